"""policies.profile_quality: which latency and prefill points a trustworthy profile cannot have."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.policies.profile import LatencyPoint, PrefillPoint
from dsd.policies.profile_quality import (
    QualityLimits,
    check_latency,
    check_prefill,
    problems_line,
)

BATCH_SIZES = (1, 2, 4)
KS = (0, 1, 3)


def grid(medians: dict[tuple[int, int], float], spread: float = 0.1, context: int = 129):
    return [
        LatencyPoint(
            b, k, m, context_len=context, p10_ms=m * (1 - spread / 2), p90_ms=m * (1 + spread / 2)
        )
        for (b, k), m in medians.items()
    ]


@st.composite
def monotone_medians(draw):  # type: ignore[no-untyped-def]
    """ITL(B, K) = base + growth in B + growth in K + a non-negative interaction."""
    base = draw(st.floats(0.5, 100))
    b_steps = draw(st.lists(st.floats(0, 50), min_size=2, max_size=2))
    k_steps = draw(st.lists(st.floats(0, 50), min_size=2, max_size=2))
    b_add = dict(zip(BATCH_SIZES, itertools.accumulate([0.0, *b_steps]), strict=True))
    k_add = dict(zip(KS, itertools.accumulate([0.0, *k_steps]), strict=True))
    mix = draw(st.floats(0, 1))
    return {
        (b, k): base + b_add[b] + k_add[k] + mix * b_add[b] * k_add[k]
        for b in BATCH_SIZES
        for k in KS
    }


@given(monotone_medians(), st.floats(0, 0.24))
@settings(max_examples=200)
def test_a_monotone_quiet_grid_has_no_problems(medians, spread) -> None:
    assert check_latency(grid(medians, spread)) == []


@given(
    monotone_medians(), st.sampled_from(BATCH_SIZES), st.sampled_from(KS[1:]), st.floats(0.07, 0.9)
)
@settings(max_examples=200)
def test_a_point_below_a_cheaper_k_is_named(medians, b, k, drop) -> None:
    cheaper = medians[(b, 0)]
    medians[(b, k)] = cheaper * (1 - drop)  # below K=0 of its row by more than the tolerance
    problems = check_latency(grid(medians))
    named = [p for p in problems if p.kind == "falls-with-k"]
    assert any((p.batch_size, p.num_spec_tokens) == (b, k) for p in named)
    assert all(f"B={p.batch_size} K={p.num_spec_tokens} ctx=129" in str(p) for p in problems)


def test_a_fall_within_the_tolerance_is_noise() -> None:
    medians = {(b, k): 10.0 + b + k for b in BATCH_SIZES for k in KS}
    medians[(1, 1)] = medians[(1, 0)] * 0.97  # 3% below: inside the default 5%
    assert check_latency(grid(medians)) == []
    assert check_latency(grid(medians), QualityLimits(tolerance=0.01))[0].point == "B=1 K=1 ctx=129"


def test_a_point_below_a_smaller_batch_is_named() -> None:
    medians = {(b, k): 10.0 + b + k for b in BATCH_SIZES for k in KS}
    medians[(4, 3)] = 5.0
    kinds = {(p.kind, p.point) for p in check_latency(grid(medians))}
    assert ("falls-with-b", "B=4 K=3 ctx=129") in kinds and (
        "falls-with-k",
        "B=4 K=3 ctx=129",
    ) in kinds


def test_noisy_points_and_points_without_percentiles() -> None:
    noisy = LatencyPoint(1, 0, 10.0, context_len=5, p10_ms=8.0, p90_ms=13.0)  # 50% of median
    quiet = LatencyPoint(1, 1, 11.0, context_len=5, p10_ms=10.0, p90_ms=12.0)
    bare = LatencyPoint(1, 3, 12.0)  # a PR #32374 point: no percentiles, monotonicity only
    problems = check_latency([noisy, quiet, bare])
    assert [(p.kind, p.point) for p in problems] == [("noisy", "B=1 K=0 ctx=5")]
    assert "spans 50% of the median" in str(problems[0])
    assert check_latency([noisy, quiet], QualityLimits(max_spread=0.6)) == []


def test_context_lengths_are_checked_separately() -> None:
    short = grid({(1, 0): 10.0, (1, 1): 11.0}, context=129)
    long = grid({(1, 0): 5.0, (1, 1): 6.0}, context=1025)  # cheaper than short: fine, other ctx
    assert check_latency(short + long) == []


def test_prefill_must_grow_with_the_prompt() -> None:
    points = [PrefillPoint(32, 5.0), PrefillPoint(128, 80.0), PrefillPoint(512, 5.5)]
    problems = check_prefill(points)
    assert [p.point for p in problems] == ["prefill 512 tokens"]
    assert "below 80 ms for 128 tokens" in str(problems[0])
    assert check_prefill([PrefillPoint(32, 5.0), PrefillPoint(128, 9.0)]) == []


def test_problems_line_shows_the_first_few_and_counts_the_rest() -> None:
    medians = {(b, k): 10.0 + b + k for b in BATCH_SIZES for k in KS}
    problems = check_latency(grid(medians, spread=0.9))
    line = problems_line(problems, limit=2)
    assert line.count("spans") == 2 and line.endswith(f"and {len(problems) - 2} more")


@pytest.mark.parametrize("limits", [{"max_spread": 0}, {"tolerance": 1.0}, {"tolerance": -0.1}])
def test_bad_limits_are_refused(limits) -> None:
    with pytest.raises(InputError):
        QualityLimits(**limits)
