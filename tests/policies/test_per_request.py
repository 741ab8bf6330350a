"""Per-request K: exact allocation vs brute force, learning per request, bounded memory."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_factories import h100_profile

from dsd.common.errors import InputError
from dsd.policies.goodput import GoodputPolicy
from dsd.policies.per_request import (
    PerRequestConfig,
    PerRequestPolicy,
    best_allocation,
    best_uniform_k,
    conditional_depth_rates,
)
from dsd.policies.profile import Profile
from dsd.policies.range_table import synthetic_view
from dsd.policies.types import StepFeedback, StepView

DATA = Path(__file__).resolve().parents[1] / "data"


def _view(req_ids: list[int], step: int = 0, k_max: int = 5) -> StepView:
    ids = np.array(req_ids, dtype=np.int64)
    return StepView(
        step_index=step,
        time_s=0.0,
        batch_size=len(ids),
        num_decode_reqs=len(ids),
        req_ids=ids,
        context_lens=np.zeros(len(ids), dtype=np.int64),
        k_max=k_max,
    )


def _feedback(step: int, req_ids, ks, accepted) -> StepFeedback:  # type: ignore[no-untyped-def]
    return StepFeedback(
        step_index=step,
        time_s=0.0,
        batch_size=len(req_ids),
        req_ids=np.asarray(req_ids, dtype=np.int64),
        num_spec_tokens=np.asarray(ks, dtype=np.int64),
        num_accepted=np.asarray(accepted, dtype=np.int64),
        duration_s=0.01,
    )


def _brute_force(gains: np.ndarray, itl_by_total: np.ndarray) -> float:
    num_decode, k_max = gains.shape
    best = -np.inf
    for ks in itertools.product(range(k_max + 1), repeat=num_decode):
        tokens = num_decode + sum(gains[j, :k].sum() for j, k in enumerate(ks))
        best = max(best, tokens / itl_by_total[sum(ks)])
    return float(best)


@given(
    st.integers(1, 4),  # D decode rows
    st.integers(1, 3),  # K_max
    st.data(),
)
def test_best_allocation_matches_brute_force(num_decode: int, k_max: int, data) -> None:  # type: ignore[no-untyped-def]
    raw = data.draw(
        st.lists(st.floats(0.0, 1.0), min_size=num_decode * k_max, max_size=num_decode * k_max)
    )
    # Non-increasing gains per request, as unconditional rates are.
    gains = np.minimum.accumulate(np.array(raw).reshape(num_decode, k_max), axis=1)
    slope = data.draw(st.floats(0.0, 3.0))
    itl_by_total = 5.0 + slope * np.arange(num_decode * k_max + 1)  # ITL rises with drafts
    ks = best_allocation(gains, itl_by_total)
    tokens = num_decode + sum(gains[j, : int(k)].sum() for j, k in enumerate(ks))
    assert tokens / itl_by_total[int(ks.sum())] == pytest.approx(
        _brute_force(gains, itl_by_total), rel=1e-12
    )


def test_unseen_requests_read_the_profile_rates() -> None:
    profile = h100_profile()
    policy = PerRequestPolicy(profile, 64)
    rates = policy.request_rates(np.array([7, 8]))
    np.testing.assert_allclose(rates, np.tile(profile.acceptance_rates, (2, 1)), rtol=1e-12)


TOKEN_EQUIVALENT = PerRequestConfig(mixed_k="token-equivalent")


@pytest.mark.parametrize("config", [PerRequestConfig(), TOKEN_EQUIVALENT])
def test_uniform_unseen_batch_matches_goodput_at_b1(config: PerRequestConfig) -> None:
    # One unseen request: both costs are the profile's ITL(1, K) at D=1: K* = 3.
    policy = PerRequestPolicy(h100_profile(), 64, config)
    assert policy.choose_k(_view([0])).tolist() == [3]


@pytest.mark.parametrize("batch_size", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_padded_unseen_batch_is_the_goodput_k(batch_size: int) -> None:
    # Under padded cost with no evidence, every request reads the profile: goodput's uniform K.
    profile = h100_profile()
    policy = PerRequestPolicy(profile, 256)
    goodput = GoodputPolicy(profile, 256)
    ks = policy.choose_k(_view(list(range(batch_size))))
    assert set(ks.tolist()) == {goodput.choose_k(synthetic_view(batch_size, 5))}


def test_padded_always_answers_one_k_for_the_whole_batch() -> None:
    policy = PerRequestPolicy(h100_profile(), 64)
    ids = list(range(8))
    for step in range(30):
        ks = policy.choose_k(_view(ids, step))
        assert len(set(ks.tolist())) == 1  # unequal K cannot pay under ITL(D, max K)
        accepted = np.where(np.arange(8) < 4, ks, 0)
        policy.observe(_feedback(step, ids, ks, accepted))


@given(
    st.integers(1, 6),  # D
    st.integers(1, 5),  # K_max
    st.data(),
)
def test_best_uniform_k_matches_brute_force(num_decode: int, k_max: int, data) -> None:  # type: ignore[no-untyped-def]
    raw = data.draw(
        st.lists(st.floats(0, 1), min_size=num_decode * k_max, max_size=num_decode * k_max)
    )
    gains = -np.sort(-np.array(raw).reshape(num_decode, k_max), axis=1)  # non-increasing rows
    itl = 5.0 + np.cumsum(
        data.draw(st.lists(st.floats(0, 3), min_size=k_max + 1, max_size=k_max + 1))
    )
    scores = [(num_decode + gains[:, :k].sum()) / itl[k] for k in range(k_max + 1)]
    assert scores[best_uniform_k(gains, itl)] == pytest.approx(max(scores), rel=1e-12)


def test_learns_which_requests_accept() -> None:
    policy = PerRequestPolicy(h100_profile(), 64, TOKEN_EQUIVALENT)
    ids = list(range(8))
    for step in range(30):
        ks = policy.choose_k(_view(ids, step))
        accepted = np.where(np.arange(8) < 4, ks, 0)  # rows 0-3 accept all, 4-7 reject all
        policy.observe(_feedback(step, ids, ks, accepted))
    ks = policy.choose_k(_view(ids, 30))
    assert (ks[:4] == 5).all()
    assert (ks[4:] == 0).all()


def test_k_within_bounds_and_view_k_max() -> None:
    policy = PerRequestPolicy(h100_profile(), 256)
    for batch_size in (1, 7, 64, 256):
        ks = policy.choose_k(synthetic_view(batch_size, 2))
        assert ks.shape == (batch_size,)
        assert ks.min() >= 0 and ks.max() <= 2
    assert policy.choose_k(_view([])).shape == (0,)


def test_forgets_requests_not_seen_and_memory_is_bounded() -> None:
    config = PerRequestConfig(forget_after_steps=5, max_tracked=16)
    policy = PerRequestPolicy(h100_profile(), 256, config)
    for step in range(100):
        ids = list(range(step * 10, step * 10 + 32))  # 32 ids, mostly new each step
        policy.observe(_feedback(step, ids, [2] * 32, [1] * 32))
        assert policy.num_tracked <= 16
    policy.observe(_feedback(200, [1], [1], [1]))
    assert policy.num_tracked == 1  # everything older than 5 steps is gone


def test_deterministic() -> None:
    def run() -> list[list[int]]:
        policy = PerRequestPolicy(h100_profile(), 64)
        rng = np.random.default_rng(0)
        out = []
        for step in range(20):
            ids = list(range(step, step + 6))
            ks = policy.choose_k(_view(ids, step))
            policy.observe(_feedback(step, ids, ks, rng.integers(0, ks + 1)))
            out.append(ks.tolist())
        return out

    assert run() == run()


def test_conditional_depth_rates() -> None:
    np.testing.assert_allclose(conditional_depth_rates(np.array([0.6, 0.36, 0.216])), [0.6] * 3)
    # made non-increasing first; a depth never reached has rate 0
    np.testing.assert_allclose(
        conditional_depth_rates(np.array([0.5, 0.6, 0.0, 0.0])), [0.5, 1, 0, 0]
    )


def _ngram_profile() -> Profile:
    """The H100 table with the H200 report's n-gram rates: r_i unconditional, s_i drafted."""
    return dataclasses.replace(
        h100_profile(),
        acceptance_rates=(0.157, 0.127, 0.103, 0.085, 0.082),
        draft_rates=(0.245, 0.245, 0.245, 0.244, 0.238),
    )


