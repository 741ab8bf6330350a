"""GGUF files: a reader (v2/v3), numpy dequantization, llama name mapping, and a small writer.

Written from the GGUF format description (ggml's docs/gguf.md):

    magic "GGUF" | uint32 version | uint64 tensor_count | uint64 kv_count
    kv_count x (string key, uint32 value_type, value)
    tensor_count x (string name, uint32 n_dims, uint64 dims[n_dims], uint32 ggml_type,
                    uint64 offset relative to the data section)
    padding to `general.alignment` (default 32) | tensor data

Strings are uint64 length + UTF-8 bytes; arrays are uint32 element type + uint64 count +
elements. All little-endian. `dims[0]` is ggml's `ne[0]`, the fastest-varying axis, so the numpy
shape is the reversed dims: a Hugging Face `[out, in]` Linear weight is stored as ne = [in, out].

Supported tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1 (blocks of 32 along ne[0]):
    Q8_0: f16 d, int8 q[32];              value = d * q
    Q4_0: f16 d, uint8 qs[16];            value = d * (q - 8)
    Q4_1: f16 d, f16 m, uint8 qs[16];     value = d * q + m
    nibbles: the low nibble of qs[j] is element j, the high nibble is element j + 16.

The llama mapping renames GGUF tensors (`blk.N.attn_q.weight` ...) to Hugging Face Llama names
without the `model.` prefix, and undoes the row permutation that llama.cpp's converter applies to
q_proj/k_proj (it turns HF's rotate-half RoPE layout into interleaved pairs).

This module does not know about torch or our Transformer (backend/weights.py builds the model),
and it does not read GGUF tokenizers (we ship SmolLM2's tokenizer.json). The writer exists for
round-trip tests and small exports; it does not do llama.cpp's mixed quantization recipes.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dsd.common.atomic import atomic_write
from dsd.common.errors import InputError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
QK = 32  # elements per quantization block for Q8_0 / Q4_0 / Q4_1


class ValueType(IntEnum):
    """GGUF metadata value types."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct formats of the fixed-size scalar value types
_SCALAR_FORMATS: dict[ValueType, str] = {
    ValueType.UINT8: "<B",
    ValueType.INT8: "<b",
    ValueType.UINT16: "<H",
    ValueType.INT16: "<h",
    ValueType.UINT32: "<I",
    ValueType.INT32: "<i",
    ValueType.FLOAT32: "<f",
    ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q",
    ValueType.INT64: "<q",
    ValueType.FLOAT64: "<d",
}
# numpy dtypes for fast reading of scalar arrays (token lists, scores)
_SCALAR_DTYPES: dict[ValueType, str] = {
    ValueType.UINT8: "<u1",
    ValueType.INT8: "<i1",
    ValueType.UINT16: "<u2",
    ValueType.INT16: "<i2",
    ValueType.UINT32: "<u4",
    ValueType.INT32: "<i4",
    ValueType.FLOAT32: "<f4",
    ValueType.BOOL: "<u1",
    ValueType.UINT64: "<u8",
    ValueType.INT64: "<i8",
    ValueType.FLOAT64: "<f8",
}


class GGMLType(IntEnum):
    """ggml tensor types (the subset that has a number we may meet; only some are decodable)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    BF16 = 30


# (elements per block, bytes per block) of the types we can decode
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q8_0: (QK, 2 + QK),
    GGMLType.Q4_0: (QK, 2 + QK // 2),
    GGMLType.Q4_1: (QK, 4 + QK // 2),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in the GGUF header."""

    name: str  # GGUF tensor name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]  # numpy shape (reversed ggml dims): [out, in] for a Linear weight
    ggml_type: int  # raw ggml type number (see GGMLType)
    offset: int  # byte offset of the data, relative to the start of the data section
    num_bytes: int  # bytes the data occupies; -1 when the type is not decodable here


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF header plus a read-only view of the file's bytes."""

    path: Path  # the file read
    version: int  # GGUF version (2 or 3)
    metadata: dict[str, Any]  # key -> value (arrays as lists, or numpy arrays for numbers)
    tensors: dict[str, TensorInfo]  # name -> info, in file order
    data_start: int  # absolute byte offset of the data section
    buffer: Any  # the file's bytes (mmap or bytes), indexed by absolute offset

    def tensor(self, name: str) -> npt.NDArray[np.float32]:
        """The named tensor dequantized to float32, in numpy shape."""
        if name not in self.tensors:
            raise InputError(f"{self.path}: no tensor named {name!r}")
        info = self.tensors[name]
        begin = self.data_start + info.offset
        raw = np.frombuffer(self.buffer, dtype=np.uint8, count=info.num_bytes, offset=begin)
        return dequantize(raw, info.ggml_type, info.shape, where=f"{self.path}: {name}")


