"""backend.profiler: ITL points per (B, K, context), prefill, acceptance counts, config checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from mock_models import perturbed_copy, random_prompt, tiny_target

from backend.engine import Draft, EngineConfig
from backend.fast_path import build_engine
from backend.profiler import ProfileConfig, measure_acceptance, profile_pair
from policies.errors import InputError
from policies.profile_io import load_profile, save_profile


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


def small_config(**overrides) -> ProfileConfig:
    values = dict(
        batch_sizes=(1, 3),
        spec_tokens=(0, 1, 3),
        context_lens=(8, 20),
        prefill_token_counts=(4, 16),
        num_warmup=1,
        num_iters=4,
    )
    values.update(overrides)
    return ProfileConfig(**values)  # type: ignore[arg-type]


def prompts(count: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [random_prompt(rng, n) for n in rng.integers(3, 12, size=count)]


@pytest.mark.parametrize("fast_path", ["off", "eager"])
def test_profile_has_every_point_and_round_trips(target, tmp_path, fast_path: str) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    config = small_config(fast_path=fast_path)
    profile = profile_pair(target, draft, config, prompts(), [10] * 5, {"command": "test"})
    keys = {(p.batch_size, p.num_spec_tokens, p.context_len) for p in profile.latency}
    # context_len records the tokens each row holds: the context plus the first sampled token
    assert keys == {(b, k, c + 1) for b in (1, 3) for k in (0, 1, 3) for c in (8, 20)}
    for point in profile.latency:
        assert point.n == 4
        assert point.p10_ms <= point.median_ms <= point.p90_ms
    assert [p.num_tokens for p in profile.prefill] == [4, 16]
    assert profile.k_max == 3
    assert profile.metadata["command"] == "test"
    assert profile.metadata["fast_path"] == fast_path
    for key in ("device", "dtype", "versions", "date"):
        assert key in profile.metadata
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded.acceptance_rates == pytest.approx(profile.acceptance_rates)
    assert len(loaded.latency) == len(profile.latency)


def test_acceptance_counts_are_unconditional_and_consistent(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    engine = build_engine(target, draft, EngineConfig(num_slots=2, max_model_len=64, k_max=3))
    counts = measure_acceptance(engine, prompts(4), [12, 9, 15, 6], k_max=3)
    drafted = np.array(counts.drafted_at_pos)
    accepted = np.array(counts.accepted_at_pos)
    assert (drafted == drafted[0]).all()  # every counted step drafted k_max
    assert (np.diff(accepted) <= 0).all()  # accepting i+1 drafts means accepting i
    assert ((accepted >= 0) & (accepted <= drafted)).all()
    assert 0 < accepted[0] < drafted[0]  # this draft both agrees and disagrees
    assert len(counts.per_request_rates) == 4
    for rates in counts.per_request_rates:
        assert all(b <= a for a, b in itertools.pairwise(rates))


def test_identical_draft_accepts_every_position(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.0, seed=1))
    profile = profile_pair(target, draft, small_config(), prompts(3), [10] * 3)
    assert profile.acceptance_rates == (1.0, 1.0, 1.0)


def test_profile_is_seed_reproducible_except_timing(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    first = profile_pair(target, draft, small_config(seed=3), prompts(), [10] * 5)
    second = profile_pair(target, draft, small_config(seed=3), prompts(), [10] * 5)
    assert first.drafted_at_pos == second.drafted_at_pos
    assert first.accepted_at_pos == second.accepted_at_pos
    assert first.per_request_rates == second.per_request_rates


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_sizes": (2, 4)}, "batch_sizes: must include 1"),  # the format needs B = 1
        ({"spec_tokens": (0, 3)}, "spec_tokens: must include 0 and 1"),  # goodput needs K = 1
        ({"spec_tokens": (0,)}, "spec_tokens"),  # K_max >= 1
        ({"batch_sizes": (1, 1)}, "duplicate"),
        ({"context_lens": (0,)}, "context_lens"),
        ({"num_iters": 0}, "num_iters"),
        ({"fast_path": "turbo"}, "fast_path"),
        ({"fast_path": "eager", "temperature": 0.5}, "greedy only"),  # fast path is greedy
    ],
)
def test_profile_config_rejects_bad_values(overrides, message: str) -> None:
    with pytest.raises(InputError, match=message):
        small_config(**overrides)


def test_profile_needs_a_draft(target) -> None:
    with pytest.raises(InputError, match="draft"):
        profile_pair(target, None, small_config(), prompts(), [10] * 5)
