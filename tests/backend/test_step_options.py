"""The engine-efficiency switches: fused projections (`Transformer.fuse_projections`), attention
reading the KV cache in place (`ForwardGroup.in_place_slots`, `StepOptions.in_place_attention`)
and the torch.compile'd fixed-shape step (`StepOptions.compile_backend`).

Each must leave greedy tokens exactly as they were: checked on CPU in float32 at tiny shapes
against the unswitched model and the reference engine. Compiling uses dynamo's "eager" and
"aot_eager" backends here (no C++ compiler); inductor on CPU is marked slow, on CUDA gpu.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mock_models import make_engine, perturbed_copy, random_prompt, tiny_target
from test_fast_path import fast_engine, run_pair

from dsd.backend.eagle import EagleDraft, EagleHead
from dsd.backend.engine import Draft, SpecDecodeConfig, SpecDecodeEngine, target_greedy_decode
from dsd.backend.fast_path import (
    FastSpecDecodeEngine,
    GraphKey,
    StepOptions,
    build_spec_decode_engine,
)
from dsd.backend.model import Transformer, fuse_rows, new_kv_cache


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def close_draft(target) -> Transformer:
    return perturbed_copy(target, noise_std=0.006, seed=1)


def plain_copy(model: Transformer, device: torch.device | None = None) -> Transformer:
    """A second model with `model`'s weights, on `device`."""
    copy = Transformer(model.config)
    copy.load_state_dict(model.state_dict())
    return copy.to(device).eval()


def fused_copy(model: Transformer, device: torch.device | None = None) -> Transformer:
    """`plain_copy` with its projections fused (after the move, as fusing asks)."""
    copy = plain_copy(model, device)
    copy.fuse_projections()
    return copy


def _ids(seed: int, batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (batch, tokens), generator=generator)  # [B, T]
    return ids, torch.arange(tokens).expand(batch, tokens)


# ------------------------------------------------------------------------ fused projections
def test_fused_weights_are_views_of_one_tensor_held_once(target) -> None:
    fused = fused_copy(target)
    attention = fused.layers[0].self_attn
    mlp = fused.layers[0].mlp
    parts = [attention.q_proj, attention.k_proj, attention.v_proj]
    assert attention.qkv_weight.shape[0] == sum(p.weight.shape[0] for p in parts)
    for part in [*parts, mlp.gate_proj, mlp.up_proj]:
        assert part.weight.is_contiguous()
    # the separate weights live inside the fused ones: no second copy
    assert attention.q_proj.weight.data_ptr() == attention.qkv_weight.data_ptr()
    assert (
        mlp.up_proj.weight.data_ptr()
        == mlp.gate_up_weight[mlp.gate_proj.weight.shape[0] :].data_ptr()
    )
    assert sum(p.numel() for p in fused.parameters()) == target.config.num_params
    assert list(fused.state_dict()) == list(target.state_dict())  # HF names, no extra entries
    assert fused.projections_fused and not target.projections_fused


def test_fused_logits_match_and_switching_back_runs_the_separate_products(target) -> None:
    fused = fused_copy(target)
    ids, positions = _ids(0, 3, 9)
    with torch.inference_mode():
        expected = target(ids, positions)
        on = fused(ids, positions)
        fused.fuse_projections(False)
        off = fused(ids, positions)
    torch.testing.assert_close(on, expected, rtol=0, atol=1e-5)
    assert torch.equal(off, expected)  # the views are the separate weights, bit for bit
    assert not fused.projections_fused


def test_in_place_weight_changes_reach_the_fused_product(target) -> None:
    fused = fused_copy(target)
    with torch.no_grad():
        fused.layers[1].self_attn.v_proj.weight.mul_(2.0)
        fused.layers[1].mlp.up_proj.weight.mul_(0.5)
    scaled = Transformer(target.config)
    scaled.load_state_dict(fused.state_dict())  # separate products of the changed weights
    ids, positions = _ids(1, 2, 6)
    with torch.inference_mode():
        torch.testing.assert_close(
            fused(ids, positions), scaled.eval()(ids, positions), atol=1e-5, rtol=0
        )


def test_fused_greedy_tokens_are_the_unfused_ones(target) -> None:
    fused = fused_copy(target)
    rng = np.random.default_rng(3)
    for length in (3, 11):
        prompt = random_prompt(rng, length)
        assert target_greedy_decode(fused, prompt, 16) == target_greedy_decode(target, prompt, 16)


def test_fusing_refuses_cpu_kernels_either_way_round(target) -> None:
    with_kernels = Transformer(target.config)
    with_kernels.load_state_dict(target.state_dict())
    if not with_kernels.eval().prepare_cpu_kernels():
        pytest.skip("no oneDNN linear ops in this torch")
    with pytest.raises(ValueError, match="CPU kernels"):
        with_kernels.fuse_projections()
    with pytest.raises(ValueError, match="fused"):
        fused_copy(target).prepare_cpu_kernels()


