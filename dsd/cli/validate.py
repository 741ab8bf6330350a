"""`dsd validate`: the simulator checked against the real engine, cell by cell, or against a
`vllm bench serve` result (`dsd.api.validate`, `dsd.api.validate_vllm`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from dsd.cli import flags
from dsd.cli.simulate import _dataset
from dsd.common.errors import InputError


def _print_cells(cells: Sequence[Any]) -> None:
    sources = sorted({cell.host_overhead_source for cell in cells})
    typer.echo(f"simulator host overhead per step: {', '.join(sources)}")
    for cell in cells:
        low, high = cell.interval("mean_tpot_ms")
        interval = f" (90%: {low:.3f}-{high:.3f})" if math.isfinite(low + high) else ""
        typer.echo(
            f"{cell.policy:>16} C={cell.max_concurrency}: mean TPOT measured "
            f"{float(cell.measured.get('mean_tpot_ms', math.nan)):.3f} ms, simulated "
            f"{float(cell.simulated.get('mean_tpot_ms', math.nan)):.3f} ms{interval}, error "
            f"{cell.error_pct('mean_tpot_ms'):+.1f} %"
        )


def register(app: typer.Typer) -> None:
    """Add `validate` to the app."""

    @flags.command(
        app,
        "validate",
        flags.PAIR,
        flags.SOURCE,
        flags.REQUEST_SHAPE,
        flags.ENGINE,
        flags.SIMULATOR,
        flags.SEED,
    )
    def validate_command(
        profile: Annotated[str, typer.Option(help="Profile the simulator is fitted from.")],
        policies: Annotated[
            str, typer.Option(help=f"Policy SPECs, comma-separated, each {flags.POLICY_SPEC_HELP}.")
        ] = "static:0,static:3,goodput",
        max_concurrency: Annotated[str, typer.Option(help="C values, e.g. 1,4,16.")] = "1,4",
        num_prompts_per_concurrency: Annotated[int, typer.Option(help="Prompts per C.")] = 20,
        trials: Annotated[int, typer.Option(help="Real runs per cell (median and spread).")] = 3,
        measured: Annotated[
            str | None, typer.Option(help="A `vllm bench serve --save-result` JSON.")
        ] = None,
        policy: Annotated[
            str | None,
            typer.Option(help=f"Policy SPEC (with --measured): {flags.POLICY_SPEC_HELP}."),
        ] = None,
        fast_path: Annotated[str, typer.Option(help="off, eager, cuda-graphs.")] = "off",
        out: Annotated[str | None, typer.Option(help="Report folder.")] = None,
        allow_noisy_profile: Annotated[
            bool, typer.Option(help="Validate against a profile that fails the timing checks.")
        ] = False,
        retime: Annotated[
            bool,
            typer.Option(
                help="Time the profile's points again around every real run and price the "
                "simulated side by them."
            ),
        ] = True,
        in_sample: Annotated[
            bool,
            typer.Option(
                "--in-sample",
                help="Run the cells on the profile's own acceptance prompts (a timing check; "
                "default: prompts it never recorded).",
            ),
        ] = False,
        **given: Any,
    ) -> None:
        """Simulated vs measured per (policy, C), or the simulator vs a vLLM bench result."""
        from dsd import api

        pair_flags, given = flags.split_flags(given, flags.PAIR_FLAGS)
        given = _dataset(given)
        if measured is not None:
            if policy is None:
                raise InputError("--measured: give the run's --policy SPEC")
            cell = api.validate_vllm(measured, profile=profile, policy=policy, out=out, **given)
            _print_cells([cell])
            scores = ", ".join(
                f"{kind} {error:+.1f} %" for kind, error in cell.latency_model_errors_pct.items()
            )
            if scores:
                typer.echo(f"mean TPOT error by latency model: {scores}")
            return
        if "target" not in pair_flags:
            raise InputError("--target: needed to run the real backend (or pass --measured)")
        if out is None:
            raise InputError("--out: give the report folder")
        specs = api.split_policy_list(policies)
        concurrencies = flags.int_list("--max-concurrency", max_concurrency, 1)
        pair = api.load_pair(**pair_flags, seed=given.get("seed", 0))
        cells = api.validate(
            pair,
            profile=profile,
            out=out,
            policies=specs,
            max_concurrency=concurrencies,
            num_prompts_per_concurrency=num_prompts_per_concurrency,
            trials=trials,
            fast_path=fast_path,
            allow_noisy_profile=allow_noisy_profile,
            retime=retime,
            held_out_prompts=not in_sample,
            progress=flags.progress_bar,
            **given,
        )
        _print_cells(cells)
        typer.echo(api.threads_text(pair_flags.get("threads"), str(pair.device)))
        typer.echo(f"wrote {out}/report.md")
