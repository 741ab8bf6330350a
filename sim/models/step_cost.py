"""How dsd's torch engine composes a step, as wrappers around a latency model: prefill as a
forward of its own (`PaddedPrefill`), steps run at fixed shapes (`FixedShapeSteps`, the fast
path's CUDA-graph buckets of `sim.models.shapes`) and padded attention (`PaddedAttention`). Each
changes how some steps are priced; the wrapped model (`sim.models.latency`) prices the rest. Not the
models themselves, nor which one a profile gets (`sim.resolve`)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from dsd.policies.profile import Profile
from dsd.sim.models.latency import (
    ParametricLatencyModel,
    PrefillCost,
    PrefillSource,
    TableLatencyModel,
    measured_on_fast_path,
    profile_contexts,
)
from dsd.sim.models.shapes import StepShapes, kv_len_bucket
from dsd.sim.types import ScheduledBatch

# --------------------------------------------------------------------------------------------
# How dsd's torch engine composes a step: prefill as a forward of its own, padded attention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StepCostWrapper:
    """A model that changes how the wrapped model prices some steps: prefill pricing and the
    policy's ITL(B, K) are the wrapped model's."""

    inner: TableLatencyModel | ParametricLatencyModel | PaddedAttention | FixedShapeSteps

    @property
    def prefill(self) -> PrefillCost:
        return self.inner.prefill

    @property
    def prefill_source(self) -> PrefillSource:
        return self.inner.prefill_source

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        return self.inner.decode_itl_ms(batch_size, num_spec_tokens)


@dataclass(frozen=True)
class PaddedPrefill(_StepCostWrapper):
    """A latency model for an engine that pads a step's prefill chunks to the longest one.

    dsd's torch engine (`backend.engine.SpecDecodeEngine`) runs the P prefill rows of a step as
    one block of P rows x W tokens, W the longest chunk: in the decode rows' verify forward
    (`engine_fuses`, its reference step) or in a forward of their own after the decode step
    (the fixed-shape fast path). Each row's attention is over its own W tokens, so P rows do not
    cost one prompt of P x W tokens, whose attention would be quadratic in P x W:

    - a forward of its own: padded(P, W) = curve(W) + (P - 1) x marginal(W) (its fixed cost is
      paid once; each further row adds the marginal cost of W tokens). On the 2-core CPU with
      SmolLM2-135M, P = 2, 4, 8 rows of 200 tokens took 1019, 1951, 3945 ms against 1020,
      1970, 3871 ms so priced, and one prompt of P x 200 tokens 1094, 2391, 6191 ms
      (benchmarks/padded_prefill.py). Prefill-only steps run so in both modes;
    - in the decode forward: P x in_decode(W), each row what W tokens add to a decode step.

    A mixed step costs decode + that, instead of the inner model's decode + in_decode(sum of
    chunks). Decode-only steps are the inner model's.
    """

    # inner: the model it corrects (padded attention included when the engine pads)
    engine_fuses: bool = False  # the chunks run in the decode rows' forward

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        chunks = batch.num_scheduled_tokens[num_decode:]  # [P]
        if chunks.shape[0] == 0:
            return self.inner.step_ms(batch)
        prefill = self.inner.prefill
        longest = float(np.maximum.reduce(chunks))
        rows = int(chunks.shape[0])
        own_forward = prefill.curve_ms(longest) + (rows - 1) * prefill.marginal_ms(longest)
        if num_decode == 0:
            return own_forward
        block = rows * prefill.in_decode_ms(longest) if self.engine_fuses else own_forward
        return self.inner.step_ms(batch) - prefill.in_decode_ms(float(chunks.sum())) + block


@dataclass(frozen=True)
class FixedShapeSteps(_StepCostWrapper):
    """A latency model for an engine that runs each decode step at a fixed shape.

    dsd's fast path (`backend.fast_path`, the shapes in `sim.models.shapes`) pads a step's D
    decode rows up to a batch bucket, runs every row at the step's largest K, and attends over
    the longest row's span rounded up to a kv bucket. So a step costs what the inner model
    charges for bucket(D) rows at that K whose attention reads that span (a step over 3 rows
    costs what 4 rows cost, not what the B = 2 and B = 4 points interpolate to).

    The span is priced at the profiled context whose steps read it: a profile measured on the
    same fixed shapes (`profile_fixed_shapes`) read the span of each of its contexts (contexts 65
    and 321 read 256 and 512 positions), one measured on the reference path read the context
    itself. Between and beyond those, the context is linear in the span. Prefill rows and a
    step without decode rows are the inner model's.
    """

    # inner: the model of the step's own shape (a table or parametric model)
    shapes: StepShapes
    profile_contexts: tuple[int, ...] = ()  # the profile's recorded contexts, ascending
    profile_fixed_shapes: bool = False  # the profile's steps ran on these kv buckets

    @staticmethod
    def of_profile(
        inner: TableLatencyModel | ParametricLatencyModel,
        shapes: StepShapes,
        profile: Profile | None,
    ) -> FixedShapeSteps:
        """The wrapper of a model fitted to `profile`: its contexts, and whether it ran on the
        fast path (None: neither)."""
        if profile is None:
            return FixedShapeSteps(inner, shapes)
        return FixedShapeSteps(
            inner, shapes, tuple(profile_contexts(profile)), measured_on_fast_path(profile)
        )

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        if num_decode == 0:
            return self.inner.step_ms(batch)
        k = int(np.maximum.reduce(batch.num_spec_tokens[:num_decode]))
        span = self.shapes.span(int(np.maximum.reduce(batch.num_computed_tokens[:num_decode])), k)
        context = self.context_of_span(span, k)
        cached = batch.num_computed_tokens[0] if context is None else max(round(context) - 1, 0)
        return self.inner.step_ms(_as_fixed_shape(batch, self.shapes.rows(num_decode), k, cached))

    def context_of_span(self, span: int, num_spec_tokens: int) -> float | None:
        """The recorded context (tokens held) whose profiled steps read `span` positions; None
        for a profile without contexts (the inner model then ignores them)."""
        if not self.profile_contexts:
            return None
        reads, levels = _reads_and_levels(
            self.profile_contexts,
            self.profile_fixed_shapes,
            self.shapes.min_kv_len,
            num_spec_tokens,
        )
        if len(reads) == 1:
            return levels[0] + (span - reads[0])
        upper = min(max(int(np.searchsorted(reads, span)), 1), len(reads) - 1)
        slope = (levels[upper] - levels[upper - 1]) / (reads[upper] - reads[upper - 1])
        return levels[upper] + slope * (span - reads[upper])


@functools.cache
def _reads_and_levels(
    contexts: tuple[int, ...], fixed_shapes: bool, min_kv_len: int, num_spec_tokens: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(the span each recorded context's steps read, that context), ascending in the span; of
    contexts that read one span only the first (they cost the same). Built once per K, not per
    step."""
    reads: list[float] = []
    levels: list[float] = []
    for level in contexts:
        # A recorded context holds level - 1 cached tokens (see TableLatencyModel).
        read = (
            kv_len_bucket(level + num_spec_tokens, 1 << 40, min_kv_len) if fixed_shapes else level
        )
        if not reads or read > reads[-1]:
            reads.append(float(read))
            levels.append(float(level))
    return tuple(reads), tuple(levels)


