"""torch's thread settings: the one place a command applies its `--threads`, and what it records.

Without `--threads`, a CPU run takes one intra-op thread: torch's default (one per core) makes
two processes on a shared machine fight over every core, and one thread per process cannot
oversubscribe. On CUDA torch's default stays. A timing without its thread count cannot be
compared with another; profiles, benchmarks and reports record `thread_settings()` next to
`common.machine`'s CPU model and load.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Most intra-op threads a command accepts (torch itself overflows on absurd counts)
MAX_THREADS = 1024


# torch's intra-op threads on CPU when a command is given no --threads
DEFAULT_CPU_THREADS = 1


def default_threads(threads: int | None, device: str) -> int | None:
    """The intra-op threads a command runs with: `threads` when given, else
    DEFAULT_CPU_THREADS on CPU, else None (torch's default)."""
    if threads is not None:
        return threads
    return DEFAULT_CPU_THREADS if device == "cpu" else None


def set_threads(threads: int | None, device: str = "cpu") -> None:
    """torch's intra-op threads: `default_threads(threads, device)` (None: torch's default)."""
    chosen = default_threads(threads, device)
    if chosen is not None:
        torch.set_num_threads(chosen)


def threads_text(threads: int | None, device: str) -> str:
    """One line saying which intra-op thread count a command runs with, and why."""
    count = torch.get_num_threads()
    if threads is not None:
        return f"threads: {count} (--threads)"
    if default_threads(threads, device) is not None:
        return (
            f"threads: {count} (the CPU default: one per process cannot oversubscribe the "
            "cores; --threads N for more)"
        )
    return f"threads: {count} (torch's default on {device})"


def thread_settings() -> dict[str, Any]:
    """torch's intra/inter-op threads and the thread variables of the environment."""
    return {
        "torch_intra_op_threads": torch.get_num_threads(),
        "torch_inter_op_threads": torch.get_num_interop_threads(),
        **{name: os.environ.get(name) for name in THREAD_ENV_VARS},
        "cpu_count": os.cpu_count(),
    }


def measured_run_settings(load_before: float) -> dict[str, Any]:
    """What a timed benchmark records beside its figures: threads, CPU model, the load average
    before (`load_before`, read when it started) and now, and its command line."""
    from dsd.common.machine import cpu_model, load_average

    return {
        "threads": thread_settings(),
        "cpu": cpu_model(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "command": " ".join(sys.argv),
    }
