"""Thompson bandit: converges to the best K on a synthetic environment, seeded, bounded."""

from __future__ import annotations

import numpy as np
import pytest
from policy_factories import h100_profile

from policies.bandit import (
    BanditConfig,
    ThompsonBanditPolicy,
    batch_bucket,
    bucket_middle_batch_size,
    profile_prior_rewards,
)
from policies.errors import InputError
from policies.goodput import ItlTable, acceptance_lengths
from policies.range_table import synthetic_view
from policies.spec import parse_policy
from policies.types import StepFeedback

# Synthetic engine: per-position rates and an ITL(B, K) with a known best K per B.
RATES = np.array([0.85, 0.65, 0.3, 0.1, 0.03])


def _itl_ms(batch_size: int, k: int) -> float:
    return 6.0 + 0.8 * k + batch_size * (0.02 + 0.03 * k)


def _true_goodput(batch_size: int) -> np.ndarray:
    """[6] expected output tokens per ms per request of each K (the arms' true means)."""
    al = 1.0 + np.concatenate(([0.0], np.cumsum(RATES)))
    return np.array([al[k] / _itl_ms(batch_size, k) for k in range(6)])


def _best_k(batch_size: int) -> int:
    return int(np.argmax(_true_goodput(batch_size)))


def _run(policy: ThompsonBanditPolicy, batch_size: int, steps: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    chosen = []
    for step in range(steps):
        k = policy.choose_k(synthetic_view(batch_size, 5))
        chosen.append(k)
        positions = np.arange(1, k + 1)
        # accepted per request: how many leading positions pass P(first i accepted) = r_i.
        draws = rng.random((batch_size, 1))
        accepted = (draws < RATES[None, :k]).sum(axis=1) if k else np.zeros(batch_size)
        duration_s = _itl_ms(batch_size, k) * rng.lognormal(0.0, 0.05) / 1e3
        policy.observe(
            StepFeedback(
                step,
                0.0,
                batch_size,
                np.arange(batch_size),
                np.full(batch_size, k),
                accepted.astype(np.int64),
                duration_s,
            )
        )
        del positions
    return chosen


@pytest.mark.parametrize("batch_size", [1, 64, 256])
def test_converges_to_the_best_arm(batch_size: int) -> None:
    # Arms within ~1-6% of each other and per-step noise of tens of % (B = 1 sees one request):
    # after 1500 steps the late plays must sit on the near-optimal arms, with little regret.
    policy = ThompsonBanditPolicy(5, 256, seed=1, config=BanditConfig(discount=1.0))
    chosen = _run(policy, batch_size, 1500, seed=2)
    truth = _true_goodput(batch_size)
    late = np.array(chosen[-300:])
    counts = np.bincount(late, minlength=6)
    assert truth[late].mean() / truth.max() > 0.97, counts
    assert np.mean(truth[late] >= 0.95 * truth.max()) > 0.9, counts
    runner_up = np.sort(truth)[-2] / truth.max()
    if runner_up < 0.96:  # a clear optimum (B=64, 256): it gets most late plays
        assert counts[_best_k(batch_size)] >= 0.6 * len(late), counts


def test_discounting_follows_a_change_of_optimum() -> None:
    # The environment flips from B=1 (best K=3) to B=256 statistics inside one bucket: rewards
    # from the old regime fade and the bandit moves to the new best arm.
    policy = ThompsonBanditPolicy(5, 256, seed=4, config=BanditConfig(discount=0.98))
    _run(policy, 256, 400, seed=5)
    assert _best_k(256) == 1
    late = np.array(_run(policy, 256, 400, seed=6)[-200:])
    assert np.mean(late == 1) > 0.5, np.bincount(late, minlength=6)


def test_best_k_differs_across_buckets() -> None:
    assert _best_k(1) != _best_k(256)  # the environment really needs per-bucket arms


def test_same_seed_same_choices() -> None:
    first = _run(ThompsonBanditPolicy(5, 256, seed=7), 16, 200, seed=3)
    second = _run(ThompsonBanditPolicy(5, 256, seed=7), 16, 200, seed=3)
    assert first == second


def test_memory_is_one_row_per_log2_bucket() -> None:
    policy = ThompsonBanditPolicy(5, 256, seed=0)
    assert policy.plays.shape == (9, 6)
    for batch_size in (1, 2, 3, 255, 256):
        assert batch_bucket(batch_size) < 9


def test_respects_view_k_max() -> None:
    policy = ThompsonBanditPolicy(5, 64, seed=0)
    assert all(policy.choose_k(synthetic_view(4, 2)) <= 2 for _ in range(10))


def test_spec_seed_sources() -> None:
    by_spec = parse_policy("bandit:seed=5", profile=None, k_max=5, max_num_seqs=64)
    by_context = parse_policy("bandit", profile=None, k_max=5, max_num_seqs=64, seed=5)
    assert isinstance(by_spec, ThompsonBanditPolicy)
    assert isinstance(by_context, ThompsonBanditPolicy)
    assert by_spec.rng.random() == by_context.rng.random()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"discount": 0.0},  # forgets everything
        {"min_relative_std": 0.0},  # no noise floor
        {"min_plays": 0},  # never explores
    ],
)
def test_bad_config_is_input_error(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="bandit"):
        BanditConfig(**kwargs)


