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


def test_policy_overhead_in_the_loop_prints_each_policy_and_the_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--target: the policies timed after the real steps of the profiler's host-overhead runs
    (the tiny random-weight target, one B), with the baseline, and the lines a profile keeps."""
    assert _module().main(["--target", "tiny", "--draft", "ngram:1-3", "--batch-sizes", "1"]) == 0
    out = capsys.readouterr().out
    timed = [line.split()[:2] for line in out.splitlines() if "us/step over" in line]
    assert timed == [
        ["goodput", "D=1"],
        ["online", "D=1"],
        ["per-request", "D=1"],
        ["static:5", "D=1"],
    ]
    lines = [line.split()[0] for line in out.splitlines() if "ms beyond static:5" in line]
    assert lines == ["goodput", "online", "per-request"]


def test_policy_overhead_refuses_a_bad_batch_size_list_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _module().main(["--batch-sizes", "1,x"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "policy_overhead.py: --batch-sizes: expected comma-separated integers or ranges a-b, "
        "got '1,x'"
    ]
