"""backend.profiler.measure_acceptance with a drafter that drafts fewer than K (n-gram lookup).

Checks the counting rules: over the rows that asked for k_max, drafted_at_pos counts d >= i
(vLLM's per-position draft count), accepted_at_pos counts a >= i, the per-request (d, a)
histograms sum to them, and r_i = P(a >= i), s_i = P(d >= i) are over ALL those rows, the ones
that drafted nothing included; a model draft gives s_i = 1 and the old rates.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mock_models import perturbed_copy, random_prompt, tiny_target

from dsd.backend.engine import Draft, NgramDraft, SpecDecodeConfig, StepResult
from dsd.backend.fast_path import build_spec_decode_engine
from dsd.backend.ngram import NgramConfig
from dsd.backend.profiler import ProfileConfig, measure_acceptance, profile_pair
from dsd.policies.profile import outcome_matrices
from dsd.policies.profile_io import load_profile, save_profile


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


def repeating_prompts() -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    block = random_prompt(rng, 5)
    return [
        np.concatenate([block, block, block[:2]]),
        random_prompt(rng, 7),
        np.concatenate([random_prompt(rng, 3), block, block]),
        np.concatenate([block[:3], block[:3], block[:3]]),
    ]


def test_ngram_counts_follow_the_drafted_counts_the_engine_reports(target) -> None:
    draft = NgramDraft(NgramConfig(1, 2))
    engine = build_spec_decode_engine(
        target, draft, SpecDecodeConfig(num_slots=2, max_model_len=64, k_max=3)
    )
    # Log what the engine reported, to count independently of the function under test.
    logged: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    real_step = engine.step

    def logging_step(slots: np.ndarray, ks: np.ndarray) -> StepResult:
        result = real_step(slots, ks)
        full = np.asarray(ks) == 3
        logged.append((np.asarray(ks), result.num_drafted[full], result.num_accepted[full]))
        return result

    engine.step = logging_step  # type: ignore[method-assign]
    counts = measure_acceptance(engine, repeating_prompts(), [14, 10, 12, 9], k_max=3)
    drafted = np.concatenate([d for _, d, _ in logged])  # [F] rows that asked for k_max
    accepted = np.concatenate([a for _, _, a in logged])  # [F]
    positions = np.arange(1, 4)
    assert counts.num_steps_at_k_max == drafted.size
    assert counts.drafted_at_pos == tuple((drafted[:, None] >= positions).sum(axis=0).tolist())
    assert counts.accepted_at_pos == tuple((accepted[:, None] >= positions).sum(axis=0).tolist())
    # The lookup drafted fewer than K (and nothing) on some rows, and accepted something.
    assert (drafted < 3).any() and (drafted == 0).any() and accepted.sum() > 0
    # The per-request histograms are lower triangular and sum to the global counts.
    joint = outcome_matrices(counts.draft_outcomes, 3)  # [R, 4, 4]
    assert len(counts.draft_outcomes) == len(counts.per_request_rates) == 4
    assert int(joint.sum()) == counts.num_steps_at_k_max
    pooled = joint.sum(axis=0)
    assert tuple(int(pooled[i:].sum()) for i in positions) == counts.drafted_at_pos
    assert tuple(int(pooled[:, i:].sum()) for i in positions) == counts.accepted_at_pos
    # Per request: r_i = P(a >= i) over that request's rows.
    for rates, request_joint in zip(counts.per_request_rates, joint, strict=True):
        steps = request_joint.sum()
        assert rates == pytest.approx([request_joint[:, i:].sum() / steps for i in positions])


def test_ngram_profile_has_draft_rates_over_all_steps_and_round_trips(target, tmp_path) -> None:
    draft = NgramDraft(NgramConfig(1, 2))
    config = ProfileConfig(
        batch_sizes=(1, 2),
        spec_tokens=(0, 1, 3),
        context_lens=(24,),
        prefill_token_counts=(4,),
        num_warmup=1,
        num_iters=2,
        host_overhead_output_len=0,
        allow_noisy=True,
    )
    keys = ["k0", "", "k2", "k3"]  # "": a prompt without text
    profile = profile_pair(
        target, draft, config, repeating_prompts(), [12, 10, 12, 9], prompt_keys=keys
    )
    # one key per outcome row, the key of the prompt the row was measured on
    assert len(profile.draft_outcome_keys) == len(profile.draft_outcomes) == 4
    assert profile.draft_outcome_keys == tuple(keys)
    with pytest.raises(ValueError, match="3 prompt keys for 4 prompts"):
        profile_pair(
            target, draft, config, repeating_prompts(), [12, 10, 12, 9], None, None, keys[:3]
        )
    steps = profile.num_acceptance_steps
    assert steps is not None and profile.draft_rates is not None
    assert profile.acceptance_rates == tuple(a / steps for a in profile.accepted_at_pos or ())
    assert profile.draft_rates == tuple(d / steps for d in profile.drafted_at_pos or ())
    assert profile.draft_rates[0] < 1.0  # some step that asked found nothing
    assert all(r <= s for r, s in zip(profile.acceptance_rates, profile.draft_rates, strict=True))
    path = tmp_path / "ngram_profile.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded.draft_rates == profile.draft_rates
    assert loaded.acceptance_rates == profile.acceptance_rates
    assert loaded.draft_outcomes == profile.draft_outcomes
    assert loaded.draft_outcome_keys == profile.draft_outcome_keys
    assert loaded.num_acceptance_steps == steps


def test_model_draft_drafts_every_position_so_rates_are_unchanged(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    engine = build_spec_decode_engine(
        target, draft, SpecDecodeConfig(num_slots=2, max_model_len=64, k_max=3)
    )
    rng = np.random.default_rng(0)
    prompts = [random_prompt(rng, n) for n in (4, 9, 6)]
    counts = measure_acceptance(engine, prompts, [12, 9, 10], k_max=3)
    assert counts.drafted_at_pos == (counts.num_steps_at_k_max,) * 3  # s_i = 1
    joint = outcome_matrices(counts.draft_outcomes, 3).sum(axis=0)
    assert joint[:3].sum() == 0  # every counted row drafted k_max
