"""How fast this machine's speed drifts, and how well a probe interleaved with a workload tracks it.

Two fixed torch workloads run one step each in turn for `--seconds`: the *run* (a chain of
matrix products at batch 1 over `--weights-mb` of float32 weights: a memory-bound decode step,
SmolLM2-135M-sized by default) and the *probe* (the same chain at batch 8, a different mix of
memory and compute). Each is timed on its own, in wall and in thread CPU time. Per window of
`--window-s` seconds it prints both means and the run's mean divided by the probe's (scaled to
the probe's median), then:
- the spread (max - min) / median of the run's window means, raw and divided by the probe's:
  how much of the drift an interleaved probe explains (what `validation.cells.SpeedProbes`
  relies on);
- the correlation of the run's and the probe's window means;
- the correlation of wall and thread CPU time per step, and the CPU steal over the run (from
  /proc/stat where there is one): near 1 and near 0 mean the host runs our core slower or
  faster, rather than taking time from us.

    python benchmarks/machine_drift.py --seconds 120 --window-s 10

It measures; it changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dsd.common.machine import cpu_model, load_average

HIDDEN = 576  # SmolLM2-135M's hidden size
WIDTH = 4096  # columns of every weight matrix (~9.4 MB each in float32)
PROBE_BATCH = 8


def _steal_jiffies() -> int | None:
    """The CPU steal counter of /proc/stat (None where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return None


def _spread_pct(values: np.ndarray) -> float:
    return float((values.max() - values.min()) / np.median(values) * 100.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="run time (default 120)")
    parser.add_argument("--window-s", type=float, default=10.0, help="window (default 10 s)")
    parser.add_argument("--weights-mb", type=float, default=540.0, help="weights (default 540)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if not (args.seconds > 0 and args.window_s > 0 and args.weights_mb > 0 and args.threads > 0):
        print("error: --seconds, --window-s, --weights-mb, --threads: must be > 0", file=sys.stderr)
        return 2
    if args.seconds < 2 * args.window_s:
        print("error: --seconds: must cover at least two windows", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    matrices = max(1, round(args.weights_mb * 1e6 / (HIDDEN * WIDTH * 4)))
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(HIDDEN, WIDTH, generator=generator) for _ in range(matrices)]

    def step(batch: int) -> tuple[float, float]:
        x = torch.randn(batch, HIDDEN, generator=generator)
        wall_s, cpu_s = time.perf_counter(), time.thread_time()
        for weight in weights:
            x @ weight
        return time.perf_counter() - wall_s, time.thread_time() - cpu_s

    for _ in range(3):  # warm-up
        step(1), step(PROBE_BATCH)
    load_before, steal_before = load_average(), _steal_jiffies()
    start_s = time.perf_counter()
    rows = []  # (time since start, run wall, run cpu, probe wall)
    while (now_s := time.perf_counter() - start_s) < args.seconds:
        run_wall, run_cpu = step(1)
        probe_wall, _ = step(PROBE_BATCH)
        rows.append((now_s, run_wall, run_cpu, probe_wall))
    elapsed_s = time.perf_counter() - start_s
    steal_after = _steal_jiffies()
    table = np.array(rows)
    windows = np.floor(table[:, 0] / args.window_s).astype(np.int64)
    full = [w for w in np.unique(windows) if (w + 1) * args.window_s <= elapsed_s]
    run = np.array([table[windows == w, 1].mean() for w in full]) * 1000.0
    probe = np.array([table[windows == w, 3].mean() for w in full]) * 1000.0
    adjusted = run / probe * float(np.median(probe))
    print(
        f"# {cpu_model()}, {args.threads} torch thread(s), {matrices} matrices "
        f"{HIDDEN}x{WIDTH} ({matrices * HIDDEN * WIDTH * 4 / 1e6:.0f} MB), {len(rows)} step "
        f"pairs in {elapsed_s:.0f} s, load {load_before:.2f} -> {load_average():.2f}"
    )
    print(f"{'window':>6} {'run ms':>8} {'probe ms':>9} {'run / probe':>12}")
    for index, window in enumerate(full):
        print(f"{window:>6} {run[index]:8.2f} {probe[index]:9.2f} {adjusted[index]:12.2f}")
    correlation = float(np.corrcoef(run, probe)[0, 1]) if len(full) > 2 else float("nan")
    wall_cpu = float(np.corrcoef(table[:, 1], table[:, 2])[0, 1])
    print(
        f"run windows spread {_spread_pct(run):.1f}% raw, {_spread_pct(adjusted):.1f}% divided "
        f"by the probe; correlation run-probe {correlation:.2f} over {len(full)} windows"
    )
    steal = "n/a"
    if steal_before is not None and steal_after is not None:
        # jiffies are 1/100 s on Linux; steal over all CPUs against our wall time
        steal = f"{(steal_after - steal_before) / 100.0 / elapsed_s * 100.0:.1f}% of the wall time"
    print(f"per step: correlation wall-thread CPU time {wall_cpu:.2f}; CPU steal {steal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
