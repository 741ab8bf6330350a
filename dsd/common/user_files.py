"""Reading user-edited text files and JSON: UTF-8 (a leading BOM allowed), or a one-line InputError.

Hand-edited profiles, tables and traces arrive with Windows BOMs, Latin-1 bytes pasted from
elsewhere, or cut short. `read_user_text` decodes them strictly and names the file, the line
and the column of the first byte that is not UTF-8, instead of letting a UnicodeDecodeError
(a traceback) reach the user; what is not a readable regular file (a directory, a FIFO, a
device, `-`, a symlink loop) is refused first (`dsd.common.user_paths`). `parse_user_json`
refuses what Python's json would silently accept: NaN literals and a key given twice in one
object (the first value would be dropped). Nothing here interprets the decoded data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dsd.common.errors import InputError
from dsd.common.user_paths import check_input_file, os_error_reason


def decode_user_text(data: bytes, source: str) -> str:
    """`data` as UTF-8 text without a leading BOM; InputError at the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(
            f"{source}: line {line} column {column}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
        ) from None


def read_user_text(path: str | os.PathLike[str], source: str | None = None) -> str:
    """The text of a user's file (UTF-8, BOM allowed); errors are named `source` (the path)."""
    check_input_file(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:  # checked above; a race or a permission
        raise InputError(f"{os.fspath(path)}: {os_error_reason(exc)}") from None
    return decode_user_text(data, os.fspath(path) if source is None else source)


def parse_user_json(
    text: str, source: str, *, allow_nonfinite: bool = False, line: int | None = None
) -> Any:
    """Decoded JSON of a user's text; InputError naming line and column on any problem.

    `line`: the text is that line of a JSON-lines file (errors name it, not line 1).
    NaN/Infinity literals (Python's json extension) are refused unless `allow_nonfinite`; a
    key given twice in one object is refused (json keeps the last silently); a document nested
    deeper than Python's recursion limit is refused instead of crashing.
    """
    at = "" if line is None else f" line {line}:"
    try:
        if allow_nonfinite:
            return json.loads(text, object_pairs_hook=_unique_keys)
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        raise InputError(
            f"{source}:{at} key {exc.args[0]!r} appears twice in one JSON object "
            f"(its keys: {exc.args[1]}); keep one"
        ) from None
    except json.JSONDecodeError as exc:
        lineno = exc.lineno if line is None else line
        raise InputError(
            f"{source}: line {lineno} column {exc.colno}: invalid JSON: {exc.msg}"
        ) from None
    except _NonFiniteError as exc:
        raise InputError(f"{source}:{at} {exc.args[0]} is not a JSON number") from None
    except RecursionError:
        raise InputError(f"{source}:{at} JSON nested too deeply") from None


class _NonFiniteError(ValueError):
    """NaN or Infinity where JSON has no such number."""


def _refuse_constant(name: str) -> float:
    raise _NonFiniteError(name)


class _DuplicateKeyError(ValueError):
    """A key given twice in one JSON object: (the key, the object's keys in short)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                keys = [name for name, _ in pairs]
                shown = ", ".join(repr(name) for name in keys[:6]) + (
                    ", ..." if len(keys) > 6 else ""
                )
                raise _DuplicateKeyError(key, shown)
            seen.add(key)
    return result


def read_json_argument(
    text_or_path: str, inline_source: str, opening: str = "[{"
) -> tuple[Any, str]:
    """(decoded JSON, source name) of a command-line value that is inline JSON (it starts with
    one of `opening`; named `inline_source` in errors) or the path of a JSON file."""
    if text_or_path.lstrip().startswith(tuple(opening)):
        return parse_user_json(text_or_path.strip(), inline_source), inline_source
    try:
        check_input_file(text_or_path, "JSON file")
    except InputError as exc:
        if text_or_path == "-":
            raise
        raise InputError(f"{exc} (give inline JSON or a JSON file's path)") from None
    path = Path(text_or_path)
    return parse_user_json(read_user_text(path, text_or_path), text_or_path), text_or_path
