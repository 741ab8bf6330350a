"""A real run builds its engine the simulator's way: the same scheduler, the same policy (seeded
from the run's policy stream, with the fitted latency for `context`), the same defaults."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mock_models import mock_pair, perturbed_copy, tiny_target

from dsd import api
from dsd.backend.engine import Draft
from dsd.backend.real import real_engine, resolve_real
from dsd.policies.context_aware import ContextLatencyGrid
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import DEFAULT_MAX_NUM_SEQS
from dsd.sim.resolve import sim_seed_streams

H100 = (
    Path(__file__).resolve().parents[2]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)


@pytest.fixture(scope="module")
def pair():  # type: ignore[no-untyped-def]
    target = tiny_target(seed=0)
    return mock_pair(target, Draft(perturbed_copy(target, noise_std=0.01, seed=1)))


@pytest.mark.parametrize(
    "policy",
    ["static:2", "goodput", "context", "bandit", "online:warmup_steps=3,decay=0.9"],
)
def test_real_and_simulated_engines_of_one_config_share_scheduler_and_policy(
    pair, policy: str
) -> None:  # type: ignore[no-untyped-def]
    config = api.run_config(
        profile=str(H100), policy=policy, num_prompts=6, max_concurrency=3, output_len=8, seed=7
    )
    resolved = resolve_real(config, pair)
    real = real_engine(resolved, pair)
    simulated = build_engine(resolved, fitted_executor(resolved))
    assert real.scheduler.config == simulated.scheduler.config
    assert type(real.policy) is type(simulated.policy)
    assert real.config.clock == "wall" and simulated.config.clock == "model"


def test_defaults_are_the_simulators(pair) -> None:  # type: ignore[no-untyped-def]
    # (before: dsd run used max_num_seqs = min(256, C), max_model_len 2048, its own block size)
    config = api.run_config(policy="static:2", num_prompts=6, max_concurrency=3, output_len=8)
    resolved = resolve_real(config, pair)
    assert resolved.max_num_seqs == DEFAULT_MAX_NUM_SEQS
    longest = max(r.prompt_len + r.output_len for r in resolved.workload.requests)
    assert resolved.max_model_len == longest + resolved.k_max + 1
    assert resolved.max_running == 3  # the executor holds KV for the cap, not for 256


def test_the_bandit_of_a_real_run_is_seeded_from_the_run_seed(pair) -> None:  # type: ignore[no-untyped-def]
    # (before: dsd run --policy bandit --seed 7 ran the bandit with seed 0)
    config = api.run_config(policy="bandit", num_prompts=4, max_concurrency=2, output_len=6, seed=7)
    engine = real_engine(resolve_real(config, pair), pair)
    expected = np.random.default_rng(sim_seed_streams(7)["policy"])
    assert engine.policy.rng.bit_generator.state == expected.bit_generator.state
    other = real_engine(resolve_real(api.run_config(policy="bandit", seed=0), pair), pair)
    assert other.policy.rng.bit_generator.state != engine.policy.rng.bit_generator.state


def test_context_in_a_real_run_plans_with_the_fitted_latency(pair) -> None:  # type: ignore[no-untyped-def]
    # (before: dsd run gave the context policy no latency function, so it fell back to the
    # profile's context grid whatever --latency-model said)
    config = api.run_config(
        profile=str(H100), policy="context", latency_model="parametric", num_prompts=4
    )
    engine = real_engine(resolve_real(config, pair), pair)
    assert not isinstance(engine.policy.latency_ms, ContextLatencyGrid)
    ks = np.arange(4, dtype=np.float64)
    fitted = engine.policy.latency_ms(8.0, ks, 4096.0)
    assert np.all(np.diff(fitted) > 0)  # the parametric model prices K (and the context)


def test_no_draft_runs_at_k_max_zero(pair) -> None:  # type: ignore[no-untyped-def]
    plain = mock_pair(pair.target, None)
    resolved = resolve_real(api.run_config(policy="static", num_prompts=2), plain)
    assert resolved.k_max == 0
