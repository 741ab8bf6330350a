"""`dsd report DIR`: a markdown report with PNG plots from a sweep folder's cell files.

Reads DIR/grid.resolved.json and DIR/cells/*.parquet (missing cells are listed, not invented) and
writes DIR/report.md and its PNGs atomically: TPOT by concurrency per policy, each policy's gap to
the envelope of the best static K, the throughput/TPOT frontier, and K over time for one cell.
What each part shows is in docs/sweeps.md ("dsd report DIR").

It does not run anything, or compare against real-GPU measurements.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from dsd.common.errors import InputError
from dsd.common.png import figure_png_bytes
from dsd.policies.envelope import StaticSweep
from dsd.reports.paired import paired_gap
from dsd.reports.run_outputs import write_files
from dsd.reports.sweep import (
    CELLS_DIR,
    RESOLVED_GRID_FILE,
    cell_file,
    k_trace_file,
    markdown_table,
    series_keys,
    sweep_frame,
)

REPORT_FILE = "report.md"
K_TRACE_PLOT = "k_trace.png"
_STATIC = re.compile(r"^static:(\d+)$")


def static_k(policy: str) -> int | None:
    """K of a `static:K` SPEC, else None."""
    match = _STATIC.match(policy)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class SweepData:
    """A sweep folder as read back."""

    resolved: dict[str, Any]  # grid.resolved.json
    frame: pd.DataFrame  # one row per finished cell, in grid order (reports.sweep.sweep_frame)
    missing_ids: tuple[str, ...]  # cells of the grid without a result file


def load_sweep(out_dir: str | Path) -> SweepData:
    """Read a sweep folder (InputError naming the file when it is not one)."""
    folder = Path(out_dir)
    resolved_path = folder / RESOLVED_GRID_FILE
    try:
        resolved = json.loads(resolved_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{resolved_path}: no such file (is {out_dir} a dsd sweep folder?)"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{resolved_path}: cannot read: {exc}") from None
    if not isinstance(resolved, dict) or not isinstance(resolved.get("cells"), list):
        raise InputError(f"{resolved_path}: cells: missing or not a list")
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    for entry in resolved["cells"]:
        cell_id = str(entry.get("cell_id", "")) if isinstance(entry, dict) else ""
        path = cell_file(folder, cell_id)
        if not cell_id or not path.is_file():
            missing.append(cell_id)
            continue
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # a damaged cell file is reported, not trusted
            raise InputError(f"{path}: cannot read: {exc}") from None
        rows.append({str(key): value for key, value in frame.iloc[0].to_dict().items()})
    if not rows:
        raise InputError(f"{folder / CELLS_DIR}: no finished cells")
    return SweepData(resolved=resolved, frame=sweep_frame(rows), missing_ids=tuple(missing))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(values: tuple[Any, ...]) -> str:
    text = "_".join(str(v) for v in values) or "all"
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "all"


def _policy_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["policy"]))


def envelope_table(group: pd.DataFrame) -> pd.DataFrame | None:
    """Per C: best static K, its mean TPOT, and every other policy's distance (%) to it; with
    two or more sweep seeds also the 95% half-width (%) of its paired gap to that K
    (reports.paired: seed against seed, the cells of one seed share their requests and draws)."""
    closed = group[group["max_concurrency"].notna()]
    num_seeds = int(closed["sweep_seed"].nunique())
    by_seed = closed.groupby(["policy", "max_concurrency", "sweep_seed"])["mean_tpot_ms"].mean()
    by_cell = closed.groupby(["policy", "max_concurrency"], sort=False)["mean_tpot_ms"].mean()
    records = []
    for key, t in by_cell.items():
        policy, c = cast("tuple[str, float]", key)  # the groupby's (policy, max_concurrency)
        if (k := static_k(str(policy))) is not None and math.isfinite(t) and t > 0:
            records.append({"concurrency": int(c), "k": k, "mean_tpot_ms": float(t)})
    if not records:
        return None
    sweep = StaticSweep.from_records(records, "static cells")
    best_k, best_tpot = sweep.best_static_k()
    table = pd.DataFrame(
        {
            "max_concurrency": sweep.concurrencies,
            "best_static_k": best_k,
            "envelope_mean_tpot_ms": best_tpot,
        }
    )
    for policy in _policy_order(closed):
        if static_k(policy) is not None:
            continue
        tpot = [by_cell.get((policy, int(c)), math.nan) for c in sweep.concurrencies]
        distance = (np.array(tpot) - best_tpot) / best_tpot * 100.0  # [nC]
        table[f"{policy} mean_tpot_ms"] = tpot
        table[f"{policy} vs envelope %"] = distance
        if num_seeds >= 2:
            table[f"{policy} ± % (95%, paired seeds)"] = [
                _paired_half_width_pct(by_seed, policy, f"static:{k}", c)
                for k, c in zip(best_k, sweep.concurrencies, strict=True)
            ]
    return table


def _paired_half_width_pct(by_seed: pd.Series, policy: str, reference: str, c: float) -> float:
    """95% half-width (%) of `policy`'s gap to `reference` at C over the seeds both ran."""
    try:
        mine, theirs = by_seed.loc[(policy, c)], by_seed.loc[(reference, c)]
    except KeyError:
        return math.nan
    seeds = mine.index.intersection(theirs.index)
    if len(seeds) < 2:
        return math.nan
    return 100.0 * paired_gap(mine[seeds].tolist(), theirs[seeds].tolist()).half_width


