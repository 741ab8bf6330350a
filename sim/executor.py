"""The simulator's executor: one step's duration and accepted counts from fitted models.

`FittedExecutor` implements `sim.types.Executor` with a `LatencyModel` and an `AcceptanceModel`:
per step it frees finished requests' acceptance state, samples (drafted d, accepted a) for the
decode rows, and prices the step as it ran (rows at their drafted d, plus host overhead and
optional lognormal jitter). The pricing is in docs/models.md §1.5, §1.6 and §3.

It does not decide anything about scheduling (the scheduler), stop early on EOS (simulated
requests run to max_tokens; `stop_index` stays None), or touch torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from dsd.common.arrays import IntArray
from dsd.policies.profile import HostOverhead
from dsd.sim.types import AcceptanceModel, LatencyModel, ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class LatencyJitter:
    """Multiplicative lognormal noise on step latency: duration *= exp(sigma * Z), Z ~ N(0, 1)."""

    sigma: float  # std of log(duration); 0.05 is about +-5% step to step; >= 0, finite
    seed: np.random.SeedSequence  # the noise's own stream, so acceptance draws are unaffected

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"jitter sigma must be finite and >= 0, got {self.sigma}")


class FittedExecutor:
    """Executor of the simulator: latency model + acceptance model (+ optional noise)."""

    def __init__(
        self,
        latency: LatencyModel,
        acceptance: AcceptanceModel,
        host_overhead_ms: float = 0.0,
        jitter: LatencyJitter | None = None,
        host_overhead_model: HostOverhead | None = None,
        host_planning_ms: float = 0.0,
        overlap_planning: bool = False,
    ) -> None:
        """`host_overhead_ms`: a constant added to every step; `host_overhead_model`: the
        measured model instead (giving both is an error: which one applies would be a guess).
        `host_planning_ms`: the part of the constant spent planning the step (the model has
        its own); `overlap_planning`: that part runs while the previous step is on the device
        (async scheduling), so a step costs max(device, planning) + the rest of the host time
        instead of device + host."""
        if not (math.isfinite(host_overhead_ms) and host_overhead_ms >= 0):
            raise ValueError(f"host_overhead_ms must be finite and >= 0, got {host_overhead_ms}")
        if host_overhead_model is not None and host_overhead_ms != 0:
            raise ValueError("give host_overhead_ms or host_overhead_model, not both")
        if not (math.isfinite(host_planning_ms) and 0 <= host_planning_ms <= host_overhead_ms):
            raise ValueError(
                f"host_planning_ms must be in [0, host_overhead_ms {host_overhead_ms}], "
                f"got {host_planning_ms}"
            )
        self.latency = latency
        self.acceptance = acceptance
        self.host_overhead_ms = float(host_overhead_ms)
        self.host_overhead_model = host_overhead_model
        self.host_planning_ms = float(host_planning_ms)
        self.overlap_planning = overlap_planning
        self.jitter_sigma = jitter.sigma if jitter is not None else 0.0
        self._jitter_rng = np.random.default_rng(jitter.seed) if jitter is not None else None

    @property
    def repeats_plain_steps(self) -> bool:
        """Whether plain decode steps (every row at K = 0, no prefill) of one batch size all
        cost the same and change nothing here: no latency noise and a latency model that
        ignores contexts (`context_free`). Acceptance draws at K = 0 touch no state (their
        streams are counter-based). The engine then runs such stretches at once."""
        no_noise = self._jitter_rng is None or self.jitter_sigma == 0
        return no_noise and getattr(self.latency, "context_free", False) is True

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        self.acceptance.add_request(req_id, spec)

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        for req_id in batch.finished_req_ids:
            self.acceptance.remove_request(req_id)
        num_decode = batch.num_decode_reqs
        decode_ks = batch.num_spec_tokens[:num_decode]  # [D]
        num_drafted, num_accepted = self.acceptance.sample_outcomes(
            batch.req_ids[:num_decode],
            batch.num_output_tokens[:num_decode],
            decode_ks,
        )  # [D] each
        if num_drafted is decode_ks:
            # Every row drafted its K: the step runs as scheduled (the fast path). The contract
            # the engine relies on: 0 <= a <= K, i.e. neither a nor K - a is negative.
            if num_accepted.shape != decode_ks.shape or (
                num_decode > 0
                and np.minimum.reduce(np.minimum(num_accepted, decode_ks - num_accepted)) < 0
            ):
                raise RuntimeError(
                    f"step {batch.step_index}: acceptance model returned accepted counts "
                    f"outside [0, K]: {num_accepted.tolist()} for K {decode_ks.tolist()}"
                )
            ran = batch
            reported_drafted = None
        else:
            self._check_outcomes(batch, decode_ks, num_drafted, num_accepted)
            ran = as_drafted(batch, num_drafted)
            reported_drafted = num_drafted.astype(np.int64, copy=False)
        step_ms = self._step_ms(ran)
        if self._jitter_rng is not None and self.jitter_sigma > 0:
            step_ms *= math.exp(self.jitter_sigma * float(self._jitter_rng.standard_normal()))
        if not (math.isfinite(step_ms) and step_ms > 0):
            raise RuntimeError(f"step {batch.step_index}: latency model gave {step_ms} ms")
        return StepOutcome(
            duration_s=step_ms / 1000.0,
            num_accepted=num_accepted.astype(np.int64, copy=False),
            num_drafted=reported_drafted,
        )

    @staticmethod
    def _check_outcomes(
        batch: ScheduledBatch, decode_ks: IntArray, drafted: IntArray, accepted: IntArray
    ) -> None:
        """0 <= a <= d <= K for every decode row (a violation is a bug in the model)."""
        if (
            drafted.shape != decode_ks.shape
            or accepted.shape != decode_ks.shape
            or (
                decode_ks.shape[0] > 0
                and int(
                    np.minimum(np.minimum(accepted, drafted - accepted), decode_ks - drafted).min()
                )
                < 0
            )
        ):
            raise RuntimeError(
                f"step {batch.step_index}: acceptance model returned outcomes outside "
                f"0 <= accepted <= drafted <= K: accepted {accepted.tolist()}, drafted "
                f"{drafted.tolist()} for K {decode_ks.tolist()}"
            )

    def _step_ms(self, batch: ScheduledBatch) -> float:
        """Device time + host time; under `overlap_planning` the planning part of the host
        time hides behind the device (docs/models.md 1.5)."""
        device_ms = self.latency.step_ms(batch)
        model = self.host_overhead_model
        if model is None:
            host_ms, planning_ms = self.host_overhead_ms, self.host_planning_ms
        else:
            has_drafts = batch.has_drafts
            host_ms = model.overhead_ms(batch.batch_size, has_drafts)
            planning_ms = model.planning_ms(batch.batch_size, has_drafts)
        if self.overlap_planning:
            return max(device_ms, planning_ms) + (host_ms - planning_ms)
        return device_ms + host_ms


def as_drafted(batch: ScheduledBatch, num_drafted: IntArray) -> ScheduledBatch:
    """The batch as the engine ran it: decode rows carry their drafted count d [D] in place of
    K (and verify 1 + d tokens); prefill rows unchanged. What the step's latency is read at."""
    num_decode = batch.num_decode_reqs
    drafted = np.asarray(num_drafted, dtype=np.int64)  # [D]
    spec = batch.num_spec_tokens.copy()  # [B]
    spec[:num_decode] = drafted
    scheduled = batch.num_scheduled_tokens.copy()  # [B]
    scheduled[:num_decode] = drafted + 1
    return dataclasses.replace(
        batch,
        num_spec_tokens=spec,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=int(scheduled.sum()),
    )
