"""How precise a profile's decode points are, and what re-timing part of a context costs.

Live (default): times every (B, K) of the hardware report's grid at one context on the real
engine, `--rounds` interleaved rounds in a fresh random order each (`backend.profiler`'s
timing, through `time_mixed_steps`). Then it splits the rounds into disjoint blocks of n
consecutive rounds (n = 5, 10, 20) and compares the blocks' estimates with each other: the
median and 90th percentile over points and block pairs of |a / b - 1| / sqrt(2), the error of
one block's estimate, for each point's mean and for each point's ratio to its own B's K = 0
(what goodput's choice of K reads). It also prints the steps' own spread (coefficient of
variation per point) and how much of it is the round's machine speed.

    python benchmarks/profile_precision.py --rounds 40 --context 64

`--reports FOLDER ...` (no model, seconds): for each hardware report that re-timed its
profile (`profile_retimed.json`, timed around the whole validation), each point's profile /
re-timed ratio over its context's median ratio, for the points `metadata.quality.remeasured`
names and for the rest. The profiler once re-timed only a context's failing points, in another
stretch of the machine's drift than the rest: two groups apart.

    python benchmarks/profile_precision.py --reports results/validation/2026-11-27-cpu-smollm2

It measures; it changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from dsd.common.arrays import FloatArray
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError

# the hardware report's profiled B and K (dsd.validation.plan.FULL_HARDWARE_PLAN)
GRID_B = (1, 2, 4, 8, 16)
GRID_K = (0, 1, 2, 4, 6)
BLOCKS = (5, 10, 20)


def _ratios(estimate: FloatArray, keys: list[tuple[int, int]]) -> FloatArray:
    """[points with K > 0] each point's estimate over its own B's K = 0."""
    by_key = dict(zip(keys, estimate.tolist(), strict=True))
    return np.array([by_key[(b, k)] / by_key[(b, 0)] for b, k in keys if k > 0])


def block_errors(samples: FloatArray, keys: list[tuple[int, int]], n: int) -> dict[str, float]:
    """Median and p90 over points and pairs of disjoint n-round blocks of |a/b - 1| / sqrt 2,
    of the points' means and of their ratios to K = 0. `samples` [rounds, points]."""
    blocks = [samples[i * n : (i + 1) * n].mean(axis=0) for i in range(samples.shape[0] // n)]
    points, ratios = [], []
    for i, first in enumerate(blocks):
        for second in blocks[i + 1 :]:
            points += list(np.abs(first / second - 1.0) / np.sqrt(2.0))
            ratios += list(np.abs(_ratios(first, keys) / _ratios(second, keys) - 1.0) / np.sqrt(2))
    return {
        "point_median_pct": 100 * float(np.median(points)),
        "point_p90_pct": 100 * float(np.percentile(points, 90)),
        "ratio_median_pct": 100 * float(np.median(ratios)),
        "ratio_p90_pct": 100 * float(np.percentile(ratios, 90)),
    }


def live(args: argparse.Namespace) -> int:
    from dsd import api
    from dsd.backend.engine import SpecDecodeConfig
    from dsd.backend.fast_path import build_spec_decode_engine
    from dsd.backend.profiler import MixedItem, ProfileConfig, divide_round_drift, time_mixed_steps
    from dsd.backend.threads import thread_settings
    from dsd.common.machine import cpu_model, load_average
    from dsd.common.progress import print_label

    if args.rounds < 2 * BLOCKS[0]:
        raise InputError(f"--rounds: at least {2 * BLOCKS[0]} (two blocks), got {args.rounds}")
    if args.context < 1:
        raise InputError(f"--context: must be >= 1, got {args.context}")
    pair = api.load_pair(args.target, args.draft, device="cpu", threads=args.threads)
    config = ProfileConfig(
        batch_sizes=GRID_B, spec_tokens=GRID_K, num_warmup=args.warmup, num_iters=args.rounds
    )
    engine = build_spec_decode_engine(
        pair.target,
        pair.draft,
        SpecDecodeConfig(
            num_slots=max(GRID_B) + 1, max_model_len=args.context + max(GRID_K) + 2, k_max=6
        ),
    )
    keys = [(b, k) for b in GRID_B for k in GRID_K]
    items: list[MixedItem] = [("decode", b, k, 0) for b, k in keys]
    load_before = load_average()
    timed = time_mixed_steps(engine, config, items, args.context, on_progress=print_label)
    load_after = load_average()
    steady_by_item, speeds = divide_round_drift(timed)  # the profiler's division
    samples = np.array([timed[item] for item in items]).T  # [rounds, points]
    steady = np.array([steady_by_item[item] for item in items]).T  # [rounds, points]
    speed = np.array(speeds)  # [rounds] each round's machine speed
    cv = samples.std(axis=0, ddof=1) / samples.mean(axis=0)
    cv_steady = steady.std(axis=0, ddof=1) / steady.mean(axis=0)
    print(
        f"{args.target} + {args.draft}, context {args.context}, {args.rounds} rounds "
        f"({args.warmup} warm-up) of {len(keys)} points; CPU {cpu_model()}; threads "
        f"{thread_settings()}; load {load_before:.2f} -> {load_after:.2f}"
    )
    print(
        f"step time spread per point (CV): median {100 * np.median(cv):.1f}%, max "
        f"{100 * cv.max():.1f}%; with each round's speed divided out "
        f"{100 * np.median(cv_steady):.1f}% (round speed {speed.min():.2f}-{speed.max():.2f})"
    )
    print("one n-round block's error, against the other blocks (median / p90 over points):")
    figures: dict[str, object] = {"rounds": args.rounds, "context": args.context, "blocks": {}}
    for n in BLOCKS:
        if samples.shape[0] // n < 2:
            continue
        errors = block_errors(samples, keys, n)
        figures["blocks"][str(n)] = errors  # type: ignore[index]
        print(
            f"  n={n:>2}: point mean {errors['point_median_pct']:.1f}% / "
            f"{errors['point_p90_pct']:.1f}%, ratio to K=0 {errors['ratio_median_pct']:.1f}% / "
            f"{errors['ratio_p90_pct']:.1f}%"
        )
    if args.json:
        atomic_write_json(args.json, figures, indent=2)
    return 0


def _describe(values: list[float]) -> str:
    if not values:
        return "none"
    spread = f"{min(values):.2f}-{max(values):.2f}"
    return f"{len(values):>2} points, median {np.median(values):.3f} ({spread})"


def retime_split(folders: list[str]) -> int:
    from dsd.policies.profile_io import load_profile
    from dsd.policies.profile_quality import point_label

    for folder in folders:
        try:  # a bad file's InputError names it
            profile = load_profile(Path(folder) / "profile.json")
            retimed = load_profile(Path(folder) / "profile_retimed.json")
        except (OSError, ValueError) as exc:
            raise InputError(f"--reports {folder}: {exc}") from None
        remeasured = set(profile.metadata.get("quality", {}).get("remeasured", []))
        after = {point_label(point): point.expected_ms for point in retimed.latency}
        for context in sorted({point.context_len or 0 for point in profile.latency}):
            points = [point for point in profile.latency if (point.context_len or 0) == context]
            ratio = {point_label(p): p.expected_ms / after[point_label(p)] for p in points}
            level = float(np.median(list(ratio.values())))
            groups: dict[bool, list[float]] = {True: [], False: []}
            for label, value in ratio.items():
                groups[label in remeasured].append(value / level)
            print(
                f"{folder} ctx {context}: profile / re-timed, over the context's median: "
                f"re-measured {_describe(groups[True])}; the rest {_describe(groups[False])}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m", help="the target model")
    parser.add_argument("--draft", default="ngram:2-6", help="the draft")
    parser.add_argument("--context", type=int, default=64, help="the rows' context (tokens)")
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds (default 40)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="also write the live figures here")
    parser.add_argument("--reports", nargs="+", help="report folders: the re-timed split only")
    args = parser.parse_args(argv)
    try:
        return retime_split(args.reports) if args.reports else live(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
