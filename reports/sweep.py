"""A grid of simulated runs (policies x concurrencies) in a local process pool, and its table.

- `SweepCell`: one picklable run spec (a `SimulationConfig` with its own seed, plus labels).
  `run_cell(cell)` is a top-level function, so any pool (processes today, a cluster later) can
  run cells; it returns a `CellResult` with the metrics.
- `sweep_cells(base, policies, concurrencies, ...)`: the grid in a fixed order. Closed loop per
  cell: `max_concurrency = C`, `num_prompts = per_concurrency * C` (or a fixed number).
- Seeds: a cell's seed is `cell_seed(seed, C)`, derived from the sweep seed and the cell's
  concurrency only, never from the worker or the order of completion. Policies (and ablation
  variants) at one concurrency deliberately share it: they see the same requests and the same
  per-request acceptance draws where the draws line up (common random numbers), so differences
  between them are less noisy.
- `run_sweep(cells, workers)`: a `ProcessPoolExecutor` (workers = 1 runs in this process),
  results in cell order whatever the completion order; an optional callback per finished cell
  (the CLI's progress bar).
- `sweep_table` / `write_sweep_outputs`: CSV + markdown (mean/median/p99 TPOT and TTFT, output
  throughput, AL per cell) and a PNG of mean TPOT vs concurrency per policy (log x).

What this module does not do: resume, write per-cell files, or talk to Ray (a later issue).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from reports.run_outputs import result_json_text, write_files
from sim.runner import SimulationConfig, run_simulation

TABLE_FILE_CSV = "sweep.csv"
TABLE_FILE_MD = "sweep.md"
PLOT_FILE = "tpot_vs_concurrency.png"
CONFIG_FILE = "sweep_config.json"

# Metric columns of the table, in order (vLLM bench keys).
METRIC_COLUMNS: tuple[str, ...] = (
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "output_throughput",
    "spec_decode_acceptance_length",
    "completed",
    "num_steps",
)


def cell_seed(seed: int, max_concurrency: int) -> int:
    """The seed of every cell at concurrency C: a 32-bit draw of SeedSequence([seed, C])."""
    state = np.random.SeedSequence([seed, max_concurrency]).generate_state(1, dtype=np.uint32)
    return int(state[0])


@dataclass(frozen=True)
class SweepCell:
    """One run of a sweep. Picklable."""

    index: int  # position in the grid (results come back in this order)
    policy: str  # policy SPEC (also in config)
    max_concurrency: int  # C (also in config)
    config: SimulationConfig  # the full run config, seed included
    variant: str = ""  # label of a config variant (ablation rows); "" for a plain sweep


@dataclass(frozen=True)
class CellResult:
    """What one cell measured."""

    cell: SweepCell  # the cell that ran
    metrics: dict[str, Any]  # the run's vLLM bench metrics (sim.metrics keys)
    num_preemptions: int  # preemptions by recompute in the run


def run_cell(cell: SweepCell) -> CellResult:
    """Run one cell (top-level so process pools can pickle it)."""
    run = run_simulation(cell.config)
    return CellResult(cell=cell, metrics=dict(run.metrics), num_preemptions=run.num_preemptions)


def sweep_cells(
    base: SimulationConfig,
    policies: Sequence[str],
    concurrencies: Sequence[int],
    *,
    num_prompts_per_concurrency: int | None = 20,
    num_prompts: int | None = None,
    seed: int = 0,
    variants: Sequence[tuple[str, dict[str, Any]]] = (("", {}),),
) -> list[SweepCell]:
    """The grid variants x concurrencies x policies, in that order (see module doc for seeds).

    Exactly one of `num_prompts_per_concurrency` (N = value * C) and `num_prompts` is used:
    `num_prompts` when given. `variants` are (label, SimulationConfig field overrides).
    """
    cells: list[SweepCell] = []
    for label, overrides in variants:
        for concurrency in concurrencies:
            if num_prompts is not None:
                count = num_prompts
            elif num_prompts_per_concurrency is not None:
                count = num_prompts_per_concurrency * concurrency
            else:
                count = None
            for policy in policies:
                config = dataclasses.replace(
                    base,
                    policy=policy,
                    max_concurrency=concurrency,
                    num_prompts=count,
                    seed=cell_seed(seed, concurrency),
                    **overrides,
                )
                cells.append(SweepCell(len(cells), policy, concurrency, config, label))
    return cells


def run_sweep(
    cells: Sequence[SweepCell],
    workers: int,
    on_done: Callable[[CellResult], None] | None = None,
) -> list[CellResult]:
    """Run every cell; results in cell order. workers = 1 runs here, else a process pool."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: dict[int, CellResult] = {}
    if workers == 1 or len(cells) <= 1:
        for cell in cells:
            done = run_cell(cell)
            results[cell.index] = done
            if on_done is not None:
                on_done(done)
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(cells))) as pool:
            pending: set[Future[CellResult]] = {pool.submit(run_cell, cell) for cell in cells}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    done = future.result()  # re-raises a cell's error here
                    results[done.cell.index] = done
                    if on_done is not None:
                        on_done(done)
    return [results[cell.index] for cell in cells]


