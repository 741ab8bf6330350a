"""Policy evaluation (issue 9): every K policy against the static-K envelope, four workloads.

Simulates every policy, and static K = 0..k_max beside it, on the PR #32374 H100 profile over
MT-Bench closed loop, the Azure 2023 conversation trace replayed open loop, a draining RL
rollout and a phased workload whose acceptance moves over time (the rates of two MT-Bench
categories, measured from the bundled early-exit recording); each policy's gap is its TPOT
paired seed by seed with the best static K's, with a 95% interval, and a point gets more seeds
while some interval is too wide. The workloads, the seed rule and the results:
docs/policies.md, "Evaluation"; what this writes under --out: report.md (it names every
workload in full), results.json, static_sweep_mt-bench.json, phased_workload.csv and one PNG
per workload.

It does not run real models and does not tune any policy's knobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsd.common import strict_json
from dsd.common.atomic import atomic_write_bytes, atomic_write_text
from dsd.common.png import figure_png_bytes
from dsd.policies.profile_io import save_profile
from dsd.policies.types import KPolicy
from dsd.reports import PR_SPECULATIVE_METHOD
from dsd.reports.paired import Gap, paired_gap, verdict
from dsd.sim.build import build_engine, fitted_executor, learned_profile
from dsd.sim.config import RunConfig
from dsd.sim.engine import Engine
from dsd.sim.models.replay import (
    DEFAULT_EXIT_LAYER,
    load_replay_recording,
    per_position_rates_from_recording,
)
from dsd.sim.resolve import resolve
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import build_workload
from dsd.traces.rollout import RolloutConfig

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
K_MAX = 5
MIN_SEEDS = 4
MAX_SEEDS = 12
CI_TARGET = 0.005  # the 95% half-width of a gap that is resolved enough (a fraction)
# The warm-start row's previous run uses seed + this (never one of the measured seeds).
WARM_START_SEED_OFFSET = 1000
MT_BENCH_CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Azure conv: trace seconds replayed (from the first row), and the time-compression factors.
AZURE_WINDOW_S = 180.0
AZURE_TIME_SCALES = (1.0, 3.0)
PHASE_ORDER = ("easy", "hard", "easy")
PHASED_CONCURRENCIES = (16, 64)
ROLLOUT_SIZES = (64, 256)
REQUESTS_PER_PHASE = 384


@dataclass(frozen=True)
class PolicyRow:
    """One row of the tables: a policy SPEC and how it is run."""

    label: str  # row name in the report
    spec: str  # SPEC for parse_policy ({sweep} is the MT-Bench static sweep path)
    # Warm start: `{prior}` in the SPEC is the profile the cold bandit learned on the same point
    # at seed + WARM_START_SEED_OFFSET (a previous run of the same workload).
    warm_start: bool = False


STATIC_ROWS = tuple(PolicyRow(f"static:{k}", f"static:{k}") for k in range(K_MAX + 1))
DYNAMIC_ROWS = (
    PolicyRow("goodput", "goodput"),
    PolicyRow("online", "online"),
    PolicyRow("per-request (padded cost)", "per-request"),
    PolicyRow("per-request (token-eq. cost)", "per-request:mixed_k=token-equivalent"),
    PolicyRow("hysteresis:goodput", "hysteresis:goodput"),
    PolicyRow("context", "context"),
    PolicyRow("bandit", "bandit"),
    PolicyRow("bandit:prior=profile", "bandit:prior=profile"),
    PolicyRow("bandit, warm (learned profile)", "bandit:prior={prior}", warm_start=True),
    PolicyRow("envelope policy (MT-Bench sweep)", "envelope:{sweep}"),
)


@dataclass(frozen=True)
class Workload:
    """One workload of the evaluation and its x-axis points."""

    name: str  # key and file suffix
    description: str  # one line for the report
    axis: str  # x-axis label
    points: tuple[tuple[str, dict[str, Any]], ...]  # (point label, RunConfig kwargs)
    requests_per_run: tuple[int, ...]  # requests one run of each point sends


@dataclass(frozen=True)
class MeasuredCategory:
    """One MT-Bench category's acceptance, measured from the bundled early-exit recording."""

    name: str  # MT-Bench category (the phased workload's tag)
    rates: tuple[float, ...]  # [K_MAX] per-position rates r_1..r_K of a chain-SD replay at K_MAX
    acceptance_length: float  # output tokens per decode step of that replay
    num_prompts: int  # recorded prompts of the category


