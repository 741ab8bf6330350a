"""The RL-rollout workload: a whole batch of requests at t=0 with long-tailed output lengths.

A rollout step submits N prompts at once and waits for the last; most responses are short and a
few run to the cap, so the batch drains and B falls from N towards 1, which is where a
batch-size-aware K policy matters. Output lengths are lognormal or Pareto, clipped to
max_output_len (the rollout's max_tokens); prompt lengths fixed or cycled from a prompt set
(docs/workloads.md, "RL rollout").

It makes no arrival times other than 0 and does not limit concurrency (max_concurrency stays
None: the engine's max_num_seqs decides how many run at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dsd.common.errors import InputError
from dsd.traces.datasets import PROMPT_SET_NAMES, load_prompt_set
from dsd.traces.workload import RequestSpec, Workload

OutputDistribution = Literal["lognormal", "pareto"]


@dataclass(frozen=True)
class RolloutConfig:
    """Shape of one rollout batch."""

    num_requests: int = 256  # requests submitted together at t=0, >= 1
    output_dist: OutputDistribution = "lognormal"  # family of the output-length tail
    output_median: float = 1024.0  # lognormal: median output tokens, > 0
    output_sigma: float = 1.0  # lognormal: sigma of log(length), > 0 (larger = longer tail)
    pareto_alpha: float = 1.5  # pareto: tail index, > 0 (smaller = heavier tail)
    pareto_min_len: float = 256.0  # pareto: x_min, the smallest length before rounding, > 0
    max_output_len: int = 16384  # cap (max_tokens of every request), >= 1
    prompt_len: int = 512  # prompt tokens when prompt_set is None, >= 1
    prompt_set: str | None = None  # take prompts (length and text) from this set, cycled
    chat_template: bool = True  # prompt_set lengths with the chat template (vLLM bench default)

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise InputError(f"num_requests: must be >= 1, got {self.num_requests}")
        if self.output_dist not in ("lognormal", "pareto"):
            raise InputError(
                f"output_dist: must be 'lognormal' or 'pareto', got {self.output_dist!r}"
            )
        for field, value in (
            ("output_median", self.output_median),
            ("output_sigma", self.output_sigma),
            ("pareto_alpha", self.pareto_alpha),
            ("pareto_min_len", self.pareto_min_len),
        ):
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"{field}: must be finite and > 0, got {value}")
        if self.max_output_len < 1:
            raise InputError(f"max_output_len: must be >= 1, got {self.max_output_len}")
        if self.prompt_len < 1:
            raise InputError(f"prompt_len: must be >= 1, got {self.prompt_len}")
        if self.prompt_set is not None and self.prompt_set not in PROMPT_SET_NAMES:
            raise InputError(
                f"prompt_set: unknown {self.prompt_set!r}; known: {', '.join(PROMPT_SET_NAMES)}"
            )


def rollout_output_lens(config: RolloutConfig, rng: np.random.Generator) -> np.ndarray:
    """Output lengths of one rollout, int64 in [1, max_output_len]."""
    if config.output_dist == "lognormal":
        lengths = rng.lognormal(
            mean=math.log(config.output_median), sigma=config.output_sigma, size=config.num_requests
        )  # [N]
    else:
        # numpy's pareto is Lomax; (1 + Lomax) * x_min is the classical Pareto with scale x_min
        lomax = rng.pareto(config.pareto_alpha, size=config.num_requests)  # [N]
        lengths = config.pareto_min_len * (1.0 + lomax)  # [N]
    return np.clip(np.rint(lengths), 1, config.max_output_len).astype(np.int64)  # [N]


def rollout_workload(config: RolloutConfig, *, rng: np.random.Generator) -> Workload:
    """One rollout batch: every request at t=0, output lengths from `rollout_output_lens`."""
    output_lens = rollout_output_lens(config, rng)  # [N]
    requests = []
    records = load_prompt_set(config.prompt_set) if config.prompt_set is not None else ()
    for index, output_len in enumerate(output_lens):
        if records:
            record = records[index % len(records)]
            prompt_len = record.chat_len if config.chat_template else record.raw_len
            requests.append(
                RequestSpec(
                    prompt_len=prompt_len,
                    output_len=int(output_len),
                    tag=record.tag,
                    prompt=record.text,
                )
            )
        else:
            requests.append(
                RequestSpec(prompt_len=config.prompt_len, output_len=int(output_len), tag="rollout")
            )
    return Workload(name="rl-rollout", requests=tuple(requests))
