"""How well a few seeds resolve a policy's gap to the static-K envelope (paired, per seed).

At each point (MT-Bench closed loop at C = 1, 4, 16; an RL rollout of N = 64) every static K
= 0..5 and each dynamic policy run on seeds 0..n-1 of the PR #32374 H100 profile
(heterogeneous acceptance, as reports/policy_eval). The envelope is the static K with the
lowest seed-mean TPOT; a policy's gap at a seed is its TPOT over the envelope's at the same seed,
minus 1; the point's figure is the 95% confidence half-width of the mean gap (Student t over
the n paired gaps) and the per-seed standard deviation. Smaller is better: the seeds a target
width needs grow with the variance.

Run it on two trees to compare them (the same script, the other tree first on PYTHONPATH):

    python benchmarks/crn_variance.py --seeds 8 --json after.json
    PYTHONPATH=/tmp/before python benchmarks/crn_variance.py --seeds 8 --json before.json
    python benchmarks/crn_variance.py --compare before.json after.json

Prints one row per (point, policy); `--compare` prints the two runs side by side with the
variance ratio. Simulated time only: the figures do not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import sys
import time
from typing import Any

import numpy as np
from scipy import stats

from dsd.common.atomic import atomic_write_json
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import RunConfig
from dsd.sim.resolve import resolve
from dsd.traces.rollout import RolloutConfig

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
STATIC = tuple(f"static:{k}" for k in range(6))
POLICIES = ("goodput", "online", "per-request", "bandit")
POINTS: dict[str, dict[str, Any]] = {
    **{
        f"mt-bench C={c}": {
            "dataset": "mt-bench",
            "num_prompts": max(4 * c, 64),
            "max_concurrency": c,
            "acceptance_model": "heterogeneous",
        }
        for c in (1, 4, 16)
    },
    "rl-rollout N=64": {
        "dataset": "rl-rollout",
        "rollout": RolloutConfig(num_requests=64, output_median=256.0, max_output_len=2048),
        "acceptance_model": "heterogeneous",
    },
}


# results/crn's before and after trees predate K timing: every step verified its own K. Ask for
# that ("same-step") where the tree has the field (next-step is the default since), so the
# committed figures reproduce on either tree.
SAME_STEP: dict[str, Any] = (
    {"k_timing": "same-step"}
    if "k_timing" in {field.name for field in dataclasses.fields(RunConfig)}
    else {}
)


def _mean_tpot_ms(task: tuple[str, str, int]) -> float:
    point, spec, seed = task
    config = RunConfig(profile=PROFILE, policy=spec, seed=seed, **POINTS[point], **SAME_STEP)
    resolved = resolve(config)
    return float(build_engine(resolved, fitted_executor(resolved)).run().metrics["mean_tpot_ms"])


def measure(num_seeds: int, workers: int) -> dict[str, Any]:
    tasks = [
        (point, spec, seed)
        for point in POINTS
        for spec in (*STATIC, *POLICIES)
        for seed in range(num_seeds)
    ]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        values = pool.map(_mean_tpot_ms, tasks, chunksize=4)
    tpot: dict[str, dict[str, list[float]]] = {}
    for (point, spec, _), value in zip(tasks, values, strict=True):
        tpot.setdefault(point, {}).setdefault(spec, []).append(value)
    rows = []
    t = float(stats.t.ppf(0.975, num_seeds - 1))
    for point, by_spec in tpot.items():
        envelope = min(STATIC, key=lambda s: float(np.mean(by_spec[s])))
        for spec in POLICIES:
            gaps = np.array(by_spec[spec]) / np.array(by_spec[envelope]) - 1.0  # [n]
            sd = float(gaps.std(ddof=1))
            rows.append(
                {
                    "point": point,
                    "policy": spec,
                    "envelope": envelope,
                    "mean_gap_pct": 100 * float(gaps.mean()),
                    "sd_pct": 100 * sd,
                    "ci95_half_width_pct": 100 * t * sd / math.sqrt(num_seeds),
                }
            )
    return {
        "num_seeds": num_seeds,
        "seconds": time.perf_counter() - start,
        "workers": workers,
        "rows": rows,
    }


def _print_run(run: dict[str, Any]) -> None:
    print(f"{run['num_seeds']} seeds, {run['seconds']:.0f} s on {run['workers']} workers")
    print(f"{'point':<18} {'policy':<12} {'envelope':<9} {'gap %':>7} {'sd %':>6} {'CI +-%':>7}")
    for row in run["rows"]:
        print(
            f"{row['point']:<18} {row['policy']:<12} {row['envelope']:<9} "
            f"{row['mean_gap_pct']:>+7.2f} {row['sd_pct']:>6.2f} {row['ci95_half_width_pct']:>7.2f}"
        )


def _compare(before: dict[str, Any], after: dict[str, Any]) -> None:
    print(f"95% CI half-width of the mean gap, {before['num_seeds']} vs {after['num_seeds']} seeds")
    print(
        f"{'point':<18} {'policy':<12} {'before %':>9} {'after %':>8} {'width x':>8} {'var x':>7}"
    )
    ratios = []
    for old, new in zip(before["rows"], after["rows"], strict=True):
        widths = f"{old['ci95_half_width_pct']:>9.2f} {new['ci95_half_width_pct']:>8.2f}"
        if new["sd_pct"] > 0:
            ratio = old["sd_pct"] / new["sd_pct"]
            ratios.append(ratio)
            change = f"{ratio:>8.1f} {ratio**2:>7.1f}"
        else:  # the policy did the envelope's exact work at every seed: nothing to resolve
            change = f"{'-':>8} {'-':>7}"
        print(f"{old['point']:<18} {old['policy']:<12} {widths} {change}")
    print(
        f"median width ratio {float(np.median(ratios)):.1f}x (variance "
        f"{float(np.median(ratios)) ** 2:.1f}x), smallest {min(ratios):.1f}x, over the "
        f"{len(ratios)} rows with a spread after ('-': identical to the envelope at every seed)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write the run here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        runs = []
        for path in args.compare:
            try:
                with open(path, encoding="utf-8") as handle:
                    runs.append(json.load(handle))
            except (OSError, ValueError) as exc:
                print(f"error: --compare {path}: {exc}", file=sys.stderr)
                return 2
        _compare(*runs)
        return 0
    if args.seeds < 2:
        print("error: --seeds: need at least 2 for a confidence interval", file=sys.stderr)
        return 2
    run = measure(args.seeds, args.workers)
    _print_run(run)
    if args.json:
        atomic_write_json(args.json, run, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