def _tpot_plot(group: pd.DataFrame, envelope: pd.DataFrame | None, title: str) -> bytes:
    plt = _pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(11.0, 4.2))
    closed = group[group["max_concurrency"].notna()]
    for policy in _policy_order(closed):
        rows = closed[closed["policy"] == policy].groupby("max_concurrency", sort=True)
        for axis, column in zip(axes, ("mean_tpot_ms", "p99_tpot_ms"), strict=True):
            series = rows[column].mean()
            axis.plot(series.index, series.to_numpy(), marker="o", label=policy)
    if envelope is not None:
        axes[0].plot(
            envelope["max_concurrency"],
            envelope["envelope_mean_tpot_ms"],
            linestyle="--",
            color="black",
            label="best static K",
        )
    for axis, name in zip(axes, ("mean TPOT (ms)", "p99 TPOT (ms)"), strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("max concurrency C")
        axis.set_ylabel(name)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle(title)
    return figure_png_bytes(figure, dpi=110)


def pareto_frontier(throughput: np.ndarray, tpot_ms: np.ndarray) -> np.ndarray:
    """Indices of the cells no other cell beats on both (higher throughput, lower TPOT)."""
    order = np.lexsort((-throughput, tpot_ms))  # by TPOT, then throughput descending
    frontier: list[int] = []
    best = -math.inf
    for index in order:
        if throughput[index] > best:
            frontier.append(int(index))
            best = float(throughput[index])
    return np.array(frontier, dtype=np.int64)


def _frontier_plot(group: pd.DataFrame, title: str) -> bytes:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7.0, 4.5))
    for policy in _policy_order(group):
        rows = group[group["policy"] == policy]
        axis.scatter(rows["mean_tpot_ms"], rows["output_throughput"], label=policy, s=18)
    tpot = group["mean_tpot_ms"].to_numpy(dtype=float)
    throughput = group["output_throughput"].to_numpy(dtype=float)
    ok = np.isfinite(tpot) & np.isfinite(throughput)
    # Each point's concurrency C (open-loop cells have none); where points of one C lie within
    # 2% of the axes of each other (policies that did the same work), one label stands for all.
    spans = [
        max(float(np.ptp(values[ok])), 1e-9) if ok.any() else 1.0 for values in (tpot, throughput)
    ]
    placed: list[tuple[float, float, str]] = []
    for x, y, concurrency in zip(tpot, throughput, group["max_concurrency"], strict=True):
        label = "no cap" if pd.isna(concurrency) else f"C={int(concurrency)}"
        near = any(
            text == label and abs(x - px) < 0.02 * spans[0] and abs(y - py) < 0.02 * spans[1]
            for px, py, text in placed
        )
        if math.isfinite(x) and math.isfinite(y) and not near:
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6)
            placed.append((x, y, label))
    if ok.any():
        frontier = pareto_frontier(throughput[ok], tpot[ok])
        axis.plot(tpot[ok][frontier], throughput[ok][frontier], color="black", label="frontier")
    axis.set_xlabel("mean TPOT (ms)")
    axis.set_ylabel("output throughput (tok/s)")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
    return figure_png_bytes(figure, dpi=110)


