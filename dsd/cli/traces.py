"""`dsd traces show | convert | export`: look at, convert and export workloads
(`dsd.api.workload` and the writers of `dsd.traces.export`, through the API)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dsd.cli import flags

traces_app = typer.Typer(
    help="Workloads: show statistics and plots, convert to our table schema, export for vLLM.",
    no_args_is_help=True,
)

Source = Annotated[
    str,
    typer.Argument(help="A workload name (docs/workloads.md) or a .csv/.parquet/.jsonl file."),
]


# `show` describes the requests and their send times; a cap on requests in flight is the
# client's and changes nothing shown. --burstiness stays: with a finite --request-rate it shapes
# the arrival times shown and plotted.
@flags.command(traces_app, "show", flags.REQUESTS, flags.ARRIVAL_TIMES, flags.SEED)
def show(
    source: Source,
    out: Annotated[
        str | None, typer.Option(help="Folder for lengths.png and arrivals.png.")
    ] = None,
    **options: Any,
) -> None:
    """Print counts, duration, rate and length percentiles; write plots with --out."""
    from rich.console import Console
    from rich.table import Table

    from dsd import api

    workload = api.workload(source, **options)
    table = Table(title=f"workload {workload.name}")
    table.add_column("", style="bold")
    table.add_column("value", justify="right")
    for label, value in api.workload_summary_rows(workload):
        table.add_row(label, value)
    console = Console()
    console.print(table)
    if out is not None:
        for path in api.plot_workload(workload, out):
            console.print(f"wrote {path}")


@flags.command(traces_app, "convert", flags.REQUESTS, flags.ARRIVALS, flags.SEED)
def convert(
    source: Source,
    out: Annotated[Path, typer.Option(help="Output .csv or .parquet (our schema).")],
    **options: Any,
) -> None:
    """Write a workload (name or file) as our table schema (.csv or .parquet)."""
    from dsd import api

    workload = api.workload(source, **options)
    api.write_workload_table(workload, out)
    typer.echo(f"wrote {out} ({len(workload.requests):,} requests)")


@flags.command(
    traces_app,
    "export",
    flags.REQUEST_SHAPE,
    {"num_prompts": flags.REQUESTS["num_prompts"]},
    flags.SEED,
)
def export(
    source: Source,
    out: Annotated[Path, typer.Option(help="Output .jsonl in vLLM's custom dataset format.")],
    **options: Any,
) -> None:
    """Write a JSONL that `vllm bench serve --dataset-name custom` replays (see docs)."""
    from dsd import api

    workload = api.workload(source, **options)
    typer.echo(api.write_vllm_custom_jsonl(workload, out))


def register(app: typer.Typer) -> None:
    """Add `dsd traces ...` to the app."""
    app.add_typer(traces_app, name="traces")
