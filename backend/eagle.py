"""An EAGLE-1-style draft head: one decoder layer over the target's features.

The head drafts from what the target already computed. At position i it reads the target's
feature f_i (the final norm's output there, `Transformer.forward_groups(features_out=...)`) and
the embedding of the token after it, t_{i+1}, concatenated and projected back to the model width
(`fc`), then runs one decoder layer of the target's shape with its own KV cache. Its output h_i
predicts f_{i+1}: the target's LM head over h_i gives the next draft token, and h_i is fed back as
the feature of the next pass (EAGLE-1). The embeddings and the LM head are the target's (shared,
not copied), so a head file holds `fc`, the layer and, optionally, a **draft vocabulary**: the
ids the head may propose (FR-Spec / EAGLE-3's frequent-token subset), whose rows of the target's
head are gathered once into a small matrix (on CPU SmolLM2's 49k-token head is a fifth of the
model; 8k rows of it are 1/6 of that).

Engine bookkeeping (`backend.engine`, `backend.fast_path`): the engine keeps the target's feature
at every position of every slot (`EagleState.features`, [S, cache_len, hidden]), written by every
target forward (prefill chunks and verification). Head position i needs f_i and t_{i+1}, so
before drafting from a last token at position L the head cache must hold [0, L - 1): the
**catch-up** (`catch_up`, eager, variable width) feeds the lagging positions with the target's
real features. Then `draft_passes` runs K width-1 passes at fixed shape (positions L - 1 ..
L + K - 2, the first from the real f_{L-1}, later ones from the head's own h): no host sync, so
the fast path captures them in its CUDA graphs. After verification only position L - 1 was fed
a real feature, so the head cache keeps [0, L) and the next catch-up re-feeds the accepted
positions with the target's features. Rows at K = 0 do not touch the head (lazy catch-up).

Files: safetensors with `fc.weight`, `layer.*` (our Llama names) and `vocab_map` (int64 draft id
-> target id), metadata `dsd.eagle` (JSON: the target's name and shape). `EagleHead.random` makes
a head at any target's shape (timing at production shapes). Training is `backend.eagle_train`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dsd.backend.kv_cache import KVCache
from dsd.backend.model import (
    DecoderLayer,
    ForwardGroup,
    Linear,
    ModelConfig,
    Transformer,
    init_random_,
    new_kv_cache,
    rope_cos_sin,
    rope_inv_freq,
)
from dsd.backend.ngram import NgramConfig
from dsd.backend.sampling import probs_from_logits, sample_from_probs
from dsd.common.arrays import IntArray
from dsd.common.errors import InputError
from dsd.sim.models.replay import ReplayRecording

EAGLE_METADATA_KEY = "dsd.eagle"
# The head trained for SmolLM2-135M (`dsd zoo train-eagle`), shipped with the package.
SHIPPED_HEADS: dict[str, Path] = {
    "smollm2-135m": Path(__file__).resolve().parent / "data" / "eagle-smollm2-135m.safetensors",
}


class EagleHead(nn.Module):
    """fc(concat(embedding, feature)) -> one decoder layer; see the module docstring."""

    def __init__(
        self,
        target_config: ModelConfig,
        vocab_map: torch.Tensor | None = None,  # [Vd] int64 target ids; None: whole vocabulary
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        # The layer has the target's shape; a 1-layer config sizes its KV cache.
        self.config = replace(target_config, num_layers=1, name=f"eagle:{target_config.name}")
        self.target_config = target_config
        width = target_config.hidden_size
        self.fc = Linear(2 * width, width, device, dtype)
        self.layer = DecoderLayer(self.config, device, dtype)
        self.register_buffer(
            "vocab_map",
            None if vocab_map is None else vocab_map.to(device=device, dtype=torch.int64),
        )
        self.register_buffer("inv_freq", rope_inv_freq(self.config).to(device), persistent=False)
        # The target's LM head rows of the draft vocabulary, gathered by `attach` (not saved).
        self.draft_head: Linear | None = None

    @property
    def draft_vocab_size(self) -> int:
        vocab_map: torch.Tensor | None = self.vocab_map  # type: ignore[assignment]
        return self.target_config.vocab_size if vocab_map is None else int(vocab_map.numel())

    @classmethod
    def random(
        cls, target: Transformer, seed: int, draft_vocab_size: int | None = None
    ) -> EagleHead:
        """A head with random weights at the target's shape (timing); a reduced draft
        vocabulary is the first `draft_vocab_size` ids."""
        param = next(target.parameters())
        vocab_map = None if draft_vocab_size is None else torch.arange(draft_vocab_size)
        head = cls(target.config, vocab_map, device=param.device, dtype=param.dtype)
        return init_random_(head, seed).attach(target)

    def attach(self, target: Transformer) -> EagleHead:
        """Gather the target's head rows of the draft vocabulary (a reduced one only); returns
        self in eval mode with its CPU kernels prepared where the target has them."""
        vocab_map: torch.Tensor | None = self.vocab_map  # type: ignore[assignment]
        param = next(target.parameters())
        if vocab_map is not None:
            full = (
                target.lm_head.weight if target.lm_head is not None else target.embed_tokens.weight
            )
            self.draft_head = Linear(
                self.config.hidden_size, int(vocab_map.numel()), param.device, param.dtype
            )
            with torch.no_grad():
                self.draft_head.weight.copy_(full.detach()[vocab_map])
            self.draft_head.weight.requires_grad_(False)
        self.eval()
        if target.cpu_kernels:
            _prepare_cpu_kernels(self, target.native_kernels)
        return self

    def logits(self, target: Transformer, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the draft vocabulary at head outputs [..., hidden]."""
        if self.draft_head is None:
            return target.project(hidden)
        logits: torch.Tensor = self.draft_head(hidden).float()
        return logits

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        vocab_map: torch.Tensor | None = self.vocab_map  # type: ignore[assignment]
        return draft_ids if vocab_map is None else vocab_map[draft_ids]

    def forward(
        self,
        features: torch.Tensor,  # [B, T, hidden] f_i
        embeds: torch.Tensor,  # [B, T, hidden] embedding of t_{i+1}
        group: ForwardGroup,  # input_ids t_{i+1} [B, T], positions i, slots, kv_len
        cache: KVCache | None,
    ) -> torch.Tensor:
        """Head outputs h_i [B, T, hidden]; with a cache, writes its K/V at the positions."""
        batch, num_tokens = group.input_ids.shape
        x = self.fc(torch.cat((embeds, features), dim=-1)).reshape(batch * num_tokens, -1)
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        rope = rope_cos_sin(inv_freq, group.positions, x.dtype)
        layer = self.layer
        cache_k = None if cache is None else cache.k[0]
        cache_v = None if cache is None else cache.v[0]
        x = x + layer.self_attn(layer.input_layernorm(x), [group], [rope], cache_k, cache_v)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        out: torch.Tensor = x.view(batch, num_tokens, -1)
        return out


