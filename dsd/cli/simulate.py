"""`dsd simulate` and `dsd sweep`: the simulator (`dsd.api.simulate`, `dsd.api.sweep`).

Flag names mirror `vllm bench serve` where it has them. Every input is checked before anything
runs, and outputs are written only after the runs succeed, so a bad input prints one
`error: ...` line, exits 2 and leaves no folder behind.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dsd.cli import flags

Profile = Annotated[
    str, typer.Option(help="Profile JSON (ours or vLLM PR #32374's dynamic_speculative_config).")
]


def _dataset(given: dict[str, Any]) -> dict[str, Any]:
    """The given flags with --dataset-name / --dataset-path turned into the run's `dataset`."""
    from dsd import api

    name, path = given.pop("dataset_name", None), given.pop("dataset_path", None)
    if name is not None or path is not None:
        given["dataset"] = api.dataset_source(name, path)
    return given


def register(app: typer.Typer) -> None:
    """Add `simulate` and `sweep` to the app."""

    @flags.command(
        app,
        "simulate",
        flags.SOURCE,
        flags.REQUESTS,
        flags.ARRIVALS,
        flags.ENGINE,
        flags.SIMULATOR,
        flags.HELD_OUT,
        flags.SEED,
    )
    def simulate(
        profile: Profile,
        policy: Annotated[
            str | None, typer.Option(help=f"K policy SPEC: {flags.POLICY_SPEC_HELP}.")
        ] = None,
        speculative_config: Annotated[
            str | None,
            typer.Option(help="vLLM --speculative-config JSON (inline or file), instead of SPEC."),
        ] = None,
        json_output: Annotated[
            bool, typer.Option("--json", help="Print one JSON object (vLLM bench keys).")
        ] = False,
        out: Annotated[
            str | None,
            typer.Option(help="Write result.json, requests.csv, steps.parquet, config.json here."),
        ] = None,
        verbose: flags.Verbose = False,
        **given: Any,
    ) -> None:
        """Simulate one serving run (like `vllm bench serve`) from a profile and a K policy."""
        from dsd import api

        outcome = api.simulate(
            out=out,
            keep_steps=False,
            speculative_config=speculative_config,
            profile=profile,
            policy=policy,
            **_dataset(given),
        )
        typer.echo(api.run_text(outcome, as_json=json_output, verbose=verbose))

    @flags.command(
        app,
        "sweep",
        flags.SOURCE,
        flags.REQUESTS,
        flags.ARRIVALS,
        flags.ENGINE,
        flags.SIMULATOR,
        flags.HELD_OUT,
        flags.SEED,
    )
    def sweep(
        out: Annotated[
            str, typer.Option(help="Folder: cells/, grid.resolved.json, sweep.csv/.md, PNG.")
        ],
        grid: Annotated[
            str | None,
            typer.Option(help="TOML grid file (docs/sweeps.md) instead of the grid flags."),
        ] = None,
        profile: Annotated[
            str | None, typer.Option(help="Profile JSON (flag grid; a grid file names its own).")
        ] = None,
        policies: Annotated[
            str | None,
            typer.Option(
                help="Comma-separated policy SPECs (default static:0,static:3,goodput), each "
                f"{flags.POLICY_SPEC_HELP}."
            ),
        ] = None,
        max_concurrency: Annotated[
            str | None,
            typer.Option(help="Comma-separated concurrencies C (default 1,4,16,64)."),
        ] = None,
        num_prompts_per_concurrency: Annotated[
            int | None, typer.Option(help="num_prompts = this x C (default 20).")
        ] = None,
        workers: Annotated[
            int | None, typer.Option(help="Processes / Ray CPUs (default: CPU cores).")
        ] = None,
        ray: Annotated[
            bool, typer.Option("--ray", help="Run cells as Ray tasks (a local Ray by default).")
        ] = False,
        ray_address: Annotated[
            str | None,
            typer.Option(help="With --ray: the cluster to join (ray.init(address=...))."),
        ] = None,
        **given: Any,
    ) -> None:
        """Run a grid of simulations (a TOML grid, or policies x concurrencies from flags).

        Each finished cell is saved in OUT/cells/; re-running the same command skips them.
        """
        from dsd import api

        if profile is not None:
            given["profile"] = profile
        outcome = api.sweep(
            out,
            grid=grid,
            policies=None if policies is None else api.split_policy_list(policies),
            max_concurrency=None
            if max_concurrency is None
            else list(flags.int_list("--max-concurrency", max_concurrency, 1)),
            num_prompts_per_concurrency=num_prompts_per_concurrency,
            workers=workers,
            ray=ray,
            ray_address=ray_address,
            progress=flags.progress_bar,
            **_dataset(given),
        )
        columns = ["policy", "max_concurrency", "mean_tpot_ms", "output_throughput"]
        # the 90% interval of mean TPOT where the cells have one (--interval-runs)
        columns += [c for c in ("mean_tpot_ms_lo", "mean_tpot_ms_hi") if c in outcome.frame]
        shown = outcome.frame[columns]
        typer.echo(shown.to_string(index=False))
        typer.echo(
            f"{len(outcome.frame)} cells ({outcome.num_computed} run, {outcome.num_reused} "
            f"reused) in {outcome.elapsed_s:.1f} s; wrote {out}/"
        )
