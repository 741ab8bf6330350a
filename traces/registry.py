"""Name -> workload: the one entry point behind `dsd simulate --dataset-name` and `dsd run`.

`build_workload` takes a prompt-set name (traces.datasets), `random`, a shipped trace
(traces.loaders), `rl-rollout` (traces.rollout) or a workload file, and applies the two
`vllm bench serve` knobs on top: arrivals from the rate and burstiness (traces.arrivals) and the
concurrency cap. `WorkloadOptions` holds the flat knobs every command and the API take;
`dataset_source` reads vLLM's `--dataset-name` / `--dataset-path` spellings. Per-kind rules and
the seed streams are in docs/workloads.md.

Beyond that, this module only chooses and composes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dsd.common.errors import InputError
from dsd.common.machine import available_memory_bytes
from dsd.traces.arrivals import validate_rate, with_arrivals
from dsd.traces.datasets import (
    PROMPT_SET_NAMES,
    RandomLengths,
    prompt_set_workload,
    random_workload,
)
from dsd.traces.loaders import TRACE_NAMES, TraceOptions, load_trace, load_workload_file
from dsd.traces.rollout import RolloutConfig, rollout_workload
from dsd.traces.workload import Workload

# The workload when a command names none (vLLM bench serve's MT-Bench prompt set).
DEFAULT_DATASET = "mt-bench"
ROLLOUT_DISTRIBUTIONS = ("lognormal", "pareto")
ROLLOUT_NAME = "rl-rollout"
RANDOM_NAME = "random"
KNOWN_NAMES: tuple[str, ...] = (*PROMPT_SET_NAMES, RANDOM_NAME, *TRACE_NAMES, ROLLOUT_NAME)

# vLLM bench's --num-prompts default, used by `random` when num_prompts is None.
DEFAULT_RANDOM_NUM_PROMPTS = 1000

# Memory a simulated request takes, all told (its RequestSpec, the simulator's per-request state
# and metrics columns): about 0.95 KiB measured on MT-Bench runs of 2,000 and 40,000 prompts
# (peak RSS difference). A count whose estimate exceeds the available memory is refused before
# anything is allocated; the estimate is checked only past BYTES_CHECKED_FROM.
BYTES_PER_REQUEST = 1024
BYTES_CHECKED_FROM = 256 * 2**20

# Child indices of the run's SeedSequence; fixed so streams stay stable as code evolves.
_STREAM_LENGTHS, _STREAM_ORDER, _STREAM_ARRIVALS = 0, 1, 2


def check_requests_fit(num_requests: int, field: str = "num_prompts") -> None:
    """InputError when `num_requests` simulated requests would not fit in the memory available
    now (BYTES_PER_REQUEST each), before any is made: such a run would grow until the OS kills
    it."""
    needed = num_requests * BYTES_PER_REQUEST
    if needed < BYTES_CHECKED_FROM:
        return
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise InputError(
            f"{field}: {num_requests} requests need about {needed / 2**30:,.1f} GiB "
            f"(~{BYTES_PER_REQUEST} bytes each), more than the {available / 2**30:,.1f} GiB of "
            f"memory available; at most {available // BYTES_PER_REQUEST} fit"
        )


def _stream(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[index])


def _take(workload: Workload, num_prompts: int | None, *, cycle: bool) -> Workload:
    """First num_prompts requests; cycle when fewer exist (only for untimed workloads)."""
    if num_prompts is None or num_prompts == len(workload.requests):
        return workload
    requests = workload.requests
    if num_prompts > len(requests) and not cycle:
        raise InputError(
            f"num_prompts: {workload.name} has {len(requests)} requests after the trace "
            f"options, asked for {num_prompts}"
        )
    taken = tuple(requests[index % len(requests)] for index in range(num_prompts))
    return dataclasses.replace(workload, requests=taken)


def _with_output_len(workload: Workload, output_len: int | None) -> Workload:
    if output_len is None:
        return workload
    requests = tuple(dataclasses.replace(r, output_len=output_len) for r in workload.requests)
    return dataclasses.replace(workload, requests=requests)


# Largest count or length accepted from a user (exact in float64, far from int64 overflow).
MAX_COUNT = 2**53


def build_workload(
    name_or_path: str,
    *,
    num_prompts: int | None = None,
    max_concurrency: int | None = None,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int = 0,
    output_len: int | None = None,
    chat_template: bool = True,
    shuffle: bool = False,
    random_lengths: RandomLengths | None = None,
    trace_options: TraceOptions | None = None,
    rollout: RolloutConfig | None = None,
    exclude_prompt_keys: Collection[str] = (),
) -> Workload:
    """The workload a name or path stands for, re-timed and capped like `vllm bench serve`.

    num_prompts: requests (None: the whole set / trace; 1000 for random; the rollout's size).
    max_concurrency: cap on requests in flight (None: no cap).
    request_rate, burstiness: arrivals (see traces.arrivals); inf rate keeps 0 or trace times.
    seed: the run seed; every random choice derives from it.
    output_len: override every request's output tokens (prompt sets, files, traces).
    chat_template: prompt-set prompt lengths with the chat template (vLLM bench default).
    shuffle: permute a prompt set with the seed before taking num_prompts.
    random_lengths: the `random` dataset's knobs (default: 1024 in, 128 out, ratio 0).
    trace_options: window / sampling / caps / time scale for traces and files.
    rollout: the rl-rollout shape (num_prompts, if given, overrides its num_requests).
    exclude_prompt_keys: prompt keys a prompt set leaves out before taking (held-out prompts:
        `traces.datasets.prompt_set_workload`); other workloads refuse them.
    """
    # Seeds feed np.random.SeedSequence (non-negative, any size); counts and lengths beyond
    # 2**53 cannot be real and would overflow int64 arithmetic downstream.
    if not 0 <= seed < 2**64:
        raise InputError(f"seed: must be an integer in [0, 2**64), got {seed}")
    for field, value in (
        ("num_prompts", num_prompts),
        ("max_concurrency", max_concurrency),
        ("output_len", output_len),
    ):
        if value is not None and value > MAX_COUNT:
            raise InputError(f"{field}: must be at most 2**53, got {value}")
    if num_prompts is not None and num_prompts < 1:
        raise InputError(f"num_prompts: must be >= 1, got {num_prompts}")
    if num_prompts is not None:
        check_requests_fit(num_prompts)
    if max_concurrency is not None and max_concurrency < 1:
        raise InputError(f"max_concurrency: must be >= 1, got {max_concurrency}")
    if output_len is not None and output_len < 1:
        raise InputError(f"output_len: must be >= 1, got {output_len}")
    validate_rate(request_rate, burstiness)
    if exclude_prompt_keys and name_or_path not in PROMPT_SET_NAMES:
        raise InputError(
            f"held_out_prompts: only a named prompt set can leave profiled prompts out, "
            f"not {name_or_path}"
        )
    if name_or_path in PROMPT_SET_NAMES:
        workload = prompt_set_workload(
            name_or_path,
            num_prompts=num_prompts,
            output_len=output_len,
            chat_template=chat_template,
            shuffle=shuffle,
            rng=_stream(seed, _STREAM_ORDER),
            exclude_keys=exclude_prompt_keys,
        )
    elif name_or_path == RANDOM_NAME:
        if output_len is not None:
            raise InputError("output_len: the random dataset takes random_output_len instead")
        count = DEFAULT_RANDOM_NUM_PROMPTS if num_prompts is None else num_prompts
        workload = random_workload(
            count, random_lengths or RandomLengths(), rng=_stream(seed, _STREAM_LENGTHS)
        )
    elif name_or_path in TRACE_NAMES:
        workload = _with_output_len(load_trace(name_or_path, trace_options), output_len)
        workload = _take(workload, num_prompts, cycle=False)
    elif name_or_path == ROLLOUT_NAME:
        if not math.isinf(request_rate):
            raise InputError("request_rate: rl-rollout submits every request at t=0; leave it inf")
        if output_len is not None:
            raise InputError("output_len: rl-rollout draws output lengths; set its max instead")
        config = rollout or RolloutConfig()
        if num_prompts is not None:
            config = dataclasses.replace(config, num_requests=num_prompts)
        check_requests_fit(config.num_requests)
        workload = rollout_workload(config, rng=_stream(seed, _STREAM_LENGTHS))
    else:
        path = Path(name_or_path)
        if not path.suffix and not path.exists():
            raise InputError(
                f"unknown workload {name_or_path!r}; known: {', '.join(KNOWN_NAMES)}, "
                "or a .csv/.parquet/.jsonl file"
            )
        workload = _with_output_len(load_workload_file(path, trace_options), output_len)
        timed = any(request.arrival_s > 0 for request in workload.requests)
        workload = _take(workload, num_prompts, cycle=not timed)
    if not math.isinf(request_rate):
        workload = with_arrivals(
            workload, request_rate, burstiness, rng=_stream(seed, _STREAM_ARRIVALS)
        )
    return dataclasses.replace(workload, max_concurrency=max_concurrency)


@dataclasses.dataclass(frozen=True)
class WorkloadOptions:
    """The values of the workload flags of one command; a flag it lacks keeps the default here.

    The defaults are the commands' flag defaults (checked by tests/cli/test_options.py) and the
    defaults of the traces objects they become. Field checks beyond --rollout-dist happen where
    the values land (RandomLengths, TraceOptions, RolloutConfig, build_workload,
    RunConfig), so every command reports them with the same message.
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
                f"rollout_dist: choose from {', '.join(ROLLOUT_DISTRIBUTIONS)}; "
                f"got {self.rollout_dist!r}"
            )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> WorkloadOptions:
        """The workload flags among a command's parameter values (e.g. its `locals()`).

        Names that are not workload flags are ignored; a flag the command does not take keeps
        its default.
        """
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in names})

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `build_workload` and `RunConfig` (same names in both).

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
    """The workload name or file of vLLM's `--dataset-name` / `--dataset-path` flags."""
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