def measured_categories() -> tuple[MeasuredCategory, MeasuredCategory]:
    """(easy, hard): the recording's categories with the highest and lowest acceptance length."""
    recording = load_replay_recording(layer=DEFAULT_EXIT_LAYER)
    measured = []
    for name in sorted({c for c in recording.categories if c is not None}):
        members = [i for i, c in enumerate(recording.categories) if c == name]
        subset = recording.subset(members)
        counted = per_position_rates_from_recording(subset, K_MAX)
        measured.append(
            MeasuredCategory(name, tuple(counted.rates), counted.acceptance_length, len(members))
        )
    measured.sort(key=lambda m: m.acceptance_length)
    return measured[-1], measured[0]


def _rates_text(rates: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{r:.3f}" for r in rates) + ")"


def workloads(out: Path) -> tuple[Workload, ...]:
    phased = str(out / "phased_workload.csv")
    rollout = RolloutConfig(num_requests=64, output_median=256.0, max_output_len=2048)
    easy, hard = measured_categories()
    categories = ((easy.name, easy.rates), (hard.name, hard.rates))
    azure = build_workload("azure-conv", trace_options=TraceOptions(end_s=AZURE_WINDOW_S))
    phase_names = "/".join(easy.name if p == "easy" else hard.name for p in PHASE_ORDER)
    return (
        Workload(
            "mt-bench",
            "MT-Bench closed loop, num_prompts = max(4C, 64), heterogeneous acceptance",
            "concurrency C",
            tuple(
                (
                    f"C={c}",
                    {"dataset": "mt-bench", "num_prompts": max(4 * c, 64), "max_concurrency": c},
                )
                for c in MT_BENCH_CONCURRENCIES
            ),
            tuple(max(4 * c, 64) for c in MT_BENCH_CONCURRENCIES),
        ),
        Workload(
            "azure-conv",
            f"Azure 2023 conversation trace, open loop on its own timestamps and lengths: the "
            f"first {AZURE_WINDOW_S:g} s of the trace ({len(azure.requests)} requests), at 1x "
            f"and time-compressed {', '.join(f'{s:g}x' for s in AZURE_TIME_SCALES if s != 1.0)}"
            " (arrival times divided by the factor; the same requests at every point)",
            "time scale",
            tuple(
                (
                    f"{scale:g}x ({len(azure.requests) * scale / AZURE_WINDOW_S:.1f} req/s)",
                    {
                        "dataset": "azure-conv",
                        "trace_options": TraceOptions(end_s=AZURE_WINDOW_S, time_scale=scale),
                    },
                )
                for scale in AZURE_TIME_SCALES
            ),
            tuple(len(azure.requests) for _ in AZURE_TIME_SCALES),
        ),
        Workload(
            "rl-rollout",
            "RL rollout: all requests at t=0, lognormal outputs (median 256, cap 2048), drains",
            "requests",
            tuple(
                (
                    f"N={n}",
                    {
                        "dataset": "rl-rollout",
                        "rollout": dataclasses.replace(rollout, num_requests=n),
                    },
                )
                for n in ROLLOUT_SIZES
            ),
            ROLLOUT_SIZES,
        ),
        Workload(
            "phased",
            f"phases {phase_names} of {REQUESTS_PER_PHASE} requests (prompt 256, output "
            f"128-384), closed loop; per-position rates measured per MT-Bench category from "
            f"the bundled early-exit recording (exit layer {DEFAULT_EXIT_LAYER}, chain-SD replay "
            f"at K={K_MAX}): highest-acceptance category {easy.name} {_rates_text(easy.rates)} "
            f"(AL {easy.acceptance_length:.2f}, {easy.num_prompts} prompts), lowest "
            f"{hard.name} {_rates_text(hard.rates)} (AL {hard.acceptance_length:.2f}, "
            f"{hard.num_prompts} prompts)",
            "concurrency C",
            tuple(
                (
                    f"C={c}",
                    {
                        "dataset": phased,
                        "max_concurrency": c,
                        "category_acceptance": categories,
                    },
                )
                for c in PHASED_CONCURRENCIES
            ),
            tuple(len(PHASE_ORDER) * REQUESTS_PER_PHASE for _ in PHASED_CONCURRENCIES),
        ),
    )


