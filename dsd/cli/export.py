"""`dsd export vllm` and `dsd policy explain`: wiring and formatting only.

`export vllm` compiles a policy (default: goodput on the profile) to vLLM's range table for a
max_num_seqs and prints one JSON object usable as `--speculative-config`, or writes the
profile as PR #32374's `dynamic_speculative_config.json` (`--format dsd-json`). `policy explain`
prints B -> K*, AL, ITL and goodput. The logic lives in `policies` and `backend.vllm`.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from dsd.backend.vllm import profile_to_pr32374, speculative_config
from dsd.common.atomic import atomic_write_text
from dsd.common.errors import InputError
from dsd.policies.profile_io import load_profile
from dsd.policies.range_table import compile_range_table, evaluate_policy
from dsd.policies.spec import parse_policy
from dsd.policies.types import MAX_NUM_SEQS

export_app = typer.Typer(
    help="Export profiles and policies to vLLM's formats.", no_args_is_help=True
)
policy_app = typer.Typer(help="Inspect K policies.", no_args_is_help=True)


class ExportFormat(StrEnum):
    speculative_config = "speculative-config"
    dsd_json = "dsd-json"


def _check_max_num_seqs(max_num_seqs: int) -> None:
    if not 1 <= max_num_seqs <= MAX_NUM_SEQS:
        raise InputError(f"--max-num-seqs must be in [1, {MAX_NUM_SEQS}], got {max_num_seqs}")


def _emit(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(out, text)


@export_app.command("vllm")
def export_vllm(
    profile: Path = typer.Option(..., "--profile", help="Profile JSON (native or PR #32374)."),
    max_num_seqs: int = typer.Option(..., "--max-num-seqs", help="vLLM's max_num_seqs."),
    policy: str = typer.Option("goodput", "--policy", help="Policy SPEC (see docs/policies.md)."),
    method: str | None = typer.Option(None, "--method", help="vLLM spec method, e.g. eagle."),
    draft_model: str | None = typer.Option(None, "--draft-model", help="Draft model name/path."),
    output_format: ExportFormat = typer.Option(
        ExportFormat.speculative_config, "--format", help="What to write."
    ),
    out: Path | None = typer.Option(None, "--out", help="Write here (atomically), not stdout."),
) -> None:
    """Print vLLM's --speculative-config for a policy, or the profile in PR #32374 form."""
    _check_max_num_seqs(max_num_seqs)
    loaded = load_profile(profile)
    if output_format is ExportFormat.dsd_json:
        _emit(json.dumps(profile_to_pr32374(loaded), indent=4) + "\n", out)
        return
    chosen = parse_policy(policy, profile=loaded, k_max=loaded.k_max, max_num_seqs=max_num_seqs)
    table = compile_range_table(chosen, loaded.k_max, max_num_seqs)
    config = speculative_config(table, loaded.k_max, method=method, draft_model=draft_model)
    _emit(json.dumps(config) + "\n", out)


def _rows_to_show(
    batch_sizes: list[int], k_star: np.ndarray, profiled: set[int], show_all: bool
) -> list[int]:
    """Every B with --all; else B=1, profiled B, each B where K* changes, and the last B."""
    if show_all:
        return batch_sizes
    keep = {1, batch_sizes[-1]} | (profiled & set(batch_sizes))
    keep |= {b for b in batch_sizes[1:] if k_star[b - 1] != k_star[b - 2]}
    return sorted(keep)


@policy_app.command("explain")
def explain(
    profile: Path = typer.Option(..., "--profile", help="Profile JSON (native or PR #32374)."),
    max_num_seqs: int = typer.Option(..., "--max-num-seqs", help="Largest B to show."),
    policy: str = typer.Option("goodput", "--policy", help="Policy SPEC (see docs/policies.md)."),
    show_all: bool = typer.Option(False, "--all", help="One row per B instead of the changes."),
) -> None:
    """Table of B -> K, AL, ITL ms and goodput of a policy under the profile."""
    _check_max_num_seqs(max_num_seqs)
    loaded = load_profile(profile)
    chosen = parse_policy(policy, profile=loaded, k_max=loaded.k_max, max_num_seqs=max_num_seqs)
    evaluated = evaluate_policy(chosen, loaded, max_num_seqs)
    profiled = set(loaded.batch_sizes())
    batch_sizes = [int(b) for b in evaluated.batch_sizes]
    table = Table(
        title=f"{policy} on {profile.name} (K_max={loaded.k_max}, max_num_seqs={max_num_seqs})"
    )
    for column in ("B", "K", "AL", "ITL ms", "goodput tok/s/req", "best K", "note"):
        table.add_column(column, justify="left" if column == "note" else "right")
    for batch_size in _rows_to_show(batch_sizes, evaluated.k_star, profiled, show_all):
        row = batch_size - 1
        k = int(evaluated.k_star[row])
        best_k = int(np.argmax(evaluated.goodput_by_k[row]))
        notes = []
        if batch_size in profiled:
            notes.append("profiled")
        if row > 0 and k != int(evaluated.k_star[row - 1]):
            notes.append("K changes")
        table.add_row(
            str(batch_size),
            str(k),
            f"{evaluated.acceptance_length[row]:.3f}",
            f"{evaluated.itl_ms[row]:.2f}",
            f"{evaluated.goodput[row] * 1000.0:.1f}",
            str(best_k),
            ", ".join(notes),
        )
    console = Console(width=120)
    console.print(table)
    ranges = compile_range_table(chosen, loaded.k_max, max_num_seqs)
    console.print(f"range table: {json.dumps(ranges)}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `dsd export ...` and `dsd policy ...`."""
    app.add_typer(export_app, name="export")
    app.add_typer(policy_app, name="policy")
