"""The one error type for bad user input, shared by every layer.

`policies` is the bottom layer of dsd (it imports nothing from the rest), so the error that
every loader and validator raises for bad input lives here. The CLI turns an `InputError` into
one line `error: <message>` and exit code 2; anything else is a bug and keeps its traceback.
Messages name the file, line or field that is wrong.
"""

from __future__ import annotations

# Largest running-set cap (max_num_seqs) any policy or the simulator accepts: per-B tables are
# built for B = 1..max_num_seqs, so an absurd cap would be a huge allocation, not an answer.
MAX_NUM_SEQS = 1 << 20


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
