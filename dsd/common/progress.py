"""Progress of long work without a UI: the work calls `advance(label)` once per finished unit.

A `ProgressFactory(total, title)` is a context manager yielding `advance`. The API's long calls
(sweep, profile, validate) take one; the CLI passes a progress bar, notebooks pass nothing
(`no_progress`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

Advance = Callable[[str], None]  # called once per finished unit, with a label for it
ProgressFactory = Callable[[int, str], AbstractContextManager[Advance]]


@contextlib.contextmanager
def no_progress(total: int, title: str) -> Iterator[Advance]:
    """Report nothing."""
    del total, title
    yield lambda label: None
