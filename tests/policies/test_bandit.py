"""Bandits: the structured bandit's posteriors and choices, then the independent-arm baseline."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_factories import H100_PROFILE, h100_profile

from dsd.common.errors import InputError
from dsd.policies.bandit import (
    PREFILL_TOKENS_UNIT,
    AcceptancePosterior,
    BanditConfig,
    BanditPolicy,
    StepTimePosterior,
    conditional_counts,
)
from dsd.policies.bandit_arms import (
    ArmsBanditConfig,
    ArmsBanditPolicy,
    batch_bucket,
    bucket_middle_batch_size,
    profile_prior_rewards,
)
from dsd.policies.goodput import ItlTable, acceptance_lengths
from dsd.policies.profile_io import load_profile, parse_profile, profile_to_native, save_profile
from dsd.policies.range_table import synthetic_view
from dsd.policies.spec import parse_policy
from dsd.policies.types import StepFeedback

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


def _run(policy: ArmsBanditPolicy, batch_size: int, steps: int, seed: int) -> list[int]:
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
    policy = ArmsBanditPolicy(5, 256, seed=1, config=ArmsBanditConfig(discount=1.0))
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
    policy = ArmsBanditPolicy(5, 256, seed=4, config=ArmsBanditConfig(discount=0.98))
    _run(policy, 256, 400, seed=5)
    assert _best_k(256) == 1
    late = np.array(_run(policy, 256, 400, seed=6)[-200:])
    assert np.mean(late == 1) > 0.5, np.bincount(late, minlength=6)


def test_best_k_differs_across_buckets() -> None:
    assert _best_k(1) != _best_k(256)  # the environment really needs per-bucket arms


def test_same_seed_same_choices() -> None:
    first = _run(ArmsBanditPolicy(5, 256, seed=7), 16, 200, seed=3)
    second = _run(ArmsBanditPolicy(5, 256, seed=7), 16, 200, seed=3)
    assert first == second


def test_memory_is_one_row_per_log2_bucket() -> None:
    policy = ArmsBanditPolicy(5, 256, seed=0)
    assert policy.plays.shape == (9, 6)
    for batch_size in (1, 2, 3, 255, 256):
        assert batch_bucket(batch_size) < 9


def test_respects_view_k_max() -> None:
    policy = ArmsBanditPolicy(5, 64, seed=0)
    assert all(policy.choose_k(synthetic_view(4, 2)) <= 2 for _ in range(10))


def test_spec_seed_sources() -> None:
    by_spec = parse_policy("bandit:model=arms,seed=5", profile=None, k_max=5, max_num_seqs=64)
    by_context = parse_policy("bandit:model=arms", profile=None, k_max=5, max_num_seqs=64, seed=5)
    assert isinstance(by_spec, ArmsBanditPolicy)
    assert isinstance(by_context, ArmsBanditPolicy)
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
        ArmsBanditConfig(**kwargs)


def _true_prior() -> np.ndarray:
    """[9, 6] the synthetic environment's own goodput at each bucket's middle B."""
    return np.array([_true_goodput(round(bucket_middle_batch_size(b, 256))) for b in range(9)])


def test_a_prior_starts_on_the_prior_best_arm_without_exploring() -> None:
    policy = ArmsBanditPolicy(5, 256, seed=1, prior_rewards=_true_prior(), prior_plays=50.0)
    first = _run(policy, 256, 20, seed=2)
    # No walk through K = 0..5: with a tight, right prior every early play is the best arm.
    assert np.mean(np.array(first) == _best_k(256)) > 0.8, first


def test_a_wrong_prior_is_corrected_by_rewards() -> None:
    wrong = _true_prior()[:, ::-1].copy()  # claims K=5 is best where K=1 is
    policy = ArmsBanditPolicy(5, 256, seed=3, prior_rewards=wrong, prior_plays=4.0)
    # The prior fades with the discount (0.995 per step), so the right arm is found again.
    late = np.array(_run(policy, 256, 1000, seed=4)[-200:])
    assert np.mean(late == _best_k(256)) > 0.5, np.bincount(late, minlength=6)


def test_regret_with_a_right_prior_is_lower_than_without() -> None:
    truth = _true_goodput(256)
    plain = np.array(_run(ArmsBanditPolicy(5, 256, seed=5), 256, 150, seed=6))
    warm = ArmsBanditPolicy(5, 256, seed=5, prior_rewards=_true_prior())
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
        ArmsBanditPolicy(5, 256, seed=0, prior_rewards=prior, prior_plays=plays)


def test_spec_prior_profile_warm_starts_from_the_profile() -> None:
    profile = h100_profile()
    warm = parse_policy(
        "bandit:model=arms,prior=profile,seed=1", profile=profile, k_max=5, max_num_seqs=64
    )
    cold = parse_policy("bandit:model=arms,seed=1", profile=profile, k_max=5, max_num_seqs=64)
    view = synthetic_view(1, 5)
    prior = profile_prior_rewards(profile, 5, 64)[batch_bucket(1)]  # [K+1]
    near_best = {int(k) for k in np.flatnonzero(prior >= 0.99 * prior.max())}  # K=2, 3 at B=1
    # The warm start plays the profile's near-best arms at once; the cold one starts its walk
    # through every arm at K=0.
    assert {int(warm.choose_k(view)) for _ in range(5)} <= near_best
    assert int(cold.choose_k(view)) not in near_best
    with pytest.raises(InputError, match="prior must be none, profile or a profile file"):
        parse_policy("bandit:prior=magic", profile=profile, k_max=5, max_num_seqs=64)
    with pytest.raises(InputError, match="needs a profile"):
        parse_policy("bandit:prior=profile", profile=None, k_max=5, max_num_seqs=64)


# --------------------------------------------------------------------------------------------
# Structured bandit
# --------------------------------------------------------------------------------------------


def _feedback(
    step: int, num_rows: int, k: int, accepted: np.ndarray, duration_ms: float, batch_size: int = 0
) -> StepFeedback:
    return StepFeedback(
        step,
        0.0,
        batch_size or num_rows,
        np.arange(num_rows, dtype=np.int64),
        np.full(num_rows, k, dtype=np.int64),
        accepted.astype(np.int64),
        duration_ms / 1e3,
    )


def _accepted_rows(
    rng: np.random.Generator, rates: np.ndarray, num_rows: int, k: int
) -> np.ndarray:
    """[num_rows] accepted drafts with P(first i accepted) = rates[i-1] (unconditional)."""
    if k == 0:
        return np.zeros(num_rows, dtype=np.int64)
    draws = rng.random((num_rows, 1))  # one uniform per row: nested events, monotone in i
    return (draws < rates[None, :k]).sum(axis=1).astype(np.int64)


def _drive(
    policy: BanditPolicy,
    num_rows: int,
    steps: int,
    seed: int,
    rates: np.ndarray = RATES,
    itl_ms=_itl_ms,  # type: ignore[no-untyped-def]
    start_step: int = 0,
) -> list[int]:
    """Sync loop: choose_k, then observe that step's outcome from the synthetic engine."""
    rng = np.random.default_rng(seed)
    chosen = []
    for step in range(start_step, start_step + steps):
        view = dataclasses.replace(synthetic_view(num_rows, 5), step_index=step)
        k = policy.choose_k(view)
        chosen.append(k)
        accepted = _accepted_rows(rng, rates, num_rows, k)
        policy.observe(_feedback(step, num_rows, k, accepted, itl_ms(num_rows, k)))
    return chosen


