"""Fuzz suite reporting: print (and optionally save) the cases tried per input path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fuzz_helpers import CASE_COUNTS, OUTCOME_COUNTS

from dsd.common.atomic import atomic_write_json


def _counts() -> dict[str, dict[str, int]]:
    return {
        name: {
            "cases": total,
            "ok": OUTCOME_COUNTS[(name, "ok")],
            "error": OUTCOME_COUNTS[(name, "error")],
        }
        for name, total in sorted(CASE_COUNTS.items())
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("DSD_FUZZ_COUNTS")
    if not target or not CASE_COUNTS:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    path = Path(target)
    if worker:  # each xdist worker counts its own cases
        path = path.with_name(f"{path.stem}.{worker}{path.suffix}")
    atomic_write_json(path, _counts())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not CASE_COUNTS:
        return
    terminalreporter.section("fuzz cases per input path")
    for name, counts in _counts().items():
        terminalreporter.write_line(
            f"{name:32s} {counts['cases']:6d} cases ({counts['ok']} accepted, "
            f"{counts['error']} rejected)"
        )
