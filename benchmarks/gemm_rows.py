"""Time a target's matrix products at M = 1..32 rows, per dtype: which row counts get a slow kernel.

Why: on an H100 with SmolLM2-135M in float32 on CUDA graphs (results/gpu/2026-11-27-h100) a step
that verified 7-16 tokens took 8.5-9.4 ms, while 6 or fewer took 3.9-5.7 ms and 20 or more
6.1-7.9 ms. On an H200 (results/gpu/2026-11-27-h200) this found why: float32 (TF32 off) runs
the k and v products at 7-16 rows on a kernel over twice as slow. Each distinct weight shape of
one forward (q, k, v, o, gate, up, down per layer, and the LM head) is multiplied by an [M, in]
activation `--calls` times in a row; a forward's products are the sum over its layers. Also
timed: q, k, v fused into one product and gate with up, which the engine does not do (yet): the
forward's products with those in their place. Modes: float32 (TF32 off, as the hardware report
runs), float32-lt (the same through cuBLASLt, torch's other CUDA matrix library: does its
kernel choice avoid the slow rows?), tf32 (float32 with TF32 matrix products), bfloat16.
Median over `--repeats`, printed per M and saved as JSON.

    python benchmarks/gemm_rows.py [--device cuda] [--target smollm2-135m] [--rows 1-32]
        [--modes float32,float32-lt,tf32,bfloat16] [--calls 50] [--repeats 5] [--out gemm_rows.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dsd.backend.model import MODEL_CONFIGS, ModelConfig
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError, int_list

MODES = ("float32", "float32-lt", "tf32", "bfloat16")


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, int, int]]:
    """name -> (in features, out features, products per forward)."""
    hidden, layers, head_dim = config.hidden_size, config.num_layers, config.head_dim
    return {
        "q": (hidden, config.num_heads * head_dim, layers),
        "k,v": (hidden, config.num_kv_heads * head_dim, 2 * layers),
        "o": (config.num_heads * head_dim, hidden, layers),
        "gate,up": (hidden, config.intermediate_size, 2 * layers),
        "down": (config.intermediate_size, hidden, layers),
        "lm_head": (hidden, config.vocab_size, 1),
        # Not in the engine's forward (yet): q, k and v as one product, and gate with up. Timed
        # because on the H200 the k/v product alone took a slow float32 kernel at 7-16 rows
        # (results/gpu/2026-11-27-h200), and fusing also halves the launches of those layers.
        "qkv fused": (hidden, (config.num_heads + 2 * config.num_kv_heads) * head_dim, layers),
        "gate+up fused": (hidden, 2 * config.intermediate_size, layers),
    }


# The products of a forward, as the engine runs them and with the fused ones in their place.
SEPARATE = ("q", "k,v", "o", "gate,up", "down", "lm_head")
FUSED = ("qkv fused", "o", "gate+up fused", "down", "lm_head")


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """A function that times `work()` in ms, device work included."""

    def cuda_ms(work: Callable[[], object]) -> float:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        work()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def host_ms(work: Callable[[], object]) -> float:
        start_s = time.perf_counter()
        work()
        return (time.perf_counter() - start_s) * 1000.0

    return cuda_ms if device.type == "cuda" else host_ms


def measure(
    config: ModelConfig,
    device: torch.device,
    mode: str,
    rows: list[int],
    calls: int,
    repeats: int,
) -> dict[int, dict[str, float]]:
    """M -> {shape name: ms per product, "forward": ms of one forward's products}."""
    dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cuda.preferred_blas_library("cublaslt" if mode == "float32-lt" else "cublas")
    time_ms = timer(device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    shapes = weight_shapes(config)
    weights = {
        name: (torch.randn(out, inp, generator=generator) * inp**-0.5).to(device, dtype)
        for name, (inp, out, _count) in shapes.items()
    }
    result: dict[int, dict[str, float]] = {}
    for m in rows:
        per_shape: dict[str, float] = {}
        for name, (inp, _out, _count) in shapes.items():
            x = torch.randn(m, inp, generator=generator).to(device, dtype)
            weight = weights[name]

            def products(x: torch.Tensor = x, weight: torch.Tensor = weight) -> None:
                for _ in range(calls):
                    torch.nn.functional.linear(x, weight)

            products()  # warm-up: kernel choice, caches
            per_shape[name] = statistics.median(time_ms(products) for _ in range(repeats)) / calls

        forward, fused = (
            sum(per_shape[name] * shapes[name][2] for name in names) for names in (SEPARATE, FUSED)
        )
        result[m] = {**per_shape, "forward": forward, "forward_fused": fused}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.preferred_blas_library("cublas")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--target", default="smollm2-135m", choices=sorted(MODEL_CONFIGS))
    parser.add_argument("--rows", default="1-32")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gemm_rows.py: --device cuda, but CUDA is not available here", file=sys.stderr)
        return 2
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        print(f"gemm_rows.py: --modes: unknown {unknown}; choose {MODES}", file=sys.stderr)
        return 2
    config = MODEL_CONFIGS[args.target]
    try:
        rows = list(int_list("--rows", args.rows, 1))
    except InputError as error:
        print(f"gemm_rows.py: {error}", file=sys.stderr)
        return 2
    results = {
        mode: measure(config, device, mode, rows, args.calls, args.repeats) for mode in modes
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{args.target} on {name}, torch {torch.__version__}: ms of one forward's products, as "
        "the engine runs them / with q,k,v and gate,up fused (lm_head alone in brackets)"
    )
    print("   M " + "".join(f"{mode:>26}" for mode in modes))
    for m in rows:
        cells = "".join(
            f"{results[mode][m]['forward']:9.3f} /{results[mode][m]['forward_fused']:7.3f}"
            f" ({results[mode][m]['lm_head']:.3f})"
            for mode in modes
        )
        print(f"{m:4d} {cells}")
    if args.out is not None:
        record = {
            "command": " ".join(["python", *sys.argv]),
            "device": name,
            "torch": torch.__version__,
            "target": args.target,
            "calls": args.calls,
            "repeats": args.repeats,
            "ms_by_mode_and_rows": results,
        }
        atomic_write_json(args.out, record, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
