"""An offline model zoo: a target/draft pair from scratch, or a draft distilled for a target.

- `train_pair`: target and draft (target larger) both trained from scratch with next-token
  cross-entropy on the same batches of an offline corpus (backend.corpus), same tokenizer.
- `distill_draft`: a draft trained against a given target (e.g. SmolLM2-135M) on the corpus:
  `kl` minimises KL(target || draft) on the target's full next-token distributions; `greedy`
  is cross-entropy to the target's argmax (what greedy SD needs the draft to match).

Checkpoint format (one folder per model): `config.json` (HF Llama keys + `dsd.tokenizer`),
`model.safetensors` (HF names), `train.json` (see `TrainRecord`: seed, steps, loss curve, corpus,
versions, held-out losses and acceptance). `dsd generate --target DIR` loads it; HF tools too.

Held-out acceptance (greedy; the vocabulary of `policies.types`): on held-out windows the target
continues greedily for `eval_tokens` tokens; the draft, fed the same sequence, matches at a
position when its argmax equals the target's next token there. Greedy chain SD accepts the first i
drafts of a step starting at t iff the draft matches at t..t+i-1 (accepted drafts are the target's
own tokens, so the draft conditions on exactly this path), so r_i is the mean over windows and
start positions t of the product of those i matches.

Deterministic for a seed on CPU: torch.manual_seed + name-keyed init + a numpy Generator for the
data order. CUDA runs use bf16 autocast and are reproducible only up to kernel nondeterminism.
This module does not decode text for users (backend.generate) or run SD steps (backend.engine).
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from dsd.backend.corpus import TokenCorpus, heldout_windows, sample_windows, tokenize_corpus
from dsd.backend.model import MODEL_CONFIGS, ModelConfig, Transformer, init_random_, new_kv_cache
from dsd.backend.pair import check_device
from dsd.backend.tokenizer import TOKENIZER_NAMES, load_tokenizer
from dsd.backend.weights import check_pair, load_model, save_checkpoint
from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError

# Named zoo shapes (vocab filled from the tokenizer). Targets are ~4-8x their drafts.
ZOO_SHAPES: dict[str, dict[str, int]] = {
    "nano-target": {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "ffn": 64},  # tests
    "nano-draft": {"hidden": 16, "layers": 1, "heads": 1, "kv_heads": 1, "ffn": 32},  # tests
    "s-target": {"hidden": 256, "layers": 6, "heads": 8, "kv_heads": 4, "ffn": 768},
    "s-draft": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 384},
    "m-target": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4, "ffn": 1536},
    "m-draft": {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 768},
}
# max_position_embeddings of zoo models: RoPE has no hard limit, and serving runs need room for
# prompt + output beyond the training window (quality past --seq-len is not trained for)
ZOO_MAX_POSITIONS = 2048
_SHAPE_KEYS = ("hidden", "layers", "heads", "kv_heads", "ffn")
DistillLoss = Literal["kl", "greedy"]


def parse_shape(spec: str, vocab_size: int, where: str, max_len: int = 4096) -> ModelConfig:
    """A ModelConfig from a zoo shape name, a MODEL_CONFIGS name (its vocab replaced), or a custom
    `hidden=256,layers=4,heads=4,kv_heads=2,ffn=768` (kv_heads defaults to heads)."""
    if spec in MODEL_CONFIGS:
        return replace(
            MODEL_CONFIGS[spec],
            vocab_size=vocab_size,
            bos_token_id=None,
            eos_token_ids=(),
            name=spec,
        )
    if spec in ZOO_SHAPES:
        fields, name = dict(ZOO_SHAPES[spec]), spec
    else:
        fields, name = {}, "custom"
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in _SHAPE_KEYS or not value.strip().isdigit():
                names = ", ".join([*ZOO_SHAPES, *MODEL_CONFIGS])
                raise InputError(
                    f"{where}: {spec!r} is not a shape name ({names}) "
                    f"or a key=value list of {', '.join(_SHAPE_KEYS)}"
                )
            fields[key] = int(value)
        for key in ("hidden", "layers", "heads", "ffn"):
            if key not in fields:
                raise InputError(f"{where}: {spec!r} lacks {key}=")
        fields.setdefault("kv_heads", fields["heads"])
    try:
        return ModelConfig(
            vocab_size=vocab_size,
            hidden_size=fields["hidden"],
            num_layers=fields["layers"],
            num_heads=fields["heads"],
            num_kv_heads=fields["kv_heads"],
            intermediate_size=fields["ffn"],
            tie_word_embeddings=True,
            max_position_embeddings=max_len,
            name=name,
        )
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


# Most tokens in one training step (batch x window): beyond it a step's arrays do not fit a
# machine, and it is far past what these small models are trained with.
MAX_TOKENS_PER_STEP = 1 << 22


@dataclass(frozen=True)
class TrainConfig:
    """Options shared by `dsd zoo train` and `dsd zoo distill-draft`. Validated on construction."""

    out_dir: str  # output folder
    corpus: tuple[str, ...] = ("stdlib",)  # corpus names (backend.corpus.CORPUS_NAMES)
    tokenizer: str = "bytes"  # "bytes" or "smollm2" (distill-draft: the target's)
    steps: int = 1000  # optimizer steps; >= 1
    batch_size: int = 16  # windows per step; >= 1
    seq_len: int = 256  # tokens per window; >= 2
    lr: float = 1e-3  # peak AdamW learning rate (linear warm-up, cosine decay to lr/10)
    weight_decay: float = 0.1  # AdamW weight decay
    seed: int = 0  # seeds init (torch) and data order (numpy)
    device: str = "cpu"  # "cpu" or "cuda"
    max_minutes: float | None = None  # stop training after this wall time (then evaluate)
    max_corpus_chars: int | None = None  # cap on corpus characters (quick runs, tests)
    eval_windows: int = 64  # held-out windows for evaluation
    eval_prompt_len: int = 64  # context tokens before the greedy continuation
    eval_tokens: int = 32  # greedy continuation tokens per window
    eval_k: int = 5  # positions of r_i reported
    log_every: int = 0  # loss-curve interval in steps; 0 picks ~100 points

    def __post_init__(self) -> None:
        checks = {
            "--steps": self.steps >= 1,
            "--batch-size": self.batch_size >= 1,
            "--seq-len": self.seq_len >= 2,
            "--lr": math.isfinite(self.lr) and self.lr > 0,
            "--eval-windows": self.eval_windows >= 1,
            "--eval-tokens": self.eval_tokens >= 1,
            "--eval-k": 1 <= self.eval_k <= self.eval_tokens,
            "--eval-prompt-len": self.eval_prompt_len >= 1,
        }
        for flag, ok in checks.items():
            if not ok:
                raise InputError(f"{flag}: invalid value in {self.__class__.__name__}")
        if self.batch_size * self.seq_len > MAX_TOKENS_PER_STEP:
            raise InputError(
                f"--batch-size x --seq-len: {self.batch_size} x {self.seq_len} tokens per step, "
                f"more than {MAX_TOKENS_PER_STEP:,} (lower either)"
            )
        check_device(self.device)
        if self.tokenizer not in TOKENIZER_NAMES:
            raise InputError(f"--tokenizer must be one of {', '.join(TOKENIZER_NAMES)}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise InputError(f"--max-minutes must be > 0, got {self.max_minutes}")


@dataclass
class TrainRecord:
    """What train.json holds (written with the checkpoint)."""

    role: str  # "target", "draft" or "distilled-draft"
    model_config: dict[str, Any]  # the HF-style config of this model
    train_config: dict[str, Any]  # the resolved TrainConfig
    seed: int  # the seed
    steps_done: int  # optimizer steps actually run (< steps when max_minutes hit)
    elapsed_s: float  # training wall time
    loss_curve: list[list[float]]  # [[step, mean train loss since the previous point], ...]
    corpus: dict[str, Any]  # names, tokenizer, token and document counts
    versions: dict[str, str]  # python, torch, numpy, platform
    heldout_loss: float | None = None  # next-token CE on held-out windows
    acceptance: dict[str, Any] = field(default_factory=dict)  # r_i, AL(K), how measured
    teacher: str | None = None  # distill-draft: the target spec


def versions() -> dict[str, str]:
    import tokenizers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "tokenizers": tokenizers.__version__,
        "platform": platform.platform(),
    }


def _corpus_summary(corpus: TokenCorpus) -> dict[str, Any]:
    return {
        "names": list(corpus.names),
        "tokenizer": corpus.tokenizer_name,
        "num_train_tokens": len(corpus.train_ids),
        "num_heldout_tokens": len(corpus.heldout_ids),
        "num_documents": corpus.num_documents,
        "num_heldout_documents": corpus.num_heldout_documents,
        "num_chars": corpus.num_chars,
    }


def _lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over 5% of steps, cosine decay to lr / 10."""
    warmup = max(1, config.steps // 20)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _optimizer(model: Transformer, config: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )


def _forward(model: Transformer, inputs: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of a cache-free causal forward (training)."""
    positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)  # [B, T]
    if inputs.device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits: torch.Tensor = model(inputs, positions).float()  # [B, T, V]
            return logits
    logits = model(inputs, positions)  # [B, T, V]
    return logits


def next_token_loss(model: Transformer, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of windows [B, T+1]."""
    logits = _forward(model, windows[:, :-1])  # [B, T, V]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


def distill_loss(
    draft: Transformer, teacher: Transformer, windows: torch.Tensor, kind: DistillLoss
) -> torch.Tensor:
    """KL(teacher || draft) per token, or CE to the teacher's argmax, on windows [B, T+1]."""
    inputs = windows[:, :-1]  # [B, T]
    with torch.no_grad():
        teacher_logits = _forward(teacher, inputs)  # [B, T, V]
    draft_logits = _forward(draft, inputs)  # [B, T, V]
    vocab = draft_logits.shape[-1]
    if kind == "greedy":
        return F.cross_entropy(
            draft_logits.reshape(-1, vocab), teacher_logits.argmax(-1).reshape(-1)
        )
    teacher_logp = F.log_softmax(teacher_logits, dim=-1).reshape(-1, vocab)  # [B*T, V]
    draft_logp = F.log_softmax(draft_logits, dim=-1).reshape(-1, vocab)  # [B*T, V]
    return F.kl_div(draft_logp, teacher_logp, log_target=True, reduction="batchmean")


ProgressHook = Callable[[int, list[float]], None]  # (steps done, this step's losses)


def _train_loop(
    models: list[Transformer],
    loss_fns: list[Callable[[torch.Tensor], torch.Tensor]],
    corpus: TokenCorpus,
    config: TrainConfig,
    on_step: ProgressHook | None,
) -> tuple[int, float, list[list[list[float]]]]:
    """Train each model with its loss on the same batches. Returns steps done, seconds, curves."""
    device = torch.device(config.device)
    rng = np.random.default_rng(config.seed)  # the data order
    optimizers = [_optimizer(model, config) for model in models]
    log_every = config.log_every or max(1, config.steps // 100)
    curves: list[list[list[float]]] = [[] for _ in models]
    running = [0.0 for _ in models]
    running_count = 0
    start_s = time.perf_counter()
    steps_done = 0
    for step in range(config.steps):
        if (
            config.max_minutes is not None
            and time.perf_counter() - start_s > 60 * config.max_minutes
        ):
            break
        windows = torch.from_numpy(
            sample_windows(corpus.train_ids, config.batch_size, config.seq_len, rng)
        ).to(device)  # [B, T+1]
        lr = _lr_at(step, config)
        step_losses = [0.0 for _ in models]
        for index, (model, loss_fn, optimizer) in enumerate(
            zip(models, loss_fns, optimizers, strict=True)
        ):
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = loss_fn(windows)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step_losses[index] = float(loss.detach())
            running[index] += step_losses[index]
        running_count += 1
        steps_done = step + 1
        if steps_done % log_every == 0 or steps_done == config.steps:
            for index in range(len(models)):
                curves[index].append([steps_done, running[index] / running_count])
            running = [0.0 for _ in models]
            running_count = 0
        if on_step is not None:
            on_step(steps_done, step_losses)
    if running_count:
        for index in range(len(models)):
            curves[index].append([steps_done, running[index] / running_count])
    return steps_done, time.perf_counter() - start_s, curves


@torch.inference_mode()
def heldout_loss(model: Transformer, corpus: TokenCorpus, config: TrainConfig) -> float:
    """Mean next-token CE over evenly spaced held-out windows."""
    model.eval()
    windows = heldout_windows(corpus.heldout_ids, config.eval_windows, config.seq_len + 1)
    device = next(model.parameters()).device
    losses = []
    for chunk in np.array_split(windows, max(1, len(windows) // 16)):
        losses.append(
            float(next_token_loss(model, torch.from_numpy(chunk).to(device))) * len(chunk)
        )
    return sum(losses) / len(windows)


@torch.inference_mode()
def greedy_match_matrix(
    target: Transformer,
    draft: Transformer,
    draft_layers: int | None,
    contexts: npt.NDArray[np.int64],
    num_tokens: int,
) -> npt.NDArray[np.bool_]:
    """[W, num_tokens] True where the draft's argmax equals the target's greedy next token along
    the target's greedy continuation of each context [W, P]."""
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    num_windows, prompt_len = contexts.shape
    cache = new_kv_cache(
        target.config, num_windows, prompt_len + num_tokens, device=device, dtype=dtype
    )
    slots = torch.arange(num_windows, device=device)  # [W]
    inputs = torch.from_numpy(contexts).to(device)  # [W, P]
    positions = torch.arange(prompt_len, device=device).expand(num_windows, prompt_len)  # [W, P]
    continuation = []
    for _ in range(num_tokens):
        logits = target(inputs, positions, cache, slots, kv_len=int(positions[0, -1]) + 1)
        token = logits[:, -1].argmax(-1)  # [W]
        continuation.append(token)
        inputs = token[:, None]  # [W, 1]
        positions = positions[:, -1:] + 1  # [W, 1]
    greedy = torch.stack(continuation, dim=1)  # [W, N]
    sequence = torch.cat(
        [torch.from_numpy(contexts).to(device), greedy[:, :-1]], dim=1
    )  # [W, P+N-1]
    all_positions = torch.arange(sequence.shape[1], device=device).expand_as(sequence)
    draft_logits = draft(sequence, all_positions, num_layers=draft_layers)  # [W, P+N-1, V]
    draft_next = draft_logits[:, prompt_len - 1 :].argmax(-1)  # [W, N]
    matches: npt.NDArray[np.bool_] = (draft_next == greedy).cpu().numpy()
    return matches


def per_position_rates(matches: npt.NDArray[np.bool_], k: int) -> list[float]:
    """r_i for i = 1..k: mean over windows and start t of prod_{j<i} matches[:, t + j]."""
    num_tokens = matches.shape[1]
    starts = num_tokens - k + 1
    rates = []
    run = np.ones((matches.shape[0], starts), dtype=bool)  # [W, starts]
    for i in range(k):
        run &= matches[:, i : i + starts]
        rates.append(float(run.mean()))
    return rates


def evaluate_acceptance(
    target: Transformer,
    draft: Transformer,
    corpus: TokenCorpus,
    config: TrainConfig,
    draft_layers: int | None = None,
) -> dict[str, Any]:
    """Held-out greedy acceptance of a draft against a target (see the module docstring)."""
    target.eval()
    draft.eval()
    contexts = heldout_windows(corpus.heldout_ids, config.eval_windows, config.eval_prompt_len)
    matches = np.concatenate(
        [
            greedy_match_matrix(target, draft, draft_layers, chunk, config.eval_tokens)
            for chunk in np.array_split(contexts, max(1, len(contexts) // 16))
        ]
    )  # [W, N]
    rates = per_position_rates(matches, config.eval_k)
    return {
        "per_position_acceptance_rates": rates,
        "acceptance_length": [1.0 + sum(rates[:k]) for k in range(config.eval_k + 1)],
        "draft_match_rate": float(matches.mean()),
        "num_windows": int(matches.shape[0]),
        "prompt_len": config.eval_prompt_len,
        "continuation_tokens": config.eval_tokens,
        "method": "greedy: draft argmax vs target greedy continuation on held-out windows",
    }


def _record(
    role: str,
    model: Transformer,
    config: TrainConfig,
    corpus: TokenCorpus,
    steps_done: int,
    elapsed_s: float,
    curve: list[list[float]],
) -> TrainRecord:
    from dsd.backend.weights import hf_config_dict

    return TrainRecord(
        role=role,
        model_config=hf_config_dict(model.config, config.tokenizer),
        train_config={k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()},
        seed=config.seed,
        steps_done=steps_done,
        elapsed_s=round(elapsed_s, 3),
        loss_curve=curve,
        corpus=_corpus_summary(corpus),
        versions=versions(),
    )


def _save(model: Transformer, folder: Path, record: TrainRecord, tokenizer: str) -> None:
    save_checkpoint(model, folder, tokenizer_name=tokenizer)
    atomic_write_json(folder / "train.json", asdict(record))


@dataclass(frozen=True)
class PairResult:
    """What `train_pair` produced."""

    target_dir: Path  # the target checkpoint
    draft_dir: Path  # the draft checkpoint
    target_record: TrainRecord  # its train.json
    draft_record: TrainRecord  # its train.json (holds the acceptance against the target)


def _check_trainable(config: ModelConfig, device: str) -> None:
    """InputError when training `config` cannot fit the device's memory: fp32 weights,
    gradients and two AdamW moments (16 bytes per parameter), activations not counted."""
    if device == "cuda":
        total = int(torch.cuda.get_device_properties(0).total_memory)
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    needed = 16 * config.num_params
    if needed > total:
        raise InputError(
            f"model config{f' {config.name}' if config.name else ''}: {config.num_params:,} "
            f"parameters need {needed / 2**30:,.1f} GiB to train, the {device} has "
            f"{total / 2**30:,.1f} GiB"
        )


def _build(config: ModelConfig, seed: int, device: str) -> Transformer:
    _check_trainable(config, device)
    torch.manual_seed(seed)
    model = init_random_(Transformer(config), seed=seed).to(device)
    model.train()
    return model


def train_pair(
    config: TrainConfig,
    target_shape: str = "s-target",
    draft_shape: str = "s-draft",
    on_step: ProgressHook | None = None,
    corpus: TokenCorpus | None = None,
) -> PairResult:
    """Train a target and a draft from scratch on the same batches; save both; evaluate."""
    tokenizer = load_tokenizer(config.tokenizer)
    max_len = max(
        ZOO_MAX_POSITIONS, config.seq_len + 1, config.eval_prompt_len + config.eval_tokens
    )
    target_cfg = parse_shape(target_shape, tokenizer.vocab_size, "--target-config", max_len)
    draft_cfg = parse_shape(draft_shape, tokenizer.vocab_size, "--draft-config", max_len)
    if draft_cfg.num_params >= target_cfg.num_params:
        raise InputError(
            f"--draft-config: the draft ({draft_cfg.num_params:,} params) must be smaller than the "
            f"target ({target_cfg.num_params:,})"
        )
    check_pair(target_cfg, draft_cfg)
    if corpus is None:
        corpus = tokenize_corpus(config.corpus, tokenizer, config.max_corpus_chars)
    target = _build(target_cfg, config.seed, config.device)
    draft = _build(draft_cfg, config.seed + 1, config.device)
    steps_done, elapsed_s, curves = _train_loop(
        [target, draft],
        [lambda w: next_token_loss(target, w), lambda w: next_token_loss(draft, w)],
        corpus,
        config,
        on_step,
    )
    out = Path(config.out_dir)
    target_record = _record("target", target, config, corpus, steps_done, elapsed_s, curves[0])
    draft_record = _record("draft", draft, config, corpus, steps_done, elapsed_s, curves[1])
    target_record.heldout_loss = heldout_loss(target, corpus, config)
    draft_record.heldout_loss = heldout_loss(draft, corpus, config)
    draft_record.acceptance = evaluate_acceptance(target, draft, corpus, config)
    draft_record.teacher = str(out / "target")
    target_record.acceptance = draft_record.acceptance
    _save(target, out / "target", target_record, config.tokenizer)
    _save(draft, out / "draft", draft_record, config.tokenizer)
    return PairResult(out / "target", out / "draft", target_record, draft_record)


@dataclass(frozen=True)
class DistillResult:
    """What `distill_draft` produced."""

    draft_dir: Path  # the draft checkpoint
    record: TrainRecord  # its train.json
    baseline_acceptance: dict[str, Any]  # the untrained draft's acceptance, for comparison


def distill_draft(
    config: TrainConfig,
    target_spec: str,
    draft_shape: str = "s-draft",
    loss: DistillLoss = "kl",
    on_step: ProgressHook | None = None,
    corpus: TokenCorpus | None = None,
) -> DistillResult:
    """Train a draft from scratch against a given target's outputs on the corpus."""
    if loss not in ("kl", "greedy"):
        raise InputError(f"--loss must be kl or greedy, got {loss!r}")
    teacher = load_model(target_spec, device=config.device)
    if teacher.tokenizer_name is None:
        raise InputError(f"{target_spec}: cannot tell the target's tokenizer")
    if teacher.tokenizer_name != config.tokenizer:
        config = replace(config, tokenizer=teacher.tokenizer_name)  # the draft must share it
    tokenizer = load_tokenizer(config.tokenizer)
    max_len = max(
        ZOO_MAX_POSITIONS, config.seq_len + 1, config.eval_prompt_len + config.eval_tokens
    )
    draft_cfg = parse_shape(draft_shape, teacher.config.vocab_size, "--draft-config", max_len)
    check_pair(teacher.config, draft_cfg)
    if corpus is None:
        corpus = tokenize_corpus(config.corpus, tokenizer, config.max_corpus_chars)
    draft = _build(draft_cfg, config.seed + 1, config.device)
    teacher.model.eval()
    for param in teacher.model.parameters():
        param.requires_grad_(False)
    baseline = evaluate_acceptance(teacher.model, draft, corpus, config)
    draft.train()
    steps_done, elapsed_s, curves = _train_loop(
        [draft],
        [lambda w: distill_loss(draft, teacher.model, w, loss)],
        corpus,
        config,
        on_step,
    )
    record = _record("distilled-draft", draft, config, corpus, steps_done, elapsed_s, curves[0])
    record.teacher = target_spec
    record.heldout_loss = heldout_loss(draft, corpus, config)
    record.acceptance = evaluate_acceptance(teacher.model, draft, corpus, config)
    record.acceptance["loss"] = loss
    out = Path(config.out_dir)
    _save(draft, out, record, config.tokenizer)
    return DistillResult(out, record, baseline)