def _as_fixed_shape(batch: ScheduledBatch, rows: int, k: int, cached: int) -> ScheduledBatch:
    """`batch` with its decode rows replaced by `rows` rows of K = k holding `cached` tokens
    each (the fixed shape the engine runs); prefill rows kept, after them."""
    num_decode = batch.num_decode_reqs
    padding = rows - num_decode

    def decode_then_prefill(decode: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.concatenate((decode, values[num_decode:]))

    num_scheduled = decode_then_prefill(np.full(rows, k + 1), batch.num_scheduled_tokens)
    return dataclasses.replace(
        batch,
        req_ids=decode_then_prefill(
            np.concatenate((batch.req_ids[:num_decode], np.full(padding, -1))), batch.req_ids
        ),
        num_decode_reqs=rows,
        num_scheduled_tokens=num_scheduled,
        num_spec_tokens=decode_then_prefill(np.full(rows, k), batch.num_spec_tokens),
        num_computed_tokens=decode_then_prefill(np.full(rows, cached), batch.num_computed_tokens),
        num_output_tokens=decode_then_prefill(
            np.concatenate((batch.num_output_tokens[:num_decode], np.zeros(padding, np.int64))),
            batch.num_output_tokens,
        ),
        completes_prompt=decode_then_prefill(np.zeros(rows, bool), batch.completes_prompt),
        total_num_scheduled_tokens=int(num_scheduled.sum()),
    )


@dataclass(frozen=True)
class PaddedAttention(_StepCostWrapper):
    """A latency model for an engine whose decode rows all attend over the longest row's span.

    dsd's torch engine gathers every row's KV cache to one padded length (the step's longest
    context), so a step costs what it would if every decode row held that many tokens: the
    inner model is read with each decode row's context replaced by the largest. Context-free
    models are unaffected.
    """

    # inner: the model of ragged attention (`build` wraps a table or parametric model)

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        if num_decode < 2:
            return self.inner.step_ms(batch)
        contexts = batch.num_computed_tokens.copy()  # [B]
        contexts[:num_decode] = contexts[:num_decode].max()
        return self.inner.step_ms(dataclasses.replace(batch, num_computed_tokens=contexts))
