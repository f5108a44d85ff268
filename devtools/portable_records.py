"""Rewrite the machine paths in committed run records to repository-relative paths.

A ``results.json`` written by a run holds the absolute paths of the machine it ran on: its ``run_dir``, the tested
``checkpoint.path``, ``config.paths.data_dir`` and the ``paths.data_dir=...`` override. Committed records (the run
archives ``results/*.jsonl.gz`` and the JSON fixtures under ``tests/``) should say nothing about one machine, so
each absolute path is cut to the part from its first ``outputs`` or ``data`` component on: the run folder as it is
in a checkout (``outputs/...``) and the data folder as the default ``paths.data_dir`` names it (``data``). An
absolute path with neither component is an error: it would need a rule of its own, and is never left silently.

Only the JSON string of each rewritten path changes; every other byte of a file stays, so a fixture keeps its
layout and an archive keeps its line order (sorted by run folder, which cutting a common prefix keeps) and stays
byte-identical when rewritten twice (gzip with a zero timestamp, as ``diffrank.experiments.records.archive`` writes it).

    python -m devtools.portable_records results/*.jsonl.gz tests/experiments/records/*.json   # rewrite in place
    python -m devtools.portable_records --check results tests                                 # exit 1 if any remain
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

# an absolute path inside a string: at its start or after "=" (an override), "(" or a space
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[=\s(]))/[^\s\"'=,;()]+")
_KEEP_FROM = ("outputs", "data")


def relative(path: str) -> str:
    """The repository-relative form of an absolute ``path``: from its first ``outputs`` or ``data`` component on.

    Raises:
        ValueError: a path with neither component.
    """
    parts = path.strip("/").split("/")
    for i, part in enumerate(parts):
        if part in _KEEP_FROM:
            return "/".join(parts[i:])
    raise ValueError(f"no rule for the machine path {path!r} (neither an outputs/ nor a data/ component)")


def portable(text: str) -> str:
    """``text`` (one string value of a record) with every absolute path in it made relative (:func:`relative`)."""
    return _ABSOLUTE.sub(lambda m: relative(m.group(0)), text)


def _strings(obj) -> Iterator[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)
    elif isinstance(obj, str):
        yield obj


def _read(path: Path) -> tuple[str, list]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        text = gzip.decompress(raw).decode("utf-8")
        return text, [json.loads(line) for line in text.splitlines() if line.strip()]
    text = raw.decode("utf-8")
    return text, [json.loads(text)]


def machine_paths(path: str | Path) -> list[str]:
    """The string values of a record file (``.json`` or ``.jsonl.gz``) that hold an absolute path."""
    _, records = _read(Path(path))
    return sorted({s for rec in records for s in _strings(rec) if _ABSOLUTE.search(s)})


def rewrite(path: str | Path) -> int:
    """Rewrite ``path`` in place with :func:`portable` applied to every string that holds an absolute path; returns
    the number of distinct strings changed. Each is replaced as its JSON encoding, so nothing else in the file moves.

    Raises:
        ValueError: a path :func:`relative` has no rule for; the file is then left as it was.
    """
    path = Path(path)
    text, _ = _read(path)
    changes = {old: portable(old) for old in machine_paths(path)}
    for old, new in changes.items():
        text = text.replace(json.dumps(old), json.dumps(new))
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return len(changes)


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted([*p.rglob("*.json"), *p.rglob("*.jsonl.gz")]) if p.is_dir() else [p]
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: rewrite the given files (folders: their ``*.json`` / ``*.jsonl.gz``), or ``--check`` them."""
    ap = argparse.ArgumentParser(prog="python -m devtools.portable_records", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="record files (.json, .jsonl.gz) or folders holding them")
    ap.add_argument("--check", action="store_true", help="only list the machine paths; exit 1 when there are any")
    a = ap.parse_args(argv)
    found = 0
    for f in _files(a.paths):
        if a.check:
            for s in machine_paths(f):
                print(f"{f}: {s}")
                found += 1
        else:
            print(f"{f}: {rewrite(f)} strings rewritten")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
