"""Atomic file output: the one helper every dsd writer goes through.

A file is written to a temporary file in the target's own folder (`.NAME.XXXX.tmp`), flushed to
disk (fsync), given ordinary permissions (0644; mkstemp makes 0600) and moved over the target
with `os.replace`, which is atomic on POSIX and Windows within one file system. A reader, or a
re-run after the writer was killed (SIGKILL, Ctrl-C, out of memory, power loss after the
fsync), sees either the old complete file or the new complete file, never a prefix. On an
exception the temporary file is removed and the target is left untouched.

Deliberately not done: no locking between concurrent writers (the last `os.replace` wins, each
file whole), no cleanup of temporary files left by a process killed mid-write (they are hidden
dot-files beside the target; `stale_temp_files` lists them), no writing across file systems.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from dsd.common import strict_json
from dsd.common.user_paths import check_output_file

# Permission bits of a finished output: an ordinary user-readable file.
OUTPUT_MODE = 0o644
TEMP_SUFFIX = ".tmp"


def _temp_prefix(target: Path) -> str:
    # at most 128 characters of the name: a name near the file system's limit still gets one
    return f".{target.name[:128]}."


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[Path], object], *, fsync: bool = True
) -> None:
    """Call `write(temp_path)`, then move the finished temp file onto `path` atomically.

    `write` must write the whole file at exactly `temp_path` (a library that appends its own
    suffix, like `np.save`, must be given an open file instead). The parent folder is created
    if missing. A `path` that cannot be a file (empty, ending in '/', a directory, a device) is
    an InputError before anything is written; an OS error (an OSError, as callers such as a
    cache expect) names `path`, not the temp file.
    `fsync=False` skips the flush to disk (still atomic against process kills, not against
    power loss).
    """
    target = check_output_file(path, os_errors=True)
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(
            prefix=_temp_prefix(target), suffix=TEMP_SUFFIX, dir=folder
        )
    except OSError as exc:
        raise _about_target(exc, target) from None
    os.close(handle)
    temp_path = Path(temp_name)
    try:
        write(temp_path)
        if fsync:
            _fsync_file(temp_path)
        os.chmod(temp_path, OUTPUT_MODE)
        os.replace(temp_path, target)
    except OSError as exc:
        temp_path.unlink(missing_ok=True)
        if exc.filename == str(temp_path) or exc.filename2 == str(target):
            raise _about_target(exc, target) from None
        raise
    except BaseException:
        temp_path.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_folder(folder)


def _about_target(error: OSError, target: Path) -> OSError:
    """The same OS error about the user's target, not the hidden temp file (a long name's temp
    file is longer still; its name means nothing to the user)."""
    return OSError(error.errno, error.strerror, str(target))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write `data` to `path` atomically."""
    atomic_write(path, lambda temp_path: temp_path.write_bytes(data), fsync=fsync)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_write_json(
    path: str | os.PathLike[str],
    data: Any,
    *,
    indent: int | None = 2,
    fsync: bool = True,
    nonfinite: Literal["null", "refuse"] = "null",
) -> None:
    """Write `data` as strict JSON (`common.strict_json.dumps`: NaN and infinities as null, or
    ValueError with `nonfinite="refuse"`) plus a final newline, atomically."""
    text = strict_json.dumps(data, indent=indent, nonfinite=nonfinite) + "\n"
    atomic_write_text(path, text, fsync=fsync)


def stale_temp_files(path: str | os.PathLike[str]) -> list[Path]:
    """Temporary files a killed writer of `path` left beside it (safe to delete)."""
    target = Path(path)
    if not target.parent.is_dir():
        return []
    prefix = _temp_prefix(target)
    return sorted(
        entry
        for entry in target.parent.iterdir()
        if entry.name.startswith(prefix) and entry.name.endswith(TEMP_SUFFIX)
    )


def _fsync_file(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_folder(folder: Path) -> None:
    """Persist the rename itself; folders cannot be opened for fsync on every platform."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