def test_unseen_requests_read_an_ngram_profile_and_never_exceed_its_draft_rates() -> None:
    profile = _ngram_profile()
    policy = PerRequestPolicy(profile, 64)
    np.testing.assert_allclose(policy.request_rates(np.array([3]))[0], profile.acceptance_rates)
    for step in range(20):  # request 3 accepts every draft it makes
        policy.observe(_feedback(step, [3], [5], [5]))
    learned = policy.request_rates(np.array([3]))[0]
    assert (learned > np.array(profile.acceptance_rates)).all()
    assert (learned <= np.array(profile.draft_rates) + 1e-12).all()
    assert (np.diff(learned) <= 1e-12).all()


def test_one_fully_accepted_draft_moves_each_depth_by_one_trial() -> None:
    # The earlier pooled model read one 5-of-5 draft as every depth nearly certain (a flat
    # 0.256 > s_i = 0.245 on the H200's n-gram profile, so it drafted 6 deep at C = 1). Each
    # depth now moves by one trial in prior_strength + 1.
    profile = _ngram_profile()
    policy = PerRequestPolicy(profile, 64)
    prior = conditional_depth_rates(np.array(profile.acceptance_rates) / profile.draft_rates)
    policy.observe(_feedback(0, [3], [5], [5]))
    strength = policy.config.prior_strength
    expected = np.array(profile.draft_rates) * np.cumprod((strength * prior + 1) / (strength + 1))
    np.testing.assert_allclose(policy.request_rates(np.array([3]))[0], expected, rtol=1e-12)
    # a rejection at depth 3 after 2 accepted: successes at 1, 2, a failure at 3, nothing deeper
    policy.observe(_feedback(1, [4], [5], [2]))
    counts = policy.counts[policy._lookup(np.array([4]))[0][0]]  # [alpha per depth, beta]
    assert counts[:5].tolist() == pytest.approx((strength * prior + [1, 1, 0, 0, 0]).tolist())
    assert counts[5:].tolist() == pytest.approx((strength * (1 - prior) + [0, 0, 1, 0, 0]).tolist())


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5)).map(lambda t: (t[0], min(t))),
        min_size=1,
        max_size=30,
    )
)
def test_learned_rates_stay_under_the_draft_rates_and_non_increasing(outcomes) -> None:  # type: ignore[no-untyped-def]
    profile = _ngram_profile()
    policy = PerRequestPolicy(profile, 64)
    for step, (drafted, accepted) in enumerate(outcomes):
        policy.observe(_feedback(step, [9], [drafted], [accepted]))
    rates = policy.request_rates(np.array([9]))[0]
    assert (rates >= 0).all() and (rates <= np.array(profile.draft_rates) + 1e-12).all()
    assert (np.diff(rates) <= 1e-12).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prior_strength": 0.0},  # no prior
        {"forget_after_steps": 0},  # forgets at once
        {"max_tracked": 0},  # cannot track anything
        {"mixed_k": "max"},  # unknown cost model
        {"acceptance": "walk"},  # unknown acceptance model
    ],
)
def test_bad_config_is_input_error(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="per-request"):
        PerRequestConfig(**kwargs)


