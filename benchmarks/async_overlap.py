"""Async scheduling on the real engine: measured async/sync throughput per concurrency, and the
simulator's ratio beside it.

The pair is profiled first (B and K of the cells, a short context; the host-overhead model with
its planning split), then, per concurrency C, the same workload (4 x C prompts, static K, EOS
ignored) runs on the real engine three ways, once untimed each and then in a rotated order per
repeat: sync, async with the step on the step thread while the next one is planned (the
engine's default on CUDA), and async run serially (`LoopConfig(overlap=False)`, the engine's
default on a CPU). The simulator runs the same configs on the profile: async overlapped is
charged max(device, planning) + the rest of the host time, async serial as sync. Printed per
C: the profile's host time as a share of the step, measured output-throughput ratios async/sync
and async-serial/sync (mean over repeats with its 95% interval, the arms of a repeat paired as
they ran back to back; median and range), and the simulated ratios. The issue's goal: real
async >= sync wherever host time is >= 5% of the step, and the simulated ratio within 2
percentage points of the measured one.

    python benchmarks/async_overlap.py                          # tiny pair: host time matters
    python benchmarks/async_overlap.py --target smollm2-135m --draft ngram:2-6 --k 4

On this shared 2-core CPU: pin threads (`--threads`, default 1), keep the machine quiet; the
command records the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from dsd import api
from dsd.backend.real import resolve_real, torch_executor
from dsd.backend.threads import measured_run_settings
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError, int_list
from dsd.common.machine import load_average
from dsd.policies.profile import Profile
from dsd.reports.paired import Gap, paired_gap
from dsd.sim.build import build_engine, fitted_executor
from dsd.sim.engine import LoopConfig

ARMS = ("sync", "async", "async-serial")


def _measured(pair: Any, config: Any, arm: str) -> float:
    """Output tokens per second of one real run of `config` under `arm`."""
    scheduling = "sync" if arm == "sync" else "async"
    resolved = resolve_real(api.run_config(**{**config, "scheduling": scheduling}), pair)
    executor = torch_executor(resolved, pair.target, pair.draft, ignore_eos=True)
    loop = LoopConfig(clock="wall", overlap=arm != "async-serial")
    return float(build_engine(resolved, executor, loop).run().metrics["output_throughput"])


def _simulated(pair: Any, config: dict[str, Any], scheduling: str, overlap: bool) -> float:
    resolved = resolve_real(api.run_config(**{**config, "scheduling": scheduling}), pair)
    resolved = dataclasses.replace(resolved, host_overlap=overlap)
    run = build_engine(resolved, fitted_executor(resolved)).run()
    return float(run.metrics["output_throughput"])


def _spread(ratios: list[float], gap: Gap) -> str:
    """Mean ratio with its 95% interval over repeats, then median and range."""
    interval = "" if gap.num_seeds < 2 else f" [{1 + gap.low:.3f}, {1 + gap.high:.3f}]"
    return (
        f"{1 + gap.mean:.3f}{interval} (median {statistics.median(ratios):.3f}, "
        f"{min(ratios):.3f}-{max(ratios):.3f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="tiny")
    parser.add_argument("--draft", default="tiny-draft")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--k", type=int, default=3, help="static K of every run")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated C")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--profile", help="use this profile of the pair instead of measuring")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        concurrencies = list(int_list("--concurrency", args.concurrency, 1))
        pair = api.load_pair(args.target, args.draft, device=args.device, threads=args.threads)
        load_before = load_average()
        profile_path = args.profile
        if profile_path is None:
            profile_path = str(Path(tempfile.mkdtemp(prefix="dsd-async-")) / "profile.json")
            api.profile(
                pair,
                out=profile_path,
                batch_sizes=tuple(sorted(set(concurrencies))),
                k=tuple(sorted({0, 1, args.k})),
                context_lens=(32,),
                prefill_tokens=(16, 64),
                num_prompts=8,
                output_len=16,
                warmup=2,
                iters=10,
                allow_noisy=True,
            )
        host = api.load_profile(profile_path)
        rows: list[dict[str, Any]] = []
        for concurrency in concurrencies:
            config = dict(
                profile=profile_path,
                policy=f"static:{args.k}",
                k_max=args.k,
                num_prompts=4 * concurrency,
                max_concurrency=concurrency,
                max_num_seqs=concurrency,
                output_len=args.output_len,
            )
            # One untimed run per arm first: on an H200 the first run at each C was 6-16x
            # slower than the next ones (results/gpu/2026-11-26-h200), cold costs that
            # belong to no arm
            for arm in ARMS:
                _measured(pair, config, arm)
            throughputs: dict[str, list[float]] = {arm: [] for arm in ARMS}
            for repeat in range(args.repeats):
                order = ARMS[repeat % 3 :] + ARMS[: repeat % 3]  # rotated: drift spreads
                for arm in order:
                    throughputs[arm].append(_measured(pair, config, arm))
            ratios = {
                arm: [a / s for a, s in zip(throughputs[arm], throughputs["sync"], strict=True)]
                for arm in ("async", "async-serial")
            }
            # the three arms of a repeat ran back to back: pair them (machine drift cancels)
            gaps = {arm: paired_gap(throughputs[arm], throughputs["sync"]) for arm in ratios}
            sync = _simulated(pair, config, "sync", True)
            simulated = {
                arm: _simulated(pair, config, "async", arm == "async") / sync
                for arm in ("async", "async-serial")
            }
            share = _host_share(host, concurrency, args.k)
            rows.append(
                {
                    "concurrency": concurrency,
                    "host_share_of_step": share,
                    "measured_async_over_sync": ratios["async"],
                    "measured_async_serial_over_sync": ratios["async-serial"],
                    "measured_throughput": throughputs,
                    **{
                        # None with one repeat (no interval)
                        f"measured_{arm.replace('-', '_')}_over_sync_ci95": (
                            [1 + gaps[arm].low, 1 + gaps[arm].high]
                            if gaps[arm].num_seeds > 1
                            else None
                        )
                        for arm in gaps
                    },
                    "simulated_async_over_sync": simulated["async"],
                    "simulated_async_serial_over_sync": simulated["async-serial"],
                }
            )
            print(
                f"C={concurrency:<3} host {100 * share:5.1f}% of the step | measured async/sync "
                f"{_spread(ratios['async'], gaps['async'])}, serial async/sync "
                f"{_spread(ratios['async-serial'], gaps['async-serial'])} | simulated "
                f"{simulated['async']:.3f}, serial {simulated['async-serial']:.3f}",
                flush=True,
            )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = {
        # the arm `dsd run --scheduling async` takes on this device (LoopConfig.overlap=None)
        "engine_default_async": "async" if pair.device.type == "cuda" else "async-serial",
        "target": args.target,
        "draft": args.draft,
        "k": args.k,
        "device": args.device,
        "repeats": args.repeats,
        "profile": profile_path,
        **measured_run_settings(load_before),
    }
    print(f"load average {load_before:.2f} -> {settings['load_average_after']:.2f}")
    if args.json:
        atomic_write_json(args.json, {"settings": settings, "rows": rows}, indent=1)
    return 0


def _host_share(profile: Profile, batch_size: int, k: int) -> float:
    """The profile's host overhead at (B, K > 0) over ITL + host: what async can hide."""
    host = profile.host_overhead
    if host is None:
        return 0.0
    latency = [
        p.expected_ms
        for p in profile.latency
        if p.batch_size == batch_size and p.num_spec_tokens == k
    ]
    if not latency:
        return float("nan")
    host_ms = host.overhead_ms(batch_size, k > 0)
    return float(host_ms / (statistics.mean(latency) + host_ms))


if __name__ == "__main__":
    sys.exit(main())
