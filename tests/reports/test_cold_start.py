"""reports.cold_start: the forced-K wrapper and its table."""

from __future__ import annotations

import dataclasses

from dsd.policies.range_table import synthetic_view
from dsd.policies.static import StaticPolicy
from dsd.reports.cold_start import CASES, ForcedSteps, markdown


def test_forced_steps_override_only_the_chosen_decode_steps() -> None:
    policy = ForcedSteps(StaticPolicy(2), frozenset({1, 3}), 0)
    views = [dataclasses.replace(synthetic_view(8, 5), step_index=i) for i in range(5)]
    assert [policy.choose_k(v) for v in views] == [2, 0, 2, 0, 2]
    prefill_only = dataclasses.replace(views[1], num_decode_reqs=0)
    assert policy.choose_k(prefill_only) == 2  # nothing decodes: nothing to force


def test_table_has_one_row_per_case_with_the_seed_range() -> None:
    text = markdown([(case, [0.5, -0.25, 1.0]) for case in CASES])
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| mt-bench") or line.startswith("| rl-rollout")
    ]
    assert len(rows) == len(CASES)
    assert rows[0].endswith("| +0.42% [-0.25, +1.00] |")
    assert "python -m dsd.reports.cold_start --out reports/policies" in text
