"""A Llama-family decoder in plain torch: RMSNorm, RoPE (with Llama-3 scaling), GQA, SwiGLU.

This module is modules only (gpt-fast layout): it knows nothing about generation, drafting,
sampling or slots beyond "write this token's K/V at its position in that slot, attend to what the
slot holds up to the token's position". The SD step lives in `backend.engine`, rejection sampling
in `backend.sampling`, the KV cache storage in `backend.kv_cache`.

Parameter names are exactly the Hugging Face Llama names without the leading "model." (and
`lm_head.weight` as is), so an HF state dict loads with only that prefix stripped:
`embed_tokens.weight`, `layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
`layers.{i}.mlp.{gate,up,down}_proj.weight`, `layers.{i}.input_layernorm.weight`,
`layers.{i}.post_attention_layernorm.weight`, `norm.weight`, `lm_head.weight` (absent when the
head is tied to the embedding). Qwen3's per-head `self_attn.{q,k}_norm.weight` exist only when
`ModelConfig.qk_norm` is set. RoPE uses HF's rotate_half convention (the two halves of each head
are the real/imaginary parts), so HF weights work unchanged. Norms compute in float32 like HF.

On CPU, `Transformer.prepare_cpu_kernels()` lays the float32 weights out for inference
(`CpuKernels`: the native product of `backend.native` for few rows on one thread, oneDNN
otherwise): the few-token forwards that SD verification runs are bound by how matmuls with a
handful of rows are done, not by attention.

On CUDA the forwards keep SDPA off cuDNN attention (`attention_backends`): it builds an
execution plan for every new (batch, key length, ...) shape, and a decode step's key length is new
at every step.

Two switches for speed on a GPU, both off by default: `Transformer.fuse_projections()` runs q/k/v
and gate/up as one product each (the separate weights become views of the fused one), and a
group's `in_place_slots` lets attention read cache slots where they lie instead of gathering
each row's span (the decode fast path sets it when its rows' slots allow).

It deliberately does not: load files (`backend.weights`), tokenize, support attention biases,
sliding windows, MoE or tensor parallelism, or pick attention kernels otherwise (plain SDPA).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dsd.backend.kv_cache import KVCache
from dsd.backend.native import RowsMatmul, rows_matmul
from dsd.backend.native import fits as native_fits
from dsd.backend.native import pack as native_pack
from dsd.common.errors import InputError

# SDPA backends without a per-shape plan. torch prefers cuDNN attention on sm90/sm100 with a
# recent cuDNN, and cuDNN caches one built plan per (batch, query length, key length, ...): a
# miss costs tens of ms of host time. A decode step reads a key length it never read before.
# On an H100 (results/gpu/2026-11-26-h100) the cells that ran a (B, K) first took 46-94 ms a
# step, and later cells with the same shapes 23-27 ms (profiled: 19-23): the cost of a build
# per step, by that pattern (not yet re-measured with this context).
_NO_PER_SHAPE_PLANS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """The context a forward on `device` runs its attention in: on CUDA, SDPA without cuDNN
    attention (flash, memory-efficient or math pick up any shape at no build cost); elsewhere
    nothing changes."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(_NO_PER_SHAPE_PLANS)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 RoPE frequency scaling (HF `rope_type: "llama3"`)."""

    factor: float  # long wavelengths are divided by this; > 0
    low_freq_factor: float  # wavelengths above original_len / low_freq_factor are fully scaled
    high_freq_factor: float  # wavelengths below original_len / high_freq_factor are unscaled
    original_max_position_embeddings: int  # context length the base model was trained at

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise InputError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise InputError(
                "rope_scaling: need 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor}, {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings < 1:
            raise InputError(
                "rope_scaling.original_max_position_embeddings must be >= 1, got "
                f"{self.original_max_position_embeddings}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one Llama-family decoder. Validated on construction."""

    vocab_size: int  # tokens in the vocabulary (rows of embed_tokens); >= 1
    hidden_size: int  # model width; >= 1
    num_layers: int  # decoder layers; >= 1
    num_heads: int  # query heads; >= 1
    num_kv_heads: int  # key/value heads (GQA); divides num_heads
    intermediate_size: int  # SwiGLU inner width; >= 1
    rope_theta: float = 10000.0  # RoPE base
    rope_scaling: RopeScaling | None = None  # Llama-3 scaling, or None for plain RoPE
    rms_norm_eps: float = 1e-5  # epsilon inside every RMSNorm
    tie_word_embeddings: bool = False  # True: the head reuses embed_tokens.weight (no lm_head)
    max_position_embeddings: int = 4096  # longest context the model is meant for
    head_dim: int = 0  # per-head width; 0 means hidden_size // num_heads (filled in)
    bos_token_id: int | None = None  # beginning-of-sequence id, if the model has one
    eos_token_ids: tuple[int, ...] = ()  # every id that ends generation (may be empty)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    name: str = field(default="", compare=False)  # label for reports; not part of the shape

    def __post_init__(self) -> None:
        positive = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
        }
        for key, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"model config: {key} must be an integer >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise InputError(
                f"model config: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads != 0:
                raise InputError(
                    f"model config: hidden_size ({self.hidden_size}) not divisible by "
                    f"num_heads ({self.num_heads}); give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim < 2 or self.head_dim % 2 != 0:
            raise InputError(f"model config: head_dim must be even and >= 2, got {self.head_dim}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 1.0):
            raise InputError(
                f"model config: rope_theta must be finite and > 1, got {self.rope_theta}"
            )
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise InputError(f"model config: rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        for token_id in (
            *self.eos_token_ids,
            *(() if self.bos_token_id is None else (self.bos_token_id,)),
        ):
            if not 0 <= token_id < self.vocab_size:
                raise InputError(
                    f"model config: special token id {token_id} outside vocab "
                    f"[0, {self.vocab_size})"
                )

    @property
    def num_params(self) -> int:
        """Parameter count (embedding and head counted once when tied)."""
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * (attn + mlp + norms) + embed + head + self.hidden_size

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], name: str = "") -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (Llama, Mistral-style, SmolLM, Qwen3)."""
        where = f"{name or 'config.json'}"
        try:
            scaling = hf.get("rope_scaling")
            rope_scaling = None
            if scaling:
                rope_type = scaling.get("rope_type", scaling.get("type"))
                if rope_type not in ("llama3",):
                    raise InputError(
                        f"{where}: rope_scaling type {rope_type!r} is not supported (only llama3)"
                    )
                rope_scaling = RopeScaling(
                    factor=float(scaling["factor"]),
                    low_freq_factor=float(scaling["low_freq_factor"]),
                    high_freq_factor=float(scaling["high_freq_factor"]),
                    original_max_position_embeddings=int(
                        scaling["original_max_position_embeddings"]
                    ),
                )
            eos = hf.get("eos_token_id")
            eos_ids: tuple[int, ...]
            if eos is None:
                eos_ids = ()
            elif isinstance(eos, list):
                eos_ids = tuple(int(e) for e in eos)
            else:
                eos_ids = (int(eos),)
            model_type = str(hf.get("model_type", "llama"))
            num_heads = int(hf["num_attention_heads"])
            return cls(
                vocab_size=int(hf["vocab_size"]),
                hidden_size=int(hf["hidden_size"]),
                num_layers=int(hf["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
                intermediate_size=int(hf["intermediate_size"]),
                rope_theta=float(hf.get("rope_theta", 10000.0)),
                rope_scaling=rope_scaling,
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
                head_dim=int(hf.get("head_dim") or 0),
                bos_token_id=None if hf.get("bos_token_id") is None else int(hf["bos_token_id"]),
                eos_token_ids=eos_ids,
                qk_norm=model_type.startswith("qwen3"),
                name=name,
            )
        except KeyError as exc:
            raise InputError(f"{where}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{where}: bad value ({exc})") from None


_LLAMA3_SCALING_8K = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

# Named shapes. "tiny"/"tiny-draft" are test shapes (a draft of the same vocabulary); the others
# are the published shapes of those checkpoints, used with random weights for latency at real
# shapes or with loaded weights.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=256,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_ids=(2,),
        name="tiny",
    ),
    "tiny-draft": ModelConfig(
        vocab_size=256,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
        name="tiny-draft",
    ),
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1536,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_ids=(2,),
        name="smollm2-135m",
    ),
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=8192,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-3.2-1b",
    ),
    "llama-3.1-8b": ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_SCALING_8K,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-3.1-8b",
    ),
    "qwen3-0.6b": ModelConfig(
        vocab_size=151936,
        hidden_size=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        intermediate_size=3072,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        head_dim=128,
        bos_token_id=151643,
        eos_token_ids=(151645, 151643),
        qk_norm=True,
        name="qwen3-0.6b",
    ),
}


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies [head_dim / 2], float32, with Llama-3 scaling when configured."""
    half = config.head_dim // 2
    exponents = torch.arange(0, half, dtype=torch.float64) * 2.0 / config.head_dim  # [D/2]
    inv_freq = 1.0 / (config.rope_theta**exponents)  # [D/2]
    scaling = config.rope_scaling
    if scaling is not None:
        # Llama-3: frequencies whose wavelength exceeds the original context / low_freq_factor
        # are slowed by `factor`; those shorter than original / high_freq_factor are kept; the band
        # between is a linear blend in (original_len / wavelength).
        original_len = float(scaling.original_max_position_embeddings)
        wavelen = 2.0 * math.pi / inv_freq  # [D/2]
        low_freq_wavelen = original_len / scaling.low_freq_factor
        high_freq_wavelen = original_len / scaling.high_freq_factor
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
        blend = (original_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )  # [D/2]
        blended = (1.0 - blend) * scaled / scaling.factor + blend * scaled
        in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(in_band, blended, scaled)
    return inv_freq.to(torch.float32)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, head_dim] for integer positions [B, T] (HF layout: halves repeated)."""
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [B, T, D/2]
    angles = torch.cat((angles, angles), dim=-1)  # [B, T, D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, D] by cos/sin [B, T, D]: x*cos + rotate_half(x)*sin (HF convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [B, T, H, D]
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def _onednn_linear_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


# Rows the oneDNN weight layout is blocked for; fewer (2, 3) are padded up to it
BLOCKED_ROWS = 4
# Most rows the native product takes; more go to oneDNN. Whole SmolLM2-135M forwards on the
# 2-core AMD EPYC host: native 1.32x oneDNN's speed at 32 tokens, equal at 64, 0.91x at 128
# (`benchmarks/cpu_kernels.py`, docs/backend.md).
NATIVE_MAX_ROWS = 64


def on_native(rows: int) -> bool:
    """Whether `CpuKernels` with the native product runs a product of `rows` rows on it."""
    return rows <= NATIVE_MAX_ROWS and torch.get_num_threads() == 1


def padded_rows(rows: int, native: bool = False) -> int:
    """Rows `CpuKernels` computes for a product of `rows` rows: the native product (`native`)
    takes what `on_native` admits as it is, and on one thread 1 stays 1 (the matrix-vector
    product); otherwise fewer than `BLOCKED_ROWS` are padded to it."""
    if (native and on_native(rows)) or (rows == 1 and torch.get_num_threads() == 1):
        return rows
    return max(rows, BLOCKED_ROWS)


class CpuKernels:
    """Inference layouts of one float32 CPU weight [out, in] for `x @ weight.T`.

    With the native product (`backend.native`, one thread, AVX2), up to `NATIVE_MAX_ROWS` rows
    run on it from its packed copy of the weight: a verification of K + 1 tokens, or a batch of
    them, reads the weights once, so it costs little more than one token. More rows, or several
    threads, go to oneDNN with the weight pre-blocked once (below). Memory: the packed and the
    blocked copies, two weights' worth beside the weight itself.

    Without it: one row (B = T = 1 decoding) on one thread is a matrix-vector product, fastest
    when it reads the weight contiguously along `out`: the weight's storage is switched in place
    to column-major (the tensor keeps its shape and values; no second copy). That product runs on
    one thread whatever torch's thread count, so with more threads one row goes the multi-row
    way, padded to 4 rows (on 2 threads a 1-token SmolLM2-135M forward went from 1.15-1.20x
    to 1.30-1.36x the speed of plain torch; docs/backend.md). Several rows (a verification of
    K + 1 tokens, a batch) go to oneDNN with the weight pre-blocked once: F.linear's small-M GEMM
    re-packs the weight on every call, which made a 5-token forward cost twice a 1-token one
    (docs/backend.md has the measurement). The blocked copy is the only extra memory (one
    weight's worth). Two or three rows are padded with zero rows to the four the blocked layout
    is made for: oneDNN runs two rows on a slower kernel (a 2-token SmolLM2-135M forward took
    65 ms against 49-56 ms for 1, 3 and 4 tokens; padded, 51 ms), which made K = 1 and B = 2
    steps dearer than K = 2 and B = 4 ones.

    In-place changes to the weight are noticed and the copies rebuilt.
    """

    def __init__(self, weight: torch.Tensor, native: RowsMatmul | None = None) -> None:
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError("CpuKernels: a 2-D float32 CPU weight is required")
        self.native = native if native is not None and native_fits(weight) else None
        if self.native is None:
            with torch.no_grad():
                weight.data = weight.data.t().contiguous().t()  # same shape, column-major
        self.weight = weight
        self._pack()

    def _pack(self) -> None:
        self.version = self.weight._version
        self.blocked = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), BLOCKED_ROWS)
        self.packed = native_pack(self.weight) if self.native is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight._version != self.version:
            self._pack()
        features = x.shape[-1]
        rows = x.numel() // features
        if self.native is not None and self.packed is not None and on_native(rows):
            return self.native(x, self.packed, self.weight.shape[0])
        if padded_rows(rows) == 1:  # one row on one thread: the matrix-vector product
            return F.linear(x, self.weight)
        if rows < BLOCKED_ROWS:
            flat = x.reshape(rows, features)
            flat = torch.cat([flat, flat.new_zeros(BLOCKED_ROWS - rows, features)])
            blocked: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                flat, self.blocked, None, "none", [], ""
            )
            return blocked[:rows].reshape(*x.shape[:-1], blocked.shape[-1])
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.blocked, None, "none", [], ""
        )
        return out


class Linear(nn.Linear):
    """nn.Linear without bias that runs on `CpuKernels` once they are prepared (inference only:
    with autograd recording it is plain F.linear)."""

    kernels: CpuKernels | None = None

    def __init__(self, in_features: int, out_features: int, device: Any, dtype: Any) -> None:
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None or torch.is_grad_enabled():
            return F.linear(x, self.weight)
        return self.kernels(x)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, weight applied in the input dtype (as HF Llama does)."""

    def __init__(self, dim: int, eps: float, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)


@dataclass(frozen=True)
class ForwardGroup:
    """One padded [B, T] block of tokens of a forward (`Transformer.forward` runs one,
    `Transformer.forward_groups` several in one pass)."""

    input_ids: torch.Tensor  # [B, T] int64
    positions: torch.Tensor  # [B, T] int64, position of each token in its sequence
    slot_ids: torch.Tensor | None = None  # [B] int64 cache slot of each row (with a cache)
    kv_len: int | None = None  # attend to cache positions [0, kv_len); None: the whole cache
    logit_indices: torch.Tensor | None = None  # [B, N] tokens to compute logits at; None: all
    # Every slot id is below this: attention reads cache slots [0, in_place_slots) where they
    # lie instead of gathering each row's slot (`Attention`); None: gather
    in_place_slots: int | None = None


class Attention(nn.Module):
    """Grouped-query self-attention that reads/writes one layer of a slot-indexed KV cache."""

    qkv_weight: torch.Tensor | None  # a buffer (None until fused)

    def __init__(self, config: ModelConfig, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        kw = {"device": device, "dtype": dtype}
        self.q_proj = Linear(config.hidden_size, config.num_heads * config.head_dim, **kw)
        self.k_proj = Linear(config.hidden_size, config.num_kv_heads * config.head_dim, **kw)
        self.v_proj = Linear(config.hidden_size, config.num_kv_heads * config.head_dim, **kw)
        self.o_proj = Linear(config.num_heads * config.head_dim, config.hidden_size, **kw)
        # [q; k; v] rows in one weight once fused (`fuse_rows`): q/k/v_proj's weights are views
        self.register_buffer("qkv_weight", None, persistent=False)
        self.fused = False  # run q/k/v as one product of qkv_weight
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device, dtype)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device, dtype)

    def forward(
        self,
        x: torch.Tensor,  # [N, hidden] the tokens of every group, flat
        groups: Sequence[ForwardGroup],  # N = sum of each group's B x T
        ropes: Sequence[tuple[torch.Tensor, torch.Tensor]],  # per group: cos, sin [B, T, D]
        cache_k: torch.Tensor | None,  # [S, max_len, Hkv, D] this layer, or None (no cache)
        cache_v: torch.Tensor | None,  # [S, max_len, Hkv, D]
    ) -> torch.Tensor:
        """[N, hidden]: the projections run once over all N tokens (one read of each weight),
        attention within each group."""
        if self.fused and self.qkv_weight is not None:
            q_width = self.num_heads * self.head_dim
            kv_width = self.num_kv_heads * self.head_dim
            widths = [q_width, kv_width, kv_width]
            q_all, k_all, v_all = F.linear(x, self.qkv_weight).split_with_sizes(widths, -1)
        else:
            q_all = self.q_proj(x)  # [N, H * D]
            k_all = self.k_proj(x)  # [N, Hkv * D]
            v_all = self.v_proj(x)  # [N, Hkv * D]
        outs: list[torch.Tensor] = []
        start = 0
        for group, (cos, sin) in zip(groups, ropes, strict=True):
            batch, num_tokens = group.input_ids.shape
            end = start + batch * num_tokens
            q = q_all[start:end].view(batch, num_tokens, self.num_heads, self.head_dim)
            k = k_all[start:end].view(batch, num_tokens, self.num_kv_heads, self.head_dim)
            v = v_all[start:end].view(batch, num_tokens, self.num_kv_heads, self.head_dim)
            out = self._attend(q, k, v, cos, sin, group, cache_k, cache_v)  # [B, T, H * D]
            outs.append(out.reshape(end - start, -1))
            start = end
        projected: torch.Tensor = self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))
        return projected  # [N, hidden]

    def _attend(
        self,
        q: torch.Tensor,  # [B, T, H, D]
        k: torch.Tensor,  # [B, T, Hkv, D]
        v: torch.Tensor,  # [B, T, Hkv, D]
        cos: torch.Tensor,  # [B, T, D]
        sin: torch.Tensor,  # [B, T, D]
        group: ForwardGroup,
        cache_k: torch.Tensor | None,
        cache_v: torch.Tensor | None,
    ) -> torch.Tensor:
        """One group's attention -> [B, T, H * D]."""
        batch, num_tokens = group.input_ids.shape
        positions, slot_ids, kv_len = group.positions, group.slot_ids, group.kv_len
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)

        if cache_k is None or cache_v is None or slot_ids is None:
            # No cache: attend causally among the given tokens by their positions.
            keys, values = k, v  # [B, T, Hkv, D]
            key_positions = positions  # [B, T]
        else:
            # Write first, then read: a token attends to itself and to every earlier position.
            cache_k[slot_ids[:, None], positions] = k
            cache_v[slot_ids[:, None], positions] = v
            span = cache_k.shape[1] if kv_len is None else kv_len
            if group.in_place_slots is not None:
                return self._attend_in_place(q, positions, slot_ids, cache_k, cache_v, span, group)
            # index_select, not cache_k[slot_ids, :span]: on CPU advanced indexing gathers
            # element by element (B = 8, 600 positions: 1.6 ms a layer's K against 0.27 ms)
            keys = cache_k[:, :span].index_select(0, slot_ids)  # [B, S_kv, Hkv, D]
            values = cache_v[:, :span].index_select(0, slot_ids)  # [B, S_kv, Hkv, D]
            key_positions = torch.arange(span, device=q.device).expand(batch, span)  # [B, S_kv]
        mask = key_positions[:, None, :] <= positions[:, :, None]  # [B, T, S_kv]

        # Grouped-query attention without copying each KV head `group` times (repeat_interleave
        # did, and that copy was most of a CPU step's attention cost at long contexts).
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [B, H, T, D]
            keys.transpose(1, 2),  # [B, Hkv, S_kv, D]
            values.transpose(1, 2),  # [B, Hkv, S_kv, D]
            attn_mask=mask[:, None, :, :],  # [B, 1, T, S_kv]
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, T, D]
        return out.transpose(1, 2).reshape(batch, num_tokens, self.num_heads * self.head_dim)

    def _attend_in_place(
        self,
        q: torch.Tensor,  # [B, T, H, D], RoPE applied
        positions: torch.Tensor,  # [B, T]
        slot_ids: torch.Tensor,  # [B], every id < group.in_place_slots
        cache_k: torch.Tensor,  # [S, max_len, Hkv, D], this step's K/V already written
        cache_v: torch.Tensor,
        span: int,
        group: ForwardGroup,
    ) -> torch.Tensor:
        """Attention over cache slots [0, W) as they lie (W = group.in_place_slots): no copy of
        any row's span. The queries move instead (a few rows, not a span): slot s takes the
        queries of the lowest row on it, so a padded row that shares a real row's slot (padding
        rows come after the real ones) leaves it the real row's; a slot with no row attends with
        some row's queries (finite: position 0 is always visible) and its output is dropped.
        The query heads that share a KV head are stacked along the query axis (group x T
        queries per KV head), so SDPA needs no grouped-query support: a backend without it
        would otherwise copy each KV head per query head. -> [B, T, H * D], the gather's values.
        """
        batch, num_tokens = positions.shape
        window = group.in_place_slots
        assert window is not None
        share = self.num_heads // self.num_kv_heads  # query heads per KV head
        rows = torch.arange(batch, device=q.device)  # [B]
        row_of_slot = torch.full((window,), batch, dtype=rows.dtype, device=q.device)
        row_of_slot = row_of_slot.scatter_reduce(0, slot_ids, rows, reduce="amin")  # [W]
        row_of_slot = row_of_slot.clamp(max=batch - 1)  # [W]
        slot_q = q.index_select(0, row_of_slot).transpose(1, 2)  # [W, H, T, D]
        slot_q = slot_q.reshape(window, self.num_kv_heads, share * num_tokens, self.head_dim)
        slot_positions = positions.index_select(0, row_of_slot)  # [W, T]
        key_positions = torch.arange(span, device=q.device)  # [S_kv]
        mask = key_positions[None, None, :] <= slot_positions[:, :, None]  # [W, T, S_kv]
        mask = mask[:, None].expand(window, share, num_tokens, span)  # [W, share, T, S_kv]
        out = F.scaled_dot_product_attention(
            slot_q,  # [W, Hkv, share * T, D]
            cache_k[:window, :span].transpose(1, 2),  # [W, Hkv, S_kv, D], a view
            cache_v[:window, :span].transpose(1, 2),  # [W, Hkv, S_kv, D], a view
            attn_mask=mask.reshape(window, 1, share * num_tokens, span),
        )  # [W, Hkv, share * T, D]
        out = out.reshape(window, self.num_heads, num_tokens, self.head_dim)  # [W, H, T, D]
        out = out.index_select(0, slot_ids)  # [B, H, T, D]
        return out.transpose(1, 2).reshape(batch, num_tokens, self.num_heads * self.head_dim)

    def fuse(self, enabled: bool) -> None:
        """q/k/v as one product (`Transformer.fuse_projections`)."""
        if enabled and not _aliases(self.qkv_weight, [self.q_proj, self.k_proj, self.v_proj]):
            self.qkv_weight = fuse_rows([self.q_proj, self.k_proj, self.v_proj])
        self.fused = enabled


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    gate_up_weight: torch.Tensor | None  # a buffer (None until fused)

    def __init__(self, config: ModelConfig, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, **kw)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, **kw)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, **kw)
        # [gate; up] rows in one weight once fused (`fuse_rows`): gate/up_proj's are views
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.fused = False  # run gate and up as one product of gate_up_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and self.gate_up_weight is not None:
            gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
            out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        else:
            out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out  # [B, T, hidden]

    def fuse(self, enabled: bool) -> None:
        """gate/up as one product (`Transformer.fuse_projections`)."""
        if enabled and not _aliases(self.gate_up_weight, [self.gate_proj, self.up_proj]):
            self.gate_up_weight = fuse_rows([self.gate_proj, self.up_proj])
        self.fused = enabled


