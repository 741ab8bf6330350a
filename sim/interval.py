"""Prediction intervals: how far a simulated run's figures move with the workload's own sampling.

`prediction_interval` re-runs the same config on `runs` seeds derived from the run's own
(`interval_seeds`, so it is deterministic for a seed) and states, for each of `INTERVAL_KEYS`,
the interval another draw falls in with probability `level` (docs/simulator.md, "Prediction
intervals").

The re-runs price every step alike, so they do not move with the latency model's error: where
the profile was taken on our torch engine (its `device_type`), each interval is widened by that
error as the committed real-hardware reports measured it (`TIMING_ERROR_P90_PCT`, in
quadrature). It is not the measuring machine's noise during a validation (`with_speed_spread`);
validation checks how often measured runs fall inside (`validation.report`, "coverage"). Each
re-run costs one simulation, so `dsd simulate` runs none unless asked (`--interval-runs`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsd.common.errors import require_int
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import MAX_INTERVAL_RUNS
from dsd.sim.engine import LoopConfig
from dsd.sim.metrics import discard_steps
from dsd.sim.resolve import ResolvedRun, resolve

# The figures an interval is stated for (vLLM bench keys of the run's metrics).
INTERVAL_KEYS: tuple[str, ...] = (
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_ttft_ms",
    "mean_itl_ms",
    "output_throughput",
    "acceptance_length",
)
DEFAULT_LEVEL = 0.90
# The figures a slower or faster machine moves (times up, throughput down, by one factor)
TIME_KEYS: tuple[str, ...] = ("mean_tpot_ms", "median_tpot_ms", "mean_ttft_ms", "mean_itl_ms")
RATE_KEYS: tuple[str, ...] = ("output_throughput",)
# Re-runs of a validation cell: with the run itself 9 draws, t(0.95, 8) = 1.86 (1.64 for
# infinitely many), and nine simulations of a cell cost far less than one real trial of it.
VALIDATION_INTERVAL_RUNS = 8
# A child of the run's seed no other stream uses (sim.build's streams take the low indices).
_INTERVAL_STREAM = 0x1D7E
# The simulator's own error against our torch engine, by the profile's device type: per figure,
# the 90th percentile of |simulated / measured - 1| in % over the in-sample cells of committed
# real-hardware reports (each replays its run's own drafts: the timing part alone). CPU:
# results/validation/2026-11-27e, 27f, 28 and 28b (112 cells); CUDA: results/gpu/2026-11-27-h100,
# 2026-11-27-h200 and 2026-11-28-h100 (84 cells; prefill on the GPU is priced far worse than
# decode). Throughput takes mean TPOT's (the reports score no throughput error).
TIMING_ERROR_P90_PCT: dict[str, dict[str, float]] = {
    "cpu": {
        "mean_tpot_ms": 5.8,
        "median_tpot_ms": 6.0,
        "mean_itl_ms": 5.8,
        "output_throughput": 5.8,
        "mean_ttft_ms": 7.7,
    },
    "cuda": {
        "mean_tpot_ms": 6.9,
        "median_tpot_ms": 6.5,
        "mean_itl_ms": 6.9,
        "output_throughput": 6.9,
        "mean_ttft_ms": 203.5,
    },
}


def interval_seeds(seed: int, runs: int) -> list[int]:
    """The seeds of a run's `runs` re-runs: a function of `seed` alone, none equal to it."""
    state = np.random.SeedSequence([seed, _INTERVAL_STREAM]).generate_state(runs, dtype=np.uint64)
    seeds = [int(value) >> 1 for value in state]  # below 2**63: any int64 consumer takes them
    return [value + 1 if value == seed else value for value in seeds]


@dataclass(frozen=True)
class PredictionInterval:
    """Per figure, the (low, high) that another draw of the workload falls in with `level`."""

    level: float
    runs: int  # draws behind it: the run and its re-runs
    bounds: dict[str, tuple[float, float]]

    def text(self, key: str, digits: int = 1) -> str:
        """'90%: 58.1-67.0' for `key` ('' without a finite interval for it)."""
        low, high = self.bounds.get(key, (math.nan, math.nan))
        if not (math.isfinite(low) and math.isfinite(high)):
            return ""
        return f"{self.level:.0%}: {low:.{digits}f}-{high:.{digits}f}"

    def to_json(self) -> dict[str, Any]:
        """{"level", "runs", KEY: [low, high], ...} (strict JSON writes NaN as null)."""
        return {
            "level": self.level,
            "runs": self.runs,
            **{key: [low, high] for key, (low, high) in self.bounds.items()},
        }


def interval_of(
    samples: Mapping[str, list[float]], level: float = DEFAULT_LEVEL
) -> PredictionInterval:
    """The normal-sample prediction interval of each key's draws (NaN bounds where fewer than
    2 of them are finite)."""
    from scipy.stats import t as student_t  # only where intervals are asked for

    bounds: dict[str, tuple[float, float]] = {}
    runs = 0
    for key, values in samples.items():
        finite = np.array([v for v in values if math.isfinite(v)], dtype=np.float64)
        runs = max(runs, len(values))
        if finite.size < 2:
            bounds[key] = (math.nan, math.nan)
            continue
        n = finite.size
        half = float(student_t.ppf(0.5 + level / 2, n - 1)) * float(finite.std(ddof=1))
        half *= math.sqrt(1.0 + 1.0 / n)
        center = float(finite.mean())
        bounds[key] = (center - half, center + half)
    return PredictionInterval(level=level, runs=runs, bounds=bounds)


