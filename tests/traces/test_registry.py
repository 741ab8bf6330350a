"""build_workload: every name, paths, vLLM bench knobs, determinism and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsd.common.errors import InputError
from dsd.traces.export import write_workload_table
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import KNOWN_NAMES, build_workload


@pytest.mark.parametrize("name", KNOWN_NAMES)
def test_every_known_name_builds_a_workload(name: str) -> None:
    workload = build_workload(name, num_prompts=50, seed=1)
    assert len(workload.requests) == 50
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in workload.requests)


def test_closed_loop_is_zero_arrivals_with_concurrency() -> None:
    workload = build_workload("mt-bench", num_prompts=20 * 4, max_concurrency=4)
    assert workload.max_concurrency == 4
    assert all(r.arrival_s == 0.0 for r in workload.requests)


def test_open_loop_rate_retimes_and_same_seed_repeats() -> None:
    first = build_workload("spec-bench", num_prompts=200, request_rate=8.0, burstiness=0.5, seed=3)
    again = build_workload("spec-bench", num_prompts=200, request_rate=8.0, burstiness=0.5, seed=3)
    other = build_workload("spec-bench", num_prompts=200, request_rate=8.0, burstiness=0.5, seed=4)
    assert first == again
    assert first != other
    assert first.requests[-1].arrival_s == pytest.approx(200 / 8.0)
    # the seed changes the arrivals, not the (unshuffled) prompts
    assert [r.prompt for r in first.requests] == [r.prompt for r in other.requests]


def test_trace_replays_its_timestamps_and_rate_replaces_them() -> None:
    replay = build_workload("azure-code", num_prompts=100)
    assert replay.requests[0].arrival_s == 0.0 and replay.requests[-1].arrival_s > 0
    retimed = build_workload("azure-code", num_prompts=100, request_rate=2.0)
    assert [r.prompt_len for r in retimed.requests] == [r.prompt_len for r in replay.requests]
    assert retimed.requests[-1].arrival_s == pytest.approx(50.0)


def test_trace_options_and_output_override_pass_through() -> None:
    workload = build_workload(
        "mooncake-conversation", trace_options=TraceOptions(num_rows=300, seed=2), output_len=32
    )
    assert len(workload.requests) == 300
    assert {r.output_len for r in workload.requests} == {32}


def test_trace_cannot_be_asked_for_more_rows_than_it_has() -> None:
    with pytest.raises(InputError, match="has 3993 requests"):
        build_workload("mooncake-synthetic", num_prompts=5000)


def test_paths_load_and_untimed_files_cycle(tmp_path: Path) -> None:
    table = tmp_path / "w.csv"
    write_workload_table(build_workload("eagle-qa"), table)
    workload = build_workload(str(table), num_prompts=100)
    assert len(workload.requests) == 100
    assert workload.requests[80].prompt == workload.requests[0].prompt


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("mtbench", {}, "unknown workload 'mtbench'; known: mt-bench"),  # typo lists known names
        ("rl-rollout", {"request_rate": 5.0}, "request_rate"),  # rollouts start together
        ("random", {"output_len": 5}, "random_output_len"),  # ambiguous output knob
        ("mt-bench", {"num_prompts": 0}, "num_prompts"),  # no requests
        ("mt-bench", {"max_concurrency": 0}, "max_concurrency"),  # no slots
        ("mt-bench", {"request_rate": -1.0}, "request_rate"),  # negative rate
        ("missing.csv", {}, "no such file"),  # a path that does not exist
    ],
)
def test_bad_requests_raise_one_line_input_errors(
    name: str, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError, match=message) as raised:
        build_workload(name, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_random_default_matches_vllm_bench_defaults() -> None:
    workload = build_workload("random")
    assert len(workload.requests) == 1000
    assert {(r.prompt_len, r.output_len) for r in workload.requests} == {(1024, 128)}
    assert all(r.arrival_s == 0.0 for r in workload.requests)