@pytest.mark.parametrize(
    ("num_spec", "num_accepted", "trials", "successes"),
    [
        ([3], [3], [1, 1, 1], [1, 1, 1]),  # all accepted: a success at every drafted position
        ([3], [1], [1, 1, 0], [1, 0, 0]),  # rejected at 2: position 3 was never reached
        ([0, 2], [0, 0], [1, 0, 0], [0, 0, 0]),  # K=0 row counts nowhere
        ([1, 3], [1, 2], [2, 1, 1], [2, 1, 0]),  # mixed K: the K=1 row stops at position 1
    ],
)
def test_conditional_counts_count_reached_positions(
    num_spec: list[int], num_accepted: list[int], trials: list[int], successes: list[int]
) -> None:
    got_trials, got_successes = conditional_counts(
        np.array(num_spec), np.array(num_accepted), k_max=3
    )
    assert got_trials.tolist() == trials
    assert got_successes.tolist() == successes


def test_acceptance_posterior_concentrates_on_the_true_rates() -> None:
    posterior = AcceptancePosterior(np.full(5, 0.5), prior_rows=2.0, discount=1.0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        posterior.observe(np.full(64, 5), _accepted_rows(rng, RATES, 64, 5))
    np.testing.assert_allclose(posterior.mean_rates(), RATES, atol=0.02)
    draws = np.array([posterior.sample_rates(rng) for _ in range(200)])  # [200, 5]
    assert np.all(np.diff(draws, axis=1) <= 0)  # every draw is non-increasing in position
    assert draws.std(axis=0).max() < 0.02


def test_step_time_posterior_concentrates_on_the_true_slope() -> None:
    # Durations from the synthetic ITL at two batch sizes, K spread over 0..5: the posterior
    # mean reproduces ITL(D, K) for every K (the slope is identified) and is confident.
    posterior = StepTimePosterior(256, BanditConfig(), None, 5)
    rng = np.random.default_rng(1)
    for _ in range(300):
        num_rows, k = int(rng.choice([32, 64])), int(rng.integers(0, 6))
        noisy = _itl_ms(num_rows, k) * rng.lognormal(0.0, 0.01)
        posterior.observe(posterior.features(num_rows, np.array([k]), 0.0)[0], noisy)
    mean, chol = posterior.posterior()
    ks = np.arange(6.0)
    for num_rows in (32, 48, 64):
        features = posterior.features(num_rows, ks, 0.0)  # [6, P]
        truth = np.array([_itl_ms(num_rows, int(k)) for k in ks])
        np.testing.assert_allclose(features @ mean, truth, rtol=0.01)
        predictive_std = np.linalg.norm(features @ chol, axis=1)  # [6]
        assert np.all(predictive_std < 0.01 * truth)


def test_step_time_posterior_learns_the_prefill_cost() -> None:
    posterior = StepTimePosterior(64, BanditConfig(), None, 5)
    rng = np.random.default_rng(2)
    for _ in range(200):
        k, prefill = int(rng.integers(0, 6)), float(rng.choice([0.0, 512.0, 2048.0]))
        duration = _itl_ms(16, k) + 0.01 * prefill  # 10 ms per 1024 prompt tokens... x1.024
        posterior.observe(posterior.features(16, np.array([k]), prefill)[0], duration)
    mean, _ = posterior.posterior()
    assert mean[-1] == pytest.approx(0.01 * PREFILL_TOKENS_UNIT, rel=0.02)


def _best_k_for(rates: np.ndarray, itl_ms, num_rows: int) -> int:  # type: ignore[no-untyped-def]
    al = 1.0 + np.concatenate(([0.0], np.cumsum(rates)))
    return int(np.argmax([al[k] / itl_ms(num_rows, k) for k in range(6)]))


def _cheap_drafts_ms(num_rows: int, k: int) -> float:
    return 10.0 + 0.2 * k


def _dear_drafts_ms(num_rows: int, k: int) -> float:
    return 10.0 + 6.0 * k + 2.0 * (k > 0)


HIGH_RATES = np.array([0.95, 0.9, 0.85, 0.8, 0.75])
LOW_RATES = np.array([0.3, 0.08, 0.02, 0.005, 0.001])


@pytest.mark.parametrize(
    ("rates", "itl_ms", "num_rows"),
    [
        (HIGH_RATES, _cheap_drafts_ms, 8),  # drafts almost free and accepted: K = 5
        (LOW_RATES, _dear_drafts_ms, 8),  # drafts dear and rejected: K = 0
        (RATES, _itl_ms, 1),  # the synthetic engine at B = 1: a middle K
        (RATES, _itl_ms, 256),  # ... and at B = 256, where verification is dear: K = 1
    ],
)
def test_picks_the_best_k_when_the_model_makes_it_clear(
    rates: np.ndarray,
    itl_ms,
    num_rows: int,  # type: ignore[no-untyped-def]
) -> None:
    policy = BanditPolicy(5, 256, seed=3)
    chosen = np.array(_drive(policy, num_rows, 400, seed=4, rates=rates, itl_ms=itl_ms))
    best = _best_k_for(rates, itl_ms, num_rows)
    late = chosen[-150:]
    truth = np.array(
        [(1 + np.concatenate(([0.0], np.cumsum(rates)))[k]) / itl_ms(num_rows, k) for k in range(6)]
    )
    # Near-ties (B = 1: K = 3 and 4 within 1%) may share plays; regret must be tiny either way.
    assert truth[late].mean() / truth.max() > 0.99, np.bincount(late, minlength=6)
    if np.sort(truth)[-2] < 0.97 * truth.max():
        assert np.mean(late == best) > 0.9, np.bincount(late, minlength=6)


def test_exploration_ends_within_a_few_dozen_steps() -> None:
    # At B = 256 the wrong K cost up to 40%: the structured bandit must stop playing them soon.
    policy = BanditPolicy(5, 256, seed=5)
    chosen = np.array(_drive(policy, 256, 300, seed=6))
    best = _best_k(256)
    assert np.sum(chosen[50:] != best) <= 5, chosen.tolist()


def test_structured_bandit_same_seed_same_choices() -> None:
    first = _drive(BanditPolicy(5, 256, seed=7), 16, 200, seed=3)
    second = _drive(BanditPolicy(5, 256, seed=7), 16, 200, seed=3)
    assert first == second


def test_structured_bandit_follows_a_drop_in_acceptance() -> None:
    # Easy phase (K = 5 best with cheap drafts), then the drafts stop being accepted: the
    # discounted acceptance posterior moves and K falls to 0 within the phase.
    policy = BanditPolicy(5, 64, seed=8)
    easy = _drive(policy, 8, 300, seed=9, rates=HIGH_RATES, itl_ms=_dear_drafts_ms)
    # K = 4 and 5 are within 0.5% of each other here: both count as right.
    assert _best_k_for(HIGH_RATES, _dear_drafts_ms, 8) == 4
    assert np.mean(np.array(easy[-100:]) >= 4) > 0.9, np.bincount(easy, minlength=6)
    hard = _drive(policy, 8, 400, seed=10, rates=LOW_RATES, itl_ms=_dear_drafts_ms, start_step=300)
    assert np.mean(np.array(hard[-100:]) == 0) > 0.9, np.bincount(hard, minlength=6)


def test_async_feedback_one_step_late_uses_its_own_k_and_prefill() -> None:
    # Async order: choose_k(t+1) comes before observe(t). The feedback's own K is used, and the
    # prefill tokens of step t come from the view of step t (not t+1).
    policy = BanditPolicy(5, 64, seed=9)
    rng = np.random.default_rng(10)
    pending: list[tuple[int, int, float]] = []
    for step in range(300):
        prefill = float(rng.choice([0, 1024]))
        view = dataclasses.replace(
            synthetic_view(16, 5),
            step_index=step,
            num_tokens=16 + int(prefill),
            batch_size=17 if prefill else 16,
            scheduling="async",
        )
        pending.append((step, policy.choose_k(view), prefill))
        if len(pending) == 2:
            done, k, done_prefill = pending.pop(0)
            accepted = _accepted_rows(rng, RATES, 16, k)
            duration = _itl_ms(16, k) + 0.02 * done_prefill
            policy.observe(_feedback(done, 16, k, accepted, duration, batch_size=17))
    mean, _ = policy.step_time.posterior()
    assert mean[-1] == pytest.approx(0.02 * PREFILL_TOKENS_UNIT, rel=0.05)
    np.testing.assert_allclose(
        policy.step_time.features(16, np.arange(6.0), 0.0) @ mean,
        [_itl_ms(16, k) for k in range(6)],
        rtol=0.02,
    )


def test_zero_duration_and_empty_steps_leave_everything_finite() -> None:
    policy = BanditPolicy(5, 64, seed=11)
    empty = np.zeros(0, dtype=np.int64)
    policy.observe(StepFeedback(0, 0.0, 3, empty, empty, empty, 0.01))  # prefill only
    policy.observe(_feedback(1, 4, 2, np.array([2, 1, 0, 2]), 0.0))  # zero duration
    policy.observe(_feedback(2, 4, 2, np.array([2, 1, 0, 2]), float("nan")))  # broken clock
    policy.observe(_feedback(3, 4, 2, np.array([2, 1, 0, 2]), float("inf")))
    mean, chol = policy.step_time.posterior()
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(chol))
    assert np.all(np.isfinite(policy.acceptance.mean_rates()))
    assert policy.step_time.num_obs == 0  # no duration was usable
    for batch_size in (0, 1, 64):
        k = policy.choose_k(synthetic_view(batch_size, 5))
        assert 0 <= k <= 5
    assert np.all(np.isfinite(policy.mean_goodput(8)))
    _drive(policy, 8, 20, seed=12)
    assert np.all(np.isfinite(policy.mean_goodput(8)))


