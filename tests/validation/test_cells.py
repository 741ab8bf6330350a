"""validation.cells + validation.report: vLLM result files, real vs simulated cells, the report."""

from __future__ import annotations

import csv
import itertools
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mock_models import mock_pair, perturbed_copy, random_prompt, tiny_target

from dsd.backend.engine import Draft
from dsd.backend.fast_path import EnginePool
from dsd.backend.profiler import ProfileConfig, profile_pair
from dsd.backend.real import resolve_real
from dsd.common.errors import InputError
from dsd.policies.profile_io import save_profile
from dsd.sim.config import RunConfig
from dsd.sim.resolve import with_latency_from
from dsd.traces.datasets import RandomLengths
from dsd.validation.cells import (
    CellResult,
    SpeedProbes,
    compare_cell,
    interleaved_groups,
    measured_runs,
    median_metrics,
    simulated_run,
    validate_against_vllm,
    validation_cells,
)
from dsd.validation.report import write_validation_report
from dsd.validation.retime import TimingRounds
from dsd.validation.vllm_result import load_vllm_result, parse_vllm_result

REPO = Path(__file__).resolve().parents[2]
VLLM_RESULT = REPO / "tests" / "data" / "vllm_bench_result_small.json"
SHIPPED_PROFILE = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"


def vllm_data() -> dict:
    return json.loads(VLLM_RESULT.read_text())


def test_vllm_result_file_gives_its_workload() -> None:
    result = load_vllm_result(VLLM_RESULT)
    lens = [(r.prompt_len, r.output_len) for r in result.workload.requests]
    assert lens == [(12, 24), (20, 24), (16, 24), (16, 24)]
    assert result.workload.max_concurrency == 2
    assert math.isinf(result.request_rate)
    assert all(r.arrival_s == 0 for r in result.workload.requests)
    assert result.metrics["mean_tpot_ms"] == 4.3
    assert result.info["model_id"] == "tiny"


def test_vllm_result_with_finite_rate_is_retimed_and_failed_requests_dropped() -> None:
    data = vllm_data()
    data["request_rate"] = 10.0
    data["output_lens"][1] = 0  # vLLM records failed requests with 0 output tokens
    result = parse_vllm_result(data, "x.json")
    arrivals = [r.arrival_s for r in result.workload.requests]
    assert len(arrivals) == 3
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0


def _without(key: str) -> dict:
    data = vllm_data()
    del data[key]
    return data


