"""Cells per minute of `dsd sweep` on this machine: the local process pool vs a local Ray,
side by side in one run, on the PR-profile grid (static:0, static:3, goodput x C in
1,4,16,64,128,256 x MT-Bench, 20*C prompts per cell: 18 cells).

Each runner gets a fresh output folder (nothing reused). Ray's start-up (ray.init) is timed
separately from the cells. Ray is skipped with a note when it is not installed.

    python benchmarks/sweep_throughput.py [--workers 2] [--concurrencies 1,4,16,64,128,256]

What it does not do: check results (tests/reports do) or tune worker counts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dsd.reports.ablation import PR_PROFILE
from dsd.reports.sweep import identify, run_sweep_to_dir, sweep_cells
from dsd.sim.config import RunConfig
from dsd.sim.resolve import resolve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrencies", default="1,4,16,64,128,256")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    base = RunConfig(profile=str(PR_PROFILE), policy="static:0", dataset="mt-bench")
    cells = identify(
        sweep_cells(
            base, ["static:0", "static:3", "goodput"], concurrencies, num_prompts_per_concurrency=20
        )
    )
    for cell in cells:
        resolve(cell.config)
    print(f"{len(cells)} cells, {args.workers} workers")
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        run_sweep_to_dir(cells, Path(scratch) / "pool", args.workers)
        pool_s = time.perf_counter() - started
        print(f"local pool: {pool_s:7.1f} s  {60 * len(cells) / pool_s:7.1f} cells/min")
        try:
            import ray
        except ImportError:
            print("ray: not installed (pip install 'dsd[ray]')")
            return
        started = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        init_s = time.perf_counter() - started
        try:
            started = time.perf_counter()
            run_sweep_to_dir(cells, Path(scratch) / "ray", args.workers, use_ray=True)
            ray_s = time.perf_counter() - started
        finally:
            ray.shutdown()
        print(
            f"ray local:  {ray_s:7.1f} s  {60 * len(cells) / ray_s:7.1f} cells/min "
            f"(+ {init_s:.1f} s ray.init, "
            f"{60 * len(cells) / (ray_s + init_s):.1f} cells/min with it)"
        )


if __name__ == "__main__":
    main()