def _prepare_cpu_kernels(head: EagleHead, native: bool) -> None:
    """The head's linears on the same CPU kernels as the target's (`CpuKernels`)."""
    from dsd.backend.model import CpuKernels
    from dsd.backend.native import rows_matmul

    product = rows_matmul() if native else None
    for module in head.modules():
        if isinstance(module, Linear) and module.weight.dtype == torch.float32:
            module.kernels = CpuKernels(module.weight, product)


@dataclass(frozen=True)
class EagleDraft:
    """An EAGLE head and the target whose features, embeddings and LM head it uses."""

    head: EagleHead
    target: Transformer

    def __post_init__(self) -> None:
        if self.head.target_config.hidden_size != self.target.config.hidden_size or (
            self.head.target_config.vocab_size != self.target.config.vocab_size
        ):
            raise InputError(
                f"eagle head: made for width {self.head.target_config.hidden_size} and "
                f"{self.head.target_config.vocab_size} tokens, the target has "
                f"{self.target.config.hidden_size} and {self.target.config.vocab_size}"
            )


@dataclass(frozen=True)
class EagleOrLookup:
    """Per row and step, prompt lookup's drafts where it finds all K of them, else the head's
    (`--draft eagle+ngram[:MIN-MAX]`): a request that copies its input drafts by lookup, others by
    the head, under the same per-row K. The head runs for every drafting row either way, so its
    cache bookkeeping is the plain head's."""

    eagle: EagleDraft
    lookup: NgramConfig


@dataclass
class EagleState:
    """What the engine keeps for an EAGLE draft: the target's features and the head's cache."""

    features: torch.Tensor  # [S, cache_len, hidden] the target's feature at each position
    cache: KVCache  # the head's one-layer cache; its lengths are what it holds per slot

    @classmethod
    def new(cls, draft: EagleDraft, num_slots: int, cache_len: int) -> EagleState:
        param = next(draft.target.parameters())
        features = torch.zeros(
            (num_slots, cache_len, draft.target.config.hidden_size),
            device=param.device,
            dtype=param.dtype,
        )
        cache = new_kv_cache(
            draft.head.config, num_slots, cache_len, device=param.device, dtype=param.dtype
        )
        return cls(features, cache)

    def store(self, groups: list[ForwardGroup], features: list[torch.Tensor]) -> None:
        """Keep the features a target forward computed (padding lands on the trash position)."""
        for group, block in zip(groups, features, strict=True):
            assert group.slot_ids is not None
            self.features[group.slot_ids[:, None], group.positions] = block


