"""A grid of simulated runs in a process pool or on Ray, saved per cell, and its table.

`SweepCell` is one picklable run spec and `run_cell` runs it in any pool; `sweep_cells` builds
the flag-given grid, `identify` gives each cell its content id, `run_sweep_to_dir` writes each
finished cell at once (and resumes), `run_sweep` keeps results in memory, `sweep_to_folder` is
the whole `dsd sweep`, and `write_sweep_outputs` the CSV, markdown and plot. Seeds, cell ids,
the folder's files, resume and stopping are in docs/sweeps.md.

It does not parse grid files (reports.grid), retry a cell whose worker died (the sweep stops;
re-running it resumes), or draw the report (reports.report).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsd.common import invocation, strict_json
from dsd.common.atomic import atomic_write_bytes, atomic_write_text
from dsd.common.errors import InputError, StoppedBySignal, WorkerDied
from dsd.common.png import figure_png_bytes
from dsd.common.progress import ProgressFactory, no_progress
from dsd.common.user_paths import check_output_folder
from dsd.policies.spec import policy_source
from dsd.reports.run_outputs import result_json_text, write_files
from dsd.reports.sweep_guard import check_same_grid, end_workers, quiet_worker, stop_on_sigterm
from dsd.sim.build import run_simulation
from dsd.sim.config import RunConfig
from dsd.sim.interval import interval_metrics
from dsd.sim.metrics import TPOT_TTFT_KEYS
from dsd.sim.resolve import plain_config_value, resolve, resolved_config_dict

TABLE_FILE_CSV = "sweep.csv"
TABLE_FILE_MD = "sweep.md"
PLOT_FILE = "tpot_vs_concurrency.png"
CONFIG_FILE = "sweep_config.json"
RESOLVED_GRID_FILE = "grid.resolved.json"
CELLS_DIR = "cells"
CELL_SUFFIX = ".parquet"
K_TRACE_SUFFIX = ".ktrace.parquet"
# Bumped when the cell file layout or the spec changes, so old files are never reused.
CELL_FORMAT = 1
RAY_MISSING = "install the ray extra: pip install 'dsd[ray]'"

# Metric columns of the table, in order (vLLM bench keys, and our acceptance_length: NaN at K = 0).
METRIC_COLUMNS: tuple[str, ...] = (
    *TPOT_TTFT_KEYS,
    "output_throughput",
    "acceptance_length",
    "completed",
    "num_steps",
)
# A cell's prediction interval (sim.interval) in the shown table, where cells have one.
INTERVAL_COLUMNS: tuple[str, ...] = (
    "mean_tpot_ms_lo",
    "mean_tpot_ms_hi",
    "output_throughput_lo",
    "output_throughput_hi",
)
# Step-table columns kept in the K trace.
K_TRACE_COLUMNS: tuple[str, ...] = (
    "step_index",
    "start_s",
    "duration_s",
    "batch_size",
    "num_decode_reqs",
    "k_min",
    "k_max",
    "mean_k",
)
# Parameter columns of a cell row (labels come between variant and policy).
PARAM_COLUMNS: tuple[str, ...] = (
    "policy",
    "max_concurrency",
    "request_rate",
    "scheduling",
    "dataset",
    "num_prompts",
    "sweep_seed",
    "seed",
)


def cell_seed(seed: int, max_concurrency: int) -> int:
    """The seed of every cell at concurrency C: a 32-bit draw of SeedSequence([seed, C])."""
    state = np.random.SeedSequence([seed, max_concurrency]).generate_state(1, dtype=np.uint32)
    return int(state[0])


def load_seed(seed: int, max_concurrency: int | None, request_rate: float) -> int:
    """The seed of every cell at one load point (C, rate) of sweep seed `seed`.

    Closed loop (rate inf): `cell_seed(seed, C)`. With a finite rate: a 32-bit draw of
    SeedSequence([seed, C or 0, 1, round(rate * 1000)]) (rates equal to 1e-3 req/s share it).
    """
    if math.isinf(request_rate):
        return cell_seed(seed, max_concurrency or 0)
    key = [seed, max_concurrency or 0, 1, round(request_rate * 1000)]
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint32)[0])


@dataclass(frozen=True)
class SweepCell:
    """One run of a sweep. Picklable."""

    index: int  # position in the grid (results come back in this order)
    policy: str  # policy SPEC (also in config)
    max_concurrency: int | None  # C (also in config); None: no cap (open loop)
    config: RunConfig  # the full run config, seed included
    variant: str = ""  # label of a config variant (ablation rows); "" for a plain sweep
    labels: tuple[tuple[str, Any], ...] = ()  # (column, value) shown in tables (workload, ...)
    sweep_seed: int | None = None  # the sweep seed the cell seed came from
    cell_id: str = ""  # content hash of spec_json ("" until `identify`)
    spec_json: str = ""  # canonical spec JSON ("" until `identify`)


@dataclass(frozen=True)
class CellResult:
    """What one cell measured."""

    cell: SweepCell  # the cell that ran
    metrics: dict[str, Any]  # the run's vLLM bench metrics (sim.metrics keys)
    num_preemptions: int  # preemptions by recompute in the run
    k_trace: pd.DataFrame | None = None  # K_TRACE_COLUMNS per step (None when not kept)


def run_cell(cell: SweepCell) -> CellResult:
    """Run one cell (top-level so process pools and Ray can pickle it), with the prediction
    interval its config's `interval_runs` ask for."""
    run = run_simulation(cell.config)
    trace = run.steps.loc[:, list(K_TRACE_COLUMNS)].reset_index(drop=True)
    metrics = dict(run.metrics)
    if cell.config.interval_runs:
        metrics.update(interval_metrics(resolve(cell.config), run.metrics))
    return CellResult(
        cell=cell, metrics=metrics, num_preemptions=run.num_preemptions, k_trace=trace
    )


