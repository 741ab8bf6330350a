"""Text generation with real weights: target-only decoding, or speculative decoding with a draft.

- Without a draft: plain decoding with the target and a one-slot KV cache per prompt (argmax at
  temperature 0, else a sample from softmax(logits / T) drawn from a seeded torch.Generator).
  It is deliberately independent of the SD engine, so it doubles as the reference that greedy SD
  must reproduce token for token.
- With a draft (a model of the same vocabulary, or `early-exit:N`, the target cut after N layers):
  `backend.engine.SpecDecodeEngine` runs all prompts as one batch, K drafts per request per step,
  and we count drafted/accepted per position for the acceptance report.

Prompts are wrapped in the model's chat template (SmolLM2's ChatML) when the model is an
instruct model and `chat` is on. Generation stops at the tokenizer's stop ids or max_tokens.

This module does not schedule requests or measure latency distributions (backend.executor and
the profiler do); the throughput it reports is plain wall time over all prompts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dsd.backend.engine import AnyDraft, SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.model import Transformer, new_kv_cache
from dsd.backend.pair import ModelPair
from dsd.backend.tokenizer import TextTokenizer, chat_prompt, load_tokenizer
from dsd.common.errors import InputError


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate. Validated on construction."""

    max_tokens: int = 64  # output tokens per prompt at most; >= 1
    temperature: float = 0.0  # 0: greedy; > 0: sampling (lossless rejection sampling with SD)
    num_spec_tokens: int = 4  # K: drafts per step when a draft is given; >= 1
    seed: int = 0  # seeds the torch.Generator of sampling
    chat: bool = True  # wrap prompts in the chat template when the model has one

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InputError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise InputError(f"--temperature must be finite and >= 0, got {self.temperature}")
        if self.num_spec_tokens < 1:
            raise InputError(f"--k must be >= 1, got {self.num_spec_tokens}")


@dataclass(frozen=True)
class GenerationResult:
    """One prompt's generation."""

    prompt: str  # the user's prompt text (before the chat template)
    text: str  # decoded output text
    output_token_ids: list[int]  # output tokens, stop token excluded
    num_prompt_tokens: int  # tokens in the templated prompt
    num_steps: int  # decode steps (target forwards after the prefill)
    num_drafted: int  # draft tokens verified (0 without a draft)
    num_accepted: int  # draft tokens accepted


@dataclass(frozen=True)
class GenerationReport:
    """All prompts' results and the run's totals."""

    results: list[GenerationResult]  # one per prompt, in order
    elapsed_s: float  # wall time of generation (loading excluded)
    num_output_tokens: int  # output tokens over all prompts
    accepted_at_pos: list[int]  # [K] steps whose first i+1 drafts were all accepted
    drafted_at_pos: list[int]  # [K] steps that drafted at least i+1 tokens

    @property
    def per_position_rates(self) -> list[float]:
        """r_i = accepted_at_pos[i] / drafted_at_pos[i] (`policies.types`)."""
        return [
            a / d if d else 0.0
            for a, d in zip(self.accepted_at_pos, self.drafted_at_pos, strict=True)
        ]

    @property
    def acceptance_length(self) -> float:
        """Output tokens per decode step, bonus/recovered token included."""
        steps = sum(result.num_steps for result in self.results)
        return (sum(r.num_accepted for r in self.results) + steps) / steps if steps else 0.0


def format_prompt(prompt: str, chat: bool) -> str:
    return chat_prompt(prompt) if chat else prompt


