"""Dynamic policies against static K on the real engine: paired gaps, split at prefill steps.

The workload of the CPU hardware report's cells (2 x C InstructCoder prompts, 96 output tokens,
EOS ignored, greedy, sync; `dsd.validation.plan.hardware_cell_config`). Each repeat runs every
SPEC of a concurrency at once, interleaved a step at a time (`dsd.sim.engine.run_interleaved`: each
engine's clock holds only its own steps), so the drift of a shared machine over seconds lands
on every SPEC alike; the engines' order rotates from repeat to repeat. Per SPEC, medians over
the repeats of

- mean TPOT (`vllm bench serve`'s),
- its part in steps that also ran other requests' prompts (`mean_tpot_in_prefill_steps_ms`),
- the rest: the TPOT of the decode steps alone, where K acts,

with the simulator's figures for the same runs beside them (`--profile` drives the policies and
the simulator; `--price-with P` prices the simulated steps with another profile, as the report
prices with its re-timed one). Then each dynamic SPEC's paired gap (mean over repeats of
SPEC / static - 1, 95% interval) to the static K with the lowest median, on mean TPOT and on
the decode steps alone. Each run's steps and verified tokens are recorded: runs that did the
same work differ only by the machine. `--prefill-forward fused,separate` runs every SPEC on
both engines (prompt chunks in the decode forward, or in one of their own), interleaved too,
and prints each SPEC's separate-over-fused gap in mean TPOT, measured and simulated.

    python benchmarks/envelope_gap.py --target smollm2-135m --draft ngram:2-6 \\
        --profile results/validation/2026-11-25-cpu-smollm2/profile.json \\
        --price-with results/validation/2026-11-25-cpu-smollm2/profile_retimed.json \\
        --concurrency 8 --static 0,1,2 --policy goodput --repeats 5 --json out.json

On a shared CPU: pin threads (`--threads`, default 1), keep the machine quiet; the command
records the load average before and after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError, int_list
from dsd.common.machine import load_average
from dsd.policies.profile_io import load_profile
from dsd.policies.spec import parse_policy
from dsd.reports.paired import paired_gap
from dsd.sim.config import RunConfig
from dsd.sim.models.latency import PREFILL_FORWARDS, PrefillForward
from dsd.sim.resolve import ResolvedRun

TPOT = "mean_tpot_ms"
IN_PREFILL_STEPS = "mean_tpot_in_prefill_steps_ms"


def _figures(metrics: dict[str, Any], steps: Any) -> dict[str, float]:
    """TPOT, its prefill-step part, the decode-step rest; the run's steps and tokens."""
    return {
        "tpot_ms": float(metrics[TPOT]),
        "in_prefill_steps_ms": float(metrics[IN_PREFILL_STEPS]),
        "decode_steps_ms": float(metrics[TPOT]) - float(metrics[IN_PREFILL_STEPS]),
        "num_steps": float(len(steps)),
        "num_tokens": float(steps["num_tokens"].sum() + steps["num_spec_tokens"].sum()),
    }


class Arm(NamedTuple):
    """One SPEC on one engine: `label` is the SPEC, with "/separate" or "/fused" appended when
    the engines differ."""

    label: str
    spec: str
    prefill_forward: PrefillForward
    config: RunConfig


class _Runs:
    """The pair, and its real and simulated runs of a cell."""

    def __init__(self, args: argparse.Namespace) -> None:
        from dsd import api

        self.api = api
        self.profile = args.profile
        self.prompts_per_concurrency = args.prompts_per_concurrency
        self.price_with = None if args.price_with is None else load_profile(args.price_with)
        self.pair = api.load_pair(args.target, args.draft, device=args.device, threads=args.threads)

    def config(self, policy: str, concurrency: int) -> RunConfig:
        from dsd.validation.plan import hardware_cell_config

        return hardware_cell_config(
            self.profile,
            policy,
            concurrency,
            prompts_per_concurrency=self.prompts_per_concurrency,
        )

    def resolved(self, arm: Arm) -> ResolvedRun:
        """The arm's cell as the engine runs it (its prefill forward) and the simulator twins it."""
        import dataclasses

        from dsd.backend.real import resolve_real

        resolved = resolve_real(arm.config, self.pair)
        return dataclasses.replace(resolved, prefill_forward=arm.prefill_forward)

    def measured(self, arms: list[Arm]) -> list[dict[str, float]]:
        """The real runs of `arms`, interleaved a step at a time."""
        from dsd.validation.cells import measured_runs

        runs = measured_runs([self.resolved(arm) for arm in arms], self.pair)
        return [_figures(run.metrics, run.steps) for run in runs]

    def simulated(self, arm: Arm) -> dict[str, float]:
        from dsd.sim.resolve import with_latency_from
        from dsd.validation.cells import simulated_run

        resolved = self.resolved(arm)
        if self.price_with is not None:
            resolved = with_latency_from(resolved, self.price_with)
        result = simulated_run(resolved)
        return _figures(dict(result.metrics), result.steps)


def _median(runs: list[dict[str, float]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs))


