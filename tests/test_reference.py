"""The reference reader (``diffrank.reference``): malformed CSV rows are named by file and line; the notes stay
inside the project."""

from __future__ import annotations

import pytest

from diffrank.reference import COLUMNS, all_rows, read_csv

HEADER = ",".join(COLUMNS)
ROW = "petersen_topk_icml2022,1,cifar100,resnet18,NeuralSort,neuralsort,,,100,\"[0,0,0,0,1]\",,,top5,95.1,,,a note"


def _write(tmp_path, *lines):
    path = tmp_path / "table.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_rows(tmp_path):
    (row,) = read_csv(_write(tmp_path, HEADER, ROW))
    assert row["pk"] == "[0,0,0,0,1]" and row["value"] == "95.1" and row["note"] == "a note"


@pytest.mark.parametrize("line", [ROW + ",extra", ROW.rsplit(",", 1)[0]], ids=["one comma too many", "one too few"])
def test_bad_field_count_names_file_and_line(tmp_path, line):
    """One comma too many used to end in a TypeError raised while building the reader's own message."""
    path = _write(tmp_path, HEADER, ROW, line)
    with pytest.raises(ValueError, match=rf"table\.csv, line 3: {len(COLUMNS) + (1 if 'extra' in line else -1)} "
                                         rf"fields where the header has {len(COLUMNS)}"):
        read_csv(path)


def test_bad_header_names_file(tmp_path):
    with pytest.raises(ValueError, match=r"table\.csv, line 1: the header"):
        read_csv(_write(tmp_path, HEADER.replace("metric", "metrik"), ROW))
    with pytest.raises(ValueError, match=r"table\.csv, line 1"):
        read_csv(_write(tmp_path, ""))


def test_bundled_tables_read_and_their_notes_name_no_outside_path():
    """The notes (every cell) cite papers by name and section, never a file outside the repository."""
    rows = all_rows()
    assert rows
    outside = [(r["source_file"], k, v) for r in rows for k, v in r.items() if "../" in v or "shared/" in v]
    assert not outside