def test_a_move_after_fusing_is_noticed_and_fused_again(target) -> None:
    fused = fused_copy(target)
    fused.to(torch.float64)  # copies every tensor on its own: the views no longer alias
    attention = fused.layers[0].self_attn
    assert attention.q_proj.weight.data_ptr() != attention.qkv_weight.data_ptr()
    fused.fuse_projections()
    assert attention.q_proj.weight.data_ptr() == attention.qkv_weight.data_ptr()
    assert attention.qkv_weight.dtype == torch.float64


def test_fuse_rows_keeps_each_weight_and_its_grad_flag() -> None:
    from dsd.backend.model import Linear

    first, second = Linear(4, 3, None, None), Linear(4, 5, None, None)
    second.weight.requires_grad_(False)
    before = [first.weight.detach().clone(), second.weight.detach().clone()]
    fused = fuse_rows([first, second])
    assert torch.equal(fused, torch.cat(before))
    assert first.weight.requires_grad and not second.weight.requires_grad


def test_fused_target_and_draft_agree_with_unfused_through_reference_and_fast_path(
    target, close_draft
) -> None:
    fused_target, fused_draft = fused_copy(target), fused_copy(close_draft)
    rng = np.random.default_rng(7)
    prompts = [random_prompt(rng, n) for n in (2, 15, 9, 5)]
    k_rng = np.random.default_rng(8)
    engines = [
        make_engine(target, Draft(close_draft), k_max=4, num_slots=4),
        make_engine(fused_target, Draft(fused_draft), k_max=4, num_slots=4),
        fast_engine(fused_target, Draft(fused_draft), k_max=4, num_slots=4),
    ]
    runs = run_pair(
        engines, prompts, 16, lambda step, rows: k_rng.integers(0, 5, size=rows), [0, 0, 2, 9]
    )
    (ref_out, ref_acc), *others = runs
    for out, acc in others:
        assert out == ref_out and acc == ref_acc
    assert sum(map(sum, ref_acc)) > 0


# ------------------------------------------------------------------------ in-place attention
@settings(max_examples=25, deadline=None)
@given(
    window=st.integers(1, 6),
    data=st.data(),
    num_tokens=st.integers(1, 3),
    num_padded=st.integers(0, 2),
)
def test_in_place_attention_equals_the_gather(window, data, num_tokens, num_padded) -> None:
    model = _in_place_model()
    num_real = data.draw(st.integers(1, window))
    real_slots = data.draw(st.permutations(range(window)))[:num_real]
    # padded rows come after the real ones, on slot 0, at the trash position (as the fast path)
    slots = torch.tensor([*real_slots, *[0] * num_padded])
    lengths = data.draw(st.lists(st.integers(0, 10), min_size=num_real, max_size=num_real))
    max_len = 16
    positions = torch.tensor(
        [[n + t for t in range(num_tokens)] for n in lengths]
        + [[max_len - 1] * num_tokens] * num_padded
    )  # [B, T]
    ids = torch.randint(0, 256, positions.shape, generator=torch.Generator().manual_seed(window))
    gathered = new_kv_cache(model.config, window, max_len)
    in_place = new_kv_cache(model.config, window, max_len)
    history = torch.Generator().manual_seed(num_tokens)
    for cache in (gathered, in_place):  # the same earlier K/V in both
        for layer in range(model.config.num_layers):
            for tensors in (cache.k, cache.v):
                tensors[layer].copy_(torch.randn(tensors[layer].shape, generator=history))
        history.manual_seed(num_tokens)
    kv_len = data.draw(st.sampled_from([max(lengths) + num_tokens, max_len]))
    with torch.inference_mode():
        expected = model(ids, positions, gathered, slots, kv_len=kv_len)[:num_real]
        actual = model(ids, positions, in_place, slots, kv_len=kv_len, in_place_slots=window)
    torch.testing.assert_close(actual[:num_real], expected, rtol=0, atol=1e-5)
    for layer in range(model.config.num_layers):  # the same K/V written (but the trash)
        for ours, theirs in (
            (in_place.k[layer], gathered.k[layer]),
            (in_place.v[layer], gathered.v[layer]),
        ):
            torch.testing.assert_close(ours[:, :-1], theirs[:, :-1], rtol=0, atol=1e-5)


_MODEL: list[Transformer] = []


def _in_place_model() -> Transformer:
    if not _MODEL:
        _MODEL.append(tiny_target(seed=4))
    return _MODEL[0]


def test_fast_path_in_place_agrees_with_reference_and_falls_back_to_the_gather(
    target, close_draft
) -> None:
    rng = np.random.default_rng(11)
    prompts = [random_prompt(rng, n) for n in (2, 15, 9, 21, 5)]
    k_rng = np.random.default_rng(12)
    options = StepOptions(in_place_attention=True)
    reference = make_engine(target, Draft(close_draft), k_max=4, num_slots=4)
    config = SpecDecodeConfig(num_slots=4, max_model_len=96, k_max=4)
    fast = FastSpecDecodeEngine(target, Draft(close_draft), config, min_kv_len=16, options=options)
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [reference, fast],
        prompts,
        20,
        lambda step, rows: k_rng.integers(0, 5, size=rows),
        arrival_steps=[0, 0, 2, 12, 40],  # slots 0..3 reused: some steps' slots exceed the bucket
    )
    assert fast_out == ref_out and fast_acc == ref_acc
    assert {key.in_place for key in fast.runner.keys_seen} == {False, True}


