"""Every flag of the `dsd` command, declared once, and the `command` decorator that adds them.

A flag is a name (the API's keyword: a `RunConfig` field, a `WorkloadOptions` knob, or an API
argument), its type with its `typer.Option` (spelling, help) and its default. Flags come in
groups (`SOURCE`, `REQUESTS`, `ARRIVALS`, `ENGINE`, `SIMULATOR`, `HELD_OUT`, `PAIR`, `REAL`,
`SEED`); a command lists the groups it takes, like vLLM's benchmarks share `add_dataset_parser`:

    @command(app, "simulate", SOURCE, REQUESTS, ARRIVALS, ENGINE, SIMULATOR, SEED)
    def simulate(profile: Profile, **flags: Any) -> None: ...

The command receives only the group flags the user gave (so the API's defaults apply, and a
grid file can refuse flags given beside it); its own parameters arrive as usual. This module
imports no dsd package beyond `common` (the CLI starts fast and calls `dsd.api` inside each
command), and holds no logic beyond turning flag text into values.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from dsd.common.errors import int_list as int_list
from dsd.common.progress import Advance


@dataclass(frozen=True)
class Flag:
    """One flag: its annotation (type + typer.Option) and default."""

    annotation: Any  # Annotated[type, typer.Option(...)]
    default: Any


FlagGroup = dict[str, Flag]


def option(kind: Any, default: Any, help_text: str, *spelling: str) -> Flag:
    return Flag(Annotated[kind, typer.Option(*spelling, help=help_text)], default)


# --- where the requests come from (the simulator's, run's and validate's workload) -------------
SOURCE: FlagGroup = {
    "dataset_name": option(
        str | None,
        None,
        "Workload: a prompt set, trace or generator name (docs/workloads.md), or a "
        ".csv/.parquet/.jsonl file. Default mt-bench.",
    ),
    "dataset_path": option(str | None, None, "Workload file (vLLM's --dataset-path)."),
}

# --- what the requests are (REQUEST_SHAPE: all but how many) -----------------------------------
REQUEST_SHAPE: FlagGroup = {
    "output_len": option(int | None, None, "Override every request's max_tokens."),
    "raw_prompt": option(
        bool, False, "Prompt-set lengths without the chat template.", "--raw-prompt"
    ),
    "shuffle": option(bool, False, "Permute a prompt set with the seed.", "--shuffle"),
    "random_input_len": option(int, 1024, "random: mean prompt tokens."),
    "random_output_len": option(int, 128, "random: mean output tokens."),
    "random_range_ratio": option(float, 0.0, "random: lengths in [L(1-r), L(1+r)]."),
    "time_scale": option(float, 1.0, "Traces: rate multiplier (2 = twice as fast)."),
    "start_s": option(float, 0.0, "Traces: window start, s since the first row."),
    "end_s": option(float, math.inf, "Traces: window end (exclusive), s."),
    "fraction": option(float | None, None, "Traces: keep this share of rows (seeded)."),
    "num_rows": option(int | None, None, "Traces: keep this many rows (seeded)."),
    "max_prompt_len": option(int | None, None, "Traces: clip prompt tokens."),
    "max_output_len": option(int | None, None, "Traces: clip output tokens."),
    "rollout_dist": option(str, "lognormal", "rl-rollout: lognormal or pareto."),
    "rollout_median": option(float, 1024.0, "rl-rollout: lognormal median output."),
    "rollout_sigma": option(float, 1.0, "rl-rollout: lognormal sigma."),
    "rollout_alpha": option(float, 1.5, "rl-rollout: Pareto tail index."),
    "rollout_min": option(float, 256.0, "rl-rollout: Pareto minimum length."),
    "rollout_max": option(int, 16384, "rl-rollout: output cap (max_tokens)."),
    "rollout_prompt_len": option(int, 512, "rl-rollout: fixed prompt tokens."),
    "rollout_prompt_set": option(
        str | None, None, "rl-rollout: take prompts from this set instead."
    ),
}

REQUESTS: FlagGroup = {
    "num_prompts": option(
        int | None, None, "Requests to send (default: the whole set; random 1000, rl-rollout 256)."
    ),
    **REQUEST_SHAPE,
}

# --- when they arrive -------------------------------------------------------------------------
# the send times alone (`traces show`: a cap on requests in flight is the client's)
ARRIVAL_TIMES: FlagGroup = {
    "request_rate": option(
        float, math.inf, "Mean requests/s; inf sends all at once (a trace keeps its own times)."
    ),
    "burstiness": option(float, 1.0, "Gamma shape of arrival gaps; 1.0 = Poisson."),
}
ARRIVALS: FlagGroup = {
    "max_concurrency": option(int | None, None, "Cap on requests in flight."),
    **ARRIVAL_TIMES,
}

# --- the engine: scheduler limits and what the policy plans with --------------------------------
ENGINE: FlagGroup = {
    "scheduling": option(str, "sync", "sync or async (vLLM async scheduling)."),
    "k_timing": option(
        str,
        "next-step",
        "When a step's K is verified: next-step (vLLM: drafted after the step, verified at the "
        "next) or same-step (sync only).",
    ),
    "scheduler": option(
        str,
        "dsd",
        "Whose scheduler plans the steps: dsd (fast) or vllm (vLLM 0.33's own, installed; "
        "simulator only).",
    ),
    "speculative_method": option(
        str,
        "ngram",
        "vLLM drafting method, for the KV lookahead and budget slots its scheduler reserves per "
        "row: ngram (none), eagle, eagle3, mtp, draft_model, pard, p-eagle (a "
        "--speculative-config's method sets it too).",
    ),
    "max_num_seqs": option(int | None, None, "Running-set cap (default 256)."),
    "max_num_batched_tokens": option(int, 8192, "Token budget per step."),
    "max_model_len": option(
        int | None, None, "Longest context (default: longest request + k_max + 1)."
    ),
    "num_kv_blocks": option(
        int | None, None, "KV pool in 16-token blocks (default: no preemption)."
    ),
    "k_max": option(
        int | None,
        None,
        "k_max, num_speculative_tokens (default: the profile's, else 4, raised to a static K or "
        "a range table's largest K).",
        "--num-spec-tokens",
    ),
    "latency_model": option(str, "auto", "Profile latency model: auto, table or parametric."),
}

# --- the simulator's executor -----------------------------------------------------------------
SIMULATOR: FlagGroup = {
    "acceptance_model": option(
        str,
        "heterogeneous",
        "heterogeneous, per-position, empirical (the profile's requests) or replay.",
    ),
    "host_overhead_ms": option(
        float | None,
        None,
        "Extra host time per step, ms (default: the profile's measured model, if any).",
    ),
    "host_planning_ms": option(
        float | None,
        None,
        "The part of --host-overhead-ms spent planning the step, which async scheduling "
        "overlaps with the previous step (default 0; the measured model has its own split).",
    ),
    "jitter_sigma": option(
        float, 0.0, "Lognormal step-latency noise sigma (0: none).", "--latency-jitter"
    ),
    "interval_runs": option(
        int,
        0,
        "Re-runs on seeds derived from --seed for a 90% prediction interval of the figures "
        "(each costs one simulation; 0: none; validate: 8 unless given).",
    ),
}

# --- which prompts a simulated run takes (validate: held out unless its own --in-sample) -------
HELD_OUT: FlagGroup = {
    "held_out_prompts": option(
        bool,
        False,
        "Leave out the prompts the profile's acceptance run recorded (predict prompts it never "
        "saw).",
        "--held-out-prompts",
    ),
}

# Where a help text names every registered K policy: `dsd.cli.app` fills it from the registry
# (`policies.spec.POLICY_BUILDERS`) when help is shown, so no other start imports the policies.
POLICY_NAMES = "{policy_names}"
# A policy SPEC's help: its grammar and the names
POLICY_SPEC_HELP = f"NAME[:ARGUMENT], NAME one of {POLICY_NAMES} (docs/policies.md)"

# `dsd simulate` and `dsd run`: the latency model chosen and why, which config.json always holds
Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="Also print the latency model and why (config.json has it)."
    ),
]

# --- a real model pair --------------------------------------------------------------------------
PAIR: FlagGroup = {
    "target": option(
        str | None, None, "Target model: a named shape, smollm2-135m, a .gguf file or a folder."
    ),
    "draft": option(
        str,
        "none",
        "Draft: a model spec, early-exit:N, ngram[:MIN-MAX], eagle[:FILE], eagle+ngram[:MIN-MAX], "
        "or none.",
    ),
    "device": option(str, "cpu", "cpu or cuda."),
    "dtype": option(str, "auto", "auto, float32, bfloat16, float16."),
    "threads": option(
        int | None,
        None,
        "torch CPU threads (default: 1 on CPU, which cannot oversubscribe; torch's on CUDA); "
        "recorded with the results.",
    ),
}

# --- how the real engine runs -------------------------------------------------------------------
REAL: FlagGroup = {
    "temperature": option(float, 0.0, "0: greedy; > 0: sampling."),
    "fast_path": option(str, "off", "Decode path: off (reference), eager, cuda-graphs."),
}

SEED: FlagGroup = {
    "seed": option(int, 0, "Run seed: roots every random stream (workload, acceptance, weights)."),
}

WORKLOAD = {**REQUESTS, **ARRIVALS}
PAIR_FLAGS = frozenset(PAIR)
# API fields of commands' own parameters whose flag is not the field's name with dashes
OWN_FIELD_FLAGS = {
    "time_budget_s": "--time-budget",
    "speedup_arms": "--speedup-arm",
    "file_format": "--format",
    "dataset": "--dataset-name",
    "profile_dataset": "--profile-dataset-name",
}


def flag_of(field: str) -> str:
    """The flag a user types for an API field (`k_max` -> `--num-spec-tokens`)."""
    for group in (SOURCE, REQUEST_SHAPE, REQUESTS, ARRIVALS, ENGINE, SIMULATOR, PAIR, REAL, SEED):
        if field in group:
            info = group[field].annotation.__metadata__[0]
            # with Annotated, typer keeps the first spelling as `default`, the rest as param_decls
            spelled = [
                decl
                for decl in (info.default, *info.param_decls)
                if isinstance(decl, str) and decl.startswith("--")
            ]
            return spelled[0] if spelled else "--" + field.replace("_", "-")
    return OWN_FIELD_FLAGS.get(field, "--" + field.replace("_", "-"))


def command(
    parent: typer.Typer, name: str, *groups: FlagGroup
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register `fn(own params..., **flags)` as `parent`'s command `name` with the groups'
    flags added; `flags` holds only the group flags the user gave."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        own = [
            p
            for p in inspect.signature(fn, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        own_names = {p.name for p in own}
        group_flags = {n: f for group in groups for n, f in group.items() if n not in own_names}
        parameters = [
            inspect.Parameter(
                "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
            ),
            *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own),
            *(
                inspect.Parameter(
                    n, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.annotation
                )
                for n, f in group_flags.items()
            ),
        ]

        @functools.wraps(fn)
        def run(ctx: typer.Context, **values: Any) -> None:
            given = {
                n: values[n]
                for n in group_flags
                if getattr(ctx.get_parameter_source(n), "name", "DEFAULT")
                not in ("DEFAULT", "DEFAULT_MAP")
            }
            fn(**{n: values[n] for n in own_names}, **given)

        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        parent.command(name)(run)
        return fn

    return decorate


def split_flags(
    flags: dict[str, Any], names: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the flags named in `names`, the rest)."""
    return (
        {k: v for k, v in flags.items() if k in names},
        {k: v for k, v in flags.items() if k not in names},
    )


