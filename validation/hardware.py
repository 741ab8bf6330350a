"""The real-hardware report: speedup at B = 1, the crossover, and simulated vs measured TPOT.

`dsd hardware-report` (validation.pipeline) measures; this module only analyses and writes: the
crossover (per C, every static K's and every dynamic policy's measured TPOT, the envelope and
each gap to it), the goals met or missed, and the report's files (report.md, crossover.csv,
speedup.json, config.json and the plots, beside `validation.report`'s cells.csv, trials.csv,
steps.csv and validation.md; docs/validation.md, "`dsd hardware-report`"). A cell's measured
TPOT is the median over its trials.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsd.common import strict_json
from dsd.common.atomic import atomic_write_text
from dsd.reports.paired import paired_gap
from dsd.validation.report import (
    Cell,
    as_number,
    cell_tables,
    format_number,
    level_lines,
    plot_k_over_time,
    plot_tpot_vs_concurrency,
    prompts_lines,
    report_markdown,
    save_concurrency_plot,
    speed_adjusted_lines,
    step_split_lines,
    tpot_error_summary,
)
from dsd.validation.speedup import SpeedupResult, speedup_table

SPEEDUP_GOAL = 1.5  # B = 1 TPOT ratio of the best draft arm over plain decoding
ENVELOPE_GAP_GOAL_PCT = 2.0  # goodput / online TPOT above the best static K, at every C
# Mean TPOT over held-out cells (prompts the profile never recorded: the acceptance is
# predicted, not replayed), and the timing part alone (the replay of each run's own drafts)
MEDIAN_ERROR_GOAL_PCT = 4.0
MAX_ERROR_GOAL_PCT = 10.0
MEDIAN_TIMING_ERROR_GOAL_PCT = 3.0
MAX_TIMING_ERROR_GOAL_PCT = 8.0
INTERVAL_COVERAGE_GOAL = 0.85  # share of cells whose measured TPOT is in the 90% interval
GAP_CHECKED_POLICIES = ("goodput", "online")  # policy families the envelope goal applies to


def _tpot(cell: Cell) -> float:
    try:
        return float(cell.measured.get("mean_tpot_ms", math.nan))
    except (TypeError, ValueError):
        return math.nan


def _tpot_outside_prefill_steps(cell: Cell) -> float:
    """Median over the trials of mean TPOT less its part in steps that also ran prompts (NaN
    where the trials did not record that part)."""
    values = [
        float(trial["mean_tpot_ms"]) - float(trial["mean_tpot_in_prefill_steps_ms"])
        for trial in cell.measured_trials
        if "mean_tpot_in_prefill_steps_ms" in trial
    ]
    return statistics.median(values) if values else math.nan


def _tpot_speed_adjusted(cell: Cell) -> float:
    """Median over the trials of mean TPOT divided by the trial's machine speed (NaN without
    speeds)."""
    return cell.speed_adjusted_measured("mean_tpot_ms")


def static_k(policy: str) -> int | None:
    """K of a `static:K` SPEC, else None."""
    base, _, value = policy.partition(":")
    if base != "static" or not value.isdigit():
        return None
    return int(value)


@dataclass(frozen=True)
class CrossoverRow:
    """One concurrency C: the static envelope and every dynamic policy's gap to it."""

    max_concurrency: int
    k_star: int  # the static K with the lowest measured TPOT
    envelope_tpot_ms: float  # that TPOT
    static_tpot_ms: dict[int, float]  # K -> measured TPOT
    dynamic_tpot_ms: dict[str, float]  # policy SPEC -> measured TPOT

    def gap_pct(self, policy: str) -> float:
        """(TPOT(policy) - envelope) / envelope, percent (negative: beats every static K)."""
        return (self.dynamic_tpot_ms[policy] / self.envelope_tpot_ms - 1.0) * 100.0


