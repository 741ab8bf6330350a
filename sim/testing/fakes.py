"""Small deterministic executors and K policies for tests, benchmarks and examples.

`ScriptedExecutor` runs every step in a fixed time and accepts drafts from a script (all of
them by default), optionally with an EOS at a given output position; `RandomAcceptanceExecutor`
draws acceptance from fixed per-position rates with an explicit generator. `StaticK` and
`ScriptedK` are K policies that also record what they saw.

What this module deliberately does not do: model latency or acceptance realistically (that is
`sim.executor.FittedExecutor`), or keep any global state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dsd.common.arrays import IntArray
from dsd.policies.types import StepFeedback, StepView
from dsd.sim.types import ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec


class ScriptedExecutor:
    """Fixed step duration; accepted = min(K, script) per decode row.

    `accept_script[req_id]` lists the accepted count of that request's successive decode steps
    (the last value repeats); requests without a script accept every draft. `eos_at[req_id]` is
    the 0-based output position of an EOS token: the step that would emit it reports it in
    `stop_index`.
    """

    def __init__(
        self,
        duration_s: float = 0.01,
        accept_script: Mapping[int, Sequence[int]] | None = None,
        eos_at: Mapping[int, int] | None = None,
        record: bool = False,
    ) -> None:
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        self.duration_s = duration_s
        self.accept_script = dict(accept_script or {})
        self.eos_at = dict(eos_at or {})
        self.record = record
        self.batches: list[ScheduledBatch] = []  # every executed batch when `record`
        self.added: list[int] = []  # req_ids in add_request order
        self._decode_steps: dict[int, int] = {}  # req_id -> decode steps run so far

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        self.added.append(req_id)

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        if self.record:
            self.batches.append(batch)
        num_decode = batch.num_decode_reqs
        num_spec = batch.num_spec_tokens[:num_decode]  # [D]
        if self.accept_script:
            accepted = num_spec.copy()  # [D]
            for row, req_id in enumerate(batch.req_ids[:num_decode].tolist()):
                script = self.accept_script.get(req_id)
                if script:
                    index = self._decode_steps.get(req_id, 0)
                    self._decode_steps[req_id] = index + 1
                    accepted[row] = min(int(num_spec[row]), script[min(index, len(script) - 1)])
        else:
            accepted = num_spec.copy()
        stop_index = None
        if self.eos_at:
            stop_index = np.full(batch.batch_size, -1, dtype=np.int64)  # [B]
            emitted = np.concatenate(
                [accepted + 1, batch.completes_prompt[num_decode:].astype(np.int64)]
            )  # [B]
            for row, req_id in enumerate(batch.req_ids.tolist()):
                eos = self.eos_at.get(req_id)
                if eos is None:
                    continue
                first = int(batch.num_output_tokens[row])
                if first <= eos < first + int(emitted[row]):
                    stop_index[row] = eos - first
        return StepOutcome(duration_s=self.duration_s, num_accepted=accepted, stop_index=stop_index)


class RandomAcceptanceExecutor:
    """Fixed step duration; drafts accepted with unconditional per-position rates `r_i`."""

    def __init__(
        self, duration_s: float, acceptance_rates: Sequence[float], rng: np.random.Generator
    ) -> None:
        rates = np.asarray(acceptance_rates, dtype=np.float64)  # [k_max]
        if (rates < 0).any() or (rates > 1).any() or (np.diff(rates) > 0).any():
            raise ValueError("acceptance_rates must be in [0, 1] and non-increasing")
        self.duration_s = duration_s
        # P(a >= i | K >= i) = r_i, so conditional rate at i is r_i / r_{i-1}.
        previous = np.concatenate([[1.0], rates[:-1]])  # [k_max]
        with np.errstate(divide="ignore", invalid="ignore"):
            self._conditional = np.where(previous > 0, rates / previous, 0.0)  # [k_max]
        self._rng = rng

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        return None

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        num_decode = batch.num_decode_reqs
        num_spec = batch.num_spec_tokens[:num_decode]  # [D]
        k_top = int(num_spec.max()) if num_decode else 0
        if k_top == 0:
            return StepOutcome(self.duration_s, np.zeros(num_decode, dtype=np.int64))
        draws = self._rng.random((num_decode, k_top)) < self._conditional[:k_top]  # [D, k_top]
        positions = np.arange(1, k_top + 1)  # [k_top]
        draws &= positions[None, :] <= num_spec[:, None]
        # accepted = length of the leading run of True
        accepted = np.cumprod(draws, axis=1).sum(axis=1).astype(np.int64)  # [D]
        return StepOutcome(self.duration_s, accepted)


class StaticK:
    """K policy: the same K every step. Records views and feedback when `record`."""

    def __init__(self, k: int, record: bool = False) -> None:
        self.k = k
        self.record = record
        self.views: list[StepView] = []
        self.feedback: list[StepFeedback] = []

    def choose_k(self, view: StepView) -> int | IntArray:
        if self.record:
            self.views.append(view)
        return self.k

    def observe(self, feedback: StepFeedback) -> None:
        if self.record:
            self.feedback.append(feedback)


class ScriptedK:
    """K policy: `schedule[i]` at the i-th call (last value repeats); records what it saw."""

    def __init__(self, schedule: Sequence[int]) -> None:
        if not schedule:
            raise ValueError("schedule must not be empty")
        self.schedule = list(schedule)
        self.views: list[StepView] = []
        self.feedback: list[StepFeedback] = []

    def choose_k(self, view: StepView) -> int | IntArray:
        index = min(len(self.views), len(self.schedule) - 1)
        self.views.append(view)
        return self.schedule[index]

    def observe(self, feedback: StepFeedback) -> None:
        self.feedback.append(feedback)
