"""`dsd export vllm|trtllm|sglang` and `dsd policy explain` (`dsd.api.export_*`,
`dsd.api.explain_policy`).

`export vllm` prints vLLM's `--speculative-config` for a policy (default: goodput on the
profile) compiled to a range table for a max_num_seqs, or the profile as PR #32374's
`dynamic_speculative_config.json` (`--format dsd-json`). `export trtllm` and `export sglang`
print the same table as TensorRT-LLM's `draft_len_schedule` and SGLang's adaptive config.
`policy explain` prints B -> K*, AL, ITL and goodput.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dsd.cli import flags
from dsd.common import strict_json

export_app = typer.Typer(
    help="Export profiles and policies to vLLM's, TensorRT-LLM's and SGLang's formats.",
    no_args_is_help=True,
)
policy_app = typer.Typer(help="Inspect K policies.", no_args_is_help=True)

ProfileFile = Annotated[Path, typer.Option(help="Profile JSON (native or PR #32374).")]
MaxNumSeqs = Annotated[int, typer.Option(help="vLLM's max_num_seqs (the largest B).")]
PolicySpec = Annotated[str, typer.Option(help=f"Policy SPEC: {flags.POLICY_SPEC_HELP}.")]
Method = Annotated[
    str | None, typer.Option(help="vLLM spec method, e.g. eagle (mapped to the engine's name).")
]
DraftModel = Annotated[str | None, typer.Option(help="Draft model name/path.")]
Out = Annotated[
    str | None,
    typer.Option(help="Write this file (atomically) instead of stdout; not a folder."),
]
FORMATS = ("speculative-config", "dsd-json")


@export_app.command("vllm")
def export_vllm(
    profile: ProfileFile,
    max_num_seqs: MaxNumSeqs,
    policy: PolicySpec = "goodput",
    method: Method = None,
    draft_model: DraftModel = None,
    output_format: Annotated[
        str, typer.Option("--format", help="speculative-config or dsd-json (PR #32374).")
    ] = "speculative-config",
    out: Out = None,
) -> None:
    """Print vLLM's --speculative-config for a policy, or the profile in PR #32374 form."""
    from dsd import api
    from dsd.common.errors import require_choice

    require_choice(output_format, "--format", FORMATS)
    _check_out(out)
    if output_format == "dsd-json":
        text = strict_json.dumps(api.export_pr32374(profile), indent=4) + "\n"
    else:
        config = api.export_vllm(
            profile,
            max_num_seqs=max_num_seqs,
            policy=policy,
            method=method,
            draft_model=draft_model,
        )
        text = strict_json.dumps(config) + "\n"
    _write(text, out)


def _check_out(out: str | None) -> None:
    """A folder, '' or 'dir/' is refused before anything is computed."""
    from dsd.common.user_paths import check_output_file

    if out is not None:
        check_output_file(out, "--out")


def _write(text: str, out: str | None) -> None:
    from dsd.common.atomic import atomic_write_text

    if out is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(out, text)


@export_app.command("trtllm")
def export_trtllm(
    profile: ProfileFile,
    max_num_seqs: MaxNumSeqs,
    policy: PolicySpec = "goodput",
    method: Method = None,
    draft_model: DraftModel = None,
    out: Out = None,
) -> None:
    """Print TensorRT-LLM's draft_len_schedule for a policy.

    The object is TensorRT-LLM's extra_llm_api_options (trtllm-serve --config FILE):
    max_batch_size and speculative_config with draft_len_schedule, the same K at every B as
    `export vllm`.

    max_draft_len is the K at B=1; a table with a larger K at some B, or K=0 at B=1, cannot be
    expressed and is refused. Without --method, add speculative_config.decoding_type yourself.
    """
    from dsd import api

    _check_out(out)

    config = api.export_trtllm(
        profile, max_num_seqs=max_num_seqs, policy=policy, method=method, draft_model=draft_model
    )
    _write(strict_json.dumps(config) + "\n", out)


@export_app.command("sglang")
def export_sglang(
    profile: ProfileFile,
    max_num_seqs: MaxNumSeqs,
    policy: PolicySpec = "goodput",
    method: Method = None,
    draft_model: DraftModel = None,
    out: Out = None,
) -> None:
    """Print SGLang's --speculative-adaptive-config for a policy.

    One slot per range of `export vllm`'s table, keyed by its first B, with that range's K as
    the only candidate step.

    The launch flags go to stderr. SGLang picks a slot by the batch size padded to its next
    captured CUDA graph: the table holds at every B only when each range's last B (but the
    last range's) is in --cuda-graph-bs, or with --disable-cuda-graph; otherwise a B between two
    captured sizes takes the K of the larger. --method: eagle, eagle3 or mtp.
    """
    from dsd import api

    _check_out(out)

    config = api.export_sglang(profile, max_num_seqs=max_num_seqs, policy=policy, method=method)
    _write(strict_json.dumps(config) + "\n", out)
    note = api.sglang_launch_note(
        config,
        max_num_seqs,
        method=method,
        draft_model=draft_model,
        config_path="FILE" if out is None else str(out),
    )
    sys.stderr.write(f"note: {note}\n")


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
    console.print(f"range table: {strict_json.dumps(explained.range_table)}", soft_wrap=True)
    if explained.held_out:
        console.print(explained.held_out, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `dsd export ...` and `dsd policy ...`."""
    app.add_typer(export_app, name="export")
    app.add_typer(policy_app, name="policy")
