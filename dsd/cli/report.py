"""`dsd report DIR`: the markdown report of a sweep folder (`dsd.api.report`)."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `report` to the app."""

    @app.command("report")
    def report(
        out: Annotated[str, typer.Argument(help="A `dsd sweep --out` folder.")],
        k_trace_cell: Annotated[
            str | None,
            typer.Option(
                help="Cell id for the K-over-time plot (default: the cell whose K moves most)."
            ),
        ] = None,
    ) -> None:
        """Write DIR/report.md (+ PNGs): TPOT vs C, envelope distance, frontier, K trace."""
        from dsd import api

        typer.echo(f"wrote {api.report(out, k_trace_cell=k_trace_cell)}")
