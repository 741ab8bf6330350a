"""GPU benchmarks of the real SD engine (run on a CUDA machine; exits with a message on CPU).

One run measures, for a Llama-3.1-8B-shaped target with random weights (bf16, CUDA graphs), the
decode step under each engine-efficiency switch, so that it says what each one buys:

- variants: `baseline` (today's step), `fused` (q/k/v and gate/up as one product each:
  `Transformer.fuse_projections`), `in-place` (attention reads the KV cache where it lies:
  `StepOptions.in_place_attention`), `compiled` (the fixed-shape step torch.compile'd before its
  CUDA graph is captured: `StepOptions.compile_backend`) and `all` (every switch; gpt-fast's
  recipe). The target is built once; fusing lays its weights out once (the separate weights are
  views of the fused ones) and each variant switches the products it runs.
(a) plain decode TPOT at B = 1 for every variant against the copy-bandwidth roofline: weight
    bytes / measured device-to-device copy bandwidth. Target: >= 0.85 of it. At each larger B
    (64 and 256) for `--large-variants`: the achieved bandwidth (weights and each row's KV span
    read) and TFLOP/s (the products and attention).
(b) the tax of the dynamic engine (a draft, held at K = 0) against the plain engine at B = 1, per
    `--tax-variants`: target <= 1 %.
(c) the SD step at K against K = 0 at B = 1 (the ideal speedup per unit of AL), per
    `--sd-variants` (default baseline only: a compiled K > 0 step is one more compile);
    random weights accept almost nothing, so only the step times mean anything.

Variants are interleaved (rounds of A B C ..., `--rounds`): each engine is built and prefilled
once, its shapes captured (and compiled) in its first round's warm-up, and every round times
each engine again; the figure is the median over rounds of each round's median step. Each B's
engines are freed before the next B's are built (the KV cache of 256 rows is ~22 GB at 8B). A
variant that fails to build or run is recorded with its error and left out of later rounds. The
JSON is rewritten after each part, so a run cut short keeps what it measured.

`--dry-run` runs every variant and part with a tiny shape on CPU (the eager runner; dynamo's
"eager" backend for the compiled variants) in seconds and checks nothing about speed; it is what
the test suite runs. This script only measures; it asserts no target.

    python benchmarks/engine_gpu.py --out results/gpu/engine_gpu.json
    python benchmarks/engine_gpu.py --dry-run --out /tmp/engine_gpu.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsd.backend.engine import Draft, SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.environment import environment_metadata
from dsd.backend.fast_path import StepOptions, build_spec_decode_engine
from dsd.backend.model import MODEL_CONFIGS, Transformer, init_random_
from dsd.backend.profiler import synthetic_ids
from dsd.common.atomic import atomic_write_json
from dsd.common.strict_json import missing_text

ROOFLINE_TARGET = 0.85  # (a): B = 1 at this fraction of the copy-bandwidth roofline or better
TAX_TARGET_PCT = 1.0  # (b)
PREFILL_ROWS = 32  # rows per prefill forward (bounds its activations at 8B)


@dataclass(frozen=True)
class Variant:
    """One combination of the engine-efficiency switches."""

    name: str
    fused: bool  # Transformer.fuse_projections
    in_place: bool  # StepOptions.in_place_attention
    compiled: bool  # StepOptions.compile_backend set

    def options(self, backend: str, mode: str | None) -> StepOptions:
        return StepOptions(
            in_place_attention=self.in_place,
            compile_backend=backend if self.compiled else None,
            compile_mode=mode if self.compiled else None,
        )


VARIANTS = {
    v.name: v
    for v in (
        Variant("baseline", fused=False, in_place=False, compiled=False),
        Variant("fused", fused=True, in_place=False, compiled=False),
        Variant("in-place", fused=False, in_place=True, compiled=False),
        Variant("compiled", fused=False, in_place=False, compiled=True),
        Variant("all", fused=True, in_place=True, compiled=True),
    )
}


def _names(text: str, flag: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"{flag}: choose from {', '.join(VARIANTS)}, got {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-shape", default="llama-3.1-8b", help="named shape (random)")
    parser.add_argument("--draft-shape", default="llama-3.2-1b", help="named draft shape (b, c)")
    parser.add_argument(
        "--batch-sizes", default="1,64,256", help="B values: 1 for every variant, others (a)"
    )
    parser.add_argument("--context-len", type=int, default=512, help="tokens per row")
    parser.add_argument("--k", type=int, default=3, help="K for (c)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="variants at B = 1")
    parser.add_argument("--large-variants", default="baseline,all", help="variants at B > 1")
    parser.add_argument("--tax-variants", default="baseline,all", help="variants for (b)")
    parser.add_argument("--sd-variants", default="baseline", help="variants for (c)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per engine")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per round")
    parser.add_argument("--iters", type=int, default=20, help="timed steps per round")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (no graphs)")
    parser.add_argument("--fast-path", default="cuda-graphs", help="eager, cuda-graphs")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", default="results/gpu/engine_gpu.json", help="JSON to write")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, no targets")
    args = parser.parse_args(argv)
    args.batch_size_list = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    args.variant_list = _names(args.variants, "--variants")
    args.large_variant_list = _names(args.large_variants, "--large-variants")
    args.tax_variant_list = _names(args.tax_variants, "--tax-variants")
    args.sd_variant_list = _names(args.sd_variants, "--sd-variants")
    if args.fast_path not in ("eager", "cuda-graphs"):
        raise SystemExit(f"--fast-path: choose eager or cuda-graphs, got {args.fast_path!r}")
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


def step_work(model: Transformer, batch_size: int, context_len: int) -> tuple[float, float]:
    """(bytes read, FLOPs) of a plain decode step of `batch_size` rows at `context_len`: every
    product's weight (not the embedding table, of which a step reads B rows) and each row's KV
    span once; 2 FLOPs per weight per row, and q.k and p.v over the span."""
    config = model.config
    products = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name
    )
    if model.lm_head is None:  # tied: the embedding is the head's weight
        products += model.embed_tokens.weight.numel()
    element = model.embed_tokens.weight.element_size()
    kv_per_token = config.num_layers * 2 * config.num_kv_heads * config.head_dim
    kv_bytes = batch_size * context_len * kv_per_token * element
    attention_flops = (
        4.0 * batch_size * context_len * config.num_layers * config.num_heads * config.head_dim
    )
    return products * element + kv_bytes, 2.0 * products * batch_size + attention_flops


class Timed:
    """One engine with `batch_size` rows prefilled to `context_len`, stepped at a fixed context
    (each step's tokens are forgotten again, as `backend.profiler` does)."""

    def __init__(self, engine: SpecDecodeEngine, batch_size: int, context_len: int) -> None:
        self.engine = engine
        rng = np.random.default_rng(0)
        vocab = engine.target.config.vocab_size
        self.slots = np.array(
            [
                engine.alloc_slot(synthetic_ids(rng, context_len, vocab, []))
                for _ in range(batch_size)
            ]
        )
        for start in range(0, batch_size, PREFILL_ROWS):
            rows = self.slots[start : start + PREFILL_ROWS]
            while not all(engine.is_decoding(int(s)) for s in rows):
                pending = np.array([s for s in rows if not engine.is_decoding(int(s))])
                engine.prefill(pending, np.full(pending.size, context_len))
        self.known = context_len + 1

    def median_ms(self, k: int, warmup: int, iters: int) -> float:
        """Median ms of engine.step at K = k over `iters` steps after `warmup` untimed ones."""
        engine, slots = self.engine, self.slots
        spec = np.full(slots.size, k, dtype=np.int64)
        cuda = engine.device.type == "cuda"
        samples_ms = []
        for index in range(warmup + iters):
            if cuda:
                torch.cuda.synchronize(engine.device)
            start_s = time.perf_counter()
            engine.step(slots, spec)
            if cuda:
                torch.cuda.synchronize(engine.device)
            if index >= warmup:
                samples_ms.append((time.perf_counter() - start_s) * 1000.0)
            engine.num_tokens[slots] = self.known
            engine.target_cache.lengths[slots] = self.known - 1
            if engine.draft_cache is not None:
                engine.draft_cache.lengths[slots] = np.minimum(
                    engine.draft_cache.lengths[slots], self.known - 1
                )
        return float(np.median(samples_ms))


@dataclass
class Arm:
    """One timed series of a part: its variant, engine (plain, or `dynamic`: with a draft), K,
    and each round's median step."""

    label: str
    variant: Variant
    k: int = 0
    dynamic: bool = False
    timed: Timed | None = None
    rounds_ms: list[float] | None = None
    error: str | None = None

    @property
    def ms(self) -> float:
        return float(np.median(self.rounds_ms)) if self.rounds_ms else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        if args.dry_run:
            self.device, self.dtype = torch.device("cpu"), torch.float32
            target_config, draft_config = MODEL_CONFIGS["tiny"], MODEL_CONFIGS["tiny-draft"]
            self.batch_sizes, self.context_len = [1, 2], 16
            self.fast_path, self.compile_backend, self.compile_mode = "eager", "eager", None
            args.warmup, args.iters = 1, 2
        else:
            if not torch.cuda.is_available():
                raise SystemExit(
                    "engine_gpu.py needs a CUDA GPU (use --dry-run to exercise the code on CPU)"
                )
            self.device, self.dtype = torch.device("cuda"), getattr(torch, args.dtype)
            target_config = MODEL_CONFIGS[args.target_shape]
            draft_config = MODEL_CONFIGS[args.draft_shape]
            self.batch_sizes, self.context_len = args.batch_size_list, args.context_len
            self.fast_path = args.fast_path
            self.compile_backend, self.compile_mode = args.compile_backend, args.compile_mode
        # room for the prefilled context, the verified tokens and the trash position
        self.max_model_len = self.context_len + args.k + 8
        kw = {"device": self.device, "dtype": self.dtype}
        self.target = init_random_(Transformer(target_config, **kw), 0).eval()
        self.draft = init_random_(Transformer(draft_config, **kw), 1).eval()
        for model in (self.target, self.draft):
            model.fuse_projections()  # lays the fused weights out once; variants switch
            model.fuse_projections(False)
        self.results: dict[str, Any] = {
            "command": shlex.join([sys.executable, *sys.argv]),
            "dry_run": bool(args.dry_run),
            "target_shape": target_config.name,
            "draft_shape": draft_config.name,
            "context_len": self.context_len,
            "fast_path": self.fast_path,
            "compile": {"backend": self.compile_backend, "mode": self.compile_mode},
            "rounds": args.rounds,
            "steps_per_round": {"warmup": args.warmup, "timed": args.iters},
            "variants": {
                name: {"fused": v.fused, "in_place": v.in_place, "compiled": v.compiled}
                for name, v in VARIANTS.items()
            },
            **environment_metadata(self.device, self.dtype),
        }
        self.rows: list[list[str]] = []  # the printed table

    def engine(self, variant: Variant, batch_size: int, k_max: int) -> SpecDecodeEngine:
        config = SpecDecodeConfig(
            num_slots=batch_size, max_model_len=self.max_model_len, k_max=k_max
        )
        return build_spec_decode_engine(
            self.target,
            Draft(self.draft) if k_max > 0 else None,
            config,
            self.fast_path,
            variant.options(self.compile_backend, self.compile_mode),
        )

    def run_arms(self, arms: list[Arm], batch_size: int) -> None:
        """Build the arms' engines (one per variant and kind), then time them in interleaved
        rounds."""
        args = self.args
        built: dict[tuple[str, bool], Timed | str] = {}
        for arm in arms:
            key = (arm.variant.name, arm.dynamic)
            if key not in built:
                try:
                    self._switch(arm.variant)
                    k_max = max(args.k, 1) if arm.dynamic else 0
                    engine = self.engine(arm.variant, batch_size, k_max)
                    built[key] = Timed(engine, batch_size, self.context_len)
                except Exception as exc:  # a variant that cannot run is reported, not fatal
                    built[key] = f"{type(exc).__name__}: {exc}"
                    print(f"{arm.label} B={batch_size}: failed to build ({built[key]})", flush=True)
            timed = built[key]
            if isinstance(timed, str):
                arm.error = timed
            else:
                arm.timed, arm.rounds_ms = timed, []
        for _ in range(args.rounds):
            for arm in arms:
                if arm.timed is None or arm.error is not None:
                    continue
                try:
                    self._switch(arm.variant)
                    ms = arm.timed.median_ms(arm.k, args.warmup, args.iters)
                    assert arm.rounds_ms is not None
                    arm.rounds_ms.append(ms)
                except Exception as exc:
                    arm.error = f"{type(exc).__name__}: {exc}"
                    print(f"{arm.label} B={batch_size}: failed ({arm.error})", flush=True)
        for arm in arms:
            arm.timed = None  # frees the engines and their KV caches
        built.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _switch(self, variant: Variant) -> None:
        # A captured graph keeps the products it was captured with; eager steps read the flag
        self.target.fuse_projections(variant.fused)
        self.draft.fuse_projections(variant.fused)

    def measure(self) -> dict[str, Any]:
        args, results = self.args, self.results
        bandwidth = (
            copy_bandwidth_bytes_per_s(self.device) if self.device.type == "cuda" else float("nan")
        )
        roofline_ms = weight_bytes(self.target) / bandwidth * 1000.0
        results["roofline"] = {
            "weight_bytes": weight_bytes(self.target),
            "copy_bandwidth_gb_s": bandwidth / 1e9,
            "roofline_ms": roofline_ms,
            "target_fraction_at_b1": ROOFLINE_TARGET,
        }
        decode: dict[str, Any] = {}
        for batch_size in self.batch_sizes:
            if batch_size == 1:
                names = list(dict.fromkeys(args.variant_list + args.tax_variant_list))
            else:
                names = args.large_variant_list
            plain = {name: Arm(name, VARIANTS[name]) for name in names}
            zero: dict[str, Arm] = {}  # the dynamic engine at K = 0, per variant
            with_k: dict[str, Arm] = {}  # ... and at K = args.k
            if batch_size == 1:
                for name in dict.fromkeys(args.tax_variant_list + args.sd_variant_list):
                    zero[name] = Arm(f"{name} dynamic", VARIANTS[name], dynamic=True)
                for name in args.sd_variant_list:
                    label = f"{name} dynamic K={args.k}"
                    with_k[name] = Arm(label, VARIANTS[name], args.k, dynamic=True)
            self.run_arms([*plain.values(), *zero.values(), *with_k.values()], batch_size)
            decode[str(batch_size)] = self._decode(batch_size, list(plain.values()), roofline_ms)
            if batch_size == 1:
                results["k0_tax"] = self._tax(plain, zero)
                results["sd_step"] = self._sd(zero, with_k)
            self._summarise(decode)
        return results

    def _decode(self, batch_size: int, arms: list[Arm], roofline_ms: float) -> dict[str, Any]:
        read_bytes, flops = step_work(self.target, batch_size, self.context_len + 1)
        by_variant = {}
        for arm in arms:
            ms = arm.ms
            entry = {
                "tpot_ms": ms,
                "rounds_ms": arm.rounds_ms,
                "fraction_of_roofline": roofline_ms / ms,
                "achieved_gb_s": read_bytes / ms / 1e6,
                "achieved_tflop_s": flops / ms / 1e9,
                "error": arm.error,
            }
            by_variant[arm.label] = entry
            self.rows.append(
                [f"decode B={batch_size}", arm.label, _ms(ms), _fraction(entry), _gbs(entry)]
            )
        return {"bytes_read": read_bytes, "flops": flops, "by_variant": by_variant}

    def _tax(self, plain: dict[str, Arm], zero: dict[str, Arm]) -> dict[str, Any]:
        tax = {}
        for name in self.args.tax_variant_list:
            plain_ms, dynamic_ms = plain[name].ms, zero[name].ms
            tax[name] = {
                "plain_ms": plain_ms,
                "dynamic_k0_ms": dynamic_ms,
                "tax_pct": (dynamic_ms / plain_ms - 1.0) * 100.0,
                "errors": [e for e in (plain[name].error, zero[name].error) if e],
            }
            pct = missing_text(tax[name]["tax_pct"], "{:+.2f} %")
            self.rows.append(["K=0 tax B=1", name, _ms(dynamic_ms), pct, ""])
        return tax

    def _sd(self, zero: dict[str, Arm], with_k: dict[str, Arm]) -> dict[str, Any]:
        sd = {}
        for name in self.args.sd_variant_list:
            k0_ms, k_ms = zero[name].ms, with_k[name].ms
            sd[name] = {
                "k": self.args.k,
                "itl_k0_ms": k0_ms,
                "itl_k_ms": k_ms,
                "ideal_speedup_per_al": k0_ms / k_ms,  # multiply by AL(K) for the ideal speedup
                "errors": [e for e in (zero[name].error, with_k[name].error) if e],
            }
            self.rows.append([f"SD K={self.args.k} B=1", name, _ms(k_ms), "", ""])
        return sd

    def _summarise(self, decode: dict[str, Any]) -> None:
        """The parts so far, written out; with the keys earlier runs of this script wrote,
        (a), (b) and (c) of the last variant of each list (by default `all`, `all`,
        `baseline`)."""
        args, results = self.args, self.results
        results["by_batch_size"] = decode
        headline = args.variant_list[-1]
        b1 = decode.get("1", {}).get("by_variant", {}).get(headline)
        if b1 is not None:
            roofline = results["roofline"]
            results["a_plain_decode"] = {
                "variant": headline,
                **roofline,
                "by_batch_size": {"1": b1},
            }
        tax_headline = args.tax_variant_list[-1]
        if tax_headline in results.get("k0_tax", {}):
            tax = results["k0_tax"][tax_headline]
            results["b_k0_tax"] = {"variant": tax_headline, **tax, "target_pct": TAX_TARGET_PCT}
        sd_headline = args.sd_variant_list[-1]
        if sd_headline in results.get("sd_step", {}):
            sd = results["sd_step"][sd_headline]
            note = "random weights: acceptance is near 0; multiply by AL(K)"
            results["c_sd_speedup"] = {"variant": sd_headline, **sd, "note": note}
        stats = torch._dynamo.utils.counters
        results["compile_stats"] = {
            "unique_graphs": int(stats["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(stats["graph_break"].values())),
        }
        atomic_write_json(args.out, results)

    def table(self) -> str:
        header = ["part", "variant", "ms", "of roofline / tax", "GB/s, TFLOP/s"]
        rows = [header, *self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
        )


def _ms(value: float) -> str:
    return missing_text(value if np.isfinite(value) else None, "{:.3f}")


def _fraction(entry: dict[str, Any]) -> str:
    value = entry["fraction_of_roofline"]
    return missing_text(value if np.isfinite(value) else None, "{:.2f}")


def _gbs(entry: dict[str, Any]) -> str:
    gbs, tflops = entry["achieved_gb_s"], entry["achieved_tflop_s"]
    if not np.isfinite(gbs):
        return missing_text(None)
    return f"{gbs:.4g}, {tflops:.4g}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results = bench.measure()
    print(bench.table())
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run(args)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