def crossover(
    cells: Sequence[Cell], tpot_of: Callable[[Cell], float] = _tpot
) -> list[CrossoverRow]:
    """One row per C that has at least one static cell, by C; `tpot_of` is each cell's
    measured figure (mean TPOT unless given)."""
    by_c: dict[int, list[Cell]] = {}
    for cell in cells:
        if cell.max_concurrency is not None:
            by_c.setdefault(int(cell.max_concurrency), []).append(cell)
    rows = []
    for concurrency in sorted(by_c):
        statics = {
            k: tpot_of(c) for c in by_c[concurrency] if (k := static_k(c.policy)) is not None
        }
        statics = {k: t for k, t in statics.items() if math.isfinite(t)}
        if not statics:
            continue
        k_star = min(statics, key=lambda k: (statics[k], k))
        dynamic = {c.policy: tpot_of(c) for c in by_c[concurrency] if static_k(c.policy) is None}
        rows.append(
            CrossoverRow(
                concurrency, k_star, statics[k_star], dict(sorted(statics.items())), dynamic
            )
        )
    return rows


def crossover_csv(rows: Sequence[CrossoverRow]) -> str:
    """One line per (C, policy): measured TPOT, whether it is the envelope, gap % (a missing
    value: an empty field)."""
    lines: list[list[Any]] = [
        ["max_concurrency", "policy", "mean_tpot_ms", "k_star", "gap_to_envelope_pct"]
    ]
    for row in rows:
        for k, tpot in row.static_tpot_ms.items():
            gap = (tpot / row.envelope_tpot_ms - 1.0) * 100.0
            lines.append([row.max_concurrency, f"static:{k}", tpot, row.k_star, gap])
        for policy in row.dynamic_tpot_ms:
            lines.append(
                [
                    row.max_concurrency,
                    policy,
                    row.dynamic_tpot_ms[policy],
                    row.k_star,
                    row.gap_pct(policy),
                ]
            )
    return strict_json.csv_text(lines)


@dataclass(frozen=True)
class Goal:
    """One goal of the report: what, the measured figure, met or missed."""

    name: str
    figure: str
    met: bool | None  # None: not measured in this report


def goals(
    speedup: SpeedupResult | None, rows: Sequence[CrossoverRow], cells: Sequence[Cell]
) -> list[Goal]:
    """The report's goals, each met or missed with its figure (module docstring)."""
    found: list[Goal] = []
    if speedup is not None and len(speedup.arms) > 1:
        best = max(speedup.arms[1:], key=lambda a: a.speedup_median)
        identical = all(a.identical_to_first_arm for a in speedup.arms)
        shown = _against_bound(best.speedup_median, SPEEDUP_GOAL, 2)
        found.append(
            Goal(
                f"B=1 speedup >= {SPEEDUP_GOAL}x, output identical to plain greedy",
                f"{shown}x ({best.arm}); identical tokens: {'yes' if identical else 'NO'}",
                best.speedup_median >= SPEEDUP_GOAL and identical,
            )
        )
    if rows:
        k_stars = [row.k_star for row in rows]
        found.append(
            Goal(
                "K* does not rise as C grows",
                ", ".join(f"C={r.max_concurrency}: K*={r.k_star}" for r in rows),
                all(b <= a for a, b in itertools.pairwise(k_stars)),
            )
        )
        adjusted_rows = crossover(cells, _tpot_speed_adjusted)
        for family in GAP_CHECKED_POLICIES:
            gaps = _family_gaps(rows, family)
            if gaps:
                worst = max(gaps, key=lambda g: g[2])
                shown = _against_bound(worst[2], ENVELOPE_GAP_GOAL_PCT, 1, sign=True)
                figure = f"worst {shown}% ({worst[1]} at C={worst[0]})"
                adjusted_gaps = [
                    gap for gap in _family_gaps(adjusted_rows, family) if math.isfinite(gap[2])
                ]
                if adjusted_gaps:
                    most = max(adjusted_gaps, key=lambda g: g[2])
                    figure += f" (speed-adjusted: worst {most[2]:+.1f}% at C={most[0]})"
                found.append(
                    Goal(
                        f"{family} within {ENVELOPE_GAP_GOAL_PCT:g}% of the best static K at "
                        "every C",
                        figure,
                        worst[2] <= ENVELOPE_GAP_GOAL_PCT,
                    )
                )
    summary = tpot_error_summary(cells)
    median, largest = summary["median_abs_tpot_error_pct"], summary["max_abs_tpot_error_pct"]
    if math.isfinite(median):
        figure = (
            f"median {_against_bound(median, MEDIAN_ERROR_GOAL_PCT, 1)}%, "
            f"max {_against_bound(largest, MAX_ERROR_GOAL_PCT, 1)}% over {len(cells)} cells"
        )
        adjusted = (
            summary["median_abs_speed_adjusted_error_pct"],
            summary["max_abs_speed_adjusted_error_pct"],
        )
        if math.isfinite(adjusted[0]):
            figure += (
                f" (each trial divided by the machine's speed during it: median "
                f"{adjusted[0]:.1f}%, max {adjusted[1]:.1f}%)"
            )
        found.append(
            Goal(
                f"simulated vs measured mean TPOT: median |error| <= {MEDIAN_ERROR_GOAL_PCT:g}%, "
                f"max <= {MAX_ERROR_GOAL_PCT:g}%",
                figure,
                median <= MEDIAN_ERROR_GOAL_PCT and largest <= MAX_ERROR_GOAL_PCT,
            )
        )
    timing = summary["median_abs_timing_error_pct"], summary["max_abs_timing_error_pct"]
    if math.isfinite(timing[0]):
        found.append(
            Goal(
                f"timing part (each run's own drafts replayed): median |error| <= "
                f"{MEDIAN_TIMING_ERROR_GOAL_PCT:g}%, max <= {MAX_TIMING_ERROR_GOAL_PCT:g}%",
                f"median {_against_bound(timing[0], MEDIAN_TIMING_ERROR_GOAL_PCT, 1)}%, "
                f"max {_against_bound(timing[1], MAX_TIMING_ERROR_GOAL_PCT, 1)}%",
                timing[0] <= MEDIAN_TIMING_ERROR_GOAL_PCT
                and timing[1] <= MAX_TIMING_ERROR_GOAL_PCT,
            )
        )
    coverage = summary["interval_coverage"]
    if math.isfinite(coverage):
        found.append(
            Goal(
                f"measured mean TPOT inside the simulator's 90% interval in >= "
                f"{INTERVAL_COVERAGE_GOAL:.0%} of cells",
                f"{coverage:.0%} of {int(summary['interval_cells'])} cells (median half-width "
                f"{summary['median_interval_half_width_pct']:.1f}%)",
                coverage >= INTERVAL_COVERAGE_GOAL,
            )
        )
    return found


