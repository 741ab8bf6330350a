"""reports.ablation: what the fidelity ablation runs."""

from __future__ import annotations

from dsd.reports import ablation
from dsd.sim.resolve import resolve


def test_the_pr_profile_runs_with_its_drafters_reservations() -> None:
    """The PR's format does not name its drafter: the ablation says EAGLE, so the scheduler
    reserves EAGLE's KV lookahead (K slots per row), not ngram's nothing."""
    cells = ablation.ablation_cells(
        str(ablation.PR_PROFILE), (1, 4), ablation.PR_POLICIES, 2, seed=0
    )
    assert {cell.config.speculative_method for cell in cells} == {"eagle"}
    scheduler = resolve(cells[0].config).scheduler_config
    assert scheduler.num_lookahead_tokens == scheduler.k_max == 5
