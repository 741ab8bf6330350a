"""A target and its draft, loaded once from specs, with the target's tokenizer.

Model specs (`--target`, `--draft`), one spelling everywhere:
- a named shape of `backend.model.MODEL_CONFIGS` (`tiny`, `llama-3.1-8b`, ...) with random
  weights; `random:NAME` forces random weights for any named shape (`random:smollm2-135m`);
- anything `backend.weights.load_model` reads: `smollm2-135m` (the real weights), a .gguf file,
  an HF or dsd checkpoint folder;
- drafts only: `early-exit:N` (the target's first N layers + final norm + head), `ngram` or
  `ngram:MIN-MAX` (prompt lookup with vLLM's `ngram` semantics: n-grams of MIN..MAX tokens,
  vLLM's prompt_lookup_min / prompt_lookup_max; `ngram` alone is vLLM's default 5-5; no model),
  `eagle` (an EAGLE head, `backend.eagle`: the trained one shipped for `smollm2-135m`, random
  weights at any random-weight target's shape), `eagle:FILE` (a head file), `eagle+ngram[:MIN-MAX]`
  (per row and step, prompt lookup where it finds all K drafts, else the head), and `none`.

`load_pair` checks the draft spec's spelling before any weights load and its depth against
the target once the target is known. `ModelPair.real_workload` turns a workload into the one a
real run serves: prompt text chat-templated and tokenized (lengths re-measured) when the target
names a tokenizer, else (random weights) the dataset's lengths with synthetic ids.

This module runs nothing (backend.executor, backend.run do) and knows no policies.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dsd.backend.eagle import SHIPPED_HEADS, EagleDraft, EagleHead, EagleOrLookup, load_head
from dsd.backend.engine import AnyDraft, Draft, NgramDraft
from dsd.backend.model import MODEL_CONFIGS, Transformer, init_random_
from dsd.backend.ngram import NgramConfig
from dsd.backend.tokenizer import chat_prompt, load_tokenizer
from dsd.backend.weights import SMOLLM2_SPEC, check_pair, load_model
from dsd.common.errors import InputError
from dsd.traces.workload import Workload

NO_DRAFT = "none"
EARLY_EXIT_PREFIX = "early-exit:"
NGRAM = "ngram"
EAGLE = "eagle"
RANDOM_PREFIX = "random:"
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def check_device(device: str) -> None:
    """`cpu`, `cuda` or `cuda:N`, and CUDA only where it is available."""
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InputError(f"--device: choose cpu or cuda, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: CUDA is not available on this machine")


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`auto` (bfloat16 on CUDA, float32 on CPU) or a dtype name."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise InputError(f"--dtype: choose from auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def _positive_int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and int(text) >= 1 else None


def check_draft_spec(spec: str) -> int | NgramConfig | None:
    """What a draft spec names before anything loads: an early-exit depth, an n-gram lookup, or
    None (no draft, or a model spec); a bad spelling is a one-line error."""
    if spec.lower() in (NO_DRAFT, NGRAM, EAGLE) and spec not in (NO_DRAFT, NGRAM, EAGLE):
        raise InputError(f"--draft {spec}: write {spec.lower()}")
    if spec == NGRAM:
        return NgramConfig()
    if spec.startswith(NGRAM + ":"):
        low, sep, high = spec.removeprefix(NGRAM + ":").partition("-")
        bounds = (_positive_int(low), _positive_int(high))
        if not sep or bounds[0] is None or bounds[1] is None or bounds[1] < bounds[0]:
            raise InputError(
                f"--draft {spec}: write ngram:MIN-MAX with 1 <= MIN <= MAX (e.g. ngram:1-4)"
            )
        return NgramConfig(prompt_lookup_min=bounds[0], prompt_lookup_max=bounds[1])
    if not spec.startswith(EARLY_EXIT_PREFIX):
        return None
    depth = _positive_int(spec.removeprefix(EARLY_EXIT_PREFIX))
    if depth is None:
        raise InputError(f"--draft {spec}: the depth N of {EARLY_EXIT_PREFIX}N must be >= 1")
    return depth


def build_model(
    spec: str, device: str, dtype: torch.dtype, seed: int
) -> tuple[Transformer, str | None]:
    """(Transformer in eval mode, tokenizer name or None) for a model spec (module docstring);
    float32 CPU weights get their inference layouts (`Transformer.prepare_cpu_kernels`)."""
    name = spec.removeprefix(RANDOM_PREFIX)
    if spec.startswith(RANDOM_PREFIX) or (spec in MODEL_CONFIGS and spec != SMOLLM2_SPEC):
        if name not in MODEL_CONFIGS:
            raise InputError(
                f"model {spec!r}: unknown shape; known: {', '.join(sorted(MODEL_CONFIGS))}"
            )
        model = init_random_(Transformer(MODEL_CONFIGS[name], device=device, dtype=dtype), seed)
        tokenizer_name = None
    else:
        loaded = load_model(spec, device=device, dtype=dtype)
        model, tokenizer_name = loaded.model, loaded.tokenizer_name
    model.eval().prepare_cpu_kernels()
    return model, tokenizer_name


@dataclass(frozen=True)
class ModelPair:
    """A loaded target and draft (or no draft) on one device."""

    target_spec: str  # the --target spec it was loaded from
    draft_spec: str  # the --draft spec (`none` without a draft)
    target: Transformer  # the target model, eval mode
    draft: AnyDraft | None  # a separate model or an early exit of the target; None: no draft
    tokenizer_name: str | None  # the target's tokenizer (None: random weights, no text)
    dtype: torch.dtype  # of both models

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    @functools.cached_property
    def tokenize(self) -> Callable[[str], list[int]] | None:
        """Chat-template and tokenize a prompt text (None when the target has no tokenizer)."""
        if self.tokenizer_name is None:
            return None
        tokenizer = load_tokenizer(self.tokenizer_name)

        def tokenize(text: str) -> list[int]:
            return list(tokenizer.encode(chat_prompt(text)))

        return tokenize

    @functools.cached_property
    def detokenize(self) -> Callable[[list[int]], str] | None:
        """Token ids back to text (None when the target has no tokenizer)."""
        if self.tokenizer_name is None:
            return None
        return load_tokenizer(self.tokenizer_name).decode

    def real_workload(self, workload: Workload) -> Workload:
        """Prompt lengths re-measured with the tokenizer, or the text dropped (random weights,
        whose requests get synthetic ids of the dataset's lengths)."""
        tokenize = self.tokenize
        if tokenize is None:
            requests = tuple(dataclasses.replace(r, prompt=None) for r in workload.requests)
        else:
            requests = tuple(
                dataclasses.replace(r, prompt_len=len(tokenize(r.prompt))) if r.prompt else r
                for r in workload.requests
            )
        return dataclasses.replace(workload, requests=requests)

    def with_draft(self, spec: str, *, seed: int = 0) -> ModelPair:
        """The same target (shared, not copied) with the draft `spec` names; a separate draft
        model gets random weights from `seed + 1` when it has no file."""
        parsed = check_draft_spec(spec)
        draft: AnyDraft | None = None
        if isinstance(parsed, NgramConfig):
            draft = NgramDraft(parsed)
        elif parsed is not None:
            num_layers = self.target.config.num_layers
            if parsed >= num_layers:
                raise InputError(
                    f"--draft {spec}: N must be an integer in [1, {num_layers - 1}] "
                    "(layers of the target)"
                )
            draft = Draft.early_exit(self.target, parsed)
        elif spec.startswith(EAGLE + "+"):  # eagle+ngram[:MIN-MAX]
            lookup = check_draft_spec(spec.removeprefix(EAGLE + "+"))
            if not isinstance(lookup, NgramConfig):
                raise InputError(f"--draft {spec}: write eagle+ngram or eagle+ngram:MIN-MAX")
            draft = EagleOrLookup(
                EagleDraft(self._eagle_head(EAGLE, seed + 1), self.target), lookup
            )
        elif spec == EAGLE or spec.startswith(EAGLE + ":"):
            draft = EagleDraft(self._eagle_head(spec, seed + 1), self.target)
        elif spec != NO_DRAFT:
            draft_model, draft_tokenizer = build_model(spec, str(self.device), self.dtype, seed + 1)
            check_pair(self.target.config, draft_model.config, self.tokenizer_name, draft_tokenizer)
            draft = Draft(draft_model)
        return dataclasses.replace(self, draft_spec=spec, draft=draft)

    def _eagle_head(self, spec: str, seed: int) -> EagleHead:
        """The head `eagle` or `eagle:FILE` names for this target."""
        if spec.startswith(EAGLE + ":"):
            return load_head(spec.removeprefix(EAGLE + ":"), self.target)
        shipped = SHIPPED_HEADS.get(self.target_spec)
        if shipped is not None and self.tokenizer_name is not None:
            if not shipped.is_file():
                raise InputError(f"--draft eagle: the trained head {shipped} is missing")
            return load_head(shipped, self.target)
        if self.tokenizer_name is None:  # random weights: a random head at the target's shape
            return EagleHead.random(self.target, seed)
        raise InputError(
            f"--draft eagle: no trained head ships for {self.target_spec}; give eagle:FILE "
            "(dsd zoo train-eagle makes one)"
        )

    def describe(self) -> dict[str, Any]:
        """What a run's result records about the pair."""
        return {
            "model_id": self.target_spec,
            "draft": self.draft_spec,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }


def load_pair(
    target: str, draft: str = NO_DRAFT, *, device: str = "cpu", dtype: str = "auto", seed: int = 0
) -> ModelPair:
    """Load a target and its draft from specs (module docstring); random weights from `seed`
    (the target's) and `seed + 1` (a separate draft's)."""
    check_draft_spec(draft)
    check_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    target_model, tokenizer_name = build_model(target, device, torch_dtype, seed)
    pair = ModelPair(
        target_spec=target,
        draft_spec=NO_DRAFT,
        target=target_model,
        draft=None,
        tokenizer_name=tokenizer_name,
        dtype=torch_dtype,
    )
    return pair.with_draft(draft, seed=seed)
