"""Hysteresis wrapper: no flapping at a table edge, dwell, async lookahead, clamping."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.policies.range_table import RangeTablePolicy, synthetic_view
from dsd.policies.spec import parse_policy
from dsd.policies.switching import HysteresisConfig, HysteresisPolicy
from dsd.policies.types import StepView

EDGE_TABLE = [[1, 17, 3], [18, 256, 2]]  # one edge between B=17 and B=18


def _policy(**kwargs) -> HysteresisPolicy:  # type: ignore[no-untyped-def]
    base = RangeTablePolicy(EDGE_TABLE, 5, 256)
    return HysteresisPolicy(base, 256, HysteresisConfig(**kwargs))


def test_no_flapping_when_b_wanders_across_an_edge() -> None:
    policy = _policy(margin=0.15, min_dwell=0)
    base = RangeTablePolicy(EDGE_TABLE, 5, 256)
    batch_sizes = [17, 18] * 50  # B flips across the edge every step
    wrapped = [policy.choose_k(synthetic_view(b, 5)) for b in batch_sizes]
    raw = [base.choose_k(synthetic_view(b, 5)) for b in batch_sizes]
    assert len(set(wrapped)) == 1  # the wrapper never switches
    assert sum(a != b for a, b in itertools.pairwise(raw)) == 99  # the base flaps


def test_follows_a_clear_change() -> None:
    policy = _policy(margin=0.15, min_dwell=0)
    assert policy.choose_k(synthetic_view(17, 5)) == 3
    assert policy.choose_k(synthetic_view(40, 5)) == 2  # far from the edge: switch at once
    assert policy.choose_k(synthetic_view(4, 5)) == 3


def test_min_dwell_holds_k_after_a_change() -> None:
    policy = _policy(margin=0.0, min_dwell=3)
    ks = [policy.choose_k(synthetic_view(b, 5)) for b in [40, 4, 40, 40, 40, 40]]
    assert ks == [2, 3, 3, 3, 2, 2]  # the switch to K=3 is held for 3 steps, then K=2
    assert policy.num_switches == 2


def test_the_first_decision_is_not_held_by_the_dwell() -> None:
    # A run's first decode step (B=4 here) is not a switch: when the batch fills (B=40) the
    # wrapper follows the base at once instead of holding the ramp-up K for min_dwell steps.
    policy = _policy(margin=0.15, min_dwell=4)
    ks = [policy.choose_k(synthetic_view(b, 5)) for b in [4, 40, 40]]
    assert ks == [3, 2, 2]
    assert policy.num_switches == 1


def _prefill_only_view(batch_size: int) -> StepView:
    """B prefill chunks and no decode row: nothing drafts whatever K is."""
    view = synthetic_view(batch_size, 5)
    empty = np.zeros(0, dtype=np.int64)
    return dataclasses.replace(
        view, num_decode_reqs=0, req_ids=empty, context_lens=empty, num_tokens=256 * batch_size
    )


def test_a_step_without_decode_rows_neither_sets_nor_holds_k() -> None:
    # MT-Bench C=256 start: step 0 prefills a few requests only (B=4: the base says K=3); the
    # first decode step is at B=40 (K=2). Without decode rows K does nothing, so the first real
    # decision is the one at B=40 and no dwell from step 0 keeps K=3 there.
    policy = _policy(margin=0.15, min_dwell=4)
    assert policy.choose_k(_prefill_only_view(4)) == 3  # what the base says; not recorded
    assert policy.current_k is None
    assert [policy.choose_k(synthetic_view(40, 5)) for _ in range(2)] == [2, 2]
    assert policy.num_switches == 0


def test_steps_without_decode_rows_do_not_count_toward_the_dwell() -> None:
    policy = _policy(margin=0.0, min_dwell=2)
    assert [policy.choose_k(synthetic_view(b, 5)) for b in [40, 4]] == [2, 3]  # a switch
    assert [policy.choose_k(_prefill_only_view(40)) for _ in range(5)] == [3] * 5
    assert [policy.choose_k(synthetic_view(40, 5)) for _ in range(2)] == [3, 2]


def test_clamps_to_view_k_max_at_once() -> None:
    policy = _policy(margin=0.5, min_dwell=100)
    assert policy.choose_k(synthetic_view(4, 5)) == 3
    assert policy.choose_k(synthetic_view(4, 1)) == 1  # engine now runs at most K=1


@pytest.mark.parametrize(
    ("k_timing", "lookahead", "expected"),
    [
        ("next-step", "auto", 2),  # K verified next step: B rises by 4 a step, next B = 19 -> 2
        ("same-step", "auto", 3),  # K verified now: decide for the current B = 15
        ("same-step", "always", 2),  # forced lookahead
        ("next-step", "never", 3),  # lookahead off
    ],
)
def test_lookahead_uses_predicted_b_when_k_applies_next_step(
    k_timing: str, lookahead: str, expected: int
) -> None:
    policy = _policy(margin=0.0, min_dwell=0, lookahead=lookahead, trend_smoothing=1.0)
    for batch_size in (3, 7, 11):
        policy.choose_k(dataclasses.replace(synthetic_view(batch_size, 5), k_timing=k_timing))
    view = dataclasses.replace(synthetic_view(15, 5), k_timing=k_timing)
    assert policy.choose_k(view) == expected


def test_observe_reaches_the_base() -> None:
    from policy_factories import h100_profile

    policy = parse_policy(
        "hysteresis:online:warmup_steps=0:margin=0.1",
        profile=h100_profile(),
        k_max=5,
        max_num_seqs=64,
    )
    assert isinstance(policy, HysteresisPolicy)
    assert policy.config.margin == 0.1
    from dsd.policies.types import StepFeedback

    policy.observe(StepFeedback(0, 0.0, 2, np.arange(2), np.array([3, 3]), np.array([0, 0]), 0.01))
    assert policy.base.num_observed_steps == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("hysteresis", "needs a base policy"),  # no base
        ("hysteresis:bandit", "batch-level"),  # sampling base
        ("hysteresis:static:2:margin=2", "margin must be in"),  # margin out of range
        ("hysteresis:static:2:min_dwell=-1", "min_dwell must be >= 0"),  # negative dwell
    ],
)
def test_bad_specs(spec: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        parse_policy(spec, profile=None, k_max=5, max_num_seqs=64)
