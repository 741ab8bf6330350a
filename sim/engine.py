"""The engine loop shared by simulated and real runs: a client sending the workload's requests
and an engine running steps (plan, choose K, commit, execute, update, observe), in sync or async
order, under the model clock (the simulator) or the wall clock (a real executor), with
`run_interleaved` for paired A/B runs of several engines one step each in turn.

It does not compute latency (the executor does), choose K (the policy does), or write files
(`run()` returns a `RunResult`; the CLI writes it). The step order, the closed-loop driver
without SimPy and its shortcuts, the clocks, and the real overlap are in docs/simulator.md
("Engine loop").
"""

from __future__ import annotations

import bisect
import functools
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import numpy as np

from dsd.common.arrays import IntArray
from dsd.policies.types import KPolicy, StepFeedback, batch_size_only
from dsd.sim.metrics import Columns, MetricsRecorder, StepSink
from dsd.sim.scheduler import SchedulerConfig, SpecDecodeStats, StepPlan, StepResult
from dsd.sim.types import Executor, ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec, Workload

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd
    import simpy


class StepScheduler(Protocol):
    """What the engine loop calls: `sim.scheduler.Scheduler` (dsd's own) or
    `sim.vllm_oracle.VllmScheduler` (vLLM's, `--scheduler vllm`)."""

    config: SchedulerConfig
    spec_stats: SpecDecodeStats
    num_preemptions: int

    def add_requests(self, req_ids: Sequence[int], specs: Sequence[RequestSpec]) -> None: ...
    def has_unfinished(self) -> bool: ...
    def plan_step(self) -> StepPlan | None: ...
    def commit_step(self, plan: StepPlan, k: int | IntArray) -> ScheduledBatch: ...
    def update(self, batch: ScheduledBatch, outcome: StepOutcome) -> StepResult: ...
    def running_positions(self, batch: ScheduledBatch) -> ScheduledBatch: ...
    def check_invariants(self) -> None: ...
    # stretches of plain decode steps at once (`Scheduler`'s; a scheduler may answer 0)
    def plain_decode_steps_ahead(self) -> int: ...
    def advance_plain_decode(self, num_steps: int) -> tuple[IntArray, int]: ...


ClockMode = Literal["model", "wall"]


@dataclass(frozen=True)
class LoopConfig:
    """How the engine loop runs (the scheduler has its own config)."""

    # "model": advance by the executor's duration; "wall": by measured wall time.
    clock: ClockMode = "model"
    # Keep an event log (send / step / emit / finish) on the result; for tests and debugging.
    record_events: bool = False
    # Call scheduler.check_invariants() after every scheduler call (tests; slow).
    check_invariants: bool = False
    # Percentiles reported as pNN_*_ms, like `--metric-percentiles`.
    percentiles: tuple[float, ...] = (99.0,)
    # None: keep every step row on RunResult.steps. A callable: receives the step rows as
    # columns in blocks (sim.metrics.STEP_BLOCK_ROWS) during the run and RunResult.steps is
    # empty, so long runs keep flat memory (e.g. a parquet writer, or `lambda rows: None`).
    step_sink: StepSink | None = None
    # Record the wall time of planning each step (admitting sent requests, plan_step, the
    # policy's choose_k, commit_step) in Engine.planning_ms: the host work that async
    # scheduling overlaps with the previous step (the profiler's host-overhead split).
    time_planning: bool = False
    # Wall clock + async scheduling: execute step t on a worker thread while step t+1 is
    # planned (the real engine's overlap; see the module docstring). False: serially. None:
    # where the executor says the overlap pays (`overlaps_host`: dsd's engine on CUDA).
    overlap: bool | None = None

    def __post_init__(self) -> None:
        if self.clock not in ("model", "wall"):
            raise ValueError(f"clock must be 'model' or 'wall', got {self.clock!r}")
        if any(not 0 <= p <= 100 for p in self.percentiles):
            raise ValueError(f"percentiles must be in [0, 100], got {self.percentiles}")


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One entry of the optional event log."""

    time_s: float  # engine clock, seconds
    kind: str  # "send", "step" (a step starts), "emit" (tokens of a step), "finish"
    req_id: int  # -1 for "step"
    step_index: int  # -1 for "send"
    value: int  # send: prompt_len; step: B; emit: output tokens; finish: total output tokens


@dataclass(frozen=True)
class RunResult:
    """Everything a run measured. Nothing is written to disk here.

    The per-request and per-step tables are kept as numpy columns and become DataFrames when
    first read (`requests`, `steps`): a run whose tables nobody reads never imports pandas."""

    metrics: dict[str, Any]  # `vllm bench serve` keys plus ours (see sim.metrics)
    request_columns: Columns  # one row per request
    step_columns: Columns  # one row per step (empty when LoopConfig.step_sink took them)
    spec_stats: SpecDecodeStats  # spec-decode counters of the run
    events: tuple[EngineEvent, ...]  # empty unless LoopConfig.record_events
    num_preemptions: int  # preemptions by recompute during the run

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (sim.metrics.MetricsRecorder.request_columns)."""
        import pandas as pd

        return pd.DataFrame(self.request_columns)

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        """One row per step (sim.metrics.MetricsRecorder.step_columns)."""
        import pandas as pd

        return pd.DataFrame(self.step_columns)


