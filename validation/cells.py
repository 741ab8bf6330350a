"""Simulated vs measured: run the same cells on the fitted simulator and on the real backend.

A cell is one `RunConfig` (a policy SPEC at a max concurrency C), resolved once and built twice
by `sim.build.build_engine`: the simulator with models fitted from the profile only, and the real
engine on the wall clock with EOS ignored, so limits, policy, workload and seed are identical.
`validate_against_vllm` does the simulator half for a `vllm bench serve --save-result` file.
Trials, timing rounds, the in-trial machine-speed probes and the errors they give are in
docs/validation.md.

It does not parse flags, load models or write files (`dsd validate` and `validation.report` do).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dsd.backend.fast_path import EnginePool
from dsd.backend.pair import ModelPair
from dsd.backend.real import real_engine, run_output_ids, run_prompt_ids, run_step_table
from dsd.backend.replay import pair_replay_recording
from dsd.common.errors import InputError
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import RunConfig
from dsd.sim.engine import RunResult, run_interleaved
from dsd.sim.interval import interval_metrics, with_speed_spread
from dsd.sim.resolve import ResolvedRun, resolve, with_latency_from
from dsd.validation.vllm_result import VllmBenchResult

if TYPE_CHECKING:
    from dsd.validation.retime import TimingRounds

# Most a trial's machine-speed probes may take, as a share of its steps' wall time: a quarter
# gives every CPU trial dozens to hundreds of samples for +25% of its time
PROBE_SHARE = 0.25


@dataclass(frozen=True)
class CellResult:
    """One (policy, C) cell: both runs' metrics and the errors."""

    policy: str  # policy SPEC
    max_concurrency: int | None  # C (None: uncapped)
    # vLLM-keyed metrics of the real run: with several trials, each numeric metric's median over
    # them (the trials' own metrics in `measured_trials`); or the vLLM file's
    measured: dict[str, Any]
    simulated: dict[str, Any]  # vLLM-keyed metrics of the simulator
    measured_steps: Any = None  # pandas step table of the first real trial (None: a vLLM file)
    simulated_steps: Any = None  # pandas step table of the simulator
    # Host overhead the simulator charged per step: "measured" (the profile's model), "flag"
    # (a constant host_overhead_ms) or "none"
    host_overhead_source: str = "none"
    measured_trials: tuple[dict[str, Any], ...] = ()  # every real trial's metrics, in run order
    # The simulator replaying the first real trial's own drafts and acceptances position by
    # position (fitted latency, recorded acceptance); {} for a vLLM file
    replayed: dict[str, Any] = field(default_factory=dict)
    # how slow the machine ran during each real trial against all the timing (`TimingRounds.
    # speed`: > 1 slower), in trial order; () without timing rounds
    trial_speeds: tuple[float, ...] = ()
    num_prompts: int = 0  # requests of the cell (0: not recorded)
    # a vLLM file's cell: each latency model's mean-TPOT error % on it ({}: not scored)
    latency_model_errors_pct: dict[str, float] = field(default_factory=dict)

    def interval(self, key: str) -> tuple[float, float]:
        """The simulator's prediction interval of `key` (`sim.interval`; NaN, NaN without)."""
        return _as_float(self.simulated.get(f"{key}_lo")), _as_float(
            self.simulated.get(f"{key}_hi")
        )

    def inside_interval(self, key: str) -> bool | None:
        """Whether the measured `key` lies in the simulator's interval (None without either)."""
        low, high = self.interval(key)
        measured = _as_float(self.measured.get(key))
        if not all(math.isfinite(v) for v in (low, high, measured)):
            return None
        return low <= measured <= high

    @property
    def machine_speed(self) -> float:
        """The median of `trial_speeds` (NaN without them)."""
        speeds = [speed for speed in self.trial_speeds if math.isfinite(speed)]
        return float(np.median(speeds)) if speeds else float("nan")

    def error_pct(self, key: str) -> float:
        """(simulated - measured) / measured * 100; NaN when either is missing or measured 0."""
        return _error_pct(self.simulated.get(key), self.measured.get(key))

    def timing_error_pct(self, key: str) -> float:
        """(replayed - measured) / measured * 100: the latency model's part of the error."""
        return _error_pct(self.replayed.get(key), self.measured.get(key))

    def acceptance_error_pct(self, key: str) -> float:
        """(simulated - replayed) / replayed * 100: the acceptance model's part (fitted vs the
        run's own acceptance, both on the fitted latency)."""
        return _error_pct(self.simulated.get(key), self.replayed.get(key))

    def speed_adjusted_measured(self, key: str) -> float:
        """The median over the trials of each one's `key` divided by its machine speed: the
        trials as if run at the speed the timing rounds price the simulator at (ms keys
        only); NaN unless every trial has a speed."""
        speeds = np.array(self.trial_speeds, dtype=np.float64)
        values = np.array([_as_float(t.get(key)) for t in self.measured_trials])
        if speeds.size == 0 or speeds.size != values.size or not np.isfinite(speeds).all():
            return float("nan")
        return float(np.median(values / speeds))

    def speed_adjusted_error_pct(self, key: str) -> float:
        """`error_pct` against `speed_adjusted_measured`."""
        return _error_pct(self.simulated.get(key), self.speed_adjusted_measured(key))

    def speed_adjusted_timing_error_pct(self, key: str) -> float:
        """`timing_error_pct` against `speed_adjusted_measured`."""
        return _error_pct(self.replayed.get(key), self.speed_adjusted_measured(key))

    def trial_spread_pct(self, key: str, speed_adjusted: bool = False) -> float:
        """(max - min) / median of the real trials' `key`, in percent (NaN below 2 trials);
        `speed_adjusted`: of each divided by its trial's speed (NaN without speeds)."""
        values = np.array([_as_float(t.get(key)) for t in self.measured_trials])
        if speed_adjusted:
            if len(self.trial_speeds) != values.size:
                return float("nan")
            values = values / np.array(self.trial_speeds, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size < 2 or np.median(values) == 0:
            return float("nan")
        return float((values.max() - values.min()) / np.median(values) * 100.0)


def _error_pct(simulated: Any, measured: Any) -> float:
    measured_value, simulated_value = _as_float(measured), _as_float(simulated)
    if not (math.isfinite(measured_value) and math.isfinite(simulated_value)):
        return float("nan")
    if measured_value == 0:
        return float("nan")
    return (simulated_value - measured_value) / measured_value * 100.0


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def median_metrics(trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per key: the median over trials where every trial has a finite number, else the first
    trial's value (lists, strings, settings)."""
    merged = dict(trials[0])
    for key, first in trials[0].items():
        if isinstance(first, bool) or not isinstance(first, int | float):
            continue
        values = [_as_float(trial.get(key)) for trial in trials]
        if all(math.isfinite(v) for v in values):
            merged[key] = float(np.median(values))
    return merged


@dataclass(frozen=True)
class MeasuredRun:
    """One real run of a cell: its metrics, steps and every request's tokens."""

    metrics: dict[str, Any]  # vLLM-keyed metrics
    steps: Any  # pandas step table, with the executor's own time per step (`run_step_table`)
    prompt_ids: dict[int, list[int]]  # req_id -> prompt ids it was given
    output_ids: dict[int, list[int]]  # req_id -> output ids, as counted
    timing_rounds: tuple[int, ...] = ()  # the TimingRounds just before and after it
    # how slow the machine ran during it (`TimingRounds.speed`); NaN without timing rounds
    machine_speed: float = float("nan")


def simulated_run(resolved: ResolvedRun) -> RunResult:
    """The simulator's run of a resolved cell."""
    return build_engine(resolved, fitted_executor(resolved)).run()


def measured_runs(
    resolved_cells: Sequence[ResolvedRun],
    pair: ModelPair,
    *,
    temperature: float = 0.0,
    fast_path: str = "off",
    between_steps: Callable[[], object] | None = None,
    engines: EnginePool | None = None,
    drawn_acceptance: bool = False,
) -> list[MeasuredRun]:
    """The real engine's runs of resolved cells, EOS ignored (output lengths as simulated), in
    their order. Several cells (closed loop only) run interleaved a step at a time
    (`sim.engine.run_interleaved`): each run's clock holds only its own steps, and the drift of
    a shared machine over seconds lands on all of them alike. `between_steps` (closed-loop
    cells only) runs after every step, outside the steps' time; `engines`: the pool of the
    measurement (a fast path's shapes kept across its runs), the i-th cell on its lane i;
    `drawn_acceptance`: accepted counts drawn as the cells' simulated side draws them
    (`backend.real.torch_executor`)."""
    built = [
        real_engine(
            resolved,
            pair,
            temperature=temperature,
            ignore_eos=True,
            fast_path=fast_path,
            engines=None if engines is None else engines.lane(lane),
            drawn_acceptance=drawn_acceptance,
        )
        for lane, resolved in enumerate(resolved_cells)
    ]
    if len(built) == 1 and between_steps is None:
        results = [built[0].run()]
    else:
        results = run_interleaved(built, between_steps)
    return [
        MeasuredRun(
            metrics=dict(result.metrics),
            steps=run_step_table(engine, result),
            prompt_ids=run_prompt_ids(engine),
            output_ids=run_output_ids(engine, result),
        )
        for engine, result in zip(built, results, strict=True)
    ]


def replayed_run(resolved: ResolvedRun, pair: ModelPair, run: MeasuredRun) -> RunResult | None:
    """The simulator replaying a greedy real run's own drafts and acceptances (request i as
    recorded request i, `sim.models.replay`); None without a draft (nothing to replay)."""
    if pair.draft is None or not run.output_ids:
        return None
    req_ids = sorted(run.output_ids)
    recording = pair_replay_recording(
        pair,
        [np.asarray(run.prompt_ids[req_id], dtype=np.int64) for req_id in req_ids],
        [np.asarray(run.output_ids[req_id], dtype=np.int64) for req_id in req_ids],
        resolved.max_model_len,
    )
    replaying = replace(
        resolved,
        config=replace(resolved.config, acceptance_model="replay"),
        replay_recording=recording,
    )
    return simulated_run(replaying)


def cell_result(
    resolved: ResolvedRun, runs: Sequence[MeasuredRun], pair: ModelPair | None = None
) -> CellResult:
    """The simulator's run of a cell next to its real trials; given the pair (runs greedy:
    temperature 0), also the simulator replaying the first trial's acceptance."""
    simulated = simulated_run(resolved)
    replayed = None if pair is None else replayed_run(resolved, pair, runs[0])
    # the interval over other draws of acceptance for the very requests the real side ran
    interval = interval_metrics(resolved, simulated.metrics, redraw_workload=False)
    return CellResult(
        policy=resolved.config.policy,
        max_concurrency=resolved.workload.max_concurrency,
        measured=median_metrics([run.metrics for run in runs]),
        simulated={**simulated.metrics, **interval},
        num_prompts=len(resolved.workload.requests),
        measured_steps=runs[0].steps,
        simulated_steps=simulated.steps,
        host_overhead_source=resolved.host_overhead_source,
        measured_trials=tuple(run.metrics for run in runs),
        replayed={} if replayed is None else dict(replayed.metrics),
        # speeds only when every trial was timed between rounds (validation_cells times all)
        trial_speeds=(
            tuple(run.machine_speed for run in runs)
            if all(run.timing_rounds for run in runs)
            else ()
        ),
    )


def compare_cell(
    resolved: ResolvedRun,
    pair: ModelPair,
    *,
    trials: int = 1,
    temperature: float = 0.0,
    fast_path: str = "off",
) -> CellResult:
    """Both sides of one cell (resolved by `backend.real.resolve_real`): `trials` real runs
    with EOS ignored, then the simulator."""
    engines = EnginePool()
    runs = [
        measured_runs(
            [resolved], pair, temperature=temperature, fast_path=fast_path, engines=engines
        )[0]
        for _ in range(trials)
    ]
    return cell_result(resolved, runs, pair if temperature == 0 else None)


def interleaved_groups(resolved_cells: Sequence[ResolvedRun]) -> list[list[int]]:
    """The indices of the cells that run together, a step at a time: the closed-loop cells of
    one max concurrency, in the cells' order; an open-loop cell alone (its arrivals keep their
    own wall clock). Groups in the order of their first cell."""
    groups: dict[tuple[str, int | None], list[int]] = {}
    for index, resolved in enumerate(resolved_cells):
        workload = resolved.workload
        key = ("closed", workload.max_concurrency) if workload.closed_loop else ("open", index)
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def validation_cells(
    resolved_cells: Sequence[ResolvedRun],
    pair: ModelPair,
    *,
    trials: int = 1,
    fast_path: str = "off",
    on_progress: Callable[[str], None] | None = None,
    timing: TimingRounds | None = None,
    deadline_s: float | None = None,
    drawn_acceptance: bool = False,
    interleave: bool = True,
) -> list[CellResult]:
    """Every cell on both sides, in order (resolve them all with `resolve_real` first, so a
    bad cell fails before any runs). The real runs go in `trials` rounds over the cells'
    `interleaved_groups`: the closed-loop cells of one C run together, a step at a time, so the
    machine's drift over seconds lands on every policy of a C alike (docs/validation.md). Each
    round takes the groups, and each group its cells, in an order rotated by one, so drift over
    minutes spreads over the cells instead of biasing the ones that ran last. With `timing`, a
    timing round runs before the first group and after every one, and every cell's simulated
    side is priced by the re-timed profile (`TimingRounds.profile`) instead of the cells' own;
    a closed-loop group is probed between its steps (`SpeedProbes`), and every trial's machine
    speed recorded (a group's trials share it). `deadline_s` (a `time.monotonic()` instant): no
    round starts that the mean round so far says would end after it, so every cell has the
    same number of trials (at least one: the first round always runs). `drawn_acceptance`: the
    real runs accept the simulator's draws (`measured_runs`; no replay of their meaningless
    tokens); `interleave` False: every cell runs alone (one engine, and KV cache, per C instead
    of one per cell of a C: production shapes)."""
    if trials < 1:
        raise InputError(f"--trials: must be >= 1, got {trials}")
    runs: list[list[MeasuredRun]] = [[] for _ in resolved_cells]
    groups = (
        interleaved_groups(resolved_cells)
        if interleave
        else [[index] for index in range(len(resolved_cells))]
    )
    engines = EnginePool()  # a fast path's engine (its CUDA graphs) serves every run of its config
    last_c: int | None = None  # the max concurrency of the group that ran last
    before = timing.round() if timing is not None else -1
    round_start_s = time.monotonic()
    for trial in range(trials):
        if trial > 0 and deadline_s is not None:
            now_s = time.monotonic()
            if now_s + (now_s - round_start_s) / trial > deadline_s:
                break
        for offset in range(len(groups)):
            group = groups[(trial + offset) % len(groups)]
            order = [group[(trial + lane) % len(group)] for lane in range(len(group))]
            cells = [resolved_cells[index] for index in order]
            workload = cells[0].workload
            if not interleave and trial == trials - 1 and workload.max_concurrency != last_c:
                # the last round leaves a C for good: its engine (an 8B KV cache) is let go
                engines = EnginePool()
                gc.collect()
            last_c = workload.max_concurrency
            probes = None
            if timing is not None and workload.closed_loop:
                probes = SpeedProbes(timing, workload.max_concurrency)
            measured = measured_runs(
                cells,
                pair,
                fast_path=fast_path,
                between_steps=probes,
                engines=engines,
                drawn_acceptance=drawn_acceptance,
            )
            if timing is not None:
                after = timing.round()
                speed = timing.speed((before, after) if probes is None else (probes.window,))
                measured = [
                    replace(run, timing_rounds=(before, after), machine_speed=speed)
                    for run in measured
                ]
                before = after
            for index, run in zip(order, measured, strict=True):
                runs[index].append(run)
                if on_progress is not None:
                    resolved = resolved_cells[index]
                    on_progress(
                        f"{resolved.config.policy} C={resolved.workload.max_concurrency} "
                        f"trial {trial + 1}"
                    )
    if timing is not None:
        retimed = timing.profile()
        resolved_cells = [with_latency_from(resolved, retimed) for resolved in resolved_cells]
    replay_pair = None if drawn_acceptance else pair  # drawn tokens have nothing to replay
    results = [
        cell_result(resolved, own, replay_pair)
        for resolved, own in zip(resolved_cells, runs, strict=True)
    ]
    return results if timing is None else with_machine_spread(results)


def machine_speed_sigma(cells: Sequence[CellResult]) -> float:
    """The log standard deviation of every real trial's machine speed (`TimingRounds.speed`)
    over the cells: how far the machine's speed moved between the runs the simulator is priced
    for (NaN below 3 speeds)."""
    speeds = np.array([s for cell in cells for s in cell.trial_speeds], dtype=np.float64)
    speeds = speeds[np.isfinite(speeds) & (speeds > 0)]
    return float(np.std(np.log(speeds), ddof=1)) if speeds.size >= 3 else float("nan")


def with_machine_spread(cells: Sequence[CellResult]) -> list[CellResult]:
    """The cells with each simulated interval widened by the machine's speed spread over the
    validation (`machine_speed_sigma`, `sim.interval.with_speed_spread`): a prediction for a
    run on this machine, whose speed the simulator's re-runs hold fixed. Unchanged without
    timing rounds (no speeds)."""
    sigma = machine_speed_sigma(cells)
    if not math.isfinite(sigma):
        return list(cells)
    return [replace(cell, simulated=with_speed_spread(cell.simulated, sigma)) for cell in cells]


class SpeedProbes:
    """Called after every step of a real trial: times one profile point (`TimingRounds.probe`,
    B <= the trial's C) into a round of the trial's own whenever the probes so far took less
    than `share` of the time since the trial's first step less the probes' own."""

    def __init__(
        self, timing: TimingRounds, max_concurrency: int | None, share: float = PROBE_SHARE
    ) -> None:
        self.timing = timing
        self.window = timing.open_window()
        self.max_batch = max_concurrency or max(b for _c, b, _k in timing.decode_keys)
        self.share = share
        self._mark_s = time.perf_counter()
        self._steps_s = 0.0
        self._probes_s = 0.0

    def __call__(self) -> None:
        start_s = time.perf_counter()
        self._steps_s += start_s - self._mark_s
        if self._probes_s < self.share * self._steps_s:
            self.timing.probe(self.window, self.max_batch)
        self._mark_s = time.perf_counter()
        self._probes_s += self._mark_s - start_s


def validate_against_vllm(result: VllmBenchResult, config: RunConfig) -> CellResult:
    """The simulator on the file's workload (profile and policy from `config`) vs the file."""
    resolved = resolve(config, workload=result.workload)
    simulated = simulated_run(resolved)
    interval = interval_metrics(resolved, simulated.metrics, redraw_workload=False)
    return CellResult(
        policy=config.policy,
        max_concurrency=result.workload.max_concurrency,
        measured=dict(result.metrics),
        simulated={**simulated.metrics, **interval},
        num_prompts=len(result.workload.requests),
        measured_steps=None,
        simulated_steps=simulated.steps,
        host_overhead_source=resolved.host_overhead_source,
    )