def _against_bound(value: float, bound: float, digits: int, sign: bool = False) -> str:
    """`value` with `digits` decimals, or more where fewer would print the goal's own bound for a
    figure on either side of it (1.499 against 1.5 reads 1.499, not a "missed" 1.50)."""
    for shown_digits in range(digits, digits + 4):
        if round(value, shown_digits) != bound or value == bound:
            break
    return f"{value:{'+' if sign else ''}.{shown_digits}f}"


def _family_gaps(rows: Sequence[CrossoverRow], family: str) -> list[tuple[int, str, float]]:
    """(C, policy, gap %) of every dynamic policy of `family` (`goodput:...` is goodput's)."""
    return [
        (row.max_concurrency, policy, row.gap_pct(policy))
        for row in rows
        for policy in row.dynamic_tpot_ms
        if policy.partition(":")[0] == family
    ]


def _verdict(goal: Goal, dry_run: bool = False) -> str:
    """A goal's verdict; a dry run (`--quick`: too few prompts and trials to judge) has none."""
    if dry_run:
        return "dry run: no verdict"
    return "not measured" if goal.met is None else ("met" if goal.met else "**missed**")


def _crossover_markdown(rows: Sequence[CrossoverRow]) -> list[str]:
    if not rows:
        return []
    ks = sorted({k for row in rows for k in row.static_tpot_ms})
    dynamic = sorted({p for row in rows for p in row.dynamic_tpot_ms})
    header = ["C", *[f"K={k}" for k in ks], "K*", *dynamic]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in rows:
        cells = [str(row.max_concurrency)]
        for k in ks:
            tpot = row.static_tpot_ms.get(k)
            text = "" if tpot is None else f"{tpot:.1f}"
            cells.append(f"**{text}**" if k == row.k_star else text)
        cells.append(str(row.k_star))
        for policy in dynamic:
            if policy in row.dynamic_tpot_ms:
                cells.append(f"{row.dynamic_tpot_ms[policy]:.1f} ({row.gap_pct(policy):+.1f}%)")
            else:
                cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _outside_prefill_steps_lines(cells: Sequence[Cell]) -> list[str]:
    """The crossover again on the TPOT of the decode steps alone ([] where no trial recorded
    `mean_tpot_in_prefill_steps_ms`; one line where it is the measured table again)."""
    rows = crossover(cells, _tpot_outside_prefill_steps)
    if not rows:
        return []
    if _crossover_markdown(rows) == _crossover_markdown(crossover(cells)):
        return [
            "",
            "Outside prefill steps the table is the same (no decode row waited on a prompt).",
        ]
    return [
        "",
        "### The same, outside prefill steps",
        "",
        "Mean TPOT less its part in steps that also ran other requests' prompts "
        "(`mean_tpot_in_prefill_steps_ms`, median over the trials): the decode steps alone, "
        "where K acts. A K policy does not choose when prompts run, yet K moves them: with "
        "equal output lengths K = 0 finishes a wave of requests in the same step, so the next "
        "wave's prompts run while nothing decodes, and K > 0 staggers the finishes, so each "
        "prompt stalls the requests still decoding (docs/policies.md).",
        "",
        *_crossover_markdown(rows),
    ]


