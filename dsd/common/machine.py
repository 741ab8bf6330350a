"""What a measurement must record about the machine it ran on: CPU model and load; and the
memory a run may still take (`available_memory_bytes`, for refusing what cannot fit).

Timings on a shared CPU mean little without the load around them and the threads used; every
profile, benchmark and report records these (docs/validation.md, "Measuring on a shared CPU").
This module only reads the machine and needs no torch; torch's thread settings are
`backend.threads`.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def load_average() -> float:
    """The 1-minute load average (nan where the OS does not report one)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        try:
            return float(os.getloadavg()[0])
        except (OSError, AttributeError):
            return float("nan")


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def available_memory_bytes() -> int | None:
    """Memory a new allocation can get without swapping (Linux's MemAvailable), else the free
    physical pages; None where the OS reports neither."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None
