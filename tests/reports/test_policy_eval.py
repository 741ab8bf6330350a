"""reports.policy_eval: measured phased categories, trace-timed Azure points, gap arithmetic."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dsd.reports import cold_start, policy_eval
from dsd.reports.policy_eval import Gap, envelope_k, gap, measured_categories, verdict
from dsd.sim.models.replay import (
    DEFAULT_EXIT_LAYER,
    load_replay_recording,
    per_position_rates_from_recording,
)
from dsd.traces.registry import build_workload


def test_phased_categories_are_the_recordings_extremes() -> None:
    recording = load_replay_recording(layer=DEFAULT_EXIT_LAYER)
    by_category = {}
    for name in {c for c in recording.categories if c is not None}:
        members = [i for i, c in enumerate(recording.categories) if c == name]
        subset = recording.subset(members)
        by_category[name] = per_position_rates_from_recording(subset, policy_eval.K_MAX)
    easy, hard = measured_categories()
    lengths = {name: counted.acceptance_length for name, counted in by_category.items()}
    assert easy.name == max(lengths, key=lengths.__getitem__)
    assert hard.name == min(lengths, key=lengths.__getitem__)
    assert easy.rates == tuple(by_category[easy.name].rates)
    assert hard.rates == tuple(by_category[hard.name].rates)
    for category in (easy, hard):
        rates = np.array(category.rates)
        assert len(rates) == policy_eval.K_MAX
        assert np.all((rates >= 0) & (rates <= 1)) and np.all(np.diff(rates) <= 0)
    assert easy.acceptance_length > hard.acceptance_length


def test_phased_workload_is_tagged_with_the_measured_categories(tmp_path: Path) -> None:
    path = tmp_path / "phased.csv"
    policy_eval.write_phased_workload(path)
    easy, hard = measured_categories()
    tags = [line.split(",")[2] for line in path.read_text().splitlines()[1:]]
    per_phase = policy_eval.REQUESTS_PER_PHASE
    assert tags == [easy.name] * per_phase + [hard.name] * per_phase + [easy.name] * per_phase
    workload = {w.name: w for w in policy_eval.workloads(tmp_path)}["phased"]
    for _label, kwargs in workload.points:
        assert dict(kwargs["category_acceptance"]) == {easy.name: easy.rates, hard.name: hard.rates}


def test_azure_points_replay_the_trace_timestamps_compressed(tmp_path: Path) -> None:
    workload = {w.name: w for w in policy_eval.workloads(tmp_path)}["azure-conv"]
    arrivals = []
    for _label, kwargs in workload.points:
        assert "request_rate" not in kwargs  # the trace's own times, not Poisson
        built = build_workload(kwargs["dataset"], trace_options=kwargs["trace_options"])
        arrivals.append(np.array([r.arrival_s for r in built.requests]))  # [n]
    one_x, *compressed = arrivals
    assert one_x[-1] > 0.5 * policy_eval.AZURE_WINDOW_S  # real spread-out times
    for scale, times in zip(policy_eval.AZURE_TIME_SCALES[1:], compressed, strict=True):
        np.testing.assert_allclose(times, one_x / scale)  # same requests, compressed


def _table(
    static: dict[int, list[float]], **rows: list[float]
) -> dict[str, dict[str, list[float]]]:
    table = {f"static:{k}": {"p": v} for k, v in static.items()}
    table.update({label: {"p": v} for label, v in rows.items()})
    return table


STATIC = {k: [10.0 + abs(k - 2)] * 3 for k in range(policy_eval.K_MAX + 1)}


@pytest.mark.parametrize(
    ("values", "expected", "mean"),
    [
        ([9.0, 9.5, 9.2], "better", -0.0767),  # the interval lies below the envelope
        ([9.0, 10.5, 9.8], "tie", -0.0233),  # the interval straddles 0
        ([10.0, 10.0, 10.0], "tie", 0.0),  # exactly the envelope: zero width, a tie
        ([10.2, 10.1, 10.15], "worse", 0.015),  # above
    ],
)
def test_gap_is_the_mean_of_paired_gaps_with_a_t_interval(
    values: list[float], expected: str, mean: float
) -> None:
    table = _table(STATIC, policy=values)
    assert envelope_k(table, "p") == 2
    g = gap(table, "policy", "p")
    assert isinstance(g, Gap)
    assert g.mean == pytest.approx(mean, abs=1e-4)
    paired = np.array(values) / 10.0 - 1.0
    expected_width = stats.t.ppf(0.975, 2) * paired.std(ddof=1) / np.sqrt(3)
    assert g.half_width == pytest.approx(expected_width)
    assert (g.low, g.high) == (g.mean - g.half_width, g.mean + g.half_width)
    assert verdict(g) == expected


@pytest.mark.parametrize(
    ("spread", "have", "want"),
    [
        (0.0, 3, 3),  # resolved: no more seeds
        (0.5, 3, 6),  # a half-width over CI_TARGET: twice the seeds
        (0.5, 8, policy_eval.MAX_SEEDS),  # capped
        (0.5, policy_eval.MAX_SEEDS, policy_eval.MAX_SEEDS),
    ],
)
def test_points_get_more_seeds_until_their_intervals_are_narrow(
    spread: float, have: int, want: int
) -> None:
    static = {k: [10.0 + abs(k - 2)] * have for k in range(policy_eval.K_MAX + 1)}
    noisy = [10.0 + spread * (-1) ** i for i in range(have)]
    table = _table(static, goodput=noisy, online=[10.0] * have)
    assert policy_eval.seeds_wanted(table, "p", have) == want


def test_one_seed_has_no_interval() -> None:
    g = gap(_table({k: [v[0]] for k, v in STATIC.items()}, policy=[9.0]), "policy", "p")
    assert g.num_seeds == 1 and g.half_width == float("inf") and verdict(g) == "tie"


@pytest.mark.parametrize(
    ("requests_per_run", "num_seeds"),
    [
        (64, 16),  # MT-Bench C <= 16: 16 x 64 = 1,024 requests over the seeds
        (256, 4),  # C = 64, the RL rollout N = 256
        (1024, 3),  # never fewer than MIN_SEEDS
        (1, 1024),  # one request a run
    ],
)
def test_cold_start_seeds_give_enough_requests(requests_per_run: int, num_seeds: int) -> None:
    seeds = cold_start.point_seeds(requests_per_run)
    assert seeds == tuple(range(num_seeds))
    assert len(seeds) * requests_per_run >= cold_start.MIN_REQUESTS_PER_POINT


def test_every_point_states_how_many_requests_a_run_sends(tmp_path: Path) -> None:
    for workload in policy_eval.workloads(tmp_path):
        assert len(workload.requests_per_run) == len(workload.points)
        assert all(n >= 1 for n in workload.requests_per_run)


def test_runs_on_the_pr_profile_reserve_what_its_eagle_drafter_does(tmp_path: Path) -> None:
    """The PR profile's drafter is EAGLE-1; its format does not say so, so the reports name it
    (else the scheduler would reserve an n-gram drafter's nothing)."""
    kwargs = policy_eval.workloads(tmp_path)[0].points[0][1]
    scheduler = policy_eval.point_engine(kwargs, "static:3", 0).scheduler.config
    assert scheduler.speculative_method == "eagle"
    assert scheduler.num_lookahead_tokens == scheduler.k_max > 0


def test_the_committed_goal_table_is_what_the_committed_results_render_to() -> None:
    """results/policies/report.md's goal table comes from its results.json; a point where a
    policy is strictly better shows by how much (an interval can exclude 0 by a hair)."""
    folder = Path(__file__).resolve().parents[2] / "results" / "policies"
    results = json.loads((folder / "results.json").read_text())
    rendered = policy_eval._markdown(results, folder, seconds=0.0, num_workers=2)
    section = "## Goals per policy and workload"
    committed = (folder / "report.md").read_text()
    assert rendered[rendered.index(section) :] == committed[committed.index(section) :]
    goal_rows = [line for line in rendered.splitlines() if line.startswith("| mt-bench | ")]
    better = [row.split(" | ")[3] for row in goal_rows]
    assert any(cell != "-" for cell in better)
    assert all(
        re.fullmatch(r"(?:[^,()]+ \([+-]\d+\.\d\d%\)(?:, )?)+", cell)
        for cell in better
        if cell != "-"
    )
