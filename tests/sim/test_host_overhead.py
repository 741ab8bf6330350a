"""Host overhead per step in the simulator: the measured model, the flag, and their record."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from test_executor import RecordingAcceptance, h100_profile, make_batch
from test_runner import write_flat_profile, write_workload_file

from dsd.common.errors import InputError
from dsd.policies.profile import HostOverhead, HostOverheadLine
from dsd.reports.run_outputs import bench_result, simulator_settings
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import RunConfig
from dsd.sim.executor import FittedExecutor
from dsd.sim.models.latency import TableLatencyModel
from dsd.sim.resolve import resolve, resolved_config_dict
from dsd.traces.workload import RequestSpec

MODEL = HostOverhead(
    plain=HostOverheadLine(intercept_ms=1.0, per_row_ms=0.5),
    spec=HostOverheadLine(intercept_ms=2.0, per_row_ms=0.25),
    residual_ms=0.01,
    num_steps=100,
    max_batch_size=8,
)


@pytest.mark.parametrize(
    ("decode_ks", "num_prefill", "expected_host_ms"),
    [
        ([2, 2, 2], 0, 2.0 + 0.25 * 3),  # every row drafts: the spec line at B = 3
        ([0, 0], 0, 1.0 + 0.5 * 2),  # plain decoding: the plain line at B = 2
        ([0, 3], 0, 2.0 + 0.25 * 2),  # one row drafts: the step is a drafting step
        ([], 2, 1.0 + 0.5 * 2),  # prefill only: plain, B counts the prefill rows
        ([1], 3, 2.0 + 0.25 * 4),  # decode + prefill chunks: B = 4 rows in all
    ],
)
def test_measured_model_adds_its_line_at_the_step_batch_size(
    decode_ks: list[int], num_prefill: int, expected_host_ms: float
) -> None:
    latency = TableLatencyModel(h100_profile())
    bare = FittedExecutor(latency, RecordingAcceptance())
    measured = FittedExecutor(latency, RecordingAcceptance(), host_overhead_model=MODEL)
    batch = make_batch(
        0, list(range(len(decode_ks))), decode_ks, prefill_ids=list(range(10, 10 + num_prefill))
    )
    delta_ms = (measured.execute(batch).duration_s - bare.execute(batch).duration_s) * 1000.0
    assert delta_ms == pytest.approx(expected_host_ms)


def test_constant_and_model_together_are_refused() -> None:
    latency = TableLatencyModel(h100_profile())
    with pytest.raises(ValueError, match="not both"):
        FittedExecutor(
            latency, RecordingAcceptance(), host_overhead_ms=0.5, host_overhead_model=MODEL
        )


def write_measured_profile(path: Path, itl_ms: float) -> Path:
    """A native profile with flat ITL `itl_ms` (every B, K) and the MODEL's host overhead."""
    data: dict[str, Any] = {
        "format": "dsd-profile",
        "version": 1,
        "k_max": 2,
        "latency": [
            {"batch_size": b, "num_spec_tokens": k, "median_ms": itl_ms}
            for b in (1, 4)
            for k in (0, 1, 2)
        ],
        "acceptance": {"rates": [0.5, 0.25]},
        "host_overhead": {
            "plain": {"intercept_ms": 1.0, "per_row_ms": 0.5},
            "spec": {"intercept_ms": 2.0, "per_row_ms": 0.25},
            "residual_ms": 0.01,
            "num_steps": 100,
            "max_batch_size": 8,
        },
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _one_at_a_time(tmp_path: Path, measured: bool, **fields: Any) -> RunConfig:
    """static:0 at C = 1 over two requests on a flat 10 ms profile (with the measured MODEL's
    host overhead when `measured`): every step is a plain B = 1 step, prefill included."""
    profile = (
        write_measured_profile(tmp_path / "p.json", itl_ms=10.0)
        if measured
        else write_flat_profile(tmp_path / "p.json", itl_ms=10.0)
    )
    workload = write_workload_file(tmp_path / "w.csv", [(16, 5)] * 2)
    return RunConfig(
        profile=str(profile),
        policy="static:0",
        dataset=str(workload),
        max_concurrency=1,
        **fields,
    )


@pytest.mark.parametrize(
    ("measured", "flag_ms", "source", "tpot_ms"),
    [
        (True, None, "measured", 10.0 + 1.0 + 0.5),  # the profile's plain line at B = 1
        (True, 2.5, "flag", 12.5),  # the flag overrides the measured model
        (True, 0.0, "flag", 10.0),  # an explicit 0 is a flag too, not "use the model"
        (False, None, "none", 10.0),  # nothing measured, nothing asked: no overhead
        (False, 2.5, "flag", 12.5),  # the flag on a profile without a model
    ],
)
def test_runner_resolves_the_host_overhead_source(
    tmp_path: Path, measured: bool, flag_ms: float | None, source: str, tpot_ms: float
) -> None:
    config = _one_at_a_time(tmp_path, measured, host_overhead_ms=flag_ms)
    resolved = resolve(config)
    assert resolved.host_overhead_source == source
    run = build_engine(resolved, fitted_executor(resolved)).run()
    # C = 1, K = 0: every step is a plain step of B = 1, prefill included (flat 10 ms).
    assert run.metrics["mean_tpot_ms"] == pytest.approx(tpot_ms)
    assert run.metrics["mean_ttft_ms"] == pytest.approx(tpot_ms)
    record = resolved_config_dict(config, resolved)["resolved"]["host_overhead"]
    assert record["source"] == source
    if source == "measured":
        assert record["model"]["plain"] == {"intercept_ms": 1.0, "per_row_ms": 0.5}
    else:
        assert record["ms"] == (flag_ms or 0.0)
    assert (
        bench_result(run, resolved, simulator_settings(resolved))["host_overhead_source"] == source
    )


PLANNING_MODEL = dataclasses.replace(
    MODEL,
    planning_plain=HostOverheadLine(intercept_ms=0.5, per_row_ms=0.25),
    planning_spec=HostOverheadLine(intercept_ms=1.5, per_row_ms=0.0),
)


@pytest.mark.parametrize(
    ("policy", "tpot_ms"),
    [
        ("static:0", 10.0 + 1.0 + 0.5),  # no line of its own: the static model
        ("per-request", 10.0 + (1.0 + 0.75) + (0.5 + 0.125)),  # its line added (K = 0 here)
        ("per-request:prior_strength=8", 10.0 + 1.75 + 0.625),  # by the SPEC's name
        (" Per-Request", 10.0 + 1.75 + 0.625),  # read as parsing reads it
    ],
)
def test_a_run_is_charged_its_policys_own_host_time_where_the_profile_timed_it(
    tmp_path: Path, policy: str, tpot_ms: float
) -> None:
    path = write_measured_profile(tmp_path / "p.json", itl_ms=10.0)
    data = json.loads(path.read_text())
    data["host_overhead"]["policies"] = {"per-request": {"intercept_ms": 0.75, "per_row_ms": 0.125}}
    path.write_text(json.dumps(data))
    workload = write_workload_file(tmp_path / "w.csv", [(16, 5)] * 2)
    # k_max 0: every step plain, so the plain line (+ the policy's) prices each one
    config = RunConfig(
        profile=str(path), policy=policy, dataset=str(workload), max_concurrency=1, k_max=0
    )
    resolved = resolve(config)
    run = build_engine(resolved, fitted_executor(resolved)).run()
    assert run.metrics["mean_tpot_ms"] == pytest.approx(tpot_ms)


def test_a_policys_line_is_added_to_both_classes_and_not_to_planning() -> None:
    extra = HostOverheadLine(intercept_ms=0.5, per_row_ms=0.125)
    model = dataclasses.replace(PLANNING_MODEL, policies=(("online", extra),))
    online = model.for_policy("online")
    assert online.overhead_ms(4, has_spec=True) == pytest.approx(MODEL.overhead_ms(4, True) + 1.0)
    assert online.overhead_ms(4, has_spec=False) == pytest.approx(MODEL.overhead_ms(4, False) + 1.0)
    assert online.planning_ms(4, has_spec=True) == PLANNING_MODEL.planning_ms(4, has_spec=True)
    assert model.for_policy("goodput") is model  # not timed: unchanged


@pytest.mark.parametrize(
    ("host_ms", "planning_ms", "overlap", "expected_extra_ms"),
    [
        (3.0, 2.0, False, 3.0),  # sync: device + all the host time
        (3.0, 2.0, True, 1.0),  # async: planning hides behind the device, the rest does not
        (3.0, 0.0, True, 3.0),  # nothing overlappable: as sync
        (30.0, 25.0, True, 25.0 + 5.0),  # planning longer than the device: it sets the pace
    ],
)
def test_async_overlaps_the_planning_part_with_the_device(
    host_ms: float, planning_ms: float, overlap: bool, expected_extra_ms: float
) -> None:
    latency = TableLatencyModel(h100_profile())
    batch = make_batch(0, [0, 1, 2], [2, 2, 2])
    device_ms = FittedExecutor(latency, RecordingAcceptance()).execute(batch).duration_s * 1000
    executor = FittedExecutor(
        latency,
        RecordingAcceptance(),
        host_overhead_ms=host_ms,
        host_planning_ms=planning_ms,
        overlap_planning=overlap,
    )
    step_ms = executor.execute(batch).duration_s * 1000.0
    if planning_ms > device_ms and overlap:
        assert step_ms == pytest.approx(expected_extra_ms)
    else:
        assert step_ms == pytest.approx(device_ms + expected_extra_ms)


def test_the_measured_models_planning_lines_overlap_under_async() -> None:
    latency = TableLatencyModel(h100_profile())
    batch = make_batch(0, [0, 1], [0, 0])  # plain step, B = 2
    device_ms = FittedExecutor(latency, RecordingAcceptance()).execute(batch).duration_s * 1000
    overlapped = FittedExecutor(
        latency, RecordingAcceptance(), host_overhead_model=PLANNING_MODEL, overlap_planning=True
    )
    # host 1 + 0.5 x 2 = 2 ms, of which planning 0.5 + 0.25 x 2 = 1 ms hides
    assert overlapped.execute(batch).duration_s * 1000 == pytest.approx(device_ms + 1.0)
    assert PLANNING_MODEL.planning_ms(2, True) == pytest.approx(1.5)
    assert MODEL.planning_ms(2, True) == 0.0  # not measured: nothing overlaps


@pytest.mark.parametrize(
    ("overhead", "planning", "message"),
    [(None, 0.5, "give both"), (1.0, 1.5, "planning <= overhead"), (1.0, -1.0, ">= 0")],
)
def test_host_planning_must_be_a_part_of_the_host_overhead(overhead, planning, message) -> None:
    with pytest.raises(InputError, match=message):
        RunConfig(policy="static:0", host_overhead_ms=overhead, host_planning_ms=planning)


@pytest.mark.parametrize(("scheduling", "tpot_ms"), [("sync", 14.0), ("async", 11.0)])
def test_async_hides_the_planning_host_time_in_a_run(
    tmp_path: Path, scheduling: str, tpot_ms: float
) -> None:
    """Flat 10 ms steps, 4 ms of host time of which 3 ms planning, C = 1, K = 0: sync pays
    10 + 4 per token, async max(10, 3) + 1 (vLLM's async scheduling)."""
    config = _one_at_a_time(
        tmp_path, False, host_overhead_ms=4.0, host_planning_ms=3.0, scheduling=scheduling
    )
    resolved = resolve(config)
    run = build_engine(resolved, fitted_executor(resolved)).run()
    assert run.metrics["mean_tpot_ms"] == pytest.approx(tpot_ms)
    record = resolved_config_dict(config, resolved)["resolved"]["host_overhead"]
    assert record["planning_ms"] == 3.0
    assert record["planning_overlaps"] == (scheduling == "async")


def test_a_run_that_does_not_overlap_charges_its_async_planning_in_series(tmp_path) -> None:
    """`ResolvedRun.host_overlap` False (dsd's engine on a CPU runs async steps serially:
    `backend.real.resolve_real`) charges async like sync, and the run's config says so."""
    config = RunConfig(
        profile=str(write_flat_profile(tmp_path / "p.json", itl_ms=10.0)),
        policy="static:0",
        scheduling="async",
        host_overhead_ms=2.0,
        host_planning_ms=2.0,
        num_prompts=2,
        output_len=8,
    )
    resolved = resolve(config)
    batch = make_batch(0, [0], [0])
    for overlap, step_ms in [(True, 10.0), (False, 12.0)]:
        run = dataclasses.replace(resolved, host_overlap=overlap)
        executor = fitted_executor(run)
        assert executor.overlap_planning is overlap
        executor.add_request(0, RequestSpec(prompt_len=4, output_len=8))
        assert executor.execute(batch).duration_s * 1000 == pytest.approx(step_ms)
        record = resolved_config_dict(config, run)["resolved"]["host_overhead"]
        assert record["planning_overlaps"] is overlap
