"""Speed of the engine loop + scheduler + metrics with a trivial executor (no latency model).

Closed loop of C clients over N prompts (like `vllm bench serve --max-concurrency C
--num-prompts N`). Reports steps/s and simulated output tokens per wall second. Does not
measure the fitted executor's cost (see the full simulator benchmark for that).

    python benchmarks/sim_speed_core.py --concurrency 256 --num-prompts 5120 --k 0 --k 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dsd.sim.engine import Engine
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.testing.fakes import RandomAcceptanceExecutor, StaticK
from dsd.traces.workload import RequestSpec, Workload


def run_once(args: argparse.Namespace, k: int, scheduling: str) -> dict[str, float]:
    workload = Workload(
        "speed",
        tuple(
            RequestSpec(prompt_len=args.prompt_len, output_len=args.output_len)
            for _ in range(args.num_prompts)
        ),
        max_concurrency=args.concurrency,
    )
    config = SchedulerConfig(
        max_model_len=4096,
        num_kv_blocks=1_000_000,
        k_max=max(k, 1),
        max_num_seqs=args.concurrency,
        scheduling=scheduling,  # type: ignore[arg-type]
    )
    scheduler = Scheduler(config, capacity=args.concurrency * 2)
    executor = RandomAcceptanceExecutor(
        0.01, [0.8, 0.64, 0.5, 0.4][: max(k, 1)], np.random.default_rng(0)
    )
    engine = Engine(scheduler, executor, StaticK(k), workload)
    start = time.perf_counter()
    result = engine.run()
    wall_s = time.perf_counter() - start
    steps = result.metrics["num_steps"]
    tokens = result.metrics["total_output_tokens"]
    return {
        "wall_s": wall_s,
        "steps_per_s": steps / wall_s,
        "tokens_per_s": tokens / wall_s,
        "us_per_step": 1e6 * wall_s / steps,
        "num_steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--num-prompts", type=int, default=5120)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--k", type=int, action="append")
    parser.add_argument("--scheduling", action="append", choices=["sync", "async"])
    args = parser.parse_args()
    for scheduling in args.scheduling or ["sync", "async"]:
        for k in args.k or [0, 3]:
            stats = run_once(args, k, scheduling)
            print(
                f"{scheduling:5s} K={k}: {stats['num_steps']:.0f} steps in {stats['wall_s']:.2f} s"
                f" -> {stats['steps_per_s']:.0f} steps/s, {stats['us_per_step']:.0f} us/step,"
                f" {stats['tokens_per_s'] / 1e6:.2f} M output tokens/s"
            )


if __name__ == "__main__":
    main()