def _speed_adjusted_crossover_lines(cells: Sequence[Cell]) -> list[str]:
    """The crossover again with every trial divided by its machine speed ([] without speeds;
    one line where it is the measured table again), and its noise floor where that differs."""
    rows = crossover(cells, _tpot_speed_adjusted)
    if not rows:
        return []
    if _crossover_markdown(rows) == _crossover_markdown(crossover(cells)):
        return ["", "Divided by the machine's speed during each trial the table is the same."]
    noise = _noise_floor_lines(cells, _tpot_speed_adjusted)
    return [
        "",
        "### The same, each trial divided by its machine speed",
        "",
        "Median over the trials of each one's mean TPOT divided by the machine's speed during "
        'it (the profile\'s points timed between its steps; "Simulated vs measured" below): '
        "the cells as if all ran at one speed. The verdicts above use the undivided medians.",
        "",
        *_crossover_markdown(rows),
        *([] if noise == _noise_floor_lines(cells) else noise),
    ]


def _paired_gap_lines(rows: Sequence[CrossoverRow], cells: Sequence[Cell]) -> list[str]:
    """Each dynamic policy's gap to the best static K trial by trial: the cells of one C run
    together, a step at a time, so their i-th trials saw the same moments of the machine
    ([] where no cell has two trials to pair)."""
    by_key = {(cell.policy, cell.max_concurrency): cell for cell in cells}
    parts = []
    for row in rows:
        envelope = by_key.get((f"static:{row.k_star}", row.max_concurrency))
        if envelope is None:
            continue
        reference = [float(trial["mean_tpot_ms"]) for trial in envelope.measured_trials]
        gaps = []
        for policy in row.dynamic_tpot_ms:
            values = [
                float(trial["mean_tpot_ms"])
                for trial in by_key[(policy, row.max_concurrency)].measured_trials
            ]
            if len(values) < 2 or len(values) != len(reference):
                continue
            gap = paired_gap(values, reference)
            gaps.append(
                f"{policy} {100 * gap.mean:+.1f}% ({100 * gap.low:+.1f} to {100 * gap.high:+.1f})"
            )
        if gaps:
            parts.append(f"C={row.max_concurrency} (vs static:{row.k_star}): " + ", ".join(gaps))
    if not parts:
        return []
    return [
        "",
        "### The gaps paired by trial",
        "",
        "The cells of one C run together, a step at a time, so the i-th trial of each saw the "
        "same moments of the machine. Each dynamic policy's TPOT over the best static K's (by "
        "the medians above), trial i against trial i: mean and its 95% interval. A sharper "
        "reading of the same gap; the verdicts use the medians.",
        "",
        *[f"- {part}" for part in parts],
    ]


