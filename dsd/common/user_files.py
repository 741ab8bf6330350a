"""Reading user-edited text files and JSON: UTF-8 (a leading BOM allowed), or a one-line InputError.

Hand-edited profiles, tables and traces arrive with Windows BOMs, Latin-1 bytes pasted from
elsewhere, or cut short. `read_user_text` decodes them strictly and names the file, the line
and the column of the first byte that is not UTF-8, instead of letting a UnicodeDecodeError
(a traceback) reach the user. This module does not parse anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dsd.common.errors import InputError


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
    return decode_user_text(Path(path).read_bytes(), str(path) if source is None else source)


def parse_user_json(text: str, source: str, *, allow_nonfinite: bool = False) -> Any:
    """Decoded JSON of a user's text; InputError naming line and column on any problem.

    NaN/Infinity literals (Python's json extension) are refused unless `allow_nonfinite`; a
    document nested deeper than Python's recursion limit is refused instead of crashing.
    """
    try:
        if allow_nonfinite:
            return json.loads(text)
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
        ) from None
    except _NonFiniteError as exc:
        raise InputError(f"{source}: {exc.args[0]} is not a JSON number") from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply") from None


class _NonFiniteError(ValueError):
    """NaN or Infinity where JSON has no such number."""


def _refuse_constant(name: str) -> float:
    raise _NonFiniteError(name)


def read_json_argument(
    text_or_path: str, inline_source: str, opening: str = "[{"
) -> tuple[Any, str]:
    """(decoded JSON, source name) of a command-line value that is inline JSON (it starts with
    one of `opening`; named `inline_source` in errors) or the path of a JSON file."""
    if text_or_path.lstrip().startswith(tuple(opening)):
        return parse_user_json(text_or_path.strip(), inline_source), inline_source
    path = Path(text_or_path)
    if not path.is_file():
        raise InputError(f"{text_or_path}: no such file (give inline JSON or a JSON file's path)")
    return parse_user_json(read_user_text(path, text_or_path), text_or_path), text_or_path