class _Cursor:
    """Sequential little-endian reads with bounds checks that name the file."""

    def __init__(self, buffer: Any, path: Path) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self.pos = 0
        self.path = path

    def take(self, num_bytes: int, what: str) -> bytes:
        if num_bytes < 0 or self.pos + num_bytes > self.size:
            raise InputError(
                f"{self.path}: truncated or corrupt GGUF (reading {what} at byte {self.pos})"
            )
        chunk = bytes(self.buffer[self.pos : self.pos + num_bytes])
        self.pos += num_bytes
        return chunk

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("<Q", what)
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def value(self, value_type: int, what: str) -> Any:
        try:
            kind = ValueType(value_type)
        except ValueError:
            raise InputError(f"{self.path}: {what}: unknown GGUF value type {value_type}") from None
        if kind == ValueType.STRING:
            return self.string(what)
        if kind == ValueType.ARRAY:
            elem_type = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            try:
                elem_kind = ValueType(elem_type)
            except ValueError:
                raise InputError(
                    f"{self.path}: {what}: unknown GGUF array element type {elem_type}"
                ) from None
            if elem_kind in _SCALAR_DTYPES:
                dtype = np.dtype(_SCALAR_DTYPES[elem_kind])
                values = np.frombuffer(self.take(count * dtype.itemsize, what), dtype=dtype)
                return values.astype(bool) if elem_kind == ValueType.BOOL else values.copy()
            return [self.value(elem_type, what) for _ in range(count)]
        return self.scalar(_SCALAR_FORMATS[kind], what)


def _tensor_num_bytes(ggml_type: int, shape: tuple[int, ...], where: str) -> int:
    """Bytes of a tensor of this type and numpy shape; -1 for types we cannot decode."""
    try:
        layout = BLOCK_LAYOUT[GGMLType(ggml_type)]
    except (ValueError, KeyError):
        return -1
    block_elems, block_bytes = layout
    num_elems = int(np.prod(shape)) if shape else 1
    row = shape[-1] if shape else 1
    if row % block_elems:
        raise InputError(f"{where}: row length {row} is not a multiple of the block {block_elems}")
    return num_elems // block_elems * block_bytes


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse a GGUF v2/v3 file's header; tensor data stays memory-mapped until asked for."""
    file_path = Path(path)
    if not file_path.exists():
        raise InputError(f"{file_path}: no such file")
    if file_path.is_dir():
        raise InputError(f"{file_path}: is a directory, expected a .gguf file")
    with open(file_path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise InputError(f"{file_path}: empty file, not GGUF")
        buffer: Any = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buffer, file_path)
    magic = cursor.take(4, "magic")
    if magic != GGUF_MAGIC:
        raise InputError(f"{file_path}: bad magic {magic!r}, not a GGUF file")
    version = cursor.scalar("<I", "version")
    if version not in (2, 3):
        raise InputError(f"{file_path}: GGUF version {version} not supported (2 or 3)")
    num_tensors = cursor.scalar("<Q", "tensor count")
    num_kv = cursor.scalar("<Q", "metadata count")
    metadata: dict[str, Any] = {}
    for index in range(num_kv):
        key = cursor.string(f"metadata key #{index}")
        value_type = cursor.scalar("<I", f"type of {key}")
        metadata[key] = cursor.value(value_type, key)
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment % 8:
        raise InputError(f"{file_path}: general.alignment must be a positive multiple of 8")
    tensors: dict[str, TensorInfo] = {}
    for index in range(num_tensors):
        name = cursor.string(f"tensor name #{index}")
        num_dims = cursor.scalar("<I", f"{name} n_dims")
        if num_dims > 8:
            raise InputError(f"{file_path}: {name}: {num_dims} dims, corrupt tensor info")
        dims = [cursor.scalar("<Q", f"{name} dims") for _ in range(num_dims)]
        ggml_type = cursor.scalar("<I", f"{name} type")
        offset = cursor.scalar("<Q", f"{name} offset")
        shape = tuple(int(d) for d in reversed(dims))
        num_bytes = _tensor_num_bytes(ggml_type, shape, f"{file_path}: {name}")
        tensors[name] = TensorInfo(name, shape, ggml_type, offset, num_bytes)
    data_start = -(-cursor.pos // alignment) * alignment
    for info in tensors.values():
        if info.offset % alignment:
            raise InputError(f"{file_path}: {info.name}: data offset not aligned to {alignment}")
        if info.num_bytes >= 0 and data_start + info.offset + info.num_bytes > size:
            raise InputError(
                f"{file_path}: truncated GGUF: tensor {info.name} ends past the end of the file"
            )
    return GGUFFile(file_path, version, metadata, tensors, data_start, buffer)


# ---------------------------------------------------------------------------------------------
# Dequantization


def dequantize(
    raw: npt.NDArray[np.uint8], ggml_type: int, shape: tuple[int, ...], where: str = "tensor"
) -> npt.NDArray[np.float32]:
    """Decode raw GGUF tensor bytes to float32 of the given numpy shape."""
    try:
        kind = GGMLType(ggml_type)
    except ValueError:
        kind = None
    if kind not in BLOCK_LAYOUT:
        name = kind.name if kind is not None else str(ggml_type)
        raise InputError(
            f"{where}: ggml type {name} is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
        )
    assert kind is not None
    if kind == GGMLType.F32:
        return raw.view("<f4").astype(np.float32).reshape(shape)
    if kind == GGMLType.F16:
        return raw.view("<f2").astype(np.float32).reshape(shape)
    if kind == GGMLType.BF16:
        # bf16 is the top half of an f32
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    block_bytes = BLOCK_LAYOUT[kind][1]
    blocks = raw.reshape(-1, block_bytes)  # [num_blocks, block_bytes]
    scale = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [num_blocks, 1]
    if kind == GGMLType.Q8_0:
        quants = blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # [num_blocks, 32]
        values = scale * quants
    else:
        nibble_start = 2 if kind == GGMLType.Q4_0 else 4
        packed = blocks[:, nibble_start:]  # [num_blocks, 16]
        # low nibbles are elements 0..15, high nibbles elements 16..31
        quants = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)
        if kind == GGMLType.Q4_0:
            values = scale * (quants - 8.0)  # [num_blocks, 32]
        else:
            minimum = blocks[:, 2:4].copy().view("<f2").astype(np.float32)  # [num_blocks, 1]
            values = scale * quants + minimum  # [num_blocks, 32]
    return values.reshape(shape).astype(np.float32, copy=False)