def k_movement(trace: pd.DataFrame) -> float:
    """How much a cell's K moves: the standard deviation of the mean K of its decode steps
    (0 for a K that never changes, or a trace without decode steps)."""
    decode = trace.loc[trace["num_decode_reqs"] > 0, "mean_k"].to_numpy(dtype=float)
    return float(np.std(decode)) if len(decode) else 0.0


def default_k_trace_cell(frame: pd.DataFrame, folder: Path) -> str:
    """The cell whose K moves most (`k_movement` of each K trace in `folder`); where none
    moves, or ties, the first non-static cell at the median concurrency of the first group
    (else the first cell) comes first."""
    preferred = _preferred_k_trace_cell(frame)
    order = [preferred, *(str(c) for c in frame["cell_id"] if str(c) != preferred)]
    movement = {}
    for cell_id in order:
        try:
            movement[cell_id] = k_movement(pd.read_parquet(k_trace_file(folder, cell_id)))
        except (OSError, ValueError, KeyError):  # an unreadable trace is not chosen
            movement[cell_id] = -1.0
    return max(order, key=lambda cell_id: movement[cell_id])  # the first of equals


def _preferred_k_trace_cell(frame: pd.DataFrame) -> str:
    """The first non-static cell at the median concurrency of the first group (else the first)."""
    keys = [k for k in series_keys(frame) if k != "policy"]
    first = frame
    if keys:
        first_values = tuple(frame.iloc[0][k] for k in keys)
        mask = np.ones(len(frame), dtype=bool)
        for key, value in zip(keys, first_values, strict=True):
            mask &= (frame[key] == value).to_numpy()
        first = frame[mask]
    dynamic = first[[static_k(str(p)) is None for p in first["policy"]]]
    pool = dynamic if len(dynamic) else first
    concurrencies = sorted(c for c in pool["max_concurrency"].dropna().unique())
    if concurrencies:
        median = concurrencies[(len(concurrencies) - 1) // 2]
        pool = pool[pool["max_concurrency"] == median]
    return str(pool.iloc[0]["cell_id"])


def _k_trace_plot(trace: pd.DataFrame, title: str) -> bytes:
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9.0, 4.0))
    decode = trace[trace["num_decode_reqs"] > 0]
    (k_line,) = axis.plot(
        decode["start_s"], decode["mean_k"], linewidth=0.8, label="mean K (decode rows)"
    )
    axis.set_xlabel("simulated time (s)")
    axis.set_ylabel("K")
    # K is a whole number: integer ticks, and at least 0..k_max+1 so a flat K reads as flat
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    top = float(decode["k_max"].max()) if len(decode) else 1.0
    axis.set_ylim(-0.2, max(top, 1.0) + 0.2)
    other = axis.twinx()
    (b_line,) = other.plot(
        trace["start_s"],
        trace["batch_size"],
        color="grey",
        alpha=0.5,
        linewidth=0.8,
        label="batch size B",
    )
    other.set_ylabel("batch size B", color="grey")
    other.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.legend(handles=[k_line, b_line], loc="upper right", fontsize="small")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    return figure_png_bytes(figure, dpi=110)


