"""The one error type for bad user input, and the field checks every layer shares.

Every loader and validator raises `InputError` for bad input. The CLI turns it into one line
`error: <message>` and exit code 2; anything else is a bug and keeps its traceback. Messages
name the file, line or field that is wrong: `<name>: must be ..., got <value>`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any


class InputError(ValueError):
    """Bad user input (a file, a field, a flag). The message says what and where."""


class WorkerDied(RuntimeError):
    """A worker process of a sweep died (killed, out of memory); finished cells are saved."""


class StoppedBySignal(BaseException):
    """SIGINT or SIGTERM stopped long work; the message says what was kept. A BaseException,
    like KeyboardInterrupt, so no `except Exception` swallows it. `exit_code`: 128 + the
    signal's number, as a shell reports a process the signal ended."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def require_int(
    value: object, name: str, minimum: int, maximum: int | None = None, *, optional: bool = False
) -> None:
    """InputError `<name>: must be an integer >= <minimum>, got <value>` (`in [<minimum>,
    <maximum>]` with a maximum) unless it is one. numpy integers count; bool does not. With
    `optional`, None passes."""
    if value is None and optional:
        return
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
        if number >= minimum and (maximum is None or number <= maximum):
            return
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise InputError(f"{name}: must be an integer {bound}, got {value!r}")


def require_number(
    value: object, name: str, *, minimum: float, allow_inf: bool = False, optional: bool = False
) -> None:
    """InputError unless `value` is a real number >= `minimum` (not NaN; infinite only with
    `allow_inf`; bool is not a number). With `optional`, None passes."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{name}: must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf) or number < minimum:
        bound = f">= {minimum}" + (" (inf allowed)" if allow_inf else ", finite")
        raise InputError(f"{name}: must be {bound}, got {value!r}")


def require_choice(value: object, name: str, choices: tuple[str, ...]) -> None:
    """InputError `<name>: choose from a, b, c; got <value>` unless `value` is one of `choices`."""
    if value not in choices:
        raise InputError(f"{name}: choose from {', '.join(choices)}; got {value!r}")


def require_unique(name: str, values: Sequence[Any]) -> None:
    """At least one value and no value twice (a list flag such as --max-concurrency)."""
    if not values:
        raise InputError(f"{name}: give at least one value")
    if len(set(values)) != len(values):
        raise InputError(f"{name}: duplicate values in {list(values)}")


def int_list(flag: str, text: str, minimum: int) -> tuple[int, ...]:
    """Comma-separated integers or inclusive ranges, each >= minimum, no duplicates
    (`--batch-sizes 1,4,16`, `--rows 1-32`, `--rows 1-8,16`)."""
    values: list[int] = []
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:  # "a-b" is a range, "-3" a negative integer
            low, high = (int(first), int(last)) if dash and first else (int(part), int(part))
        except ValueError:
            raise InputError(
                f"{flag}: expected comma-separated integers or ranges a-b, got {text!r}"
            ) from None
        if high < low:
            raise InputError(f"{flag}: the range {part!r} ends below its start")
        values += range(low, high + 1)
    if not values or any(v < minimum for v in values):
        raise InputError(f"{flag}: every value must be an integer >= {minimum}, got {text!r}")
    if len(set(values)) != len(values):
        raise InputError(f"{flag}: duplicate values in {text!r}")
    return tuple(values)
