"""Ablation switches of the fidelity report (docs/fidelity.md): effects the simulator models,
switched off by wrapping the latency model or the policy.

`RunConfig.prefill_cost = "free"` wraps the latency model in `FreePrefillLatency`;
`RunConfig.fixed_batch_size = C` wraps it in `FixedBatchLatency` and the policy in
`FixedBatchPolicy`, so every decode step is charged and shown at B = C.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dsd.common.arrays import IntArray
from dsd.policies.types import KPolicy, StepFeedback, StepView
from dsd.sim.models.latency import ParametricLatencyModel, PrefillCost, TableLatencyModel
from dsd.sim.types import LatencyModel, ScheduledBatch


@dataclass(frozen=True)
class FreePrefillLatency:
    """A latency model whose prompt tokens cost nothing (ablation "prefill free").

    Relies on the composition rule of `sim.models.latency`: a step with decode rows costs
    decode + prefill.in_decode_ms(prompt tokens); a prefill-only step costs
    prefill.curve_ms(prompt tokens). Here the marginal part is dropped and a prefill-only step
    costs one forward of a single token, curve_ms(1) (a step cannot take zero time).
    """

    inner: TableLatencyModel | ParametricLatencyModel  # the model with real prefill cost

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        prefill_tokens = float(batch.num_scheduled_tokens[num_decode:].sum())
        prefill = self.inner.prefill
        if num_decode == 0:
            return prefill.curve_ms(1.0)
        return self.inner.step_ms(batch) - prefill.in_decode_ms(prefill_tokens)

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        return self.inner.decode_itl_ms(batch_size, num_spec_tokens)


@dataclass(frozen=True)
class FixedBatchLatency:
    """Charges every step that decodes as a decode step of `batch_size` rows (ablation).

    Decode cost = decode_itl_ms(batch_size, max K of the step) (mixed K charged padded) plus
    the marginal cost of the step's prompt tokens; prefill-only steps keep the inner cost.
    """

    inner: LatencyModel  # the model that prices the real steps
    prefill: PrefillCost  # cost of prompt tokens (the inner model's, or free)
    batch_size: int  # B every decode step is charged at, >= 1

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        if num_decode == 0:
            return self.inner.step_ms(batch)
        k_charged = int(batch.num_spec_tokens[:num_decode].max())
        prefill_tokens = float(batch.num_scheduled_tokens[num_decode:].sum())
        decode_ms = self.inner.decode_itl_ms(self.batch_size, k_charged)
        return decode_ms + self.prefill.in_decode_ms(prefill_tokens)

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        return self.inner.decode_itl_ms(batch_size, num_spec_tokens)


class FixedBatchPolicy:
    """Shows the wrapped policy B = `batch_size` on every step (ablation "no fluctuation")."""

    def __init__(self, inner: KPolicy, batch_size: int) -> None:
        self.inner = inner
        self.batch_size = batch_size

    def choose_k(self, view: StepView) -> int | IntArray:
        return self.inner.choose_k(dataclasses.replace(view, batch_size=self.batch_size))

    def observe(self, feedback: StepFeedback) -> None:
        self.inner.observe(feedback)
