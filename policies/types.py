"""The vocabulary of dsd and the K-policy plug point.

Vocabulary (use these words, and only these, in code and docs):

- **step**: one target forward pass over the scheduled batch, with the draft passes that made
  its drafts. **B** (`batch_size`): requests scheduled in the step, prefill chunks included
  (vLLM's range-table key); `num_decode_reqs`: those that decode (only they carry drafts);
  `num_tokens`: tokens the target computes in the step.
- **K** (`num_spec_tokens`): draft tokens proposed for one request in one step; K=0 is plain
  decoding.
- **drafted** `d` in [0, K]: the drafts a request got in a step (a model draft always K; a
  lookup drafter such as n-gram what it finds, possibly none); the step verifies only those.
- **accepted** `a` in [0, d]: the leading drafts the target agreed with. A decode step emits
  `a + 1` **output tokens**: the *bonus* token when all drafts were accepted, else the
  *recovered* token sampled at the first rejected position. Rejected = d - a.
- **per-position acceptance rate** `r_i` (i = 1..K_max): P(the first i drafts all accepted) at
  a step that asked for at least i drafts, counting the steps that drafted fewer. Unconditional
  in i, so r_i <= r_{i-1} (the conditional rate is r_i / r_{i-1}). vLLM's *logged* rate
  divides by all drafts and reads low when K varies; we count `drafted_at_pos` separately.
- **draft rate** `s_i`: P(d >= i) at a step that asked for at least i drafts (1 for model
  drafts); r_i <= s_i, and accepted_at_pos[i] / drafted_at_pos[i] = r_i / s_i.
- **AL(K)** (acceptance length) = expected output tokens per decode step = 1 + sum_{i<=K} r_i.
- **ITL(B, K)**: latency in ms of one decode step at batch size B with K drafts per request
  (draft passes + verification + host overhead); with s_i < 1, its expectation over the widest
  row's drafted count (`policies.goodput.expected_itl_ms`).
- **goodput(B, K)** = AL(K) / ITL(B, K): output tokens per ms per request (not SLO goodput).
- Request metrics follow `vllm bench serve`: TTFT; TPOT = (E2EL - TTFT) / (output_tokens - 1),
  only for requests with more than one output token; ITL = gaps between successive output
  chunks; E2EL.

Units live in names: `*_s` for clock seconds (simulated or measured), `*_ms` for reported
latencies. Ids come from per-run counters.

A K policy sees a frozen `StepView` before each step and returns one K for the whole batch or a
K per decode request; after the step it gets a `StepFeedback` (docs/policies.md). Policies
import nothing from `sim` or `backend`: plain numpy in, int or array out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from dsd.common.arrays import IntArray

SchedulingMode = Literal["sync", "async"]
# When the K a policy chooses at step t is verified. "next-step": vLLM's, in sync and async
# mode alike (the drafter runs at the end of step t with that step's K, the scheduler hands its
# drafts to step t + 1); "same-step": at step t itself (a drafter that runs after scheduling).
KTiming = Literal["next-step", "same-step"]
K_TIMINGS: tuple[KTiming, ...] = ("next-step", "same-step")
# Largest running-set cap (max_num_seqs) any policy or the simulator accepts: per-B tables are
# built for B = 1..max_num_seqs, so an absurd cap would be a huge allocation, not an answer.
MAX_NUM_SEQS = 1 << 20
# Largest num_speculative_tokens a run accepts: far past any useful K (acceptance of the 10th
# draft is tiny), and small enough that KV caches sized by it stay allocatable.
MAX_SPEC_TOKENS = 64


@dataclass(frozen=True, slots=True)
class StepView:
    """What a policy may look at when it chooses K for a step. Arrays are read-only by contract."""

    step_index: int  # 0-based index of the step being scheduled
    time_s: float  # engine clock when the step is scheduled, seconds
    batch_size: int  # B: requests scheduled in this step, prefill chunks included; >= 0
    num_decode_reqs: int  # scheduled requests that decode; <= batch_size
    req_ids: IntArray  # [num_decode_reqs] ids of the decode requests, in batch order
    context_lens: IntArray  # [num_decode_reqs] tokens already in each request's KV cache
    k_max: int  # largest K the engine can run (num_speculative_tokens); >= 0
    scheduling: SchedulingMode = "sync"  # async: step t+1 is planned while step t runs
    k_timing: KTiming = "next-step"  # next-step: the K chosen now is verified one step later
    num_tokens: int = 0  # tokens in the step before drafts (decode rows + prefill chunks)


@dataclass(frozen=True, slots=True)
class StepFeedback:
    """The outcome of one step, for policies that learn at run time."""

    step_index: int  # index of the step whose outcome this is
    time_s: float  # engine clock when the outcome arrived, seconds
    batch_size: int  # B of that step, prefill chunks included
    req_ids: IntArray  # [num_decode_reqs] decode requests of that step
    # [num_decode_reqs] drafts each request verified: its K, or fewer when the drafter found
    # fewer (n-gram lookup); >= 0
    num_spec_tokens: IntArray
    num_accepted: IntArray  # [num_decode_reqs] accepted drafts; 0 <= a <= K
    duration_s: float  # step latency, seconds
    num_output_tokens: int = field(default=0)  # output tokens the step emitted (all requests)


@runtime_checkable
class KPolicy(Protocol):
    """Chooses K before each step and may learn from each step's outcome.

    A policy whose K is a function of the view's batch size and k_max alone, and whose
    `observe` does nothing, may say so with a class attribute `BATCH_SIZE_ONLY = True`: the
    simulator then runs stretches of identical steps without asking it again
    (`batch_size_only`)."""

    def choose_k(self, view: StepView) -> int | IntArray:
        """One K for every decode request, or an array of K per decode request."""
        ...

    def observe(self, feedback: StepFeedback) -> None:
        """Take the drafted/accepted counts of a finished step."""
        ...


def batch_size_only(policy: object) -> bool:
    """Whether `policy` declares K = f(batch size, k_max) and an `observe` that does nothing
    (class attribute `BATCH_SIZE_ONLY = True`)."""
    return getattr(policy, "BATCH_SIZE_ONLY", False) is True


def position_counts(
    num_spec_tokens: IntArray, num_accepted: IntArray, k_max: int
) -> tuple[IntArray, IntArray]:
    """Per-position (drafted_at_pos, accepted_at_pos), each of length k_max.

    drafted_at_pos[i-1] = number of requests that drafted at least i tokens;
    accepted_at_pos[i-1] = number whose first i drafts were all accepted.
    """
    positions = np.arange(1, k_max + 1, dtype=np.int64)  # [k_max]
    drafted = (num_spec_tokens[:, None] >= positions[None, :]).sum(axis=0)  # [k_max]
    accepted = (num_accepted[:, None] >= positions[None, :]).sum(axis=0)  # [k_max]
    return drafted.astype(np.int64), accepted.astype(np.int64)
