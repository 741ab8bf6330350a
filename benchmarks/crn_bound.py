"""How much of a policy's per-seed gap at the RL rollout is the workload's, out of reach of CRN.

At crn_variance.py's "rl-rollout N=64" point (PR #32374 H100 profile, heterogeneous acceptance,
64 requests at t=0, lognormal outputs of median 256) every static K = 0..5 and each dynamic
policy run on an n x n grid of seeds: the workload (the rollout's output lengths, seed w's
children 0..2 in traces.registry) from seed w, the simulator's streams (acceptance, latency
noise, policy: sim.resolve.sim_seed_streams) from seed a. The workload is built with seed w and
handed to `resolve` (its `workload` argument), whose config carries seed a: no library change.
A policy's gap in a cell is its TPOT over the envelope's in the same cell, minus 1; the
envelope is the static K with the lowest mean TPOT on the diagonal. For n paired gaps each:

    total            w = a = s (every run: crn_variance.py's "after" figures)
    workload only    w = s, a = 0 (the acceptance and policy luck held fixed)
    acceptance only  w = 0, a = s (the workload held fixed)

the per-seed standard deviation and the 95% Student-t half-width of the mean gap. From the
whole grid (two-way random-effects ANOVA, one run a cell) the variance of the workload's effect
on the gap averaged over the acceptance streams: what stays however the acceptance is drawn
while each seed draws its own workload ("floor"), and a one-sided 95% upper bound on it (from
the workload mean square, whose expectation is n times the floor's variance plus the
interaction's). `--k-timing same-step` is what results/crn/before.json and after.json ran
with (next-step is the default since commit 5f4c391); `--requests` shrinks the rollout (a
quick check; the figures are for 64).

    python benchmarks/crn_bound.py --seeds 8 --json results/crn/bound.json
    python benchmarks/crn_bound.py --k-timing same-step --json results/crn/bound_same_step.json

One process, n * n * 10 runs. Simulated time only: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from crn_variance import POINTS, POLICIES, PROFILE, STATIC
from scipy import stats

from dsd.common.atomic import atomic_write_json
from dsd.policies.types import K_TIMINGS
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.config import RunConfig
from dsd.sim.resolve import config_workload, resolve

POINT = "rl-rollout N=64"


def measure(num_seeds: int, num_requests: int, k_timing: str) -> dict[str, Any]:
    base = {**POINTS[POINT], "k_timing": k_timing}
    base["rollout"] = dataclasses.replace(base["rollout"], num_requests=num_requests)
    profile = str(Path(__file__).resolve().parent.parent / PROFILE)
    start = time.perf_counter()
    tpot: dict[str, np.ndarray] = {}  # spec -> [w, a] mean TPOT, ms
    for w in range(num_seeds):
        workload = config_workload(RunConfig(profile=profile, policy="static:0", seed=w, **base))
        for a in range(num_seeds):
            for spec in (*STATIC, *POLICIES):
                config = RunConfig(profile=profile, policy=spec, seed=a, **base)
                resolved = resolve(config, workload=workload)
                run = build_engine(resolved, fitted_executor(resolved)).run()
                grid = tpot.setdefault(spec, np.zeros((num_seeds, num_seeds)))
                grid[w, a] = run.metrics["mean_tpot_ms"]
    n = num_seeds
    envelope = min(STATIC, key=lambda s: float(np.mean(np.diag(tpot[s]))))
    t = float(stats.t.ppf(0.975, n - 1))
    rows = []
    for spec in POLICIES:
        gaps = tpot[spec] / tpot[envelope] - 1.0  # [w, a]
        designs = {"total": np.diag(gaps), "workload": gaps[:, 0], "acceptance": gaps[0, :]}
        row: dict[str, Any] = {"policy": spec, "envelope": envelope}
        for name, values in designs.items():
            sd = float(values.std(ddof=1))
            row[f"{name}_gaps_pct"] = [100 * float(v) for v in values]
            row[f"{name}_sd_pct"] = 100 * sd
            row[f"{name}_ci95_pct"] = 100 * t * sd / math.sqrt(n)
        # Two-way random effects without replication: E[MS_w] = var_wa + n var_w
        rows_mean, cols_mean = gaps.mean(axis=1), gaps.mean(axis=0)  # [w], [a]
        resid = gaps - rows_mean[:, None] - cols_mean[None, :] + gaps.mean()  # [w, a]
        ms_inter = float((resid**2).sum()) / (n - 1) ** 2
        var_w = max(0.0, (n * float(rows_mean.var(ddof=1)) - ms_inter) / n)
        var_a = max(0.0, (n * float(cols_mean.var(ddof=1)) - ms_inter) / n)
        row["anova_sd_pct"] = {
            "workload": 100 * math.sqrt(var_w),
            "acceptance": 100 * math.sqrt(var_a),
            "interaction": 100 * math.sqrt(ms_inter),
        }
        row["floor_ci95_pct"] = 100 * t * math.sqrt(var_w) / math.sqrt(n)
        # var_w <= E[MS_w] / n, and (n - 1) MS_w / E[MS_w] is chi-square with n - 1 dof
        upper = (n - 1) * float(rows_mean.var(ddof=1)) / float(stats.chi2.ppf(0.05, n - 1))
        row["floor_sd_upper95_pct"] = 100 * math.sqrt(upper)
        row["floor_ci95_upper95_pct"] = 100 * t * math.sqrt(upper) / math.sqrt(n)
        row["grid_gaps_pct"] = (100 * gaps).round(5).tolist()
        rows.append(row)
    return {
        "point": POINT,
        "k_timing": k_timing,
        "num_requests": num_requests,
        "num_seeds": n,
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }


def _print_run(run: dict[str, Any]) -> None:
    print(
        f"{run['point']} ({run['num_requests']} requests, K timing {run['k_timing']}), "
        f"{run['num_seeds']} seeds, "
        f"{run['seconds']:.0f} s; 95% CI half-width of the mean gap, %"
    )
    print(
        f"{'policy':<12} {'envelope':<9} {'total':>6} {'wl only':>7} {'acc only':>8} "
        f"{'wl share':>8} {'floor':>6} {'<=':>6}"
    )
    for row in run["rows"]:
        total = row["total_ci95_pct"]
        share = f"{(row['workload_ci95_pct'] / total) ** 2:>8.2f}" if total > 0 else f"{'-':>8}"
        print(
            f"{row['policy']:<12} {row['envelope']:<9} {total:>6.3f} "
            f"{row['workload_ci95_pct']:>7.3f} {row['acceptance_ci95_pct']:>8.3f} {share} "
            f"{row['floor_ci95_pct']:>6.3f} {row['floor_ci95_upper95_pct']:>6.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="rollout size (64: the point)")
    parser.add_argument("--k-timing", choices=K_TIMINGS, default="next-step")
    parser.add_argument("--json", help="write the run here")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        print("error: --seeds: need at least 2 for a confidence interval", file=sys.stderr)
        return 2
    if args.requests < 1:
        print(f"error: --requests: must be >= 1, got {args.requests}", file=sys.stderr)
        return 2
    run = measure(args.seeds, args.requests, args.k_timing)
    _print_run(run)
    if args.json:
        try:
            atomic_write_json(args.json, run, indent=1)
        except OSError as exc:
            print(f"error: --json {args.json}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
