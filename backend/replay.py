"""A real run's replay recording (`sim.models.replay.ReplayRecording`) from its prompts and outputs.

After a greedy (temperature 0) run, what the drafter would propose at every output position and
how much of it the target accepted follow from the token ids alone:

- n-gram lookup (`NgramDraft`): `backend.ngram.propose_ngram` over prompt + outputs[:p], no
  model (`sim.models.replay.recording_from_proposals`);
- a chain model draft (`Draft`: a separate model or `early-exit:N`): ONE teacher-forced draft
  forward over prompt + outputs per request. When drafts p..p+j-1 were accepted, the context of
  draft p+j is the target's own tokens, so that draft is the draft's argmax at that position of
  the teacher-forced pass; match[t] = (argmax after outputs[:t] == outputs[t]), and
  matched[p] = the leading ones of match[p:] (`sim.models.replay.recording_from_matches`).

Then a simulated step at (p, K) drafts min(K, available[p]) and accepts min(that, matched[p]),
what the engine did. Give the engine's own tokens (`TorchExecutor.prompt_ids` and
`finished_output_ids`, which keep tokens accepted past max_tokens): trimmed outputs leave the
last step's acceptance unknown past the end (read as not matched). Exact up to float rounding
of the draft's logits between this pass and the engine's incremental one (an argmax near-tie).

This module runs models; it does not run the engine, schedule, or write files
(`sim.models.replay.save_replay_recording` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dsd.backend.eagle import EagleDraft, EagleOrLookup, eagle_recording
from dsd.backend.engine import AnyDraft, Draft, NgramDraft
from dsd.backend.ngram import propose_ngram
from dsd.backend.pair import ModelPair
from dsd.common.arrays import BoolArray, IntArray
from dsd.common.errors import InputError
from dsd.sim.models.replay import (
    DEFAULT_REPLAY_CAP,
    ReplayRecording,
    recording_from_matches,
    recording_from_proposals,
)


@torch.inference_mode()
def draft_matches(draft: Draft, prompt_ids: IntArray, output_ids: IntArray) -> BoolArray:
    """[n] match[t] = the draft's greedy token after prompt + outputs[:t] equals outputs[t].

    One forward of the draft (its first `num_layers` layers for an early exit) over the whole
    sequence without a cache (causal attention), logits only at the n predicting positions.
    """
    prompt = np.asarray(prompt_ids, dtype=np.int64)  # [P]
    output = np.asarray(output_ids, dtype=np.int64)  # [n]
    if prompt.size < 1:
        raise ValueError("a request needs at least one prompt token")
    if output.size == 0:
        return np.zeros(0, dtype=np.bool_)
    device = next(draft.model.parameters()).device
    # Every token but the last output is context for some draft.
    tokens = np.concatenate((prompt, output[:-1]))  # [P + n - 1]
    length = tokens.shape[0]
    predicting = torch.arange(prompt.size - 1, length, device=device)[None]  # [1, n]
    logits = draft.model(
        torch.from_numpy(tokens).to(device)[None],
        torch.arange(length, device=device)[None],
        num_layers=draft.num_layers,
        logit_indices=predicting,
    )  # [1, n, V]
    greedy = logits[0].argmax(dim=-1).cpu().numpy().astype(np.int64)  # [n]
    matches: BoolArray = greedy == output
    return matches


def replay_recording(
    draft: AnyDraft,
    prompt_ids: Sequence[IntArray],
    output_ids: Sequence[IntArray],
    max_model_len: int,
    cap: int = DEFAULT_REPLAY_CAP,
    categories: Sequence[str | None] | None = None,
    metadata: dict[str, Any] | None = None,
) -> ReplayRecording:
    """The recording of a greedy run of `draft`, request i = (prompt_ids[i], output_ids[i]).

    `max_model_len`: the engine's (an n-gram lookup never drafts past it). The recording is in
    request order: simulating the same workload replays request i as recorded request i.
    """
    if len(prompt_ids) != len(output_ids) or not prompt_ids:
        raise ValueError("need one output list per prompt and at least one prompt")
    info = {"draft": type(draft).__name__, "max_model_len": max_model_len, **(metadata or {})}
    if isinstance(draft, NgramDraft):
        config = draft.config
        info["prompt_lookup"] = [config.prompt_lookup_min, config.prompt_lookup_max]

        def propose(context: IntArray, k: int) -> IntArray:
            return propose_ngram(context, config, k, max_model_len)

        return recording_from_proposals(
            prompt_ids,
            output_ids,
            propose,
            cap=cap,
            categories=categories,
            source="ngram replay",
            metadata=info,
        )
    if isinstance(draft, EagleDraft):
        return eagle_recording(draft, prompt_ids, output_ids, cap, categories, info)
    if isinstance(draft, EagleOrLookup):  # which of the two drafts depends on the step's K
        raise InputError("draft: a replay recording of eagle+ngram is not supported")
    info["num_layers"] = draft.depth
    matches = [
        draft_matches(draft, np.asarray(prompt), np.asarray(output))
        for prompt, output in zip(prompt_ids, output_ids, strict=True)
    ]
    return recording_from_matches(
        matches, cap=cap, categories=categories, source="draft replay", metadata=info
    )


def pair_replay_recording(
    pair: ModelPair,
    prompt_ids: Sequence[IntArray],
    output_ids: Sequence[IntArray],
    max_model_len: int,
    cap: int = DEFAULT_REPLAY_CAP,
) -> ReplayRecording:
    """`replay_recording` of a loaded pair's draft (its specs go into the metadata)."""
    if pair.draft is None:
        raise ValueError(f"pair {pair.target_spec}: no draft to replay")
    return replay_recording(
        pair.draft,
        prompt_ids,
        output_ids,
        max_model_len,
        cap=cap,
        metadata={"target": pair.target_spec, "draft_spec": pair.draft_spec},
    )
