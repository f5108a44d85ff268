"""Run archives: the ``results.json`` records of finished runs kept in the repository, so that the report
regenerates the numbers ``docs/`` quotes without the run folders (``outputs/`` is ignored and a run folder
does not outlive the machine it was written on).

An archive is a gzip-compressed JSON-lines file (``results/<name>.jsonl.gz``): one whole record per line
(:meth:`~diffrank.experiments.records.record.RunRecord.to_dict`, config, versions and device included), sorted by run
folder and written with a zero gzip timestamp, so archiving the same runs twice gives the same bytes. Table 7.1's
epoch-1 CPU runs (640 records) take 80 kB.

    python -m diffrank.experiments.records.archive outputs/t7_1_cpu --out results/thesis_t7_1_cpu.jsonl.gz
    python -m diffrank.experiments.analysis.report results outputs      # archives and run folders together

The report (:func:`diffrank.experiments.analysis.report.collect`) and the P_K report read archives wherever they read
run folders (:func:`find_records`); a run found both in an archive and in its folder counts once. Runs are told
apart by their ``run_id`` (older records: by their folder): a new run into the folder of an archived one is another
run, kept beside it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from diffrank.experiments.records.record import RECORD_FILE, RunRecord, write_atomic

SUFFIX = ".jsonl.gz"


def _identity(path: Path, rec: RunRecord) -> tuple:
    # a run is its run_id (kept by its resumes, new for a re-run into the same folder); older records: one run
    # folder held one run, and the device tells apart folders of the same name on two machines
    if rec.run_id:
        return ("id", rec.run_id)
    if rec.run_dir:
        return ("run", rec.run_dir, rec.device)
    return ("file", str(path.resolve()))


def _newest(records: Iterable[tuple]) -> list[tuple]:
    # per run, its last record (by finish time; on equal times the one read last), in first-seen order; the items
    # are (path, record, ...) tuples, kept whole
    out: dict[tuple, tuple] = {}
    for item in records:
        path, rec = item[0], item[1]
        key = _identity(path, rec)
        if key not in out or (rec.finished_at or "") >= (out[key][1].finished_at or ""):
            out[key] = item
    return list(out.values())


def read_archive(path: str | Path) -> list[tuple[Path, RunRecord]]:
    """The records of one archive, each with the path of the ``results.json`` it was archived from (its run
    folder's, which the report shows; the archive's own path when the record has no ``run_dir``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file that is not gzip, or a line that is not a JSON object (the message names the line).
    """
    path = Path(path)
    out = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a run archive (gzip-compressed JSON lines): {e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {i}: not JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}, line {i}: a {type(data).__name__}, not a run record (JSON object)")
        rec = RunRecord.from_dict(data)
        out.append((Path(rec.run_dir) / RECORD_FILE if rec.run_dir else path, rec))
    return out


def find_records(paths: Iterable[str | Path]) -> list[tuple[Path, RunRecord]]:
    """Every run record under ``paths``: ``results.json`` files and archives (``*.jsonl.gz``) given directly or
    found recursively in folders, in path order; each run once (the same file twice, or a run both archived and
    in its folder: its latest record by ``finished_at``). An unreadable ``results.json`` (a run killed while
    writing it) is left out with a warning.

    Returns:
        ``(path of the run's results.json, record)`` pairs.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a malformed archive (:func:`read_archive`).
    """
    return [(path, rec) for path, rec, _ in find_records_with_files(paths)]


def find_records_with_files(paths: Iterable[str | Path]) -> list[tuple[Path, RunRecord, Path]]:
    """:func:`find_records`, each record with the file it was read from: its archive, or the ``results.json``
    itself (the report names it beside a run of no paper row).

    Returns:
        ``(path of the run's results.json, record, file read)`` triples.

    Raises:
        FileNotFoundError / ValueError: see :func:`find_records`.
    """
    files: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such file or folder: {p}")
        files.update([p] if p.is_file() else [*p.rglob(RECORD_FILE), *p.rglob(f"*{SUFFIX}")])
    found: list[tuple[Path, RunRecord, Path]] = []
    for f in sorted(files):
        if f.name.endswith(SUFFIX):
            found += [(path, rec, f) for path, rec in read_archive(f)]
            continue
        rec = RunRecord.read(f)
        if rec is None:
            print(f"warning: cannot read {f} (missing, partial or not a JSON object)", file=sys.stderr)
        else:
            found.append((f, rec, f))
    return _newest(found)


def write_archive(paths: Iterable[str | Path], out: str | Path) -> int:
    """Archive the finished runs (``status: done``) under ``paths`` into ``out``, keeping the records ``out``
    already holds (a run archived again is stored once: its latest record). Returns the records written.

    Raises:
        FileNotFoundError / ValueError: see :func:`find_records`; ValueError also for an ``out`` not ending in
            ``.jsonl.gz``.
    """
    out = Path(out)
    if not out.name.endswith(SUFFIX):
        raise ValueError(f"an archive's name ends in {SUFFIX}, got {out}")
    held = read_archive(out) if out.exists() else []
    new = [(p, r) for p, r in find_records(paths) if r.status == "done"]
    records = sorted(_newest(held + new), key=lambda pr: (pr[1].run_dir or "", pr[1].finished_at or ""))
    text = "".join(json.dumps(r.to_dict(), sort_keys=True, default=str) + "\n" for _, r in records)
    write_atomic(out, gzip.compress(text.encode("utf-8"), mtime=0))
    return len(records)


def main(argv: list[str] | None = None) -> None:
    """Command line of :func:`write_archive`."""
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.records.archive", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run folders (searched recursively for results.json) or archives")
    ap.add_argument("--out", required=True, help=f"the archive written (…{SUFFIX}; records it holds are kept)")
    a = ap.parse_args(argv)
    print(f"{write_archive(a.paths, a.out)} runs in {a.out}")


if __name__ == "__main__":
    main()
