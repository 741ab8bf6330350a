"""benchmarks/policy_overhead.py runs end to end on a few steps (its figures are not asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_overhead.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("policy_overhead", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_policy_overhead_prints_one_line_per_policy_and_batch_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = "--policy static:2 --policy per-request --batch-sizes 1,4 --steps 5 --repeats 2"
    _module().main(args.split())
    lines = [line for line in capsys.readouterr().out.splitlines() if "us/step" in line]
    assert [line.split()[:2] for line in lines] == [
        ["static:2", "D=1"],
        ["static:2", "D=4"],
        ["per-request", "D=1"],
        ["per-request", "D=4"],
    ]