@pytest.mark.parametrize("compile_backend", [None, "aot_eager"])
def test_in_place_and_compiled_with_an_eagle_head_give_the_reference_tokens(
    target, compile_backend
) -> None:
    draft = EagleDraft(EagleHead.random(target, seed=3), target)
    rng = np.random.default_rng(13)
    prompts = [random_prompt(rng, n) for n in (3, 12, 6)]
    k_rng = np.random.default_rng(14)
    config = SpecDecodeConfig(num_slots=4, max_model_len=96, k_max=3)
    options = StepOptions(in_place_attention=True, compile_backend=compile_backend)
    fast = FastSpecDecodeEngine(target, draft, config, min_kv_len=16, options=options)
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [SpecDecodeEngine(target, draft, config), fast],
        prompts,
        12,
        lambda step, rows: k_rng.integers(0, 4, size=rows),
        arrival_steps=[0, 0, 5],
    )
    assert fast_out == ref_out and fast_acc == ref_acc
    assert any(key.in_place for key in fast.runner.keys_seen)


def test_in_place_doubles_the_shapes_and_every_shape_runs(target, close_draft) -> None:
    config = SpecDecodeConfig(num_slots=2, max_model_len=40, k_max=1)
    draft = Draft(close_draft)
    plain = FastSpecDecodeEngine(target, draft, config, min_kv_len=16)
    options = StepOptions(in_place_attention=True)
    in_place = FastSpecDecodeEngine(target, draft, config, min_kv_len=16, options=options)
    keys = in_place.all_graph_keys()
    assert len(keys) == 2 * len(plain.all_graph_keys())
    assert GraphKey(2, 1, 16, True) in keys
    assert in_place.run_every_shape() == len(keys)


# ------------------------------------------------------------------------ compiled step
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_step_gives_the_reference_tokens(backend, target, close_draft) -> None:
    options = StepOptions(in_place_attention=True, compile_backend=backend)
    _check_all_switches_agree(target, close_draft, options)


@pytest.mark.slow
def test_inductor_compiled_step_gives_the_reference_tokens_on_cpu(target, close_draft) -> None:
    options = StepOptions(compile_backend="inductor")
    _check_all_switches_agree(target, close_draft, options, ks=(0, 2))


def _check_all_switches_agree(
    target, close_draft, options: StepOptions, device=None, ks: tuple[int, ...] = (0, 1, 2, 3)
) -> None:
    """A fast engine with `options` over fused copies gives the reference's tokens (each row's
    K drawn from `ks`: fewer K, fewer shapes to compile)."""
    fused_target, fused_draft = fused_copy(target, device), fused_copy(close_draft, device)
    if device is not None:
        target, close_draft = plain_copy(target, device), plain_copy(close_draft, device)
    rng = np.random.default_rng(5)
    prompts = [random_prompt(rng, n) for n in (4, 13, 7)]
    k_rng = np.random.default_rng(6)
    reference = make_engine(target, Draft(close_draft), k_max=3, num_slots=2)
    config = SpecDecodeConfig(num_slots=2, max_model_len=64, k_max=3)
    runner = "eager" if device is None else "cuda-graphs"
    fast = FastSpecDecodeEngine(
        fused_target,
        Draft(fused_draft),
        config,
        runner=runner,  # type: ignore[arg-type]
        min_kv_len=64,
        options=options,
    )
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [reference, fast],
        prompts,
        10,
        lambda step, rows: k_rng.choice(ks, size=rows),
        [0, 0, 6],
    )
    assert fast_out == ref_out and fast_acc == ref_acc


def test_step_options_are_checked() -> None:
    with pytest.raises(ValueError, match="captures CUDA graphs itself"):
        StepOptions(compile_backend="inductor", compile_mode="reduce-overhead")
    with pytest.raises(ValueError, match="needs compile_backend 'inductor'"):
        StepOptions(compile_backend="eager", compile_mode="max-autotune-no-cudagraphs")
    config = SpecDecodeConfig(num_slots=1, max_model_len=16, k_max=0)
    with pytest.raises(ValueError, match="need a fast path"):
        build_spec_decode_engine(
            tiny_target(0), None, config, "off", StepOptions(in_place_attention=True)
        )


@pytest.mark.gpu
def test_every_switch_on_cuda_graphs_gives_the_reference_tokens(target, close_draft) -> None:
    options = StepOptions(in_place_attention=True, compile_backend="inductor")
    _check_all_switches_agree(target, close_draft, options, torch.device("cuda"), ks=(0, 2))
