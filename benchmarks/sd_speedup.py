"""Speculative decoding vs plain decoding on the real engine: TPOT, speedup, lossless check.

Each "arm" is a draft and a K policy (`none` is plain decoding, K = 0); the timing protocol
(shared target, rotated arm order per repeat, warm-up, paired speedups, token-for-token check
against the first arm) is `dsd.validation.speedup`. Printed per arm: mean TPOT (vLLM's: mean over
requests) as median and range over repeats, the speedup over the first arm (median and range of
the per-repeat ratios), acceptance length and rate, and whether the generated tokens equal the
first arm's. Recorded with `--out`: every run, torch threads and thread variables, the 1-minute
load average around each run, CPU, versions, the command line. Exit status 1 if some arm's
tokens differ from the first arm's (lossless verification broken).

    python benchmarks/sd_speedup.py                           # SmolLM2, InstructCoder, B=1
    python benchmarks/sd_speedup.py --num-prompts 8 --repeats 3 \\
        --arm none --arm "ngram:2-4 static:4" --arm "ngram:2-6 static:6" --out /tmp/sd.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

import dsd
from dsd import api
from dsd.backend.threads import thread_settings
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError
from dsd.common.machine import cpu_model
from dsd.validation.speedup import Arm, measure_arms, speedup_table

DEFAULT_ARMS = ("none", "ngram:2-4 static:4", "ngram:2-6 static:6")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--dataset-name", default="instructcoder")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument(
        "--output-len", type=int, help="output tokens per prompt (default: the set's)"
    )
    parser.add_argument("--max-concurrency", type=int, default=1)
    parser.add_argument("--arm", action="append", help="'none' or 'DRAFT POLICY [K_MAX]'")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the figures and settings as JSON here")
    args = parser.parse_args(argv)
    started = time.time()
    try:
        arms = [Arm.parse(text) for text in (args.arm or DEFAULT_ARMS)]
        pair = api.load_pair(
            args.target, device=args.device, dtype=args.dtype, threads=args.threads
        )
        config = api.run_config(
            policy="static:0",  # each arm's own
            dataset=args.dataset_name,
            num_prompts=args.num_prompts,
            output_len=args.output_len,
            max_concurrency=args.max_concurrency,
            seed=args.seed,
        )
        result = measure_arms(
            pair,
            arms,
            config,
            repeats=args.repeats,
            on_run=lambda repeat, arm, run: print(
                f"repeat {repeat + 1}/{args.repeats} {arm.label:<26} "
                f"TPOT {run['mean_tpot_ms']:.1f} ms, load {run['load_before']:.2f}",
                file=sys.stderr,
                flush=True,
            ),
        )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(speedup_table(result))
    loads = [
        r[key]
        for runs in result.runs.values()
        for r in runs
        for key in ("load_before", "load_after")
    ]
    settings = {
        "target": args.target,
        "device": args.device,
        "dtype": str(pair.dtype),
        "dataset_name": args.dataset_name,
        "num_prompts": args.num_prompts,
        "output_len": args.output_len,
        "max_concurrency": args.max_concurrency,
        "repeats": args.repeats,
        "threads": thread_settings(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "dsd": dsd.__version__,
        "python": platform.python_version(),
        "started_unix_s": started,
        "wall_s": time.time() - started,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    print(
        f"{settings['cpu']}, {torch.get_num_threads()} torch thread(s), load "
        f"{min(loads):.2f}-{max(loads):.2f}, torch {settings['torch']}, {args.repeats} repeats, "
        f"{settings['wall_s']:.0f} s"
    )
    if args.out:
        rows = [summary.row() for summary in result.arms]
        atomic_write_json(
            args.out, {"settings": settings, "arms": rows, "runs": result.runs}, indent=1
        )
    return 0 if all(summary.identical_to_first_arm for summary in result.arms) else 1


if __name__ == "__main__":
    raise SystemExit(main())
