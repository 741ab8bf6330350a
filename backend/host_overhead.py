"""The engine loop's host overhead: what a step costs beyond its model forwards.

The real loop (`sim.engine.Engine` on the wall clock with `backend.executor.TorchExecutor`) runs
short closed-loop workloads at C = B; per iteration, loop wall time minus the time inside the
model forwards is the host work the step timing does not see, fitted as intercept + per_row x B
for steps without and with drafts (docs/models.md). Each learning policy's own host time is
measured in the same loop. Part of the profiler (`backend.profiler.profile_pair` calls it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import scipy.optimize

from dsd.backend.engine import AnyDraft, SpecDecodeEngine
from dsd.backend.executor import engine_prefill_forward
from dsd.backend.model import Transformer
from dsd.backend.profiler import ProfileConfig, device_sync
from dsd.backend.real import torch_executor
from dsd.common.arrays import BoolArray, FloatArray, IntArray
from dsd.common.progress import Advance
from dsd.policies.host_time import TIMED_POLICIES, policy_steppers
from dsd.policies.profile import (
    HostOverhead,
    HostOverheadLine,
    Profile,
)
from dsd.sim.build import build_engine
from dsd.sim.config import DEFAULT_BLOCK_SIZE, RunConfig
from dsd.sim.engine import LoopConfig
from dsd.sim.resolve import ResolvedRun, resolve
from dsd.sim.types import Executor, ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec, Workload

_Result = TypeVar("_Result")  # what a timed engine method returns


@dataclass(frozen=True, slots=True)
class HostOverheadSample:
    """One iteration of the engine loop, split into model forwards and the rest."""

    batch_size: int  # B of the step (decode rows + prefill chunks)
    has_spec: bool  # some decode row drafted K > 0
    iteration_ms: float  # wall time of the whole loop iteration (what the wall clock advanced)
    forward_ms: float  # time inside the model forwards of the step (engine.step + prefill)
    # wall time planning the step (admissions, plan, policy, commit; Engine.planning_ms)
    planning_ms: float = 0.0

    @property
    def overhead_ms(self) -> float:
        return self.iteration_ms - self.forward_ms


class ForwardTimer:
    """Wraps one SpecDecodeEngine's forwards (`step`, `prefill`, `step_with_prefill`) with a
    clock and sums their time.

    The wrappers are instance attributes that shadow the methods, so the engine and the
    executor are unchanged. On CUDA the device is synchronized before each clock read.
    """

    def __init__(self, engine: SpecDecodeEngine, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._device = engine.device
        self._total_s = 0.0
        for name in ("step", "prefill", "step_with_prefill"):
            setattr(engine, name, self._timed(getattr(engine, name)))

    def _timed(self, method: Callable[..., _Result]) -> Callable[..., _Result]:
        def timed(*args: Any) -> _Result:
            start_s = self._start()
            out = method(*args)
            self._stop(start_s)
            return out

        return timed

    def _start(self) -> float:
        device_sync(self._device)
        return self._clock()

    def _stop(self, start_s: float) -> None:
        device_sync(self._device)
        self._total_s += self._clock() - start_s

    def take_ms(self) -> float:
        """Forward ms summed since the last call (and reset)."""
        total_ms, self._total_s = self._total_s * 1000.0, 0.0
        return total_ms


class _ForwardTimedExecutor:
    """An `Executor` that records, per step, B, whether it drafts, and its forward ms; and runs
    `after_step` (if any) after each step, recording its ms apart."""

    def __init__(
        self,
        inner: Executor,
        take_forward_ms: Callable[[], float],
        after_step: Callable[[], object] | None = None,
    ) -> None:
        self.inner = inner
        self.take_forward_ms = take_forward_ms
        self.after_step = after_step
        # step_index -> (B, has_spec, forward ms)
        self.records: dict[int, tuple[int, bool, float]] = {}
        self.after_step_ms: dict[int, float] = {}  # step_index -> ms in after_step

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        self.inner.add_request(req_id, spec)

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        self.take_forward_ms()  # drop anything timed outside a step
        outcome = self.inner.execute(batch)
        forward_ms = self.take_forward_ms()
        self.records[batch.step_index] = (batch.batch_size, batch.has_drafts, forward_ms)
        if self.after_step is not None:
            start_s = time.perf_counter()
            self.after_step()
            self.after_step_ms[batch.step_index] = (time.perf_counter() - start_s) * 1000.0
        return outcome


def loop_host_samples(
    resolved: ResolvedRun,
    executor: Executor,
    take_forward_ms: Callable[[], float],
    after_step: Callable[[], object] | None = None,
) -> list[HostOverheadSample]:
    """Run a resolved run through the engine loop with the wall clock; one sample per iteration.

    `take_forward_ms()` returns the model-forward ms since its last call (a `ForwardTimer`'s
    `take_ms`); iteration time is the wall time the loop advanced for the step, less the time
    in `after_step`, which runs after each step (the policy timing of `measure_host_overhead`).
    """
    timed = _ForwardTimedExecutor(executor, take_forward_ms, after_step)
    engine = build_engine(resolved, timed, LoopConfig(clock="wall", time_planning=True))
    steps = engine.run().steps
    samples = []
    for step_index, duration_s in zip(
        steps["step_index"].tolist(), steps["duration_s"].tolist(), strict=True
    ):
        batch_size, has_spec, forward_ms = timed.records[int(step_index)]
        samples.append(
            HostOverheadSample(
                batch_size=batch_size,
                has_spec=has_spec,
                iteration_ms=float(duration_s) * 1000.0
                - timed.after_step_ms.get(int(step_index), 0.0),
                forward_ms=forward_ms,
                planning_ms=engine.planning_ms.get(int(step_index), 0.0),
            )
        )
    return samples


def host_overhead_run(batch_size: int, k: int, config: ProfileConfig) -> tuple[RunConfig, Workload]:
    """One loop run of `measure_host_overhead`: static K at C = max_num_seqs = B over 2 x B
    synthetic requests of min(context_lens) prompt tokens (the config and its workload)."""
    output_len = config.host_overhead_output_len
    prompt_len = min(config.context_lens)
    k_max = config.k_max
    max_model_len = prompt_len + output_len + k_max + 1
    workload = Workload(
        name=f"host-overhead-B{batch_size}",
        requests=tuple(
            RequestSpec(prompt_len=prompt_len, output_len=output_len) for _ in range(2 * batch_size)
        ),
        max_concurrency=batch_size,
    )
    run_config = RunConfig(
        policy=f"static:{k}",
        dataset=workload.name,
        k_max=k_max,
        max_num_seqs=batch_size,
        max_model_len=max_model_len,
        num_kv_blocks=batch_size * -(-max_model_len // DEFAULT_BLOCK_SIZE),
        seed=config.seed,
    )
    return run_config, workload


def _fit_line(
    batch_sizes: np.ndarray, medians_ms: np.ndarray, counts: np.ndarray
) -> tuple[HostOverheadLine, np.ndarray]:
    """Non-negative least squares of medians ~ intercept + per_row x B, weighted by sqrt(count).

    One distinct B: no slope can be seen, so per_row is 0 and the intercept the weighted mean.
    Returns the line and the residuals [groups].
    """
    weights = np.sqrt(counts.astype(np.float64))  # [G]
    if np.unique(batch_sizes).size >= 2:
        design = np.stack([np.ones_like(medians_ms), batch_sizes.astype(np.float64)], axis=1)
    else:
        design = np.ones((medians_ms.size, 1))  # [G, 1]
    coef, _ = scipy.optimize.nnls(design * weights[:, None], medians_ms * weights)
    fitted = design @ coef  # [G]
    per_row = float(coef[1]) if coef.size > 1 else 0.0
    return HostOverheadLine(intercept_ms=float(coef[0]), per_row_ms=per_row), medians_ms - fitted


def fit_host_overhead(samples: Sequence[HostOverheadSample]) -> HostOverhead:
    """Fit intercept + per_row x B per class (steps without / with drafts) -> HostOverhead.

    Each (class, B) group is summarised by its median overhead (one slow iteration, e.g. a
    garbage collection, must not tilt the line); the groups are fitted by non-negative least
    squares weighted by their sample counts. A class with no samples takes the other's line.
    `residual_ms` is the RMS of the group medians about their line.
    """
    if not samples:
        raise ValueError("host overhead: no loop iterations to fit")
    batch = np.array([s.batch_size for s in samples], dtype=np.int64)  # [S]
    spec = np.array([s.has_spec for s in samples], dtype=bool)  # [S]
    overhead = np.array([s.overhead_ms for s in samples], dtype=np.float64)  # [S]
    planning = np.array([s.planning_ms for s in samples], dtype=np.float64)  # [S]
    if not (np.all(np.isfinite(overhead)) and np.all(np.isfinite(planning))):
        raise ValueError("host overhead: a sample is not finite")
    (plain, drafting), residuals = _fit_class_lines(batch, spec, overhead)
    (planning_plain, planning_spec), _ = _fit_class_lines(batch, spec, planning)
    return HostOverhead(
        plain=plain,
        spec=drafting,
        residual_ms=float(np.sqrt(np.mean(residuals**2))),
        num_steps=len(samples),
        max_batch_size=int(batch.max()),
        planning_plain=planning_plain,
        planning_spec=planning_spec,
    )


def _fit_class_lines(
    batch: IntArray, spec: BoolArray, values: FloatArray
) -> tuple[tuple[HostOverheadLine, HostOverheadLine], FloatArray]:
    """((plain line, spec line), residuals per (class, B) group) of per-sample ms `values`:
    each (class, B) group's median, lines fitted by weighted non-negative least squares; a
    class with no samples takes the other's line."""
    lines: dict[bool, HostOverheadLine] = {}
    residuals: list[FloatArray] = []
    for has_spec in (False, True):
        mask = spec == has_spec
        if not mask.any():
            continue
        group_b = np.unique(batch[mask])  # [G]
        medians = np.array([np.median(values[mask & (batch == b)]) for b in group_b])  # [G]
        counts = np.array([int((mask & (batch == b)).sum()) for b in group_b])  # [G]
        lines[has_spec], group_residuals = _fit_line(group_b, medians, counts)
        residuals.append(group_residuals)
    plain = lines.get(False, lines.get(True))
    drafting = lines.get(True, lines.get(False))
    assert plain is not None and drafting is not None  # samples is non-empty
    return (plain, drafting), np.concatenate(residuals)


