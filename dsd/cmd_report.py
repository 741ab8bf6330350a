"""`dsd report DIR`: the markdown report of a sweep folder (wiring only; reports.report draws).

What this module does not do: run cells (`dsd sweep`) or choose what the report shows.
"""

from __future__ import annotations

import shlex
import sys
from typing import Annotated

import typer


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
        from reports.report import build_report

        command_line = shlex.join(["dsd", *sys.argv[1:]]) if sys.argv[1:2] == ["report"] else ""
        if not command_line:
            command_line = shlex.join(
                ["dsd", "report", out] + (["--k-trace-cell", k_trace_cell] if k_trace_cell else [])
            )
        path = build_report(out, k_trace_cell=k_trace_cell, command_line=command_line)
        typer.echo(f"wrote {path}")
