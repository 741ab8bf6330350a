"""Drawn acceptance: the real engine does a step's device work but accepts counts drawn before it
from the simulator's acceptance model, so a real run and its simulated twin accept alike."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mock_models import perturbed_copy, tiny_target

from dsd import api
from dsd.backend.engine import Draft, NgramDraft, SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.fast_path import FastSpecDecodeEngine
from dsd.backend.ngram import NgramConfig
from dsd.backend.pair import load_pair
from dsd.backend.real import real_engine, resolve_real
from dsd.backend.sampling import PLACEHOLDER_TOKEN_ID, drawn_accept
from dsd.policies.profile_io import load_profile, save_profile
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.engine import Engine
from dsd.sim.resolve import ResolvedRun
from dsd.sim.types import ScheduledBatch, StepOutcome

H100 = (
    Path(__file__).resolve().parents[2]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def draft(target) -> Draft:  # type: ignore[no-untyped-def]
    return Draft(perturbed_copy(target, noise_std=0.05, seed=1))


def _engine(target, draft, runner: str = "off", num_slots: int = 4) -> SpecDecodeEngine:  # type: ignore[no-untyped-def]
    config = SpecDecodeConfig(num_slots=num_slots, max_model_len=96, k_max=5, drawn_acceptance=True)
    if runner == "off":
        return SpecDecodeEngine(target, draft, config)
    return FastSpecDecodeEngine(target, draft, config, runner=runner)  # type: ignore[arg-type]


def test_drawn_accept_keeps_the_given_count_and_emits_drafts_then_the_target_token() -> None:
    drafts = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])  # [B, K]
    logits = torch.zeros((3, 4, 20))
    logits[:, :, 1] = 1.0  # the target's argmax is 1 at every position
    accepted, output = drawn_accept(drafts, logits, torch.tensor([0, 2, 3]))
    assert accepted.tolist() == [0, 2, 3]
    pad = PLACEHOLDER_TOKEN_ID
    assert output.tolist() == [[1, pad, pad, pad], [8, 9, 1, pad], [11, 12, 13, 1]]


def _prefilled(engine: SpecDecodeEngine, num_rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    slots = np.array(
        [engine.alloc_slot(rng.integers(3, 200, size=5 + row)) for row in range(num_rows)]
    )
    engine.prefill(slots, np.full(num_rows, 64))
    return slots


def _check_lengths(engine: SpecDecodeEngine, slots: np.ndarray) -> None:
    """Between steps a decoding slot's target cache holds every known token but the last."""
    assert (engine.target_cache.lengths[slots] == engine.num_tokens[slots] - 1).all()
    if engine.draft_cache is not None:
        assert (engine.draft_cache.lengths[slots] <= engine.num_tokens[slots] - 1).all()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_steps_accept_the_drawn_counts_and_roll_back_by_them(target, draft, data) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(target, draft)
    slots = _prefilled(engine, 3)
    for _ in range(data.draw(st.integers(1, 5))):
        spec = np.array(data.draw(st.lists(st.integers(0, 5), min_size=3, max_size=3)))
        drawn = np.array([data.draw(st.integers(0, int(k))) for k in spec])
        before = engine.num_tokens[slots].copy()
        result = engine.step(slots, spec, drawn)
        assert result.num_accepted.tolist() == drawn.tolist()
        assert result.num_drafted.tolist() == spec.tolist()
        assert (engine.num_tokens[slots] - before).tolist() == (drawn + 1).tolist()
        _check_lengths(engine, slots)


def test_a_k0_row_emits_the_targets_own_token(target, draft) -> None:  # type: ignore[no-untyped-def]
    drawn_engine = _engine(target, draft)
    plain = SpecDecodeEngine(
        target, draft, SpecDecodeConfig(num_slots=4, max_model_len=96, k_max=5)
    )
    drawn_slots, plain_slots = _prefilled(drawn_engine, 2), _prefilled(plain, 2)
    for _ in range(4):  # row 0 at K = 0 beside a drafting row: the same tokens as plain decoding
        drawn_result = drawn_engine.step(drawn_slots, np.array([0, 3]), np.array([0, 2]))
        plain_result = plain.step(plain_slots, np.array([0, 0]))
        assert drawn_result.emitted(0).tolist() == plain_result.emitted(0).tolist()
    assert drawn_engine.sequence(0).tolist() == plain.sequence(0).tolist()


def _steps_agree(want: SpecDecodeEngine, got: SpecDecodeEngine, seed: int, steps: int) -> None:
    """`steps` drawn-acceptance steps of 3 rows at random K and drawn counts on both engines:
    the same accepted counts (the drawn ones) and output ids, `got`'s cache lengths consistent."""
    want_slots, got_slots = _prefilled(want, 3), _prefilled(got, 3)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        spec = rng.integers(0, 6, size=3)
        drawn = rng.integers(0, spec + 1)
        expected = want.step(want_slots, spec, drawn)
        result = got.step(got_slots, spec, drawn)
        assert result.num_accepted.tolist() == expected.num_accepted.tolist() == drawn.tolist()
        assert result.output_token_ids.tolist() == expected.output_token_ids.tolist()
        _check_lengths(got, got_slots)