def _true_prior() -> np.ndarray:
    """[9, 6] the synthetic environment's own goodput at each bucket's middle B."""
    return np.array([_true_goodput(round(bucket_middle_batch_size(b, 256))) for b in range(9)])


def test_a_prior_starts_on_the_prior_best_arm_without_exploring() -> None:
    policy = ThompsonBanditPolicy(5, 256, seed=1, prior_rewards=_true_prior(), prior_plays=50.0)
    first = _run(policy, 256, 20, seed=2)
    # No walk through K = 0..5: with a tight, right prior every early play is the best arm.
    assert np.mean(np.array(first) == _best_k(256)) > 0.8, first


def test_a_wrong_prior_is_corrected_by_rewards() -> None:
    wrong = _true_prior()[:, ::-1].copy()  # claims K=5 is best where K=1 is
    policy = ThompsonBanditPolicy(5, 256, seed=3, prior_rewards=wrong, prior_plays=4.0)
    # The prior fades with the discount (0.995 per step), so the right arm is found again.
    late = np.array(_run(policy, 256, 1000, seed=4)[-200:])
    assert np.mean(late == _best_k(256)) > 0.5, np.bincount(late, minlength=6)


def test_regret_with_a_right_prior_is_lower_than_without() -> None:
    truth = _true_goodput(256)
    plain = np.array(_run(ThompsonBanditPolicy(5, 256, seed=5), 256, 150, seed=6))
    warm = ThompsonBanditPolicy(5, 256, seed=5, prior_rewards=_true_prior())
    primed = np.array(_run(warm, 256, 150, seed=6))
    assert (truth.max() - truth[primed]).sum() < (truth.max() - truth[plain]).sum()


def test_profile_prior_is_goodput_per_request_of_the_profile() -> None:
    profile = h100_profile()
    prior = profile_prior_rewards(profile, 5, 256)
    assert prior.shape == (9, 6)
    # The prior's best arm per bucket is the goodput argmax at the bucket's middle B.
    for bucket in range(9):
        mid = bucket_middle_batch_size(bucket, 256)
        expected = int(
            np.argmax(
                acceptance_lengths(profile.acceptance_rates, 5)
                / ItlTable.from_profile(profile).itl_ms_at(mid, np.arange(6.0))
            )
        )
        assert int(np.argmax(prior[bucket])) == expected


@pytest.mark.parametrize(
    ("prior", "plays"),
    [
        (np.ones((9, 5)), 4.0),  # wrong shape
        (np.full((9, 6), np.nan), 4.0),  # not finite
        (np.ones((9, 6)), 0.0),  # a prior worth nothing
    ],
)
def test_bad_prior_is_input_error(prior: np.ndarray, plays: float) -> None:
    with pytest.raises(InputError, match="bandit"):
        ThompsonBanditPolicy(5, 256, seed=0, prior_rewards=prior, prior_plays=plays)


def test_spec_prior_profile_warm_starts_from_the_profile() -> None:
    profile = h100_profile()
    warm = parse_policy("bandit:prior=profile,seed=1", profile=profile, k_max=5, max_num_seqs=64)
    cold = parse_policy("bandit:seed=1", profile=profile, k_max=5, max_num_seqs=64)
    view = synthetic_view(1, 5)
    prior = profile_prior_rewards(profile, 5, 64)[batch_bucket(1)]  # [K+1]
    near_best = {int(k) for k in np.flatnonzero(prior >= 0.99 * prior.max())}  # K=2, 3 at B=1
    # The warm start plays the profile's near-best arms at once; the cold one starts its walk
    # through every arm at K=0.
    assert {int(warm.choose_k(view)) for _ in range(5)} <= near_best
    assert int(cold.choose_k(view)) not in near_best
    with pytest.raises(InputError, match="prior must be none or profile"):
        parse_policy("bandit:prior=magic", profile=profile, k_max=5, max_num_seqs=64)
    with pytest.raises(InputError, match="needs a profile"):
        parse_policy("bandit:prior=profile", profile=None, k_max=5, max_num_seqs=64)