class _Client:
    """Sends requests in order at max(arrival_s, a free concurrency slot)."""

    def __init__(self, engine: Engine, workload: Workload) -> None:
        self._engine = engine
        self._requests = workload.requests
        self._cap = workload.max_concurrency
        self._arrivals = [r.arrival_s for r in workload.requests]
        self.next_index = 0  # requests sent so far; also the next req_id
        self.num_in_flight = 0
        self._blocked: simpy.Event | None = None

    @property
    def done(self) -> bool:
        return self.next_index == len(self._requests)

    @property
    def sends_nothing_until_release(self) -> bool:
        """Every request arrives at 0: nothing is sent until a slot frees (or ever again)."""
        return self.done or (self._cap is not None and self.num_in_flight >= self._cap)

    def pump(self, due_s: float) -> None:
        """Send, in order, every request whose arrival is <= due_s while the cap allows."""
        start = self.next_index
        stop = bisect.bisect_right(self._arrivals, due_s, lo=start)  # arrivals never decrease
        if self._cap is not None:
            stop = min(stop, start + self._cap - self.num_in_flight)
        if stop <= start:
            return
        self.next_index = stop
        self.num_in_flight += stop - start
        self._engine.send(range(start, stop), self._requests[start:stop])
        if self._blocked is not None:
            blocked, self._blocked = self._blocked, None
            blocked.succeed()

    def release(self, num_finished: int, now_s: float) -> None:
        self.num_in_flight -= num_finished
        self.pump(now_s)

    def process(self, env: simpy.Environment) -> Generator[simpy.Event, Any, None]:
        while not self.done:
            arrival_s = self._arrivals[self.next_index]
            if arrival_s > env.now:
                yield env.timeout(arrival_s - env.now)
                self._engine.now_s = float(env.now)
                # The head's time has come (float rounding aside): send it if the cap allows.
                self.pump(max(env.now, arrival_s))
            else:
                # Due but capped: the engine's release() sends it; wake up then.
                self._blocked = env.event()
                yield self._blocked