def measure(
    runs: _Runs,
    specs: list[str],
    concurrency: int,
    repeats: int,
    prefill_forwards: Sequence[PrefillForward] = ("fused",),
) -> dict[str, Any]:
    """Every SPEC (on every engine of `prefill_forwards`) at one C, `repeats` interleaved runs;
    medians, gaps, simulated."""
    arms = [
        Arm(
            spec if len(prefill_forwards) == 1 else f"{spec}/{forward}",
            spec,
            forward,
            runs.config(spec, concurrency),
        )
        for forward in prefill_forwards
        for spec in specs
    ]
    labels = [arm.label for arm in arms]
    measured: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    for repeat in range(repeats):
        shift = repeat % len(arms)
        order = arms[shift:] + arms[:shift]
        for arm, figures in zip(order, runs.measured(order), strict=True):
            measured[arm.label].append(figures)
        print(f"  C={concurrency} repeat {repeat + 1} done", file=sys.stderr, flush=True)
    simulated = {arm.label: runs.simulated(arm) for arm in arms}
    width = max(14, *(len(label) for label in labels))
    print(
        f"C={concurrency} (medians of {repeats} interleaved runs; simulated in brackets)\n"
        f"{'policy':<{width}} {'mean TPOT ms':>20} {'in prefill steps':>20} {'decode steps':>20}"
        f"  steps/tokens per run"
    )
    for label in labels:
        cells = [
            f"{_median(measured[label], key):.1f} [{simulated[label][key]:.1f}]"
            for key in ("tpot_ms", "in_prefill_steps_ms", "decode_steps_ms")
        ]
        work = sorted({(int(r["num_steps"]), int(r["num_tokens"])) for r in measured[label]})
        print(f"{label:<{width}} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20}  {work}")
    gaps: dict[str, dict[str, Any]] = {}
    for forward in prefill_forwards:  # each engine's dynamic arms against its own statics
        own = [arm for arm in arms if arm.prefill_forward == forward]
        statics = [arm.label for arm in own if arm.spec.startswith("static:")]
        for key in ("tpot_ms", "decode_steps_ms") if statics else ():
            best = min(statics, key=lambda label: _median(measured[label], key))
            for label in [arm.label for arm in own if arm.label not in statics]:
                gap = _gap(measured, simulated, label, best, key, f"best static ({best})")
                gaps.setdefault(label, {})[key] = {"best_static": best, **gap}
    engines: dict[str, dict[str, Any]] = {}
    if len(prefill_forwards) == 2:  # the same SPEC on both engines: the second over the first
        first, second = prefill_forwards
        for spec in specs:
            a, b = f"{spec}/{second}", f"{spec}/{first}"
            engines[spec] = {"base": b, **_gap(measured, simulated, a, b, "tpot_ms", b)}
    return {
        "concurrency": concurrency,
        "measured": measured,
        "simulated": simulated,
        "gaps": gaps,
        "engines": engines,
    }


def _gap(
    measured: dict[str, list[dict[str, float]]],
    simulated: dict[str, dict[str, float]],
    label: str,
    base: str,
    key: str,
    base_name: str,
) -> dict[str, float]:
    """`label` over `base` on `key`: the paired gap over repeats, and the simulated one; printed
    as "`label` vs `base_name`"."""
    gap = paired_gap([run[key] for run in measured[label]], [run[key] for run in measured[base]])
    sim_gap = simulated[label][key] / simulated[base][key] - 1
    print(
        f"{label} vs {base_name} on {key}: {100 * gap.mean:+.1f}% "
        f"(+-{100 * gap.half_width:.1f}, 95%, paired); simulated {100 * sim_gap:+.1f}%"
    )
    return {
        "gap_pct": 100 * gap.mean,
        "half_width_pct": 100 * gap.half_width,
        "simulated_gap_pct": 100 * sim_gap,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target model (as dsd run --target)")
    parser.add_argument("--draft", default="ngram:2-6", help="the draft")
    parser.add_argument("--profile", required=True, help="the pair's profile (policies, sim)")
    parser.add_argument("--price-with", help="a profile that prices the simulated steps")
    parser.add_argument("--concurrency", default="4", help="comma-separated C")
    parser.add_argument("--static", default="0,1,2,3", help="comma-separated static K")
    parser.add_argument("--policy", action="append", help="dynamic SPEC (repeatable; goodput)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of every SPEC per C")
    parser.add_argument("--prompts-per-concurrency", type=int, default=2, help="cell prompts / C")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--prefill-forward",
        default="fused",
        help="the engine's prefill forward: fused, separate, or both (fused,separate: every "
        "SPEC on both engines, interleaved, and each SPEC's separate-over-fused gap)",
    )
    parser.add_argument("--json", help="also write every run's figures here")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        print("error: --repeats: need >= 2 for an interval", file=sys.stderr)
        return 2
    load_before = load_average()
    try:
        concurrencies = int_list("--concurrency", args.concurrency, 1)
        static = int_list("--static", args.static, 0)
        forwards = [f.strip() for f in args.prefill_forward.split(",")]
        if (
            not forwards
            or len(set(forwards)) != len(forwards)
            or not set(forwards) <= set(PREFILL_FORWARDS)
        ):
            raise InputError(
                f"--prefill-forward: fused, separate or both, got {args.prefill_forward!r}"
            )
        specs = [f"static:{k}" for k in static] + (args.policy or ["goodput"])
        profile = load_profile(args.profile)
        for spec in specs:  # a bad SPEC is refused before anything loads or runs
            parse_policy(spec, profile=profile, k_max=6, max_num_seqs=max(concurrencies))
        runs = _Runs(args)
        rows = [measure(runs, specs, c, args.repeats, forwards) for c in concurrencies]
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from dsd.backend.threads import measured_run_settings

    settings = {
        "target": args.target,
        "draft": args.draft,
        "profile": args.profile,
        "price_with": args.price_with,
        "device": args.device,
        "repeats": args.repeats,
        "prompts_per_concurrency": args.prompts_per_concurrency,
        "prefill_forward": forwards,
        **measured_run_settings(load_before),
    }
    print(f"load average {load_before:.2f} -> {settings['load_average_after']:.2f}")
    if args.json:
        atomic_write_json(args.json, {**settings, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