def test_the_fixed_shape_step_agrees_with_the_reference_step(target, draft) -> None:  # type: ignore[no-untyped-def]
    reference, fast = _engine(target, draft), _engine(target, draft, runner="eager")
    _steps_agree(reference, fast, seed=3, steps=6)
    assert fast.token_ids.tolist() == reference.token_ids.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("draft_spec", ["tiny-draft", "eagle"])
def test_cuda_graphs_accept_the_drawn_counts_as_the_eager_fixed_shape_step(draft_spec: str) -> None:
    # the drawn counts ride in the graphs' static inputs: replays take each step's own counts
    pair = load_pair("tiny", draft_spec, device="cuda", dtype="float32", seed=0)
    assert pair.draft is not None
    config = SpecDecodeConfig(num_slots=4, max_model_len=96, k_max=5, drawn_acceptance=True)
    eager = FastSpecDecodeEngine(pair.target, pair.draft, config, runner="eager")
    graphs = FastSpecDecodeEngine(pair.target, pair.draft, config, runner="cuda-graphs")
    _steps_agree(eager, graphs, seed=4, steps=10)


def test_drawn_counts_are_checked(target, draft) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(target, draft)
    slots = _prefilled(engine, 2)
    with pytest.raises(ValueError, match="needs its accepted counts"):
        engine.step(slots, np.array([2, 2]))
    with pytest.raises(ValueError, match=r"in \[0, K\]"):
        engine.step(slots, np.array([2, 1]), np.array([1, 2]))
    plain = SpecDecodeEngine(
        target, draft, SpecDecodeConfig(num_slots=2, max_model_len=96, k_max=5)
    )
    with pytest.raises(ValueError, match="without drawn acceptance"):
        plain.step(_prefilled(plain, 2), np.array([1, 1]), np.array([0, 0]))
    with pytest.raises(ValueError, match="greedy only"):
        SpecDecodeConfig(
            num_slots=2, max_model_len=96, k_max=5, drawn_acceptance=True, temperature=1
        )
    with pytest.raises(ValueError, match="not prompt lookup"):
        _engine(target, NgramDraft(NgramConfig()))


def _recording(engine: Engine) -> dict[int, list[tuple[int, int, int]]]:
    """req_id -> (K, drafted, accepted) of each of its decode steps, as the engine's executor
    reports them (recorded as the run goes)."""
    counts: dict[int, list[tuple[int, int, int]]] = {}
    execute = engine.executor.execute

    def recording_execute(batch: ScheduledBatch) -> StepOutcome:
        outcome = execute(batch)
        ks = batch.num_spec_tokens[: batch.num_decode_reqs]
        drafted = ks if outcome.num_drafted is None else outcome.num_drafted
        for req_id, k, d, a in zip(
            batch.req_ids[: batch.num_decode_reqs].tolist(),
            ks.tolist(),
            drafted.tolist(),
            outcome.num_accepted.tolist(),
            strict=True,
        ):
            counts.setdefault(int(req_id), []).append((int(k), int(d), int(a)))
        return outcome

    engine.executor.execute = recording_execute  # type: ignore[method-assign]
    return counts


def _both_sides(resolved: ResolvedRun, pair, fast_path: str = "off"):  # type: ignore[no-untyped-def]
    real = real_engine(resolved, pair, fast_path=fast_path, drawn_acceptance=True)
    simulated = build_engine(resolved, fitted_executor(resolved))
    real_counts, simulated_counts = _recording(real), _recording(simulated)
    real_result, simulated_result = real.run(), simulated.run()
    return real_counts, simulated_counts, real_result, simulated_result


@pytest.mark.parametrize(
    ("policy", "acceptance_model", "fast_path"),
    [
        ("static:3", "per-position", "off"),
        ("static:5", "heterogeneous", "eager"),
        ("goodput", "per-position", "eager"),
        ("static:4", "replay", "off"),  # the bundled early-exit recording
        ("static:5", "fewer drafts", "eager"),  # per-position, some steps drafting fewer than K
    ],
)
def test_a_real_drawn_run_accepts_what_the_simulator_accepts(
    policy: str, acceptance_model: str, fast_path: str, tmp_path: Path
) -> None:
    # the core property: the same run config and seed, the same accepted counts per request
    # and step on both sides (the validation error is then timing alone)
    pair = load_pair("tiny", "eagle", seed=0)
    profile = H100
    if acceptance_model == "fewer drafts":  # draft rates s_i < 1: d = K not always
        profile = tmp_path / "fewer.json"
        save_profile(replace(load_profile(H100), draft_rates=(0.9, 0.7, 0.5, 0.4, 0.3)), profile)
        acceptance_model = "per-position"
    config = api.run_config(
        profile=str(profile),
        policy=policy,
        acceptance_model=acceptance_model,
        num_prompts=6,
        max_concurrency=3,
        output_len=12,
        seed=5,
    )
    resolved = resolve_real(config, pair, fast_path)
    real, simulated, real_result, simulated_result = _both_sides(resolved, pair, fast_path)
    assert real == simulated
    steps = [step for own in real.values() for step in own]
    assert sum(a for _k, _d, a in steps) > 0  # the profile's rates accept something
    if profile != H100:
        assert any(d < k for k, d, _a in steps)
    columns = ["req_id", "num_output_tokens"]
    assert real_result.requests[columns].equals(simulated_result.requests[columns])
    assert (
        real_result.metrics["spec_decode_accepted_tokens"]
        == (simulated_result.metrics["spec_decode_accepted_tokens"])
    )
