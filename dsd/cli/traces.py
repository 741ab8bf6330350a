"""`dsd traces show | convert | export`: look at, convert and export workloads.

Wiring only: workloads come from traces.registry.build_workload (names, trace names, files)
with the workload flags of dsd.options, files and plots from traces.export. Every output is
written atomically by traces.export.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from dsd.cli.flags import (
    Burstiness,
    EndS,
    Fraction,
    MaxConcurrency,
    MaxOutputLen,
    MaxPromptLen,
    NumPrompts,
    NumRows,
    OutputLen,
    RandomInputLen,
    RandomOutputLen,
    RandomRangeRatio,
    RawPrompt,
    RequestRate,
    RolloutAlpha,
    RolloutDist,
    RolloutMax,
    RolloutMedian,
    RolloutMin,
    RolloutPromptLen,
    RolloutPromptSet,
    RolloutSigma,
    Shuffle,
    StartS,
    TimeScale,
    WorkloadFlags,
)
from dsd.traces.export import (
    plot_workload,
    summarize,
    write_vllm_custom_jsonl,
    write_workload_table,
)
from dsd.traces.registry import KNOWN_NAMES, build_workload
from dsd.traces.workload import Workload

traces_app = typer.Typer(
    help="Workloads: show statistics and plots, convert to our table schema, export for vLLM.",
    no_args_is_help=True,
)

Source = Annotated[
    str,
    typer.Argument(
        help=f"A workload name ({', '.join(KNOWN_NAMES)}) or a .csv/.parquet/.jsonl file."
    ),
]
# `dsd traces` seeds only the workload; the simulator's --seed says what else it seeds.
Seed = Annotated[int, typer.Option(help="Run seed.")]


def _build(source: str, values: dict[str, Any]) -> Workload:
    """The workload of `source` shaped by the command's workload flag values."""
    return build_workload(source, **WorkloadFlags.from_values(values).arguments())


def _summary_table(workload: Workload) -> Table:
    summary = summarize(workload)
    table = Table(title=f"workload {summary.name}")
    table.add_column("", style="bold")
    table.add_column("value", justify="right")
    rate = "inf" if math.isinf(summary.request_rate) else f"{summary.request_rate:.3f}"
    rows = [
        ("requests", f"{summary.num_requests:,}"),
        ("duration (s)", f"{summary.duration_s:.2f}"),
        ("request rate (req/s)", rate),
        ("max concurrency", str(summary.max_concurrency or "-")),
        ("total prompt tokens", f"{summary.total_prompt_tokens:,}"),
        ("total output tokens", f"{summary.total_output_tokens:,}"),
    ]
    for label, stats in (("prompt_len", summary.prompt), ("output_len", summary.output)):
        rows.append(
            (
                f"{label} mean / p50 / p90 / p99 / max",
                f"{stats.mean:.1f} / {stats.p50:.0f} / {stats.p90:.0f} / "
                f"{stats.p99:.0f} / {stats.max}",
            )
        )
    top_tags = list(summary.tags.items())[:8]
    more = len(summary.tags) - len(top_tags)
    tags_text = ", ".join(f"{tag} {count}" for tag, count in top_tags)
    rows.append(("tags", tags_text + (f", +{more} more" if more > 0 else "")))
    for label, value in rows:
        table.add_row(label, value)
    return table


@traces_app.command("show")
def show(
    source: Source,
    out: Annotated[
        Path | None, typer.Option(help="Folder for lengths.png and arrivals.png.")
    ] = None,
    num_prompts: NumPrompts = None,
    request_rate: RequestRate = math.inf,
    burstiness: Burstiness = 1.0,
    max_concurrency: MaxConcurrency = None,
    seed: Seed = 0,
    output_len: OutputLen = None,
    raw_prompt: RawPrompt = False,
    shuffle: Shuffle = False,
    random_input_len: RandomInputLen = 1024,
    random_output_len: RandomOutputLen = 128,
    random_range_ratio: RandomRangeRatio = 0.0,
    time_scale: TimeScale = 1.0,
    start_s: StartS = 0.0,
    end_s: EndS = math.inf,
    fraction: Fraction = None,
    num_rows: NumRows = None,
    max_prompt_len: MaxPromptLen = None,
    max_output_len: MaxOutputLen = None,
    rollout_dist: RolloutDist = "lognormal",
    rollout_median: RolloutMedian = 1024.0,
    rollout_sigma: RolloutSigma = 1.0,
    rollout_alpha: RolloutAlpha = 1.5,
    rollout_min: RolloutMin = 256.0,
    rollout_max: RolloutMax = 16384,
    rollout_prompt_len: RolloutPromptLen = 512,
    rollout_prompt_set: RolloutPromptSet = None,
) -> None:
    """Print counts, duration, rate and length percentiles; write plots with --out."""
    workload = _build(source, locals())
    console = Console()
    console.print(_summary_table(workload))
    if out is not None:
        for path in plot_workload(workload, out):
            console.print(f"wrote {path}")


