"""The speculative-decoding step for a whole batch: draft, verify, accept, roll back.

`SpecDecodeEngine` owns a static KV cache for the target and one for the draft, a token buffer
per slot, and the slots (continuous batching: `alloc_slot` / `free_slot`); `step` runs one SD
step over chosen slots with per-row K, `prefill` their prompt chunks, `step_with_prefill` both
in one target forward (vLLM's mixed batch). Drafts: `Draft` (a small model or an early exit of
the target), `EagleDraft` (`backend.eagle`), `NgramDraft` (prompt lookup, `backend.ngram`).
Under drawn acceptance (`SpecDecodeConfig.drawn_acceptance`) each row accepts a count drawn by
the simulator's model and the tokens mean nothing. docs/backend.md ("One SD step") has the
step, the per-slot invariant, the trash position and the draft kinds. The engine knows nothing
of requests, schedulers, tokenizers or wall time (`backend.executor` does); this is the
reference (eager) step, which `backend.fast_path` subclasses with fixed shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dsd.backend.eagle import EagleDraft, EagleOrLookup, EagleState, catch_up, draft_passes
from dsd.backend.kv_cache import KVCache
from dsd.backend.model import ForwardGroup, Transformer, new_kv_cache
from dsd.backend.ngram import NgramConfig, propose_ngram_rows
from dsd.backend.sampling import (
    PLACEHOLDER_TOKEN_ID,
    drawn_accept,
    greedy_accept,
    probs_from_logits,
    rejection_sample,
    sample_from_probs,
    sample_tokens,
)
from dsd.common.arrays import BoolArray, IntArray
from dsd.sim.models.latency import verify_width
from dsd.sim.models.shapes import engine_cache_len


@dataclass(frozen=True)
class Draft:
    """Which network drafts: a separate model, or the target cut after `num_layers` layers."""

    model: Transformer  # the draft network (the target itself for an early exit)
    num_layers: int | None = None  # early-exit depth k; None: all layers of `model`

    def __post_init__(self) -> None:
        if self.num_layers is not None and not 1 <= self.num_layers <= self.model.config.num_layers:
            raise ValueError(
                f"early-exit depth must be in [1, {self.model.config.num_layers}], "
                f"got {self.num_layers}"
            )

    @classmethod
    def early_exit(cls, target: Transformer, num_layers: int) -> Draft:
        """The target's first `num_layers` layers + final norm + head."""
        return cls(model=target, num_layers=num_layers)

    @property
    def depth(self) -> int:
        return self.model.config.num_layers if self.num_layers is None else self.num_layers


@dataclass(frozen=True)
class NgramDraft:
    """Drafts by prompt lookup in the row's own tokens (vLLM's `ngram` method)."""

    config: NgramConfig  # prompt_lookup_min / prompt_lookup_max


AnyDraft = Draft | NgramDraft | EagleDraft | EagleOrLookup


@dataclass(frozen=True)
class SpecDecodeConfig:
    """Capacity and sampling of one engine."""

    num_slots: int  # requests that can hold KV at once (max_num_seqs); >= 1
    max_model_len: int  # longest sequence a slot holds (prompt + output tokens); >= 2
    k_max: int  # largest K a step may ask for; >= 0
    temperature: float = 0.0  # 0: greedy match; > 0: rejection sampling at this temperature
    seed: int = 0  # seeds the engine's torch.Generator (drafting and acceptance draws)
    # every step is given each row's accepted count, drawn before it (module docstring)
    drawn_acceptance: bool = False

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {self.k_max}")
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.drawn_acceptance and self.temperature != 0.0:
            raise ValueError("drawn acceptance is greedy only (temperature 0)")

    @property
    def cache_len(self) -> int:
        """Positions per slot: room for max_model_len + one step's drafts, plus the trash one."""
        return engine_cache_len(self.max_model_len, self.k_max)