def fuse_rows(linears: Sequence[Linear]) -> torch.Tensor:
    """One weight holding the linears' weights' rows one after another; each linear's weight
    becomes a view of its rows (contiguous: a block of whole rows), so the weights are held
    once and every later in-place change (a state dict loaded, a random init) reaches both."""
    with torch.no_grad():
        fused = torch.cat([linear.weight.detach() for linear in linears])  # [sum out, in]
        start = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            requires_grad = linear.weight.requires_grad
            linear.weight = nn.Parameter(fused[start : start + rows], requires_grad=requires_grad)
            start += rows
    return fused


def _aliases(fused: torch.Tensor | None, linears: Sequence[Linear]) -> bool:
    """Whether `fused` still holds the linears' weights (moving a module to another device or
    dtype copies each tensor on its own and breaks the views)."""
    if fused is None:
        return False
    offset = 0
    for linear in linears:
        weight = linear.weight
        if weight.untyped_storage().data_ptr() != fused.untyped_storage().data_ptr():
            return False
        if weight.storage_offset() != fused.storage_offset() + offset:
            return False
        offset += weight.numel()
    return True


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.self_attn = Attention(config, device, dtype)
        self.mlp = MLP(config, device, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, device, dtype
        )


class Transformer(nn.Module):
    """The decoder. `forward` returns logits for every given token; see its docstring."""

    def __init__(self, config: ModelConfig, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, device=device, dtype=dtype
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, device, dtype) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head: Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, device, dtype)
        self.tied_head_kernels: CpuKernels | None = None  # the tied head's, once prepared
        self.cpu_kernels = False  # prepare_cpu_kernels ran: linears run on `CpuKernels`
        self.native_kernels = False  # ... and every one of them has the native product
        # Not a parameter and not in the state dict: derived from the config.
        self.register_buffer("inv_freq", rope_inv_freq(config).to(device), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T] int64
        positions: torch.Tensor,  # [B, T] int64, position of each token in its sequence
        kv_cache: KVCache | None = None,
        slot_ids: torch.Tensor | None = None,  # [B] int64 cache slot of each row
        num_layers: int | None = None,
        kv_len: int | None = None,
        logit_indices: torch.Tensor | None = None,  # [B, N] token indices into T; None: all T
        in_place_slots: int | None = None,  # every slot id < this: no gather (`ForwardGroup`)
    ) -> torch.Tensor:
        """Logits [B, T, V] (float32) of the next token after each given token.

        With a cache: writes the K/V of these tokens into `kv_cache` at (slot, position) and lets
        each token attend to every cache entry of its slot at positions <= its own, so the slot
        must already hold positions [0, first given position) of that sequence. Padding tokens are
        allowed at positions past a row's real tokens: they write only past the row's real length
        and no real token reads them. `kv_len` (a host int, > every position) bounds how much of
        the cache is read; None reads all of it. Without a cache: plain causal attention among the
        given tokens by position (training, reference checks).

        `num_layers=k` runs only the first k layers, then the final norm and head (an early-exit
        draft); the cache then needs only k layers. `logit_indices` computes the head only at
        those tokens (a prefill chunk needs one row of logits, not T x V); the result is then
        [B, N, V].
        """
        group = ForwardGroup(input_ids, positions, slot_ids, kv_len, logit_indices, in_place_slots)
        return self.forward_groups([group], kv_cache, num_layers)[0]

    def forward_groups(
        self,
        groups: Sequence[ForwardGroup],
        kv_cache: KVCache | None = None,
        num_layers: int | None = None,
        features_out: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """`forward` of several padded blocks in ONE pass: per group its logits, as `forward`
        would return them for that group alone. With `features_out`, each group's features (the
        final norm's output at every token, [B, T, hidden]: what an EAGLE head reads) are
        appended to it.

        Every linear layer (and the head) runs once over the tokens of all groups, so each weight
        is read once; attention runs per group. This is how a step that verifies decode rows of
        1 + K tokens and computes prefill chunks of hundreds runs as one forward without padding
        the decode rows to the chunk length. The groups' slots must differ.
        """
        depth = self.config.num_layers if num_layers is None else num_layers
        if not 1 <= depth <= self.config.num_layers:
            raise ValueError(f"num_layers must be in [1, {self.config.num_layers}], got {depth}")
        if not groups:
            raise ValueError("forward_groups needs at least one group")
        if kv_cache is not None and (
            any(g.slot_ids is None for g in groups) or kv_cache.num_layers < depth
        ):
            raise ValueError("a KV cache needs slot_ids and at least num_layers layers")
        flat_ids = [g.input_ids.reshape(-1) for g in groups]
        hidden = self.embed_tokens(flat_ids[0] if len(groups) == 1 else torch.cat(flat_ids))
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        ropes = [rope_cos_sin(inv_freq, g.positions, hidden.dtype) for g in groups]  # [B, T, D]
        with attention_backends(hidden.device):
            for index in range(depth):
                layer: DecoderLayer = self.layers[index]  # type: ignore[assignment]
                cache_k = kv_cache.k[index] if kv_cache is not None else None  # [S, L, Hkv, D]
                cache_v = kv_cache.v[index] if kv_cache is not None else None  # [S, L, Hkv, D]
                hidden = hidden + layer.self_attn(
                    layer.input_layernorm(hidden), groups, ropes, cache_k, cache_v
                )  # [N, hidden]
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))

        # The head only at the tokens each group wants logits of, all groups in one matmul.
        heads: list[torch.Tensor] = []
        sizes = [ids.numel() for ids in flat_ids]
        if features_out is not None:
            features = torch.split(self.norm(hidden), sizes)
            features_out.extend(
                f.view(*g.input_ids.shape, -1) for f, g in zip(features, groups, strict=True)
            )
        for group, part in zip(groups, torch.split(hidden, sizes), strict=True):
            block = part.view(*group.input_ids.shape, -1)  # [B, T, hidden]
            if group.logit_indices is not None:
                gather_index = group.logit_indices[:, :, None].expand(-1, -1, block.shape[-1])
                block = block.gather(1, gather_index)  # [B, N, hidden]
            heads.append(block)
        logits = self._head(
            heads[0] if len(heads) == 1 else torch.cat([h.reshape(-1, h.shape[-1]) for h in heads])
        )
        if len(heads) == 1:
            return [logits]
        parts = torch.split(logits, [h.shape[0] * h.shape[1] for h in heads])
        return [p.view(h.shape[0], h.shape[1], -1) for p, h in zip(parts, heads, strict=True)]

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head -> float32 logits."""
        return self.project(self.norm(hidden))

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head alone (no norm) -> float32 logits: also an EAGLE head's, over features."""
        logits: torch.Tensor
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        elif self.tied_head_kernels is not None and not torch.is_grad_enabled():
            logits = self.tied_head_kernels(hidden)
        else:
            logits = F.linear(hidden, self.embed_tokens.weight)
        return logits.float()

    @property
    def projections_fused(self) -> bool:
        """Whether q/k/v and gate/up run as one product each (`fuse_projections`)."""
        return any(layer.self_attn.fused for layer in self.layers)  # type: ignore[union-attr]

    def fuse_projections(self, enabled: bool = True) -> None:
        """Run q/k/v as one product and gate/up as one product in every layer (`enabled`), or
        the separate products again (False).

        The first call lays each group's weights out as one tensor whose row blocks ARE the
        separate weights (views, `fuse_rows`): nothing is held twice, the state dict keeps its
        Hugging Face names, and switching back and forth costs nothing. Move the model to its
        device and dtype before fusing (a move copies every tensor on its own; enabling again
        re-fuses). A wide product reads the same bytes as the separate ones but launches one
        kernel, and on CUDA avoids cuBLAS's slow few-row kernels of the narrow k/v products.
        Values: the same dot products; logits agree to rounding (the kernels may differ).
        Not with the CPU kernels (`prepare_cpu_kernels`: per-weight layouts), and never on by
        default: the CPU latency fits were measured on the separate products.
        """
        if enabled and self.cpu_kernels:
            raise ValueError("fuse_projections: not with the CPU kernels (a layout per weight)")
        for layer in self.layers:
            layer.self_attn.fuse(enabled)  # type: ignore[union-attr,operator]
            layer.mlp.fuse(enabled)  # type: ignore[union-attr,operator]

    def prepare_cpu_kernels(self, native: bool = True) -> bool:
        """Lay the weights out for CPU inference (`CpuKernels`); True if done.

        Only float32 CPU weights where torch has oneDNN's linear ops; otherwise (CUDA, other
        dtypes) nothing changes and False is returned. `native`: use the native product where
        it runs here (`backend.native`; False: oneDNN's and torch's kernels only, for
        comparisons). Values are unchanged; logits agree with the plain path to float32
        rounding (the summation order differs).
        """
        weight = self.embed_tokens.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return False
        if self.projections_fused:
            raise ValueError("prepare_cpu_kernels: the projections are fused (torch's kernels)")
        if not _onednn_linear_available():
            return False
        product = rows_matmul() if native else None
        kernels = []
        for module in self.modules():
            if isinstance(module, Linear):
                module.kernels = CpuKernels(module.weight, product)
                kernels.append(module.kernels)
        if self.lm_head is None:
            self.tied_head_kernels = CpuKernels(weight, product)
            kernels.append(self.tied_head_kernels)
        self.cpu_kernels = True
        self.native_kernels = all(kernel.native is not None for kernel in kernels)
        return True

    def tokens_worth_computing(self, num_tokens: int) -> int:
        """How many tokens a forward of `num_tokens` costs as many as (`padded_rows`): on
        `CpuKernels` without the native product, 2 or 3 (and 1 on several threads) cost what
        `BLOCKED_ROWS` do, since every linear pads them. A caller with spare positions (trash)
        pads its block once instead (the engine's verify forward: 2 tokens took 46.8 ms against
        44.0 for 4 on SmolLM2-135M, docs/backend.md)."""
        if not self.cpu_kernels:
            return num_tokens
        return padded_rows(num_tokens, self.native_kernels)


