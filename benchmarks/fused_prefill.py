"""What a prefill chunk adds to a decode step on the real engine, fused and separate.

A step that admits a prompt while other requests decode runs the prefill chunk either in the
decode rows' verify forward ("fused", `SpecDecodeEngine.step_with_prefill`, vLLM's mixed batch)
or in a forward of its own after the step ("separate"). This times, interleaved in random order
each round, per decode batch D, K and chunk size N: the decode step alone, the prefill alone,
and the step with the chunk both ways (`backend.profiler.time_mixed_steps`). It prints the
medians, the chunk's added cost (per round: mixed step minus that round's decode step) and the
simulator's prices read from this run's own prefill-alone timings: fused
curve(N) - curve(1) (`sim.models.latency.PrefillCost.marginal_ms`), separate curve(N).

    python benchmarks/fused_prefill.py --target smollm2-135m --draft ngram:2-6 \\
        --rows 1,4,8 --k 0,3 --tokens 32,128,512 --repeats 5

It measures; it changes nothing.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from dsd import api
from dsd.backend.engine import SpecDecodeConfig
from dsd.backend.fast_path import build_spec_decode_engine
from dsd.backend.profiler import MixedItem, ProfileConfig, time_mixed_steps
from dsd.backend.threads import thread_settings
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError
from dsd.common.machine import cpu_model, load_average
from dsd.common.progress import print_label


def _ints(text: str, name: str, minimum: int) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise InputError(f"--{name}: a comma list of integers, got {text!r}") from None
    if values[0] < minimum:
        raise InputError(f"--{name}: every value must be >= {minimum}, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m", help="the target model")
    parser.add_argument("--draft", default="ngram:2-6", help="the draft (K > 0 needs one)")
    parser.add_argument("--rows", default="1,4,8", help="decode batch sizes D, comma list")
    parser.add_argument("--k", default="0,3", help="K of the decode rows, comma list")
    parser.add_argument("--tokens", default="32,128,512", help="chunk sizes N, comma list")
    parser.add_argument("--context", type=int, default=256, help="decode rows' context")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        rows, ks = _ints(args.rows, "rows", 1), _ints(args.k, "k", 0)
        tokens = _ints(args.tokens, "tokens", 2)
        for name in ("context", "repeats", "threads"):
            if getattr(args, name) < 1:
                raise InputError(f"--{name}: must be >= 1, got {getattr(args, name)}")
        if args.warmup < 0:
            raise InputError(f"--warmup: must be >= 0, got {args.warmup}")
        pair = api.load_pair(args.target, args.draft, device=args.device, threads=args.threads)
        if max(ks) > 0 and pair.draft is None:
            raise InputError("--k: K > 0 needs a draft")
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = ProfileConfig(
        batch_sizes=tuple(sorted({1, *rows})),
        spec_tokens=tuple(sorted({0, 1, *ks})),
        num_warmup=args.warmup,
        num_iters=args.repeats,
    )
    engine = build_spec_decode_engine(
        pair.target,
        pair.draft,
        SpecDecodeConfig(
            num_slots=max(rows) + 1,
            max_model_len=max(args.context, max(tokens)) + max(ks) + 2,
            k_max=max(config.spec_tokens),
        ),
    )
    items: list[MixedItem] = [("prefill", 0, 0, n) for n in [1, *tokens]]
    items += [("decode", d, k, 0) for d in rows for k in ks]
    items += [
        (kind, d, k, n) for kind in ("separate", "fused") for d in rows for k in ks for n in tokens
    ]
    load_before = load_average()
    samples = time_mixed_steps(engine, config, items, args.context, on_progress=print_label)
    load_after = load_average()

    def median(item: MixedItem) -> float:
        return float(np.median(samples[item]))

    def added(item: MixedItem) -> float:
        """Median over rounds of the mixed step minus the same round's decode step."""
        decode = np.asarray(samples[("decode", item[1], item[2], 0)])
        return float(np.median(np.asarray(samples[item]) - decode))

    curve_1 = median(("prefill", 0, 0, 1))
    print(
        f"{args.target} + {args.draft}, decode context {args.context}, {args.repeats} rounds "
        f"({args.warmup} warm-up); CPU {cpu_model()}; threads {thread_settings()}; "
        f"load {load_before:.2f} -> {load_after:.2f}"
    )
    print(f"prefill of 1 token alone (curve(1)): {curve_1:.1f} ms")
    header = (
        f"{'D':>3} {'K':>2} {'N':>4} {'decode':>8} {'prefill':>8} {'separate':>9} {'fused':>8} "
        f"{'fused/sep':>9} {'added fused':>12} {'priced':>8} {'added sep':>10} {'priced':>8}"
    )
    print(header)
    table = []
    for d in rows:
        for k in ks:
            for n in tokens:
                prefill = median(("prefill", 0, 0, n))
                row = {
                    "decode_rows": d,
                    "k": k,
                    "num_tokens": n,
                    "decode_ms": median(("decode", d, k, 0)),
                    "prefill_ms": prefill,
                    "separate_ms": median(("separate", d, k, n)),
                    "fused_ms": median(("fused", d, k, n)),
                    "added_fused_ms": added(("fused", d, k, n)),
                    "priced_fused_ms": prefill - curve_1,
                    "added_separate_ms": added(("separate", d, k, n)),
                    "priced_separate_ms": prefill,
                }
                table.append(row)
                print(
                    f"{d:>3} {k:>2} {n:>4} {row['decode_ms']:>8.1f} {prefill:>8.1f} "
                    f"{row['separate_ms']:>9.1f} {row['fused_ms']:>8.1f} "
                    f"{row['fused_ms'] / row['separate_ms']:>9.3f} {row['added_fused_ms']:>12.1f} "
                    f"{row['priced_fused_ms']:>8.1f} {row['added_separate_ms']:>10.1f} "
                    f"{row['priced_separate_ms']:>8.1f}"
                )
    if args.json:
        settings = {
            "target": args.target,
            "draft": args.draft,
            "context": args.context,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "cpu": cpu_model(),
            "threads": thread_settings(),
            "load": [load_before, load_after],
            "curve_1_ms": curve_1,
        }
        atomic_write_json(args.json, {**settings, "rows": table}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
