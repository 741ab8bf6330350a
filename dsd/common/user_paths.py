"""What is wrong with a path a user gave, in one line: the checks before reading a file or
writing a file or a folder, and the words for an OS error about a path.

Every reader of a user's file and every writer of a user's output goes through these (via
`dsd.common.user_files` and `dsd.common.atomic`), so a directory, a FIFO, /dev/zero, `-`, a
symlink loop, a name too long or an empty `--out` is refused before anything is opened or
written, naming the path as the user gave it. This module opens nothing and writes nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from dsd.common.errors import InputError

# The OS's words, as a user reads them; other errors keep the OS's own text.
_REASONS = {
    errno.ENOENT: "no such file",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.ELOOP: "too many levels of symbolic links (a symlink loop)",
    errno.ENAMETOOLONG: "file name too long",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EBUSY: "device or resource busy",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
}


def os_error_reason(error: OSError) -> str:
    """The reason of an OS error about a path, in a few lowercase words."""
    if error.errno in _REASONS:
        return _REASONS[error.errno]
    text = error.strerror or str(error)
    return text[:1].lower() + text[1:]


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def check_input_file(path: str | os.PathLike[str], what: str = "file") -> os.stat_result:
    """The stat of a regular file a user named; InputError `<path>: <what is wrong>` otherwise.

    Checked by stat before anything opens it: a FIFO would block the read, a device would never
    end. `what` names the expected content ("profile file").
    """
    text = os.fspath(path)
    if text == "-":
        raise InputError(f"-: standard input is not read here; give a {what}'s path")
    if not text.strip():
        raise InputError(f"{text!r}: an empty path; give a {what}'s path")
    try:
        status = os.stat(text)
    except OSError as exc:
        raise InputError(f"{text}: {os_error_reason(exc)}") from None
    if stat.S_ISDIR(status.st_mode):
        raise InputError(f"{text}: is a directory, expected a {what}")
    if not stat.S_ISREG(status.st_mode):
        raise InputError(f"{text}: not a regular file ({_kind(status.st_mode)}), expected a {what}")
    return status


def check_output_file(
    path: str | os.PathLike[str], flag: str = "", *, os_errors: bool = False
) -> Path:
    """`path` as a Path if a file may be written there (missing, or a regular file to replace);
    InputError naming it otherwise: empty, ending in '/' (a folder), an existing directory or
    device, a name too long, a symlink loop. `flag` ("--out") prefixes the message. With
    `os_errors`, an OS error looking the path up (a name too long, a symlink loop, a file where
    a folder should be) stays an OSError about `path`, for writers that handle those (a
    cache that skips a store it cannot make)."""
    text = os.fspath(path)
    named = f"{flag} {text}".strip() if text else (flag or "output path")
    if not text.strip():
        raise InputError(f"{named}: an empty path; give a file name")
    if text.endswith(("/", os.sep)):
        raise InputError(f"{named}: ends with '/', a folder; give a file name, e.g. {text}NAME")
    status = _stat_unless_missing(text, named, os_errors=os_errors)
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise InputError(f"{named}: is a directory; give a file name, e.g. {text}/NAME")
    if status is not None and not stat.S_ISREG(status.st_mode):
        raise InputError(f"{named}: not a regular file ({_kind(status.st_mode)}); give a file name")
    return Path(text)


def check_output_folder(path: str | os.PathLike[str], flag: str = "--out") -> Path:
    """`path` as a Path if an output folder may be made or filled there; InputError naming it
    otherwise: empty (it would write into the current folder), an existing non-folder, a name
    too long, a symlink loop."""
    text = os.fspath(path)
    named = f"{flag} {text}".strip() if text else flag
    if not text.strip():
        raise InputError(f"{named}: an empty path; give a folder (e.g. --out runs/first)")
    status = _stat_unless_missing(text, named)
    if status is not None and not stat.S_ISDIR(status.st_mode):
        raise InputError(f"{named}: exists and is not a folder")
    return Path(text)


def _stat_unless_missing(
    text: str, named: str, *, os_errors: bool = False
) -> os.stat_result | None:
    """The stat of `text`, None when it (or a folder above it) does not exist yet; another OS
    error is an InputError (`os_errors`: raised as it is)."""
    try:
        return os.stat(text)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os_errors:
            raise
        raise InputError(f"{named}: {os_error_reason(exc)}") from None
