"""Online acceptance: the naive cumulative estimator collapses, ours recovers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_factories import h100_profile

from dsd.common.errors import InputError
from dsd.policies.goodput import GoodputPolicy
from dsd.policies.online import (
    NaiveCumulativeAcceptancePolicy,
    OnlineAcceptancePolicy,
    OnlineConfig,
)
from dsd.policies.range_table import synthetic_view
from dsd.policies.types import KPolicy, StepFeedback

DATA = Path(__file__).resolve().parents[1] / "data"

BATCH_SIZE = 4
K_MAX = 5


def _conditional(rates: tuple[float, ...]) -> np.ndarray:
    """Conditional acceptance per position from unconditional rates: r_i / r_{i-1}."""
    unconditional = np.array(rates)  # [k_max]
    previous = np.concatenate(([1.0], unconditional[:-1]))  # [k_max]
    return unconditional / previous


def _run(
    policy: KPolicy, conditional: np.ndarray, num_steps: int, rng: np.random.Generator, start: int
) -> list[int]:
    """Drive `policy` for num_steps at B=4; accepted = leading successes of per-position draws."""
    chosen = []
    for step in range(start, start + num_steps):
        k = int(policy.choose_k(synthetic_view(BATCH_SIZE, K_MAX)))
        chosen.append(k)
        draws = rng.random((BATCH_SIZE, K_MAX)) < conditional[None, :]  # [B, k_max]
        draws[:, k:] = False
        # leading run of successes = accepted count
        accepted = np.where(draws.all(axis=1), k, np.argmin(draws, axis=1))  # [B]
        accepted = np.minimum(accepted, k)
        policy.observe(
            StepFeedback(
                step_index=step,
                time_s=step * 0.01,
                batch_size=BATCH_SIZE,
                req_ids=np.arange(BATCH_SIZE, dtype=np.int64),
                num_spec_tokens=np.full(BATCH_SIZE, k, dtype=np.int64),
                num_accepted=accepted.astype(np.int64),
                duration_s=0.01,
            )
        )
    return chosen


def _good_bad_good(policy: KPolicy, seed: int) -> tuple[list[int], list[int], list[int]]:
    """30 steps at the profiled acceptance, 400 with a broken draft (nothing accepted), 600 good."""
    rng = np.random.default_rng(seed)
    good = _conditional(h100_profile().acceptance_rates)
    broken = np.zeros(K_MAX)
    first = _run(policy, good, 30, rng, 0)
    bad = _run(policy, broken, 400, rng, 30)
    last = _run(policy, good, 600, rng, 430)
    return first, bad, last


def test_naive_cumulative_estimator_collapses_for_good() -> None:
    policy = NaiveCumulativeAcceptancePolicy(h100_profile(), 64, warmup_steps=20)
    first, bad, last = _good_bad_good(policy, seed=1)
    assert first[0] == 3  # the profile's goodput choice at B=4
    assert bad[-1] == 0  # the broken draft drives K to 0 ...
    assert set(last) == {0}  # ... and with nothing drafted it never learns acceptance is back


def _near_optimal_ks(tolerance: float = 0.01) -> set[int]:
    """K whose goodput at B=4 under the profiled (true) rates is within `tolerance` of the best."""
    by_k = GoodputPolicy(h100_profile(), 64).table.goodput_by_k[BATCH_SIZE - 1]  # [k_max + 1]
    return {int(k) for k in np.flatnonzero(by_k >= (1 - tolerance) * by_k.max())}


def test_online_estimator_recovers_when_acceptance_returns() -> None:
    config = OnlineConfig(warmup_steps=20, prior_strength=20.0, decay=0.98)
    policy = OnlineAcceptancePolicy(h100_profile(), 64, config)
    first, bad, last = _good_bad_good(policy, seed=1)
    assert first[0] == 3
    # It reacts to the broken draft: mostly K=0, with short probes as the prior pulls it back.
    assert np.mean(np.array(bad[100:]) == 0) >= 0.5
    # Undrafted positions drift back to the prior, K rises, real acceptance is seen again, and
    # it settles on K that are near-optimal for the true rates ({2, 3} at B=4: 0.6% apart).
    settled = set(last[200:])
    assert _near_optimal_ks() == {2, 3}
    assert settled <= _near_optimal_ks()


def test_stationary_acceptance_rarely_rebuilds_the_table() -> None:
    policy = OnlineAcceptancePolicy(h100_profile(), 64)  # default config
    rng = np.random.default_rng(3)
    ks = _run(policy, _conditional(h100_profile().acceptance_rates), 1000, rng, 0)
    assert set(ks[100:]) <= _near_optimal_ks()
    assert policy.num_table_builds < 100  # 1000 steps: rebuilt only when the estimates move


def test_online_runs_are_deterministic_for_a_seed() -> None:
    runs = []
    for _ in range(2):
        policy = OnlineAcceptancePolicy(h100_profile(), 64, OnlineConfig(warmup_steps=5))
        runs.append(_good_bad_good(policy, seed=7))
    assert runs[0] == runs[1]


def test_warmup_uses_the_profile_rates() -> None:
    policy = OnlineAcceptancePolicy(h100_profile(), 64, OnlineConfig(warmup_steps=50))
    rng = np.random.default_rng(0)
    _run(policy, np.zeros(K_MAX), 49, rng, 0)
    assert np.array_equal(policy.current_rates(), np.array(h100_profile().acceptance_rates))
    assert policy.num_table_builds == 1


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, K_MAX), st.integers(0, K_MAX)), min_size=1, max_size=8),
        min_size=1,
        max_size=30,
    )
)
def test_estimates_stay_in_unit_interval_and_non_increasing(steps) -> None:  # type: ignore[no-untyped-def]
    policy = OnlineAcceptancePolicy(h100_profile(), 16, OnlineConfig(warmup_steps=0))
    for index, rows in enumerate(steps):
        num_spec = np.array([k for k, _ in rows], dtype=np.int64)
        num_accepted = np.minimum(np.array([a for _, a in rows], dtype=np.int64), num_spec)
        policy.observe(
            StepFeedback(index, 0.0, len(rows), np.arange(len(rows)), num_spec, num_accepted, 0.01)
        )
        rates = policy.estimated_rates()
        assert np.all((rates >= 0) & (rates <= 1))
        assert np.all(np.diff(rates) <= 1e-15)
        assert 0 <= policy.choose_k(synthetic_view(len(rows), K_MAX)) <= K_MAX


def test_positions_never_drafted_stay_at_their_prior() -> None:
    profile = h100_profile()
    policy = OnlineAcceptancePolicy(profile, 16, OnlineConfig(warmup_steps=0))
    # Only K=1 is ever drafted, always accepted: position 1 rises, positions 2.. keep the prior.
    for index in range(100):
        ones = np.ones(4, dtype=np.int64)
        policy.observe(StepFeedback(index, 0.0, 4, np.arange(4), ones, ones, 0.01))
    rates = policy.estimated_rates()
    assert rates[0] > profile.acceptance_rates[0]
    assert rates[1:] == pytest.approx(profile.acceptance_rates[1:])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"decay": 0.0}, "decay must be in (0, 1]"),  # no memory at all
        ({"decay": 1.5}, "decay must be in (0, 1]"),  # counts would grow
        ({"prior_strength": 0.0}, "prior_strength must be > 0"),  # no prior: the naive estimator
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
        ({"recompute_tolerance": -0.1}, "recompute_tolerance must be >= 0"),
        ({"acceptance": "walk"}, "acceptance must be sequences or rates"),
    ],
)
def test_bad_online_config_is_an_input_error(kwargs: dict[str, float], fragment: str) -> None:
    with pytest.raises(InputError) as info:
        OnlineConfig(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def _cpu_profile():  # type: ignore[no-untyped-def]

    from dsd.policies.profile_io import load_profile

    return load_profile(DATA / "profiles/cpu_smollm2_ngram_2026-11-25.json")


def test_online_starts_from_goodputs_table_with_sequences_and_from_the_rates_without() -> None:
    """A greedy profile's draft sequences: online decides as goodput does until it learns;
    `acceptance=rates` decides as goodput's rates rule (K = 6 at B = 2 on this profile)."""
    from dsd.policies.spec import parse_policy

    profile = _cpu_profile()
    tables = {
        spec: parse_policy(spec, profile=profile, k_max=6, max_num_seqs=8).table
        for spec in ("online", "goodput", "online:acceptance=rates", "goodput:acceptance=rates")
    }
    assert tables["online"].k_star.tolist() == tables["goodput"].k_star.tolist()
    np.testing.assert_allclose(tables["online"].goodput_by_k, tables["goodput"].goodput_by_k)
    rates_rule = tables["online:acceptance=rates"].k_star.tolist()
    assert rates_rule == tables["goodput:acceptance=rates"].k_star.tolist() and rates_rule[1] == 6
    assert tables["online"].k_star[1] == 3