def build_report(
    out_dir: str | Path, k_trace_cell: str | None = None, command_line: str = ""
) -> Path:
    """Write DIR/report.md and its PNGs; returns the report path."""
    folder = Path(out_dir)
    data = load_sweep(folder)
    frame = data.frame
    files: dict[str, bytes] = {}
    lines = ["# Sweep report", ""]
    lines += ["Produced by:", "", "```", str(data.resolved.get("command_line", "dsd sweep ..."))]
    if command_line:
        lines.append(command_line)
    lines += ["```", ""]
    total = len(data.resolved["cells"])
    lines.append(f"{len(frame)} of {total} cells finished.")
    if data.missing_ids:
        lines.append(f" Missing (not run yet): {', '.join(data.missing_ids)}.")
    seeds = frame["sweep_seed"].nunique(dropna=False)
    if seeds > 1:
        lines.append(f" Values are means over {seeds} sweep seeds.")
    lines.append("")
    keys = [k for k in series_keys(frame) if k != "policy"]
    groups = frame.groupby(keys, sort=False, dropna=False) if keys else [((), frame)]
    for key, group in groups:
        values = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)) or "all cells"
        slug = _slug(values)
        lines += [f"## {name}", ""]
        closed = group[group["max_concurrency"].notna()]
        if len(closed):
            for column, label in (("mean_tpot_ms", "Mean"), ("p99_tpot_ms", "P99")):
                pivot = closed.pivot_table(
                    index="max_concurrency", columns="policy", values=column, aggfunc="mean"
                )[_policy_order(closed)]
                lines += [f"{label} TPOT (ms) by concurrency:", ""]
                lines.append(markdown_table(pivot.reset_index()))
            envelope = envelope_table(group)
            files[f"tpot_{slug}.png"] = _tpot_plot(group, envelope, name)
            lines += [f"![TPOT vs concurrency](tpot_{slug}.png)", ""]
            if envelope is None:
                lines += ["No `static:K` cells in this group: no envelope.", ""]
            else:
                lines += [
                    "Envelope of the best static K per concurrency (lowest mean TPOT among the "
                    "`static:K` cells) and each other policy's distance to it (% of the "
                    "envelope's mean TPOT; > 0 is slower); with several sweep seeds, the 95% "
                    "half-width of its gap paired seed by seed with that K:",
                    "",
                    markdown_table(envelope),
                ]
        files[f"frontier_{slug}.png"] = _frontier_plot(group, name)
        lines += [
            "Output throughput vs mean TPOT, every cell (labelled with its concurrency C); the "
            "line is the Pareto frontier:",
            "",
            f"![throughput vs TPOT](frontier_{slug}.png)",
            "",
        ]
    chosen = k_trace_cell or default_k_trace_cell(frame, folder)
    if chosen not in set(frame["cell_id"]):
        raise InputError(f"--k-trace-cell {chosen}: no finished cell with that id")
    row = frame[frame["cell_id"] == chosen].iloc[0]
    try:
        trace = pd.read_parquet(k_trace_file(folder, chosen))
    except Exception as exc:
        raise InputError(f"{k_trace_file(folder, chosen)}: cannot read: {exc}") from None
    label_keys = [k for k in keys if k in row.index]
    where = ", ".join(f"{k}={row[k]}" for k in label_keys)
    title = f"{row['policy']} at C={row['max_concurrency']}" + (f" ({where})" if where else "")
    files[K_TRACE_PLOT] = _k_trace_plot(trace, f"K over time: {title}")
    lines += [
        "## K chosen over time",
        "",
        f"Cell `{chosen}`: {title}"
        + ("" if k_trace_cell else ", the cell whose K moves most")
        + " (pick another with `--k-trace-cell ID`; ids in sweep.csv).",
        "",
        f"![K over time]({K_TRACE_PLOT})",
        "",
    ]
    files[REPORT_FILE] = "\n".join(lines).encode("utf-8")
    write_files(folder, files)
    return folder / REPORT_FILE
