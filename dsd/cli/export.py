"""`dsd export vllm` and `dsd policy explain` (`dsd.api.export_vllm`, `dsd.api.explain_policy`).

`export vllm` prints vLLM's `--speculative-config` for a policy (default: goodput on the
profile) compiled to a range table for a max_num_seqs, or the profile as PR #32374's
`dynamic_speculative_config.json` (`--format dsd-json`). `policy explain` prints B -> K*, AL,
ITL and goodput.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

export_app = typer.Typer(
    help="Export profiles and policies to vLLM's formats.", no_args_is_help=True
)
policy_app = typer.Typer(help="Inspect K policies.", no_args_is_help=True)

ProfileFile = Annotated[Path, typer.Option(help="Profile JSON (native or PR #32374).")]
MaxNumSeqs = Annotated[int, typer.Option(help="vLLM's max_num_seqs (the largest B).")]
PolicySpec = Annotated[str, typer.Option(help="Policy SPEC (see docs/policies.md).")]
FORMATS = ("speculative-config", "dsd-json")


@export_app.command("vllm")
def export_vllm(
    profile: ProfileFile,
    max_num_seqs: MaxNumSeqs,
    policy: PolicySpec = "goodput",
    method: Annotated[str | None, typer.Option(help="vLLM spec method, e.g. eagle.")] = None,
    draft_model: Annotated[str | None, typer.Option(help="Draft model name/path.")] = None,
    output_format: Annotated[
        str, typer.Option("--format", help="speculative-config or dsd-json (PR #32374).")
    ] = "speculative-config",
    out: Annotated[
        str | None,
        typer.Option(help="Write this file (atomically) instead of stdout; not a folder."),
    ] = None,
) -> None:
    """Print vLLM's --speculative-config for a policy, or the profile in PR #32374 form."""
    from dsd import api
    from dsd.common.atomic import atomic_write_text
    from dsd.common.errors import require_choice
    from dsd.common.user_paths import check_output_file

    require_choice(output_format, "--format", FORMATS)
    if out is not None:  # a folder, '' or 'dir/' is refused before anything is computed
        check_output_file(out, "--out")
    if output_format == "dsd-json":
        text = json.dumps(api.export_pr32374(profile), indent=4) + "\n"
    else:
        config = api.export_vllm(
            profile,
            max_num_seqs=max_num_seqs,
            policy=policy,
            method=method,
            draft_model=draft_model,
        )
        text = json.dumps(config) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(out, text)


@policy_app.command("explain")
def explain(
    profile: ProfileFile,
    max_num_seqs: MaxNumSeqs,
    policy: PolicySpec = "goodput",
    show_all: Annotated[
        bool, typer.Option("--all", help="One row per B instead of the changes.")
    ] = False,
) -> None:
    """Table of B -> K, AL, ITL ms and goodput of a policy under the profile."""
    from rich.console import Console
    from rich.table import Table

    from dsd import api

    explained = api.explain_policy(
        profile, max_num_seqs=max_num_seqs, policy=policy, show_all=show_all
    )
    table = Table(
        title=f"{policy} on {profile.name} (K_max={explained.k_max}, max_num_seqs={max_num_seqs})"
    )
    formats = {"AL": "{:.3f}", "ITL ms": "{:.2f}", "goodput tok/s/req": "{:.1f}"}
    for column in explained.frame.columns:
        table.add_column(column, justify="left" if column == "note" else "right")
    for row in explained.frame.itertuples(index=False):
        table.add_row(
            *(
                formats.get(column, "{}").format(value)
                for column, value in zip(explained.frame.columns, row, strict=True)
            )
        )
    console = Console(width=120)
    console.print(table)
    console.print(f"range table: {json.dumps(explained.range_table)}", soft_wrap=True)
    if explained.held_out:
        console.print(explained.held_out, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `dsd export ...` and `dsd policy ...`."""
    app.add_typer(export_app, name="export")
    app.add_typer(policy_app, name="policy")
