"""Simulated vs measured: run the same cells on the fitted simulator and on the real backend.

A **cell** is one `RunConfig` (a policy SPEC at a max concurrency C), resolved once
(`backend.real.resolve_real`) and run twice through `sim.build.build_engine`:
- the **simulator** with `fitted_executor`: latency and acceptance models fitted from the
  PROFILE ONLY (never from the validation runs); it charges the profile's measured host
  overhead per step unless the config sets `host_overhead_ms` (`CellResult.host_overhead_source`);
- the **real engine** with a `TorchExecutor` on the wall clock, exactly like `dsd run`, with
  EOS ignored (like `vllm bench serve --ignore-eos`) so output lengths match.
So limits (max_num_seqs, max_model_len, KV pool, token budget), policy, workload and seed are
identical on both sides.

`validate_against_vllm` does the simulator half for a `vllm bench serve --save-result` file: its
per-request `input_lens` / `output_lens`, `max_concurrency`, `request_rate` and `burstiness`
become the workload, and its recorded metrics are the measured side.

Errors are (simulated - measured) / measured in percent. With `TimingRounds`, the profile's
points are timed again before and after every real trial, and the simulated side of every cell
is priced by those samples (`sim.resolve.with_latency_from`): the simulator and the runs then
see the same stretch of a drifting machine. The machine drifts within a trial too, so a
closed-loop trial also times one profile point between its steps whenever such probes have
taken less than `PROBE_SHARE` of its step time (the steps' own timing leaves them out), and its
machine speed is read from them (`TimingRounds.speed`: > 1 slower; the rounds around it for an
open-loop trial). A cell reports each trial's speed and the error left once every trial's
measured times are divided by it (`speed_adjusted_error_pct`). This module does not parse flags,
load models or write files (`dsd validate` and `reports.validation` do).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsd.backend.fast_path import EnginePool
from dsd.backend.pair import ModelPair
from dsd.backend.real import real_engine, run_output_ids, run_prompt_ids, run_step_table
from dsd.backend.replay import pair_replay_recording
from dsd.common.errors import InputError
from dsd.common.user_files import parse_user_json, read_user_text
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import RunConfig
from dsd.sim.engine import RunResult, run_interleaved
from dsd.sim.metrics import TPOT_TTFT_KEYS
from dsd.sim.resolve import ResolvedRun, resolve, with_latency_from
from dsd.traces.arrivals import validate_rate, with_arrivals
from dsd.traces.workload import RequestSpec, Workload

if TYPE_CHECKING:
    from dsd.backend.profiler import TimingRounds

# Metrics compared per cell: vLLM bench keys (ms).
COMPARED_METRICS: tuple[str, ...] = (*TPOT_TTFT_KEYS, "mean_itl_ms", "mean_e2el_ms")
# Largest per-request token count read: far above any model's context (2**24 = 16.8 M tokens),
# far below what would overflow the simulator's int64 token arithmetic.
MAX_REQUEST_TOKENS = 2**24
# Keys a vLLM result file must have for a comparison (the rest are optional).
VLLM_REQUIRED_KEYS: tuple[str, ...] = ("input_lens", "output_lens", "max_concurrency")
VLLM_METRIC_KEYS: tuple[str, ...] = (
    *COMPARED_METRICS,
    "output_throughput",
    "request_throughput",
)
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
) -> list[MeasuredRun]:
    """The real engine's runs of resolved cells, EOS ignored (output lengths as simulated), in
    their order. Several cells (closed loop only) run interleaved a step at a time
    (`sim.engine.run_interleaved`): each run's clock holds only its own steps, and the drift of
    a shared machine over seconds lands on all of them alike. `between_steps` (closed-loop
    cells only) runs after every step, outside the steps' time; `engines`: the pool of the
    measurement (a fast path's shapes kept across its runs), the i-th cell on its lane i."""
    built = [
        real_engine(
            resolved,
            pair,
            temperature=temperature,
            ignore_eos=True,
            fast_path=fast_path,
            engines=None if engines is None else engines.lane(lane),
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
    recorded request i, `sim.replay`); None without a draft (nothing to replay)."""
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
    return CellResult(
        policy=resolved.config.policy,
        max_concurrency=resolved.workload.max_concurrency,
        measured=median_metrics([run.metrics for run in runs]),
        simulated=dict(simulated.metrics),
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
    same number of trials (at least one: the first round always runs)."""
    if trials < 1:
        raise InputError(f"--trials: must be >= 1, got {trials}")
    runs: list[list[MeasuredRun]] = [[] for _ in resolved_cells]
    groups = interleaved_groups(resolved_cells)
    engines = EnginePool()  # a fast path's engine (its CUDA graphs) serves every run of its config
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
            probes = None
            if timing is not None and workload.closed_loop:
                probes = SpeedProbes(timing, workload.max_concurrency)
            measured = measured_runs(
                cells, pair, fast_path=fast_path, between_steps=probes, engines=engines
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
    return [
        cell_result(resolved, own, pair) for resolved, own in zip(resolved_cells, runs, strict=True)
    ]


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


# ---------------------------------------------------------------------------- vLLM result file
@dataclass(frozen=True)
class VllmBenchResult:
    """What a `vllm bench serve --save-result` file says about its run."""

    source: str  # file name, for messages
    workload: Workload  # requests from input_lens/output_lens, cap and arrivals
    request_rate: float  # requests/s; inf: all at once
    burstiness: float  # gamma shape of the gaps (1: Poisson)
    metrics: dict[str, Any]  # the file's metric keys that we compare (VLLM_METRIC_KEYS present)
    info: dict[str, Any]  # date, backend, model_id, num_prompts, completed, duration


def _short(value: Any) -> str:
    """repr of a value cut to one short line (a huge number or list stays readable)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_lens(source: str, data: dict[str, Any], key: str, minimum: int) -> list[int]:
    values = data[key]
    if not isinstance(values, list) or not values:
        raise InputError(f"{source}: {key}: must be a non-empty list of integers")
    for index, value in enumerate(values):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not minimum <= value <= MAX_REQUEST_TOKENS
        ):
            raise InputError(
                f"{source}: {key}[{index}]: must be an integer >= {minimum} (at most 2**24), "
                f"got {_short(value)}"
            )
    return values


def _check_metric(source: str, key: str, value: Any) -> float:
    """A recorded metric (ms, tokens/s, requests/s): a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{source}: {key}: must be a number, got {_short(value)}")
    number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{source}: {key}: must be a finite number >= 0, got {_short(value)}")
    return number


def parse_vllm_result(data: Any, source: str, seed: int = 0) -> VllmBenchResult:
    """Validate a vLLM bench result object (InputError naming file and key) -> its workload.

    Failed requests (output length 0 or a non-empty `errors[i]`) are left out, as vLLM leaves
    them out of its metrics. A finite `request_rate` re-times the requests with the seed
    (the file records the rate, not the send times).
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: top level must be a JSON object, got {type(data).__name__}")
    for key in VLLM_REQUIRED_KEYS:
        if key not in data:
            raise InputError(
                f"{source}: missing key {key!r} (a `vllm bench serve --save-result` file?)"
            )
    input_lens = _check_lens(source, data, "input_lens", 1)
    output_lens = _check_lens(source, data, "output_lens", 0)
    if len(input_lens) != len(output_lens):
        raise InputError(
            f"{source}: input_lens has {len(input_lens)} entries, output_lens {len(output_lens)}"
        )
    errors = data.get("errors")
    if errors is not None:
        if not isinstance(errors, list) or len(errors) != len(input_lens):
            raise InputError(f"{source}: errors: must be a list with one entry per request")
        for index, error in enumerate(errors):
            if error is not None and not isinstance(error, str):
                raise InputError(
                    f"{source}: errors[{index}]: must be a string (empty: no error), "
                    f"got {_short(error)}"
                )
    cap = data["max_concurrency"]
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_REQUEST_TOKENS
    ):
        raise InputError(
            f"{source}: max_concurrency: must be null or an integer >= 1 (at most 2**24), "
            f"got {_short(cap)}"
        )
    raw_rate = data.get("request_rate", "inf")
    if raw_rate in ("inf", "Infinity", None):
        request_rate = math.inf
    elif (
        isinstance(raw_rate, int | float)
        and not isinstance(raw_rate, bool)
        and _finite_or_inf(raw_rate)
        and raw_rate > 0
    ):
        request_rate = float(raw_rate)
    else:
        raise InputError(f'{source}: request_rate: must be > 0 or "inf", got {_short(raw_rate)}')
    raw_burst = data.get("burstiness", 1.0)
    if (
        isinstance(raw_burst, bool)
        or not isinstance(raw_burst, int | float)
        or not _finite_or_inf(raw_burst)
        or not raw_burst > 0
    ):
        raise InputError(f"{source}: burstiness: must be a number > 0, got {_short(raw_burst)}")
    burstiness = float(raw_burst)
    try:
        validate_rate(request_rate, burstiness)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    metrics: dict[str, Any] = {}
    for key in VLLM_METRIC_KEYS:
        if key in data:
            metrics[key] = _check_metric(source, key, data[key])
    if "mean_tpot_ms" not in metrics:
        raise InputError(f"{source}: missing key 'mean_tpot_ms'")
    requests = []
    for index, (prompt_len, output_len) in enumerate(zip(input_lens, output_lens, strict=True)):
        failed = output_len == 0 or bool(errors and errors[index])
        if not failed:
            requests.append(RequestSpec(prompt_len=prompt_len, output_len=output_len))
    if not requests:
        raise InputError(f"{source}: no successful request (every output_lens entry is 0)")
    workload = Workload(name=Path(source).stem, requests=tuple(requests), max_concurrency=cap)
    if math.isfinite(request_rate):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,)))
        workload = with_arrivals(workload, request_rate, burstiness, rng=rng)
    info = {
        key: data.get(key)
        for key in ("date", "backend", "model_id", "num_prompts", "completed", "duration")
        if key in data
    }
    return VllmBenchResult(
        source=source,
        workload=workload,
        request_rate=request_rate,
        burstiness=burstiness,
        metrics=metrics,
        info=info,
    )


def _finite_or_inf(value: int | float) -> bool:
    """False for NaN and for an integer too large to be a float (it is no rate)."""
    if isinstance(value, int):
        return abs(value) < 2**1023
    return not math.isnan(value)


def load_vllm_result(path: str | Path, seed: int = 0) -> VllmBenchResult:
    """Read and validate a `vllm bench serve --save-result` JSON file.

    Errors name the path as given. The text is UTF-8 (a BOM allowed); NaN/Infinity literals
    parse (Python's json, which vLLM writes with, emits them) and are then refused where a
    number must be finite.
    """
    source = str(path)
    try:
        text = read_user_text(path, source)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None
    data = parse_user_json(text, source, allow_nonfinite=True)
    return parse_vllm_result(data, source, seed=seed)


def validate_against_vllm(result: VllmBenchResult, config: RunConfig) -> CellResult:
    """The simulator on the file's workload (profile and policy from `config`) vs the file."""
    resolved = resolve(config, workload=result.workload)
    simulated = simulated_run(resolved)
    return CellResult(
        policy=config.policy,
        max_concurrency=result.workload.max_concurrency,
        measured=dict(result.metrics),
        simulated=dict(simulated.metrics),
        measured_steps=None,
        simulated_steps=simulated.steps,
        host_overhead_source=resolved.host_overhead_source,
    )