def write_phased_workload(path: Path) -> None:
    """The phased CSV: fixed lengths from a fixed generator (the file is part of the report).

    Rows are tagged with the measured easy / hard categories' names (see `measured_categories`).
    """
    easy, hard = measured_categories()
    rng = np.random.default_rng(20240909)
    lines = ["prompt_len,output_len,tag"]
    for phase in PHASE_ORDER:
        tag = easy.name if phase == "easy" else hard.name
        outputs = rng.integers(128, 385, size=REQUESTS_PER_PHASE)  # [n]
        lines += [f"256,{int(n)},{tag}" for n in outputs]
    atomic_write_text(path, "\n".join(lines) + "\n")


def point_engine(kwargs: dict[str, Any], spec: str, seed: int) -> Engine:
    """The engine of one run at a workload point (its RunConfig kwargs) on PROFILE."""
    config = RunConfig(
        profile=PROFILE,
        policy=spec,
        seed=seed,
        speculative_method=PR_SPECULATIVE_METHOD,
        **kwargs,
    )
    resolved = resolve(config)
    return build_engine(resolved, fitted_executor(resolved))


def latency_model_note() -> str:
    """The latency model the runs get on PROFILE, and why (one clause for the report)."""
    choice = resolve(RunConfig(profile=PROFILE, policy="static:0", num_prompts=1)).latency_choice
    assert choice is not None  # a run on a profile always records its choice
    return f"latency model auto: {choice.kind} ({choice.reason})"


def run_cell(task: tuple[dict[str, Any], PolicyRow, int, str]) -> float:
    """Mean TPOT ms of one (workload point, policy row, seed)."""
    kwargs, row, seed, sweep_path = task

    def run(spec: str, run_seed: int) -> tuple[float, KPolicy]:
        engine = point_engine(kwargs, spec, run_seed)
        return float(engine.run().metrics["mean_tpot_ms"]), engine.policy

    if not row.warm_start:
        return run(row.spec.format(sweep=sweep_path), seed)[0]
    # The previous run: the cold bandit on the same point at another seed; the profile it
    # learned is the prior of the measured run.
    learned = learned_profile(run("bandit", seed + WARM_START_SEED_OFFSET)[1])
    assert learned is not None, "the cold bandit saw no timed decode step"
    with tempfile.TemporaryDirectory() as folder:
        prior_path = Path(folder) / "learned_profile.json"
        save_profile(learned, prior_path)
        return run(row.spec.format(prior=prior_path), seed)[0]


Results = dict[str, dict[str, dict[str, list[float]]]]  # workload -> row -> point -> [seed]


def _run_all(
    tasks: list[tuple[str, str, str, tuple[dict[str, Any], PolicyRow, int, str]]],
    results: Results,
    num_workers: int,
) -> None:
    with multiprocessing.get_context("fork").Pool(num_workers) as pool:
        values = pool.map(run_cell, [t[3] for t in tasks], chunksize=1)
    for (workload, label, point, _task), value in zip(tasks, values, strict=True):
        results[workload].setdefault(label, {}).setdefault(point, []).append(value)