def test_structured_bandit_respects_view_k_max_and_max_num_seqs() -> None:
    policy = BanditPolicy(5, 64, seed=0)
    assert all(policy.choose_k(synthetic_view(4, 2)) <= 2 for _ in range(20))
    assert policy.choose_k(synthetic_view(4, 0)) == 0
    with pytest.raises(InputError, match="exceeds max_num_seqs"):
        policy.choose_k(synthetic_view(65, 5))


def test_profile_prior_starts_on_the_profiles_goodput_k() -> None:
    profile = h100_profile()
    policy = BanditPolicy(5, 64, seed=1, profile=profile)
    goodput = acceptance_lengths(profile.acceptance_rates, 5) / ItlTable.from_profile(
        profile
    ).itl_ms_at(1.0, np.arange(6.0))
    near_best = {int(k) for k in np.flatnonzero(goodput >= 0.99 * goodput.max())}
    assert {policy.choose_k(synthetic_view(1, 5)) for _ in range(10)} <= near_best


@pytest.mark.parametrize(
    "kwargs",
    [
        {"acceptance_discount": 0.0},  # forgets everything
        {"latency_discount": 1.5},  # grows old data
        {"acceptance_prior_rows": 0.0},  # a prior worth nothing
        {"min_relative_noise": float("nan")},  # not finite
        {"slope_prior_std": -1.0},  # negative spread
        {"max_exploration_loss": 0.0},  # would forbid any K below the mean's best
        {"min_best_probability": 1.0},  # no K is the best in more than all draws
        {"min_best_probability": -0.1},
    ],
)
def test_bad_structured_config_is_input_error(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="bandit: "):
        BanditConfig(**kwargs)


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("bandit", BanditPolicy),  # default: the structured bandit
        ("bandit:model=linear,seed=3", BanditPolicy),  # named explicitly
        ("bandit:model=arms", ArmsBanditPolicy),  # the independent-arm baseline
        ("bandit:acceptance_discount=0.95,latency_discount=1", BanditPolicy),  # keys
        ("bandit:model=arms,discount=0.9,min_plays=2", ArmsBanditPolicy),  # arms keys
        ("bandit:prior=profile", BanditPolicy),  # profile-seeded priors
    ],
)
def test_spec_builds_the_named_bandit(spec: str, kind: type) -> None:
    policy = parse_policy(spec, profile=h100_profile(), k_max=5, max_num_seqs=64)
    assert isinstance(policy, kind)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bandit:model=tree", "model must be linear or arms"),  # unknown model
        ("bandit:prior=magic", "profile file; magic: no such file"),  # neither word nor file
        ("bandit:prior=", "prior must be none, profile or a profile file"),  # empty
        ("bandit:discount=0.9", "expected key=value with key in"),  # an arms key on linear
        ("bandit:acceptance_discount=fast", "acceptance_discount must be a number"),  # not a number
        ("bandit:acceptance_discount=2", "acceptance_discount must be in"),  # out of range
        ("bandit:seed=-1", "seed must be >= 0"),  # negative seed
    ],
)
def test_spec_errors_are_one_line_input_errors(spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as error:
        parse_policy(spec, profile=None, k_max=5, max_num_seqs=64)
    assert "\n" not in str(error.value)


def test_structured_spec_seed_sources() -> None:
    by_spec = parse_policy("bandit:seed=5", profile=None, k_max=5, max_num_seqs=64)
    by_context = parse_policy("bandit", profile=None, k_max=5, max_num_seqs=64, seed=5)
    assert isinstance(by_spec, BanditPolicy)
    assert isinstance(by_context, BanditPolicy)
    assert by_spec.rng.random() == by_context.rng.random()


# --------------------------------------------------------------------------------------------
# Structured bandit: the batch it decides at, the exploration check, the learned profile
# --------------------------------------------------------------------------------------------


def _mixed_view(batch_size: int, num_decode: int, step: int = 0) -> object:
    """A ramp-up step: `num_decode` decode rows plus prefill chunks up to `batch_size`."""
    return dataclasses.replace(
        synthetic_view(num_decode, 5),
        step_index=step,
        batch_size=batch_size,
        num_tokens=num_decode + 512 * (batch_size - num_decode),
    )


def test_decides_at_the_batch_prefill_chunks_included() -> None:
    # With the H100 profile as prior, K = 0 is best at B = 256 and K > 0 at B = 8. A step of 8
    # decode rows among 256 scheduled requests is decided at B = 256, like every other policy.
    policy = BanditPolicy(5, 256, seed=3, profile=h100_profile())
    ramp_up = [policy.choose_k(_mixed_view(256, 8, step)) for step in range(50)]
    small = [policy.choose_k(_mixed_view(8, 8, step)) for step in range(50, 100)]
    assert max(ramp_up) == 0
    assert min(small) > 0


def test_exploration_check_drops_far_and_seldom_best_draws() -> None:
    # At B = 256 under the profile prior the mean sees K > 0 lose >= 10% of K = 0's goodput;
    # plain Thompson still drafts on a few percent of steps, the checked policy (nearly) never.
    plain = BanditPolicy(
        5,
        256,
        seed=4,
        config=BanditConfig(max_exploration_loss=1.0),
        profile=h100_profile(),
    )
    checked = BanditPolicy(5, 256, seed=4, profile=h100_profile())
    mean = checked.mean_goodput(256)
    assert mean.argmax() == 0 and mean[1:].max() < 0.95 * mean[0]
    view = synthetic_view(256, 5)
    plain_drafts = sum(plain.choose_k(view) > 0 for _ in range(2000))
    checked_drafts = sum(checked.choose_k(view) > 0 for _ in range(2000))
    assert plain_drafts >= 20
    assert checked_drafts <= plain_drafts / 10


def test_exploration_check_keeps_draws_that_are_often_best() -> None:
    # Little evidence (a cold prior and a handful of steps): every K is often the best, so the
    # check lets Thompson explore and it settles on the synthetic engine's best K = 2 or on
    # K = 3, 0.6% below it (too close to tell apart in 300 steps); K = 4 is 7% below.
    policy = BanditPolicy(5, 64, seed=5)
    chosen = _drive(policy, 8, 300, seed=6)
    assert len(set(chosen[:30])) >= 3
    assert np.mean(np.isin(chosen[-100:], [2, 3])) > 0.95


def test_exploration_check_explores_when_the_means_best_is_in_doubt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A posterior that doubts its mean's best K = 5 while spreading the doubt: each other K is
    # the best in at most 3 of the 32 check draws (under min_best_probability's 8), K = 5 in
    # 18. The draw is played (a K-slope the data do not pin down is how a cold bandit held
    # K = 5 for a whole MT-Bench C = 256 run). A confident mean still overrides a seldom-best K.
    policy = BanditPolicy(5, 256, seed=0)
    spread = [5] * 18 + [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4]
    confident = [5] * 29 + [0, 0, 0]
    for winners, explores in ((spread, True), (confident, False)):
        one_hot = iter(np.eye(6)[winners])  # [32, 6]: goodput of each check draw
        monkeypatch.setattr(policy, "expected_goodput", lambda *_, draws=one_hot: next(draws))
        assert policy._worth_exploring(0, 5, 256, 5) is explores


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1000, 1003])
def test_cold_bandit_does_not_lock_into_k5_at_mt_bench_c256(seed: int) -> None:
    """The runs that held K = 5 throughout (mean TPOT +50% over static:0) before the check
    looked at the mean's own doubt: PR profile, parametric model, 1,024 prompts."""
    from dsd.sim.build import run_simulation
    from dsd.sim.config import RunConfig

    def tpot(policy: str) -> float:
        config = RunConfig(
            profile=str(H100_PROFILE),
            policy=policy,
            seed=seed,
            dataset="mt-bench",
            num_prompts=1024,
            max_concurrency=256,
        )
        return float(run_simulation(config).metrics["mean_tpot_ms"])

    assert tpot("bandit") < 1.03 * tpot("static:0")


