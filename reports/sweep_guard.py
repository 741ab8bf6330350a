"""What keeps a sweep folder whole when the sweep is stopped or pointed at the wrong folder.

`check_same_grid` refuses another grid in a folder that holds one (the same grid resumes);
`stop_on_sigterm` makes SIGTERM raise `StoppedBySignal` in the main thread as Ctrl-C raises
KeyboardInterrupt, so pool workers are not left orphaned; `quiet_worker` is a pool worker's
initializer (ignores Ctrl-C, dies at SIGTERM); `end_workers` kills a pool's workers now
(docs/sweeps.md, "Stopping", "One grid per folder").

Not here: running cells, saving them (reports.sweep), or printing (the CLI).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from dsd.common.errors import InputError, StoppedBySignal

# Seconds to wait for a killed worker to be reaped before moving on.
_REAP_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------------------------
# The same grid, or refuse
# --------------------------------------------------------------------------------------------


def check_same_grid(record: Path, resolved_grid: dict[str, Any]) -> None:
    """InputError unless the sweep folder of `record` (its grid.resolved.json) holds no sweep
    yet or a sweep of the same cells as `resolved_grid`."""
    out_dir, path = record.parent, record
    if not path.is_file():
        return
    how = "give a new --out, or delete the folder to start over"
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_ids = {cell["cell_id"] for cell in old["cells"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"--out {out_dir}: its {path.name} is not a sweep's record ({exc}); {how}"
        ) from None
    new_ids = {cell["cell_id"] for cell in resolved_grid["cells"]}
    if old_ids == new_ids:
        return  # the same grid: resume it
    raise InputError(
        f"--out {out_dir} holds another sweep ({grid_difference(old, resolved_grid)}); "
        f"re-running the same grid resumes it; for this one {how}"
    )


def grid_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two resolved grids, in a few words."""
    parts: list[str] = []
    for name, key in (("policies", "policy"), ("concurrencies", "max_concurrency")):
        before = _values(old, key)
        after = _values(new, key)
        if before != after:
            parts.append(f"{name} {','.join(before)} there, {','.join(after)} here")
    # the first cell's run settings, less what varies by cell (its seed derives from the sweep's)
    old_config, new_config = _base_config(old), _base_config(new)
    changed = sorted(
        key
        for key in old_config.keys() | new_config.keys()
        if key not in ("policy", "max_concurrency", "seed")
        and old_config.get(key) != new_config.get(key)
    )
    if old.get("seed") != new.get("seed"):
        changed.insert(0, "seed")
    if changed:
        shown = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
        parts.append(f"settings differ: {shown}")
    old_count, new_count = len(old.get("cells", [])), len(new.get("cells", []))
    if not parts:  # labels, seeds or the files' contents
        parts.append("the cells' specs differ (seed, labels or the profile/workload files)")
    parts.append(f"{old_count} cells there, {new_count} here")
    return "; ".join(parts)


def _base_config(grid: dict[str, Any]) -> dict[str, Any]:
    base = grid.get("base")
    config = base.get("config") if isinstance(base, dict) else None
    return config if isinstance(config, dict) else {}


def _values(grid: dict[str, Any], key: str) -> list[str]:
    """The distinct values of a cell field, in first-seen order."""
    seen: dict[str, None] = {}
    for cell in grid.get("cells", []):
        if isinstance(cell, dict):
            seen.setdefault(str(cell.get(key)), None)
    return list(seen)


# --------------------------------------------------------------------------------------------
# Signals and pool workers
# --------------------------------------------------------------------------------------------


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    del frame
    raise StoppedBySignal(signal.Signals(signum).name, 128 + signum)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises `StoppedBySignal` inside the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def quiet_worker() -> None:
    """A pool worker's signals: Ctrl-C is the driver's to handle (it ends the workers), and
    SIGTERM ends the worker (not the handler it inherited from the driver by fork)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def end_workers(pool: ProcessPoolExecutor) -> None:
    """Kill `pool`'s worker processes now and shut it down without waiting for their cells.

    Python < 3.14 has no public call for it (3.14 adds `kill_workers`); the executor's own
    process table is what that call walks.
    """
    kill = getattr(pool, "kill_workers", None)
    workers = list(dict(getattr(pool, "_processes", None) or {}).values())
    if callable(kill):
        kill()
    else:
        for process in workers:
            with contextlib.suppress(OSError, ValueError):
                process.kill()
    for process in workers:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            process.join(_REAP_TIMEOUT_S)
    pool.shutdown(wait=False, cancel_futures=True)
