"""Factories for backend tests: tiny real models with a tunable draft, and a mock model.

- `tiny_target()` / `perturbed_copy()`: real `Transformer`s at test shapes. A perturbed copy of
  the target is a draft whose agreement with the target falls as the noise grows (0 noise: it
  always agrees), so tests reach every accept/reject path.
- `shallow_target()`: a target whose last layers barely change the residual stream, so its
  early exit agrees with it often.
- `MockModel`: logits fully controlled by a Python rule of (token, position), nanochat-style, for
  exact engine-logic assertions (which drafts get accepted, what is emitted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dsd.backend.engine import Draft, SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.model import (
    MODEL_CONFIGS,
    ForwardGroup,
    ModelConfig,
    Transformer,
    init_random_,
)
from dsd.backend.pair import ModelPair
from dsd.backend.weights import save_checkpoint
from dsd.backend.zoo import parse_shape

TINY = MODEL_CONFIGS["tiny"]

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's spinning
# makes each op ~1000x slower (16 ms instead of 5 us). Every backend test module imports this.
torch.set_num_threads(1)


def tiny_target(seed: int = 0, config: ModelConfig = TINY) -> Transformer:
    """A tiny random target; std 0.1 keeps logits spread out so argmax has no near-ties."""
    return init_random_(Transformer(config), seed, std=0.1).eval()


def perturbed_copy(model: Transformer, noise_std: float, seed: int) -> Transformer:
    """Same shape and weights plus N(0, noise_std) noise on every matrix."""
    copy = Transformer(model.config)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in copy.named_parameters():
            if not name.endswith("norm.weight"):
                param.add_(torch.randn(param.shape, generator=generator) * noise_std)
    return copy.eval()


def shallow_target(seed: int = 0, num_layers: int = 3, last_scale: float = 0.1) -> Transformer:
    """A target whose layers after the first write little (outputs scaled by last_scale)."""
    config = ModelConfig(**{**_fields(TINY), "num_layers": num_layers, "name": "tiny-shallow"})
    model = tiny_target(seed, config)
    with torch.no_grad():
        for layer in list(model.layers)[1:]:
            layer.self_attn.o_proj.weight.mul_(last_scale)
            layer.mlp.down_proj.weight.mul_(last_scale)
    return model


def _fields(config: ModelConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def make_engine(
    target: nn.Module,
    draft: Draft | None,
    *,
    num_slots: int = 4,
    max_model_len: int = 96,
    k_max: int = 5,
    temperature: float = 0.0,
    seed: int = 0,
) -> SpecDecodeEngine:
    config = SpecDecodeConfig(
        num_slots=num_slots,
        max_model_len=max_model_len,
        k_max=k_max,
        temperature=temperature,
        seed=seed,
    )
    return SpecDecodeEngine(target, draft, config)  # type: ignore[arg-type]


def random_prompt(
    rng: np.random.Generator, length: int, vocab: int = TINY.vocab_size
) -> np.ndarray:
    return rng.integers(3, vocab, size=length, dtype=np.int64)


class MockModel(nn.Module):
    """A "model" whose next-token logits at (token, position) are one-hot on rule(token, pos).

    It also records the (token, position) pairs of every real (non-trash) row it is fed, so
    tests can check what the engine fed and where. Accepts the `Transformer.forward` keywords.
    """

    def __init__(
        self, rule: Callable[[int, int], int], config: ModelConfig = TINY, pads_to: int = 1
    ) -> None:
        super().__init__()
        self.config = config
        self.rule = rule
        self.pads_to = pads_to  # `tokens_worth_computing`: 2..pads_to-1 tokens cost pads_to
        self._anchor = nn.Parameter(torch.zeros(1))  # gives the engine a device and dtype
        self.calls: list[tuple[int, int]] = []  # (batch rows, tokens per row) of each forward

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: object = None,
        slot_ids: torch.Tensor | None = None,
        num_layers: int | None = None,
        kv_len: int | None = None,
        logit_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, width = input_ids.shape
        self.calls.append((batch, width))
        logits = torch.zeros(batch, width, self.config.vocab_size)  # [B, T, V]
        for row in range(batch):
            for col in range(width):
                token = int(input_ids[row, col])
                logits[
                    row, col, self.rule(token, int(positions[row, col])) % self.config.vocab_size
                ] = 10.0
        if logit_indices is not None:
            index = logit_indices[:, :, None].expand(-1, -1, self.config.vocab_size)
            logits = logits.gather(1, index)  # [B, N, V]
        return logits

    def tokens_worth_computing(self, num_tokens: int) -> int:
        """`Transformer.tokens_worth_computing`, as if its kernels padded to `pads_to`."""
        return num_tokens if num_tokens == 1 else max(num_tokens, self.pads_to)

    def forward_groups(
        self, groups: Sequence[ForwardGroup], kv_cache: object = None, num_layers: int | None = None
    ) -> list[torch.Tensor]:
        """`Transformer.forward_groups`: each group as a `forward` of its own (recorded so)."""
        return [
            self(
                g.input_ids,
                g.positions,
                kv_cache,
                g.slot_ids,
                num_layers,
                g.kv_len,
                g.logit_indices,
            )
            for g in groups
        ]


def target_rule(token: int, position: int) -> int:
    """The mock target's next token: a simple deterministic function of (token, position)."""
    return (token * 7 + position * 3 + 1) % 250 + 3


def draft_rule_wrong_at(wrong_positions: set[int]) -> Callable[[int, int], int]:
    """A draft that agrees with `target_rule` except when predicting the token at these positions.

    The token predicted from input at position p lands at position p + 1.
    """

    def rule(token: int, position: int) -> int:
        good = target_rule(token, position)
        return good + 1 if position + 1 in wrong_positions else good

    return rule


def mock_pair(target: Transformer, draft: Draft | None) -> ModelPair:
    """A ModelPair of models built in a test (no tokenizer: synthetic prompt ids)."""
    param = next(target.parameters())
    return ModelPair(
        target_spec="mock-target",
        draft_spec="none" if draft is None else "mock-draft",
        target=target,
        draft=draft,
        tokenizer_name=None,
        dtype=param.dtype,
    )


def byte_checkpoint(tmp_path: Path, name: str, shape: str, seed: int) -> str:
    """A random byte-vocabulary checkpoint folder of a zoo shape (untied head, so that random
    models are not all "repeat the input token")."""
    config = replace(parse_shape(shape, 259, "test"), tie_word_embeddings=False, name=name)
    model = init_random_(Transformer(config), seed=seed, std=0.2)
    save_checkpoint(model, tmp_path / name, tokenizer_name="bytes")
    return str(tmp_path / name)
