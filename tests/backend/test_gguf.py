"""GGUF reader: hand-built blocks, round trips of every supported type, metadata, errors, rotary."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsd.backend.gguf import (
    GGMLType,
    MetadataValue,
    ValueType,
    dequantize,
    hf_name,
    llama_hyperparams,
    permute_rotary,
    quantize,
    read_gguf,
    unpermute_rotary,
    write_gguf,
)
from dsd.common.errors import InputError


def _f16_bytes(value: float) -> bytes:
    return np.array([value], dtype="<f2").tobytes()


def test_q4_1_block_layout_low_nibbles_first_then_high() -> None:
    # d = 0.5, m = -1; byte j holds element j (low nibble) and element 16 + j (high nibble)
    qs = bytes((j & 0xF) | ((15 - j) << 4) for j in range(16))
    block = np.frombuffer(_f16_bytes(0.5) + _f16_bytes(-1.0) + qs, dtype=np.uint8)
    values = dequantize(block, GGMLType.Q4_1, (32,))
    expected = [0.5 * j - 1 for j in range(16)] + [0.5 * (15 - j) - 1 for j in range(16)]
    np.testing.assert_array_equal(values, np.array(expected, dtype=np.float32))


def test_q4_0_block_layout_is_offset_by_eight() -> None:
    qs = bytes((j & 0xF) | ((15 - j) << 4) for j in range(16))
    block = np.frombuffer(_f16_bytes(2.0) + qs, dtype=np.uint8)
    values = dequantize(block, GGMLType.Q4_0, (32,))
    expected = [2.0 * (j - 8) for j in range(16)] + [2.0 * (15 - j - 8) for j in range(16)]
    np.testing.assert_array_equal(values, np.array(expected, dtype=np.float32))


def test_q8_0_block_layout_is_scale_times_signed_bytes() -> None:
    quants = np.arange(-16, 16, dtype=np.int8)
    block = np.frombuffer(_f16_bytes(0.25) + quants.tobytes(), dtype=np.uint8)
    values = dequantize(block, GGMLType.Q8_0, (32,))
    np.testing.assert_array_equal(values, 0.25 * quants.astype(np.float32))


def test_bf16_is_the_top_half_of_f32() -> None:
    raw = np.array([0x3F80, 0xC000, 0x0000], dtype="<u2").view(np.uint8)  # 1.0, -2.0, 0.0
    np.testing.assert_array_equal(dequantize(raw, GGMLType.BF16, (3,)), [1.0, -2.0, 0.0])


# (type, tolerance in units of the block's max |x|): exact types store the values unchanged
ROUND_TRIP_CASES = [
    (GGMLType.F32, 0.0),  # exact
    (GGMLType.F16, 1e-3),  # 11-bit mantissa
    (GGMLType.BF16, 8e-3),  # 8-bit mantissa
    (GGMLType.Q8_0, 1 / 254 + 1e-3),  # half a step of amax/127, plus f16 rounding of d
    (GGMLType.Q4_0, 1 / 16 + 1e-2),  # half a step of amax/8
    (GGMLType.Q4_1, 2 / 30 + 1e-2),  # half a step of (max-min)/15 <= 2 amax / 30
]


@pytest.mark.parametrize(("ggml_type", "tolerance"), ROUND_TRIP_CASES)
def test_write_then_read_round_trips_every_supported_type(
    tmp_path: Path, ggml_type: GGMLType, tolerance: float
) -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(6, 64)).astype(np.float32)  # [out, in]
    vector = rng.normal(size=(64,)).astype(np.float32)
    path = tmp_path / "t.gguf"
    write_gguf(
        path, {"general.architecture": "test"}, [("w", weight, ggml_type), ("v", vector, ggml_type)]
    )
    gguf = read_gguf(path)
    assert gguf.tensors["w"].shape == (6, 64)
    for name, original in (("w", weight), ("v", vector)):
        decoded = gguf.tensor(name)
        assert decoded.dtype == np.float32 and decoded.shape == original.shape
        blocks = original.reshape(-1, 32)
        error = np.abs(decoded.reshape(-1, 32) - blocks)
        bound = tolerance * np.abs(blocks).max(axis=1, keepdims=True)
        assert np.all(error <= bound + 1e-7), (name, float(error.max()))


def test_dequantize_of_quantize_is_idempotent_for_block_types() -> None:
    # a value already on the grid must come back unchanged (catches nibble order mix-ups)
    rng = np.random.default_rng(1)
    for ggml_type in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1):
        x = rng.normal(size=(4, 32)).astype(np.float32)
        once = dequantize(np.frombuffer(quantize(x, ggml_type), np.uint8), ggml_type, x.shape)
        twice = dequantize(np.frombuffer(quantize(once, ggml_type), np.uint8), ggml_type, x.shape)
        np.testing.assert_allclose(twice, once, rtol=0, atol=2e-3 * np.abs(x).max())


def test_metadata_of_every_value_type_round_trips(tmp_path: Path) -> None:
    metadata = {
        "u8": MetadataValue(250, ValueType.UINT8),
        "i8": MetadataValue(-5, ValueType.INT8),
        "u16": MetadataValue(65000, ValueType.UINT16),
        "i16": MetadataValue(-30000, ValueType.INT16),
        "u32": MetadataValue(4_000_000_000, ValueType.UINT32),
        "i32": MetadataValue(-2_000_000_000, ValueType.INT32),
        "f32": MetadataValue(1.5, ValueType.FLOAT32),
        "bool": MetadataValue(True, ValueType.BOOL),
        "str": "héllo",
        "u64": MetadataValue(2**63, ValueType.UINT64),
        "i64": MetadataValue(-(2**62), ValueType.INT64),
        "f64": MetadataValue(0.1, ValueType.FLOAT64),
        "arr_str": ["a", "bb", ""],
        "arr_i32": MetadataValue([1, -2, 3], ValueType.ARRAY, ValueType.INT32),
        "arr_arr": MetadataValue([[1, 2], [3]], ValueType.ARRAY, ValueType.ARRAY),
        "arr_empty": MetadataValue([], ValueType.ARRAY, ValueType.FLOAT32),
    }
    path = tmp_path / "m.gguf"
    write_gguf(path, metadata, [("x", np.ones((32,), np.float32), GGMLType.F32)], version=2)
    gguf = read_gguf(path)
    meta = gguf.metadata
    assert gguf.version == 2
    assert (meta["u8"], meta["i8"], meta["u16"], meta["i16"]) == (250, -5, 65000, -30000)
    assert (meta["u32"], meta["i32"], meta["u64"], meta["i64"]) == (
        4_000_000_000,
        -2_000_000_000,
        2**63,
        -(2**62),
    )
    assert meta["f32"] == 1.5 and meta["bool"] is True and meta["f64"] == 0.1
    assert meta["str"] == "héllo" and meta["arr_str"] == ["a", "bb", ""]
    assert list(meta["arr_i32"]) == [1, -2, 3]
    assert [list(inner) for inner in meta["arr_arr"]] == [[1, 2], [3]]
    assert len(meta["arr_empty"]) == 0


def test_custom_alignment_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "a.gguf"
    tensors = [
        ("a", np.arange(3, dtype=np.float32), GGMLType.F32),
        ("b", np.full(5, 7.0), GGMLType.F32),
    ]
    write_gguf(path, {}, tensors, alignment=64)
    gguf = read_gguf(path)
    assert gguf.metadata["general.alignment"] == 64
    assert gguf.data_start % 64 == 0 and gguf.tensors["b"].offset == 64
    np.testing.assert_array_equal(gguf.tensor("b"), np.full(5, 7.0))


def _small_file(tmp_path: Path) -> Path:
    path = tmp_path / "ok.gguf"
    write_gguf(path, {"k": "v"}, [("w", np.ones((2, 32), np.float32), GGMLType.Q8_0)])
    return path


def test_bad_magic_is_a_one_line_input_error(tmp_path: Path) -> None:
    path = _small_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[:4] = b"GGML"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="bad magic"):
        read_gguf(path)


# where the file is cut: inside the header counts, inside the metadata, inside the tensor data
@pytest.mark.parametrize("cut", ["counts", "metadata", "data"])
def test_truncated_file_is_an_input_error(tmp_path: Path, cut: str) -> None:
    path = _small_file(tmp_path)
    gguf = read_gguf(path)
    info = gguf.tensors["w"]
    keep = {
        "counts": 12,
        "metadata": 30,
        "data": gguf.data_start + info.offset + info.num_bytes - 1,
    }
    data = path.read_bytes()
    del gguf
    path.write_bytes(data[: keep[cut]])
    with pytest.raises(InputError, match="truncated"):
        read_gguf(path)


def test_unsupported_version_and_missing_file_are_input_errors(tmp_path: Path) -> None:
    path = _small_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 7)
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="version 7"):
        read_gguf(path)
    with pytest.raises(InputError, match="no such file"):
        read_gguf(tmp_path / "nope.gguf")
    with pytest.raises(InputError, match="directory"):
        read_gguf(tmp_path)


def test_undecodable_type_is_reported_by_name(tmp_path: Path) -> None:
    raw = np.zeros(210, dtype=np.uint8)
    with pytest.raises(InputError, match="Q6_K"):
        dequantize(raw, GGMLType.Q6_K, (256,))


# GGUF name -> HF name; None for tensors the llama loader skips
NAME_CASES = [
    ("token_embd.weight", "embed_tokens.weight"),  # embeddings
    ("output_norm.weight", "norm.weight"),  # final norm
    ("output.weight", "lm_head.weight"),  # untied head
    ("blk.0.attn_q.weight", "layers.0.self_attn.q_proj.weight"),
    ("blk.12.attn_k.weight", "layers.12.self_attn.k_proj.weight"),  # two-digit layer
    ("blk.3.attn_v.weight", "layers.3.self_attn.v_proj.weight"),
    ("blk.3.attn_output.weight", "layers.3.self_attn.o_proj.weight"),
    ("blk.3.ffn_gate.weight", "layers.3.mlp.gate_proj.weight"),
    ("blk.3.ffn_up.weight", "layers.3.mlp.up_proj.weight"),
    ("blk.3.ffn_down.weight", "layers.3.mlp.down_proj.weight"),
    ("blk.3.attn_norm.weight", "layers.3.input_layernorm.weight"),
    ("blk.3.ffn_norm.weight", "layers.3.post_attention_layernorm.weight"),
    ("rope_freqs.weight", None),  # Llama-3 rope scaling factors: not a parameter
    ("blk.x.attn_q.weight", None),  # malformed layer index
]


@pytest.mark.parametrize(("gguf_name", "expected"), NAME_CASES)
def test_llama_names_map_to_hf_names(gguf_name: str, expected: str | None) -> None:
    assert hf_name(gguf_name) == expected


@given(num_heads=st.integers(1, 4), half_dim=st.integers(1, 4), cols=st.integers(1, 3))
def test_unpermute_inverts_the_converter_permutation(
    num_heads: int, half_dim: int, cols: int
) -> None:
    weight = np.arange(num_heads * 2 * half_dim * cols, dtype=np.float32).reshape(-1, cols)
    np.testing.assert_array_equal(
        unpermute_rotary(permute_rotary(weight, num_heads), num_heads), weight
    )
    np.testing.assert_array_equal(
        permute_rotary(unpermute_rotary(weight, num_heads), num_heads), weight
    )


def _rope_rotate_half(q: np.ndarray, pos: int, theta: float) -> np.ndarray:
    # HF Llama: pairs (i, i + d/2)
    half = q.shape[-1] // 2
    freqs = theta ** (-np.arange(half) / half) * pos
    cos, sin = np.cos(freqs), np.sin(freqs)
    x, y = q[..., :half], q[..., half:]
    return np.concatenate([x * cos - y * sin, x * sin + y * cos], axis=-1)


def _rope_interleaved(q: np.ndarray, pos: int, theta: float) -> np.ndarray:
    # llama.cpp "normal" RoPE: pairs (2i, 2i + 1)
    half = q.shape[-1] // 2
    freqs = theta ** (-np.arange(half) / half) * pos
    cos, sin = np.cos(freqs), np.sin(freqs)
    x, y = q[..., 0::2], q[..., 1::2]
    out = np.empty_like(q)
    out[..., 0::2] = x * cos - y * sin
    out[..., 1::2] = x * sin + y * cos
    return out


def test_permutation_turns_rotate_half_rope_into_interleaved_rope() -> None:
    # the reason the permutation exists: llama.cpp's interleaved RoPE on permuted rows must give
    # the same attention scores as HF's rotate-half RoPE on the original rows
    rng = np.random.default_rng(3)
    num_heads, head_dim, hidden = 2, 8, 5
    w_hf = rng.normal(size=(num_heads * head_dim, hidden))  # [H*d, hidden]
    w_gguf = permute_rotary(w_hf, num_heads)
    x_a, x_b = rng.normal(size=hidden), rng.normal(size=hidden)
    for head in range(num_heads):
        rows = slice(head * head_dim, (head + 1) * head_dim)
        hf_score = _rope_rotate_half(w_hf[rows] @ x_a, 5, 1e4) @ _rope_rotate_half(
            w_hf[rows] @ x_b, 2, 1e4
        )
        gguf_score = _rope_interleaved(w_gguf[rows] @ x_a, 5, 1e4) @ _rope_interleaved(
            w_gguf[rows] @ x_b, 2, 1e4
        )
        assert np.isclose(hf_score, gguf_score)


def test_llama_hyperparams_read_from_metadata(tmp_path: Path) -> None:
    path = tmp_path / "llama.gguf"
    metadata = {
        "general.architecture": "llama",
        "llama.embedding_length": 64,
        "llama.feed_forward_length": 96,
        "llama.block_count": 1,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.freq_base": 500000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-6,
        "llama.context_length": 256,
    }
    write_gguf(
        path, metadata, [("token_embd.weight", np.zeros((40, 64), np.float32), GGMLType.F16)]
    )
    params = llama_hyperparams(read_gguf(path))
    assert (params.vocab_size, params.hidden_size, params.intermediate_size) == (40, 64, 96)
    assert (params.num_heads, params.num_kv_heads, params.num_layers) == (4, 2, 1)
    assert params.rope_theta == 500000.0 and params.tie_word_embeddings
    assert params.max_position_embeddings == 256


def test_missing_llama_metadata_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    write_gguf(
        path,
        {"general.architecture": "llama"},
        [("token_embd.weight", np.zeros((4, 32)), GGMLType.F32)],
    )
    with pytest.raises(InputError, match=r"llama\.attention\.head_count missing"):
        llama_hyperparams(read_gguf(path))
