"""Write a validation report into one folder: report.md, cells.csv, trials.csv, steps.csv, PNGs
and config.json.

Input is a list of `validation.cells.CellResult`-like objects (policy, max_concurrency,
measured / simulated metric dicts, optional step tables, `error_pct(key)`). Every file is written
atomically (a temp file in the same folder, then os.replace). This module runs nothing and
fits nothing; it only formats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dsd.common import strict_json
from dsd.common.atomic import atomic_write_bytes, atomic_write_text
from dsd.common.png import figure_png_bytes

# (metric key, label) rows of the per-cell table and the CSV.
REPORT_METRICS: tuple[tuple[str, str], ...] = (
    ("mean_tpot_ms", "mean TPOT"),
    ("median_tpot_ms", "median TPOT"),
    ("p99_tpot_ms", "p99 TPOT"),
    ("mean_ttft_ms", "mean TTFT"),
    ("median_ttft_ms", "median TTFT"),
    ("p99_ttft_ms", "p99 TTFT"),
    ("mean_itl_ms", "mean ITL"),
)


class Cell(Protocol):
    """What the report reads of a cell (validation.cells.CellResult)."""

    @property
    def policy(self) -> str: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def measured(self) -> dict[str, Any]: ...
    @property
    def simulated(self) -> dict[str, Any]: ...
    @property
    def measured_steps(self) -> Any: ...
    @property
    def simulated_steps(self) -> Any: ...
    @property
    def measured_trials(self) -> tuple[dict[str, Any], ...]: ...
    @property
    def replayed(self) -> dict[str, Any]: ...
    @property
    def machine_speed(self) -> float: ...
    @property
    def trial_speeds(self) -> tuple[float, ...]: ...

    @property
    def num_prompts(self) -> int: ...

    def interval(self, key: str) -> tuple[float, float]: ...
    def inside_interval(self, key: str) -> bool | None: ...
    def error_pct(self, key: str) -> float: ...
    def timing_error_pct(self, key: str) -> float: ...
    def acceptance_error_pct(self, key: str) -> float: ...
    def trial_spread_pct(self, key: str, speed_adjusted: bool = False) -> float: ...
    def speed_adjusted_measured(self, key: str) -> float: ...
    def speed_adjusted_error_pct(self, key: str) -> float: ...
    def speed_adjusted_timing_error_pct(self, key: str) -> float: ...


def as_number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def format_number(value: float, digits: int = 2) -> str:
    return strict_json.missing_text(value, f"{{:.{digits}f}}")


def _median_max_abs(errors: Sequence[float]) -> tuple[float, float]:
    """(median, max) of |error| over the finite errors (NaN, NaN when none is)."""
    values = np.abs(np.array(errors, dtype=np.float64))
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    return float(np.median(values)), float(np.max(values))


def tpot_error_summary(cells: Sequence[Cell]) -> dict[str, float]:
    """Median and max |error %| of mean TPOT over the cells (NaN cells left out), and of its
    two parts: timing (replay vs measured) and acceptance modelling (fitted vs replay), and of
    the total and timing errors against the trials divided by their machine speed (NaN when
    not re-timed)."""
    summary: dict[str, float] = {}
    parts = {
        "tpot": [cell.error_pct("mean_tpot_ms") for cell in cells],
        "timing": [cell.timing_error_pct("mean_tpot_ms") for cell in cells],
        "acceptance": [cell.acceptance_error_pct("mean_tpot_ms") for cell in cells],
        "speed_adjusted": [cell.speed_adjusted_error_pct("mean_tpot_ms") for cell in cells],
        "speed_adjusted_timing": [
            cell.speed_adjusted_timing_error_pct("mean_tpot_ms") for cell in cells
        ],
    }
    for name, errors in parts.items():
        median, largest = _median_max_abs(errors)
        summary[f"median_abs_{name}_error_pct"] = median
        summary[f"max_abs_{name}_error_pct"] = largest
    summary.update(interval_summary(cells))
    return summary


def interval_summary(cells: Sequence[Cell], key: str = "mean_tpot_ms") -> dict[str, float]:
    """Calibration of the simulator's prediction intervals of `key` over the cells that have
    one: `interval_cells`, `interval_coverage` (the share whose measured value lies inside)
    and `median_interval_half_width_pct` (half the width over the simulated value); NaN
    figures without intervals."""
    inside = [cell.inside_interval(key) for cell in cells]
    judged = [flag for flag in inside if flag is not None]
    widths = []
    for cell in cells:
        low, high = cell.interval(key)
        simulated = as_number(cell.simulated.get(key))
        if math.isfinite(low) and math.isfinite(high) and simulated > 0:
            widths.append((high - low) / 2.0 / simulated * 100.0)
    return {
        "interval_cells": float(len(judged)),
        "interval_coverage": sum(judged) / len(judged) if judged else float("nan"),
        "median_interval_half_width_pct": float(np.median(widths)) if widths else float("nan"),
    }


def interval_lines(cells: Sequence[Cell], summary: dict[str, float]) -> list[str]:
    """The report's sentence on the prediction intervals' calibration (none without them)."""
    if not summary["interval_cells"]:
        return []
    sigmas = [as_number(cell.simulated.get("interval_speed_sigma")) for cell in cells]
    sigma = next((value for value in sigmas if math.isfinite(value)), math.nan)
    timing = (
        f"widened by the machine's speed spread over the trials (log sigma {100 * sigma:.1f}%, "
        "their probes' speeds)"
        if math.isfinite(sigma)
        else "not timing noise (no trial speeds without re-timing)"
    )
    devices = {str(cell.simulated.get("interval_timing_error", "none")) for cell in cells}
    device = next(iter(devices)) if len(devices) == 1 else "none"
    model_error = (
        f"widened by the simulator's timing error on {device} measured by earlier reports "
        "(sim.interval.TIMING_ERROR_P90_PCT), "
        if device != "none"
        else ""
    )
    acceptance = interval_summary(cells, "acceptance_length")
    acceptance_line = (
        f" Measured acceptance length inside its 90% interval (the sampling alone) in "
        f"{round(acceptance['interval_coverage'] * acceptance['interval_cells'])} of "
        f"{int(acceptance['interval_cells'])} cells that drafted: where it falls outside, the "
        "profile's prompts draft unlike the cells' (docs/validation.md, \"Transfer\")."
        if acceptance["interval_cells"]
        else ""
    )
    return [
        f"Prediction intervals: measured mean TPOT inside the simulator's 90% interval in "
        f"{summary['interval_coverage']:.0%} of {int(summary['interval_cells'])} cells "
        f"(median half-width {format_number(summary['median_interval_half_width_pct'], 1)} %). "
        "The interval is how far other draws of the cell's acceptance move the prediction "
        f"(sim.interval), {model_error}{timing}.{acceptance_line}",
        "",
    ]


def cells_csv(cells: Sequence[Cell]) -> str:
    """One row per cell: measured, simulated and error % of every report metric (a missing
    value: an empty field)."""
    header = ["policy", "max_concurrency"]
    for key, _label in REPORT_METRICS:
        header += [f"measured_{key}", f"simulated_{key}", f"error_pct_{key}"]
    header += [
        "measured_acceptance_length",
        "simulated_acceptance_length",
        "num_trials",
        "trial_spread_pct_mean_tpot_ms",
        # The error split: replaying the run's own acceptance on the fitted latency (timing),
        # and the fitted acceptance vs that replay (acceptance modelling)
        "replayed_mean_tpot_ms",
        "timing_error_pct_mean_tpot_ms",
        "acceptance_error_pct_mean_tpot_ms",
        "replayed_acceptance_length",
        # The machine's speed during the real trials against all the timing (TimingRounds;
        # median over the trials), the trials each divided by their speed, and the errors
        # against them
        "machine_speed",
        "speed_adjusted_error_pct_mean_tpot_ms",
        "speed_adjusted_timing_error_pct_mean_tpot_ms",
        "speed_adjusted_measured_mean_tpot_ms",
        "speed_adjusted_trial_spread_pct_mean_tpot_ms",
        # The first trial's steps: median wall ms of the loop's step and of its part outside
        # the executor (host planning, policy, bookkeeping; steps.csv has every step)
        "measured_step_ms",
        "measured_outside_executor_ms",
        # The simulator's 90% prediction interval of mean TPOT (sim.interval), whether the
        # measured value lies in it, and the cell's requests
        "simulated_mean_tpot_ms_lo",
        "simulated_mean_tpot_ms_hi",
        "measured_inside_interval",
        "num_prompts",
        # The same for the acceptance length (the workload's sampling alone): outside it, the
        # profile's prompts draft unlike the cell's (docs/validation.md, "Transfer")
        "simulated_acceptance_length_lo",
        "simulated_acceptance_length_hi",
        "measured_acceptance_length_inside_interval",
    ]
    rows: list[list[Any]] = [header]
    for cell in cells:
        row: list[Any] = [cell.policy, "" if cell.max_concurrency is None else cell.max_concurrency]
        for key, _label in REPORT_METRICS:
            row += [
                as_number(cell.measured.get(key)),
                as_number(cell.simulated.get(key)),
                cell.error_pct(key),
            ]
        row += [
            as_number(cell.measured.get("acceptance_length")),
            as_number(cell.simulated.get("acceptance_length")),
            len(cell.measured_trials),
            cell.trial_spread_pct("mean_tpot_ms"),
            as_number(cell.replayed.get("mean_tpot_ms")),
            cell.timing_error_pct("mean_tpot_ms"),
            cell.acceptance_error_pct("mean_tpot_ms"),
            as_number(cell.replayed.get("acceptance_length")),
            cell.machine_speed,
            cell.speed_adjusted_error_pct("mean_tpot_ms"),
            cell.speed_adjusted_timing_error_pct("mean_tpot_ms"),
            cell.speed_adjusted_measured("mean_tpot_ms"),
            cell.trial_spread_pct("mean_tpot_ms", speed_adjusted=True),
            *step_split_ms(cell),
            *cell.interval("mean_tpot_ms"),
            {None: "", True: 1, False: 0}[cell.inside_interval("mean_tpot_ms")],
            cell.num_prompts or "",
            *cell.interval("acceptance_length"),
            {None: "", True: 1, False: 0}[cell.inside_interval("acceptance_length")],
        ]
        rows.append(row)
    return strict_json.csv_text(rows)


def _executor_steps(cell: Cell) -> Any:
    """The first real trial's step table when it has the executor's own times, else None."""
    steps = cell.measured_steps
    if steps is None or "execute_s" not in getattr(steps, "columns", ()) or len(steps) == 0:
        return None
    return steps


def step_split_ms(cell: Cell) -> tuple[float, float]:
    """Over the first real trial's steps: the median wall ms of a step and the median ms of it
    spent outside the executor (NaN, NaN without executor times: a vLLM file)."""
    steps = _executor_steps(cell)
    if steps is None:
        return float("nan"), float("nan")
    wall_ms = steps["duration_s"].to_numpy() * 1000.0
    outside_ms = wall_ms - steps["execute_s"].to_numpy() * 1000.0
    return float(np.median(wall_ms)), float(np.median(outside_ms))


def steps_csv(cells: Sequence[Cell]) -> str | None:
    """One row per step of each cell's first real trial: what ran, the loop's wall ms and the
    executor's own ms (None when no cell has executor times; a missing value: an empty field)."""
    columns = ["step_index", "batch_size", "num_decode_reqs", "num_tokens", "num_spec_tokens"]
    columns += ["num_accepted_tokens", "mean_k"]
    rows: list[list[Any]] = [["policy", "max_concurrency", *columns, "wall_ms", "execute_ms"]]
    written = False
    for cell in cells:
        steps = _executor_steps(cell)
        if steps is None:
            continue
        concurrency = "" if cell.max_concurrency is None else cell.max_concurrency
        values = [steps[column].tolist() for column in columns]
        values.append((steps["duration_s"] * 1000.0).round(4).tolist())
        values.append((steps["execute_s"] * 1000.0).round(4).tolist())
        for row in zip(*values, strict=True):
            rows.append([cell.policy, concurrency, *row])
        written = True
    return strict_json.csv_text(rows) if written else None