def _error_split_markdown(cells: Sequence[Cell]) -> list[str]:
    """One row per cell: mean TPOT measured, simulated, replayed and the errors (%)."""
    lines = [
        "| policy | C | measured ms | trial spread % | simulated ms | error % | replayed ms "
        "| timing error % | acceptance error % | machine speed | speed-adjusted trial spread % "
        "| speed-adjusted error % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        figures = (
            cell.measured.get("mean_tpot_ms"),
            cell.trial_spread_pct("mean_tpot_ms"),
            cell.simulated.get("mean_tpot_ms"),
            cell.error_pct("mean_tpot_ms"),
            cell.replayed.get("mean_tpot_ms"),
            cell.timing_error_pct("mean_tpot_ms"),
            cell.acceptance_error_pct("mean_tpot_ms"),
        )
        texts = [format_number(as_number(value), 1) for value in figures]
        texts += [
            format_number(cell.machine_speed, 2),
            format_number(cell.trial_spread_pct("mean_tpot_ms", speed_adjusted=True), 1),
            format_number(cell.speed_adjusted_error_pct("mean_tpot_ms"), 1),
        ]
        concurrency = "-" if cell.max_concurrency is None else str(cell.max_concurrency)
        lines.append(f"| {cell.policy} | {concurrency} | " + " | ".join(texts) + " |")
    return lines


def work_signature(cell: Cell) -> tuple[Any, ...]:
    """What a cell's real run computed: K per step (histogram), drafts, accepted and output
    tokens. Two cells with one signature did the same work; their TPOT differs by noise only."""
    measured = cell.measured
    histogram = measured.get("k_histogram") or {}
    return (
        tuple(sorted((int(k), int(n)) for k, n in dict(histogram).items())),
        *(
            measured.get(key)
            for key in (
                "spec_decode_num_drafts",
                "spec_decode_draft_tokens",
                "spec_decode_accepted_tokens",
                "total_output_tokens",
            )
        ),
    )


def identical_work(cells: Sequence[Cell]) -> list[tuple[int, list[Cell]]]:
    """Per C, the groups of two or more cells that did the same work (`work_signature`)."""
    groups: dict[tuple[Any, ...], list[Cell]] = {}
    for cell in cells:
        if cell.max_concurrency is not None:
            key = (int(cell.max_concurrency), work_signature(cell))
            groups.setdefault(key, []).append(cell)
    return [(key[0], group) for key, group in groups.items() if len(group) > 1]


def _noise_floor_lines(
    cells: Sequence[Cell], tpot_of: Callable[[Cell], float] = _tpot
) -> list[str]:
    """How far apart cells that did identical work measured: the noise floor of a cell."""
    found: list[tuple[float, str]] = []  # (spread %, what)
    for concurrency, group in identical_work(cells):
        tpots = [tpot_of(cell) for cell in group]
        low, high = min(tpots), max(tpots)
        if low > 0 and math.isfinite(high):
            names = ", ".join(cell.policy for cell in group)
            found.append(((high / low - 1.0) * 100.0, f"{names} at C={concurrency}"))
    if not found:
        return []
    listed = "; ".join(f"{what}: {spread:.1f}%" for spread, what in found)
    return [
        "",
        "Cells that did identical work (same K per step, drafts and accepted tokens) measured "
        f"up to {max(found)[0]:.1f}% apart ({listed}): differences of that size between cells "
        "are this machine's noise, not the policies'.",
    ]


def _beats_envelope_lines(rows: Sequence[CrossoverRow], cells: Sequence[Cell]) -> list[str]:
    """Where a dynamic policy beat every static K (negative gap): per-request K can, when
    acceptance differs by request; the others at best match the envelope. A policy that did a
    static K's exact work is marked: its gap is noise."""
    twins: dict[tuple[int, str], str] = {}
    for concurrency, group in identical_work(cells):
        statics = [cell.policy for cell in group if static_k(cell.policy) is not None]
        for cell in group:
            if statics and static_k(cell.policy) is None:
                twins[(concurrency, cell.policy)] = statics[0]
    beaten = []
    for row in rows:
        for policy in sorted(row.dynamic_tpot_ms):
            if row.gap_pct(policy) >= 0:
                continue
            text = f"{policy} at C={row.max_concurrency} ({row.gap_pct(policy):+.1f}%"
            twin = twins.get((row.max_concurrency, policy))
            text += f"; did {twin}'s exact work: noise)" if twin else ")"
            beaten.append(text)
    text = "; ".join(beaten) if beaten else "none"
    return ["", f"Dynamic policies faster than the best static K: {text}."]


