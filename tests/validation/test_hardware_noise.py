"""validation.hardware: cells that did identical work are named, and their gap called noise."""

from __future__ import annotations

from dsd.validation.cells import CellResult
from dsd.validation.hardware import crossover, hardware_markdown, identical_work


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


def test_the_crossover_outside_prefill_steps_is_the_median_of_each_trials_difference() -> None:
    def cell(policy: str, trials: list[tuple[float, float]]) -> CellResult:
        metrics = [
            {"mean_tpot_ms": tpot, "mean_tpot_in_prefill_steps_ms": stalls}
            for tpot, stalls in trials
        ]
        return CellResult(policy, 8, metrics[0], {}, measured_trials=tuple(metrics))

    cells = [
        cell("static:0", [(100.0, 0.0), (104.0, 0.0), (102.0, 0.0)]),  # in step: no stalls
        cell("static:1", [(103.0, 15.0), (105.0, 18.0), (101.0, 12.0)]),  # 88, 87, 89
        cell("goodput", [(101.0, 0.0), (99.0, 0.0), (103.0, 0.0)]),
    ]
    text = hardware_markdown({"command": "x"}, None, crossover(cells), cells)
    total, outside = text.split("### The same, outside prefill steps")
    assert "| 8 | **100.0** | 103.0 | 0 | 101.0 (+1.0%) |" in total
    assert "| 8 | 102.0 | **88.0** | 1 | 101.0 (+14.8%) |" in outside
    # trials that did not record the part leave the table out
    plain = [CellResult(c.policy, 8, c.measured, {}) for c in cells]
    assert "outside prefill steps" not in hardware_markdown({}, None, crossover(plain), plain)


def test_the_speed_adjusted_crossover_divides_every_trial_by_its_machine_speed() -> None:
    """Raw, goodput reads 25% above static:1 because its trials ran on a slow machine (speed
    1.25); divided by the speeds, it did static:1's exact work at static:1's time."""

    def cell(policy: str, tpots: list[float], speeds: tuple[float, ...], k: int) -> CellResult:
        work = {"k_histogram": {k: 90}, "spec_decode_accepted_tokens": 60 * k}
        trials = tuple({"mean_tpot_ms": tpot, **work} for tpot in tpots)
        return CellResult(
            policy,
            4,
            trials[0] | {"mean_tpot_ms": sorted(tpots)[1]},
            {},
            measured_trials=trials,
            trial_speeds=speeds,
        )

    cells = [
        cell("static:0", [120.0, 120.0, 120.0], (1.0, 1.0, 1.0), 0),
        cell("static:1", [100.0, 96.0, 104.0], (1.0, 0.96, 1.04), 1),
        cell("goodput", [125.0, 125.0, 125.0], (1.25, 1.25, 1.25), 1),
    ]
    text = hardware_markdown({"command": "x"}, None, crossover(cells), cells)
    raw, adjusted = text.split("### The same, each trial divided by its machine speed")
    assert "| 4 | 120.0 | **100.0** | 1 | 125.0 (+25.0%) |" in raw
    assert "| 4 | 120.0 | **100.0** | 1 | 100.0 (+0.0%) |" in adjusted
    assert "static:1, goodput at C=4: 25.0%" in raw and "static:1, goodput at C=4: 0.0%" in adjusted
    assert "worst +25.0% (goodput at C=4) (speed-adjusted: worst +0.0% at C=4)" in raw
    # without speeds there is no such table, and the goal says nothing of it
    plain = [
        CellResult(c.policy, 4, c.measured, {}, measured_trials=c.measured_trials) for c in cells
    ]
    text = hardware_markdown({}, None, crossover(plain), plain)
    assert "each trial divided by its machine speed" not in text
    assert "speed-adjusted: worst" not in text


