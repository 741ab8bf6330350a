"""Goodput policy decisions, checked by hand on both published profiles, and its properties."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_factories import fixture_profile, h100_profile, make_profile

from dsd.policies.goodput import GoodputPolicy, ItlTable, acceptance_lengths, goodput_table
from dsd.policies.range_table import synthetic_view

DATA = Path(__file__).resolve().parents[1] / "data"


def test_h100_batch_size_1_by_hand() -> None:
    # rates r = .6812 .3914 .2035 .1014 .0514
    # -> AL(0..5) = 1, 1.6812, 2.0726, 2.2761, 2.3775, 2.4290
    # ITL(1, K): K=0 6.5206, K=1 7.3676, K=2 (7.3676+8.8407)/2 = 8.1041 (linear in K),
    #            K=3 8.8407, K=4 (8.8407+10.3265)/2 = 9.5836, K=5 10.3265
    # goodput:   .1534, .2282, .2557, .2575, .2481, .2352  -> K* = 3
    policy = GoodputPolicy(h100_profile(), 256)
    by_k = policy.table.goodput_by_k[0]
    assert by_k == pytest.approx([0.15336, 0.22818, 0.25575, 0.25746, 0.24809, 0.23522], abs=2e-5)
    assert policy.choose_k(synthetic_view(1, 5)) == 3


def test_h100_batch_size_256_by_hand() -> None:
    # ITL(256, K): 14.4914, 27.1381, K=2 (27.1381+41.8484)/2 = 34.4933, 41.8484, 49.6263, 57.4042
    # goodput: 1/14.4914 = .0690, 1.6812/27.1381 = .0619, 2.0726/34.4933 = .0601, ... -> K* = 0
    policy = GoodputPolicy(h100_profile(), 256)
    assert policy.table.goodput_by_k[255][:3] == pytest.approx(
        [0.069006, 0.061950, 0.060088], abs=2e-5
    )
    assert policy.choose_k(synthetic_view(256, 5)) == 0


def test_h100_batch_size_160_interpolates_between_64_and_256() -> None:
    # B=160 is halfway between 64 and 256: ITL(160, 0) = (7.7741+14.4914)/2 = 11.1328,
    # ITL(160, 1) = (9.6564+27.1381)/2 = 18.3973. goodput K=0 .0898 vs K=1 1.6812/18.3973 = .0914,
    # K=2 ITL (18.3973 + (13.4979+41.8484)/2)/2 = 23.0349, 2.0726/23.0349 = .0900 -> K* = 1
    policy = GoodputPolicy(h100_profile(), 256)
    assert float(policy.table.itl_ms[159]) == pytest.approx(18.3973, abs=1e-3)
    assert policy.choose_k(synthetic_view(160, 5)) == 1


def test_fixture_batch_size_64_with_the_outlier_by_hand() -> None:
    # rates .68 .39 .20 .10 .06 .03 .02 -> AL(0..7) = 1, 1.68, 2.07, 2.27, 2.37, 2.43, 2.46, 2.48
    # ITL(64, K): 8.53, 10.44, K=2 (10.44+13.16)/2 = 11.80, 13.16, 15.7, 17.54,
    #             K=6 (17.54+120.57)/2 = 69.055 (the outlier drags K=6 too), 120.57
    # goodput: .1172, .1609, .1754, .1725, .1510, .1385, .0356, .0206 -> K* = 2
    policy = GoodputPolicy(fixture_profile(), 64)
    expected = [0.11723, 0.16092, 0.17542, 0.17249, 0.15096, 0.13854, 0.03562, 0.02057]
    assert policy.table.goodput_by_k[63] == pytest.approx(expected, abs=2e-5)
    assert policy.choose_k(synthetic_view(64, 7)) == 2


def test_fixture_batch_size_1_by_hand() -> None:
    # ITL(1, K): 6.87, 7.97, 8.69, 9.41, 9.91, 10.8, 11.545, 12.29
    # goodput: .1456, .2108, .2382, .2412, .2392, .2250, .2131, .2018 -> K* = 3
    policy = GoodputPolicy(fixture_profile(), 64)
    assert policy.choose_k(synthetic_view(1, 7)) == 3


def test_ties_pick_the_smallest_k() -> None:
    # ITL doubles from K=0 to K=1 and AL doubles (r_1 = 1): exact tie, K=0 wins.
    # K=2 adds r_2 = 0 at higher ITL: worse.
    profile = make_profile({1: {0: 4.0, 1: 8.0, 2: 9.0}}, (1.0, 0.0))
    policy = GoodputPolicy(profile, 4)
    assert policy.table.goodput_by_k[0][0] == policy.table.goodput_by_k[0][1]
    assert policy.choose_k(synthetic_view(1, 2)) == 0


def test_batch_size_past_max_num_seqs_is_an_error() -> None:
    from dsd.common.errors import InputError

    policy = GoodputPolicy(h100_profile(), 8)
    with pytest.raises(InputError, match="exceeds max_num_seqs 8"):
        policy.choose_k(synthetic_view(9, 5))


def test_view_with_no_decode_requests_is_answered() -> None:
    policy = GoodputPolicy(h100_profile(), 8)
    assert policy.choose_k(synthetic_view(0, 5)) == 3


def test_k_is_clamped_to_the_views_k_max() -> None:
    policy = GoodputPolicy(h100_profile(), 8)
    assert policy.choose_k(synthetic_view(1, 2)) == 2


@st.composite
def random_profiles(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """Valid profiles: B=1 plus random B, K=0, 1, k_max at every B plus random K."""
    k_max = draw(st.integers(1, 7))
    batch_sizes = sorted({1, *draw(st.lists(st.integers(2, 300), max_size=4))})
    itl = {}
    for b in batch_sizes:
        ks = {0, 1, k_max, *draw(st.lists(st.integers(0, k_max), max_size=3))}
        itl[b] = {k: draw(st.floats(0.5, 200.0)) for k in ks}
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=k_max, max_size=k_max))
    rates = tuple(float(r) for r in np.minimum.accumulate(np.array(raw)))
    return make_profile(itl, rates)


@given(random_profiles(), st.integers(1, 300))
def test_goodput_k_is_the_argmax_of_its_own_objective(profile, max_num_seqs: int) -> None:  # type: ignore[no-untyped-def]
    policy = GoodputPolicy(profile, max_num_seqs)
    itl = ItlTable.from_profile(profile)
    al = acceptance_lengths(profile.acceptance_rates, profile.k_max)
    for batch_size in {1, max_num_seqs, (max_num_seqs + 1) // 2}:
        k = policy.choose_k(synthetic_view(batch_size, profile.k_max))
        assert 0 <= k <= profile.k_max
        scores = [al[j] / float(itl.itl_ms_at(batch_size, j)) for j in range(profile.k_max + 1)]
        best = max(scores)
        assert scores[k] == pytest.approx(best, rel=1e-12)
        # No smaller k is better. Ties are exact (the PR's `g > best_g`): a k whose AL is
        # larger by one ulp (rates ~1e-16) wins, so "smallest k within 1e-12" would be wrong.
        assert all(s <= scores[k] * (1 + 1e-12) for s in scores[:k])


def test_goodput_table_rows_are_consistent() -> None:
    table = goodput_table(
        ItlTable.from_profile(h100_profile()), h100_profile().acceptance_rates, 256
    )
    rows = np.arange(256)
    assert np.allclose(table.goodput, table.acceptance_length / table.itl_ms)
    assert np.allclose(table.goodput, table.goodput_by_k[rows, table.k_star])


def test_sequence_acceptance_walks_each_sequence_at_each_k() -> None:
    """By hand: available (0, 3, 3, 3, 0, 0), matched (0, 3, 1, 0, 0, 0).
    K=1: positions 0 (d 0), 1 (d 1, a 1), 3 (d 1, a 0), 4, 5: 5 steps, 6 tokens, 2 drafted.
    K=2: positions 0, 1 (d 2, a 2), 4, 5: 4 steps, 6 tokens, one step drafted 2."""
    from dsd.policies.goodput import sequence_acceptance

    result = sequence_acceptance([((0, 3, 3, 3, 0, 0), (0, 3, 1, 0, 0, 0))], 2)
    np.testing.assert_allclose(result.acceptance_length, [1.0, 6 / 5, 6 / 4])
    np.testing.assert_allclose(result.draft_rates, [[0, 0], [2 / 5, 0], [1 / 4, 1 / 4]])
    # k = 1: two steps drafted 1 and accepted 1 and 0; k = 2: one step drafted 2, accepted 2
    np.testing.assert_allclose(result.accepted_given_drafted, [0.0, 0.5, 2.0])


def test_goodput_scores_a_greedy_profiles_draft_sequences_unless_asked_for_rates() -> None:
    """The CPU report's SmolLM2 + n-gram profile: per-step rates measured at K_max = 6 say
    K = 6 at B = 2; walking the recorded sequences at each K (copy spans take more steps at
    small K) says K = 3, the K the simulator's static sweep finds best there."""

    from dsd.policies.goodput import sequence_acceptance
    from dsd.policies.profile_io import load_profile
    from dsd.policies.spec import parse_policy

    profile = load_profile(DATA / "profiles/cpu_smollm2_ngram_2026-11-25.json")
    by_spec = {
        spec: parse_policy(spec, profile=profile, k_max=6, max_num_seqs=8)
        for spec in ("goodput", "goodput:acceptance=sequences", "goodput:acceptance=rates")
    }
    k_star = {spec: policy.table.k_star.tolist() for spec, policy in by_spec.items()}
    assert k_star["goodput"] == k_star["goodput:acceptance=sequences"]
    assert k_star["goodput:acceptance=rates"][1] == 6 and k_star["goodput"][1] == 3
    walked = sequence_acceptance(profile.draft_sequences, 6).acceptance_length
    np.testing.assert_allclose(by_spec["goodput"].table.acceptance_length[1], walked[3])
