"""Whole-process speed of the `dsd` command for the simulator-speed goals, start-up included.

Each case is one `python -m dsd.cli ...` process timed from outside (wall seconds):

- `help`: `dsd --help` (goal <= 0.25 s);
- `simulate-1280`: 1,280 MT-Bench prompts, C=256, goodput on the PR profile, `--json`
  (goal <= 0.6 s);
- `simulate-1280-cold`: the same with `DSD_CACHE_DIR=off` (nothing kept between runs: a new
  user, a fresh worker); printed with its excess over `simulate-1280` when both ran (goal: at
  most 0.5 s over warm);
- `simulate-20480`: the same with 20,480 prompts, reported as simulated output tokens per wall
  second (goal >= 4M);
- `k0-per-step-20480`: static:0 with `--latency-jitter 1e-9`, which keeps the results and
  switches off the bulk step for runs of identical decode steps, so every step runs one by
  one (goal >= 5M tok/s: 12x Vidur's lean run of the same workload on the 2-core machine);
- `sd-arrivals-20480`: goodput at `--request-rate 50` (arrivals over time, SD with acceptance
  draws; `../shared/checks/sim-speed-sd`'s run) (goal >= 3M tok/s);
- `readme-sweep`: the README's sweep, static:0, static:3, goodput x C in 1, 16, 64, 256, 20*C
  prompts per cell, reported as simulated output tokens (all cells) per wall second (goal
  >= 3M tok/s);
- `sweep`: static:0, static:3, goodput x C in 1, 4, 16, 64, 128, 256, 20*C prompts per cell
  (goal < 15 s on 2 cores).

With `--vs DIR` (another checkout of this repository, e.g. a `git worktree` of an older commit)
every case also runs from DIR with the same interpreter, in turn with this checkout (A B A B),
and the ratio this/DIR is printed per pair: ratios stay meaningful when the shared machine's
speed drifts. The interpreter imports `dsd` from the folder it runs in (its first path entry),
so both sides use the same libraries. The load average before and after is printed.

    python benchmarks/whole_process.py                          # this checkout, 3 repeats
    python benchmarks/whole_process.py --vs /tmp/base --repeats 5 --case simulate-1280

What it does not do: time parts of a process (benchmarks/sim_speed.py times the engine run alone)
or check results (the tests do).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"  # relative: in every checkout
SIMULATE = ["simulate", "--profile", PROFILE, "--policy", "goodput", "--max-concurrency", "256"]
SIMULATE += ["--dataset-name", "mt-bench", "--seed", "0", "--json"]
SWEEP = ["sweep", "--profile", PROFILE, "--dataset-name", "mt-bench"]
SWEEP += ["--policies", "static:0,static:3,goodput"]
K0 = [*SIMULATE, "--num-prompts", "20480", "--latency-jitter", "1e-9"]
K0[K0.index("goodput")] = "static:0"
CASES: dict[str, list[str]] = {
    "help": ["--help"],
    "simulate-1280": [*SIMULATE, "--num-prompts", "1280"],
    "simulate-1280-cold": [*SIMULATE, "--num-prompts", "1280"],
    "simulate-20480": [*SIMULATE, "--num-prompts", "20480"],
    "k0-per-step-20480": K0,
    "sd-arrivals-20480": [*SIMULATE, "--num-prompts", "20480", "--request-rate", "50"],
    "readme-sweep": [*SWEEP, "--max-concurrency", "1,16,64,256"],
    "sweep": [*SWEEP, "--max-concurrency", "1,4,16,64,128,256"],
}
ENV = {"simulate-1280-cold": {"DSD_CACHE_DIR": "off"}}
GOALS = {
    "help": "<= 0.25 s",
    "simulate-1280": "<= 0.6 s",
    "simulate-1280-cold": "<= 0.5 s over simulate-1280",
    "simulate-20480": ">= 4M tok/s",
    "k0-per-step-20480": ">= 5M tok/s",
    "sd-arrivals-20480": ">= 3M tok/s",
    "readme-sweep": ">= 3M tok/s",
    "sweep": "< 15 s",
}
RATE_CASES = ("simulate-20480", "k0-per-step-20480", "sd-arrivals-20480", "readme-sweep")


def sweep_tokens(out: Path) -> int:
    """Simulated output tokens of every cell a sweep wrote (its cell rows)."""
    import pandas as pd  # the benchmark's own process only

    rows = [path for path in (out / "cells").glob("*.parquet") if "ktrace" not in path.name]
    return sum(int(pd.read_parquet(path)["total_output_tokens"].iloc[0]) for path in rows)


def run_case(name: str, root: Path, scratch: Path) -> tuple[float, float | None]:
    """(wall seconds, simulated output tokens per wall second or None) of one process."""
    argv = [sys.executable, "-m", "dsd.cli", *CASES[name]]
    out = None
    if "sweep" in name:
        out = Path(tempfile.mkdtemp(dir=scratch)) / "sweep"
        argv += ["--out", str(out)]
    env = {**os.environ, **ENV.get(name, {})}
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, env=env)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"error: {name} in {root} failed: {done.stderr.strip()[-300:]}")
    if "--json" in argv:
        tokens: int | None = json.loads(done.stdout)["total_output_tokens"]
    else:
        tokens = sweep_tokens(out) if out is not None else None
    return wall_s, (tokens / wall_s if tokens is not None else None)


def compile_bytecode(root: Path) -> None:
    """Write the checkout's bytecode before timing. Under PYTHONDONTWRITEBYTECODE, or in a fresh
    worktree, a process would otherwise compile every module it imports, every run (0.25-0.3 s
    for `dsd simulate` here): one side of an A/B would pay it and the other not."""
    packages = [str(path) for path in sorted(root.iterdir()) if (path / "__init__.py").is_file()]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *packages],
        cwd=root,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (>= 1)")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--vs", type=Path, default=None, help="another checkout to compare")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.vs is not None and not (args.vs / "dsd" / "cli" / "__main__.py").is_file():
        parser.error(f"--vs {args.vs}: not a checkout of this repository (no dsd/cli)")
    roots = [REPO_ROOT] if args.vs is None else [REPO_ROOT, args.vs.resolve()]
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.repeats} repeats per side")
    for root in roots:
        compile_bytecode(root)
    medians: dict[tuple[str, Path], float] = {}
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        for name in args.case or list(CASES):
            for root in roots:
                run_case(name, root, scratch)  # warm-up: file cache
            walls: dict[Path, list[float]] = {root: [] for root in roots}
            rates: dict[Path, list[float]] = {root: [] for root in roots}
            for _ in range(args.repeats):
                for root in roots:  # in turn: A B A B
                    wall_s, rate = run_case(name, root, scratch)
                    walls[root].append(wall_s)
                    if rate is not None:
                        rates[root].append(rate / 1e6)
            for root in roots:
                label = "this" if root == REPO_ROOT else str(root)
                line = f"{name:18s} {label:>12s}: wall s {summary(walls[root])}"
                if name in RATE_CASES:
                    line += f", M tok/s {summary(rates[root])}"
                medians[name, root] = statistics.median(walls[root])
                if name == "simulate-1280-cold" and ("simulate-1280", root) in medians:
                    over = medians[name, root] - medians["simulate-1280", root]
                    line += f", {over:+.3f} s over simulate-1280"
                print(f"{line}  [goal {GOALS[name]}]")
            if len(roots) == 2:
                ratios = [a / b for a, b in zip(walls[roots[0]], walls[roots[1]], strict=True)]
                print(f"{name:18s} {'this/vs':>12s}: wall ratio {summary(ratios)}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