def test_learned_profile_is_none_before_a_timed_decode_step() -> None:
    policy = BanditPolicy(5, 64, seed=0)
    assert policy.learned_profile() is None
    empty = np.zeros(0, dtype=np.int64)
    policy.observe(StepFeedback(0, 0.0, 3, empty, empty, empty, 0.01))  # prefill only
    assert policy.learned_profile() is None


def test_learned_profile_holds_what_the_runs_taught_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy = BanditPolicy(5, 64, seed=7)
    _drive(policy, 8, 300, seed=8)
    _drive(policy, 32, 300, seed=9, start_step=300)
    learned = policy.learned_profile()
    assert learned is not None
    # A profile on disk like any other: it round-trips through the native reader.
    path = tmp_path / "learned_profile.json"
    save_profile(learned, path)
    assert load_profile(path) == learned
    # Knots 1..32 (a profile starts at B = 1); n = observed steps, none below B = 8.
    assert learned.batch_sizes() == [1, 2, 4, 8, 16, 32]
    steps_at = {p.batch_size: p.n for p in learned.latency if p.num_spec_tokens == 0}
    assert steps_at == {1: None, 2: None, 4: None, 8: 300, 16: None, 32: 300}
    assert learned.metadata["observed_steps"] == 600
    assert sum(learned.metadata["observed_steps_per_k"]) == 600
    # The K it settled on is measured to within the noise floor, where it played it.
    best_8, best_32 = _best_k(8), _best_k(32)
    table = ItlTable.from_profile(learned)
    assert table.itl_ms_at(8.0, float(best_8)) == pytest.approx(_itl_ms(8, best_8), rel=0.02)
    assert table.itl_ms_at(32.0, float(best_32)) == pytest.approx(_itl_ms(32, best_32), rel=0.02)
    np.testing.assert_allclose(learned.acceptance_rates[:best_8], RATES[:best_8], atol=0.03)


