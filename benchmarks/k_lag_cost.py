"""What vLLM's one-step K lag costs a dynamic policy: in the simulator, and on the real engine.

Under next-step K timing (vLLM 0.33, sync and async) the K a policy picks at step t is verified
at step t+1, whose batch may differ; under same-step timing (sync only) it is verified at step
t. Per policy and concurrency the same workload runs under both timings and the figure is the
paired gap of mean TPOT, next-step over same-step - 1, with its 95% interval
(`reports.paired`): positive = the lag costs that much. Policies that change K often
(per-request, the bandit, online) are where the lag could cost most; `hysteresis:goodput`
predicts the next step's B under next-step timing (its lookahead) to pay less.

Simulated (the default): MT-Bench closed loop, 8 x C prompts, paired seeds of the PR #32374
H100 profile. Simulated time only: the figures do not depend on the machine.

    python benchmarks/k_lag_cost.py                      # 4 seeds, C = 4, 64, 256
    python benchmarks/k_lag_cost.py --seeds 8 --concurrency 16,256 --json out.json

Real (`--target`): the pair runs the workload of the CPU hardware report (2 x C InstructCoder
prompts, 96 output tokens, EOS ignored, greedy) on the real engine, both timings back to back
in an alternating order per repeat (pairs: machine drift cancels), sync scheduling, wall clock;
the simulator's gap for the same runs on `--profile` (the pair's profile) is printed beside it.
Steps and verified tokens per run are deterministic for policies that learn from acceptance only
(greedy drafts and outputs), so a gap there is the lag's work plus timing noise.

    python benchmarks/k_lag_cost.py --target smollm2-135m --draft ngram:2-6 --concurrency 1,4 \
        --profile results/validation/2026-11-25-cpu-smollm2/profile.json --repeats 5

On a shared CPU: pin threads (`--threads`, default 1) and keep the machine quiet; the command
records the load average before and after.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError, int_list
from dsd.common.machine import load_average
from dsd.reports.paired import Gap, paired_gap
from dsd.sim.build import run_simulation
from dsd.sim.config import RunConfig

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
POLICIES = ("goodput", "hysteresis:goodput", "online", "per-request", "bandit:prior=profile")
TIMINGS = ("next-step", "same-step")


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


def _row(policy: str, concurrency: int, gap: Gap, **extra: Any) -> dict[str, Any]:
    """One printed and returned row of the paired gap of next-step over same-step."""
    line = f"{policy:<24} {concurrency:>4}  {100 * gap.mean:+.2f}% (+-{100 * gap.half_width:.2f})"
    if "simulated_gap_pct" in extra:
        line += f"  simulated {extra['simulated_gap_pct']:+.2f}%"
    print(line, flush=True)
    return {
        "policy": policy,
        "concurrency": concurrency,
        "gap_pct": 100 * gap.mean,
        "half_width_pct": 100 * gap.half_width,
        "seeds": gap.num_seeds,
        **extra,
    }


def _simulated_lag(policy: str, concurrency: int, seeds: int) -> dict[str, Any]:
    lagged = [_tpot(policy, concurrency, seed, "next-step") for seed in range(seeds)]
    same = [_tpot(policy, concurrency, seed, "same-step") for seed in range(seeds)]
    return _row(policy, concurrency, paired_gap(lagged, same))


class _RealLag:
    """The real pair's runs of one workload per C under both K timings."""

    def __init__(self, args: argparse.Namespace) -> None:
        from dsd import api

        self.api = api
        self.profile = args.profile
        self.repeats = args.repeats
        self.pair = api.load_pair(args.target, args.draft, device=args.device, threads=args.threads)

    def _config(self, policy: str, concurrency: int, k_timing: str) -> RunConfig:
        from dsd.validation.plan import hardware_cell_config

        return hardware_cell_config(self.profile, policy, concurrency, k_timing=k_timing)

    def _measured(self, config: RunConfig) -> dict[str, float]:
        from dsd.backend.real import real_engine, resolve_real

        result = real_engine(resolve_real(config, self.pair), self.pair, ignore_eos=True).run()
        steps = result.steps
        return {
            "mean_tpot_ms": float(result.metrics["mean_tpot_ms"]),
            "num_steps": float(len(steps)),
            "num_tokens": float(steps["num_tokens"].sum() + steps["num_spec_tokens"].sum()),
        }

    def _simulated(self, config: RunConfig) -> float:
        from dsd.backend.real import resolve_real
        from dsd.validation.cells import simulated_run

        return float(simulated_run(resolve_real(config, self.pair)).metrics["mean_tpot_ms"])

    def lag(self, policy: str, concurrency: int) -> dict[str, Any]:
        configs = {t: self._config(policy, concurrency, t) for t in TIMINGS}
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in TIMINGS}
        for repeat in range(self.repeats):
            for timing in TIMINGS if repeat % 2 == 0 else TIMINGS[::-1]:
                runs[timing].append(self._measured(configs[timing]))
        tpot = {t: [run["mean_tpot_ms"] for run in runs[t]] for t in TIMINGS}
        simulated = {t: self._simulated(configs[t]) for t in TIMINGS}
        return _row(
            policy,
            concurrency,
            paired_gap(tpot["next-step"], tpot["same-step"]),
            simulated_gap_pct=100 * (simulated["next-step"] / simulated["same-step"] - 1),
            measured_tpot_ms=tpot,
            # per timing: (steps, verified tokens) of every repeat; constant over repeats for a
            # policy that learns from acceptance only
            work={t: [(run["num_steps"], run["num_tokens"]) for run in runs[t]] for t in TIMINGS},
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4, help="simulated: paired seeds")
    parser.add_argument("--concurrency", default=None, help="comma-separated C")
    parser.add_argument("--policy", action="append", help="policy SPEC (repeatable)")
    parser.add_argument("--target", help="real: the target model (as dsd run --target)")
    parser.add_argument("--draft", default="ngram:2-6", help="real: the draft")
    parser.add_argument("--profile", help="real: the pair's profile (policies and simulator)")
    parser.add_argument("--device", default="cpu", help="real: cpu or cuda")
    parser.add_argument("--repeats", type=int, default=5, help="real: pairs of runs per row")
    parser.add_argument("--threads", type=int, default=1, help="real: torch intra-op threads")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    real = args.target is not None
    if real and args.profile is None:
        print("error: --target needs --profile (the pair's profile)", file=sys.stderr)
        return 2
    if (args.repeats if real else args.seeds) < 2:
        name = "--repeats" if real else "--seeds"
        print(f"error: {name}: need >= 2 for an interval", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    load_before = load_average()
    try:
        default_c = "1,4" if real else "4,64,256"
        concurrencies = int_list("--concurrency", args.concurrency or default_c, 1)
        real_lag = _RealLag(args) if real else None
        print(f"{'policy':<24} {'C':>4}  next-step vs same-step mean TPOT (95% CI)")
        for policy in args.policy or POLICIES:
            for concurrency in concurrencies:
                if real_lag is None:
                    rows.append(_simulated_lag(policy, concurrency, args.seeds))
                else:
                    rows.append(real_lag.lag(policy, concurrency))
    except InputError as exc:  # a bad SPEC or value: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings: dict[str, Any] = {"profile": args.profile if real else PROFILE}
    if real:
        from dsd.backend.threads import measured_run_settings

        settings |= {
            "target": args.target,
            "draft": args.draft,
            "device": args.device,
            "repeats": args.repeats,
            **measured_run_settings(load_before),
        }
        print(f"load average {load_before:.2f} -> {settings['load_average_after']:.2f}")
    if args.json:
        atomic_write_json(args.json, {**settings, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