def default_workers() -> int:
    """CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------------------------
# Table and plot
# --------------------------------------------------------------------------------------------


def sweep_table(results: Sequence[CellResult]) -> pd.DataFrame:
    """One row per cell: variant, policy, concurrency, num_prompts, seed, METRIC_COLUMNS."""
    rows = []
    for done in results:
        cell = done.cell
        row: dict[str, Any] = {
            "variant": cell.variant,
            "policy": cell.policy,
            "max_concurrency": cell.max_concurrency,
            "num_prompts": cell.config.num_prompts,
            "seed": cell.config.seed,
        }
        row.update({name: done.metrics.get(name, math.nan) for name in METRIC_COLUMNS})
        row["num_preemptions"] = done.num_preemptions
        rows.append(row)
    return pd.DataFrame(rows)


def _cell_text(value: Any) -> str:
    if isinstance(value, float | np.floating):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of `frame` (floats with 3 decimals)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    lines = [header, rule]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell_text(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def plot_tpot_png(frame: pd.DataFrame, title: str) -> bytes:
    """PNG bytes of mean TPOT vs concurrency, one line per (variant, policy), log-x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.0, 4.5))
    try:
        for (variant, policy), group in frame.groupby(["variant", "policy"], sort=False):
            ordered = group.sort_values("max_concurrency")
            label = f"{variant}: {policy}" if variant else str(policy)
            axes.plot(ordered["max_concurrency"], ordered["mean_tpot_ms"], marker="o", label=label)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("max concurrency C (closed loop)")
        axes.set_ylabel("mean TPOT (ms)")
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        buffer = io.BytesIO()
        # No "Software" entry: the bytes then depend only on the data and the matplotlib build.
        figure.savefig(buffer, format="png", dpi=120, metadata={"Software": None})
        return buffer.getvalue()
    finally:
        plt.close(figure)


def write_sweep_outputs(
    out_dir: str | os.PathLike[str],
    results: Sequence[CellResult],
    sweep_config: dict[str, Any],
    title: str = "simulated mean TPOT",
) -> pd.DataFrame:
    """sweep.csv, sweep.md, sweep_config.json, tpot_vs_concurrency.png in `out_dir`."""
    frame = sweep_table(results)
    # A plain sweep has no variants: leave the empty column out of the files.
    shown = frame.drop(columns="variant") if (frame["variant"] == "").all() else frame
    files = {
        TABLE_FILE_CSV: shown.to_csv(index=False).encode("utf-8"),
        TABLE_FILE_MD: markdown_table(shown).encode("utf-8"),
        CONFIG_FILE: (result_json_text(sweep_config) + "\n").encode("utf-8"),
    }
    files[PLOT_FILE] = plot_tpot_png(frame, title)
    write_files(out_dir, files)
    return frame