@torch.inference_mode()
def generate_plain(
    model: Transformer,
    prompt_ids: Sequence[int],
    max_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Target-only decoding of one prompt with a KV cache; the stop token is not returned."""
    if not prompt_ids:
        raise InputError("prompt: empty after tokenization")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    num_prompt = len(prompt_ids)
    cache = new_kv_cache(model.config, 1, num_prompt + max_tokens, device=device, dtype=dtype)
    slot = torch.zeros(1, dtype=torch.int64, device=device)  # [1]
    inputs = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=device)  # [1, P]
    positions = torch.arange(num_prompt, device=device)[None]  # [1, P]
    stops = set(stop_ids)
    output: list[int] = []
    for _ in range(max_tokens):
        logits = model(inputs, positions, cache, slot, kv_len=int(positions[0, -1]) + 1)  # [1,T,V]
        last = logits[0, -1]  # [V]
        if temperature == 0.0:
            token = int(last.argmax())
        else:
            probs = torch.softmax(last.float() / temperature, dim=-1)  # [V]
            token = int(torch.multinomial(probs, 1, generator=generator))
        if token in stops:
            break
        output.append(token)
        next_position = int(positions[0, -1]) + 1
        inputs = torch.tensor([[token]], dtype=torch.int64, device=device)  # [1, 1]
        positions = torch.tensor([[next_position]], device=device)  # [1, 1]
    return output


@dataclass(frozen=True)
class SpeculativeCounts:
    """Outputs and acceptance counts of one batched SD run."""

    outputs: list[list[int]]  # output ids per prompt, stop token and overshoot trimmed
    steps: list[int]  # decode steps per prompt
    drafted: list[int]  # draft tokens verified per prompt
    accepted: list[int]  # draft tokens accepted per prompt
    accepted_at_pos: list[int]  # [K] steps whose first i+1 drafts were all accepted
    drafted_at_pos: list[int]  # [K] steps that drafted at least i+1 tokens


def _speculative(
    target: Transformer,
    draft: AnyDraft,
    prompts_ids: list[list[int]],
    config: GenerationConfig,
    stop_ids: Sequence[int],
) -> SpeculativeCounts:
    """All prompts as one batch through the SD engine."""
    k = config.num_spec_tokens
    longest = max(len(ids) for ids in prompts_ids)
    engine = SpecDecodeEngine(
        target,
        draft,
        SpecDecodeConfig(
            num_slots=len(prompts_ids),
            max_model_len=longest + config.max_tokens + 1,
            k_max=k,
            temperature=config.temperature,
            seed=config.seed,
        ),
    )
    slots = np.array([engine.alloc_slot(ids) for ids in prompts_ids], dtype=np.int64)
    first = engine.prefill(slots, np.array([len(ids) for ids in prompts_ids], dtype=np.int64))
    stops = set(stop_ids)
    outputs: list[list[int]] = [[int(token)] for token in first]
    done = [out[-1] in stops or len(out) >= config.max_tokens for out in outputs]
    steps = [0] * len(prompts_ids)
    drafted = [0] * len(prompts_ids)
    accepted = [0] * len(prompts_ids)
    accepted_at_pos = [0] * k
    drafted_at_pos = [0] * k
    while not all(done):
        rows = [row for row in range(len(prompts_ids)) if not done[row]]
        # never draft past max_tokens: the last step may need fewer drafts
        spec = np.array(
            [min(k, config.max_tokens - len(outputs[row]) - 1) for row in rows], dtype=np.int64
        )
        spec = np.maximum(spec, 0)
        result = engine.step(slots[rows], spec)
        for index, row in enumerate(rows):
            num_accepted = int(result.num_accepted[index])
            num_drafted = int(result.num_drafted[index])  # <= K: prompt lookup finds fewer
            steps[row] += 1
            drafted[row] += num_drafted
            accepted[row] += num_accepted
            for pos in range(num_drafted):
                drafted_at_pos[pos] += 1
                accepted_at_pos[pos] += int(pos < num_accepted)
            for token in result.emitted(index).tolist():
                outputs[row].append(int(token))
                if token in stops or len(outputs[row]) >= config.max_tokens:
                    done[row] = True
                    break
    trimmed = []
    for out in outputs:
        cut = next((i for i, token in enumerate(out) if token in stops), len(out))
        trimmed.append(out[: min(cut, config.max_tokens)])
    return SpeculativeCounts(trimmed, steps, drafted, accepted, accepted_at_pos, drafted_at_pos)


def generate_texts(
    pair: ModelPair,
    prompts: Sequence[str],
    config: GenerationConfig,
    tokenizer: TextTokenizer | None = None,
) -> GenerationReport:
    """Generate for each prompt; with the pair's draft, by speculative decoding."""
    if not prompts:
        raise InputError("--prompt: give at least one prompt")
    if tokenizer is None:
        if pair.tokenizer_name is None:
            raise InputError(
                f"{pair.target_spec}: cannot tell the model's tokenizer (only SmolLM2-vocabulary "
                "and byte-level models with real weights are supported)"
            )
        tokenizer = load_tokenizer(pair.tokenizer_name)
    target = pair.target
    param = next(target.parameters())
    chat = config.chat and tokenizer.name == "smollm2"
    prompts_ids = [tokenizer.encode(format_prompt(prompt, chat)) for prompt in prompts]
    for prompt, ids in zip(prompts, prompts_ids, strict=True):
        if not ids:
            raise InputError(f"--prompt {prompt!r}: empty after tokenization")
        if len(ids) + config.max_tokens > target.config.max_position_embeddings:
            raise InputError(
                f"--prompt: {len(ids)} prompt tokens + --max-tokens {config.max_tokens} exceed "
                f"the model's context {target.config.max_position_embeddings}"
            )
    generator = torch.Generator(device=param.device)
    generator.manual_seed(config.seed)
    start_s = time.perf_counter()
    k = config.num_spec_tokens
    if pair.draft is None:
        outputs = [
            generate_plain(
                target,
                ids,
                config.max_tokens,
                tokenizer.stop_ids,
                config.temperature,
                generator,
            )
            for ids in prompts_ids
        ]
        counts = SpeculativeCounts(
            outputs=outputs,
            steps=[len(out) for out in outputs],
            drafted=[0] * len(outputs),
            accepted=[0] * len(outputs),
            accepted_at_pos=[0] * k,
            drafted_at_pos=[0] * k,
        )
    else:
        counts = _speculative(target, pair.draft, prompts_ids, config, tokenizer.stop_ids)
    if param.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed_s = time.perf_counter() - start_s
    results = [
        GenerationResult(
            prompt=prompt,
            text=tokenizer.decode(out),
            output_token_ids=out,
            num_prompt_tokens=len(ids),
            num_steps=counts.steps[row],
            num_drafted=counts.drafted[row],
            num_accepted=counts.accepted[row],
        )
        for row, (prompt, ids, out) in enumerate(
            zip(prompts, prompts_ids, counts.outputs, strict=True)
        )
    ]
    return GenerationReport(
        results=results,
        elapsed_s=elapsed_s,
        num_output_tokens=sum(len(out) for out in counts.outputs),
        accepted_at_pos=counts.accepted_at_pos,
        drafted_at_pos=counts.drafted_at_pos,
    )
