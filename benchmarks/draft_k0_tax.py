"""Does an engine that holds a draft pay for it at K = 0? Steps of two engines, interleaved.

Two engines on one target: one with no draft (k_max 0, as a static:0 cell runs) and one with
`--draft` and `--k-max` (as a dynamic policy's cell runs), each with `--batch-size` rows of the
same `--prompt-len` synthetic prompt tokens. Both step at K = 0, alternating A B / B A step by
step, so the machine's drift falls on both alike; the first `--skip` pairs are warm-up. Printed:
each engine's median step time with its p10-p90, the ratio of the medians and the median of the
per-pair ratios (the paired figure), the load around the run, and whether both engines
generated the same tokens (they must: K = 0 is plain greedy decoding).

    python benchmarks/draft_k0_tax.py                    # SmolLM2-135M, ngram:2-6, B = 8
    python benchmarks/draft_k0_tax.py --steps 150 --json /tmp/k0tax.json
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from dsd import api
from dsd.backend.engine import SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.pair import ModelPair
from dsd.backend.threads import thread_settings
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError
from dsd.common.machine import load_average


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default="ngram:2-6")
    parser.add_argument("--k-max", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=120)
    parser.add_argument("--steps", type=int, default=60, help="step pairs, warm-up included")
    parser.add_argument("--skip", type=int, default=5, help="warm-up pairs left out")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures and settings here")
    args = parser.parse_args(argv)
    try:
        if not 0 <= args.skip < args.steps:
            raise InputError(f"--skip {args.skip}: must be in [0, --steps {args.steps})")
        if args.k_max < 1:
            raise InputError(f"--k-max {args.k_max}: must be >= 1")
        plain_pair = api.load_pair(args.target, threads=args.threads, seed=args.seed)
        draft_pair = plain_pair.with_draft(args.draft, seed=args.seed)
        if draft_pair.draft is None:
            raise InputError("--draft: name a draft (e.g. ngram:2-6)")
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    vocab = plain_pair.target.config.vocab_size
    prompts = [
        rng.integers(100, vocab, size=args.prompt_len) for _ in range(args.batch_size)
    ]  # [B] of [prompt_len]
    max_model_len = args.prompt_len + args.steps + 2

    def engine(pair: ModelPair, k_max: int) -> tuple[SpecDecodeEngine, np.ndarray]:
        built = SpecDecodeEngine(
            pair.target,
            pair.draft,
            SpecDecodeConfig(num_slots=args.batch_size, max_model_len=max_model_len, k_max=k_max),
        )
        slots = np.array([built.alloc_slot(prompt) for prompt in prompts])
        built.prefill(slots, np.full(args.batch_size, args.prompt_len))
        return built, slots

    arms = {"no draft": engine(plain_pair, 0), args.draft: engine(draft_pair, args.k_max)}
    times: dict[str, list[float]] = {name: [] for name in arms}
    k0 = np.zeros(args.batch_size, dtype=np.int64)
    load_before = load_average()
    for step in range(args.steps):
        order = list(arms) if step % 2 == 0 else list(reversed(arms))
        for name in order:
            built, slots = arms[name]
            start = time.perf_counter()
            built.step(slots, k0)
            times[name].append((time.perf_counter() - start) * 1000.0)
    load_after = load_average()
    plain_ms, draft_ms = (np.array(times[name][args.skip :]) for name in arms)
    same_tokens = all(
        np.array_equal(arms["no draft"][0].sequence(a), arms[args.draft][0].sequence(b))
        for a, b in zip(arms["no draft"][1], arms[args.draft][1], strict=True)
    )
    figures = {
        name: {
            "median_ms": float(np.median(ms)),
            "p10_ms": float(np.percentile(ms, 10)),
            "p90_ms": float(np.percentile(ms, 90)),
        }
        for name, ms in zip(arms, (plain_ms, draft_ms), strict=True)
    }
    ratio_of_medians = float(np.median(draft_ms) / np.median(plain_ms))
    paired = float(np.median(draft_ms / plain_ms))
    for name, row in figures.items():
        print(
            f"{name:<12} K=0 step median {row['median_ms']:.1f} ms "
            f"(p10-p90 {row['p10_ms']:.1f}-{row['p90_ms']:.1f})"
        )
    print(
        f"{args.draft} / no draft: ratio of medians {ratio_of_medians:.3f}, median of "
        f"{plain_ms.size} paired ratios {paired:.3f}; same tokens: {'yes' if same_tokens else 'NO'}"
    )
    print(
        f"B = {args.batch_size}, {args.prompt_len}-token prompts, {args.target}, "
        f"threads {thread_settings()['torch_intra_op_threads']}, load {load_before:.2f} -> "
        f"{load_after:.2f}"
    )
    if args.json:
        atomic_write_json(
            args.json,
            {
                "settings": {**vars(args), "threads": thread_settings()},
                "arms": figures,
                "ratio_of_medians": ratio_of_medians,
                "median_paired_ratio": paired,
                "pairs": int(plain_ms.size),
                "same_tokens": same_tokens,
                "load": [load_before, load_after],
            },
            indent=1,
        )
    return 0 if same_tokens else 1


if __name__ == "__main__":
    raise SystemExit(main())