class _PolicyTurns:
    """One synthetic step of one policy in turn per call (static:K_max, the baseline, among
    them), timed: `samples_us[(spec, D)]`. Called after each real step, so each policy step
    meets the caches a step leaves, as in the engine loop (`policies.host_time`)."""

    def __init__(
        self, profile: Profile, num_decode: int, max_num_seqs: int, warmup_steps: int = 200
    ) -> None:
        specs = [f"static:{profile.k_max}", *TIMED_POLICIES]
        self.steppers = list(
            policy_steppers(profile, specs, num_decode, max_num_seqs, warmup_steps).items()
        )
        self.num_decode = num_decode
        self.turn = 0
        self.samples_us: dict[tuple[str, int], list[float]] = {
            (spec, num_decode): [] for spec in specs
        }

    def __call__(self) -> None:
        spec, stepper = self.steppers[self.turn % len(self.steppers)]
        self.turn += 1
        self.samples_us[spec, self.num_decode].append(stepper.step() * 1e6)


def measure_host_overhead(
    target: Transformer,
    draft: AnyDraft | None,
    config: ProfileConfig,
    on_progress: Advance | None = None,
    policy_profile: Profile | None = None,
) -> tuple[HostOverhead, list[HostOverheadSample], dict[tuple[str, int], list[float]]]:
    """The loop runs of the module docstring -> (fitted model, raw samples, policy samples).

    Per profiled B and K in (0, K_max): 2 x B synthetic requests of min(context_lens) prompt
    tokens and `host_overhead_output_len` output tokens (EOS ignored), closed loop at C = B,
    max_num_seqs = B, a fresh TorchExecutor (the same fast path as the profile) each run.
    With `policy_profile` (and K_max > 0), the learning policies built on it are timed after
    each step at D = B (`_PolicyTurns`): their samples in us per (spec, B), else none.
    """
    samples: list[HostOverheadSample] = []
    policy_samples_us: dict[tuple[str, int], list[float]] = {}
    for batch_size in sorted(config.batch_sizes):
        turns = (
            _PolicyTurns(policy_profile, batch_size, max(config.batch_sizes))
            if policy_profile is not None and config.k_max > 0
            else None
        )
        for k in (0, config.k_max):
            run_config, workload = host_overhead_run(batch_size, k, config)
            resolved = resolve(run_config, workload=workload)
            resolved = dataclasses.replace(
                resolved, prefill_forward=engine_prefill_forward(config.fast_path)
            )
            executor = torch_executor(
                resolved,
                target,
                draft,
                temperature=config.temperature,
                ignore_eos=True,
                fast_path=config.fast_path,
            )
            timer = ForwardTimer(executor.engine, time.perf_counter)
            samples += loop_host_samples(resolved, executor, timer.take_ms, turns)
            del executor, timer
            if on_progress is not None:
                on_progress(f"host overhead B={batch_size} K={k}")
        if turns is not None:
            policy_samples_us.update(turns.samples_us)
    return fit_host_overhead(samples), samples, policy_samples_us
