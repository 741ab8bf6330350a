"""Target forward time per verify width T (1 + K tokens) on CPU: plain torch vs the CPU kernels.

What an SD step costs on CPU is mostly the target's forward over T = 1 + K tokens of one row,
with the KV cache at a fixed context. Three models with the same weights:
- plain: torch's `F.linear`;
- onednn: `Transformer.prepare_cpu_kernels(native=False)`: 1-row projections from column-major
  weights, multi-row ones from oneDNN's prepacked layout;
- native: `prepare_cpu_kernels()`, what every loaded pair uses: the native product
  (`backend.native`) where it runs, else the same as onednn.
They are timed interleaved (plain, onednn, native, plain, ...), each `--iters` forwards per turn
after a warm-up, for `--repeats` turns; the figure per (model, T) is the median over turns of
the turn's median.

    OMP_NUM_THREADS=1 python benchmarks/cpu_kernels.py --model smollm2-135m --threads 1

Prints one row per T (ms per model with the turns' range, each prepared model's speedup over
plain, and T's cost over T = 1 per model), the native product's status and the machine (CPU,
threads, load before and after).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from dsd.backend import native
from dsd.backend.model import Transformer, new_kv_cache
from dsd.backend.pair import build_model
from dsd.backend.threads import set_threads, thread_settings
from dsd.common.errors import InputError
from dsd.common.machine import cpu_model, load_average


def _forward_ms(model: Transformer, width: int, context: int, iters: int) -> float:
    """Median ms of `iters` forwards of `width` new tokens after `context` cached ones."""
    cache = new_kv_cache(model.config, num_slots=1, max_len=context + width + 1)
    slots = torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        prompt = torch.arange(context)[None] % model.config.vocab_size
        model(prompt, torch.arange(context)[None], kv_cache=cache, slot_ids=slots)
        ids = torch.arange(width)[None] % model.config.vocab_size
        positions = torch.arange(context, context + width)[None]
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            model(ids, positions, kv_cache=cache, slot_ids=slots, kv_len=context + width)
            times.append((time.perf_counter() - start) * 1000.0)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model spec (default smollm2-135m)")
    parser.add_argument("--widths", default="1,2,3,4,5,7", help="tokens per forward, comma list")
    parser.add_argument("--context", type=int, default=192, help="cached tokens (default 192)")
    parser.add_argument("--iters", type=int, default=8, help="forwards per turn (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="turns per model (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
        if min(widths) < 1 or args.iters < 1 or args.repeats < 1 or args.context < 1:
            raise ValueError
    except ValueError:
        print("error: --widths, --iters, --repeats, --context: integers >= 1", file=sys.stderr)
        return 2
    set_threads(args.threads)
    load_before = load_average()
    try:
        prepared, _ = build_model(args.model, "cpu", torch.float32, seed=0)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The same weights in torch's own layout: fresh copies, prepared without the native product
    # or not at all.
    state = {k: v.contiguous() for k, v in prepared.state_dict().items()}
    plain = Transformer(prepared.config).eval()
    plain.load_state_dict(state)
    onednn = Transformer(prepared.config).eval()
    onednn.load_state_dict(state)
    onednn.prepare_cpu_kernels(native=False)
    models = {"plain": plain, "onednn": onednn, "native": prepared}
    for model in models.values():  # warm-up: allocator, oneDNN primitives, page faults
        for width in widths:
            _forward_ms(model, width, args.context, 2)
    turns: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for width in widths:
            for name, model in models.items():
                turns.setdefault((name, width), []).append(
                    _forward_ms(model, width, args.context, args.iters)
                )
    print(
        f"{args.model}, context {args.context}, {args.iters} forwards x {args.repeats} turns; "
        f"CPU {cpu_model()}; threads {thread_settings()}; "
        f"load {load_before:.2f} -> {load_average():.2f}"
    )
    print(f"native product: {native.status()}")
    names = list(models)
    print(f"{'T':>3} " + " ".join(f"{name + ' ms':>18}" for name in names)
          + "".join(f" {name + '/plain':>12}" for name in names[1:])
          + "".join(f" {'T/1 ' + name:>11}" for name in names))  # fmt: skip
    first = {name: np.median(turns[(name, widths[0])]) for name in models}
    for width in widths:
        cells = {name: np.array(turns[(name, width)]) for name in models}
        med = {name: float(np.median(values)) for name, values in cells.items()}
        print(
            f"{width:>3} "
            + " ".join(
                f"{med[name]:>6.1f} ({cells[name].min():>4.1f}-{cells[name].max():>4.1f})"
                for name in names
            )
            + "".join(f" {med['plain'] / med[name]:>11.2f}x" for name in names[1:])
            + "".join(f" {med[name] / first[name]:>11.2f}" for name in names)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