def _with(key: str, value) -> dict:
    data = vllm_data()
    data[key] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_without("input_lens"), "x.json: missing key 'input_lens'"),  # the workload is needed
        (_without("max_concurrency"), "x.json: missing key 'max_concurrency'"),
        (_without("mean_tpot_ms"), "x.json: missing key 'mean_tpot_ms'"),  # nothing to compare
        (_with("output_lens", [24, 24]), "input_lens has 4 entries, output_lens 2"),
        (_with("input_lens", [12, 0, 16, 16]), r"input_lens\[1\]: must be an integer >= 1"),
        (_with("input_lens", "12"), "input_lens: must be a non-empty list"),
        (_with("max_concurrency", 0), "max_concurrency: must be null or an integer >= 1"),
        (_with("request_rate", -1), "request_rate: must be > 0"),
        (_with("burstiness", 0), "burstiness: must be a number > 0"),
        (_with("mean_ttft_ms", "fast"), "mean_ttft_ms: must be a number"),
        (_with("errors", ["", ""]), "errors: must be a list with one entry per request"),
        (_with("output_lens", [0, 0, 0, 0]), "no successful request"),
        ([1, 2], "top level must be a JSON object"),
    ],
)
def test_bad_vllm_result_raises_one_line_input_error(data, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        parse_vllm_result(data, "x.json")
    assert "\n" not in str(info.value)


def test_unreadable_or_malformed_vllm_file(tmp_path) -> None:
    with pytest.raises(InputError, match=r"missing\.json: no such file"):
        load_vllm_result(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"input_lens": [1,\n')
    with pytest.raises(InputError, match=r"broken\.json: line 2"):
        load_vllm_result(broken)


def test_simulator_against_vllm_file_uses_its_workload() -> None:
    result = load_vllm_result(VLLM_RESULT)
    config = RunConfig(
        profile=str(SHIPPED_PROFILE), policy="static:3", dataset="random", num_prompts=1
    )
    cell = validate_against_vllm(result, config)
    assert cell.simulated["completed"] == 4
    assert cell.simulated["total_output_tokens"] == 96
    assert cell.max_concurrency == 2
    assert math.isfinite(cell.error_pct("mean_tpot_ms"))
    # same config twice -> identical simulated metrics (seeded)
    again = validate_against_vllm(result, config)
    assert again.simulated["mean_tpot_ms"] == cell.simulated["mean_tpot_ms"]


@pytest.mark.parametrize(
    ("measured", "simulated", "expected"),
    [
        (10.0, 11.0, 10.0),  # sim reads 10 % high
        (10.0, 9.0, -10.0),  # sim reads 10 % low
        (0.0, 1.0, math.nan),  # no relative error against 0
        (None, 1.0, math.nan),  # metric missing on one side
    ],
)
def test_error_pct(measured, simulated, expected: float) -> None:
    cell = CellResult("static:1", 1, {"mean_tpot_ms": measured}, {"mean_tpot_ms": simulated})
    got = cell.error_pct("mean_tpot_ms")
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


@pytest.fixture(scope="module")
def tiny_pair_profile(tmp_path_factory):
    torch.set_num_threads(1)
    target = tiny_target(seed=0)
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    rng = np.random.default_rng(0)
    config = ProfileConfig(
        batch_sizes=(1, 2),
        spec_tokens=(0, 1, 2),
        context_lens=(16,),
        prefill_token_counts=(8, 32),
        num_warmup=1,
        num_iters=5,
        allow_noisy=True,  # millisecond steps of tiny models on a shared CPU are noisy
    )
    profile = profile_pair(
        target, draft, config, [random_prompt(rng, 8) for _ in range(4)], [12] * 4
    )
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    save_profile(profile, path)
    return target, draft, path


def test_real_and_simulated_cells_share_the_workload(tiny_pair_profile, tmp_path) -> None:
    target, draft, profile_path = tiny_pair_profile
    cells = []
    for policy in ("static:0", "static:2"):
        config = RunConfig(
            profile=str(profile_path),
            policy=policy,
            dataset="random",
            num_prompts=4,
            max_concurrency=2,
            max_num_seqs=2,
            random_lengths=RandomLengths(input_len=10, output_len=12),
        )
        pair = mock_pair(target, draft)
        cell = compare_cell(resolve_real(config, pair), pair)
        cells.append(cell)
        # ignore_eos on the real side: both complete every request with the same token count
        assert cell.measured["completed"] == cell.simulated["completed"] == 4
        assert cell.measured["total_output_tokens"] == cell.simulated["total_output_tokens"]
        assert cell.measured["mean_tpot_ms"] > 0 and cell.simulated["mean_tpot_ms"] > 0
    # K = 0: no drafts on either side
    assert cells[0].measured["spec_decode_num_drafts"] == 0
    assert cells[1].measured["spec_decode_num_drafts"] > 0
    # The replay is the real run's own acceptance, step for step: the same drafts and accepted
    # tokens (only timing differs), so the acceptance error is the fitted model's alone.
    for cell in cells:
        for key in (
            "spec_decode_num_drafts",
            "spec_decode_draft_tokens",
            "spec_decode_accepted_at_pos",
            "spec_decode_accepted_tokens",
            "total_output_tokens",
        ):
            assert cell.replayed[key] == cell.measured[key], key
        assert cell.timing_error_pct("mean_tpot_ms") == pytest.approx(
            (cell.replayed["mean_tpot_ms"] / cell.measured["mean_tpot_ms"] - 1) * 100
        )
    written = write_validation_report(tmp_path / "report", cells, {"command": "dsd validate x"})
    names = {p.name for p in written}
    assert {"report.md", "cells.csv", "config.json", "tpot_vs_concurrency.png"} <= names
    assert "k_over_time.png" in names
    rows = list(csv.DictReader((tmp_path / "report" / "cells.csv").open()))
    assert [r["policy"] for r in rows] == ["static:0", "static:2"]
    report = (tmp_path / "report" / "report.md").read_text()
    prompts = rows[1]["num_prompts"]  # stated per cell
    assert "dsd validate x" in report and f"| static:2 | 2 | {prompts} | mean TPOT |" in report
    config = json.loads((tmp_path / "report" / "config.json").read_text())
    assert set(config["summary"]) == {
        f"{stat}_abs_{part}_error_pct"
        for stat in ("median", "max")
        for part in ("tpot", "timing", "acceptance", "speed_adjusted", "speed_adjusted_timing")
    } | {"interval_cells", "interval_coverage", "median_interval_half_width_pct"}
    assert "timing_error_pct_mean_tpot_ms" in rows[0] and rows[1]["replayed_mean_tpot_ms"]
    leftovers = [p for p in (tmp_path / "report").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # atomic writes leave no temp files


def test_report_summary_ignores_nan_cells(tmp_path) -> None:
    cells = [
        CellResult("a", 1, {"mean_tpot_ms": 10.0}, {"mean_tpot_ms": 12.0}),
        CellResult("a", 2, {"mean_tpot_ms": 10.0}, {"mean_tpot_ms": 9.0}),
        CellResult("a", 4, {"mean_tpot_ms": 0.0}, {"mean_tpot_ms": 9.0}),  # NaN error
    ]
    write_validation_report(tmp_path, cells, {})
    summary = json.loads((tmp_path / "config.json").read_text())["summary"]
    assert summary["median_abs_tpot_error_pct"] == pytest.approx(15.0)
    assert summary["max_abs_tpot_error_pct"] == pytest.approx(20.0)


def test_speed_adjusted_error_divides_every_trial_by_its_machine_speed(tmp_path) -> None:
    trials = ({"mean_tpot_ms": 13.0}, {"mean_tpot_ms": 15.0})
    simulated, replayed = {"mean_tpot_ms": 10.0}, {"mean_tpot_ms": 12.0}
    cell = CellResult(
        "a",
        1,
        median_metrics(trials),
        simulated,
        measured_trials=trials,
        replayed=replayed,
        trial_speeds=(1.3, 1.25),  # the trials at the pricing speed: 10 and 12 ms
    )
    assert cell.error_pct("mean_tpot_ms") == pytest.approx(-400 / 14)
    assert cell.machine_speed == pytest.approx(1.275)
    assert cell.speed_adjusted_measured("mean_tpot_ms") == pytest.approx(11.0)
    assert cell.speed_adjusted_error_pct("mean_tpot_ms") == pytest.approx(-100 / 11)
    assert cell.speed_adjusted_timing_error_pct("mean_tpot_ms") == pytest.approx(100 / 11)
    assert cell.trial_spread_pct("mean_tpot_ms") == pytest.approx(200 / 14)
    assert cell.trial_spread_pct("mean_tpot_ms", speed_adjusted=True) == pytest.approx(200 / 11)
    unprobed = CellResult("a", 1, median_metrics(trials), simulated, measured_trials=trials)
    assert math.isnan(unprobed.speed_adjusted_error_pct("mean_tpot_ms"))
    assert math.isnan(unprobed.machine_speed)
    assert math.isnan(unprobed.trial_spread_pct("mean_tpot_ms", speed_adjusted=True))
    partly = replace(cell, trial_speeds=(1.3, float("nan")))  # every trial needs a speed
    assert math.isnan(partly.speed_adjusted_measured("mean_tpot_ms"))
    write_validation_report(tmp_path / "probed", [cell], {})
    write_validation_report(tmp_path / "unprobed", [unprobed], {})
    probed_report = (tmp_path / "probed" / "report.md").read_text()
    assert "Machine speed" in probed_report and "1.25-1.30 over the trials" in probed_report
    assert "Machine speed" not in (tmp_path / "unprobed" / "report.md").read_text()
    row = next(csv.DictReader((tmp_path / "probed" / "cells.csv").open()))
    assert float(row["machine_speed"]) == pytest.approx(1.275)
    assert float(row["speed_adjusted_error_pct_mean_tpot_ms"]) == pytest.approx(-100 / 11)
    assert float(row["speed_adjusted_measured_mean_tpot_ms"]) == pytest.approx(11.0)
    assert float(row["speed_adjusted_trial_spread_pct_mean_tpot_ms"]) == pytest.approx(200 / 11)
    trials_rows = list(csv.DictReader((tmp_path / "probed" / "trials.csv").open()))
    assert [(r["trial"], r["machine_speed"], r["mean_tpot_ms"]) for r in trials_rows] == [
        ("1", "1.3", "13.0"),
        ("2", "1.25", "15.0"),
    ]
    unprobed_rows = list(csv.DictReader((tmp_path / "unprobed" / "trials.csv").open()))
    assert [r["machine_speed"] for r in unprobed_rows] == ["", ""]
    # No step tables with executor times (as from a vLLM file): no steps.csv, no step split
    assert not (tmp_path / "unprobed" / "steps.csv").exists()
    assert "outside the executor" not in probed_report


def _tiny_cells(profile_path, pair, cells, fast_path="off"):
    """Resolved closed-loop cells of 2 random prompts: (policy, C) each."""
    return [
        resolve_real(
            RunConfig(
                profile=str(profile_path),
                policy=policy,
                dataset="random",
                num_prompts=2,
                max_concurrency=concurrency,
                random_lengths=RandomLengths(input_len=8, output_len=6),
            ),
            pair,
            fast_path,
        )
        for policy, concurrency in cells
    ]


def test_every_group_of_real_trials_is_bracketed_by_timing_rounds(tiny_pair_profile) -> None:
    """A timing round before the first group and after each; the cells of one C run as one
    group and share its probe window's speed; the simulated side is priced by the re-timed
    profile, the policy keeps the cell's own."""
    target, draft, profile_path = tiny_pair_profile
    pair = mock_pair(target, draft)
    resolved = _tiny_cells(profile_path, pair, [("static:0", 1), ("static:1", 1), ("static:1", 2)])
    timing = TimingRounds(target, draft, resolved[0].profile, share=1.0)
    cells = validation_cells(resolved, pair, trials=2, timing=timing)
    # before the first, then per trial and group (C = 1: 2 cells; C = 2) a window and a round
    assert timing.num_rounds == 1 + 2 * 2 * 2
    assert all(len(cell.trial_speeds) == 2 for cell in cells)
    assert all(math.isfinite(speed) for cell in cells for speed in cell.trial_speeds)
    assert cells[0].trial_speeds == cells[1].trial_speeds  # one group, one window per trial
    assert cells[0].trial_speeds != cells[2].trial_speeds
    # every group was probed between its steps: rounds 1, 3, 5, 7 are windows
    windows = {1 + 2 * group for group in range(4)}
    probed = [r for samples in timing._decode.values() for r, _ms in samples if r in windows]
    assert set(probed) == windows
    retimed = timing.profile()
    for cell, own in zip(cells, resolved, strict=True):
        priced = simulated_run(with_latency_from(own, retimed)).metrics
        assert cell.simulated["mean_tpot_ms"] == priced["mean_tpot_ms"]
        assert cell.simulated["mean_tpot_ms"] != simulated_run(own).metrics["mean_tpot_ms"]


@pytest.mark.parametrize("fast_path", ["off", "eager"])
def test_interleaved_cells_do_the_work_they_do_alone(tiny_pair_profile, fast_path) -> None:
    """Cells run a step at a time together take the same steps, drafts and tokens as each
    alone; on a fast path each lane has its own pooled engine, kept for the next group."""
    target, draft, profile_path = tiny_pair_profile
    pair = mock_pair(target, draft)
    resolved = _tiny_cells(profile_path, pair, [("static:0", 2), ("static:2", 2)], fast_path)
    engines = EnginePool()
    together = measured_runs(resolved, pair, fast_path=fast_path, engines=engines)
    alone = [measured_runs([cell], pair, fast_path=fast_path)[0] for cell in resolved]
    work = ["batch_size", "num_spec_tokens", "num_accepted_tokens"]
    for a, b in zip(together, alone, strict=True):
        assert a.output_ids == b.output_ids and a.prompt_ids == b.prompt_ids
        assert a.steps[work].equals(b.steps[work])
    assert together[0].steps["num_spec_tokens"].max() == 0
    assert together[1].steps["num_spec_tokens"].max() > 0
    assert len(engines) == (2 if fast_path == "eager" else 0)
    again = measured_runs(resolved[::-1], pair, fast_path=fast_path, engines=engines)
    assert [run.output_ids for run in again] == [run.output_ids for run in alone[::-1]]
    assert len(engines) == (2 if fast_path == "eager" else 0)  # the lanes' engines served again


def test_closed_loop_cells_of_one_concurrency_form_a_group() -> None:
    def cell(concurrency, closed_loop=True):
        return SimpleNamespace(
            workload=SimpleNamespace(closed_loop=closed_loop, max_concurrency=concurrency)
        )

    cells = [cell(1), cell(2), cell(1), cell(4, closed_loop=False), cell(2), cell(4, False)]
    assert interleaved_groups(cells) == [[0, 2], [1, 4], [3], [5]]  # type: ignore[arg-type]


def _stand_in_cells(*policy_and_concurrency: tuple[str, int]) -> list[SimpleNamespace]:
    """Closed-loop stand-ins for resolved cells: what `validation_cells` reads of them."""
    return [
        SimpleNamespace(
            config=SimpleNamespace(policy=policy),
            workload=SimpleNamespace(closed_loop=True, max_concurrency=concurrency),
        )
        for policy, concurrency in policy_and_concurrency
    ]


@pytest.mark.parametrize(
    ("deadline_s", "rounds"),
    [(None, 5), (1000.0, 5), (45.0, 2), (39.0, 1), (0.0, 1)],
)
def test_a_deadline_stops_whole_rounds(monkeypatch, deadline_s, rounds) -> None:
    """Each real run takes 10 s on a fake clock (two cells: 20 s a round). A round starts only
    if the mean round so far says it ends by the deadline; the first always runs, and every
    cell gets the same number of trials."""
    import dsd.validation.cells as validate_module

    clock = {"now": 0.0}
    monkeypatch.setattr(validate_module.time, "monotonic", lambda: clock["now"])

    def fake_runs(cells, pair, fast_path, between_steps, engines, drawn_acceptance):
        clock["now"] += 10.0 * len(cells)
        return [resolved.config.policy for resolved in cells]

    monkeypatch.setattr(validate_module, "measured_runs", fake_runs)
    monkeypatch.setattr(validate_module, "cell_result", lambda resolved, runs, pair: tuple(runs))
    cells = _stand_in_cells(("a", 1), ("b", 2))
    done = validation_cells(cells, None, trials=5, deadline_s=deadline_s)
    assert done == [("a",) * rounds, ("b",) * rounds]


@pytest.mark.parametrize("trials", [1, 2])
def test_cells_run_alone_one_at_a_time_and_the_last_round_lets_each_c_go(
    monkeypatch, trials: int
) -> None:
    """interleave=False: every cell its own group, and the drawn flag passed to the runs; in
    the last round each new C gets a fresh engine pool (the one of the C before is let go),
    earlier rounds keep one pool for all (the engines' shapes reused)."""
    import dsd.validation.cells as validate_module

    seen = []

    def fake_runs(cells, pair, fast_path, between_steps, engines, drawn_acceptance):
        seen.append(([r.config.policy for r in cells], engines, drawn_acceptance))
        return [resolved.config.policy for resolved in cells]

    monkeypatch.setattr(validate_module, "measured_runs", fake_runs)
    monkeypatch.setattr(validate_module, "cell_result", lambda resolved, runs, pair: tuple(runs))
    cells = _stand_in_cells(("a", 1), ("b", 1), ("c", 2))
    done = validation_cells(cells, None, trials=trials, interleave=False, drawn_acceptance=True)
    assert done == [("a",) * trials, ("b",) * trials, ("c",) * trials]
    assert all(len(policies) == 1 and drawn for policies, _pool, drawn in seen)
    concurrency = {"a": 1, "b": 1, "c": 2}
    last = seen[-3:]  # the last round, rotated by trials - 1: a b c, or b c a
    for (before, pool_before, _), (after, pool_after, _) in itertools.pairwise(last):
        same_c = concurrency[before[0]] == concurrency[after[0]]
        assert (pool_before is pool_after) == same_c
    if trials > 1:  # the first round ran every cell on one pool
        assert all(pool is seen[0][1] for _policies, pool, _drawn in seen[:3])


def test_speed_probes_take_their_share_of_the_steps_time() -> None:
    """10 ms steps, 20 ms probes, a quarter share: the probes' total stays within one probe of
    a quarter of the steps' total, all in the trial's window, at B <= C (every B uncapped)."""
    calls = []
    longest_s = [0.0]  # the longest probe: a loaded machine oversleeps

    class Timing:
        decode_keys = ((65, 1, 0), (65, 4, 2))

        def open_window(self) -> int:
            return 7

        def probe(self, window: int, max_batch: int) -> None:
            calls.append((window, max_batch))
            start_s = time.perf_counter()
            time.sleep(0.02)
            longest_s[0] = max(longest_s[0], time.perf_counter() - start_s)

    probes = SpeedProbes(Timing(), None, share=0.25)  # type: ignore[arg-type]
    for _ in range(40):
        time.sleep(0.01)
        probes()
    assert probes._probes_s <= 0.25 * probes._steps_s + longest_s[0] + 0.005
    assert probes._probes_s >= 0.25 * probes._steps_s - 0.03
    assert len(calls) >= 4 and set(calls) == {(7, 4)}
    assert SpeedProbes(Timing(), 2).max_batch == 2  # type: ignore[arg-type]


def test_machine_drift_benchmark_prints_windows_and_refuses_bad_input(
    load_benchmark, capsys
) -> None:
    """benchmarks/machine_drift.py on small weights: a row per full window, the summary lines,
    and one-line errors."""
    module = load_benchmark("machine_drift")
    assert module.main(["--seconds", "0.6", "--window-s", "0.2", "--weights-mb", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    windows = [line.split() for line in out[2:] if line.split()[0].isdigit()]
    assert 2 <= len(windows) <= 3 and all(float(value) > 0 for row in windows for value in row[1:])
    assert any(line.startswith("run windows spread") for line in out)
    assert any("correlation wall-thread CPU time" in line for line in out)
    assert module.main(["--seconds", "0"]) == 2
    assert module.main(["--seconds", "1", "--window-s", "1"]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_machine_speed_spread_widens_every_cell_interval() -> None:
    from dsd.validation.cells import CellResult, machine_speed_sigma, with_machine_spread

    simulated = {"interval_level": 0.9, "mean_tpot_ms": 10.0, "mean_tpot_ms_lo": 9.5,
                 "mean_tpot_ms_hi": 10.5}  # fmt: skip
    cells = [
        CellResult("static:0", c, {"mean_tpot_ms": 10.0}, dict(simulated), trial_speeds=speeds)
        for c, speeds in ((1, (0.97, 1.0)), (2, (1.03, 1.01)))
    ]
    sigma = machine_speed_sigma(cells)
    assert sigma == pytest.approx(np.std(np.log([0.97, 1.0, 1.03, 1.01]), ddof=1))
    widened = with_machine_spread(cells)
    for cell in widened:
        low, high = cell.interval("mean_tpot_ms")
        assert low < 9.5 and high > 10.5 and cell.simulated["interval_speed_sigma"] == sigma
    # without timing rounds there are no speeds: the intervals stay the sampling ones
    plain = [CellResult("static:0", 1, {"mean_tpot_ms": 10.0}, dict(simulated))]
    assert with_machine_spread(plain)[0].interval("mean_tpot_ms") == (9.5, 10.5)
