"""How long `--latency-model auto` takes to choose on a profile it has never fitted (cold: an
empty fit memo), for a profile of the PR #32374 shape at 16, 36 and 64 points.

    python benchmarks/latency_choice_speed.py [--json out.json]

The profiles are the PR profile's fitted parametric model read at B in 4, 6 or 8 powers of two
and K = 0..3 (..7), each point times a seeded lognormal factor (sigma 2%): realistic curvature
and noise, nothing from the machine. Each size is chosen once in a fresh memo folder, in this
process (scipy already imported, as in any run that fits). The goal of the issue "the simulator
as a design tool": a 64-point profile chooses in <= 1 s cold. A timing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

from dsd.common.atomic import atomic_write_json
from dsd.common.disk_memo import CACHE_DIR_ENV
from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.models.latency_choice import fit_parametric, select_latency_model

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
SHAPES = {16: (4, 4), 36: (6, 6), 64: (8, 8)}  # points: (batch sizes, K values)


def synthetic_profile(base: Profile, num_b: int, num_k: int, seed: int = 0) -> Profile:
    """`base`'s fitted model at B = 1, 2, 4, ... (num_b) and K = 0..num_k - 1, with noise."""
    model = fit_parametric(base)
    rng = np.random.default_rng(seed)
    points = tuple(
        LatencyPoint(
            batch_size=2**i,
            num_spec_tokens=k,
            median_ms=model.decode_itl_ms(2**i, k) * float(np.exp(0.02 * rng.standard_normal())),
        )
        for i in range(num_b)
        for k in range(num_k)
    )
    return dataclasses.replace(base, latency=points, k_max=num_k - 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the timings here")
    args = parser.parse_args(argv)
    base = load_profile(PROFILE)
    rows: list[dict[str, Any]] = []
    for points, (num_b, num_k) in SHAPES.items():
        profile = synthetic_profile(base, num_b, num_k)
        with tempfile.TemporaryDirectory() as memo:
            os.environ[CACHE_DIR_ENV] = memo
            start = time.perf_counter()
            _model, choice = select_latency_model(profile)
            seconds = time.perf_counter() - start
        rows.append({"points": points, "seconds": seconds, "kind": choice.kind})
        print(f"{points} points: {seconds:.2f} s cold, chose {choice.kind} ({choice.reason})")
    if args.json:
        atomic_write_json(args.json, rows, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
