"""Prediction intervals: how far a simulated run's figures move with the workload's own sampling.

`prediction_interval` re-runs the same config on `runs` seeds derived from the run's own
(`interval_seeds`, so it is deterministic for a seed) and states, for each of `INTERVAL_KEYS`,
the interval another draw falls in with probability `level` (docs/simulator.md, "Prediction
intervals").

It is not the latency model's error (the step prices are the same in every re-run) nor the
measuring machine's noise; validation checks how often measured runs fall inside
(`validation.report`, "coverage"). Each re-run costs one simulation, so `dsd simulate` runs none
unless asked (`--interval-runs`).
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
    for each of `INTERVAL_KEYS`, `interval_level` and `interval_runs` (the draws behind it);
    {} when the config asks for no re-runs."""
    interval = prediction_interval(resolved, metrics, redraw_workload=redraw_workload)
    if interval is None:
        return {}
    flat: dict[str, Any] = {"interval_level": interval.level, "interval_runs": interval.runs}
    for key, (low, high) in interval.bounds.items():
        flat[f"{key}_lo"], flat[f"{key}_hi"] = low, high
    return flat


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
    from scipy.stats import norm  # only where intervals are asked for

    widened = dict(metrics)
    if not (math.isfinite(speed_sigma) and speed_sigma >= 0) or "interval_level" not in metrics:
        return widened
    z = float(norm.ppf(0.5 + level / 2))
    for key in (*TIME_KEYS, *RATE_KEYS):
        low, high = _metric(metrics, f"{key}_lo"), _metric(metrics, f"{key}_hi")
        if not (math.isfinite(low) and math.isfinite(high)):
            continue
        center, half = (low + high) / 2.0, (high - low) / 2.0
        half = math.hypot(half, z * speed_sigma * abs(center))
        widened[f"{key}_sampling_lo"], widened[f"{key}_sampling_hi"] = low, high
        widened[f"{key}_lo"], widened[f"{key}_hi"] = center - half, center + half
    widened["interval_speed_sigma"] = speed_sigma
    return widened
