"""`dsd hardware-report`: the whole real-hardware report in one folder
(`dsd.api.hardware_report`: profile, B = 1 speedup, crossover, simulated vs measured TPOT)."""

from __future__ import annotations

from typing import Annotated

import typer

from dsd.cli import flags


def register(app: typer.Typer) -> None:
    """Add `hardware-report` to the app."""

    @app.command("hardware-report")
    def hardware_report_command(
        out: Annotated[str, typer.Option(help="Report folder, e.g. results/validation/DATE-cpu.")],
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        target: Annotated[str, typer.Option(help="Target model spec.")] = "smollm2-135m",
        draft: Annotated[str, typer.Option(help="Draft spec.")] = "ngram:2-6",
        dtype: Annotated[
            str, typer.Option(help="auto (bfloat16 on CUDA, float32 on CPU), float32, ...")
        ] = "auto",
        fast_path: Annotated[
            str, typer.Option(help="Decode path: off (reference), eager, cuda-graphs.")
        ] = "off",
        threads: Annotated[
            int | None, typer.Option(help="torch CPU threads (default: 1 on CPU).")
        ] = None,
        dataset_name: Annotated[
            str | None,
            typer.Option(help="Prompt set (default: the plan's; instructcoder, or mt-bench)."),
        ] = None,
        profile_dataset_name: Annotated[
            str | None,
            typer.Option(
                help="Prompt set of the profile's acceptance run (default: --dataset-name); "
                "another set than the cells' is a transfer report."
            ),
        ] = None,
        quick: Annotated[
            bool, typer.Option(help="A small plan (about a minute): a dry run, not a result.")
        ] = False,
        trials: Annotated[
            int | None, typer.Option(help="Real runs per cell (default: the plan's, 1).")
        ] = None,
        time_budget: Annotated[
            float | None,
            typer.Option(
                help="Seconds the whole report may take: no trial round starts that would end "
                "past it (at least one runs; config.json's trials_done says how many)."
            ),
        ] = None,
        speedup_arm: Annotated[
            list[str] | None,
            typer.Option(
                help="A B=1 arm beside the report's draft, 'DRAFT POLICY [K_MAX]' (repeatable), "
                "e.g. 'ngram:3-10 static:10'."
            ),
        ] = None,
        seed: Annotated[int, typer.Option(help="Run seed.")] = 0,
        plan: Annotated[
            str,
            typer.Option(
                help="full, or production (PR #32374's experiment at production shapes, "
                "acceptance drawn from its rates: tokens meaningless)."
            ),
        ] = "full",
        stage: Annotated[
            str,
            typer.Option(
                help="all; profile (then stop); cells (on the profile.json a profile stage "
                "left in --out)."
            ),
        ] = "all",
        prompts_per_concurrency: Annotated[
            int | None,
            typer.Option(help="N x C requests a cell instead of the plan's (default: the plan's)."),
        ] = None,
    ) -> None:
        """Profile, B=1 speedup, crossover and simulated-vs-measured TPOT in one report."""
        from dsd import api

        written = api.hardware_report(
            out=out,
            device=device,
            target=target,
            draft=draft,
            dtype=dtype,
            fast_path=fast_path,
            threads=threads,
            dataset=dataset_name,
            profile_dataset=profile_dataset_name,
            quick=quick,
            trials=trials,
            time_budget_s=time_budget,
            speedup_arms=speedup_arm,
            seed=seed,
            plan=plan,
            stage=stage,
            prompts_per_concurrency=prompts_per_concurrency,
            progress=flags.progress_bar,
            on_stage=lambda text: typer.echo(text, err=True),
        )
        typer.echo(f"wrote {len(written)} files into {out}/ (report.md first)")
