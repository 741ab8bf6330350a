"""The plug points of the engine loop: what crosses between scheduler, executor and models.

The engine (`sim.engine`) asks the scheduler for a `ScheduledBatch`, asks the policy for K, hands
the batch to an `Executor`, and feeds the `StepOutcome` back. The simulator's executor is
`sim.executor.FittedExecutor` (a `LatencyModel` plus an `AcceptanceModel`); the real one is
`backend.executor.TorchExecutor`. The scheduler never computes time: durations come only from
the executor. Arrays are numpy, one row per scheduled request; treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dsd.common.arrays import BoolArray, IntArray
from dsd.traces.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One step's work, like vLLM's SchedulerOutput. Rows [0, num_decode_reqs) decode."""

    step_index: int  # 0-based, per run
    req_ids: IntArray  # [B] scheduled requests; decode rows first, then prefill rows
    num_decode_reqs: int  # rows that decode (carry drafts); the rest are prefill chunks
    num_scheduled_tokens: IntArray  # [B] tokens computed per row: 1 + K (decode), chunk (prefill)
    num_spec_tokens: IntArray  # [B] K per row; 0 on prefill rows
    num_computed_tokens: IntArray  # [B] tokens in the row's KV cache before this step
    # [B] confirmed output tokens of the row's request (placeholders excluded): when scheduled,
    # and, refreshed by the engine before execute under async scheduling, when the step runs
    num_output_tokens: IntArray
    completes_prompt: BoolArray  # [B] prefill rows whose chunk ends the prompt: they sample token 1
    total_num_scheduled_tokens: int  # == int(num_scheduled_tokens.sum())
    # first scheduled (or re-scheduled after preemption) in this step
    new_req_ids: tuple[int, ...] = ()
    finished_req_ids: tuple[int, ...] = ()  # finished/aborted since the last step: free their state
    preempted_req_ids: tuple[int, ...] = ()  # preempted since the last step: their KV is gone

    @property
    def batch_size(self) -> int:
        return int(self.req_ids.shape[0])

    @property
    def has_drafts(self) -> bool:
        """Some decode row drafts (K > 0): the step class the host-overhead model is keyed on,
        measured by `backend.profiler` and charged by `sim.executor` with this one test."""
        return bool(self.num_spec_tokens[: self.num_decode_reqs].max(initial=0) > 0)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What the executor reports for one ScheduledBatch."""

    duration_s: float  # wall (measured) or modelled time of the whole step, seconds, > 0
    num_accepted: IntArray  # [num_decode_reqs] accepted drafts per decode row, 0 <= a <= d <= K
    # [B] index among the row's emitted output tokens (0..a) of a stop token (EOS), -1 if none.
    # None: the executor never stops early (simulation), only max_tokens/max_model_len apply.
    stop_index: IntArray | None = None
    # [num_decode_reqs] drafts each decode row verified, 0 <= d <= K (a drafter that finds fewer,
    # like vLLM's n-gram lookup, drafts fewer; then 0 <= a <= d). None: every row drafted its K.
    num_drafted: IntArray | None = None


class Executor(Protocol):
    """Runs one step. Holds per-request state itself (KV, token ids), keyed by req_id."""

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        """A request arrives at the engine (before it is first scheduled)."""
        ...

    def execute(self, batch: ScheduledBatch) -> StepOutcome: ...


class LatencyModel(Protocol):
    """Step latency from the shape of a step. Pure: no state, no randomness."""

    def step_ms(self, batch: ScheduledBatch) -> float:
        """Latency of the whole step (draft passes, verification, prefill chunks, overhead)."""
        ...

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        """ITL(B, K) of a pure decode step, as the goodput policy reads it."""
        ...


class AcceptanceModel(Protocol):
    """Samples drafted and accepted counts. Holds its own generator (from the run's
    SeedSequence)."""

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        """Draw this request's own acceptance behaviour (heterogeneity, replay sequence)."""
        ...

    def remove_request(self, req_id: int) -> None: ...

    def sample_outcomes(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> tuple[IntArray, IntArray]:
        """(drafted d [n], accepted a [n]), 0 <= a <= d <= K, for n decode rows with K
        `num_spec_tokens` [n] at their output positions `num_output_tokens` [n] (the request's
        output tokens when the step runs). A model whose rows always draft their K returns
        `num_spec_tokens` itself as d: the executor's fast path tests identity."""
        ...