def empty_step_result() -> StepResult:
    """What a step over no rows produced."""
    return StepResult(np.zeros(0, np.int64), np.zeros((0, 1), np.int64), np.zeros(0, np.int64))


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one SD step produced, on the host."""

    num_accepted: IntArray  # [B] accepted drafts per row, 0 <= a <= num_drafted
    output_token_ids: IntArray  # [B, max K + 1] emitted ids; entries past a + 1 are -1
    num_drafted: IntArray  # [B] drafts each row verified, <= its K (n-gram: what was found)

    def emitted(self, row: int) -> IntArray:
        """The a + 1 output tokens of one row."""
        return self.output_token_ids[row, : int(self.num_accepted[row]) + 1]


@dataclass(frozen=True)
class PrefillSpan:
    """The checked chunks of one prefill: which slots, up to where, and their forward group."""

    slots: IntArray  # [P]
    end: IntArray  # [P] cache length after the chunk
    completes: BoolArray  # [P] the chunk reaches the last known token
    group: ForwardGroup  # the chunks as a target forward group (logits at each row's last token)


class SpecDecodeEngine:
    """Batched speculative decoding over slots. See the module docstring for the step."""

    def __init__(
        self, target: Transformer, draft: AnyDraft | None, config: SpecDecodeConfig
    ) -> None:
        model_draft = draft if isinstance(draft, Draft) else None
        if (
            model_draft is not None
            and model_draft.model.config.vocab_size != target.config.vocab_size
        ):
            raise ValueError(
                f"draft vocabulary ({model_draft.model.config.vocab_size}) differs from the "
                f"target's ({target.config.vocab_size})"
            )
        if config.k_max > 0 and draft is None:
            raise ValueError("k_max > 0 needs a draft")
        if config.drawn_acceptance and isinstance(draft, NgramDraft):
            raise ValueError(
                "drawn acceptance needs a drafter that drafts its K (a model or an EAGLE head), "
                "not prompt lookup"
            )
        eagle = draft.eagle if isinstance(draft, EagleOrLookup) else draft
        self.eagle_draft = eagle if isinstance(eagle, EagleDraft) else None  # the head, if any
        if self.eagle_draft is not None and self.eagle_draft.target is not target:
            raise ValueError("an EAGLE draft must be built on this engine's target")
        self.target = target
        self.draft = draft
        self.model_draft = model_draft  # the draft network, when the draft is one
        self.config = config
        param = next(target.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        self.target_cache = new_kv_cache(
            target.config, config.num_slots, config.cache_len, device=self.device, dtype=self.dtype
        )
        self.draft_cache: KVCache | None = None
        if model_draft is not None:
            draft_dtype = next(model_draft.model.parameters()).dtype
            self.draft_cache = new_kv_cache(
                model_draft.model.config,
                config.num_slots,
                config.cache_len,
                num_layers=model_draft.depth,
                device=self.device,
                dtype=draft_dtype,
            )
        self.eagle: EagleState | None = None
        if self.eagle_draft is not None:
            self.eagle = EagleState.new(self.eagle_draft, config.num_slots, config.cache_len)
            self.draft_cache = self.eagle.cache
        self.trash_position = config.cache_len - 1
        # Known tokens per slot (prompt, then output tokens), host side.
        self.token_ids: IntArray = np.zeros((config.num_slots, config.cache_len), dtype=np.int64)
        self.num_tokens: IntArray = np.zeros(config.num_slots, dtype=np.int64)  # [S]
        self._free_slots: list[int] = list(range(config.num_slots))  # ascending: lowest first
        self._in_use = np.zeros(config.num_slots, dtype=bool)  # [S]

    # ----------------------------------------------------------------------------- slots
    def alloc_slot(self, token_ids: IntArray | list[int]) -> int:
        """Take the lowest free slot for a sequence whose known tokens are `token_ids` (>= 1)."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size < 1:
            raise ValueError("a sequence needs at least one token")
        if tokens.size > self.config.max_model_len:
            raise ValueError(
                f"{tokens.size} tokens exceed max_model_len {self.config.max_model_len}"
            )
        if not self._free_slots:
            raise RuntimeError(f"all {self.config.num_slots} slots are in use")
        slot = self._free_slots.pop(0)
        self._in_use[slot] = True
        self.token_ids[slot, : tokens.size] = tokens
        self.num_tokens[slot] = tokens.size
        self.target_cache.reset(slot)
        if self.draft_cache is not None:
            self.draft_cache.reset(slot)
        return slot

    def free_slot(self, slot: int) -> IntArray:
        """Release a slot; returns a copy of its known tokens (for recompute after preemption)."""
        self._check_in_use(np.array([slot]))
        tokens = self.token_ids[slot, : self.num_tokens[slot]].copy()
        self._in_use[slot] = False
        self.num_tokens[slot] = 0
        self.target_cache.reset(slot)
        if self.draft_cache is not None:
            self.draft_cache.reset(slot)
        self._free_slots.append(slot)
        self._free_slots.sort()
        return tokens

    def sequence(self, slot: int) -> IntArray:
        """The slot's known tokens (a view; do not modify)."""
        return self.token_ids[slot, : self.num_tokens[slot]]

    def is_decoding(self, slot: int) -> bool:
        """True when the prompt is in the cache and the slot's next work is an SD step."""
        return bool(self.target_cache.lengths[slot] == self.num_tokens[slot] - 1)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    # ----------------------------------------------------------------------------- prefill
    @torch.inference_mode()
    def prefill(self, slot_ids: IntArray, num_chunk_tokens: IntArray) -> IntArray:
        """Put the next chunk of each slot's known tokens into the caches.

        Row i computes `num_chunk_tokens[i]` tokens starting at the slot's cache length (clipped
        to the known tokens). A row whose chunk reaches the last known token samples the next
        token (appended to the slot); returns [P] those ids, -1 for rows still prefilling.
        """
        span = self._prefill_span(slot_ids, num_chunk_tokens)
        if span is None:
            return np.zeros(0, dtype=np.int64)
        logits = self._target_forward([span.group])[0][:, 0]  # [P, V]
        return self._finish_prefill(span, logits)

    def _prefill_span(self, slot_ids: IntArray, num_chunk_tokens: IntArray) -> PrefillSpan | None:
        """The checked chunks of a prefill and their target forward group; None if no rows."""
        slots = np.asarray(slot_ids, dtype=np.int64)
        chunks = np.asarray(num_chunk_tokens, dtype=np.int64)
        if slots.size == 0:
            return None
        self._check_in_use(slots)
        if (chunks < 1).any():
            raise ValueError(f"prefill chunks must be >= 1 token, got {chunks.tolist()}")
        start = self.target_cache.lengths[slots]  # [P]
        known = self.num_tokens[slots]  # [P]
        if (start >= known).any():
            raise ValueError("prefill of a slot whose known tokens are all in the cache")
        end = np.minimum(start + chunks, known)  # [P]
        group = self._span_group(slots, start, end, need_logits=True)
        return PrefillSpan(slots=slots, end=end, completes=end == known, group=group)

    def _finish_prefill(self, span: PrefillSpan, logits: torch.Tensor) -> IntArray:
        """After the target forward of `span` (logits [P, V] of each row's last token): advance
        the target cache, fill the draft's, sample first tokens -> [P] ids, -1 if unfinished."""
        slots, end = span.slots, span.end
        self.target_cache.lengths[slots] = end
        if self.model_draft is not None and self.draft_cache is not None:
            # The draft covers the same span; it starts where its cache ends (catching up if it
            # lagged), so after prefill both caches hold [0, end).
            self._forward_span(
                self.model_draft.model,
                self.model_draft.num_layers,
                self.draft_cache,
                slots,
                self.draft_cache.lengths[slots],
                end,
                need_logits=False,
            )
            self.draft_cache.lengths[slots] = end

        next_ids = sample_tokens(logits, self.config.temperature, self.generator)  # [P]
        next_host = next_ids.cpu().numpy().astype(np.int64)  # the one host sync of the prefill
        first_tokens = np.where(span.completes, next_host, PLACEHOLDER_TOKEN_ID)  # [P]
        for row in np.flatnonzero(span.completes):
            self._append(int(slots[row]), first_tokens[row : row + 1])
        return first_tokens

    # ----------------------------------------------------------------------------- SD step
    @torch.inference_mode()
    def step(
        self,
        slot_ids: IntArray,
        num_spec_tokens: IntArray,
        num_accepted: IntArray | None = None,
    ) -> StepResult:
        """One SD step for decoding slots with per-row K (K may differ per row and per step);
        `num_accepted` [B]: each row's drawn accepted count (drawn acceptance only)."""
        checked = self._checked_step_inputs(slot_ids, num_spec_tokens, num_accepted)
        if checked is None:
            return empty_step_result()
        return self._run_step(*checked)[0]

    @torch.inference_mode()
    def step_with_prefill(
        self,
        slot_ids: IntArray,
        num_spec_tokens: IntArray,
        prefill_slot_ids: IntArray,
        num_chunk_tokens: IntArray,
        num_accepted: IntArray | None = None,
    ) -> tuple[StepResult, IntArray]:
        """`step` for the decoding slots and `prefill` for the prefilling ones, with ONE target
        forward for both (vLLM's mixed batch): the verify block and the prefill chunks are two
        groups of `Transformer.forward_groups`, so the weights are read once and no decode row
        is padded to a chunk's length. Same results as `step` then `prefill`."""
        if np.intersect1d(slot_ids, prefill_slot_ids).size:
            raise ValueError("a slot both decodes and prefills in one step")
        checked = self._checked_step_inputs(slot_ids, num_spec_tokens, num_accepted)
        if checked is None:
            return empty_step_result(), self.prefill(prefill_slot_ids, num_chunk_tokens)
        span = self._prefill_span(prefill_slot_ids, num_chunk_tokens)
        if span is None:
            return self._run_step(*checked)[0], np.zeros(0, dtype=np.int64)
        result, prefill_logits = self._run_step(*checked, prefill=span)
        assert prefill_logits is not None
        return result, self._finish_prefill(span, prefill_logits)

    def _run_step(
        self,
        slots: IntArray,
        spec: IntArray,
        lengths: IntArray,
        k_step: int,
        drawn: IntArray | None,
        prefill: PrefillSpan | None = None,
    ) -> tuple[StepResult, torch.Tensor | None]:
        """The reference step on checked inputs (the fast path overrides it); with `prefill`,
        its chunks run in the verify forward -> (result, their last tokens' logits [P, V]);
        `drawn` [B]: the accepted counts under drawn acceptance (None: matched)."""
        num_rows = slots.size
        device = self.device
        last_tokens = self.token_ids[slots, lengths]  # [B]

        if isinstance(self.draft, NgramDraft) and k_step > 0:
            # Prompt lookup drafts what it finds: rows verify only their found drafts.
            spec, k_step, found_ids = self._lookup_drafts(slots, spec, lengths)
            draft_ids = torch.from_numpy(found_ids).to(device)  # [B, K']
            draft_probs = None  # one-hot q: set below if sampling
        else:
            draft_ids = torch.zeros((num_rows, k_step), dtype=torch.int64, device=device)  # [B,K]
            draft_probs = None
        drafting_rows = np.flatnonzero(spec > 0)  # host: which rows draft at all
        if k_step > 0 and self.model_draft is not None:
            drafted, probs = self._draft(slots[drafting_rows], lengths[drafting_rows], k_step)
            rows_t = torch.from_numpy(drafting_rows).to(device)
            draft_ids[rows_t] = drafted  # [R, K] into [B, K]
            if probs is not None:
                vocab = probs.shape[-1]
                # Rows that do not draft get a uniform q; they are masked anyway (K_row = 0).
                draft_probs = torch.full((num_rows, k_step, vocab), 1.0 / vocab, device=device)
                draft_probs[rows_t] = probs  # [B, K, V]
        elif k_step > 0 and self.eagle_draft is not None:
            draft_ids, draft_probs = self._draft_eagle(slots, spec, lengths, k_step)
            if isinstance(self.draft, EagleOrLookup):
                found = self._full_lookups(slots, spec, lengths)  # [B, K], -1: the head's
                use = torch.from_numpy(found[:, :1] >= 0).to(device)  # [B, 1]
                lookup_ids = torch.from_numpy(found).to(device)
                draft_ids = torch.where(use, lookup_ids, draft_ids)
                if draft_probs is not None:  # a lookup row's q is one-hot
                    one_hot = torch.nn.functional.one_hot(
                        lookup_ids.clamp(min=0), draft_probs.shape[-1]
                    )
                    draft_probs = torch.where(
                        use[:, :, None], one_hot.to(draft_probs.dtype), draft_probs
                    )

        # Verify: the last token then the drafts, at positions L..L+K; pads go to the trash.
        width = self._verify_width(num_rows, k_step, prefill is not None)  # W >= K + 1
        offsets = np.arange(width)[None, :]  # [1, W]
        positions = lengths[:, None] + offsets  # [B, W]
        positions = np.where(offsets <= spec[:, None], positions, self.trash_position)
        pad_ids = torch.zeros((num_rows, width - k_step - 1), dtype=torch.int64, device=device)
        inputs = torch.cat(
            (torch.from_numpy(last_tokens).to(device)[:, None], draft_ids, pad_ids), dim=1
        )  # [B, W]
        verify = ForwardGroup(
            inputs,
            torch.from_numpy(positions).to(device),
            torch.from_numpy(slots).to(device),
            kv_len=int((lengths + spec).max()) + 1,
        )
        groups = [verify] if prefill is None else [verify, prefill.group]
        logits = self._target_forward(groups)
        target_logits = logits[0][:, : k_step + 1]  # [B, K+1, V]
        prefill_logits = None if prefill is None else logits[1][:, 0]  # [P, V]
        spec_t = torch.from_numpy(spec).to(device)  # [B]
        if drawn is not None:
            drawn_t = torch.from_numpy(drawn).to(device)  # [B]
            accepted_t, output_t = drawn_accept(draft_ids, target_logits, drawn_t)
        elif self.config.temperature == 0.0:
            accepted_t, output_t = greedy_accept(draft_ids, target_logits, spec_t)
        else:
            target_probs = probs_from_logits(target_logits, self.config.temperature)  # [B,K+1,V]
            if draft_probs is None:  # deterministic drafts (n-gram) or none: a one-hot q
                draft_probs = torch.nn.functional.one_hot(draft_ids, target_probs.shape[-1]).to(
                    target_probs.dtype
                )  # [B, K, V]
            accepted_t, output_t = rejection_sample(
                draft_ids, draft_probs, target_probs, spec_t, self.generator
            )
        # The step's one host sync: accepted counts and emitted ids.
        num_accepted = accepted_t.cpu().numpy().astype(np.int64)  # [B]
        output_ids = output_t.cpu().numpy().astype(np.int64)  # [B, K+1]

        result = self._roll_back(
            slots, lengths, drafting_rows, k_step, num_accepted, output_ids, spec
        )
        return result, prefill_logits

    def _verify_width(self, num_rows: int, k_step: int, with_prefill: bool) -> int:
        """Tokens per row of the verify forward: K + 1, widened with trash tokens to what the
        target's kernels would pad the forward to anyway (2 or 3 tokens on CPU: one padding
        here is cheaper than one per linear layer). A step with prefill chunks has tokens
        enough."""
        tokens = num_rows * (k_step + 1)
        worth = tokens if with_prefill else self.target.tokens_worth_computing(tokens)
        return verify_width(num_rows, k_step, worth)

    def _lookup_drafts(
        self, slots: IntArray, spec: IntArray, lengths: IntArray
    ) -> tuple[IntArray, int, IntArray]:
        """(drafts found per row <= K, the widest, [B, widest] draft ids on the host) by prompt
        lookup in each row's known tokens [0, L] (its last token included)."""
        assert isinstance(self.draft, NgramDraft)
        rows = [
            self.token_ids[slot, : length + 1] for slot, length in zip(slots, lengths, strict=True)
        ]
        drafts, found = propose_ngram_rows(
            rows, spec, self.draft.config, self.config.max_model_len
        )  # [B, K], [B]
        k_found = int(found.max(initial=0))
        return found, k_found, drafts[:, :k_found].copy()  # [B], K', [B, K']

    def _full_lookups(self, slots: IntArray, spec: IntArray, lengths: IntArray) -> IntArray:
        """[B, K] prompt lookup's drafts of the rows where it found all K (K > 0), -1 elsewhere."""
        assert isinstance(self.draft, EagleOrLookup)
        rows = [
            self.token_ids[slot, : length + 1] for slot, length in zip(slots, lengths, strict=True)
        ]
        drafts, found = propose_ngram_rows(rows, spec, self.draft.lookup, self.config.max_model_len)
        full = (found >= spec) & (spec > 0)  # [B]
        return np.where(full[:, None], drafts, -1)

    def _roll_back(
        self,
        slots: IntArray,
        lengths: IntArray,
        drafting_rows: IntArray,
        k_step: int,
        num_accepted: IntArray,
        output_ids: IntArray,
        num_drafted: IntArray,
    ) -> StepResult:
        """Keep what the step accepted (the reference and the fast step end here): the target
        keeps the last token and the accepted drafts; the emitted tokens are appended."""
        self.target_cache.lengths[slots] = lengths + num_accepted + 1  # [B]
        if self.eagle is not None and drafting_rows.size:
            # Only position L - 1 was fed a real feature: the catch-up re-feeds the rest.
            self.eagle.cache.lengths[slots[drafting_rows]] = lengths[drafting_rows]
        elif self.draft_cache is not None and drafting_rows.size:
            # The draft fed the last token (pos L) and drafts 1..K-1 (pos L+1..L+K-1); those
            # are real tokens up to the accepted ones.
            rows = drafting_rows
            valid = lengths[rows] + 1 + np.minimum(num_accepted[rows], k_step - 1)
            self.draft_cache.lengths[slots[rows]] = valid
        for row in range(slots.size):
            self._append(int(slots[row]), output_ids[row, : num_accepted[row] + 1])
        return StepResult(
            num_accepted=num_accepted, output_token_ids=output_ids, num_drafted=num_drafted
        )

    # ----------------------------------------------------------------------------- internals
    def _target_forward(self, groups: list[ForwardGroup]) -> list[torch.Tensor]:
        """The target's forward of `groups` (logits per group); with an EAGLE draft its features
        are kept for the head."""
        if self.eagle is None:
            return self.target.forward_groups(groups, self.target_cache)
        features: list[torch.Tensor] = []
        logits = self.target.forward_groups(groups, self.target_cache, features_out=features)
        self.eagle.store(groups, features)
        return logits

    def _catch_up_eagle(self, slots: IntArray, lengths: IntArray) -> None:
        """The head's lagging positions of drafting rows fed, so its cache holds [0, L - 1)."""
        assert self.eagle_draft is not None and self.eagle is not None
        catch_up(
            self.eagle_draft, self.eagle, self.token_ids, slots, lengths - 1, self.trash_position
        )

    def _draft_eagle(
        self, slots: IntArray, spec: IntArray, lengths: IntArray, k_step: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K EAGLE head passes for the rows with K > 0 -> ([B, K] ids, q or None)."""
        assert self.eagle_draft is not None and self.eagle is not None
        drafting = spec > 0
        self._catch_up_eagle(slots[drafting], lengths[drafting])
        device = self.device
        return draft_passes(
            self.eagle_draft,
            self.eagle,
            torch.from_numpy(slots).to(device),
            torch.from_numpy(self.token_ids[slots, lengths]).to(device),
            torch.from_numpy(lengths).to(device),
            torch.from_numpy(drafting).to(device),
            k_step,
            kv_len=int(lengths.max()) + k_step,
            trash_position=self.trash_position,
            temperature=self.config.temperature,
            generator=self.generator,
        )

    def _draft(
        self, slots: IntArray, lengths: IntArray, k_step: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k_step draft forwards for rows whose last token sits at `lengths` -> ([R, K], q)."""
        assert self.model_draft is not None and self.draft_cache is not None
        model, depth, cache = self.model_draft.model, self.model_draft.num_layers, self.draft_cache
        temperature = self.config.temperature
        slots_t = torch.from_numpy(slots).to(self.device)  # [R]
        # First forward: catch the draft's cache up to L, then the last token at L.
        logits = self._forward_span(
            model, depth, cache, slots, cache.lengths[slots], lengths + 1, need_logits=True
        )  # [R, V]
        cache.lengths[slots] = lengths + 1
        drafted: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for index in range(k_step):
            if temperature == 0.0:
                token = logits.argmax(dim=-1)  # [R]
            else:
                q = probs_from_logits(logits, temperature)  # [R, V]
                token = sample_from_probs(q, self.generator)  # [R]
                probs.append(q)
            drafted.append(token)
            if index + 1 == k_step:
                break  # the last draft is verified by the target, never fed to the draft
            positions = torch.from_numpy(lengths + 1 + index).to(self.device)[:, None]  # [R, 1]
            logits = model(
                token[:, None],
                positions,
                cache,
                slots_t,
                num_layers=depth,
                kv_len=int(lengths.max()) + 2 + index,
            )[:, 0]  # [R, V]
        draft_ids = torch.stack(drafted, dim=1)  # [R, K]
        return draft_ids, (torch.stack(probs, dim=1) if probs else None)  # [R, K, V]

    def _span_group(
        self, slots: IntArray, start: IntArray, end: IntArray, need_logits: bool
    ) -> ForwardGroup:
        """Each slot's known tokens [start, end) as one forward group (ragged rows padded to
        the trash position), with logits at each row's last token if `need_logits`."""
        widths = end - start  # [R] >= 1
        width = int(widths.max())
        offsets = np.arange(width)[None, :]  # [1, W]
        is_real = offsets < widths[:, None]  # [R, W]
        positions = np.where(is_real, start[:, None] + offsets, self.trash_position)  # [R, W]
        token_pos = np.where(is_real, positions, 0)  # [R, W]
        tokens = self.token_ids[slots[:, None], token_pos]  # [R, W]
        last_index = torch.from_numpy(widths - 1).to(self.device)[:, None]  # [R, 1]
        return ForwardGroup(
            torch.from_numpy(tokens).to(self.device),
            torch.from_numpy(positions).to(self.device),
            torch.from_numpy(slots).to(self.device),
            kv_len=int(end.max()),
            logit_indices=last_index if need_logits else last_index[:, :0],
        )

    def _forward_span(
        self,
        model: Transformer,
        num_layers: int | None,
        cache: KVCache,
        slots: IntArray,
        start: IntArray,
        end: IntArray,
        need_logits: bool,
    ) -> torch.Tensor:
        """Feed each slot's known tokens [start, end) through `model` (`_span_group`).

        Returns [R, V] logits of each row's last fed token (or an empty tensor if not needed).
        """
        group = self._span_group(slots, start, end, need_logits)
        logits = model.forward_groups([group], cache, num_layers)[0]  # [R, 1 or 0, V]
        out: torch.Tensor = logits[:, 0] if need_logits else logits
        return out

    def _append(self, slot: int, tokens: IntArray) -> None:
        count = self.num_tokens[slot]
        if count + tokens.size > self.config.cache_len - 1:
            raise ValueError(f"slot {slot} outgrew its cache")
        self.token_ids[slot, count : count + tokens.size] = tokens
        self.num_tokens[slot] = count + tokens.size

    def _checked_step_inputs(
        self, slot_ids: IntArray, num_spec_tokens: IntArray, num_accepted: IntArray | None = None
    ) -> tuple[IntArray, IntArray, IntArray, int, IntArray | None] | None:
        """(slots [B], K [B], lengths [B], the step's largest K, drawn accepted counts [B] or
        None) after checking a step's inputs; None for an empty step. Under drawn acceptance
        every step needs its counts, 0 <= a <= K per row; otherwise none may be given.

        Shared by every step implementation (reference and fast path), so they refuse the same
        inputs with the same messages.
        """
        slots = np.asarray(slot_ids, dtype=np.int64)
        spec = np.asarray(num_spec_tokens, dtype=np.int64)
        if slots.size == 0:
            return None
        self._check_in_use(slots)
        if len(set(slots.tolist())) != slots.size:
            raise ValueError("a slot appears twice in one step")
        if spec.shape != slots.shape:
            raise ValueError(f"need one K per row: {spec.shape} vs {slots.shape}")
        if (spec < 0).any() or (spec > self.config.k_max).any():
            raise ValueError(f"K must be in [0, {self.config.k_max}], got {spec.tolist()}")
        lengths = self.target_cache.lengths[slots]  # [B] L: the last token sits at position L
        if not (lengths == self.num_tokens[slots] - 1).all():
            raise ValueError("step() on a slot that has not finished its prefill")
        k_step = int(spec.max())
        if (lengths + k_step + 1 > self.config.cache_len - 1).any():
            raise ValueError("sequence would outgrow max_model_len + k_max")
        if (num_accepted is not None) != self.config.drawn_acceptance:
            raise ValueError(
                "drawn acceptance: every step needs its accepted counts"
                if self.config.drawn_acceptance
                else "accepted counts given to an engine without drawn acceptance"
            )
        drawn = None
        if num_accepted is not None:
            drawn = np.asarray(num_accepted, dtype=np.int64)
            if drawn.shape != spec.shape or (drawn < 0).any() or (drawn > spec).any():
                raise ValueError(
                    f"drawn accepted counts must be in [0, K] per row: {drawn.tolist()} for K "
                    f"{spec.tolist()}"
                )
        return slots, spec, lengths, k_step, drawn

    def _check_in_use(self, slots: IntArray) -> None:
        if not self._in_use[slots].all():
            raise ValueError(f"slot(s) {slots[~self._in_use[slots]].tolist()} are not allocated")


@torch.inference_mode()
def target_greedy_decode(
    target: Transformer, prompt_ids: list[int] | IntArray, num_new_tokens: int
) -> list[int]:
    """Plain target-only greedy decoding (reference for tests): prompt forward, then 1 token/step.

    Independent of `SpecDecodeEngine`: its own one-slot cache, no drafts, no padding.
    """
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    prompt = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64), device=device)[None]  # [1, P]
    num_prompt = prompt.shape[1]
    cache = new_kv_cache(
        target.config, 1, num_prompt + num_new_tokens + 1, device=device, dtype=dtype
    )
    slot = torch.zeros(1, dtype=torch.int64, device=device)  # [1]
    logits = target(prompt, torch.arange(num_prompt, device=device)[None], cache, slot)  # [1,P,V]
    token = logits[0, -1].argmax()
    output = [int(token)]
    for position in range(num_prompt, num_prompt + num_new_tokens - 1):
        logits = target(token.view(1, 1), torch.tensor([[position]], device=device), cache, slot)
        token = logits[0, -1].argmax()
        output.append(int(token))
    return output
