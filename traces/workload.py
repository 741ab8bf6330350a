"""The one workload schema every generator and loader produces, and the engine consumes.

A workload is an ordered list of requests with arrival times plus an optional concurrency cap,
exactly the two knobs of `vllm bench serve` (`--request-rate`/`--burstiness` make arrival
times; `--max-concurrency` caps requests in flight). A closed loop of C clients is arrival
times all 0 with max_concurrency = C: request i is sent at max(arrival_s, the time a slot
frees), in order. This module does not generate arrivals or read files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload."""

    prompt_len: int  # prompt tokens, >= 1
    output_len: int  # max_tokens: output tokens asked for, >= 1 (fewer only on EOS in real runs)
    arrival_s: float = 0.0  # earliest send time, seconds from the start of the run, >= 0
    tag: str | None = None  # category (e.g. MT-Bench "coding"), read by per-category acceptance
    prompt: str | None = None  # prompt text, for real runs; None for synthetic lengths

    @property
    def prompt_key(self) -> str | None:
        """`prompt_key(prompt)`, None without text."""
        return None if not self.prompt else prompt_key(self.prompt)

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if not self.arrival_s >= 0.0:
            raise ValueError(f"arrival_s must be >= 0, got {self.arrival_s}")


def prompt_key(text: str) -> str:
    """A short stable name for a prompt text (16 hex digits of BLAKE2b): how a profile's
    per-request acceptance samples are matched to a workload's requests."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in send order, and the cap on requests in flight (None: no cap)."""

    name: str
    requests: tuple[RequestSpec, ...]
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        arrivals = [r.arrival_s for r in self.requests]
        if any(b < a for a, b in pairwise(arrivals)):
            raise ValueError("requests must be in non-decreasing arrival order")

    @property
    def closed_loop(self) -> bool:
        """Every request arrives at 0 (sends are paced by max_concurrency alone)."""
        return all(request.arrival_s == 0 for request in self.requests)