def evaluate(out: Path, num_workers: int) -> Results:
    """Every row at every point, on as many seeds as each point's intervals need."""
    write_phased_workload(out / "phased_workload.csv")
    sweep_path = str(out / "static_sweep_mt-bench.json")
    all_workloads = workloads(out)
    results: Results = {w.name: {} for w in all_workloads}
    # (workload, point) -> (seeds run so far, seeds wanted)
    seeds = {(w.name, p): (0, MIN_SEEDS) for w in all_workloads for p, _ in w.points}

    def tasks_for(rows: tuple[PolicyRow, ...]) -> list[Any]:
        return [
            (w.name, row.label, point, (kwargs, row, seed, sweep_path))
            for w in all_workloads
            for row in rows
            for point, kwargs in w.points
            for seed in range(*seeds[w.name, point])
        ]

    # First round: the static rows, then the envelope policy's table from their seed means
    # (written once: every seed of the envelope row runs the same table), then the rest.
    _run_all(tasks_for(STATIC_ROWS), results, num_workers)
    records = [
        {
            "concurrency": c,
            "k": k,
            "mean_tpot_ms": float(np.mean(results["mt-bench"][f"static:{k}"][f"C={c}"])),
        }
        for c in MT_BENCH_CONCURRENCIES
        for k in range(K_MAX + 1)
    ]
    atomic_write_text(Path(sweep_path), strict_json.dumps(records, indent=1))
    _run_all(tasks_for(DYNAMIC_ROWS), results, num_workers)
    while True:
        for w in all_workloads:
            for point, _ in w.points:
                have = seeds[w.name, point][1]
                seeds[w.name, point] = (have, seeds_wanted(results[w.name], point, have))
        if all(have == want for have, want in seeds.values()):
            return results
        _run_all(tasks_for(STATIC_ROWS + DYNAMIC_ROWS), results, num_workers)


def envelope_k(table: dict[str, dict[str, list[float]]], point: str) -> int:
    """The static K with the lowest seed-mean TPOT at a point (smallest K on ties)."""
    means = [float(np.mean(table[f"static:{k}"][point])) for k in range(K_MAX + 1)]
    return int(np.argmin(means))


def gap(table: dict[str, dict[str, list[float]]], label: str, point: str) -> Gap:
    """A row's paired gap to the envelope's K at a point (reports.paired)."""
    return paired_gap(table[label][point], table[f"static:{envelope_k(table, point)}"][point])


def seeds_wanted(table: dict[str, dict[str, list[float]]], point: str, have: int) -> int:
    """`have`, or twice as many (at most MAX_SEEDS) while some dynamic row's gap at the point
    has a 95% half-width over CI_TARGET."""
    labels = [row.label for row in DYNAMIC_ROWS if row.label in table]
    widest = max((gap(table, label, point).half_width for label in labels), default=0.0)
    return min(2 * have, MAX_SEEDS) if widest > CI_TARGET and have < MAX_SEEDS else have


