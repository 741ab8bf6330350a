"""What a measurement must record about the machine it ran on: CPU model and load.

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
