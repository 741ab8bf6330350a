"""The workload flags of `dsd simulate`, `dsd sweep`, `dsd traces ...` and `dsd run`, declared once.

Each flag is an `Annotated[...]` alias (its type and its `typer.Option` with the help text).
A command lists the aliases it takes in its signature with the default `WorkloadFlags` gives
the field of the same name: typer reads defaults only from the signature, and
tests/cli/test_options.py checks every command's declaration (flag name, default, help)
against this module. `WorkloadFlags.from_values` collects a command's values (its `locals()`)
and `WorkloadFlags.arguments` turns them into the keyword arguments that both
`traces.registry.build_workload` and `sim.runner.SimulationConfig` take (the `RandomLengths`,
`TraceOptions` and `RolloutConfig` objects among them), so a new workload flag is an alias, a
field and a line in `arguments`, plus its line in each command's signature.

Deliberately not here: the workload source (a positional argument of `dsd traces`,
`--dataset-name`/`--dataset-path` of the simulator, `--dataset-name` of `dsd run`, each
resolved by its command), `--seed`'s help (the seed roots different streams in each command),
and every flag that is not about the workload (scheduler, latency, model, output flags).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from dsd.common.errors import InputError
from dsd.traces.datasets import RandomLengths
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import KNOWN_NAMES
from dsd.traces.rollout import RolloutConfig

# The simulator's workload when neither --dataset-name nor --dataset-path is given.
DEFAULT_DATASET = "mt-bench"

ROLLOUT_DISTRIBUTIONS = ("lognormal", "pareto")

# --- the simulator's workload source -----------------------------------------------------------
DatasetName = Annotated[
    str | None,
    typer.Option(help=f"Workload: {', '.join(KNOWN_NAMES)}, or a .csv/.parquet/.jsonl file."),
]
DatasetPath = Annotated[
    str | None, typer.Option(help="Workload file (vLLM's --dataset-path); same as a file name.")
]

# --- how many requests, when they arrive ---------------------------------------------------------
NumPrompts = Annotated[
    int | None,
    typer.Option(help="Requests to send (default: the whole set; random 1000, rl-rollout 256)."),
]
MaxConcurrency = Annotated[int | None, typer.Option(help="Cap on requests in flight.")]
RequestRate = Annotated[
    float,
    typer.Option(help="Mean requests/s; inf sends all at once (a trace keeps its own times)."),
]
Burstiness = Annotated[float, typer.Option(help="Gamma shape of arrival gaps; 1.0 = Poisson.")]
OutputLen = Annotated[int | None, typer.Option(help="Override every request's max_tokens.")]

# --- prompt sets and the `random` dataset --------------------------------------------------------
RawPrompt = Annotated[
    bool, typer.Option("--raw-prompt", help="Prompt-set lengths without the chat template.")
]
Shuffle = Annotated[bool, typer.Option("--shuffle", help="Permute a prompt set with the seed.")]
RandomInputLen = Annotated[int, typer.Option(help="random: mean prompt tokens.")]
RandomOutputLen = Annotated[int, typer.Option(help="random: mean output tokens.")]
RandomRangeRatio = Annotated[float, typer.Option(help="random: lengths in [L(1-r), L(1+r)].")]

# --- traces and workload files -------------------------------------------------------------------
TimeScale = Annotated[float, typer.Option(help="Traces: rate multiplier (2 = twice as fast).")]
StartS = Annotated[float, typer.Option(help="Traces: window start, s since the first row.")]
EndS = Annotated[float, typer.Option(help="Traces: window end (exclusive), s.")]
Fraction = Annotated[float | None, typer.Option(help="Traces: keep this share of rows (seeded).")]
NumRows = Annotated[int | None, typer.Option(help="Traces: keep this many rows (seeded).")]
MaxPromptLen = Annotated[int | None, typer.Option(help="Traces: clip prompt tokens.")]
MaxOutputLen = Annotated[int | None, typer.Option(help="Traces: clip output tokens.")]

# --- the rl-rollout workload ---------------------------------------------------------------------
RolloutDist = Annotated[str, typer.Option(help="rl-rollout: lognormal or pareto.")]
RolloutMedian = Annotated[float, typer.Option(help="rl-rollout: lognormal median output.")]
RolloutSigma = Annotated[float, typer.Option(help="rl-rollout: lognormal sigma.")]
RolloutAlpha = Annotated[float, typer.Option(help="rl-rollout: Pareto tail index.")]
RolloutMin = Annotated[float, typer.Option(help="rl-rollout: Pareto minimum length.")]
RolloutMax = Annotated[int, typer.Option(help="rl-rollout: output cap (max_tokens).")]
RolloutPromptLen = Annotated[int, typer.Option(help="rl-rollout: fixed prompt tokens.")]
RolloutPromptSet = Annotated[
    str | None, typer.Option(help="rl-rollout: take prompts from this set instead.")
]


@dataclasses.dataclass(frozen=True)
class WorkloadFlags:
    """The values of the workload flags of one command; a flag it lacks keeps the default here.

    The defaults are the commands' flag defaults (checked by tests/cli/test_options.py) and the
    defaults of the traces objects they become. Field checks beyond --rollout-dist happen where
    the values land (RandomLengths, TraceOptions, RolloutConfig, build_workload,
    SimulationConfig), so every command reports them with the same message.
    """

    num_prompts: int | None = None  # --num-prompts: requests (None: the workload's own count)
    max_concurrency: int | None = None  # --max-concurrency: cap on requests in flight
    request_rate: float = math.inf  # --request-rate: mean requests/s (inf: all at 0)
    burstiness: float = 1.0  # --burstiness: gamma shape of arrival gaps (1 = Poisson)
    output_len: int | None = None  # --output-len: every request's max_tokens (None: dataset's)
    raw_prompt: bool = False  # --raw-prompt: prompt-set lengths without the chat template
    shuffle: bool = False  # --shuffle: permute a prompt set with the seed
    random_input_len: int = 1024  # --random-input-len: `random` mean prompt tokens
    random_output_len: int = 128  # --random-output-len: `random` mean output tokens
    random_range_ratio: float = 0.0  # --random-range-ratio: `random` length spread r
    time_scale: float = 1.0  # --time-scale: trace rate multiplier
    start_s: float = 0.0  # --start-s: trace window start, s since the first row
    end_s: float = math.inf  # --end-s: trace window end (exclusive), s
    fraction: float | None = None  # --fraction: share of trace rows kept (seeded)
    num_rows: int | None = None  # --num-rows: trace rows kept (seeded)
    max_prompt_len: int | None = None  # --max-prompt-len: clip trace prompt tokens
    max_output_len: int | None = None  # --max-output-len: clip trace output tokens
    rollout_dist: str = "lognormal"  # --rollout-dist: rl-rollout output family
    rollout_median: float = 1024.0  # --rollout-median: lognormal median output tokens
    rollout_sigma: float = 1.0  # --rollout-sigma: lognormal sigma
    rollout_alpha: float = 1.5  # --rollout-alpha: Pareto tail index
    rollout_min: float = 256.0  # --rollout-min: Pareto minimum length
    rollout_max: int = 16384  # --rollout-max: rl-rollout output cap
    rollout_prompt_len: int = 512  # --rollout-prompt-len: rl-rollout fixed prompt tokens
    rollout_prompt_set: str | None = None  # --rollout-prompt-set: prompts from this set
    seed: int = 0  # --seed: roots the workload's random streams (and the trace sampling)

    def __post_init__(self) -> None:
        # The one check with no home downstream: RolloutConfig's message names its own field.
        if self.rollout_dist not in ROLLOUT_DISTRIBUTIONS:
            raise InputError(
                f"--rollout-dist: choose from {', '.join(ROLLOUT_DISTRIBUTIONS)}; "
                f"got {self.rollout_dist!r}"
            )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> WorkloadFlags:
        """The workload flags among a command's parameter values (e.g. its `locals()`).

        Names that are not workload flags are ignored; a flag the command does not take keeps
        its default.
        """
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in names})

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `build_workload` and `SimulationConfig` (same names in both).

        The traces objects are built in a fixed order (random lengths, trace options, rollout),
        so with several bad flags every command reports the same one first.
        """
        random_lengths = RandomLengths(
            self.random_input_len, self.random_output_len, self.random_range_ratio
        )
        trace_options = TraceOptions(
            start_s=self.start_s,
            end_s=self.end_s,
            fraction=self.fraction,
            num_rows=self.num_rows,
            seed=self.seed,
            max_prompt_len=self.max_prompt_len,
            max_output_len=self.max_output_len,
            time_scale=self.time_scale,
        )
        rollout = RolloutConfig(
            output_dist="pareto" if self.rollout_dist == "pareto" else "lognormal",
            output_median=self.rollout_median,
            output_sigma=self.rollout_sigma,
            pareto_alpha=self.rollout_alpha,
            pareto_min_len=self.rollout_min,
            max_output_len=self.rollout_max,
            prompt_len=self.rollout_prompt_len,
            prompt_set=self.rollout_prompt_set,
        )
        return {
            "num_prompts": self.num_prompts,
            "max_concurrency": self.max_concurrency,
            "request_rate": self.request_rate,
            "burstiness": self.burstiness,
            "seed": self.seed,
            "output_len": self.output_len,
            "chat_template": not self.raw_prompt,
            "shuffle": self.shuffle,
            "random_lengths": random_lengths,
            "trace_options": trace_options,
            "rollout": rollout,
        }


def dataset_source(dataset_name: str | None, dataset_path: str | None) -> str:
    """The workload name or file of `--dataset-name`/`--dataset-path` (vLLM's spellings)."""
    if dataset_path is not None:
        if dataset_name not in (None, "custom"):
            raise InputError(
                f"--dataset-name {dataset_name} and --dataset-path {dataset_path}: give one "
                "(or --dataset-name custom with --dataset-path)"
            )
        return dataset_path
    if dataset_name in (None, "custom"):
        if dataset_name == "custom":
            raise InputError("--dataset-name custom needs --dataset-path FILE")
        return DEFAULT_DATASET
    return dataset_name