def cell_tables(cells: Sequence[Cell]) -> dict[str, str]:
    """The per-cell tables of a validation folder by file name: cells.csv, trials.csv and, for
    real runs, steps.csv."""
    tables = {"cells.csv": cells_csv(cells), "trials.csv": trials_csv(cells)}
    steps = steps_csv(cells)
    if steps is not None:
        tables["steps.csv"] = steps
    return tables


def trials_csv(cells: Sequence[Cell]) -> str:
    """One row per real trial, in each cell's trial order: its machine speed (empty without
    timing) and every report metric as that trial measured it (a cell's `measured` is their
    median)."""
    keys = [key for key, _label in REPORT_METRICS]
    rows: list[list[Any]] = [["policy", "max_concurrency", "trial", "machine_speed", *keys]]
    for cell in cells:
        concurrency = "" if cell.max_concurrency is None else cell.max_concurrency
        speeds = cell.trial_speeds if len(cell.trial_speeds) == len(cell.measured_trials) else ()
        for index, trial in enumerate(cell.measured_trials):
            speed = speeds[index] if speeds else ""
            rows.append(
                [cell.policy, concurrency, index + 1, speed]
                + [as_number(trial.get(key)) for key in keys]
            )
    return strict_json.csv_text(rows)


def report_markdown(cells: Sequence[Cell], config: dict[str, Any], title: str) -> str:
    """The report's markdown: setup, summary, one table row per (cell, metric)."""
    summary = tpot_error_summary(cells)
    lines = [f"# {title}", ""]
    command = config.get("command")
    if command:
        lines += ["Command:", "", "```", str(command), "```", ""]
    for key in ("device", "dtype", "target", "draft", "profile", "dataset", "seed", "acceptance"):
        if key in config:
            lines.append(f"- {key}: {config[key]}")
    lines += [
        "",
        f"Mean-TPOT error over {len(cells)} cells: median |error| "
        f"{format_number(summary['median_abs_tpot_error_pct'], 1)} %, max |error| "
        f"{format_number(summary['max_abs_tpot_error_pct'], 1)} %.",
        "",
        "Error = (simulated - measured) / measured. The simulator is fitted from the profile only.",
        "",
    ]
    if math.isfinite(summary["median_abs_timing_error_pct"]):
        lines += [
            "Split of the mean-TPOT error: timing (the simulator replaying the real run's own "
            "drafts and acceptances, vs measured) median |error| "
            f"{format_number(summary['median_abs_timing_error_pct'], 1)} %, max "
            f"{format_number(summary['max_abs_timing_error_pct'], 1)} %; acceptance modelling "
            "(fitted acceptance vs that replay) median |error| "
            f"{format_number(summary['median_abs_acceptance_error_pct'], 1)} %, max "
            f"{format_number(summary['max_abs_acceptance_error_pct'], 1)} %.",
            "",
        ]
    lines += interval_lines(cells, summary)
    lines += prompts_lines(config)
    lines += level_lines(cells)
    lines += speed_adjusted_lines(cells, summary)
    lines += step_split_lines(cells)
    lines += [
        "| policy | C | prompts | metric | measured ms | simulated ms | 90% interval | error % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        concurrency = "-" if cell.max_concurrency is None else str(cell.max_concurrency)
        prompts = str(cell.num_prompts) if cell.num_prompts else "-"
        for key, label in REPORT_METRICS:
            measured = as_number(cell.measured.get(key))
            simulated = as_number(cell.simulated.get(key))
            if not (math.isfinite(measured) or math.isfinite(simulated)):
                continue
            low, high = cell.interval(key)
            interval = (
                f"{format_number(low)}-{format_number(high)}"
                if math.isfinite(low) and math.isfinite(high)
                else "-"
            )
            lines.append(
                f"| {cell.policy} | {concurrency} | {prompts} | {label} | "
                f"{format_number(measured)} | {format_number(simulated)} | {interval} | "
                f"{format_number(cell.error_pct(key), 1)} |"
            )
    lines.append("")
    return "\n".join(lines)


def prompts_lines(config: dict[str, Any]) -> list[str]:
    """Which prompts the cells ran: held out from the profile's acceptance run, or its own."""
    held_out = config.get("held_out_prompts")
    if held_out is None:
        return []
    if str(config.get("acceptance", "")).startswith("drawn"):
        text = (
            "Prompts: their lengths only (acceptance drawn, the same draws on both sides), so "
            "this checks timing only."
        )
    elif held_out:
        text = (
            "Prompts: held out (none of the cells' prompts is among those the profile recorded "
            "acceptance for), so the acceptance-modelling part is a prediction."
        )
    else:
        text = (
            "Prompts: in sample (the profile's own acceptance prompts; with the empirical "
            "model each replays its recorded drafts), so this checks timing only."
        )
    profile_dataset = config.get("profile_dataset")
    if profile_dataset is not None and profile_dataset != config.get("dataset"):
        text += (
            f" Transfer: the profile's acceptance ran on {profile_dataset}, the cells on "
            f"{config.get('dataset')}."
        )
    return [text, ""]


def level_lines(cells: Sequence[Cell], trials: Sequence[dict[str, Any]] | None = None) -> list[str]:
    """The simulator's level: per measured trial, its cell's simulated mean TPOT over the
    trial's own, over every trial. `trials`: rows of trials.csv (policy, max_concurrency and
    the metrics) instead of the cells' `measured_trials`. Nothing with fewer than 2 trials."""
    key = "mean_tpot_ms"
    if trials is None:
        trials = [
            {"policy": cell.policy, "max_concurrency": cell.max_concurrency, **trial}
            for cell in cells
            for trial in cell.measured_trials
        ]
    simulated = {
        (cell.policy, str(cell.max_concurrency)): as_number(cell.simulated.get(key))
        for cell in cells
    }
    sims = np.array(
        [
            simulated.get((str(trial["policy"]), str(trial["max_concurrency"])), math.nan)
            for trial in trials
        ]
    )  # [trials]
    reals = np.array([as_number(trial.get(key)) for trial in trials])  # [trials]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = sims / reals
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    if ratios.size < 2:
        return []
    p10, median, p90 = np.percentile(ratios, [10, 50, 90])
    return [
        f"Level: over all {ratios.size} trials, simulated / measured mean TPOT of each trial "
        f"(its cell's simulation over the trial's own) has median {median:.3f}, p10-p90 "
        f"{p10:.2f}-{p90:.2f}. The machine's drift moves single trials, and so the cells; a "
        "simulator that priced every step too high or too low would move the median.",
        "",
    ]


def step_split_lines(cells: Sequence[Cell]) -> list[str]:
    """Where a real step's wall time went: inside the executor (the model's work) or outside
    it in the engine loop (nothing without executor times)."""
    split = [(cell, *step_split_ms(cell)) for cell in cells]
    split = [item for item in split if math.isfinite(item[1]) and item[1] > 0]
    if not split:
        return []
    step_ms = float(np.median([wall for _cell, wall, _outside in split]))
    outside_ms = float(np.median([outside for _cell, _wall, outside in split]))
    cell, wall, outside = max(split, key=lambda item: item[2] / item[1])
    concurrency = "-" if cell.max_concurrency is None else str(cell.max_concurrency)
    by_policy: dict[str, list[float]] = {}
    for each, _wall, each_outside in split:
        by_policy.setdefault(each.policy, []).append(each_outside)
    policies = ", ".join(
        f"{policy} {format_number(float(np.median(values)))}"
        for policy, values in by_policy.items()
    )
    return [
        "Per real step (each cell's first trial, every step in steps.csv; medians): the engine "
        f"loop's step took {format_number(step_ms)} ms, of which {format_number(outside_ms)} ms "
        "outside the executor (host planning, policy, bookkeeping); the largest share outside: "
        f"{format_number(outside / wall * 100.0, 1)} % of {format_number(wall)} ms "
        f"({cell.policy} at C={concurrency}). Outside the executor by policy (ms, median over "
        f"its cells; a learning policy's own decisions are the difference to a static one's, "
        f"which the profile's host_overhead.policies charges): {policies}.",
        "",
    ]


def speed_adjusted_lines(cells: Sequence[Cell], summary: dict[str, float]) -> list[str]:
    """What the errors are with every trial's measured times divided by the machine's speed
    during it (nothing when the cells were not re-timed)."""
    speeds = np.array([s for cell in cells for s in cell.trial_speeds], dtype=np.float64)
    speeds = speeds[np.isfinite(speeds)]
    if speeds.size == 0:
        return []
    # spreads are >= 0, so the median |spread| over the finite ones is their median
    raw_spread, adjusted_spread = (
        _median_max_abs([cell.trial_spread_pct("mean_tpot_ms", adjusted) for cell in cells])[0]
        for adjusted in (False, True)
    )
    spread = (
        f"the trials of a cell spread by a median of {format_number(adjusted_spread, 1)} % "
        f"instead of {format_number(raw_spread, 1)} %, and "
        if math.isfinite(adjusted_spread)
        else ""
    )
    return [
        "Machine speed (per trial: the profile's points timed between its steps, or just "
        "before and after it for an open-loop trial, against the same points over all the "
        "timing; > 1 is slower) ranged "
        f"{speeds.min():.2f}-{speeds.max():.2f} over the trials (median "
        f"{np.median(speeds):.2f}). Each trial's mean TPOT divided by it, {spread}the "
        "mean-TPOT error is median |error| "
        f"{format_number(summary['median_abs_speed_adjusted_error_pct'], 1)} %, max "
        f"{format_number(summary['max_abs_speed_adjusted_error_pct'], 1)} % (timing part median "
        f"{format_number(summary['median_abs_speed_adjusted_timing_error_pct'], 1)} %, max "
        f"{format_number(summary['max_abs_speed_adjusted_timing_error_pct'], 1)} %). The "
        "unadjusted errors above are the result; the adjusted ones show how much of it is the "
        "machine drifting under the trials.",
        "",
    ]


def plot_tpot_vs_concurrency(cells: Sequence[Cell], path: Path) -> bool:
    """Mean TPOT vs C per policy, measured (solid) and simulated (dashed); False if no C."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_policy: dict[str, list[Cell]] = {}
    for cell in cells:
        if cell.max_concurrency is not None:
            by_policy.setdefault(cell.policy, []).append(cell)
    if not by_policy:
        return False
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for index, (policy, group) in enumerate(sorted(by_policy.items())):
        group = sorted(group, key=lambda c: int(c.max_concurrency or 0))
        xs = [int(c.max_concurrency or 0) for c in group]
        color = f"C{index % 10}"
        axes.plot(
            xs,
            [as_number(c.measured.get("mean_tpot_ms")) for c in group],
            "o-",
            color=color,
            label=f"{policy} measured",
        )
        axes.plot(
            xs,
            [as_number(c.simulated.get("mean_tpot_ms")) for c in group],
            "s--",
            color=color,
            label=f"{policy} simulated",
        )
    save_concurrency_plot(figure, axes, "mean TPOT (ms)", path)
    return True


def save_concurrency_plot(figure: Any, axes: Any, ylabel: str, path: Path) -> None:
    """Finish a plot over C (log2 axis, legend, grid) and write it as a PNG, atomically."""
    import matplotlib.pyplot as plt

    axes.set_xscale("log", base=2)
    axes.set_xlabel("max concurrency C")
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    atomic_write_bytes(path, figure_png_bytes(figure, dpi=110))
    plt.close(figure)


def plot_k_over_time(cell: Cell, path: Path) -> bool:
    """Mean K per step over time for one cell, measured and simulated; False without steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = [("measured", cell.measured_steps), ("simulated", cell.simulated_steps)]
    tables = [(name, t) for name, t in tables if t is not None and len(t)]
    if not tables:
        return False
    figure, axes = plt.subplots(figsize=(6.4, 3.6))
    for name, table in tables:
        decode = table[table["num_decode_reqs"] > 0] if "num_decode_reqs" in table else table
        axes.step(decode["start_s"], decode["mean_k"], where="post", label=name)
    axes.set_xlabel("time (s)")
    axes.set_ylabel("mean K of the step")
    axes.set_title(f"{cell.policy}, C={cell.max_concurrency}")
    axes.legend()
    axes.grid(alpha=0.3)
    atomic_write_bytes(path, figure_png_bytes(figure, dpi=110))
    plt.close(figure)
    return True


def write_validation_report(
    out_dir: str | Path,
    cells: Sequence[Cell],
    config: dict[str, Any],
    title: str = "Validation: simulated vs measured",
    k_plot_cell: int | None = None,
) -> list[Path]:
    """Write report.md, the per-cell tables (`cell_tables`), config.json and the PNGs into
    out_dir; returns the paths.

    `k_plot_cell`: index of the cell whose K-over-time is plotted (default: the cell with the
    largest C of the first policy whose K is not fixed, else the first cell).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    summary = tpot_error_summary(cells)
    config_out = dict(config)
    config_out["summary"] = summary
    atomic_write_text(out / "report.md", report_markdown(cells, config_out, title))
    written.append(out / "report.md")
    for name, table in cell_tables(cells).items():
        atomic_write_text(out / name, table)
        written.append(out / name)
    atomic_write_text(
        out / "config.json", strict_json.dumps(config_out, indent=2, default=str) + "\n"
    )
    written.append(out / "config.json")
    if plot_tpot_vs_concurrency(cells, out / "tpot_vs_concurrency.png"):
        written.append(out / "tpot_vs_concurrency.png")
    if cells:
        index = k_plot_cell if k_plot_cell is not None else _default_k_cell(cells)
        if plot_k_over_time(cells[index], out / "k_over_time.png"):
            written.append(out / "k_over_time.png")
    return written


def _default_k_cell(cells: Sequence[Cell]) -> int:
    dynamic = [i for i, c in enumerate(cells) if not c.policy.startswith("static")]
    candidates = dynamic or list(range(len(cells)))
    return max(candidates, key=lambda i: (cells[i].max_concurrency or 0, -i))