# Off a terminal (a log file, CI), a line at most this often instead of a bar
LOG_PROGRESS_EVERY_S = 60.0


@contextlib.contextmanager
def progress_bar(total: int, title: str) -> Iterator[Advance]:
    """A `ProgressFactory` drawing a rich progress bar on stderr (gone when done). When stderr
    is not a terminal, where rich draws nothing, one line per `LOG_PROGRESS_EVERY_S` of work
    instead (`title: done/total label, elapsed`): work shorter than that prints nothing."""
    import sys
    import time

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if not Console(stderr=True).is_terminal:
        started_s = last_s = time.monotonic()
        done = 0

        def log_line(label: str, more: int = 0) -> None:
            nonlocal done, last_s, total
            done += 1
            total += more
            now_s = time.monotonic()
            if now_s - last_s >= LOG_PROGRESS_EVERY_S:
                last_s = now_s
                elapsed = f"{now_s - started_s:.0f} s"
                print(f"{title}: {done}/{total} {label}, {elapsed}", file=sys.stderr, flush=True)

        yield log_line
        return
    progress = Progress(
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with progress:
        task = progress.add_task("", total=total)

        def advance(label: str, more: int = 0) -> None:
            nonlocal total
            total += more
            progress.update(task, total=total, advance=1, description=label)

        yield advance
