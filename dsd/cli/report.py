"""`dsd report DIR`: the markdown report of a sweep folder (wiring only; reports.report draws).

What this module does not do: run cells (`dsd sweep`) or choose what the report shows.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dsd.cli import invocation


def register(app: typer.Typer) -> None:
    """Add `report` to the app."""

    @app.command("report")
    def report(
        out: Annotated[str, typer.Argument(help="A `dsd sweep --out` folder.")],
        k_trace_cell: Annotated[
            str | None,
            typer.Option(help="Cell id for the K-over-time plot (default: a dynamic cell)."),
        ] = None,
    ) -> None:
        """Write DIR/report.md (+ PNGs): TPOT vs C, envelope distance, frontier, K trace."""
        from dsd.reports.report import build_report

        path = build_report(out, k_trace_cell=k_trace_cell, command_line=invocation.command_line())
        typer.echo(f"wrote {path}")