def init_random_(model: ModuleT, seed: int, std: float = 0.02) -> ModuleT:
    """Fill the weights in place like HF's init (normal(0, std) matrices, unit norms); returns it.

    Deterministic for a given seed and device (a generator on the parameters' device draws them).
    """
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            generator = torch.Generator(device=param.device)
            # One stream per parameter, keyed by its name, so order of creation does not matter.
            generator.manual_seed((seed * 1_000_003 + _stable_hash(param_name)) % (2**63))
            if param_name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                sample = torch.empty(param.shape, device=param.device, dtype=torch.float32)
                sample.normal_(0.0, std, generator=generator)
                param.copy_(sample)
    return model


def _stable_hash(text: str) -> int:
    """A hash of text that does not change between processes (str hash is salted)."""
    value = 1469598103934665603
    for byte in text.encode():
        value = ((value ^ byte) * 1099511628211) % (2**64)
    return value


def new_kv_cache(
    config: ModelConfig,
    num_slots: int,
    max_len: int,
    num_layers: int | None = None,
    device: Any = None,
    dtype: torch.dtype = torch.float32,
) -> KVCache:
    """A KV cache for a model of `config`: all its layers, or its first `num_layers` (an early
    exit)."""
    layers = config.num_layers if num_layers is None else num_layers
    if not 1 <= layers <= config.num_layers:
        raise ValueError(f"bad KV cache depth: {layers} of {config.num_layers} layers")
    return KVCache(
        layers, num_slots, max_len, config.num_kv_heads, config.head_dim, device=device, dtype=dtype
    )
