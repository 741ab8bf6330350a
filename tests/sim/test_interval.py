"""Prediction intervals (sim.interval) and held-out prompts (RunConfig.held_out_prompts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.policies.profile_io import load_profile
from dsd.sim.config import RunConfig
from dsd.sim.interval import (
    INTERVAL_KEYS,
    interval_of,
    interval_seeds,
    interval_text,
    with_speed_spread,
)
from dsd.sim.resolve import config_workload
from dsd.sim.run_fields import run_config

PROFILE = "tests/data/profiles/cpu_smollm2_ngram_2026-11-27f.json"  # records 40 prompt keys
NO_KEYS = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"


def _run(**fields):
    import dsd

    base = dict(profile=PROFILE, policy="goodput", dataset="instructcoder", num_prompts=8,
                max_concurrency=2, output_len=24, acceptance_model="empirical")  # fmt: skip
    return dsd.simulate(**{**base, **fields}, keep_steps=False).metrics


def test_interval_seeds_are_a_function_of_the_seed_and_never_the_seed() -> None:
    assert interval_seeds(7, 5) == interval_seeds(7, 5)
    assert interval_seeds(7, 5) != interval_seeds(8, 5)
    assert 7 not in interval_seeds(7, 50)
    assert interval_seeds(7, 3) == interval_seeds(7, 5)[:3]  # more runs extend, not reshuffle


def test_interval_is_the_normal_sample_prediction_interval() -> None:
    interval = interval_of({"x": [1.0, 2.0, 3.0], "y": [1.0, math.nan]})
    low, high = interval.bounds["x"]
    # mean 2, s 1, t(0.95, 2) = 2.92, sqrt(1 + 1/3)
    assert low == pytest.approx(2 - 2.919986 * math.sqrt(4 / 3), rel=1e-5)
    assert high == pytest.approx(2 + 2.919986 * math.sqrt(4 / 3), rel=1e-5)
    assert all(math.isnan(v) for v in interval.bounds["y"])  # one finite draw: no interval
    assert interval.text("x") == f"90%: {low:.1f}-{high:.1f}"


def test_simulate_states_a_deterministic_interval_only_when_asked() -> None:
    plain = _run(held_out_prompts=True)
    assert not any(f"{key}_lo" in plain for key in INTERVAL_KEYS)
    first = _run(interval_runs=4, held_out_prompts=True)
    again = _run(interval_runs=4, held_out_prompts=True)
    np.testing.assert_equal(first, again)  # deterministic for a seed (NaN equal to NaN)
    assert first["interval_runs"] == 5 and first["interval_level"] == 0.9
    # the run itself is unchanged by its re-runs
    assert first["mean_tpot_ms"] == plain["mean_tpot_ms"]
    for key in INTERVAL_KEYS:
        assert first[f"{key}_lo"] <= first[f"{key}_hi"], key
    # held-out prompts are given sampled acceptance: the draws differ, the interval has width
    assert first["mean_tpot_ms_lo"] < first["mean_tpot_ms_hi"]
    other_seed = _run(interval_runs=4, held_out_prompts=True, seed=1)
    assert other_seed["mean_tpot_ms_lo"] != first["mean_tpot_ms_lo"]
    # profiled prompts replay their recorded drafts: no draw moves them, and the interval is
    # the simulator's timing error on the profile's device alone (a CPU profile: 5.8%)
    in_sample = _run(interval_runs=4)
    assert in_sample["mean_tpot_ms_sampling_lo"] == pytest.approx(
        in_sample["mean_tpot_ms_sampling_hi"]
    )
    assert in_sample["interval_timing_error"] == "cpu"
    center = in_sample["mean_tpot_ms_sampling_lo"]
    assert in_sample["mean_tpot_ms_hi"] == pytest.approx(center * 1.058, rel=1e-6)
    assert in_sample["mean_tpot_ms_lo"] == pytest.approx(center * 0.942, rel=1e-6)
    # the acceptance length has no timing error: its interval is the sampling's
    assert in_sample["acceptance_length_lo"] == pytest.approx(in_sample["acceptance_length_hi"])
    assert interval_text(first, "mean_tpot_ms").startswith("(90%: ")


def test_held_out_prompts_leave_the_profiled_ones_out() -> None:
    keys = {key for key in load_profile(PROFILE).draft_outcome_keys if key}
    config = run_config(profile=PROFILE, policy="static:2", dataset="instructcoder",
                        num_prompts=60, held_out_prompts=True)  # fmt: skip
    held_out = config_workload(config)
    assert len(held_out.requests) == 60
    assert not keys & {request.prompt_key for request in held_out.requests}
    in_sample = config_workload(run_config(profile=PROFILE, policy="static:2",
                                           dataset="instructcoder", num_prompts=60))  # fmt: skip
    assert keys <= {request.prompt_key for request in in_sample.requests}


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"profile": NO_KEYS}, "records no prompts"),
        ({"profile": PROFILE, "dataset": "random"}, "only a named prompt set"),
        ({"profile": None}, "needs a profile"),
    ],
)
def test_held_out_prompts_refuse_what_they_cannot_do(fields, fragment) -> None:
    config = RunConfig(**{"policy": "static:2", "dataset": "instructcoder",
                          "held_out_prompts": True, **fields})  # fmt: skip
    with pytest.raises(InputError, match=fragment) as raised:
        config_workload(config)
    assert str(raised.value).startswith("held_out_prompts: ")


def test_interval_runs_is_checked() -> None:
    with pytest.raises(InputError, match="interval_runs"):
        RunConfig(policy="static:2", interval_runs=-1)


def test_a_speed_spread_widens_the_times_in_quadrature() -> None:
    metrics = {"interval_level": 0.9, "mean_tpot_ms": 10.0, "mean_tpot_ms_lo": 9.0,
               "mean_tpot_ms_hi": 11.0, "output_throughput_lo": 90.0,
               "output_throughput_hi": 110.0, "acceptance_length_lo": 2.0,
               "acceptance_length_hi": 3.0}  # fmt: skip
    widened = with_speed_spread(metrics, 0.02)
    half = math.hypot(1.0, 1.644854 * 0.02 * 10.0)
    assert widened["mean_tpot_ms_lo"] == pytest.approx(10.0 - half, rel=1e-6)
    assert widened["mean_tpot_ms_hi"] == pytest.approx(10.0 + half, rel=1e-6)
    assert widened["mean_tpot_ms_sampling_lo"] == 9.0  # the sampling interval kept
    assert widened["output_throughput_hi"] == pytest.approx(100 + math.hypot(10, 1.644854 * 2))
    assert widened["acceptance_length_hi"] == 3.0  # a machine's speed moves no acceptance
    assert widened["interval_speed_sigma"] == 0.02
    assert with_speed_spread(metrics, math.nan) == metrics
    assert with_speed_spread({"mean_tpot_ms": 1.0}, 0.02) == {"mean_tpot_ms": 1.0}


def test_a_profile_from_another_engine_states_the_sampling_alone() -> None:
    import dsd

    # the PR profile was measured on vLLM, whose error against the simulator we never measured
    metrics = dsd.simulate(profile=NO_KEYS, policy="static:3", dataset="mt-bench", num_prompts=8,
                           max_concurrency=4, output_len=24, interval_runs=3,
                           keep_steps=False).metrics  # fmt: skip
    assert metrics["interval_timing_error"] == "none"
    assert "mean_tpot_ms_sampling_lo" not in metrics
    assert metrics["mean_tpot_ms_lo"] < metrics["mean_tpot_ms_hi"]
