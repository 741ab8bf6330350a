"""reports.hardware: cells that did identical work are named, and their gap called noise."""

from __future__ import annotations

from dsd.backend.validate import CellResult
from dsd.reports.hardware import crossover, hardware_markdown, identical_work


def _cell(policy: str, tpot_ms: float, k_histogram: dict[int, int], accepted: int) -> CellResult:
    drafts = sum(n for k, n in k_histogram.items() if k > 0)
    measured = {
        "mean_tpot_ms": tpot_ms,
        "k_histogram": k_histogram,
        "spec_decode_num_drafts": drafts,
        "spec_decode_draft_tokens": sum(k * n for k, n in k_histogram.items()),
        "spec_decode_accepted_tokens": accepted,
        "total_output_tokens": 768,
    }
    return CellResult(policy, 8, measured, {"mean_tpot_ms": tpot_ms})


def test_a_policy_that_did_a_static_ks_work_is_not_said_to_beat_it() -> None:
    cells = [
        _cell("static:0", 242.8, {0: 700}, 0),
        _cell("static:4", 221.7, {4: 300}, 500),
        _cell("goodput", 211.3, {0: 700}, 0),  # K = 0 throughout, like static:0
        _cell("per-request", 204.9, {0: 200, 4: 250}, 400),
    ]
    groups = identical_work(cells)
    assert [(c, [cell.policy for cell in group]) for c, group in groups] == [
        (8, ["static:0", "goodput"])
    ]
    text = hardware_markdown({"command": "x"}, None, crossover(cells), cells)
    assert "goodput at C=8 (-4.7%; did static:0's exact work: noise)" in text
    assert "per-request at C=8 (-7.6%)" in text
    assert "identical work" in text and "static:0, goodput at C=8: 14.9%" in text