@given(
    st.sampled_from(
        [
            "per-request",  # K per request
            "bandit:seed=1",  # sampling, no profile
            "hysteresis:goodput:margin=0.2,min_dwell=2",  # wrapper
            "context:table=[[1,64,0,50,5],[1,64,51,100000,2]]",  # 5-tuple table
        ]
    ),
    st.integers(0, 64),  # B
    st.integers(0, 64),  # decode rows (clipped to B)
    st.integers(0, 5),  # view k_max
)
def test_new_policies_return_k_in_range_for_any_view(
    spec: str, batch_size: int, num_decode: int, k_max: int
) -> None:
    from dsd.policies.spec import parse_policy

    num_decode = min(num_decode, batch_size)  # prefill chunks make up the rest; may be 0
    view = StepView(
        step_index=3,
        time_s=1.5,
        batch_size=batch_size,
        num_decode_reqs=num_decode,
        req_ids=np.arange(num_decode, dtype=np.int64),
        context_lens=np.full(num_decode, 100, dtype=np.int64),
        k_max=k_max,
    )
    policy = parse_policy(spec, profile=h100_profile(), k_max=5, max_num_seqs=64)
    k = np.asarray(policy.choose_k(view))
    assert k.ndim == 0 or k.shape == (num_decode,)
    assert ((k >= 0) & (k <= k_max)).all()


def _ramp_up_view(num_decode: int, num_prefill: int) -> StepView:
    """A step of `num_decode` decode rows and `num_prefill` prefill chunks (B = their sum)."""
    ids = np.arange(num_decode, dtype=np.int64)
    return StepView(
        step_index=1,
        time_s=0.0,
        batch_size=num_decode + num_prefill,
        num_decode_reqs=num_decode,
        req_ids=ids,
        context_lens=np.full(num_decode, 100, dtype=np.int64),
        k_max=5,
        num_tokens=num_decode + 100 * num_prefill,
    )