def _markdown(results: Results, out: Path, seconds: float, num_workers: int) -> str:
    lines = [
        "# K policies vs the static-K envelope (simulated, PR #32374 H100 profile)",
        "",
        "Command: `python -m dsd.reports.policy_eval --out results/policies` (seeds 0..n-1 per "
        f"point, n from {MIN_SEEDS}, doubled while some dynamic row's 95% half-width exceeds "
        f"{100 * CI_TARGET:g}%, at most {MAX_SEEDS}; n in each column header; {num_workers} "
        f"worker processes, took {seconds:.0f} s). "
        "Engine: sync scheduling, vLLM's next-step K timing (the K picked at a step is "
        f"verified at the next), {latency_model_note()}.",
        "",
        "Cells: seed-mean TPOT ms, then the gap to the envelope as the mean of paired per-seed "
        "gaps (each seed against the envelope's K at the same seed: same requests, common random "
        "numbers) +- its 95% confidence half-width. Envelope = the static K with the lowest "
        "seed-mean TPOT at that point (its K in the header). A gap whose interval contains 0 is "
        "a tie.",
        "",
    ]
    goal_lines: list[str] = []
    for w in workloads(out):
        table = results[w.name]
        points = [p for p, _ in w.points]
        lines += [f"## {w.name}: {w.description}", "", f"![plot](tpot_{w.name}.png)", ""]
        seeds = [len(table["static:0"][p]) for p in points]
        header = [
            f"{p} (K*={envelope_k(table, p)}, {n} seeds)"
            for p, n in zip(points, seeds, strict=True)
        ]
        lines.append("| policy | " + " | ".join(header) + " |")
        lines.append("|---" * (len(points) + 1) + "|")
        for label, row in table.items():
            cells = []
            for p in points:
                g = gap(table, label, p)
                gap_text = f"{100 * g.mean:+.2f}% ±{100 * g.half_width:.2f}"
                cells.append(f"{np.mean(row[p]):.2f} ({gap_text})")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        for row_def in DYNAMIC_ROWS:
            label = row_def.label
            gaps = [gap(table, label, p) for p in points]
            within = all(g.mean <= 0.01 for g in gaps)
            better = [  # with its size: an interval can exclude 0 by a hair (-0.00% +-0.00)
                f"{p} ({100 * g.mean:+.2f}%)"
                for p, g in zip(points, gaps, strict=True)
                if verdict(g) == "better"
            ]
            worse = [
                f"{p} ({100 * g.mean:+.1f}%)"
                for p, g in zip(points, gaps, strict=True)
                if g.mean > 0.01
            ]
            goal_lines.append(
                f"| {w.name} | {label} | {'yes' if within else 'no'} | "
                f"{', '.join(better) if better else '-'} | {', '.join(worse) if worse else '-'} |"
            )
    lines += [
        "## Goals per policy and workload",
        "",
        "Within 1%: the seed-mean gap is <= +1% at every point. Strictly better: points where "
        "the gap's 95% interval lies below 0 (not a tie), with the gap.",
        "",
        "| workload | policy | within 1% everywhere | strictly better at | over 1% at |",
        "|---|---|---|---|---|",
        *goal_lines,
        "",
    ]
    return "\n".join(lines) + "\n"


def _plot(results: Results, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for w in workloads(out):
        table = results[w.name]
        points = [p for p, _ in w.points]
        x = np.arange(len(points))
        fig, axis = plt.subplots(figsize=(9, 4.8))
        labels = [r.label for r in DYNAMIC_ROWS]
        for index, label in enumerate(labels):
            gaps = [gap(table, label, p) for p in points]
            mean = np.array([100 * g.mean for g in gaps])
            err = np.array([100 * g.half_width for g in gaps])
            offset = (index - len(labels) / 2) * 0.02
            axis.errorbar(x + offset, mean, yerr=err, marker="o", capsize=2, label=label)
        axis.set_xticks(x, points)
        axis.set_xlabel(w.axis)
        axis.set_ylabel("mean TPOT vs envelope, % (bars: 95% CI, paired seeds)")
        axis.set_title(w.name)
        axis.axhline(1.0, color="grey", linestyle=":")
        axis.axhline(0.0, color="black", linewidth=0.5)
        axis.set_ylim(max(axis.get_ylim()[0], -15), min(axis.get_ylim()[1], 20))
        axis.legend(fontsize=6, ncol=2)
        atomic_write_bytes(out / f"tpot_{w.name}.png", figure_png_bytes(fig, dpi=100))


def report_arguments(doc: str | None) -> argparse.Namespace:
    """--out (folder, created) and --workers of the policy reports' scripts."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/policies"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = report_arguments(__doc__)
    start = time.perf_counter()
    results = evaluate(args.out, args.workers)
    seconds = time.perf_counter() - start
    atomic_write_text(args.out / "results.json", strict_json.dumps(results, indent=1))
    _plot(results, args.out)
    atomic_write_text(args.out / "report.md", _markdown(results, args.out, seconds, args.workers))


if __name__ == "__main__":
    main()
