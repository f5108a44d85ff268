"""Run archives: the ``results.json`` records of finished runs kept in the repository, so that the report
regenerates the numbers ``docs/`` quotes without the run folders (``outputs/`` is ignored and a run folder
does not outlive the machine it was written on).

An archive is a gzip-compressed JSON-lines file (``results/<name>.jsonl.gz``): one whole record per line
(:meth:`~diffrank.experiments.records.record.RunRecord.to_dict`, config, versions and device included), sorted by run
folder and written with a zero gzip timestamp, so archiving the same runs twice gives the same bytes. Table 7.1's
epoch-1 CPU runs (640 records) take 80 kB.

    python -m diffrank.experiments.records.archive outputs/t7_1_cpu --out results/thesis_t7_1_cpu.jsonl.gz
    python -m diffrank.experiments.analysis.report results outputs      # archives and run folders together

The report (:func:`diffrank.experiments.records.matching.collect`) and the P_K report read archives wherever they read
run folders (:func:`find_records`); a run found both in an archive and in its folder counts once. Runs are told
apart by their ``run_id`` (older records: by their folder; a record with neither: by its config, seed and finish
time, else by its line): a new run into the folder of an archived one is another run, kept beside it. A record the
report cannot read (a seed that is no integer, a field of the wrong JSON type) is named and left out; an empty
(0-byte) or truncated archive is refused.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from diffrank.experiments.records.disk import write_atomic
from diffrank.experiments.records.record import RECORD_FILE, RunRecord

SUFFIX = ".jsonl.gz"


def _identity(path: Path, rec: RunRecord, line: int | None = None) -> tuple:
    """What makes two records the same run (the later of them is kept): its ``run_id`` (kept by its resumes, new
    for a re-run into the same folder); older records: their run folder (one folder held one run) and device
    (folders of the same name on two machines); a record with neither: its config, seed and finish time
    (:attr:`~diffrank.experiments.records.record.RunRecord.pool_key`, ``finished_at``), else its place: the
    ``results.json`` ``path``, or ``line`` of the archive ``path`` (never the archive alone: it holds many runs)."""
    if rec.run_id:
        return ("id", rec.run_id)
    if rec.run_dir:
        return ("run", rec.run_dir, rec.device)
    if rec.finished_at and rec.pool_key:
        return ("record", rec.pool_key, rec.seed, rec.finished_at, rec.device)
    return ("file", str(path.resolve()), line)


def _newest(keyed: Iterable[tuple[tuple, tuple]]) -> list[tuple]:
    # per run (the key: _identity), its last record (by finish time; on equal times the one read last), in
    # first-seen order; the items are (path, record, ...) tuples, kept whole
    out: dict[tuple, tuple] = {}
    for key, item in keyed:
        rec = item[1]
        if key not in out or (rec.finished_at or "") >= (out[key][1].finished_at or ""):
            out[key] = item
    return list(out.values())


# the JSON types of the record fields the report and the archive read (a field absent or null is fine)
FIELD_TYPES = {"status": str, "metrics": dict, "config": dict, "choices": dict, "overrides": list,
               "paper": dict, "variant_of": dict, "segments": list, "run_id": str, "run_dir": str,
               "finished_at": str, "device": str, "config_hash": str, "git_sha": str}


def _json_kind(kind: type) -> str:
    """A Python type of a JSON value as JSON names it, with its article (``list`` → ``an array``)."""
    name = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(kind)
    return name or f"a {kind.__name__}"


def checked_record(data: dict, where: str, strict: bool = False) -> RunRecord | None:
    """The record of one JSON object (:meth:`RunRecord.from_dict`), its seed normalised to an int (a record edited
    by hand or by another tool may hold ``"0"`` or ``0.0``: one seed, the same as ``0``); None, after a warning
    naming ``where`` and the field, for a record the report cannot read: a seed that is no integer (``"a"``,
    ``0.5``, ``true``: nothing says which seed it is), or a field of another JSON type than
    :data:`FIELD_TYPES` says (``metrics`` a list, ``finished_at`` a number, a ``segments`` entry not an object).

    Raises:
        ValueError: such a record when ``strict`` (the message names ``where`` and the field), instead of the
            warning.
    """
    why = None
    for key, kind in FIELD_TYPES.items():
        value = data.get(key)
        if value is not None and not isinstance(value, kind):
            why = f"{key} is {_json_kind(type(value))}, not {_json_kind(kind)}"
            break
    if why is None and any(not isinstance(s, dict) for s in data.get("segments") or []):
        why = "a segments entry is not a JSON object"
    seed = data.get("seed")
    if why is None and seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)):
        integral = isinstance(seed, float) and seed.is_integer()
        if integral or (isinstance(seed, str) and re.fullmatch(r"\s*[-+]?\d+\s*", seed)):
            data = {**data, "seed": int(seed)}
        else:
            why = f"seed {seed!r} is not an integer"
    if why is not None and strict:
        raise ValueError(f"{where}: {why}")
    if why is not None:
        print(f"warning: {where}: {why}; record left out", file=sys.stderr)
        return None
    return RunRecord.from_dict(data)


def read_record(path: Path) -> RunRecord | None:
    """The record of one ``results.json`` (:func:`checked_record`); None, after a warning naming the file, for a
    file that is missing, partial (a run killed while writing it) or not a JSON object, or a record
    :func:`checked_record` refuses."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):  # what RunRecord.read refuses
        print(f"warning: cannot read {path} (missing, partial or not a JSON object)", file=sys.stderr)
        return None
    return checked_record(data, str(path))


