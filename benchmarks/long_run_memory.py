"""Peak memory of a long simulated run vs trace length (is memory flat in the trace length?).

Simulates the Azure 2023 conversation trace (open loop, its own timestamps, full rate) with the
H100 PR #32374 profile and the goodput policy for 1/8, 1/4, 1/2 and all of the trace (~58 min
of simulated time, 19,365 requests), each in a fresh subprocess, and reports peak RSS, the
RSS the run added over the loaded interpreter, the number of requests in flight at the peak,
and the bytes added per request and per output token. Each run is what `dsd simulate --out`
does: step rows stream to steps.parquet, ITLs are pooled per finished request, so what is left
to grow with the trace is per request (the trace itself and one result row each).

    /work/venv/bin/python benchmarks/long_run_memory.py [--fractions 0.125,0.25,0.5,1]

This script measures; it changes nothing in the simulator.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
H100 = REPO_ROOT / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
TRACE_SPAN_S = 3500.0  # a little past the trace's last arrival (~58 min)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(fraction: float) -> dict[str, float]:
    """One run over the first `fraction` of the trace's time span (call in a fresh process).

    Runs what `dsd simulate --out DIR` runs: step rows stream to steps.parquet, requests.csv
    and result.json are written at the end (into a temporary folder, removed afterwards)."""
    import tempfile

    import numpy as np

    from dsd.reports.run_outputs import (
        bench_result,
        simulator_settings,
        step_parquet_sink,
        write_run_outputs,
    )
    from dsd.sim.build import build_engine, fitted_executor
    from dsd.sim.config import RunConfig
    from dsd.sim.engine import LoopConfig
    from dsd.sim.resolve import resolve
    from dsd.traces.loaders import TraceOptions

    config = RunConfig(
        profile=str(H100),
        policy="goodput",
        dataset="azure-conv",
        trace_options=TraceOptions(end_s=fraction * TRACE_SPAN_S),
        seed=0,
    )
    baseline_rss = _peak_rss_bytes()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, step_parquet_sink(Path(folder) / "run") as sink:
        resolved = resolve(config)
        result = build_engine(resolved, fitted_executor(resolved), LoopConfig(step_sink=sink)).run()
        metrics = bench_result(result, resolved, simulator_settings(resolved))
        write_run_outputs(Path(folder) / "run", result, resolved, metrics, {}, sink)
    wall_s = time.perf_counter() - start
    peak_rss = _peak_rss_bytes()
    requests = result.requests
    # requests in flight: arrivals minus finishes over time; report the maximum
    times = np.concatenate([requests["send_s"].to_numpy(), requests["finish_s"].to_numpy()])
    deltas = np.concatenate([np.ones(len(requests)), -np.ones(len(requests))])
    order = np.lexsort((deltas, times))  # finishes before arrivals at equal times
    in_flight = np.cumsum(deltas[order])
    num_output_tokens = int(metrics["total_output_tokens"])
    added = peak_rss - baseline_rss
    return {
        "fraction": fraction,
        "num_requests": len(requests),
        "num_steps": int(metrics["num_steps"]),
        "num_output_tokens": num_output_tokens,
        "max_in_flight": int(in_flight.max()),
        "peak_rss_mib": peak_rss / 2**20,
        "added_rss_mib": added / 2**20,
        "bytes_per_request": added / max(1, len(requests)),
        "bytes_per_output_token": added / max(1, num_output_tokens),
        "requests_frame_mib": requests.memory_usage(deep=True).sum() / 2**20,
        "wall_s": wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", default="0.125,0.25,0.5,1")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # child process mode
    args = parser.parse_args()
    from dsd.common import strict_json

    if args.one is not None:
        print(strict_json.dumps(measure(args.one)))
        return
    rows = []
    for fraction in (float(text) for text in args.fractions.split(",")):
        completed = subprocess.run(
            [sys.executable, __file__, "--one", str(fraction)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(completed.stdout.strip().splitlines()[-1]))
        row = rows[-1]
        print(
            f"trace {row['fraction']:>5.3f}: {row['num_requests']:6d} requests "
            f"{row['num_steps']:7d} steps, in flight at peak {row['max_in_flight']:4d}, "
            f"peak RSS {row['peak_rss_mib']:7.1f} MiB (+{row['added_rss_mib']:6.1f} MiB by the "
            f"run: {row['bytes_per_request']:6.0f} B/request, "
            f"{row['bytes_per_output_token']:5.1f} B/output token; requests frame "
            f"{row['requests_frame_mib']:.1f} MiB), {row['wall_s']:.1f} s",
            flush=True,
        )
    print(strict_json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
