"""`dsd run`: a workload through the real SD engine in the simulator's loop (`dsd.api.run`).

Model specs (`--target`, `--draft`) are `dsd.backend.pair`'s; the workload, scheduler and
policy flags are the simulator's, and the same flags build the same engine. Prints the same
`vllm bench serve`-keyed result as `dsd simulate`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dsd.cli import flags
from dsd.cli.simulate import _dataset


def register(app: typer.Typer) -> None:
    """Add `run` to the app."""

    @flags.command(
        app,
        "run",
        flags.PAIR,
        flags.REAL,
        flags.SOURCE,
        flags.REQUESTS,
        flags.ARRIVALS,
        flags.ENGINE,
        flags.SEED,
    )
    def run_command(
        policy: Annotated[
            str,
            typer.Option(
                help=f"K policy SPEC (static: K = k_max every step): {flags.POLICY_SPEC_HELP}."
            ),
        ] = "static",
        profile: Annotated[
            str | None, typer.Option(help="Profile JSON (for policies that read one).")
        ] = None,
        ignore_eos: Annotated[bool, typer.Option(help="Never stop at EOS.")] = False,
        json_output: Annotated[bool, typer.Option("--json", help="Print the JSON.")] = False,
        out: Annotated[
            str | None,
            typer.Option(
                help="Write result.json, requests.csv, steps.parquet, config.json, "
                "outputs.jsonl (and learned_profile.json for a learning policy) here."
            ),
        ] = None,
        verbose: flags.Verbose = False,
        **given: Any,
    ) -> None:
        """Run a workload on the real SD engine and report vLLM bench metrics."""
        from dsd import api

        pair_flags, given = flags.split_flags(given, flags.PAIR_FLAGS)
        engine_flags = {k: given.pop(k) for k in ("temperature", "fast_path") if k in given}
        config = api.run_config(policy=policy, profile=profile, **_dataset(given))
        pair = api.load_pair(**pair_flags, seed=config.seed)
        outcome = api.run(pair, config, ignore_eos=ignore_eos, out=out, **engine_flags)
        typer.echo(api.threads_text(pair_flags.get("threads"), str(pair.device)), err=True)
        typer.echo(api.run_text(outcome, as_json=json_output, verbose=verbose))
