"""sim.runner: config validation, determinism, hand-checked TPOT, defaults, ablation switches."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dsd.common.errors import InputError
from dsd.sim.build import run_simulation
from dsd.sim.config import RunConfig
from dsd.sim.models.ablation import FixedBatchPolicy
from dsd.sim.resolve import resolve, resolved_config_dict

H100 = (
    Path(__file__).resolve().parents[2]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)


def write_flat_profile(path: Path, itl_ms: float, itl_ms_at_b4: float | None = None) -> Path:
    """A PR #32374 profile whose ITL is `itl_ms` at every K (B=1) and `itl_ms_at_b4` at B=4.

    The same ITL at B=1 and B=4 makes the prefill slope (estimated from the decode table) 0, so
    every step costs exactly `itl_ms`.
    """
    at_b4 = itl_ms if itl_ms_at_b4 is None else itl_ms_at_b4
    data = {
        "is_online": False,
        "batch_stats": {
            "1": {"0": itl_ms, "1": itl_ms, "2": itl_ms},
            "4": {"0": at_b4, "1": at_b4, "2": at_b4},
        },
        "max_num_speculative_tokens": 2,
        "acceptance_rate_per_pos": [0.5, 0.25],
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_workload_file(path: Path, lengths: list[tuple[int, int]]) -> Path:
    """A workload CSV in our schema: (prompt_len, output_len) per request, all at t=0."""
    rows = "\n".join(f"{p},{o}" for p, o in lengths)
    path.write_text("prompt_len,output_len\n" + rows + "\n", encoding="utf-8")
    return path


def _config(**overrides: Any) -> RunConfig:
    base: dict[str, Any] = {
        "profile": str(H100),
        "policy": "goodput",
        "dataset": "mt-bench",
        "num_prompts": 12,
        "max_concurrency": 4,
    }
    base.update(overrides)
    return RunConfig(**base)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_prompts", 0, "num_prompts: must be an integer >= 1"),  # no requests
        (
            "max_num_seqs",
            10**11,
            r"max_num_seqs: must be an integer in \[1, 1048576\]",
        ),  # dense tables over B
        ("max_concurrency", -1, "max_concurrency: must be an integer >= 1"),  # negative cap
        ("request_rate", 0.0, "request_rate: must be > 0"),  # nothing would arrive
        ("request_rate", math.nan, "request_rate: must be"),  # NaN rate
        ("burstiness", 0.0, "burstiness: must be > 0"),  # gamma shape 0
        ("scheduling", "eager", "scheduling: choose from sync, async"),  # unknown mode
        ("max_num_seqs", 0, r"max_num_seqs: must be an integer in \[1,"),  # empty running set
        ("max_num_batched_tokens", 0, "max_num_batched_tokens"),  # zero budget
        ("max_model_len", 1, "max_model_len: must be an integer >= 2"),  # no room to decode
        ("k_max", -1, r"k_max: must be an integer in \[0, 64\]"),  # negative K
        ("latency_model", "lut", "latency_model: choose from"),  # unknown model
        ("acceptance_model", "oracle", "acceptance_model: choose from"),  # unknown model
        ("host_overhead_ms", -0.5, "host_overhead_ms: must be >= 0"),  # negative time
        ("host_overhead_ms", math.inf, "host_overhead_ms: must be >= 0"),  # infinite time
        ("jitter_sigma", -1.0, "jitter_sigma"),  # negative noise
        ("prefill_cost", "cheap", "prefill_cost: choose from"),  # unknown ablation
        ("fixed_batch_size", 0, "fixed_batch_size"),  # B = 0
        ("seed", -3, "seed: must be an integer >= 0"),  # SeedSequence needs >= 0
        ("seed", 1.5, "seed: must be an integer"),  # not an integer
        ("policy", "  ", "policy: must be a non-empty string"),  # blank SPEC
        ("num_prompts", True, "num_prompts: must be an integer"),  # bool is not a count
    ],
)
def test_config_rejects_bad_fields_naming_the_field(field: str, value: Any, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        _config(**{field: value})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"profile": "/no/such/profile.json"}, "no such file"),  # missing profile
        ({"policy": "fastest"}, "unknown policy"),  # unknown SPEC name
        ({"policy": "static:9", "k_max": 5}, "exceeds k_max"),  # K above the given k_max
        ({"dataset": "no-such-set"}, "unknown workload"),  # unknown dataset
        ({"latency_model": "table", "k_max": 7}, "does not cover"),  # table cannot do K=7
        ({"max_model_len": 8}, "max_model_len: 8 must exceed the longest prompt"),  # too short
    ],
)
def test_resolve_rejects_bad_inputs(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        resolve(_config(**overrides))


@pytest.mark.parametrize(
    ("overrides", "k_max"),
    [
        ({"policy": "static:7"}, 7),  # a static K past the profile's k_max (5) sets it
        ({"policy": "static:2"}, 5),  # below it: the profile's
        ({"policy": "table:[[1,4,6],[5,256,1]]"}, 6),  # a range table's largest K
        ({"policy": "goodput"}, 5),  # a policy that fixes no K: the profile's
        ({"policy": "static:2", "k_max": 3}, 3),  # a given k_max wins
    ],
)
def test_k_max_follows_the_policy_when_none_is_given(overrides: dict[str, Any], k_max: int) -> None:
    assert resolve(_config(**overrides)).k_max == k_max


def test_config_is_picklable_and_equal_after_a_round_trip() -> None:
    config = _config(acceptance_model="per-position", jitter_sigma=0.05)
    assert pickle.loads(pickle.dumps(config)) == config


def test_same_seed_gives_identical_metrics_and_tables() -> None:
    config = _config(jitter_sigma=0.05)
    first, second = run_simulation(config), run_simulation(config)
    assert json.dumps(first.metrics, sort_keys=True) == json.dumps(second.metrics, sort_keys=True)
    pd.testing.assert_frame_equal(first.requests, second.requests)
    pd.testing.assert_frame_equal(first.steps, second.steps)


def test_different_seed_gives_different_metrics() -> None:
    first = run_simulation(_config(seed=1))
    second = run_simulation(_config(seed=2))
    assert first.metrics["mean_tpot_ms"] != second.metrics["mean_tpot_ms"]


def test_latency_noise_does_not_change_the_acceptance_draws() -> None:
    # Closed loop with arrivals at 0: the step sequence depends on token counts only, so with
    # separate seed streams, noise changes the times but not one accepted count.
    quiet = run_simulation(_config(policy="static:3"))
    noisy = run_simulation(_config(policy="static:3", jitter_sigma=0.1))
    assert noisy.metrics["num_steps"] == quiet.metrics["num_steps"]
    assert (
        noisy.metrics["spec_decode_accepted_at_pos"] == quiet.metrics["spec_decode_accepted_at_pos"]
    )
    assert noisy.metrics["mean_tpot_ms"] != quiet.metrics["mean_tpot_ms"]


def test_tpot_matches_hand_calculation_with_a_fixed_latency(tmp_path: Path) -> None:
    # Every step costs 10 ms (flat ITL table, zero prefill slope). One client, static:0:
    # request = 1 prefill step (first token at 10 ms) + 4 decode steps (one token each).
    profile = write_flat_profile(tmp_path / "flat.json", itl_ms=10.0)
    workload = write_workload_file(tmp_path / "w.csv", [(16, 5)] * 3)
    config = RunConfig(
        profile=str(profile),
        policy="static:0",
        dataset=str(workload),
        max_concurrency=1,
        acceptance_model="per-position",
    )
    metrics = run_simulation(config).metrics
    assert metrics["completed"] == 3
    assert metrics["mean_ttft_ms"] == pytest.approx(10.0)
    assert metrics["mean_tpot_ms"] == pytest.approx((50.0 - 10.0) / (5 - 1))
    assert metrics["mean_e2el_ms"] == pytest.approx(50.0)
    assert metrics["mean_itl_ms"] == pytest.approx(10.0)
    assert metrics["duration"] == pytest.approx(3 * 0.050)
    assert metrics["num_steps"] == 3 * 5
    assert metrics["k_histogram"] == {0: 12}


def test_host_overhead_adds_to_every_step(tmp_path: Path) -> None:
    profile = write_flat_profile(tmp_path / "flat.json", itl_ms=10.0)
    workload = write_workload_file(tmp_path / "w.csv", [(16, 5)] * 2)
    config = RunConfig(
        profile=str(profile),
        policy="static:0",
        dataset=str(workload),
        max_concurrency=1,
        host_overhead_ms=2.5,
    )
    metrics = run_simulation(config).metrics
    assert metrics["mean_tpot_ms"] == pytest.approx(12.5)
    assert metrics["mean_ttft_ms"] == pytest.approx(12.5)


def test_defaults_resolve_to_the_profile_and_a_pool_without_preemption() -> None:
    config = _config(num_prompts=8, max_concurrency=8)
    resolved = resolve(config)
    longest = max(r.prompt_len + r.output_len for r in resolved.workload.requests)
    assert resolved.k_max == 5  # the PR profile's k_max
    assert resolved.max_model_len == longest + 5 + 1
    assert resolved.num_kv_blocks == 8 * math.ceil(resolved.max_model_len / 16)
    # the table covers K=0..5, but the fit holds better between the profiled B
    assert resolved.latency_kind == "parametric"
    choice = resolved_config_dict(config, resolved)["resolved"]["latency_model"]["choice"]
    assert choice["reason"].startswith("worst |error| at a profiled B, held out or fitted")
    assert set(choice["scores"]) == {"table", "parametric"}
    assert run_simulation(config).num_preemptions == 0


def test_k_max_beyond_the_profile_picks_the_parametric_model() -> None:
    resolved = resolve(_config(k_max=7, policy="static:7"))
    assert resolved.latency_kind == "parametric"
    info = resolved_config_dict(resolved.config, resolved)["resolved"]["latency_model"]
    assert info["kind"] == "parametric" and info["fit_max_abs_pct"] >= 0
    assert info["choice"] == {
        "reason": "the table does not cover K=0..7 at every profiled B",
        "scores": {},
    }


def test_a_small_kv_pool_preempts_but_completes() -> None:
    result = run_simulation(_config(num_kv_blocks=80, max_concurrency=8, num_prompts=16))
    assert result.num_preemptions > 0
    assert result.metrics["completed"] == 16


def test_async_scheduling_runs_and_differs_from_sync() -> None:
    sync = run_simulation(_config(policy="static:3"))
    async_ = run_simulation(_config(policy="static:3", scheduling="async"))
    assert async_.metrics["completed"] == sync.metrics["completed"] == 12
    assert async_.metrics["mean_ttft_ms"] != sync.metrics["mean_ttft_ms"]


@pytest.mark.parametrize("acceptance_model", ["heterogeneous", "per-position", "replay"])
def test_every_acceptance_model_runs(acceptance_model: str) -> None:
    metrics = run_simulation(_config(policy="static:3", acceptance_model=acceptance_model)).metrics
    assert metrics["completed"] == 12
    assert 1.0 < metrics["spec_decode_acceptance_length"] <= 4.0


def test_free_prefill_lowers_ttft_and_never_raises_tpot() -> None:
    charged = run_simulation(_config(policy="static:3", max_concurrency=8, num_prompts=24))
    free = run_simulation(
        _config(policy="static:3", max_concurrency=8, num_prompts=24, prefill_cost="free")
    )
    assert free.metrics["mean_ttft_ms"] < charged.metrics["mean_ttft_ms"]
    assert free.metrics["mean_tpot_ms"] <= charged.metrics["mean_tpot_ms"] + 1e-9


def test_fixed_batch_charges_every_decode_step_at_that_batch(tmp_path: Path) -> None:
    # A table where ITL depends on B only: 10 ms at B=1, 40 ms at B=4. One client: the real
    # batch is 1, but fixed_batch_size=4 charges the decode steps at B=4.
    profile = write_flat_profile(tmp_path / "b.json", itl_ms=10.0, itl_ms_at_b4=40.0)
    workload = write_workload_file(tmp_path / "w.csv", [(16, 5)])
    config = RunConfig(
        profile=str(profile),
        policy="static:0",
        dataset=str(workload),
        max_concurrency=1,
        fixed_batch_size=4,
    )
    metrics = run_simulation(config).metrics
    # The prefill-only step keeps its own cost: ITL(1, 0) + 15 tokens x (40 - 10) / (4 - 1) ms.
    assert metrics["mean_ttft_ms"] == pytest.approx(10.0 + 15 * 10.0)
    assert metrics["mean_tpot_ms"] == pytest.approx(40.0)


def test_fixed_batch_policy_shows_the_fixed_b() -> None:
    seen: list[int] = []

    class Recorder:
        def choose_k(self, view: Any) -> int:
            seen.append(view.batch_size)
            return 0

        def observe(self, feedback: Any) -> None:
            return None

    from dsd.policies.types import StepView

    view = StepView(0, 0.0, 3, 3, np.arange(3), np.zeros(3, dtype=np.int64), 5)
    FixedBatchPolicy(Recorder(), 64).choose_k(view)
    assert seen == [64]


def test_resolved_config_dict_is_json_and_names_versions_and_seeds() -> None:
    config = _config()
    data = resolved_config_dict(config)
    text = json.dumps(data, sort_keys=True)
    assert json.loads(text)["config"]["request_rate"] == "inf"
    assert set(data["versions"]) == {"dsd", "python", "numpy", "simpy"}
    assert data["seeds"]["acceptance"]["spawn_key"] == [3, 0]
    assert data["resolved"]["latency_model"]["prefill_source"] == "estimated-from-physical-model"
    assert dataclasses.asdict(config)["policy"] == data["config"]["policy"]


def test_streamed_metrics_equal_kept_metrics(monkeypatch):
    """Tiny compaction, spill and block sizes change memory use, not results."""
    import dsd.sim.metrics as metrics_module
    from dsd.sim.build import build_engine, fitted_executor
    from dsd.sim.engine import LoopConfig
    from dsd.sim.resolve import resolve

    config = _config(num_prompts=40, max_concurrency=8, request_rate=20.0)
    kept = run_simulation(config)
    monkeypatch.setattr(metrics_module, "COMPACT_MIN_CHUNKS", 5)
    monkeypatch.setattr(metrics_module, "COMPACT_MAX_STEPS", 3)
    monkeypatch.setattr(metrics_module, "DEFAULT_MAX_IN_MEMORY", 7)
    monkeypatch.setattr(metrics_module, "STEP_BLOCK_ROWS", 512)
    blocks: list[dict[str, Any]] = []
    resolved = resolve(config)
    streamed = build_engine(
        resolved, fitted_executor(resolved), LoopConfig(step_sink=blocks.append)
    ).run()

    assert streamed.steps.empty and list(streamed.steps.columns) == list(kept.steps.columns)
    assert len(blocks) > 1 and all(len(block) <= 512 for block in blocks)
    frames = [pd.DataFrame(block) for block in blocks]
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), kept.steps)
    pd.testing.assert_frame_equal(streamed.requests, kept.requests)
    approximate = {"mean_itl_ms", "std_itl_ms"}  # summed in another order once spilled
    for key in approximate:
        assert streamed.metrics[key] == pytest.approx(kept.metrics[key], rel=1e-12), key

    def exact(metrics: dict[str, Any]) -> str:
        rest = {key: value for key, value in metrics.items() if key not in approximate}
        return json.dumps(rest, sort_keys=True, default=str)

    assert exact(streamed.metrics) == exact(kept.metrics)