def catch_up(
    draft: EagleDraft,
    state: EagleState,
    token_ids: IntArray,  # [S, cache_len] the engine's known tokens per slot
    slots: IntArray,  # [R]
    upto: IntArray,  # [R] the head cache holds [0, upto) afterwards
    trash_position: int,
) -> None:
    """Feed each slot's lagging head positions [cache length, upto) with the target's real
    features (one eager forward; rows already there are left out)."""
    cache = state.cache
    start = cache.lengths[slots]
    behind = start < upto
    if not behind.any():
        return
    slots, start, end = slots[behind], start[behind], upto[behind]
    device = state.features.device
    width = int((end - start).max())
    offsets = np.arange(width)[None, :]  # [1, W]
    is_real = offsets < (end - start)[:, None]  # [R, W]
    positions = np.where(is_real, start[:, None] + offsets, trash_position)  # [R, W]
    next_tokens = token_ids[slots[:, None], np.where(is_real, positions + 1, 0)]  # t_{i+1}
    slots_t = torch.from_numpy(slots).to(device)
    positions_t = torch.from_numpy(positions).to(device)
    tokens_t = torch.from_numpy(next_tokens).to(device)
    group = ForwardGroup(tokens_t, positions_t, slots_t, kv_len=int(end.max()))
    features = state.features[slots_t[:, None], positions_t]  # [R, W, hidden]
    draft.head(features, draft.target.embed_tokens(tokens_t), group, cache)
    cache.lengths[slots] = end


