"""Speed of the whole simulator on the real stack: simulated output tokens per wall second.

One process, one run per repeat, everything the `dsd` simulator uses: the MT-Bench prompt set
through `traces.registry.build_workload` (closed loop, `--max-concurrency C`), the H100 profile
of vLLM PR #32374 (Llama-3.1-8B + EAGLE), `GoodputPolicy`, the fitted executor (table latency
model, per-position acceptance), `Scheduler` and the SimPy `Engine` with its metrics. The
figure of merit (project issue "Speed") is simulated output tokens per wall second of
`Engine(...).run()`, result tables included; building the workload, loading the profile and
precomputing the policy table are setup and are timed separately.

    python benchmarks/sim_speed.py                      # C=256, 5120 prompts, 5 repeats
    python benchmarks/sim_speed.py --repeats 1 --profile /tmp/sim.prof

Each repeat rebuilds scheduler, executor and engine from the same seed, so every repeat must
give the same metrics: the script checks that, checks that all requests completed, and prints a
digest of the results (compare it across code versions: a pure speed-up keeps it unchanged).
It does not measure the real backend (see benchmarks for `dsd run`).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsd.common import strict_json
from dsd.policies.goodput import GoodputPolicy
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.build import build_fitted_executor
from dsd.sim.engine import Engine, RunResult
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.traces.registry import build_workload
from dsd.traces.workload import Workload

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = REPO_ROOT / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
TARGET_TOKENS_PER_S = 2_000_000


@dataclass(frozen=True)
class Setup:
    """What every repeat shares (built once, outside the timed region)."""

    workload: Workload  # MT-Bench prompts, closed loop of C clients
    profile: Profile  # latency table + acceptance rates
    policy: GoodputPolicy  # stateless: its K table is precomputed per B
    config: SchedulerConfig  # limits of an H100 serving Llama-3.1-8B
    seed: int  # the run seed (executor streams)


@dataclass(frozen=True)
class Measurement:
    """One timed run."""

    wall_s: float  # wall time of Engine construction + run(), seconds
    # CPU time of this process over the same span, seconds: close to the wall time of an idle
    # machine (one thread), and much less noisy than wall time on a shared one
    cpu_s: float
    num_steps: int  # engine steps
    num_output_tokens: int  # simulated output tokens (completed requests)
    num_completed: int  # requests that finished
    digest: str  # hash of the metrics and the per-request / per-step tables

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s

    @property
    def steps_per_s(self) -> float:
        return self.num_steps / self.wall_s


def build_setup(args: argparse.Namespace) -> Setup:
    workload = build_workload(
        "mt-bench",
        num_prompts=args.num_prompts,
        max_concurrency=args.concurrency,
        seed=args.seed,
    )
    profile = load_profile(args.profile_path)
    policy = GoodputPolicy(profile, max_num_seqs=args.concurrency)
    config = SchedulerConfig(
        max_model_len=args.max_model_len,
        # 32768 blocks x 16 tokens: the order of an H100's KV pool for an 8B model; the
        # benchmark measures the scheduler's hot path, not preemption.
        num_kv_blocks=args.num_kv_blocks,
        k_max=profile.k_max,
        max_num_seqs=args.concurrency,
        max_num_batched_tokens=args.max_num_batched_tokens,
        scheduling=args.scheduling,
    )
    return Setup(workload, profile, policy, config, args.seed)


def run_engine(setup: Setup) -> RunResult:
    """The timed work: a fresh scheduler, executor and engine, run to the end."""
    executor = build_fitted_executor(
        setup.profile,
        np.random.SeedSequence(setup.seed),
        latency_kind="table",
        acceptance_kind="per-position",
    )
    scheduler = Scheduler(setup.config, capacity=2 * setup.config.max_num_seqs)
    return Engine(scheduler, executor, setup.policy, setup.workload).run()


def result_digest(result: RunResult) -> str:
    """A short hash of everything the run reports (metrics, request and step tables)."""
    hasher = hashlib.sha256()
    hasher.update(json.dumps(result.metrics, sort_keys=True, default=str).encode())
    for table in (result.requests, result.steps):
        hasher.update(",".join(table.columns).encode())
        for column in table.columns:
            hasher.update(np.ascontiguousarray(table[column].to_numpy()).tobytes())
    return hasher.hexdigest()[:16]


def measure(setup: Setup, profiler: cProfile.Profile | None = None) -> Measurement:
    start_s = time.perf_counter()
    cpu_start_s = time.process_time()
    if profiler is not None:
        profiler.enable()
    result = run_engine(setup)
    if profiler is not None:
        profiler.disable()
    wall_s = time.perf_counter() - start_s
    cpu_s = time.process_time() - cpu_start_s
    return Measurement(
        wall_s=wall_s,
        cpu_s=cpu_s,
        num_steps=int(result.metrics["num_steps"]),
        num_output_tokens=int(result.metrics["total_output_tokens"]),
        num_completed=int(result.metrics["completed"]),
        digest=result_digest(result),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=256, help="max concurrency C")
    parser.add_argument("--num-prompts", type=int, default=5120)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; median reported")
    parser.add_argument("--scheduling", choices=["sync", "async"], default="sync")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile-path", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--num-kv-blocks", type=int, default=32768)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument(
        "--profile", type=Path, default=None, help="write cProfile stats of the runs here"
    )
    parser.add_argument("--top", type=int, default=25, help="profile lines to print")
    args = parser.parse_args(argv)

    setup_start_s = time.perf_counter()
    setup = build_setup(args)
    setup_s = time.perf_counter() - setup_start_s
    print(
        f"setup: {len(setup.workload.requests)} MT-Bench prompts, C={args.concurrency}, "
        f"{args.scheduling}, K_max={setup.config.k_max}, goodput K per B "
        f"{sorted(set(setup.policy.table.k_star.tolist()))} ({setup_s:.2f} s, not timed)"
    )
    profiler = cProfile.Profile() if args.profile is not None else None
    measurements: list[Measurement] = []
    for repeat in range(args.repeats):
        m = measure(setup, profiler)
        measurements.append(m)
        print(
            f"run {repeat}: wall {m.wall_s:.3f} s (cpu {m.cpu_s:.3f} s), {m.num_steps} steps, "
            f"{m.num_output_tokens} output tokens -> {m.tokens_per_s / 1e6:.3f} M tok/s, "
            f"{m.steps_per_s:.0f} steps/s, {m.num_completed} completed, digest {m.digest}"
        )

    ok = True
    expected = len(setup.workload.requests)
    if any(m.num_completed != expected for m in measurements):
        print(f"FAIL: a run completed fewer than {expected} requests", file=sys.stderr)
        ok = False
    if len({m.digest for m in measurements}) != 1:
        print("FAIL: repeats of the same seed gave different results", file=sys.stderr)
        ok = False

    wall_s = statistics.median(m.wall_s for m in measurements)
    cpu_s = statistics.median(m.cpu_s for m in measurements)
    first = measurements[0]
    tokens_per_s = first.num_output_tokens / wall_s
    summary: dict[str, Any] = {
        "wall_s": round(wall_s, 4),
        "cpu_s": round(cpu_s, 4),
        "tokens_per_cpu_s": round(first.num_output_tokens / cpu_s),
        "num_steps": first.num_steps,
        "num_output_tokens": first.num_output_tokens,
        "tokens_per_s": round(tokens_per_s),
        "steps_per_s": round(first.num_steps / wall_s),
        "us_per_step": round(1e6 * wall_s / first.num_steps, 1),
        "completed": first.num_completed,
        "digest": first.digest,
    }
    print(
        f"median of {len(measurements)}: wall {wall_s:.3f} s, {first.num_steps} steps, "
        f"{first.num_output_tokens} simulated output tokens, "
        f"{tokens_per_s / 1e6:.3f} M output tokens per wall second "
        f"(target {TARGET_TOKENS_PER_S / 1e6:.1f} M), {first.num_steps / wall_s:.0f} steps/s, "
        f"{1e6 * wall_s / first.num_steps:.1f} us/step, "
        f"completed {first.num_completed}/{expected}; "
        f"cpu {cpu_s:.3f} s -> {first.num_output_tokens / cpu_s / 1e6:.3f} M tokens per CPU second"
    )
    print("summary " + strict_json.dumps(summary, sort_keys=True))
    if profiler is not None:
        profiler.dump_stats(args.profile)
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.top)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