def quantize(values: npt.NDArray[np.floating[Any]], ggml_type: int) -> bytes:
    """Encode float values (last axis a multiple of 32 for block types) as GGUF tensor bytes.

    Follows ggml's reference quantizers (round to nearest), so that dequantize(quantize(x)) is
    within half a quantization step of x.
    """
    kind = GGMLType(ggml_type)
    array = np.ascontiguousarray(values, dtype=np.float32)
    if kind == GGMLType.F32:
        return array.astype("<f4").tobytes()
    if kind == GGMLType.F16:
        return array.astype("<f2").tobytes()
    if kind == GGMLType.BF16:
        bits = array.view(np.uint32)
        # round to nearest even on the dropped 16 bits
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype("<u2").tobytes()
    if kind not in BLOCK_LAYOUT:
        raise InputError(f"cannot write ggml type {kind.name}")
    if array.shape[-1] % QK:
        raise InputError(f"row length {array.shape[-1]} is not a multiple of {QK}")
    blocks = array.reshape(-1, QK)  # [num_blocks, 32]
    if kind == GGMLType.Q8_0:
        amax = np.abs(blocks).max(axis=1)
        scale = (amax / 127.0).astype(np.float16)
        inv = np.divide(1.0, scale.astype(np.float32), out=np.zeros_like(amax), where=scale != 0)
        quants = np.clip(np.rint(blocks * inv[:, None]), -128, 127).astype(np.int8)
        out = np.concatenate([scale.view(np.uint8).reshape(-1, 2), quants.view(np.uint8)], axis=1)
        return out.astype(np.uint8).tobytes()
    if kind == GGMLType.Q4_0:
        # ggml: d = max / -8 where max is the signed value of largest magnitude
        idx = np.abs(blocks).argmax(axis=1)
        signed_max = blocks[np.arange(len(blocks)), idx]
        scale = (signed_max / -8.0).astype(np.float16)
        inv = np.divide(
            1.0, scale.astype(np.float32), out=np.zeros_like(signed_max), where=scale != 0
        )
        quants = np.clip(np.rint(blocks * inv[:, None] + 8.0), 0, 15).astype(np.uint8)
        header = scale.view(np.uint8).reshape(-1, 2)
    else:  # Q4_1
        low = blocks.min(axis=1)
        high = blocks.max(axis=1)
        scale = ((high - low) / 15.0).astype(np.float16)
        minimum = low.astype(np.float16)
        inv = np.divide(1.0, scale.astype(np.float32), out=np.zeros_like(low), where=scale != 0)
        shifted = blocks - minimum.astype(np.float32)[:, None]
        quants = np.clip(np.rint(shifted * inv[:, None]), 0, 15).astype(np.uint8)
        header = np.concatenate(
            [scale.view(np.uint8).reshape(-1, 2), minimum.view(np.uint8).reshape(-1, 2)], axis=1
        )
    packed = quants[:, :16] | (quants[:, 16:] << 4)  # [num_blocks, 16]
    return np.concatenate([header, packed], axis=1).astype(np.uint8).tobytes()


