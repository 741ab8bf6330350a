"""reports.cold_start: the forced-K wrapper and its table."""

from __future__ import annotations

import dataclasses

import pytest

from dsd.policies.range_table import synthetic_view
from dsd.policies.static import StaticPolicy
from dsd.reports.cold_start import CASES, ForcedSteps, markdown


@pytest.mark.parametrize(
    ("k_timing", "played"),
    [
        ("same-step", [2, 0, 2, 0, 2]),  # K chosen at step t is verified at t
        ("next-step", [0, 2, 0, 2, 2]),  # at t + 1: played one step earlier
    ],
)
def test_forced_steps_set_the_k_that_the_chosen_steps_verify(
    k_timing: str, played: list[int]
) -> None:
    policy = ForcedSteps(StaticPolicy(2), frozenset({1, 3}), 0)
    views = [
        dataclasses.replace(synthetic_view(8, 5), step_index=i, k_timing=k_timing) for i in range(5)
    ]
    assert [policy.choose_k(v) for v in views] == played


def test_table_has_one_row_per_case_with_the_seed_range() -> None:
    text = markdown([(case, [0.5, -0.25, 1.0]) for case in CASES])
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| mt-bench") or line.startswith("| rl-rollout")
    ]
    assert len(rows) == len(CASES)
    assert rows[0].endswith("| +0.42% [-0.25, +1.00] |")
    # the prose quotes the spans to the table's precision (one decimal made "+0.4 to +0.4%")
    assert "one such step costs +0.42 to +0.42% of mean TPOT" in text
    assert "python -m dsd.reports.cold_start --out results/policies" in text
