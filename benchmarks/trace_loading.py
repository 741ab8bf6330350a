"""Seconds to parse each shipped serving trace into a workload (median, min and max of N).

A speed figure, so it lives here and not in a timed unit test (a loaded machine fails those).
Each repeat loads every trace once, in a fixed interleaved order; nothing is cached between
loads.

    python benchmarks/trace_loading.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from dsd.traces.loaders import TRACE_NAMES, load_trace


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    times: dict[str, list[float]] = {name: [] for name in TRACE_NAMES}
    load_trace(TRACE_NAMES[0])  # warm-up: imports and the first file read
    for _ in range(args.repeats):
        for name in TRACE_NAMES:
            start_s = time.perf_counter()
            load_trace(name)
            times[name].append(time.perf_counter() - start_s)
    for name, samples in times.items():
        rows = len(load_trace(name).requests)
        print(
            f"{name:<22} {rows:>7,} rows: median {statistics.median(samples):.3f} s "
            f"(min {min(samples):.3f}, max {max(samples):.3f}) over {len(samples)} loads"
        )


if __name__ == "__main__":
    main()
