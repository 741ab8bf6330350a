"""GPU benchmarks of the real SD engine (run on a CUDA machine; exits with a message on CPU).

Three measurements, printed and written as one JSON (device, versions, command):
(a) plain decode TPOT at B = 1, 16, 64, 256 for a Llama-3.1-8B-shaped target with random
    weights (bf16) against the HBM roofline: weight bytes / measured device-to-device copy
    bandwidth. Target: >= 89 % of roofline at B = 1.
(b) the tax of the dynamic engine held at K = 0 against a plain decode engine (the same engine
    with no draft): target <= 1 %.
(c) SD speedup at B = 1 for a draft/target pair against the ideal ITL(K=0) * AL / ITL(K): the
    pair is random-weight unless --target/--draft name loadable models (e.g. a trained zoo pair).

`--dry-run` runs every code path with a tiny shape on CPU (seconds) and checks nothing about
speed; it is what the test suite runs. This script only measures; it asserts no target.

    python benchmarks/engine_gpu.py --out results/gpu/engine_gpu.json
    python benchmarks/engine_gpu.py --dry-run --out /tmp/engine_gpu.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsd.backend.engine import Draft, SpecDecodeConfig
from dsd.backend.environment import environment_metadata
from dsd.backend.fast_path import build_spec_decode_engine
from dsd.backend.model import MODEL_CONFIGS, Transformer, init_random_
from dsd.backend.profiler import synthetic_ids
from dsd.common.atomic import atomic_write_text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-shape", default="llama-3.1-8b", help="named shape (random)")
    parser.add_argument("--draft-shape", default="llama-3.2-1b", help="named draft shape for (c)")
    parser.add_argument("--batch-sizes", default="1,16,64,256", help="B values for (a)")
    parser.add_argument("--context-len", type=int, default=512, help="tokens per row")
    parser.add_argument("--k", type=int, default=3, help="K for (c)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--fast-path", default="cuda-graphs", help="off, eager, cuda-graphs")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", default="results/gpu/engine_gpu.json", help="JSON to write")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, no targets")
    args = parser.parse_args(argv)
    args.batch_size_list = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    return args


def copy_bandwidth_bytes_per_s(device: torch.device, num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (read + write bytes / s), the roofline's memory speed."""
    source = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device=device)  # [N]
    dest = torch.empty_like(source)
    for _ in range(3):
        dest.copy_(source)
    torch.cuda.synchronize(device)
    start_s = time.perf_counter()
    repeats = 20
    for _ in range(repeats):
        dest.copy_(source)
    torch.cuda.synchronize(device)
    elapsed_s = time.perf_counter() - start_s
    return 2.0 * num_bytes * repeats / elapsed_s