def test_the_level_is_the_median_over_every_trial_of_simulated_over_measured() -> None:
    """Trials of one cell spread by drift (0.8-1.25x); the median over all trials says where
    the simulator sits, from the cells' trials or from trials.csv rows alike."""
    from dsd.validation.report import level_lines

    def cell(policy: str, tpots: list[float], simulated: float) -> CellResult:
        trials = tuple({"mean_tpot_ms": tpot} for tpot in tpots)
        return CellResult(policy, 2, trials[0], {"mean_tpot_ms": simulated}, measured_trials=trials)

    cells = [cell("static:0", [80.0, 100.0, 125.0], 100.0), cell("goodput", [50.0, 40.0], 50.0)]
    line = level_lines(cells)[0]  # ratios 1.25, 1.0, 0.8, 1.0, 1.25
    assert "over all 5 trials" in line and "median 1.000, p10-p90 0.88-1.25" in line
    rows = [
        {"policy": "static:0", "max_concurrency": "2", "mean_tpot_ms": "80.0"},
        {"policy": "goodput", "max_concurrency": "2", "mean_tpot_ms": "40.0"},
        {"policy": "goodput", "max_concurrency": "2", "mean_tpot_ms": "0"},  # no ratio
        {"policy": "online", "max_concurrency": "2", "mean_tpot_ms": "40.0"},  # no such cell
    ]
    assert "over all 2 trials" in level_lines(cells, rows)[0]
    assert level_lines(cells, rows[:1]) == []  # one trial says nothing of a level
    text = hardware_markdown({"command": "x"}, None, crossover(cells), cells)
    assert line in text


def test_step_split_names_each_policys_time_outside_the_executor() -> None:
    import types

    import pandas as pd

    from dsd.validation.report import step_split_lines

    def cell(policy: str, concurrency: int, outside_ms: float) -> object:
        steps = pd.DataFrame(
            {"duration_s": [0.005 + outside_ms / 1000] * 3, "execute_s": [0.005] * 3}
        )
        return types.SimpleNamespace(
            policy=policy, max_concurrency=concurrency, measured_steps=steps
        )

    cells = [
        cell("static:0", 1, 0.2),
        cell("static:0", 2, 0.3),
        cell("per-request", 1, 0.6),
        cell("per-request", 2, 0.8),
    ]
    (line, _blank) = step_split_lines(cells)  # type: ignore[arg-type]
    assert "by policy" in line
    assert "static:0 0.25, per-request 0.70." in line
    assert "(per-request at C=2)" in line  # the largest share outside


def test_the_gaps_paired_by_trial_hold_the_shared_drift_out() -> None:
    # trials 1-3 of every cell ran together: the machine was 10% slower in trial 2 for all
    def cell(policy: str, tpots: list[float]) -> CellResult:
        metrics = [{"mean_tpot_ms": tpot} for tpot in tpots]
        median = sorted(tpots)[1]
        return CellResult(policy, 2, {"mean_tpot_ms": median}, {}, measured_trials=tuple(metrics))

    cells = [
        cell("static:0", [100.0, 110.0, 101.0]),
        cell("static:2", [90.0, 99.0, 91.0]),
        cell("goodput", [91.8, 100.98, 92.82]),  # +2% in every trial
    ]
    text = hardware_markdown({"command": "x"}, None, crossover(cells), cells)
    section = text.split("### The gaps paired by trial")[1]
    assert "- C=2 (vs static:2): goodput +2.0% (+2.0 to +2.0)" in section
    # one trial per cell: nothing to pair
    single = [CellResult(c.policy, 2, c.measured, {}) for c in cells]
    assert "paired by trial" not in hardware_markdown({}, None, crossover(single), single)


def test_a_goal_figure_never_prints_the_bound_it_missed_or_met_by_a_hair() -> None:
    from dsd.validation.hardware import _against_bound

    assert _against_bound(1.4990, 1.5, 2) == "1.499"  # missed: not "1.50"
    assert _against_bound(1.5004, 1.5, 2) == "1.5004"  # met, and says so
    assert _against_bound(1.5, 1.5, 2) == "1.50"
    assert _against_bound(1.46, 1.5, 2) == "1.46"
    assert _against_bound(2.04, 2.0, 1, sign=True) == "+2.04"
    assert _against_bound(-0.3, 2.0, 1, sign=True) == "-0.3"
    assert _against_bound(7.96, 8.0, 1) == "7.96"
