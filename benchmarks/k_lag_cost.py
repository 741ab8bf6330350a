"""What vLLM's one-step K lag costs a dynamic policy, in the simulator.

Under next-step K timing (vLLM 0.33, sync and async) the K a policy picks at step t is verified
at step t+1, whose batch may differ; under same-step timing (sync only) it is verified at step
t. Per policy and concurrency, the same MT-Bench workload (closed loop, 8 x C prompts) runs
under both timings on paired seeds of the PR #32374 H100 profile; the figure is the paired
gap of mean TPOT, next-step over same-step - 1, with its 95% interval (`reports.paired`):
positive = the lag costs that much. Policies that change K often (per-request, the bandit,
online) are where the lag could cost most; `hysteresis:goodput` predicts the next step's B
under next-step timing (its lookahead) to pay less.

    python benchmarks/k_lag_cost.py                      # 4 seeds, C = 4, 64, 256
    python benchmarks/k_lag_cost.py --seeds 8 --concurrency 16,256 --json out.json

Simulated time only: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dsd.cli.flags import int_list
from dsd.common.errors import InputError
from dsd.reports.paired import paired_gap
from dsd.sim.build import run_simulation
from dsd.sim.config import RunConfig

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
POLICIES = ("goodput", "hysteresis:goodput", "online", "per-request", "bandit:prior=profile")


def _tpot(policy: str, concurrency: int, seed: int, k_timing: str) -> float:
    config = RunConfig(
        profile=PROFILE,
        policy=policy,
        dataset="mt-bench",
        num_prompts=8 * concurrency,
        max_concurrency=concurrency,
        seed=seed,
        k_timing=k_timing,  # type: ignore[arg-type]
    )
    return float(run_simulation(config).metrics["mean_tpot_ms"])


def _lag_gap(policy: str, concurrency: int, seeds: int) -> dict[str, Any]:
    """One row: the paired gap of next-step over same-step mean TPOT, printed as it comes."""
    lagged = [_tpot(policy, concurrency, seed, "next-step") for seed in range(seeds)]
    same = [_tpot(policy, concurrency, seed, "same-step") for seed in range(seeds)]
    gap = paired_gap(lagged, same)
    print(
        f"{policy:<24} {concurrency:>4}  {100 * gap.mean:+.2f}% (+-{100 * gap.half_width:.2f})",
        flush=True,
    )
    return {
        "policy": policy,
        "concurrency": concurrency,
        "gap_pct": 100 * gap.mean,
        "half_width_pct": 100 * gap.half_width,
        "seeds": seeds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--concurrency", default="4,64,256", help="comma-separated C")
    parser.add_argument("--policy", action="append", help="policy SPEC (repeatable)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        print("error: --seeds: need >= 2 for an interval", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    try:
        concurrencies = int_list("--concurrency", args.concurrency, 1)
        print(f"{'policy':<24} {'C':>4}  next-step vs same-step mean TPOT (95% CI)")
        for policy in args.policy or POLICIES:
            for concurrency in concurrencies:
                rows.append(_lag_gap(policy, concurrency, args.seeds))
    except InputError as exc:  # a bad SPEC or value: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"profile": PROFILE, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
