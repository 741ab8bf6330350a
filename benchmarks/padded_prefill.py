"""What one padded prefill forward of P rows costs on the real engine, against its pricing.

dsd's torch engine runs a step's prefill chunks as one forward of P rows padded to the longest
chunk W; the simulator prices it as one row's prefill plus the marginal cost of the other rows,
curve(W) + (P - 1) x (curve(W + 1) - curve(1)) (`sim.models.latency.PaddedPrefill`), rather than as
one prompt of P x W tokens. This times, interleaved and repeated, one-row prefills of 1, W and
P x W tokens and the P-row forwards, and prints each P-row forward's median against both
prices (the curve read from this run's own one-row timings).

    python benchmarks/padded_prefill.py --model smollm2-135m --width 200 --rows 2,4,8

It measures; it changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from dsd.api import load_pair
from dsd.backend.engine import SpecDecodeConfig
from dsd.backend.fast_path import build_spec_decode_engine
from dsd.backend.profiler import special_ids, synthetic_ids
from dsd.backend.threads import thread_settings
from dsd.common.errors import InputError
from dsd.common.machine import cpu_model, load_average


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model spec")
    parser.add_argument("--width", type=int, default=200, help="tokens per row (default 200)")
    parser.add_argument("--rows", default="2,4,8", help="row counts P, comma list")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    try:
        rows = [int(p) for p in args.rows.split(",")]
        if min(rows) < 1 or args.width < 1 or args.repeats < 1:
            raise ValueError
        pair = load_pair(args.model, threads=args.threads)
    except ValueError:
        print("error: --rows, --width, --repeats: integers >= 1", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    load_before = load_average()
    target, width = pair.target, args.width
    longest = max(rows) * width
    engine = build_spec_decode_engine(
        target,
        None,
        SpecDecodeConfig(num_slots=max(rows), max_model_len=longest + 2, k_max=0, seed=0),
    )
    rng = np.random.default_rng(0)
    avoid, vocab = special_ids(target), target.config.vocab_size

    def prefill_ms(num_rows: int, tokens: int) -> float:
        slots = [
            engine.alloc_slot(synthetic_ids(rng, tokens, vocab, avoid)) for _ in range(num_rows)
        ]
        start = time.perf_counter()
        engine.prefill(np.array(slots), np.full(num_rows, tokens))
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        for slot in slots:
            engine.free_slot(slot)
        return elapsed_ms

    shapes = [(1, 1), (1, width), (1, width + 1)]
    shapes += [(p, width) for p in rows] + [(1, p * width) for p in rows]
    for shape in shapes:  # warm-up
        prefill_ms(*shape)
    samples: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(args.repeats):
        for shape in shapes:
            samples[shape].append(prefill_ms(*shape))
    median = {shape: float(np.median(values)) for shape, values in samples.items()}
    marginal = median[(1, width + 1)] - median[(1, 1)]
    print(
        f"{args.model}, rows of {width} tokens, {args.repeats} interleaved rounds; CPU "
        f"{cpu_model()}; threads {thread_settings()}; load {load_before:.2f} -> "
        f"{load_average():.2f}; torch {torch.__version__}"
    )
    print(f"{'P':>3} {'measured ms':>12} {'curve(W)+(P-1)marginal':>24} {'one prompt of PxW':>18}")
    for p in rows:
        priced = median[(1, width)] + (p - 1) * marginal
        print(f"{p:>3} {median[(p, width)]:>12.2f} {priced:>24.2f} {median[(1, p * width)]:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