@pytest.mark.parametrize(
    ("num_decode", "num_prefill"),
    [
        (82, 77),  # MT-Bench C=256, step 1: goodput K*(159) = 1 but K*(82) = 2
        (158, 68),  # step 2: K*(226) = 0 but K*(158) = 1
        (16, 0),  # decode-only: B = D
    ],
)
def test_padded_choice_reads_the_table_at_b_with_prefill_chunks(
    num_decode: int, num_prefill: int
) -> None:
    # Unseen requests read the profile's rates, so the padded choice is goodput's K at the
    # step's B (prefill chunks included), the key every policy uses; not goodput's K at D.
    profile = h100_profile()
    policy = PerRequestPolicy(profile, 256)
    goodput = GoodputPolicy(profile, 256)
    view = _ramp_up_view(num_decode, num_prefill)
    ks = policy.choose_k(view)
    assert ks.shape == (num_decode,)
    assert set(ks.tolist()) == {goodput.choose_k(view)}
    if num_prefill:
        assert goodput.choose_k(synthetic_view(num_decode, 5)) != goodput.choose_k(view)


@given(
    mixed_k=st.sampled_from(["padded", "token-equivalent"]),
    steps=st.lists(
        st.tuples(st.integers(1, 8), st.integers(0, 250), st.integers(0, 5)),
        min_size=1,
        max_size=12,
    ),
)
def test_memoized_step_costs_choose_as_a_fresh_policy_does(mixed_k: str, steps) -> None:  # type: ignore[no-untyped-def]
    # One policy over steps of varying D, prefill rows and K cap answers each step as a new
    # policy (nothing memoized) with the same posteriors would (up to B = 258, where the
    # profile's K* falls).
    config = PerRequestConfig(mixed_k=mixed_k)  # type: ignore[arg-type]
    used = PerRequestPolicy(h100_profile(), max_num_seqs=512, config=config)
    for step, (num_decode, num_prefill, k_cap) in enumerate(steps):
        ids = np.arange(num_decode, dtype=np.int64) + step % 3
        view = StepView(
            step_index=step,
            time_s=0.0,
            batch_size=num_decode + num_prefill,
            num_decode_reqs=num_decode,
            req_ids=ids,
            context_lens=np.zeros(num_decode, dtype=np.int64),
            k_max=k_cap,
        )
        fresh = PerRequestPolicy(h100_profile(), max_num_seqs=512, config=config)
        for name in ("tracked_ids", "counts", "last_seen_step"):
            setattr(fresh, name, getattr(used, name).copy())
        ks = used.choose_k(view)
        np.testing.assert_array_equal(ks, fresh.choose_k(view))
        used.observe(_feedback(step, ids, ks, np.minimum(ks, (ids + step) % 3)))


def test_policy_host_lines_fit_the_median_extra_over_the_baseline() -> None:
    """Per policy, the line in D through its median us beyond the baseline's; clipped at 0;
    a constant from one D; D where a policy has no samples are left out."""
    from dsd.policies.host_time import fit_policy_host_lines

    samples = {
        ("static:6", 1): [10.0, 11.0, 12.0],
        ("static:6", 4): [20.0, 21.0, 22.0],
        ("static:6", 8): [30.0],
        ("online", 1): [111.0, 500.0, 40.0],  # median 111: +100 us over the baseline's 11
        ("online", 4): [421.0],  # +400
        ("online", 8): [],  # no samples: D = 8 is left out
        ("goodput", 1): [5.0],  # below the baseline: clipped to 0
        ("goodput", 4): [21.0],
    }
    lines = dict(fit_policy_host_lines(samples, "static:6", ("online", "goodput")))
    assert list(lines) == ["goodput", "online"]  # by name, as a profile lists them
    assert (lines["online"].intercept_ms, lines["online"].per_row_ms) == pytest.approx((0.0, 0.1))
    assert (lines["goodput"].intercept_ms, lines["goodput"].per_row_ms) == (0.0, 0.0)
    one = dict(
        fit_policy_host_lines(
            {("static:6", 2): [1.0], ("online", 2): [51.0]}, "static:6", ("online",)
        )
    )
    assert (one["online"].intercept_ms, one["online"].per_row_ms) == pytest.approx((0.05, 0.0))
    with pytest.raises(ValueError, match="no D"):
        fit_policy_host_lines({("static:6", 2): [1.0]}, "static:6", ("online",))


def test_policy_steppers_time_each_policy_on_synthetic_steps() -> None:
    from dsd.policies.host_time import TIMED_POLICIES, policy_step_us

    specs = ["static:5", *TIMED_POLICIES]  # the H100 profile: k_max 5
    samples = policy_step_us(h100_profile(), specs, [1, 3], 5, 2, 5)
    assert set(samples) == {(spec, d) for spec in specs for d in (1, 3)}
    assert all(len(v) == 2 and min(v) > 0 for v in samples.values())