def sweep_cells(
    base: RunConfig,
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
    `num_prompts` when given. `variants` are (label, RunConfig field overrides).
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
                cells.append(
                    SweepCell(len(cells), policy, concurrency, config, label, sweep_seed=seed)
                )
    return cells


# --------------------------------------------------------------------------------------------
# Cell ids and specs
# --------------------------------------------------------------------------------------------


def _file_digest(path: str, digests: dict[str, str]) -> str:
    if path not in digests:
        try:
            digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    return digests[path]


def cell_spec(cell: SweepCell, digests: dict[str, str] | None = None) -> dict[str, Any]:
    """What a cell computes, independent of folder and machine (files by name + SHA-256)."""
    digests = {} if digests is None else digests
    config = plain_config_value(cell.config)
    if cell.config.profile is not None:
        config["profile"] = {
            "name": Path(cell.config.profile).name,
            "sha256": _file_digest(cell.config.profile, digests),
        }
    source = policy_source(cell.config.policy)
    if source is not None:  # a user's policy: by file name, class and the file's SHA-256
        config["policy"] = {
            "spec": re.sub(r"[^:]*[/\\]", "", cell.config.policy.strip()),
            **{key: value for key, value in source.items() if key not in ("spec", "path")},
        }
    dataset = cell.config.dataset
    if Path(dataset).suffix.lower() in (".csv", ".parquet", ".jsonl") and Path(dataset).is_file():
        config["dataset"] = {"name": Path(dataset).name, "sha256": _file_digest(dataset, digests)}
    return {
        "format": CELL_FORMAT,
        "config": config,
        "variant": cell.variant,
        "labels": [[key, plain_config_value(value)] for key, value in cell.labels],
        "sweep_seed": cell.sweep_seed,
    }


def identify(cells: Sequence[SweepCell]) -> list[SweepCell]:
    """The cells with `spec_json` and `cell_id` filled in; two equal cells are an InputError."""
    digests: dict[str, str] = {}
    named: list[SweepCell] = []
    seen: dict[str, int] = {}
    for cell in cells:
        spec_json = strict_json.dumps(
            cell_spec(cell, digests), sort_keys=True, separators=(",", ":")
        )
        cell_id = hashlib.sha256(spec_json.encode("utf-8")).hexdigest()[:16]
        if cell_id in seen:
            raise InputError(
                f"cells {seen[cell_id]} and {cell.index} are the same run (policy "
                f"{cell.policy}, C {cell.max_concurrency}); remove the duplicate from the grid"
            )
        seen[cell_id] = cell.index
        named.append(dataclasses.replace(cell, cell_id=cell_id, spec_json=spec_json))
    return named


# --------------------------------------------------------------------------------------------
# Per-cell files
# --------------------------------------------------------------------------------------------


def cell_file(out_dir: str | os.PathLike[str], cell_id: str) -> Path:
    """DIR/cells/<id>.parquet: the cell's one-row result."""
    return Path(out_dir) / CELLS_DIR / f"{cell_id}{CELL_SUFFIX}"


def k_trace_file(out_dir: str | os.PathLike[str], cell_id: str) -> Path:
    """DIR/cells/<id>.ktrace.parquet: the cell's per-step K trace."""
    return Path(out_dir) / CELLS_DIR / f"{cell_id}{K_TRACE_SUFFIX}"


def cell_row(done: CellResult) -> dict[str, Any]:
    """One table row: variant, labels, PARAM_COLUMNS, every scalar metric, ids and JSON."""
    cell = done.cell
    config = cell.config
    row: dict[str, Any] = {"variant": cell.variant}
    row.update({key: value for key, value in cell.labels})
    row.update(
        {
            "policy": cell.policy,
            "max_concurrency": cell.max_concurrency,
            "request_rate": config.request_rate,
            "scheduling": config.scheduling,
            "dataset": config.dataset,
            "num_prompts": config.num_prompts,
            "sweep_seed": cell.sweep_seed,
            "seed": config.seed,
        }
    )
    for name in METRIC_COLUMNS:
        row[name] = done.metrics.get(name, math.nan)
    for name, value in sorted(done.metrics.items()):
        if name not in row and isinstance(value, int | float | str | np.generic):
            row[name] = value.item() if isinstance(value, np.generic) else value
    row["num_preemptions"] = done.num_preemptions
    row["cell_id"] = cell.cell_id
    row["metrics_json"] = result_json_text(done.metrics)
    row["cell_spec_json"] = cell.spec_json
    return row


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def write_cell(out_dir: str | os.PathLike[str], done: CellResult) -> dict[str, Any]:
    """Write the K trace, then the row (its presence marks the cell done); returns the row."""
    cell_id = done.cell.cell_id
    if not cell_id:
        raise ValueError("write_cell needs an identified cell (reports.sweep.identify)")
    row = cell_row(done)
    folder = Path(out_dir) / CELLS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    trace = done.k_trace if done.k_trace is not None else pd.DataFrame(columns=K_TRACE_COLUMNS)
    atomic_write_bytes(k_trace_file(out_dir, cell_id), _parquet_bytes(trace))
    atomic_write_bytes(cell_file(out_dir, cell_id), _parquet_bytes(pd.DataFrame([row])))
    return row


def read_cell_row(out_dir: str | os.PathLike[str], cell: SweepCell) -> dict[str, Any] | None:
    """The saved row of `cell` if its file exists, reads, and holds the same spec; else None."""
    path = cell_file(out_dir, cell.cell_id)
    if not path.is_file() or not k_trace_file(out_dir, cell.cell_id).is_file():
        return None
    try:
        frame = pd.read_parquet(path)
    except Exception:  # a damaged file is recomputed and replaced, never trusted
        return None
    if len(frame) != 1 or frame["cell_spec_json"].iloc[0] != cell.spec_json:
        return None
    return {
        str(key): value.item() if isinstance(value, np.generic) else value
        for key, value in frame.iloc[0].to_dict().items()
    }


@dataclass(frozen=True)
class SweepRun:
    """What `run_sweep_to_dir` did."""

    rows: list[dict[str, Any]]  # one per cell, in cell order
    num_computed: int  # cells run now
    num_reused: int  # cells whose saved file was reused


def run_sweep_to_dir(
    cells: Sequence[SweepCell],
    out_dir: str | os.PathLike[str],
    workers: int,
    *,
    ray_address: str | None = None,
    use_ray: bool = False,
    on_done: Callable[[SweepCell], None] | None = None,
) -> SweepRun:
    """Run the cells not yet saved in DIR/cells and save each as it finishes (see module doc).

    `on_done` is called for every cell, reused ones first. Raises `WorkerDied` when a pool
    process dies; everything finished before stays saved.
    """
    rows: dict[int, dict[str, Any]] = {}
    todo: list[SweepCell] = []
    for cell in cells:
        saved = read_cell_row(out_dir, cell)
        if saved is None:
            todo.append(cell)
        else:
            rows[cell.index] = saved
            if on_done is not None:
                on_done(cell)
    num_reused = len(rows)

    def store(done: CellResult) -> None:
        rows[done.cell.index] = write_cell(out_dir, done)
        if on_done is not None:
            on_done(done.cell)

    if use_ray:
        _run_on_ray(todo, workers, ray_address, store)
    else:
        _run_local(todo, workers, store)
    return SweepRun(
        rows=[rows[cell.index] for cell in cells],
        num_computed=len(cells) - num_reused,
        num_reused=num_reused,
    )


def run_sweep(cells: Sequence[SweepCell], workers: int) -> list[CellResult]:
    """Run every cell in memory (nothing saved); results in cell order."""
    results: dict[int, CellResult] = {}
    _run_local(cells, workers, lambda done: results.__setitem__(done.cell.index, done))
    return [results[cell.index] for cell in cells]


def _run_local(
    cells: Sequence[SweepCell], workers: int, store: Callable[[CellResult], None]
) -> None:
    """Run the cells here (one worker or one cell) or in a process pool; `store` each result
    as it finishes. A cell's error is raised here; a dead worker raises `WorkerDied`."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(cells) <= 1:
        for cell in cells:
            store(run_cell(cell))
        return
    pool = ProcessPoolExecutor(max_workers=min(workers, len(cells)), initializer=quiet_worker)
    try:
        pending: set[Future[CellResult]] = {pool.submit(run_cell, cell) for cell in cells}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                try:
                    done = future.result()  # re-raises a cell's error here
                except BrokenProcessPool:
                    for other in finished:  # save what finished alongside the dead one
                        if not other.cancelled() and other.exception() is None:
                            store(other.result())
                    raise WorkerDied("a worker process died (killed or out of memory)") from None
                store(done)
    except BaseException:
        # a cell's error, a dead worker, Ctrl-C or SIGTERM: the other cells' work is lost
        # anyway, so end the workers now rather than wait for their cells (or orphan them)
        end_workers(pool)
        raise
    pool.shutdown()


def _run_on_ray(
    cells: Sequence[SweepCell],
    workers: int,
    address: str | None,
    store: Callable[[CellResult], None],
) -> None:
    try:
        import ray
    except ImportError:
        raise InputError(RAY_MISSING) from None
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        _check_rebuilt_on_ray(ray, cells)
        remote_run = ray.remote(num_cpus=1, max_retries=0)(run_cell)
        pending = [remote_run.remote(cell) for cell in cells]
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for reference in finished:
                store(ray.get(reference))
    finally:
        if started_here:
            ray.shutdown()


def rebuild_policies(cells: Sequence[SweepCell]) -> list[str]:
    """The one-line errors of building each cell's policy in this process (empty: all build).
    Top-level: a Ray task runs it on a worker before any cell, where a user's policy file or
    module must be found again."""
    errors = []
    for cell in cells:
        try:
            resolve(cell.config)  # builds the policy, as the cell will
        except InputError as error:
            errors.append(str(error))
    return errors


def _check_rebuilt_on_ray(ray: Any, cells: Sequence[SweepCell]) -> None:
    """InputError (one line) when a user's policy of the grid cannot be built on a worker."""
    first_of_each: dict[str, SweepCell] = {}
    for cell in cells:
        if policy_source(cell.config.policy) is not None:
            first_of_each.setdefault(cell.config.policy, cell)
    if not first_of_each:
        return
    task = ray.remote(num_cpus=1, max_retries=0)(rebuild_policies)
    errors = ray.get(task.remote(list(first_of_each.values())))
    if errors:
        raise InputError(f"on a Ray worker: {errors[0]}")


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep into a folder produced."""

    frame: pd.DataFrame  # one row per cell (`sweep_frame`), cell order
    num_computed: int  # cells run now
    num_reused: int  # cells read back from an earlier run of the same sweep
    elapsed_s: float  # wall time of the whole sweep


def sweep_to_folder(
    cells: Sequence[SweepCell],
    out_dir: str | os.PathLike[str],
    *,
    grid_record: dict[str, Any],
    title: str,
    workers: int | None = None,
    use_ray: bool = False,
    ray_address: str | None = None,
    progress: ProgressFactory = no_progress,
) -> SweepOutcome:
    """A whole sweep: every cell checked (profile, policy, workload) before any runs, the
    resolved grid written, the cells run and saved (resuming a previous run), the tables and
    plot written. `grid_record` says where the cells came from (flags or a grid file)."""
    started_s = time.perf_counter()
    cells = identify(cells)
    for cell in cells:
        resolve(cell.config)
    check_output_folder(out_dir)
    num_workers = default_workers() if workers is None else workers
    if num_workers < 1:
        raise InputError(f"--workers: must be >= 1, got {num_workers}")
    if ray_address is not None and not use_ray:
        raise InputError("--ray-address needs --ray")
    resolved_grid = {
        "command_line": invocation.command_line(),
        **grid_record,
        "cell_seed_rule": (
            "closed loop: SeedSequence([seed, C]).generate_state(1)[0]; finite rate r: "
            "SeedSequence([seed, C or 0, 1, round(1000 r)]); shared by policies"
        ),
        "cell_id_rule": "sha256(spec_json)[:16]",
        "cells": [
            {
                "cell_id": c.cell_id,
                "index": c.index,
                "policy": c.policy,
                "max_concurrency": c.max_concurrency,
                "labels": dict(c.labels),
                "sweep_seed": c.sweep_seed,
                "seed": c.config.seed,
            }
            for c in cells
        ],
        "base": resolved_config_dict(cells[0].config),
    }
    check_same_grid(Path(out_dir) / RESOLVED_GRID_FILE, resolved_grid)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(out_dir) / RESOLVED_GRID_FILE, result_json_text(resolved_grid) + "\n")
    runner = f"ray {ray_address or 'local'}" if use_ray else f"{num_workers} workers"
    with progress(len(cells), f"sweep ({runner})") as advance, stop_on_sigterm():
        try:
            run = run_sweep_to_dir(
                cells,
                out_dir,
                num_workers,
                use_ray=use_ray,
                ray_address=ray_address,
                on_done=lambda cell: advance(f"{cell.policy} C={cell.max_concurrency}"),
            )
        except WorkerDied as exc:
            raise WorkerDied(
                f"{exc}; finished cells are saved in {out_dir}/cells; run the same command "
                "again to resume"
            ) from None
        except (KeyboardInterrupt, StoppedBySignal) as exc:
            name, code = (
                ("Ctrl-C", 130) if isinstance(exc, KeyboardInterrupt) else (str(exc), exc.exit_code)
            )
            # counted on disk: a signal may land between a cell's write and its progress tick
            saved = sum(cell_file(out_dir, cell.cell_id).is_file() for cell in cells)
            raise StoppedBySignal(
                f"stopped by {name}: {saved} of {len(cells)} cells are saved in "
                f"{out_dir}/cells; run the same command again to resume (saved cells are reused)",
                code,
            ) from None
    frame = write_sweep_outputs(out_dir, run.rows, resolved_grid, title=title)
    return SweepOutcome(
        frame=frame,
        num_computed=run.num_computed,
        num_reused=run.num_reused,
        elapsed_s=time.perf_counter() - started_s,
    )


def default_workers() -> int:
    """CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------------------------
# Table and plot
# --------------------------------------------------------------------------------------------

# Columns that never go into the CSV/markdown table (they live in the cell files).
_HIDDEN = ("metrics_json", "cell_spec_json", "dataset")
# Parameter columns dropped from the table when every cell has the same value.
_DROP_WHEN_CONSTANT = ("variant", "request_rate", "scheduling", "sweep_seed")


def sweep_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """All rows as one frame: variant, labels, PARAM_COLUMNS, METRIC_COLUMNS, the rest."""
    frame = pd.DataFrame(list(rows))
    label_columns = [c for c in frame.columns if c not in ("variant", *PARAM_COLUMNS)]
    label_columns = label_columns[: label_columns.index("mean_tpot_ms")]
    first = ["variant", *label_columns, *PARAM_COLUMNS, *METRIC_COLUMNS, "num_preemptions"]
    rest = [c for c in frame.columns if c not in first]
    return frame[first + rest]


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


def label_columns(frame: pd.DataFrame) -> list[str]:
    """The label columns of a sweep frame (between variant and policy)."""
    columns = list(frame.columns)
    return columns[columns.index("variant") + 1 : columns.index("policy")]


def shown_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The CSV/markdown view: labels that vary, parameters, METRIC_COLUMNS, preemptions, id."""
    labels = [c for c in label_columns(frame) if frame[c].nunique(dropna=False) > 1]
    params = [
        c
        for c in ("variant", "request_rate", "scheduling", "sweep_seed")
        if frame[c].nunique(dropna=False) > 1
    ]
    columns = [
        *(["variant"] if "variant" in params else []),
        *labels,
        "policy",
        "max_concurrency",
        *[c for c in ("request_rate", "scheduling") if c in params],
        "num_prompts",
        *(["sweep_seed"] if "sweep_seed" in params else []),
        "seed",
        *METRIC_COLUMNS,
        # the 90% prediction interval where the sweep asked for one (--interval-runs)
        *[c for c in INTERVAL_COLUMNS if c in frame.columns],
        "num_preemptions",
        "cell_id",
    ]
    return frame[columns]


def _cell_text(value: Any) -> str:
    """A table cell: floats with 3 decimals, "-" where the value is missing (NaN, None)."""
    if value is None or isinstance(value, float | np.floating):
        return strict_json.missing_text(value, "{:.3f}")
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of `frame` (floats with 3 decimals)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    lines = [header, rule]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell_text(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def series_keys(frame: pd.DataFrame) -> list[str]:
    """Columns that tell plot lines apart: varying labels/parameters, then policy."""
    candidates = ["variant", *label_columns(frame), "request_rate", "scheduling"]
    return [c for c in candidates if frame[c].nunique(dropna=False) > 1] + ["policy"]


def plot_tpot_png(frame: pd.DataFrame, title: str) -> bytes:
    """PNG bytes of mean TPOT vs concurrency, one line per series (mean over seeds), log-x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = series_keys(frame) if "variant" in frame.columns and "policy" in frame.columns else []
    figure, axes = plt.subplots(figsize=(7.0, 4.5))
    try:
        closed = frame[frame["max_concurrency"].notna()]
        for key, group in closed.groupby(keys, sort=False, dropna=False):
            values = key if isinstance(key, tuple) else (key,)
            ordered = group.groupby("max_concurrency", sort=True)["mean_tpot_ms"].mean()
            label = ": ".join(str(v) for v in values if v != "")
            axes.plot(ordered.index, ordered.to_numpy(), marker="o", label=label)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("max concurrency C (closed loop)")
        axes.set_ylabel("mean TPOT (ms)")
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        if axes.get_legend_handles_labels()[0]:  # a single unnamed series has nothing to label
            axes.legend(fontsize="small")
    except BaseException:
        plt.close(figure)
        raise
    return figure_png_bytes(figure, dpi=120)


def write_sweep_outputs(
    out_dir: str | os.PathLike[str],
    rows: Sequence[dict[str, Any]],
    sweep_config: dict[str, Any],
    title: str = "simulated mean TPOT",
) -> pd.DataFrame:
    """sweep.csv, sweep.md, sweep_config.json, tpot_vs_concurrency.png in `out_dir`."""
    frame = sweep_frame(rows)
    shown = shown_table(frame)
    files = {
        TABLE_FILE_CSV: shown.to_csv(index=False).encode("utf-8"),
        TABLE_FILE_MD: markdown_table(shown).encode("utf-8"),
        CONFIG_FILE: (result_json_text(sweep_config) + "\n").encode("utf-8"),
    }
    files[PLOT_FILE] = plot_tpot_png(frame, title)
    write_files(out_dir, files)
    return frame