# ---------------------------------------------------------------------------------------------
# Writer


def _pack_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _infer_value_type(value: Any) -> ValueType:
    if isinstance(value, bool):
        return ValueType.BOOL
    if isinstance(value, int):
        return (
            ValueType.INT64
            if value < 0
            else ValueType.UINT32
            if value < 2**32
            else ValueType.UINT64
        )
    if isinstance(value, float):
        return ValueType.FLOAT32
    if isinstance(value, str):
        return ValueType.STRING
    if isinstance(value, list | tuple | np.ndarray):
        return ValueType.ARRAY
    raise InputError(f"cannot write metadata value of type {type(value).__name__}")


def _pack_value(value: Any, value_type: ValueType, elem_type: ValueType | None) -> bytes:
    if value_type == ValueType.STRING:
        return _pack_string(str(value))
    if value_type == ValueType.ARRAY:
        items = list(value)
        if elem_type is None:
            elem_type = _infer_value_type(items[0]) if items else ValueType.UINT8
        body = b"".join(_pack_value(item, elem_type, None) for item in items)
        return struct.pack("<IQ", int(elem_type), len(items)) + body
    return struct.pack(_SCALAR_FORMATS[value_type], value)


@dataclass(frozen=True)
class MetadataValue:
    """A metadata value with an explicit GGUF type (plain Python values get an inferred type)."""

    value: Any  # the value (a list for arrays)
    value_type: ValueType  # its GGUF type
    elem_type: ValueType | None = None  # element type when value_type is ARRAY


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    tensors: Iterable[tuple[str, npt.NDArray[np.floating[Any]], int]],
    version: int = 3,
    alignment: int = DEFAULT_ALIGNMENT,
) -> None:
    """Write a GGUF file atomically. tensors: (name, numpy array, ggml type) in file order."""
    meta = dict(metadata)
    if alignment != DEFAULT_ALIGNMENT:
        meta["general.alignment"] = MetadataValue(alignment, ValueType.UINT32)
    header = bytearray(GGUF_MAGIC)
    tensor_list = list(tensors)
    header += struct.pack("<IQQ", version, len(tensor_list), len(meta))
    for key, raw_value in meta.items():
        if isinstance(raw_value, MetadataValue):
            value, value_type, elem_type = (
                raw_value.value,
                raw_value.value_type,
                raw_value.elem_type,
            )
        else:
            value, value_type, elem_type = raw_value, _infer_value_type(raw_value), None
        header += _pack_string(key) + struct.pack("<I", int(value_type))
        header += _pack_value(value, value_type, elem_type)
    blobs: list[bytes] = []
    offset = 0
    for name, array, ggml_type in tensor_list:
        data = quantize(np.asarray(array), ggml_type)
        dims = list(reversed(np.shape(array)))
        header += _pack_string(name) + struct.pack("<I", len(dims))
        header += struct.pack(f"<{len(dims)}Q", *dims)
        header += struct.pack("<IQ", int(ggml_type), offset)
        padded = data + b"\0" * (-len(data) % alignment)
        blobs.append(padded)
        offset += len(padded)
    header += b"\0" * (-len(header) % alignment)

    def write_file(temp_path: Path) -> None:
        with temp_path.open("wb") as handle:
            handle.write(header)
            for blob in blobs:
                handle.write(blob)

    atomic_write(path, write_file)


