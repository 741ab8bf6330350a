"""`dsd profile`: a pair measured into a profile (`dsd.api.profile`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dsd.cli import flags


def register(app: typer.Typer) -> None:
    """Add `profile` to the app."""

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
