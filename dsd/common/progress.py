"""Progress of long work without a UI: the work calls `advance(label)` once per finished unit.

A `ProgressFactory(total, title)` is a context manager yielding `advance`. The API's long calls
(sweep, profile, validate) take one; the CLI passes a progress bar, notebooks pass nothing
(`no_progress`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol


class Advance(Protocol):
    """Called once per finished unit of work, with a label for it. `more`: units the work
    found it must add to the total (a re-measure pass), not counted up front."""

    def __call__(self, label: str, more: int = 0) -> None: ...


ProgressFactory = Callable[[int, str], AbstractContextManager[Advance]]


@contextlib.contextmanager
def no_progress(total: int, title: str) -> Iterator[Advance]:
    """Report nothing."""
    del total, title

    def advance(label: str, more: int = 0) -> None:
        del label, more

    yield advance


def print_label(label: str, more: int = 0) -> None:
    """An `Advance` that prints each unit's label on stderr (the benchmarks' progress)."""
    del more
    print(label, file=sys.stderr)