def _read_lines(path: Path, strict: bool = False) -> list[tuple[Path, RunRecord, int]]:
    """:func:`read_archive` with each record's line number (1-based); ``strict``: a record the report cannot read
    raises ValueError (:func:`checked_record`)."""
    if path.is_file() and path.stat().st_size == 0:  # gzip reads an empty file as no data, without an error
        raise ValueError(f"{path}: not a run archive (gzip-compressed JSON lines): an empty file (0 bytes)")
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
        rec = checked_record(data, f"{path}, line {i}", strict)
        if rec is not None:
            out.append((Path(rec.run_dir) / RECORD_FILE if rec.run_dir else path, rec, i))
    return out


def read_archive(path: str | Path) -> list[tuple[Path, RunRecord]]:
    """The records of one archive, each with the path of the ``results.json`` it was archived from (its run
    folder's, which the report shows; the archive's own path when the record has no ``run_dir``). A seed written
    as a string or float of an integer is read as that integer; a record whose seed is no integer, or with a field
    of the wrong type, is left out with a warning naming its line (:func:`checked_record`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file that is not gzip (an empty or truncated one included), or a line that is not a JSON
            object (the message names the line).
    """
    return [(p, rec) for p, rec, _ in _read_lines(Path(path))]


def find_records(paths: Iterable[str | Path]) -> list[tuple[Path, RunRecord]]:
    """Every run record under ``paths``: ``results.json`` files and archives (``*.jsonl.gz``) given directly or
    found recursively in folders, in path order; each run once (the same file twice, or a run both archived and
    in its folder: its latest record by ``finished_at``). An unreadable ``results.json`` (a run killed while
    writing it), and a record whose seed is no integer or with a field of the wrong type (:func:`checked_record`), are
    left out with a warning naming the file (and the archive's line).

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
    return _newest(_found(paths))


def _found(paths: Iterable[str | Path]) -> list[tuple[tuple, tuple[Path, RunRecord, Path]]]:
    """Every record under ``paths`` (:func:`find_records_with_files`' triples), each with its run's identity
    (:func:`_identity`), before the newest of each run is picked."""
    files: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such file or folder: {p}")
        files.update([p] if p.is_file() else [q for pattern in (RECORD_FILE, f"*{SUFFIX}") for q in p.rglob(pattern)
                                              if q.is_file()])
    found: list[tuple[tuple, tuple[Path, RunRecord, Path]]] = []
    for f in sorted(files):
        if f.name.endswith(SUFFIX):
            found += [(_identity(f, rec, line), (path, rec, f)) for path, rec, line in _read_lines(f)]
            continue
        rec = read_record(f)
        if rec is not None:
            found.append((_identity(f, rec), (f, rec, f)))
    return found


def write_archive(paths: Iterable[str | Path], out: str | Path) -> int:
    """Archive the finished runs (``status: done``) under ``paths`` into ``out``, keeping the records ``out``
    already holds (a run archived again is stored once: its latest record). Returns the records written.

    Raises:
        FileNotFoundError / ValueError: see :func:`find_records`; ValueError also for an ``out`` not ending in
            ``.jsonl.gz``, and for a record ``out`` holds that :func:`checked_record` refuses (never dropped).
        OSError: ``out`` cannot be written (the message names it; ``out`` is left as it was).
    """
    out = Path(out)
    if not out.name.endswith(SUFFIX):
        raise ValueError(f"an archive's name ends in {SUFFIX}, got {out}")
    # strict: a record of out this version cannot read is refused, never dropped from the archive it is in
    held = [(_identity(out, r, line), (p, r)) for p, r, line in _read_lines(out, strict=True)] if out.exists() else []
    new = [(key, (p, r)) for key, (p, r, _) in _found(paths) if r.status == "done"]
    records = sorted(_newest(held + new), key=lambda pr: (pr[1].run_dir or "", pr[1].finished_at or ""))
    text = "".join(json.dumps(r.to_dict(), sort_keys=True, default=str) + "\n" for _, r in records)
    try:
        write_atomic(out, gzip.compress(text.encode("utf-8"), mtime=0))
    except OSError as e:  # a full or read-only disk: name the archive (the temporary file is removed)
        raise OSError(e.errno, f"cannot write the archive {out}: {e.strerror or e}") from e
    return len(records)


def main(argv: list[str] | None = None) -> None:
    """Command line of :func:`write_archive`.

    Raises:
        SystemExit: status 1 with ``error: <why>`` for a missing path, a malformed archive or a failed write
            (status 2: bad arguments).
    """
    ap = argparse.ArgumentParser(prog="python -m diffrank.experiments.records.archive", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="run folders (searched recursively for results.json) or archives")
    ap.add_argument("--out", required=True, help=f"the archive written (…{SUFFIX}; records it holds are kept)")
    a = ap.parse_args(argv)
    try:
        written = write_archive(a.paths, a.out)
    except (OSError, ValueError) as e:  # a missing folder, a malformed archive, a full or read-only disk
        raise SystemExit(f"error: {e}") from None
    print(f"{written} runs in {a.out}")


if __name__ == "__main__":
    main()