def _metric(metrics: Mapping[str, Any], key: str) -> float:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def prediction_interval(
    resolved: ResolvedRun,
    metrics: Mapping[str, Any],
    runs: int | None = None,
    *,
    redraw_workload: bool = True,
    level: float = DEFAULT_LEVEL,
) -> PredictionInterval | None:
    """The interval of a simulated run of `resolved` whose figures are `metrics`: `runs`
    (None: the config's `interval_runs`) re-runs on `interval_seeds`. `redraw_workload`: each
    re-run resolves its config again, so a workload its seed draws is drawn again (False: the
    same requests and the same resolved models, as a validation cell's real side ran them).
    None when `runs` is 0."""
    runs = resolved.config.interval_runs if runs is None else runs
    require_int(runs, "interval_runs", 0, MAX_INTERVAL_RUNS)
    if runs == 0:
        return None
    samples = {key: [_metric(metrics, key)] for key in INTERVAL_KEYS}
    for seed in interval_seeds(resolved.config.seed, runs):
        config = dataclasses.replace(resolved.config, seed=seed)
        again = resolve(config) if redraw_workload else dataclasses.replace(resolved, config=config)
        engine = build_engine(again, fitted_executor(again), LoopConfig(step_sink=discard_steps))
        result = engine.run()
        for key in INTERVAL_KEYS:
            samples[key].append(_metric(result.metrics, key))
    return interval_of(samples, level)


def interval_metrics(
    resolved: ResolvedRun, metrics: Mapping[str, Any], *, redraw_workload: bool = True
) -> dict[str, Any]:
    """The flat keys a run's result gains from its `prediction_interval`: KEY_lo and KEY_hi
    for each of `INTERVAL_KEYS` (widened by `TIMING_ERROR_P90_PCT` of the profile's device
    type, the sampling alone then under KEY_sampling_lo / _hi), `interval_level`,
    `interval_runs` (the draws behind it) and `interval_timing_error` (the device type whose
    error widened it, or "none"); {} when the config asks for no re-runs."""
    interval = prediction_interval(resolved, metrics, redraw_workload=redraw_workload)
    if interval is None:
        return {}
    flat: dict[str, Any] = {"interval_level": interval.level, "interval_runs": interval.runs}
    for key, (low, high) in interval.bounds.items():
        flat[f"{key}_lo"], flat[f"{key}_hi"] = low, high
    device = None if resolved.profile is None else resolved.profile.metadata.get("device_type")
    errors = TIMING_ERROR_P90_PCT.get(str(device), {})
    flat["interval_timing_error"] = str(device) if errors else "none"
    # a 90th percentile of |error| is a normal error's 90% half-width: sigma = p90 / z(0.95)
    z90 = _z(0.90)
    sigmas = {key: pct / 100.0 / z90 for key, pct in errors.items()}
    return _widened(flat, sigmas, interval.level)


def _z(level: float) -> float:
    """The normal quantile of a two-sided `level` interval (1.645 at 90%)."""
    from scipy.stats import norm  # only where intervals are asked for

    return float(norm.ppf(0.5 + level / 2))


def _widened(
    metrics: Mapping[str, Any], sigmas: Mapping[str, float], level: float
) -> dict[str, Any]:
    """`metrics` with each KEY_lo / KEY_hi of `sigmas` widened by z(level) x sigma x the
    figure, in quadrature; the interval before the first widening kept as KEY_sampling_lo /
    _hi (the workload's sampling alone)."""
    widened = dict(metrics)
    z = _z(level)
    for key, sigma in sigmas.items():
        low, high = _metric(metrics, f"{key}_lo"), _metric(metrics, f"{key}_hi")
        if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(sigma)):
            continue
        center, half = (low + high) / 2.0, (high - low) / 2.0
        half = math.hypot(half, z * sigma * abs(center))
        widened.setdefault(f"{key}_sampling_lo", low)
        widened.setdefault(f"{key}_sampling_hi", high)
        widened[f"{key}_lo"], widened[f"{key}_hi"] = center - half, center + half
    return widened


def interval_text(metrics: Mapping[str, Any], key: str, digits: int = 1) -> str:
    """'(90%: 58.1-67.0)' from a result's flat KEY_lo / KEY_hi ('' without them)."""
    low, high = _metric(metrics, f"{key}_lo"), _metric(metrics, f"{key}_hi")
    level = _metric(metrics, "interval_level")
    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(level)):
        return ""
    return f"({level:.0%}: {low:.{digits}f}-{high:.{digits}f})"


def with_speed_spread(
    metrics: Mapping[str, Any], speed_sigma: float, level: float = DEFAULT_LEVEL
) -> dict[str, Any]:
    """`metrics` whose interval keys (`interval_metrics`) are widened by a machine whose speed
    varies between runs with log standard deviation `speed_sigma`: each half-width and z(level)
    x sigma x the figure added in quadrature (times and throughput alike; acceptance length
    unchanged). The interval of the workload's sampling alone stays under KEY_sampling_lo /
    _hi; `interval_speed_sigma` records the sigma. Unchanged without an interval or a finite
    sigma."""
    if not (math.isfinite(speed_sigma) and speed_sigma >= 0) or "interval_level" not in metrics:
        return dict(metrics)
    widened = _widened(metrics, dict.fromkeys((*TIME_KEYS, *RATE_KEYS), speed_sigma), level)
    widened["interval_speed_sigma"] = speed_sigma
    return widened