def hardware_markdown(
    config: dict[str, Any],
    speedup: SpeedupResult | None,
    rows: Sequence[CrossoverRow],
    cells: Sequence[Cell],
) -> str:
    """report.md: goals, machine, speedup table, crossover table, validation summary."""
    title = f"Real-hardware report: {config.get('target')} + {config.get('draft')} on " + str(
        config.get("device_name", config.get("device"))
    )
    lines = [f"# {title}", ""]
    lines += ["Command (the whole report):", "", "```", str(config.get("command", "")), "```", ""]
    lines += ["## Goals", ""]
    if config.get("quick"):
        lines += [
            "A dry run (`--quick`): too few prompts and trials to judge a goal; the figures "
            "show that every stage ran.",
            "",
        ]
    if config.get("acceptance"):
        lines += [
            f"Acceptance: {config['acceptance']}. Every real run accepted, per request and step, "
            "the counts the simulator draws for the same cell and seed (from "
            f"{config.get('plan', {}).get('acceptance_profile')}'s rates), so the errors below "
            "are timing alone; the emitted tokens mean nothing (random weights).",
            "",
        ]
    if config.get("b1_plain_decode_ms") is not None:
        lines += [
            f"Plain decode at B = 1 (the profile's K = 0 point): "
            f"{config['b1_plain_decode_ms']:.2f} ms on {config.get('device_name')}; vLLM: 6.3 ms "
            "on an H100 (PR #32374's table).",
            "",
        ]
    lines += ["| goal | measured | verdict |", "|---|---|---|"]
    for goal in goals(speedup, rows, cells):
        lines.append(
            f"| {goal.name} | {goal.figure} | {_verdict(goal, bool(config.get('quick')))} |"
        )
    prompts = sorted({cell.num_prompts for cell in cells if cell.num_prompts})
    if prompts:
        lines += ["", f"Prompts per cell: {', '.join(map(str, prompts))}."]
    lines += ["", *prompts_lines(config)]
    lines += ["## Machine", ""]
    for key in ("device_name", "dtype", "matmul", "load_average", "versions", "date", "quick"):
        if key in config:
            lines.append(f"- {key}: {config[key]}")
    if config.get("trials_done", config.get("trials")) != config.get("trials"):
        lines.append(
            f"- trials per cell: {config['trials_done']} of the {config['trials']} planned "
            f"(the time budget, {config.get('time_budget_s')} s, stopped the rounds)"
        )
    threads = config.get("threads")
    if isinstance(threads, dict):
        lines.append("- threads: " + ", ".join(f"{k} {v}" for k, v in threads.items()))
    problems = config.get("profile_problems")
    if problems is not None:
        lines.append(
            "- profile timing checks: "
            + ("passed" if not problems else f"{len(problems)} problems: " + "; ".join(problems))
        )
    loads = config.get("load_during", {})
    if loads:
        lines.append(
            f"- 1-minute load average during the measurements: {loads.get('min', math.nan):.2f}"
            f" to {loads.get('max', math.nan):.2f}"
        )
    if speedup is not None:
        lines += [
            "",
            "## Speedup at B = 1",
            "",
            f"{config.get('speedup_prompts')} prompts of {config.get('dataset')}, "
            f"{config.get('speedup_repeats')} repeats, arms in a rotated order per repeat; "
            "speedup = TPOT(plain) / TPOT(arm) per repeat, median (min-max).",
            "",
            "```",
            speedup_table(speedup),
            "```",
        ]
    if rows:
        lines += [
            "",
            "## Crossover: measured mean TPOT (ms) vs concurrency",
            "",
            "Median over the trials of each cell; **bold** is the best static K (the envelope, "
            "K*); dynamic policies show their gap to it.",
            "",
            *_crossover_markdown(rows),
            *_beats_envelope_lines(rows, cells),
            *_noise_floor_lines(cells),
            *_paired_gap_lines(rows, cells),
            *_outside_prefill_steps_lines(cells),
            *_speed_adjusted_crossover_lines(cells),
        ]
    summary = tpot_error_summary(cells)
    lines += [
        "",
        "## Simulated vs measured",
        "",
        f"{len(cells)} cells; median |mean-TPOT error| "
        f"{summary['median_abs_tpot_error_pct']:.1f}%, max "
        f"{summary['max_abs_tpot_error_pct']:.1f}%; its timing part (the simulator replaying "
        "each run's own drafts and acceptances, vs measured) median "
        f"{summary['median_abs_timing_error_pct']:.1f}%, max "
        f"{summary['max_abs_timing_error_pct']:.1f}%; its acceptance-modelling part (fitted "
        f"vs replayed) median {summary['median_abs_acceptance_error_pct']:.1f}%, max "
        f"{summary['max_abs_acceptance_error_pct']:.1f}%. Trial spread = (max - min) / median "
        "of the measured trials. Every metric: validation.md, cells.csv.",
        "",
        *_pricing_lines(config),
        *level_lines(cells),
        *speed_adjusted_lines(cells, summary),
        *step_split_lines(cells),
        *_error_split_markdown(cells),
        "",
        "Files: cells.csv, trials.csv, steps.csv, validation.md, crossover.csv, speedup.json, "
        "profile.json, profile_retimed.json, config.json, tpot_vs_concurrency.png, "
        "crossover.png, k_over_time.png.",
        "",
    ]
    return "\n".join(lines)


