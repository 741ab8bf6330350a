"""Model-free n-gram (prompt-lookup) drafting with exactly vLLM 0.33.0's `ngram` semantics.

A row's drafts are copied from its own context: take the longest suffix n-gram of the tokens,
n in [prompt_lookup_min, prompt_lookup_max], that also occurs earlier (ending before the last
token; overlaps with the suffix allowed), and propose the up-to-k tokens that followed its
EARLIEST occurrence. No match, a context shorter than prompt_lookup_min, or no room left before
max_model_len: no drafts. The result equals vLLM's
`vllm.v1.spec_decode.ngram_proposer._find_longest_matched_ngram_and_propose_tokens` for every
input (tests/backend/test_ngram.py uses it as the oracle); vLLM runs a numba-jitted KMP over the
reversed tokens, this module filters candidate positions with numpy instead, so it needs neither
numba nor torch.

What it does not do: run or load a model, choose K, or decide which rows draft at all (vLLM skips
rows that sampled no token this step or sit at max_model_len; a caller passes k = 0 for the
first, the second follows from max_model_len).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsd.common.arrays import IntArray
from dsd.common.errors import require_int


@dataclass(frozen=True)
class NgramConfig:
    """The n-gram lengths tried, as vLLM's `prompt_lookup_min` / `prompt_lookup_max`."""

    prompt_lookup_min: int = 5  # vLLM's default when neither bound is given
    prompt_lookup_max: int = 5

    def __post_init__(self) -> None:
        require_int(self.prompt_lookup_min, "prompt_lookup_min", 1)
        require_int(self.prompt_lookup_max, "prompt_lookup_max", int(self.prompt_lookup_min))


def _empty() -> IntArray:
    return np.zeros(0, dtype=np.int64)  # [0]


def propose_ngram(tokens: IntArray, config: NgramConfig, k: int, max_model_len: int) -> IntArray:
    """Drafts [d] int64, d <= k, for one row's context tokens [n]; bit-identical to vLLM's.

    Cost: one comparison over the context, then one pass per extra n-gram length over the
    positions still matching (all of them only for a long run of one repeated pattern).
    """
    tokens = np.asarray(tokens, dtype=np.int64)  # [n]
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    n = tokens.shape[0]
    if n < config.prompt_lookup_min:
        return _empty()
    k = min(k, max_model_len - n)  # never draft past max_model_len
    if k <= 0:
        return _empty()

    # ends: every position e <= n - 2 where the length-`length` n-gram ending at e equals the
    # context's last `length` tokens. Growing `length` only removes ends, and ends stay sorted,
    # so ends[0] is always the earliest occurrence: vLLM's KMP keeps the last match it meets in
    # the reversed tokens, which is the earliest in the original order.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # [c]
    length = 0  # longest n-gram length matched so far (capped at prompt_lookup_max)
    first_end = -1
    while ends.size > 0:
        length += 1
        first_end = int(ends[0])
        if length == config.prompt_lookup_max:
            break
        ends = ends[ends >= length]  # the longer n-gram must start at index >= 0
        if ends.size == 0:
            break
        ends = ends[tokens[ends - length] == tokens[n - 1 - length]]  # [c']
    if length < config.prompt_lookup_min:
        return _empty()
    start = first_end + 1  # the drafts are what followed the match (there is >= 1 token)
    return tokens[start : start + k].copy()  # [min(k, n - start)]


def propose_ngram_rows(
    token_rows: list[IntArray], k_per_row: IntArray, config: NgramConfig, max_model_len: int
) -> tuple[IntArray, IntArray]:
    """`propose_ngram` per row: drafts [B, max K] padded with 0, and the count drafted [B]."""
    k_per_row = np.asarray(k_per_row, dtype=np.int64)  # [B]
    if k_per_row.shape != (len(token_rows),):
        raise ValueError(f"k_per_row must have shape ({len(token_rows)},), got {k_per_row.shape}")
    width = max(int(k_per_row.max(initial=0)), 0)
    drafts = np.zeros((len(token_rows), width), dtype=np.int64)  # [B, max K]
    num_drafted = np.zeros(len(token_rows), dtype=np.int64)  # [B]
    for row, (tokens, k) in enumerate(zip(token_rows, k_per_row, strict=True)):
        proposal = propose_ngram(tokens, config, int(k), max_model_len)  # [d]
        drafts[row, : proposal.shape[0]] = proposal
        num_drafted[row] = proposal.shape[0]
    return drafts, num_drafted
