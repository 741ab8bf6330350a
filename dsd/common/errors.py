"""The one error type for bad user input, shared by every layer.

Every loader and validator raises `InputError` for bad input; `require_int` and
`require_number` are the field checks they share. The CLI turns an `InputError` into
one line `error: <message>` and exit code 2; anything else is a bug and keeps its traceback.
Messages name the file, line or field that is wrong.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input (a file, a field, a flag). The message says what and where."""


def require_int(value: object, name: str, minimum: int, maximum: int | None = None) -> None:
    """InputError `<name> must be an integer >= <minimum>, got <value>` (`in [<minimum>,
    <maximum>]` when a maximum is given) unless it is one (bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        pass
    elif maximum is None or value <= maximum:
        return
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise InputError(f"{name} must be an integer {bound}, got {value!r}")