def _pricing_lines(config: dict[str, Any]) -> list[str]:
    """How the simulated side was priced: the re-timed profile, and the acceptance model."""
    retime = config.get("retime") or {}
    if retime.get("status") == "on":
        probed = retime.get("probed_runs")
        timing = (
            f"by the profile re-timed around the real runs ({retime.get('rounds')} timing "
            f"rounds, {retime.get('share')} of the points each"
            + (f", and probes between the steps in {probed} windows" if probed else "")
            + f"; {retime.get('profile')})"
        )
    else:
        timing = f"by profile.json as measured (re-timing {retime.get('status', 'off')})"
    return [
        f"The simulated side is priced {timing}; its acceptance model is "
        f"`{config.get('acceptance_model')}` (docs/models.md 2).",
        "",
    ]


def plot_crossover(rows: Sequence[CrossoverRow], path: Path) -> bool:
    """Measured TPOT / envelope vs C, one line per static K and dynamic policy."""
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    xs = [row.max_concurrency for row in rows]
    for k in sorted({k for row in rows for k in row.static_tpot_ms}):
        ys = [row.static_tpot_ms.get(k, math.nan) / row.envelope_tpot_ms for row in rows]
        axes.plot(xs, ys, "o-", label=f"static:{k}")
    for policy in sorted({p for row in rows for p in row.dynamic_tpot_ms}):
        ys = [row.dynamic_tpot_ms.get(policy, math.nan) / row.envelope_tpot_ms for row in rows]
        axes.plot(xs, ys, "s--", label=policy)
    save_concurrency_plot(figure, axes, "measured TPOT / best static K", path)
    return True


def write_hardware_report(
    out: str | Path,
    *,
    config: dict[str, Any],
    speedup: SpeedupResult | None,
    cells: Sequence[Cell],
) -> list[Path]:
    """Every file of the report into `out` (created); returns the paths written."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rows = crossover(cells)
    summary = tpot_error_summary(cells)
    record = {
        **config,
        "summary": summary,
        "goals": [goal.__dict__ for goal in goals(speedup, rows, cells)],
    }
    texts = {
        "report.md": hardware_markdown(config, speedup, rows, cells),
        **cell_tables(cells),
        "validation.md": report_markdown(cells, record, "Validation: simulated vs measured"),
        "crossover.csv": crossover_csv(rows),
        "config.json": strict_json.dumps(record, indent=2, default=str) + "\n",
    }
    if speedup is not None:
        texts["speedup.json"] = (
            strict_json.dumps(
                {"arms": [a.row() for a in speedup.arms], "runs": speedup.runs},
                indent=1,
                default=str,
            )
            + "\n"
        )
    written = []
    for name, text in texts.items():
        atomic_write_text(folder / name, text)
        written.append(folder / name)
    plots = [
        (
            plot_tpot_vs_concurrency(cells, folder / "tpot_vs_concurrency.png"),
            "tpot_vs_concurrency",
        ),
        (plot_crossover(rows, folder / "crossover.png"), "crossover"),
    ]
    written += [folder / f"{name}.png" for done, name in plots if done]
    dynamic = [c for c in cells if static_k(c.policy) is None and c.measured_steps is not None]
    if dynamic:
        cell = max(dynamic, key=lambda c: c.max_concurrency or 0)
        if plot_k_over_time(cell, folder / "k_over_time.png"):
            written.append(folder / "k_over_time.png")
    return written