def draft_passes(
    draft: EagleDraft,
    state: EagleState,
    slots: torch.Tensor,  # [B] int64
    last_tokens: torch.Tensor,  # [B] t_L
    lengths: torch.Tensor,  # [B] L; rows that do not draft may be anything
    drafting: torch.Tensor,  # [B] bool: rows that draft (others write only at the trash)
    num_passes: int,  # K >= 1
    kv_len: int,  # > L + K - 2 for every drafting row
    trash_position: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K head passes from each row's last token -> (draft ids [B, K] in the target's
    vocabulary, q [B, K, V] over the whole vocabulary when sampling, else None).

    The head cache of every drafting row must hold [0, L - 1) (`catch_up`). Fixed shapes and
    no host sync (greedy), so the fast path captures it in a CUDA graph."""
    head, target = draft.head, draft.target
    trash = torch.full_like(lengths, trash_position)
    position = torch.where(drafting, lengths - 1, trash)  # [B]
    read_at = torch.clamp(lengths - 1, min=0)
    feature = state.features[slots, read_at]  # [B, hidden] the real f_{L-1}
    token = last_tokens  # [B]
    drafted: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    for _ in range(num_passes):
        group = ForwardGroup(token[:, None], position[:, None], slots, kv_len=kv_len)
        hidden = head(feature[:, None], target.embed_tokens(token)[:, None], group, state.cache)
        logits = head.logits(target, hidden[:, 0])  # [B, Vd]
        if temperature == 0.0:
            choice = logits.argmax(dim=-1)  # [B]
        else:
            q = probs_from_logits(logits, temperature)  # [B, Vd]
            choice = sample_from_probs(q, generator)
            probs.append(_full_vocab(head, q))
        token = head.to_target_ids(choice)
        drafted.append(token)
        feature = hidden[:, 0]
        position = torch.where(drafting, position + 1, trash)
    return torch.stack(drafted, dim=1), (torch.stack(probs, dim=1) if probs else None)


def _full_vocab(head: EagleHead, q: torch.Tensor) -> torch.Tensor:
    """q [B, Vd] over the draft vocabulary -> [B, V] (zero outside it)."""
    vocab_map: torch.Tensor | None = head.vocab_map  # type: ignore[assignment]
    if vocab_map is None:
        return q
    full = q.new_zeros((q.shape[0], head.target_config.vocab_size))
    return full.index_copy(1, vocab_map, q)


@torch.inference_mode()
def eagle_recording(
    draft: EagleDraft,
    prompt_ids: Sequence[IntArray],
    output_ids: Sequence[IntArray],
    cap: int,
    categories: Sequence[str | None] | None = None,
    metadata: dict[str, Any] | None = None,
) -> ReplayRecording:
    """The replay recording (`sim.models.replay`) of a greedy run with this head.

    Greedy drafts are a function of the prefix alone (after the catch-up the head cache holds
    the target's real features for [0, L - 1), whatever came before), so at each output
    position the head's passes from that prefix are the engine's drafts there: available = cap,
    matched = passes until the first that differs from the recorded outputs (run one at a time,
    stopping there). One cache-free target forward per request gives its features."""
    head, target = draft.head, draft.target
    param = next(target.parameters())
    available: list[IntArray] = []
    matched: list[IntArray] = []
    slot = torch.zeros(1, dtype=torch.int64, device=param.device)
    for prompt, output in zip(prompt_ids, output_ids, strict=True):
        tokens = np.concatenate((np.asarray(prompt), np.asarray(output))).astype(np.int64)
        total, num_prompt = tokens.size, len(prompt)
        cache_len = total + cap + 2
        state = EagleState(
            torch.zeros(
                (1, cache_len, target.config.hidden_size), device=param.device, dtype=param.dtype
            ),
            new_kv_cache(head.config, 1, cache_len, device=param.device, dtype=param.dtype),
        )
        known = torch.from_numpy(tokens).to(param.device)
        features: list[torch.Tensor] = []
        group = ForwardGroup(known[None], torch.arange(total, device=param.device)[None])
        target.forward_groups([group], None, features_out=features)
        state.features[0, :total] = features[0][0]
        token_ids = np.zeros((1, cache_len), dtype=np.int64)
        token_ids[0, :total] = tokens
        trash = cache_len - 1
        catch_up(draft, state, token_ids, np.zeros(1, np.int64), np.array([total - 1]), trash)
        request = np.zeros(len(output), dtype=np.int64)
        for index in range(len(output)):
            last = num_prompt + index - 1  # L: the context's last token
            if last < 1:
                continue
            feature, token, position, runs = (
                state.features[0, last - 1][None],
                known[last],
                last - 1,
                0,
            )
            while request[index] < cap:
                runs += 1
                step = ForwardGroup(
                    token.view(1, 1),
                    torch.tensor([[position]], device=param.device),
                    slot,
                    kv_len=position + 1,
                )
                hidden = head(
                    feature[:, None], target.embed_tokens(token).view(1, 1, -1), step, state.cache
                )
                proposed = head.to_target_ids(head.logits(target, hidden[:, 0]).argmax(dim=-1))[0]
                if index + request[index] >= len(output) or int(proposed) != int(
                    output[index + request[index]]
                ):
                    break
                request[index] += 1
                feature, token, position = hidden[:, 0], proposed, position + 1
            # passes after the first overwrote real K/V at L .. L + runs - 2: feed them again
            state.cache.lengths[0] = last
            upto = np.array([min(last + runs - 1, total - 1)])
            catch_up(draft, state, token_ids, np.zeros(1, np.int64), upto, trash)
            state.cache.lengths[0] = total - 1
        available.append(np.full(len(output), cap, dtype=np.int64))
        matched.append(request)
    return ReplayRecording(
        available=tuple(available),
        matched=tuple(matched),
        categories=tuple(categories) if categories is not None else (None,) * len(available),
        source="eagle replay",
        cap=cap,
        in_request_order=True,
        metadata=dict(metadata or {}),
    )


# ----------------------------------------------------------------------------- files
def save_head(head: EagleHead, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the head (not the target's shared parts) as safetensors, atomically."""
    from safetensors.torch import save

    from dsd.common.atomic import atomic_write_bytes

    tensors = {
        name: (value.detach().to("cpu", dtype) if value.is_floating_point() else value.cpu())
        .contiguous()
        .clone()
        for name, value in head.state_dict().items()
        if not name.startswith("draft_head.")
    }
    shape = head.target_config
    meta = {
        "target": shape.name,
        "hidden_size": shape.hidden_size,
        "vocab_size": shape.vocab_size,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "intermediate_size": shape.intermediate_size,
    }
    path = Path(path)
    atomic_write_bytes(path, save(tensors, metadata={EAGLE_METADATA_KEY: json.dumps(meta)}))
    return path


def load_head(path: str | Path, target: Transformer) -> EagleHead:
    """A head file for `target` (checked against its shape), on its device and dtype."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise InputError(f"eagle head {path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta_text = (handle.metadata() or {}).get(EAGLE_METADATA_KEY)
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as exc:
        raise InputError(f"eagle head {path}: unreadable ({exc})") from None
    if meta_text is None:
        raise InputError(f"eagle head {path}: not an EAGLE head file (no {EAGLE_METADATA_KEY})")
    meta = json.loads(meta_text)
    config = target.config
    for key in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "intermediate_size"):
        if meta.get(key) != getattr(config, key):
            raise InputError(
                f"eagle head {path}: made for {key} {meta.get(key)}, the target has "
                f"{getattr(config, key)}"
            )
    param = next(target.parameters())
    head = EagleHead(config, tensors.get("vocab_map"), device=param.device, dtype=param.dtype)
    missing, unexpected = head.load_state_dict(
        {k: v.to(param.device) for k, v in tensors.items()}, strict=False
    )
    if missing or unexpected:
        raise InputError(
            f"eagle head {path}: tensors do not match (missing {missing}, unexpected {unexpected})"
        )
    return head.attach(target)