def _sequence_profile(sequences) -> Profile:  # type: ignore[no-untyped-def]
    """The n-gram profile with greedy draft sequences ((available, matched) per prompt)."""
    return dataclasses.replace(_ngram_profile(), draft_sequences=tuple(sequences))


def _cpu_report_profile() -> Profile:

    from dsd.policies.profile_io import load_profile

    return load_profile(DATA / "profiles/cpu_smollm2_ngram_2026-11-27f.json")


_SEQUENCES = st.lists(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=12).map(
        lambda pairs: (tuple(a for a, _ in pairs), tuple(min(a, m) for a, m in pairs))
    ),
    min_size=1,
    max_size=4,
)


@given(_SEQUENCES, st.integers(1, 64))
def test_sequences_unseen_batch_is_the_goodput_k(sequences, batch_size: int) -> None:  # type: ignore[no-untyped-def]
    """At level 1 (nothing observed) the padded objective is goodput's on the walked sequences:
    the same AL(k) and the same per-k drafted counts, so the same K at every B."""
    profile = _sequence_profile(sequences)
    policy = PerRequestPolicy(profile, 64)
    assert policy.sequences is not None
    goodput = GoodputPolicy(profile, 64)
    view = _view(list(range(batch_size)))
    assert set(policy.choose_k(view).tolist()) == {goodput.choose_k(view)}


def test_sequences_level_counts_accepted_against_the_walked_expectation() -> None:
    profile = _sequence_profile([((0, 3, 3, 3, 0, 0), (0, 3, 1, 0, 0, 0))])
    policy = PerRequestPolicy(profile, 64)
    expected = policy.sequences.accepted_given_drafted  # type: ignore[union-attr]
    strength = policy.config.prior_strength
    np.testing.assert_allclose(policy.request_levels(np.array([1, 2])), [1.0, 1.0])
    # request 1 drafts 2 and accepts 2, then drafts 1 and accepts 0; request 2 drafts nothing
    policy.observe(_feedback(0, [1, 2], [2, 0], [2, 0]))
    policy.observe(_feedback(1, [1], [1], [0]))
    want = (strength + 2) / (strength + expected[2] + expected[1])
    np.testing.assert_allclose(policy.request_levels(np.array([1, 2])), [want, 1.0])
    with pytest.raises(ValueError, match="acceptance=rates"):
        policy.request_rates(np.array([1]))
    with pytest.raises(ValueError, match="acceptance=sequences"):
        PerRequestPolicy(profile, 64, PerRequestConfig(acceptance="rates")).request_levels(
            np.array([1])
        )


@given(st.floats(0.0, 50.0), st.integers(1, 5))
def test_sequences_gains_scale_the_walk_and_never_pass_the_drafts(level: float, k_cap: int) -> None:
    profile = _cpu_report_profile()
    policy = PerRequestPolicy(profile, 64)
    walk = policy.sequences
    assert walk is not None
    policy.counts = np.array([[level * 8.0, 8.0]])  # one tracked request at this level
    policy.tracked_ids = np.array([5])
    policy.last_seen_step = np.array([0])
    extra = np.cumsum(policy.request_gains(np.array([5]), k_cap)[0])  # AL_j(k) - 1, k >= 1
    walked = walk.acceptance_length[1 : k_cap + 1] - 1.0
    drafts = walk.draft_rates[1 : k_cap + 1].sum(axis=1)
    np.testing.assert_allclose(extra, np.minimum(level * walked, drafts), atol=1e-12)


def test_sequences_mode_follows_what_each_batch_accepts() -> None:
    """On the CPU report's profile (its walk says K = 2 at B = 4): a batch that accepted every
    draft it made drafts deeper, one that accepted none stops drafting; and the rates mode
    (per-position rates measured at K_max) reads the unseen batch deeper than the walk."""
    profile = _cpu_report_profile()
    view = _view([1, 2, 3, 4], k_max=6)
    unseen = int(PerRequestPolicy(profile, 8).choose_k(view)[0])
    assert unseen == GoodputPolicy(profile, 8).choose_k(view) == 2
    by_rates = PerRequestPolicy(profile, 8, PerRequestConfig(acceptance="rates"))
    assert int(by_rates.choose_k(view)[0]) > unseen
    accepting, rejecting = PerRequestPolicy(profile, 8), PerRequestPolicy(profile, 8)
    for step in range(10):
        accepting.observe(_feedback(step, [1, 2, 3, 4], [6] * 4, [6] * 4))
        rejecting.observe(_feedback(step, [1, 2, 3, 4], [6] * 4, [0] * 4))
    assert int(accepting.choose_k(view)[0]) > unseen
    assert int(rejecting.choose_k(view)[0]) == 0
