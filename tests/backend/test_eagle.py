"""The EAGLE head (`backend.eagle`): lossless greedy SD at any K sequence, its catch-up and
rollback, the fast path, its file, the pair spec, and its trainer (`backend.eagle_train`)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mock_models import tiny_target
from safetensors.torch import save_file

from dsd.backend import engine as engine_module
from dsd.backend.eagle import (
    EagleDraft,
    EagleHead,
    EagleOrLookup,
    draft_passes,
    load_head,
    save_head,
)
from dsd.backend.eagle_train import (
    CHAT_PROMPT_SETS,
    HELD_OUT_SETS,
    EagleTrainConfig,
    chat_prompt_texts,
    document_windows,
    greedy_continuations,
    target_features,
    train_head_on,
)
from dsd.backend.engine import SpecDecodeConfig, SpecDecodeEngine, target_greedy_decode
from dsd.backend.fast_path import FastSpecDecodeEngine
from dsd.backend.ngram import NgramConfig
from dsd.backend.pair import load_pair
from dsd.backend.replay import replay_recording
from dsd.backend.tokenizer import load_tokenizer
from dsd.common.errors import InputError
from dsd.traces.datasets import PROMPT_SET_READERS

NUM_NEW = 24


def _prompts(seed: int, count: int, length: int = 8) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 256, length).tolist() for _ in range(count)]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


def _trained(target, draft_vocab: int) -> EagleHead:  # type: ignore[no-untyped-def]
    """A head trained on the target's continuations of `_prompts(0, 32)`: on those prompts it
    agrees with the target often but not always (tests reach accept and reject paths)."""
    sequences = greedy_continuations(target, _prompts(0, 32), 40, 16)
    data = target_features(target, sequences, 48)
    config = EagleTrainConfig(
        out="unused", steps=150, batch_size=16, seq_len=48, draft_vocab=draft_vocab, noise=0.05
    )
    return train_head_on(target, data, config).head


@pytest.fixture(scope="module")
def head(target) -> EagleHead:  # type: ignore[no-untyped-def]
    return _trained(target, draft_vocab=0)


@pytest.fixture(scope="module")
def reduced_head(target) -> EagleHead:  # type: ignore[no-untyped-def]
    return _trained(target, draft_vocab=96)


def _run(engine: SpecDecodeEngine, prompts, k_of, fused: bool = False):  # type: ignore[no-untyped-def]
    """Decode every prompt NUM_NEW tokens with K per step and row from `k_of(step, rows)`;
    prompts arrive one per step (later ones prefill beside decoding rows when `fused`)."""
    outputs: dict[int, list[int]] = {}
    slot_of: dict[int, int] = {}
    accepted: list[int] = []
    step = 0
    while len(outputs) < len(prompts):
        waiting = [i for i in range(min(step + 1, len(prompts))) if i not in slot_of | outputs]
        new = waiting[: engine.num_free_slots]
        for index in new:
            slot_of[index] = engine.alloc_slot(prompts[index])
        new_slots = np.array([slot_of[i] for i in new], dtype=np.int64)
        chunks = np.array([len(prompts[i]) for i in new], dtype=np.int64)
        decoding = [i for i in slot_of if i not in new]
        if decoding:
            slots = np.array([slot_of[i] for i in decoding], dtype=np.int64)
            ks = np.asarray(k_of(step, len(decoding)), dtype=np.int64)
            if fused and new:
                result, _ = engine.step_with_prefill(slots, ks, new_slots, chunks)
                new = []
            else:
                result = engine.step(slots, ks)
            accepted.extend(result.num_accepted.tolist())
        if new:
            engine.prefill(new_slots, chunks)
        for index in list(slot_of):
            generated = engine.sequence(slot_of[index])[len(prompts[index]) :]
            if generated.size >= NUM_NEW:
                outputs[index] = generated[:NUM_NEW].tolist()
                engine.free_slot(slot_of.pop(index))
        step += 1
    return [outputs[i] for i in range(len(prompts))], accepted


def _engine(target, head, fast: bool, k_max: int = 4, slots: int = 3, lookup: bool = False):  # type: ignore[no-untyped-def]
    config = SpecDecodeConfig(num_slots=slots, max_model_len=64, k_max=k_max)
    kind = FastSpecDecodeEngine if fast else SpecDecodeEngine
    draft = EagleDraft(head, target)
    return kind(target, EagleOrLookup(draft, NgramConfig(1, 2)) if lookup else draft, config)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ks=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    fast=st.booleans(),
    reduced=st.booleans(),
    lookup=st.booleans(),
    num_prompts=st.integers(1, 4),
)
def test_greedy_tokens_equal_target_greedy_for_any_k_sequence(  # type: ignore[no-untyped-def]
    target, head, reduced_head, ks, fast, reduced, lookup, num_prompts
) -> None:
    """Per-row K drawn from the sequence (rows offset), K = 0 steps included: the emitted
    tokens are the target's own greedy ones, on the reference and the fast (eager) path, with
    the head alone or beside prompt lookup."""
    prompts = _prompts(0, num_prompts)  # the head's training prompts: it often agrees
    engine = _engine(target, reduced_head if reduced else head, fast, lookup=lookup)
    outputs, _ = _run(
        engine, prompts, lambda step, rows: [ks[(step + r) % len(ks)] for r in range(rows)]
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, NUM_NEW)


@pytest.mark.parametrize("fast", [False, True])
def test_trained_head_accepts_and_rejects_and_fast_path_matches_reference(  # type: ignore[no-untyped-def]
    target, head, fast
) -> None:
    prompts = _prompts(0, 3)
    reference, accepted_ref = _run(_engine(target, head, False), prompts, lambda s, r: [3] * r)
    outputs, accepted = _run(_engine(target, head, fast), prompts, lambda s, r: [3] * r)
    assert outputs == reference and accepted == accepted_ref
    assert 0 < sum(accepted) < 3 * len(accepted)  # both paths exercised
    assert np.mean(accepted) > 0.5  # a trained head drafts what the target says


def test_fused_prefill_steps_with_eagle_equal_target_greedy(target, head) -> None:  # type: ignore[no-untyped-def]
    prompts = _prompts(0, 4)
    k_rng = np.random.default_rng(3)
    outputs, accepted = _run(
        _engine(target, head, False, slots=4),
        prompts,
        lambda step, rows: k_rng.integers(0, 5, rows),
        fused=True,
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, NUM_NEW)
    assert sum(accepted) > 0


def test_head_does_no_work_at_k0_and_catches_up_with_real_features(target, head) -> None:  # type: ignore[no-untyped-def]
    engine = _engine(target, head, False)
    prompt = _prompts(0, 1)[0]
    slot = engine.alloc_slot(prompt)
    engine.prefill(np.array([slot]), np.array([len(prompt)]))
    assert engine.draft_cache is not None and engine.draft_cache.lengths[slot] == 0  # lazy
    for _ in range(3):
        engine.step(np.array([slot]), np.array([0]))
    assert engine.draft_cache.lengths[slot] == 0  # K = 0 steps leave the head alone
    length = int(engine.target_cache.lengths[slot])
    result = engine.step(np.array([slot]), np.array([3]))
    # caught up to L - 1, one pass at L - 1 from a real feature: the head keeps [0, L)
    assert engine.draft_cache.lengths[slot] == length
    assert int(result.num_drafted[0]) == 3


def test_reduced_vocabulary_drafts_only_its_tokens(monkeypatch, target, reduced_head) -> None:  # type: ignore[no-untyped-def]
    vocab_map = reduced_head.vocab_map
    assert vocab_map is not None and vocab_map.numel() <= 97
    drafted: list[int] = []

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        ids, probs = draft_passes(*args, **kwargs)
        drafting = args[5]
        drafted.extend(ids[drafting].flatten().tolist())
        return ids, probs

    monkeypatch.setattr(engine_module, "draft_passes", recording)
    _run(_engine(target, reduced_head, False), _prompts(0, 2), lambda s, r: [2] * r)
    assert drafted and set(drafted) <= set(vocab_map.tolist())


def test_sampling_with_a_head_is_seed_reproducible(target, head) -> None:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(2):
        config = SpecDecodeConfig(num_slots=2, max_model_len=64, k_max=3, temperature=0.8, seed=5)
        engine = SpecDecodeEngine(target, EagleDraft(head, target), config)
        runs.append(_run(engine, _prompts(0, 2), lambda s, r: [3] * r))
    assert runs[0] == runs[1]


def test_head_file_round_trip_and_refusals(tmp_path, target, reduced_head) -> None:  # type: ignore[no-untyped-def]
    path = save_head(reduced_head, tmp_path / "head.safetensors")
    loaded = load_head(path, target)
    assert torch.equal(loaded.vocab_map, reduced_head.vocab_map)
    for name, value in reduced_head.state_dict().items():
        if value.is_floating_point() and not name.startswith("draft_head."):
            assert torch.equal(loaded.state_dict()[name], value.to(torch.bfloat16).float())
    other = tiny_target(seed=0, config=replace(target.config, hidden_size=32, head_dim=16))
    with pytest.raises(InputError, match="hidden_size"):
        load_head(path, other)
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(InputError, match="not an EAGLE head"):
        load_head(plain, target)
    with pytest.raises(InputError, match="no such file"):
        load_head(tmp_path / "missing.safetensors", target)


def test_random_head_at_any_named_shape_and_pair_specs(tmp_path, target, head) -> None:  # type: ignore[no-untyped-def]
    pair = load_pair("tiny", "eagle")
    assert isinstance(pair.draft, EagleDraft) and pair.draft.target is pair.target
    assert pair.draft.head.draft_vocab_size == pair.target.config.vocab_size
    path = save_head(head, tmp_path / "h.safetensors")
    from_file = load_pair("tiny", f"eagle:{path}")
    assert isinstance(from_file.draft, EagleDraft)
    with pytest.raises(InputError, match="write eagle"):
        load_pair("tiny", "EAGLE")


def test_training_data_holds_out_mt_bench(target) -> None:  # type: ignore[no-untyped-def]
    """No MT-Bench question (Spec-Bench's copies of them are the same texts) is trained on."""
    assert not set(CHAT_PROMPT_SETS) & set(HELD_OUT_SETS)
    mt_bench = {text for text, _ in PROMPT_SET_READERS["mt-bench"]()}
    spec_bench = PROMPT_SET_READERS["spec-bench"]()
    assert sum(text in mt_bench for text, _ in spec_bench) == 80  # its MT-Bench copies
    texts = chat_prompt_texts(10_000)  # every prompt of the training sets
    assert len(texts) > 1000 and not set(texts) & mt_bench
    assert texts[0] == PROMPT_SET_READERS[CHAT_PROMPT_SETS[0]]()[0][0]  # round-robin
    windows = document_windows(load_tokenizer("bytes"), 10_000, 512, seed=0)  # every document
    text = bytes(t for window in windows for t in window if t < 256).decode("utf-8", "replace")
    some_mt_bench = sorted(mt_bench)[:20]
    assert len(windows) > 100 and not any(question[:200] in text for question in some_mt_bench)


def test_training_is_deterministic_for_a_seed(target) -> None:  # type: ignore[no-untyped-def]
    sequences = greedy_continuations(target, _prompts(1, 6), 12, 4)
    data = target_features(target, sequences, 20)
    config = EagleTrainConfig(out="unused", steps=4, batch_size=4, seq_len=20, draft_vocab=64)
    first, second = (train_head_on(target, data, config) for _ in range(2))
    assert json.dumps(first.loss_curve) == json.dumps(second.loss_curve)
    for name, value in first.head.state_dict().items():
        assert torch.equal(value, second.head.state_dict()[name])


def test_train_config_refuses_bad_values() -> None:
    with pytest.raises(InputError, match="steps"):
        EagleTrainConfig(out="x", steps=0)
    with pytest.raises(InputError, match="max_minutes"):
        EagleTrainConfig(out="x", max_minutes=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_runner_with_a_head_agrees_with_reference(target, head) -> None:  # type: ignore[no-untyped-def]
    gpu_target = tiny_target(seed=0).cuda()
    gpu_head = EagleHead(gpu_target.config, None, device="cuda")
    gpu_head.load_state_dict(head.state_dict())
    gpu_head.attach(gpu_target)
    prompts = _prompts(0, 3)
    config = SpecDecodeConfig(num_slots=3, max_model_len=64, k_max=4)
    draft = EagleDraft(gpu_head, gpu_target)
    reference = _run(SpecDecodeEngine(gpu_target, draft, config), prompts, lambda s, r: [3] * r)
    graphs = FastSpecDecodeEngine(gpu_target, draft, config, runner="cuda-graphs")
    assert _run(graphs, prompts, lambda s, r: [3] * r) == reference


def test_replay_recording_of_a_head_matches_what_the_engine_accepts(target, head) -> None:  # type: ignore[no-untyped-def]
    """Greedy drafts are a function of the prefix: the recording's matched count at each
    output position is what a static-K run accepted there (capped at K)."""
    prompts = _prompts(0, 3)
    k = 3
    engine = _engine(target, head, False)
    accepted_at: dict[int, dict[int, int]] = {i: {} for i in range(len(prompts))}
    real_step = engine.step

    def recording_step(slots, ks):  # type: ignore[no-untyped-def]
        before = {int(s): int(engine.num_tokens[s]) for s in slots}
        result = real_step(slots, ks)
        for row, slot in enumerate(slots):
            index = next(i for i, s in slot_index.items() if s == int(slot))
            position = before[int(slot)] - len(prompts[index])  # output index drafted for
            accepted_at[index][position] = int(result.num_accepted[row])
        return result

    slot_index: dict[int, int] = {}
    original_alloc = engine.alloc_slot

    def alloc(tokens):  # type: ignore[no-untyped-def]
        slot = original_alloc(tokens)
        slot_index[len(slot_index)] = slot
        return slot

    engine.alloc_slot = alloc  # type: ignore[method-assign]
    engine.step = recording_step  # type: ignore[method-assign]
    outputs, _ = _run(engine, prompts, lambda s, r: [k] * r)
    recording = replay_recording(
        EagleDraft(head, target),
        [np.array(p) for p in prompts],
        [np.array(o) for o in outputs],
        64,
        cap=8,
    )
    checked = 0
    for index in range(len(prompts)):
        for position, accepted in accepted_at[index].items():
            if position + k < NUM_NEW:  # the recording knows outputs up to NUM_NEW
                assert min(int(recording.matched[index][position]), k) == accepted
                checked += 1
    assert checked > 10 and any(m.sum() > 0 for m in recording.matched)


@pytest.mark.parametrize("fast", [False, True])
def test_eagle_or_lookup_uses_each_where_it_should(monkeypatch, target, head, fast) -> None:  # type: ignore[no-untyped-def]
    """Rows whose lookup finds all K draft by lookup, the others by the head; tokens stay the
    target's, and both kinds of row occur."""
    chosen: list[bool] = []
    real = SpecDecodeEngine._full_lookups

    def recording(self, slots, spec, lengths):  # type: ignore[no-untyped-def]
        found = real(self, slots, spec, lengths)
        chosen.extend((found[:, 0] >= 0).tolist())
        return found

    monkeypatch.setattr(SpecDecodeEngine, "_full_lookups", recording)
    block = _prompts(5, 1, length=6)[0]
    prompts = [block + p + block for p in _prompts(0, 3)]  # lookup finds the repeated block
    outputs, accepted = _run(
        _engine(target, head, fast, lookup=True), prompts, lambda s, r: [2] * r
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, NUM_NEW)
    assert any(chosen) and not all(chosen) and sum(accepted) > 0
    pair = load_pair("tiny", "eagle+ngram:1-3")
    assert isinstance(pair.draft, EagleOrLookup) and pair.draft.lookup == NgramConfig(1, 3)
    with pytest.raises(InputError, match="write eagle\\+ngram"):
        load_pair("tiny", "eagle+early-exit:1")
