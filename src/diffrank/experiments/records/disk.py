"""Writing files safely: atomic writes (a reader, or a job killed mid-write, never sees half a file) and a full disk
named (the file and ENOSPC, found anywhere in an error's chain of causes)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through a temporary file in the same folder and an
    ``os.replace`` (atomic on POSIX), so that a reader, or a job killed mid-write, never leaves half a file.
    Folders are created. Returns the path.

    Raises:
        OSError: the folder cannot be created or written; a full disk as errno ENOSPC naming ``path`` (the bare
            error of the write names no file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        if e.errno == errno.ENOSPC:  # name the file (the write's own error names none, or the temporary one)
            raise OSError(errno.ENOSPC, "No space left on device (ENOSPC)", str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write or the rename failed
    return path


def no_space_error(error: BaseException) -> OSError | None:
    """The ``OSError`` with errno ENOSPC (disk full) that is ``error`` or in its chain of causes, else None (torch's
    checkpoint writer reports a full disk as ``unexpected pos …``, the ENOSPC only in the chained cause)."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
        e = e.__cause__ or e.__context__
    return None


def describe_no_space(error: BaseException) -> str | None:
    """One line for a full disk (:func:`no_space_error` of ``error``): ``"no space left on device (ENOSPC) writing
    <file>: free disk space, then resume; <type>: <message>"`` (the file when known; the error's own text left out
    when it only repeats that, as :func:`write_atomic`'s does); None when ``error`` is not one."""
    full = no_space_error(error)
    if full is None:
        return None
    where = f" writing {full.filename}" if full.filename else ""
    head = f"no space left on device (ENOSPC){where}: free disk space, then resume"
    if error is full and full.filename and (full.strerror or "").lower().startswith("no space left on device ("):
        return head  # the error says nothing more
    return f"{head}; {type(error).__name__}: {error}"