def test_prior_file_starts_warm_from_a_learned_profile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cold = BanditPolicy(5, 64, seed=10)
    _drive(cold, 8, 300, seed=11)
    learned = cold.learned_profile()
    assert learned is not None
    path = tmp_path / "learned.json"
    save_profile(learned, path)
    warm = parse_policy(f"bandit:prior={path}", profile=None, k_max=5, max_num_seqs=64, seed=12)
    assert isinstance(warm, BanditPolicy)
    # Its very first choices are the near-best K (2, or 3 at 0.6% below) the cold run ended
    # on; a fresh cold policy's first choices spread over K.
    assert {warm.choose_k(synthetic_view(8, 5)) for _ in range(20)} <= {2, 3}
    fresh = BanditPolicy(5, 64, seed=12)
    assert not {fresh.choose_k(synthetic_view(8, 5)) for _ in range(20)} <= {2, 3}


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 255),  # decode rows (B = rows + 1 with prefill <= 256)
            st.integers(0, 5),  # K
            st.floats(1e-3, 1e3),  # duration, ms
            st.integers(0, 4096),  # prefill tokens
        ),
        max_size=30,
    )
)
def test_a_learned_profile_is_always_a_valid_profile(steps: list) -> None:  # type: ignore[type-arg]
    # Whatever it saw (any B, K, duration, prefill), what it exports passes the profile reader
    # and keeps its measured knots: B = 1 first, the largest observed knot last.
    policy = BanditPolicy(5, 256, seed=0)
    rng = np.random.default_rng(0)
    for index, (rows, k, duration_ms, prefill) in enumerate(steps):
        view = dataclasses.replace(
            synthetic_view(rows, 5),
            step_index=index,
            batch_size=rows + (1 if prefill else 0),
            num_tokens=rows + prefill,
        )
        policy.choose_k(view)
        accepted = _accepted_rows(rng, RATES, rows, k)
        policy.observe(_feedback(index, rows, k, accepted, duration_ms, batch_size=view.batch_size))
    learned = policy.learned_profile()
    weights = policy.step_time.knot_steps  # [J+1] steps per knot (hat weights summed)
    if weights.max(initial=0.0) < 1.0:  # no knot has a whole step's evidence yet
        assert learned is None
        return
    assert learned is not None
    assert parse_profile(profile_to_native(learned), "learned") == learned
    # Knots 1, 2, 4, ... up to the largest with a whole step, never past the rows seen.
    largest = int(policy.step_time.knots[np.flatnonzero(weights >= 1.0)[-1]])
    assert learned.batch_sizes() == [2**j for j in range(largest.bit_length())]
    assert largest <= 2 ** math.ceil(math.log2(max(rows for rows, *_ in steps)))
    assert all(p.median_ms > 0 for p in learned.latency)
    assert list(learned.acceptance_rates) == sorted(learned.acceptance_rates, reverse=True)