@traces_app.command("convert")
def convert(
    source: Source,
    out: Annotated[Path, typer.Option(help="Output .csv or .parquet (our schema).")],
    num_prompts: NumPrompts = None,
    request_rate: RequestRate = math.inf,
    burstiness: Burstiness = 1.0,
    seed: Seed = 0,
    output_len: OutputLen = None,
    raw_prompt: RawPrompt = False,
    shuffle: Shuffle = False,
    random_input_len: RandomInputLen = 1024,
    random_output_len: RandomOutputLen = 128,
    random_range_ratio: RandomRangeRatio = 0.0,
    time_scale: TimeScale = 1.0,
    start_s: StartS = 0.0,
    end_s: EndS = math.inf,
    fraction: Fraction = None,
    num_rows: NumRows = None,
    max_prompt_len: MaxPromptLen = None,
    max_output_len: MaxOutputLen = None,
    rollout_dist: RolloutDist = "lognormal",
    rollout_median: RolloutMedian = 1024.0,
    rollout_sigma: RolloutSigma = 1.0,
    rollout_alpha: RolloutAlpha = 1.5,
    rollout_min: RolloutMin = 256.0,
    rollout_max: RolloutMax = 16384,
    rollout_prompt_len: RolloutPromptLen = 512,
    rollout_prompt_set: RolloutPromptSet = None,
) -> None:
    """Write a workload (name or file) as our table schema (.csv or .parquet)."""
    workload = _build(source, locals())
    write_workload_table(workload, out)
    Console().print(f"wrote {out} ({len(workload.requests):,} requests)")


@traces_app.command("export")
def export(
    source: Source,
    out: Annotated[Path, typer.Option(help="Output .jsonl in vLLM's custom dataset format.")],
    num_prompts: NumPrompts = None,
    seed: Seed = 0,
    output_len: OutputLen = None,
    raw_prompt: RawPrompt = False,
    shuffle: Shuffle = False,
    random_input_len: RandomInputLen = 1024,
    random_output_len: RandomOutputLen = 128,
    random_range_ratio: RandomRangeRatio = 0.0,
    time_scale: TimeScale = 1.0,
    start_s: StartS = 0.0,
    end_s: EndS = math.inf,
    fraction: Fraction = None,
    num_rows: NumRows = None,
    max_prompt_len: MaxPromptLen = None,
    max_output_len: MaxOutputLen = None,
    rollout_dist: RolloutDist = "lognormal",
    rollout_median: RolloutMedian = 1024.0,
    rollout_sigma: RolloutSigma = 1.0,
    rollout_alpha: RolloutAlpha = 1.5,
    rollout_min: RolloutMin = 256.0,
    rollout_max: RolloutMax = 16384,
    rollout_prompt_len: RolloutPromptLen = 512,
    rollout_prompt_set: RolloutPromptSet = None,
) -> None:
    """Write a JSONL that `vllm bench serve --dataset-name custom` replays (see docs)."""
    workload = _build(source, locals())
    write_vllm_custom_jsonl(workload, out)
    console = Console()
    console.print(f"wrote {out} ({len(workload.requests):,} requests)")
    console.print(
        "replay: vllm bench serve --dataset-name custom "
        f"--dataset-path {out} --num-prompts {len(workload.requests)} --custom-output-len -1 "
        "--skip-chat-template --disable-shuffle --ignore-eos "
        "[--request-rate R --burstiness X | --max-concurrency C]",
        soft_wrap=True,
        markup=False,
    )
    if any(request.arrival_s > 0 for request in workload.requests):
        console.print(
            "note: the JSONL has no arrival times; the trace's timestamps are not replayed",
            soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    """Add `dsd traces ...` to the app."""
    app.add_typer(traces_app, name="traces")
