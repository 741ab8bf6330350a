"""`dsd profile`, `dsd validate` and `dsd hardware-report`: a pair measured into a profile, the
simulator checked against the real engine or a `vllm bench serve` result, and the whole
real-hardware report (`dsd.api.profile`, `dsd.api.validate`, `dsd.api.validate_vllm`,
`dsd.api.hardware_report`).
"""

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
        typer.echo(
            f"{cell.policy:>16} C={cell.max_concurrency}: mean TPOT measured "
            f"{float(cell.measured.get('mean_tpot_ms', math.nan)):.3f} ms, simulated "
            f"{float(cell.simulated.get('mean_tpot_ms', math.nan)):.3f} ms, error "
            f"{cell.error_pct('mean_tpot_ms'):+.1f} %"
        )


def register(app: typer.Typer) -> None:
    """Add `profile` and `validate` to the app."""

    @flags.command(app, "profile", flags.PAIR, flags.SEED)
    def profile_command(
        out: Annotated[str, typer.Option(help="Profile JSON to write (atomic).")],
        batch_sizes: Annotated[str, typer.Option(help="B values, e.g. 1,4,16,64.")] = "1,4,16",
        k: Annotated[str, typer.Option("--k", help="K values; include 0, 1, K_max.")] = "0,1,3,5",
        context_lens: Annotated[str, typer.Option(help="Context tokens per row.")] = "128",
        prefill_tokens: Annotated[
            str, typer.Option(help="Prompt sizes for prefill.")
        ] = "32,128,512",
        dataset_name: Annotated[str, typer.Option(help="Prompts for acceptance.")] = "mt-bench",
        num_prompts: Annotated[int | None, typer.Option(help="Prompts to run.")] = None,
        output_len: Annotated[int | None, typer.Option(help="Output tokens per prompt.")] = None,
        warmup: Annotated[int, typer.Option(help="Untimed steps per point.")] = 3,
        iters: Annotated[int, typer.Option(help="Timed steps per point.")] = 10,
        max_remeasure: Annotated[
            int, typer.Option(help="Re-measurements of noisy or non-monotonic points.")
        ] = 2,
        allow_noisy_profile: Annotated[
            bool, typer.Option(help="Keep a profile that fails the timing checks.")
        ] = False,
        adaptive_target_pct: Annotated[
            float | None,
            typer.Option(
                help="Add B where the ITL table interpolates worst until every interior B is "
                "predicted from its neighbours within this % (default: the listed B only)."
            ),
        ] = None,
        adaptive_budget_s: Annotated[
            float, typer.Option(help="Seconds adaptive profiling may spend adding B.")
        ] = 600.0,
        host_overhead_output_len: Annotated[
            int, typer.Option(help="Output tokens per request of the loop runs (0: skip).")
        ] = 32,
        temperature: Annotated[float, typer.Option(help="Acceptance temperature.")] = 0.0,
        ignore_eos: Annotated[
            bool,
            typer.Option(help="Run every acceptance prompt to its output length past an EOS."),
        ] = False,
        fast_path: Annotated[str, typer.Option(help="off, eager, cuda-graphs.")] = "off",
        file_format: Annotated[
            str, typer.Option("--format", help="dsd-profile (native) or dsd-json (PR #32374).")
        ] = "dsd-profile",
        **given: Any,
    ) -> None:
        """Measure ITL(B, K, context), prefill and acceptance into a profile."""
        from dsd import api

        seed = given.pop("seed", 0)
        pair = api.load_pair(**given, seed=seed)
        measured = api.profile(
            pair,
            out=out,
            batch_sizes=flags.int_list("--batch-sizes", batch_sizes, 1),
            k=flags.int_list("--k", k, 0),
            context_lens=flags.int_list("--context-lens", context_lens, 1),
            prefill_tokens=flags.int_list("--prefill-tokens", prefill_tokens, 1),
            dataset=dataset_name,
            num_prompts=num_prompts,
            output_len=output_len,
            warmup=warmup,
            iters=iters,
            max_remeasure=max_remeasure,
            allow_noisy=allow_noisy_profile,
            adaptive_target_pct=adaptive_target_pct,
            adaptive_budget_s=adaptive_budget_s,
            host_overhead_output_len=host_overhead_output_len,
            temperature=temperature,
            ignore_eos=ignore_eos,
            seed=seed,
            fast_path=fast_path,
            file_format=file_format,
            progress=flags.progress_bar,
        )
        typer.echo(api.threads_text(given.get("threads"), str(pair.device)))
        typer.echo(api.profile_text(measured, out, file_format))

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
            progress=flags.progress_bar,
            **given,
        )
        _print_cells(cells)
        typer.echo(api.threads_text(pair_flags.get("threads"), str(pair.device)))
        typer.echo(f"wrote {out}/report.md")

    @app.command("hardware-report")
    def hardware_report_command(
        out: Annotated[str, typer.Option(help="Report folder, e.g. reports/validation/DATE-cpu.")],
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
        dataset_name: Annotated[str, typer.Option(help="Prompt set.")] = "instructcoder",
        quick: Annotated[
            bool, typer.Option(help="A small plan (about a minute): a dry run, not a result.")
        ] = False,
        trials: Annotated[
            int | None, typer.Option(help="Real runs per cell (default: the plan's, 5).")
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
            quick=quick,
            trials=trials,
            time_budget_s=time_budget,
            speedup_arms=speedup_arm,
            seed=seed,
            progress=flags.progress_bar,
            on_stage=lambda text: typer.echo(text, err=True),
        )
        typer.echo(f"wrote {len(written)} files into {out}/ (report.md first)")
