"""Progress of long work without a UI: the work calls `advance(label)` once per finished unit.

A `ProgressFactory(total, title)` is a context manager yielding `advance`. The API's long calls
(sweep, profile, validate) take one; the CLI passes a progress bar, notebooks pass nothing
(`no_progress`). Work deep in the library that no caller can pass one to (the latency model's
fits) uses `delayed_stderr_progress`, silent unless it runs past a second.
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


# Off a terminal (a log, CI, a test), a line at most this often: quick work prints nothing.
LOG_EVERY_S = 60.0


@contextlib.contextmanager
def delayed_stderr_progress(
    total: int, title: str, *, after_s: float = 1.0, log_every_s: float = LOG_EVERY_S
) -> Iterator[Advance]:
    """A `ProgressFactory` for slow work deep in the library, where no caller passes one (the
    latency model's fits): silent for the first `after_s`, then on a terminal one stderr line
    `title: done/total label, N s` kept up to date in place and erased at the end; off a
    terminal a line at most every `log_every_s`. A timer shows the line even while the first
    unit is still running."""
    import threading
    import time

    stream = sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    started_s = last_s = time.monotonic()
    done, latest, shown = 0, "", False
    lock = threading.Lock()  # the timer's thread and the work's both write the line

    def line() -> str:
        elapsed = time.monotonic() - started_s
        label = f" {latest}" if latest else ""
        return f"{title}: {done}/{total}{label}, {elapsed:.0f} s"

    def show() -> None:
        nonlocal shown
        with lock:
            stream.write(f"\r\x1b[K{line()}")
            stream.flush()
            shown = True

    timer = threading.Timer(after_s, show) if terminal else None
    if timer is not None:
        timer.daemon = True
        timer.start()

    def advance(label: str, more: int = 0) -> None:
        nonlocal done, total, latest, last_s
        done, total, latest = done + 1, total + more, label
        now_s = time.monotonic()
        if terminal and now_s - started_s >= after_s:
            show()
        elif not terminal and now_s - last_s >= log_every_s:
            last_s = now_s
            print(line(), file=stream, flush=True)

    try:
        yield advance
    finally:
        if timer is not None:
            timer.cancel()
        with lock:
            if shown:
                stream.write("\r\x1b[K")
                stream.flush()