def test_online_scales_the_walked_acceptance_by_learned_over_profiled_tokens() -> None:
    """After steps that accept every draft, AL(k) - 1 of the walk grows by the ratio of the
    learned to the profiled sum of r_i up to k; the drafted counts stay the walk's."""
    from dsd.policies.goodput import sequence_acceptance

    profile = _cpu_profile()
    policy = OnlineAcceptancePolicy(profile, 8, OnlineConfig(warmup_steps=0))
    walked = sequence_acceptance(profile.draft_sequences, 6)
    six = np.array([6, 6])
    for index in range(40):
        policy.observe(StepFeedback(index, 0.0, 2, np.arange(2), six, six, 0.05))
    learned = policy.estimated_rates()
    scaled = policy.scaled_sequences(learned)
    assert scaled is not None
    ratio = np.cumsum(learned) / np.cumsum(profile.acceptance_rates)
    assert (ratio > 1).all()
    want = 1 + (walked.acceptance_length[1:] - 1) * ratio
    np.testing.assert_allclose(scaled.acceptance_length[1:], want)
    np.testing.assert_array_equal(scaled.draft_rates, walked.draft_rates)
    assert policy.table.k_star[3] > 1  # more acceptance than profiled: drafts pay at B = 4


def test_a_profile_without_sequences_scores_the_rates_either_way() -> None:
    profile = h100_profile()
    assert not profile.draft_sequences
    for acceptance in ("sequences", "rates"):
        policy = OnlineAcceptancePolicy(profile, 64, OnlineConfig(acceptance=acceptance))
        assert policy.sequences is None
        reference = GoodputPolicy(profile, 64)
        assert policy.table.k_star.tolist() == reference.table.k_star.tolist()