# ---------------------------------------------------------------------------------------------
# llama naming and the rotary permutation

# GGUF per-layer suffix -> Hugging Face Llama suffix (after "layers.N.")
_LAYER_NAMES: dict[str, str] = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
    """The HF Llama name (without "model.") of a GGUF llama tensor; None for tensors we skip
    (e.g. rope_freqs, which only matters for Llama-3 rope scaling)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        suffix = _LAYER_NAMES.get(parts[2])
        if suffix is not None:
            return f"layers.{int(parts[1])}.{suffix}"
    return None


def unpermute_rotary(weight: npt.NDArray[np.float32], num_heads: int) -> npt.NDArray[np.float32]:
    """Undo llama.cpp's q/k permutation: per head, rows were reordered from HF's two halves
    [x_0..x_{d/2-1}, y_0..y_{d/2-1}] to interleaved pairs [x_0, y_0, x_1, y_1, ...].

    The converter did reshape(heads, 2, d/2, in).swapaxes(1, 2); we do the inverse.
    """
    rows = weight.shape[0]
    head_dim = rows // num_heads
    return (
        weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])  # [H, d/2, 2, in]
        .swapaxes(1, 2)  # [H, 2, d/2, in]
        .reshape(weight.shape)
    )


def permute_rotary(weight: npt.NDArray[np.float32], num_heads: int) -> npt.NDArray[np.float32]:
    """llama.cpp's converter permutation (HF layout -> GGUF layout); the inverse of the above."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    return (
        weight.reshape(num_heads, 2, head_dim // 2, *weight.shape[1:])  # [H, 2, d/2, in]
        .swapaxes(1, 2)  # [H, d/2, 2, in]
        .reshape(weight.shape)
    )


@dataclass(frozen=True)
class LlamaHyperparams:
    """Llama hyperparameters read from GGUF `llama.*` metadata."""

    vocab_size: int  # rows of token_embd
    hidden_size: int  # llama.embedding_length
    intermediate_size: int  # llama.feed_forward_length
    num_layers: int  # llama.block_count
    num_heads: int  # llama.attention.head_count
    num_kv_heads: int  # llama.attention.head_count_kv (defaults to num_heads)
    rms_norm_eps: float  # llama.attention.layer_norm_rms_epsilon
    rope_theta: float  # llama.rope.freq_base (default 10000)
    max_position_embeddings: int  # llama.context_length
    tie_word_embeddings: bool  # True when the file has no output.weight


def _shortest_float(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-5, not
    9.99999974e-06), so configs read from GGUF compare equal to the published ones."""
    return float(str(np.float32(value)))


def llama_hyperparams(gguf: GGUFFile) -> LlamaHyperparams:
    """Read the llama hyperparameters; one-line InputError when a key is missing."""
    meta = gguf.metadata
    arch = meta.get("general.architecture", "llama")
    if arch != "llama":
        raise InputError(
            f"{gguf.path}: general.architecture is {arch!r}, only 'llama' is supported"
        )

    def need(key: str) -> Any:
        if key not in meta:
            raise InputError(f"{gguf.path}: metadata {key} missing")
        return meta[key]

    if "token_embd.weight" not in gguf.tensors:
        raise InputError(f"{gguf.path}: tensor token_embd.weight missing")
    num_heads = int(need("llama.attention.head_count"))
    return LlamaHyperparams(
        vocab_size=int(gguf.tensors["token_embd.weight"].shape[0]),
        hidden_size=int(need("llama.embedding_length")),
        intermediate_size=int(need("llama.feed_forward_length")),
        num_layers=int(need("llama.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", num_heads)),
        rms_norm_eps=_shortest_float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_shortest_float(meta.get("llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta.get("llama.context_length", 2048)),
        tie_word_embeddings="output.weight" not in gguf.tensors,
    )


def llama_state_dict(gguf: GGUFFile) -> dict[str, npt.NDArray[np.float32]]:
    """All llama tensors as float32 numpy arrays under HF names, q/k rows un-permuted."""
    params = llama_hyperparams(gguf)
    state: dict[str, npt.NDArray[np.float32]] = {}
    for name in gguf.tensors:
        target = hf_name(name)
        if target is None:
            continue
        array = gguf.tensor(name)
        if target.endswith("q_proj.weight"):
            array = unpermute_rotary(array, params.num_heads)
        elif target.endswith("k_proj.weight"):
            array = unpermute_rotary(array, params.num_kv_heads)
        state[target] = array
    return state