class Engine:
    """One run: a workload through scheduler + policy + executor. Use `run()` once."""

    def __init__(
        self,
        scheduler: StepScheduler,
        executor: Executor,
        policy: KPolicy,
        workload: Workload,
        config: LoopConfig | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.policy = policy
        self.workload = workload
        self.config = config or LoopConfig()
        self.now_s = 0.0  # the run's clock (SimPy's when SimPy drives the loop)
        self._fast_forward = False  # run stretches of plain decode steps at once (see run())
        self._client = _Client(self, workload)
        self._metrics = MetricsRecorder(
            len(workload.requests), scheduler.config.k_max, step_sink=self.config.step_sink
        )
        self._events: list[EngineEvent] = []
        self._wake: simpy.Event | None = None
        self._wall_mark_s = 0.0
        self._ran = False
        # step_index -> wall ms spent planning it (LoopConfig.time_planning)
        self.planning_ms: dict[int, float] = {}
        # Requests sent while a step runs on the worker thread, for the executor afterwards
        self._step_running = False
        self._deferred_adds: list[tuple[int, Any]] = []
        # A policy that declares K = f(B, k_max) and an observe that does nothing
        # (`batch_size_only`) is asked once per batch size and never told outcomes, under the
        # model clock (under the wall clock asking it is part of the host time measured).
        self._quiet_policy = batch_size_only(policy)
        self._k_by_batch_size: dict[int, int] | None = (
            {} if self._quiet_policy and self.config.clock == "model" else None
        )

    # -- called by the client
    def send(self, req_ids: range, specs: Sequence[RequestSpec]) -> None:
        """Requests `req_ids` (consecutive ids, in order) arrive at the engine now."""
        now_s = self.now_s
        self.scheduler.add_requests(req_ids, specs)
        if self._step_running:
            self._deferred_adds.extend(zip(req_ids, specs, strict=True))
        else:
            add = self.executor.add_request
            for req_id, spec in zip(req_ids, specs, strict=True):
                add(req_id, spec)
        self._metrics.record_sends(req_ids, now_s, [spec.prompt_len for spec in specs])
        if self.config.record_events:
            self._events.extend(
                EngineEvent(now_s, "send", req_id, -1, spec.prompt_len)
                for req_id, spec in zip(req_ids, specs, strict=True)
            )
        if self._wake is not None:
            wake, self._wake = self._wake, None
            wake.succeed()

    def run(self) -> RunResult:
        if self._start():
            self._run_without_simpy()
        else:
            self._run_with_simpy()
        return self._result()

    def _start(self) -> bool:
        """Mark the engine used; True when every request arrives at 0 (a closed loop: the loop
        runs without SimPy, and may fast-forward plain decode stretches)."""
        if self._ran:
            raise RuntimeError("Engine.run() may be called once")
        self._ran = True
        if not self.workload.closed_loop:
            return False
        config = self.config
        self._fast_forward = (
            self.scheduler.config.scheduling == "sync"
            and config.clock == "model"
            and not (config.record_events or config.check_invariants or config.time_planning)
            and batch_size_only(self.policy)
            and getattr(self.executor, "repeats_plain_steps", False) is True
        )
        return True

    def _result(self) -> RunResult:
        scheduler = self.scheduler
        metrics = self._metrics
        result = RunResult(
            metrics=metrics.bench_metrics(scheduler.spec_stats, self.config.percentiles),
            request_columns=metrics.request_columns(),
            step_columns=metrics.step_columns(),
            spec_stats=scheduler.spec_stats,
            events=tuple(self._events),
            num_preemptions=scheduler.num_preemptions,
        )
        metrics.flush_steps()
        metrics.close()
        return result

    # -- the engine loop and its two drivers
    def _run_with_simpy(self) -> None:
        import simpy  # only where requests arrive over time: a closed loop runs without it

        env = simpy.Environment()
        env.process(self._client.process(env))
        env.run(until=env.process(self._simpy_process(env)))

    def _simpy_process(self, env: simpy.Environment) -> Generator[simpy.Event, Any, None]:
        """The loop as a SimPy process beside the client's (requests arrive over time)."""
        for delay_s in self._loop(self._step_worker()):
            if delay_s is None:
                self._wake = env.event()
                yield self._wake
            else:
                yield env.timeout(delay_s)
            self.now_s = float(env.now)

    def _run_without_simpy(self) -> None:
        """The loop alone (every request arrives at 0): the clock moves only by steps."""
        for delay_s in self._loop(self._step_worker()):
            self._advance(delay_s)

    def _advance(self, delay_s: float | None) -> None:
        if delay_s is None:
            raise RuntimeError("nothing to run and no request left to arrive")
        self.now_s = self.now_s + delay_s  # as SimPy's clock: now + delay

    def _step_worker(self) -> ThreadPoolExecutor | None:
        """The thread that runs steps under real overlap (wall clock, async), else None."""
        overlap = self.config.overlap
        if overlap is None:
            overlap = getattr(self.executor, "overlaps_host", False) is True
        overlapped = (
            self.config.clock == "wall" and self.scheduler.config.scheduling == "async" and overlap
        )
        return _step_thread() if overlapped else None

    def _loop(self, worker: ThreadPoolExecutor | None) -> Generator[float | None, None, None]:
        """The steps; yields each step's duration (the clock advances by it) or None (wait for
        a request to be sent)."""
        scheduler = self.scheduler
        client = self._client
        wall = self.config.clock == "wall"
        is_async = scheduler.config.scheduling == "async"
        self._wall_mark_s = time.perf_counter()
        next_batch: ScheduledBatch | None = None
        time_planning = self.config.time_planning
        while True:
            if next_batch is None:
                planning_start_s = time.perf_counter() if time_planning else 0.0
                client.pump(self.now_s)
                plan = scheduler.plan_step()
                self._check()
                if plan is None:
                    if client.done and not scheduler.has_unfinished():
                        return
                    if scheduler.has_unfinished():
                        raise RuntimeError("scheduler has requests but planned nothing")
                    yield None
                    self._wall_mark_s = time.perf_counter()  # idle time is not step time
                    continue
                next_batch = self._commit(plan)
                if time_planning:
                    self._record_planning(next_batch, planning_start_s)
            batch, next_batch = next_batch, None
            start_s = self.now_s
            if self.config.record_events:
                self._events.append(
                    EngineEvent(start_s, "step", -1, batch.step_index, batch.batch_size)
                )
            if is_async:
                batch = scheduler.running_positions(batch)
            if worker is not None:
                self._step_running = True
                running = worker.submit(self.executor.execute, batch)
            else:
                outcome = self.executor.execute(batch)
            if is_async:
                # Schedule step t+1 while step t runs, before its outcome is known.
                planning_start_s = time.perf_counter() if time_planning else 0.0
                client.pump(self.now_s)
                plan = scheduler.plan_step()
                self._check()
                if plan is not None:
                    next_batch = self._commit(plan)
                    if time_planning:
                        self._record_planning(next_batch, planning_start_s)
            if worker is not None:
                outcome = running.result()  # re-raises what the step raised
                self._step_running = False
                for req_id, spec in self._deferred_adds:
                    self.executor.add_request(req_id, spec)
                self._deferred_adds.clear()
            if wall:
                mark_s = time.perf_counter()
                duration_s = mark_s - self._wall_mark_s
                self._wall_mark_s = mark_s
            else:
                duration_s = outcome.duration_s
                if not duration_s > 0:
                    raise ValueError(f"step {batch.step_index}: duration_s must be > 0")
            yield duration_s
            result = self._apply(batch, outcome, start_s, duration_s)
            if (
                self._fast_forward
                and batch.total_num_scheduled_tokens == batch.batch_size == batch.num_decode_reqs
                and not result.finished_req_ids
                and client.sends_nothing_until_release
            ):
                self._run_plain_decode_steps(duration_s)

    def _record_planning(self, batch: ScheduledBatch, start_s: float) -> None:
        self.planning_ms[batch.step_index] = (time.perf_counter() - start_s) * 1000.0

    def _commit(self, plan: StepPlan) -> ScheduledBatch:
        scheduler = self.scheduler
        known = self._k_by_batch_size
        k: int | IntArray | None = None if known is None else known.get(plan.batch_size)
        if k is None:
            k = self.policy.choose_k(plan.view(self.now_s, scheduler.config))
            if known is not None and isinstance(k, int | np.integer):
                known[plan.batch_size] = int(k)  # an answer per row depends on D: asked again
        batch = scheduler.commit_step(plan, k)
        self._check()
        return batch

    def _run_plain_decode_steps(self, duration_s: float) -> None:
        """After a plain decode step (every row at K = 0, no finish, nothing to send): the steps
        that would repeat it exactly, at once. The policy would answer the same K at the same
        B, the executor charge the same `duration_s` and draw nothing; the scheduler says how
        many such steps come (`plain_decode_steps_ahead`)."""
        scheduler = self.scheduler
        num_steps = scheduler.plain_decode_steps_ahead()
        if num_steps < 1:
            return
        starts_s = []
        now_s = self.now_s
        for _ in range(num_steps):
            starts_s.append(now_s)
            now_s = now_s + duration_s  # the clock's own arithmetic, step by step
        req_ids, first_step = scheduler.advance_plain_decode(num_steps)
        self._metrics.record_plain_decode_steps(req_ids, first_step, starts_s, duration_s)
        self.now_s = now_s

    def _apply(
        self, batch: ScheduledBatch, outcome: StepOutcome, start_s: float, duration_s: float
    ) -> StepResult:
        now_s = self.now_s
        result = self.scheduler.update(batch, outcome)
        self._check()
        num_output_tokens = self._metrics.record_step(batch, result, start_s, duration_s)
        if self.config.record_events:
            for req_id, num in zip(
                batch.req_ids.tolist(), result.num_output_tokens.tolist(), strict=True
            ):
                if num:
                    self._events.append(EngineEvent(now_s, "emit", req_id, batch.step_index, num))
            for req_id in result.finished_req_ids:
                total = int(self._metrics.num_output_tokens[req_id])
                self._events.append(EngineEvent(now_s, "finish", req_id, batch.step_index, total))
        if result.finished_req_ids:
            self._client.release(len(result.finished_req_ids), now_s)
        if self._quiet_policy:
            return result  # its observe does nothing (`batch_size_only`)
        num_decode = batch.num_decode_reqs
        self.policy.observe(
            StepFeedback(
                step_index=batch.step_index,
                time_s=now_s,
                batch_size=batch.batch_size,
                req_ids=batch.req_ids[:num_decode],
                # drafts each row verified (fewer than its K when the drafter found fewer)
                num_spec_tokens=(
                    batch.num_spec_tokens[:num_decode]
                    if outcome.num_drafted is None
                    else np.asarray(outcome.num_drafted, dtype=np.int64)
                ),
                num_accepted=np.asarray(outcome.num_accepted, dtype=np.int64),
                duration_s=duration_s,
                num_output_tokens=num_output_tokens,
            )
        )
        return result

    def _check(self) -> None:
        if self.config.check_invariants:
            self.scheduler.check_invariants()


def run_interleaved(
    engines: Sequence[Engine], between: Callable[[], object] | None = None
) -> list[RunResult]:
    """Closed-loop engines run one step each in turn until every one has finished; their
    results, in order. Each engine keeps its own clock, scheduler and executor, so under the
    model clock every result is exactly its `run()`'s. Under the wall clock each step is timed
    from when its engine resumed: a step never includes the other engines' steps (nor what
    `between`, called after every step, does), and a machine whose speed drifts over seconds
    slows every engine alike (A/B measurements on a shared machine: `benchmarks/envelope_gap.py`;
    speed probes inside a validation's trials: `validation.cells`)."""
    if not all(engine.workload.closed_loop for engine in engines):
        raise ValueError("run_interleaved needs closed-loop workloads (every arrival at 0)")
    for engine in engines:
        engine._start()
    # One step thread serves them all: an engine's step is never in flight while another runs
    loops = [engine._loop(engine._step_worker()) for engine in engines]
    running = list(range(len(engines)))
    while running:
        for index in list(running):
            engine = engines[index]
            engine._wall_mark_s = time.perf_counter()  # the others' steps are not its time
            delay_s = next(loops[index], _FINISHED)
            if delay_s is _FINISHED:
                running.remove(index)
            else:
                engine._advance(cast(float | None, delay_s))
                if between is not None:
                    between()
    return [engine._result() for engine in engines]


_FINISHED = object()  # run_interleaved: an engine's loop returned


@functools.cache
def _step_thread() -> ThreadPoolExecutor:
    """The one thread that runs overlapped steps, for the whole process. Created once rather
    than per run: what torch keeps per thread stays warm from run to run (a fresh thread per
    run ran every run cold: docs/simulator.md, "Real overlap"). Idle, it only waits on its
    queue."""
    from concurrent.futures import ThreadPoolExecutor  # only where steps overlap (real runs)

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsd-step")