def weight_bytes(model: Transformer) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def time_steps(engine: Any, batch_size: int, k: int, context_len: int, args: Any) -> float:
    """Median ms of engine.step at (B, K) with every row held at context_len tokens."""
    rng = np.random.default_rng(0)
    vocab = engine.target.config.vocab_size
    slots = np.array(
        [engine.alloc_slot(synthetic_ids(rng, context_len, vocab, [])) for _ in range(batch_size)]
    )
    while True:
        pending = np.array([s for s in slots if not engine.is_decoding(int(s))], dtype=np.int64)
        if pending.size == 0:
            break
        engine.prefill(pending, np.full(pending.size, 512))
    known = context_len + 1
    spec = np.full(batch_size, k, dtype=np.int64)
    samples_ms = []
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda *a: None)
    for index in range(args.warmup + args.iters):
        sync(engine.device)
        start_s = time.perf_counter()
        result = engine.step(slots, spec)
        sync(engine.device)
        if index >= args.warmup:
            samples_ms.append((time.perf_counter() - start_s) * 1000.0)
        # Hold the context fixed (same as backend.profiler).
        engine.num_tokens[slots] = known
        engine.target_cache.lengths[slots] = known - 1
        if engine.draft_cache is not None:
            engine.draft_cache.lengths[slots] = np.minimum(
                engine.draft_cache.lengths[slots], known - 1
            )
        del result
    for slot in slots:
        engine.free_slot(int(slot))
    return float(np.median(samples_ms))


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.dry_run:
        device = torch.device("cpu")
        dtype = torch.float32
        target_config = MODEL_CONFIGS["tiny"]
        draft_config = MODEL_CONFIGS["tiny-draft"]
        batch_sizes = [1, 2]
        context_len = 16
        fast_path = "eager"
        args.warmup, args.iters = 1, 2
    else:
        if not torch.cuda.is_available():
            raise SystemExit(
                "engine_gpu.py needs a CUDA GPU (use --dry-run to exercise the code on CPU)"
            )
        device = torch.device("cuda")
        dtype = getattr(torch, args.dtype)
        target_config = MODEL_CONFIGS[args.target_shape]
        draft_config = MODEL_CONFIGS[args.draft_shape]
        batch_sizes = args.batch_size_list
        context_len = args.context_len
        fast_path = args.fast_path
    k = args.k
    max_model_len = context_len + 4 * (args.warmup + args.iters) + 8
    target = init_random_(Transformer(target_config, device=device, dtype=dtype), 0).eval()
    results: dict[str, Any] = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "dry_run": bool(args.dry_run),
        "target_shape": target_config.name,
        "draft_shape": draft_config.name,
        "context_len": context_len,
        "fast_path": fast_path,
        **environment_metadata(device, dtype),
    }

    # (a) plain decode vs roofline
    plain = build_spec_decode_engine(
        target,
        None,
        SpecDecodeConfig(num_slots=max(batch_sizes), max_model_len=max_model_len, k_max=0),
        fast_path=fast_path,
    )
    bytes_of_weights = weight_bytes(target)
    bandwidth = copy_bandwidth_bytes_per_s(device) if device.type == "cuda" else float("nan")
    roofline_ms = bytes_of_weights / bandwidth * 1000.0
    decode = {}
    for batch_size in batch_sizes:
        tpot_ms = time_steps(plain, batch_size, 0, context_len, args)
        decode[str(batch_size)] = {
            "tpot_ms": tpot_ms,
            "fraction_of_roofline": roofline_ms / tpot_ms if np.isfinite(roofline_ms) else None,
        }
        print(f"(a) plain decode B={batch_size}: {tpot_ms:.3f} ms")
    results["a_plain_decode"] = {
        "weight_bytes": bytes_of_weights,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "roofline_ms": roofline_ms,
        "by_batch_size": decode,
        "target_fraction_at_b1": 0.89,
    }
    print(f"(a) roofline {roofline_ms:.3f} ms (weights / copy bandwidth)")
    del plain
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the (a) engine's KV cache for max(B) slots

    # (b) dynamic engine at K = 0 vs plain decode, B = 1
    draft_model = init_random_(Transformer(draft_config, device=device, dtype=dtype), 1).eval()
    draft = Draft(draft_model)
    dynamic = build_spec_decode_engine(
        target,
        draft,
        SpecDecodeConfig(num_slots=1, max_model_len=max_model_len, k_max=max(k, 1)),
        fast_path=fast_path,
    )
    plain = build_spec_decode_engine(
        target,
        None,
        SpecDecodeConfig(num_slots=1, max_model_len=max_model_len, k_max=0),
        fast_path=fast_path,
    )
    plain_ms = time_steps(plain, 1, 0, context_len, args)
    dynamic_k0_ms = time_steps(dynamic, 1, 0, context_len, args)
    results["b_k0_tax"] = {
        "plain_ms": plain_ms,
        "dynamic_k0_ms": dynamic_k0_ms,
        "tax_pct": (dynamic_k0_ms / plain_ms - 1.0) * 100.0,
        "target_pct": 1.0,
    }
    print(f"(b) K=0 tax: {results['b_k0_tax']['tax_pct']:+.2f} %")
    del plain

    # (c) SD speedup at B = 1 against the ideal ITL(0) * AL / ITL(K)
    k_ms = time_steps(dynamic, 1, k, context_len, args)
    results["c_sd_speedup"] = {
        "k": k,
        "itl_k0_ms": dynamic_k0_ms,
        "itl_k_ms": k_ms,
        "note": "random weights: acceptance is near 0; pass a trained pair for a real AL",
        "ideal_speedup_per_al": dynamic_k0_ms / k_ms,  # multiply by AL(K) for the ideal speedup
    }
    print(f"(c) ITL K=0 {dynamic_k0_ms:.3f} ms, K={k} {k_ms:.3f} ms")
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
