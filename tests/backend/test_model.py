"""The Llama-family decoder: config validation, HF naming, agreement with a plain reference.

Without `transformers` the reference is the straightforward implementation below (full-sequence
attention, no cache, per-head loops, written from the Llama equations). With `transformers`
installed, a slow test also compares with `LlamaForCausalLM` on the same random weights.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch

from dsd.backend.model import (
    MODEL_CONFIGS,
    CpuKernels,
    ForwardGroup,
    ModelConfig,
    RopeScaling,
    Transformer,
    init_random_,
    new_kv_cache,
    rope_inv_freq,
)
from dsd.common.errors import InputError

# float32 on CPU: the cached path and the reference differ only by summation order.
ATOL = 1e-4


def small_config(**overrides: object) -> ModelConfig:
    base: dict[str, object] = {
        "vocab_size": 97,
        "hidden_size": 48,
        "num_layers": 3,
        "num_heads": 6,
        "num_kv_heads": 2,
        "intermediate_size": 80,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
    }
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def reference_logits(model: Transformer, input_ids: torch.Tensor, num_layers: int | None = None):
    """Independent reference: one sequence at a time, explicit softmax(QK^T/sqrt(d)) per head."""
    cfg = model.config
    params = dict(model.named_parameters())
    depth = cfg.num_layers if num_layers is None else num_layers
    inv_freq = rope_inv_freq(cfg).double()
    outs = []
    for row in input_ids:
        seq_len = row.shape[0]
        pos = torch.arange(seq_len, dtype=torch.float64)
        ang = pos[:, None] * inv_freq[None, :]  # [T, D/2]
        cos, sin = ang.cos(), ang.sin()

        def rope(x: torch.Tensor, cos: torch.Tensor = cos, sin: torch.Tensor = sin) -> torch.Tensor:
            half = x.shape[-1] // 2  # [T, D]: pair i with i + D/2
            x1, x2 = x[:, :half], x[:, half:]
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

        def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

        h = params["embed_tokens.weight"].double()[row]  # [T, hidden]
        for i in range(depth):
            p = {
                k.split(f"layers.{i}.", 1)[1]: v.double()
                for k, v in params.items()
                if k.startswith(f"layers.{i}.")
            }
            x = rms(h, p["input_layernorm.weight"])
            q = x @ p["self_attn.q_proj.weight"].T
            k = x @ p["self_attn.k_proj.weight"].T
            v = x @ p["self_attn.v_proj.weight"].T
            heads = []
            group = cfg.num_heads // cfg.num_kv_heads
            for head in range(cfg.num_heads):
                kv = head // group
                qh = q[:, head * cfg.head_dim : (head + 1) * cfg.head_dim]
                kh = k[:, kv * cfg.head_dim : (kv + 1) * cfg.head_dim]
                vh = v[:, kv * cfg.head_dim : (kv + 1) * cfg.head_dim]
                if cfg.qk_norm:
                    qh = rms(qh, p["self_attn.q_norm.weight"])
                    kh = rms(kh, p["self_attn.k_norm.weight"])
                scores = rope(qh) @ rope(kh).T / math.sqrt(cfg.head_dim)
                scores = scores.masked_fill(
                    torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1), -math.inf
                )
                heads.append(torch.softmax(scores, -1) @ vh)
            h = h + torch.cat(heads, -1) @ p["self_attn.o_proj.weight"].T
            x = rms(h, p["post_attention_layernorm.weight"])
            gate = x @ p["mlp.gate_proj.weight"].T
            h = (
                h
                + (gate * torch.sigmoid(gate) * (x @ p["mlp.up_proj.weight"].T))
                @ p["mlp.down_proj.weight"].T
            )
        h = rms(h, params["norm.weight"].double())
        head_w = params.get("lm_head.weight", params["embed_tokens.weight"]).double()
        outs.append(h @ head_w.T)
    return torch.stack(outs).float()


def build(cfg: ModelConfig, seed: int = 0, prepared: bool = False) -> Transformer:
    """Random weights; `prepared`: with the CPU inference layouts (`prepare_cpu_kernels`)."""
    model = init_random_(Transformer(cfg), seed, std=0.1)
    # Non-trivial norm weights so a mix-up of norms would show.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    if prepared:
        assert model.prepare_cpu_kernels()
    return model.eval()


CONFIG_CASES = [
    small_config(),  # GQA 6 heads / 2 kv heads, untied
    small_config(num_kv_heads=6, tie_word_embeddings=True),  # MHA, tied head
    small_config(
        num_kv_heads=1, qk_norm=True, head_dim=16
    ),  # MQA, Qwen3 q/k norm, explicit head_dim
    small_config(  # Llama-3 rope scaling with a short original context so every band is hit
        rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, original_max_position_embeddings=64),
    ),
]


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "cpu-kernels"])
@pytest.mark.parametrize("cfg", CONFIG_CASES)
def test_full_forward_matches_reference(cfg: ModelConfig, prepared: bool) -> None:
    model = build(cfg, prepared=prepared)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(11).expand(2, 11)
    with torch.no_grad():
        got = model(ids, positions)
    torch.testing.assert_close(got, reference_logits(model, ids), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "cpu-kernels"])
@pytest.mark.parametrize("cfg", CONFIG_CASES)
def test_cached_incremental_decoding_equals_full_forward(cfg: ModelConfig, prepared: bool) -> None:
    model = build(cfg, seed=3, prepared=prepared)
    seq_len = 13
    ids = torch.randint(0, cfg.vocab_size, (3, seq_len), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids, torch.arange(seq_len).expand(3, seq_len))
        cache = new_kv_cache(cfg, num_slots=5, max_len=32)
        slots = torch.tensor([4, 0, 2])  # rows live in arbitrary slots
        pieces = []
        # Chunks of uneven size: a prefill of 5, then 1, 3, 1, 3 tokens.
        bounds = [0, 5, 6, 9, 10, seq_len]
        for start, end in itertools.pairwise(bounds):
            pos = torch.arange(start, end).expand(3, end - start)
            pieces.append(model(ids[:, start:end], pos, cache, slots, kv_len=end))
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=ATOL, rtol=1e-4)


def test_early_exit_equals_truncated_reference() -> None:
    cfg = small_config()
    model = build(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = new_kv_cache(cfg, num_slots=1, max_len=8, num_layers=1)
        got = model(ids, torch.arange(7)[None], cache, torch.tensor([0]), num_layers=1)
    torch.testing.assert_close(
        got, reference_logits(model, ids, num_layers=1), atol=ATOL, rtol=1e-4
    )


def test_padding_past_real_tokens_does_not_change_real_logits() -> None:
    cfg = small_config()
    model = build(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        cache = new_kv_cache(cfg, num_slots=2, max_len=16)
        slots = torch.tensor([0, 1])
        model(ids[:, :4], torch.arange(4).expand(2, 4), cache, slots)
        # Row 1 has 2 real tokens, row 0 one real token plus one pad at the next position.
        padded = torch.tensor([[ids[0, 4], 0], [ids[1, 4], ids[1, 5]]])
        got = model(padded, torch.tensor([[4, 5], [4, 5]]), cache, slots)
        full = model(ids, torch.arange(6).expand(2, 6))
    torch.testing.assert_close(got[0, 0], full[0, 4], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(got[1], full[1, 4:6], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("prepared", [False, True], ids=["plain", "cpu-kernels"])
@pytest.mark.parametrize("cfg", CONFIG_CASES[:3])
def test_forward_groups_equal_each_group_run_alone(cfg: ModelConfig, prepared: bool) -> None:
    """A verify block [3, 2] and a prefill block [2, 6] (logits at one token per row) in one
    pass give each block's own forward's logits and cache writes."""
    model = build(cfg, seed=6, prepared=prepared)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, cfg.vocab_size, (3, 5), generator=gen)  # decode rows' context
    verify = ForwardGroup(
        torch.randint(0, cfg.vocab_size, (3, 2), generator=gen),
        torch.tensor([[5, 6], [5, 6], [5, 99]]),  # row 2 verifies one token, pads the trash
        torch.tensor([0, 2, 4]),
        kv_len=7,
    )
    chunk = ForwardGroup(
        torch.randint(0, cfg.vocab_size, (2, 6), generator=gen),
        torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 99, 99]]),  # a chunk of 4, padded
        torch.tensor([1, 3]),
        kv_len=6,
        logit_indices=torch.tensor([[5], [3]]),
    )
    caches = [new_kv_cache(cfg, num_slots=5, max_len=100) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            model(prompt, torch.arange(5).expand(3, 5), cache, torch.tensor([0, 2, 4]))
        alone = [model.forward_groups([group], caches[0])[0] for group in (verify, chunk)]
        together = model.forward_groups([verify, chunk], caches[1])
    assert [t.shape for t in together] == [(3, 2, cfg.vocab_size), (2, 1, cfg.vocab_size)]
    for got, want in zip(together, alone, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
    real = slice(0, 7)  # positions real tokens were written at (the trash, 99, is not compared)
    torch.testing.assert_close(
        caches[1].k[:, :, real], caches[0].k[:, :, real], atol=ATOL, rtol=1e-4
    )
    with pytest.raises(ValueError, match="at least one group"):
        model.forward_groups([])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_cpu_kernels_agree_with_plain_linear_for_any_row_count(
    tied: bool, threads: int, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(threads)
    cfg = small_config(tie_word_embeddings=tied)
    plain, prepared = build(cfg, seed=4), build(cfg, seed=4, prepared=True)
    for name, tensor in prepared.state_dict().items():  # values kept; storage may be transposed
        assert torch.equal(tensor, plain.state_dict()[name]), name
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        for batch, tokens in [(1, 1), (1, 2), (1, 7), (3, 1), (4, 5)]:
            ids = torch.randint(0, cfg.vocab_size, (batch, tokens), generator=gen)
            positions = torch.arange(tokens).expand(batch, tokens)
            torch.testing.assert_close(
                prepared(ids, positions), plain(ids, positions), atol=1e-5, rtol=1e-5
            )


@pytest.mark.parametrize(("threads", "matrix_vector"), [(1, True), (2, False)])
def test_one_row_is_a_matrix_vector_product_only_on_one_thread(
    threads: int, matrix_vector: bool, torch_threads: Callable[[int], None]
) -> None:
    """torch runs a 1-row product on one thread whatever its thread count, so with more
    threads one row takes oneDNN's multi-row kernel instead (docs/backend.md)."""
    torch_threads(threads)
    kernels = CpuKernels(torch.randn(96, 64, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    calls: list[int] = []
    real_linear = torch.nn.functional.linear

    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        return real_linear(*args)

    with mock.patch.object(torch.nn.functional, "linear", counted), torch.inference_mode():
        out = kernels(x)
    assert bool(calls) is matrix_vector
    torch.testing.assert_close(out, x @ kernels.weight.T, atol=1e-5, rtol=1e-5)


def test_cpu_kernels_follow_in_place_weight_changes() -> None:
    cfg = small_config()
    model = build(cfg, prepared=True)
    ids = torch.tensor([[1, 2, 3]])
    positions = torch.arange(3)[None]
    with torch.no_grad():
        before = model(ids, positions)
        model.layers[1].mlp.down_proj.weight.mul_(2.0)
        model.lm_head.weight.add_(0.5)  # type: ignore[union-attr]
        after = model(ids, positions)
        plain = Transformer(cfg)
        plain.load_state_dict(model.state_dict())
        expected = plain.eval()(ids, positions)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)


def test_prepared_model_still_trains() -> None:
    """With autograd recording, projections are plain F.linear: gradients reach every weight."""
    model = build(small_config(tie_word_embeddings=True), prepared=True).train()
    logits = model(torch.tensor([[3, 1, 4, 1]]), torch.arange(4)[None])
    logits.logsumexp(-1).sum().backward()
    assert all(param.grad is not None for param in model.parameters())


def test_cpu_kernels_only_for_float32() -> None:
    model = Transformer(small_config(), dtype=torch.bfloat16)
    assert model.prepare_cpu_kernels() is False
    assert all(param.is_contiguous() for param in model.parameters())


def test_parameter_names_are_hf_llama_names() -> None:
    untied = Transformer(small_config(num_layers=1))
    tied = Transformer(small_config(num_layers=1, tie_word_embeddings=True, qk_norm=True))
    layer = [
        "input_layernorm.weight",
        "mlp.down_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "post_attention_layernorm.weight",
        "self_attn.k_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_proj.weight",
        "self_attn.v_proj.weight",
    ]
    expected = {"embed_tokens.weight", "norm.weight", "lm_head.weight"} | {
        f"layers.0.{n}" for n in layer
    }
    assert set(untied.state_dict()) == expected
    qk = {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"}
    assert set(tied.state_dict()) == (expected - {"lm_head.weight"}) | qk


def test_named_configs_have_published_shapes() -> None:
    smol = MODEL_CONFIGS["smollm2-135m"]
    assert (smol.vocab_size, smol.hidden_size, smol.num_layers, smol.num_heads) == (
        49152,
        576,
        30,
        9,
    )
    assert (smol.num_kv_heads, smol.intermediate_size, smol.head_dim, smol.tie_word_embeddings) == (
        3,
        1536,
        64,
        True,
    )
    # SmolLM2-135M has ~134.5M parameters.
    assert 134e6 < smol.num_params < 135e6
    # Llama-3.1-8B: 8.03B parameters.
    assert 8.0e9 < MODEL_CONFIGS["llama-3.1-8b"].num_params < 8.1e9
    assert MODEL_CONFIGS["tiny"].vocab_size == MODEL_CONFIGS["tiny-draft"].vocab_size


def test_llama3_scaling_keeps_high_and_slows_low_frequencies() -> None:
    plain = rope_inv_freq(
        small_config(
            head_dim=128, hidden_size=128, num_heads=1, num_kv_heads=1, rope_theta=500000.0
        )
    )
    scaled = rope_inv_freq(MODEL_CONFIGS["llama-3.1-8b"])
    wavelen = 2 * math.pi / plain
    assert torch.equal(scaled[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])  # short: unchanged
    torch.testing.assert_close(scaled[wavelen > 8192], plain[wavelen > 8192] / 8)  # long: / factor
    band = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert band.any() and bool(
        ((scaled[band] < plain[band]) & (scaled[band] > plain[band] / 8)).all()
    )


def test_from_hf_config_reads_llama3_and_qwen3() -> None:
    hf = {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    }
    assert ModelConfig.from_hf_config(hf) == MODEL_CONFIGS["llama-3.1-8b"]
    qwen = dict(
        hf,
        model_type="qwen3",
        head_dim=128,
        rope_scaling=None,
        eos_token_id=151645,
        vocab_size=151936,
    )
    cfg = ModelConfig.from_hf_config(qwen)
    assert cfg.qk_norm and cfg.head_dim == 128 and cfg.eos_token_ids == (151645,)


BAD_CONFIGS = [
    ({"num_kv_heads": 4}, "multiple of num_kv_heads"),  # 6 heads not divisible by 4 kv heads
    ({"vocab_size": 0}, "vocab_size"),  # empty vocabulary
    ({"hidden_size": 50}, "not divisible"),  # 50 / 6 heads without explicit head_dim
    ({"head_dim": 7}, "head_dim"),  # odd head_dim cannot be rotated
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),  # non-positive epsilon
    ({"eos_token_ids": (97,)}, "outside vocab"),  # special id past the vocabulary
]


@pytest.mark.parametrize(("overrides", "fragment"), BAD_CONFIGS)
def test_bad_config_raises_input_error_naming_field(
    overrides: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment):
        small_config(**overrides)


def test_from_hf_config_missing_field_is_input_error() -> None:
    with pytest.raises(InputError, match=r"x/config.json: missing field 'num_attention_heads'"):
        ModelConfig.from_hf_config({"vocab_size": 10, "hidden_size": 8}, name="x/config.json")


def test_init_random_is_deterministic() -> None:
    a = init_random_(Transformer(small_config()), seed=11)
    b = init_random_(Transformer(small_config()), seed=11)
    c = init_random_(Transformer(small_config()), seed=12)
    for (name, pa), pb, pc in zip(
        a.state_dict().items(), b.state_dict().values(), c.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


@pytest.mark.slow
def test_logits_match_transformers_llama() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = small_config(rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64), rope_theta=500000.0)
    model = build(cfg)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        rope_theta=cfg.rope_theta,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=False,
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    state = {
        ("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v
        for k, v in model.state_dict().items()
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ours = model(ids, torch.arange(40).expand(2, 40))
        theirs = hf(ids).logits.float()
    # Same float32 math in a different order: agreement to 1e-4 absolute.
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=1e-4)


def test_cuda_attention_runs_without_cudnn_plans_and_restores_the_flags() -> None:
    """On CUDA the forwards' attention excludes cuDNN attention (a plan built per new key
    length); the flags come back after, and other devices change nothing (flags only: no GPU)."""
    from dsd.backend.model import attention_backends

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


@pytest.mark.gpu
def test_cuda_decode_steps_do_not_call_cudnn_attention() -> None:
    """bf16 cached decoding on CUDA with growing key lengths: SDPA picks a backend without
    per-shape plans, never `_scaled_dot_product_cudnn_attention` (torch's first choice on sm90
    and sm100 otherwise)."""
    cfg = small_config(hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=256)
    model = init_random_(Transformer(cfg, device="cuda", dtype=torch.bfloat16), seed=0)
    cache = new_kv_cache(cfg, num_slots=2, max_len=64, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([0, 1], device="cuda")
    ids = torch.randint(0, cfg.vocab_size, (2, 12), device="cuda")
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        model(ids[:, :8], torch.arange(8, device="cuda").expand(2, 8), cache, slots, kv_len=8)
        for step in range(8, 12):
            pos = torch.full((2, 1), step, device="cuda")
            model(ids[:, step : step + 1], pos, cache, slots, kv_len=step + 1)
    names = {event.name for event in prof.events()}
    assert "aten::scaled_dot_product_attention" in names
    assert not any("cudnn_attention" in name for name in names), sorted(names)
