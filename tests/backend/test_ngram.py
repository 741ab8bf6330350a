"""N-gram drafting: hand cases, and vLLM 0.33.0's own proposer as the oracle.

The oracle tests run where vLLM and numba are installed (the `vllm` extra) and are skipped
elsewhere; the hand cases and the batch helper run everywhere. The property test calls the
oracle's plain-Python body (`.py_func`, no JIT compile time); a few cases also go through the
jitted function vLLM really runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsd.backend.ngram import NgramConfig, propose_ngram, propose_ngram_rows
from dsd.common.errors import InputError

Oracle = Callable[[np.ndarray, int, int, int, int], np.ndarray]


@pytest.fixture(scope="module")
def vllm_ngram() -> ModuleType:
    """vLLM's ngram_proposer module; the tests that use it skip without vLLM or numba."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    pytest.importorskip("numba")
    return pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")


def _ours(tokens: list[int] | np.ndarray, lo: int, hi: int, k: int, max_len: int) -> list[int]:
    result = propose_ngram(np.asarray(tokens, dtype=np.int64), NgramConfig(lo, hi), k, max_len)
    assert result.dtype == np.int64 and result.ndim == 1 and result.shape[0] <= max(k, 0)
    return result.tolist()


def _theirs(oracle: Oracle, tokens: list[int] | np.ndarray, lo: int, hi: int, k: int, max_len: int):
    return oracle(np.asarray(tokens, dtype=np.int64), lo, hi, max_len, k).tolist()


# (tokens, prompt_lookup_min, prompt_lookup_max, k, max_model_len, expected drafts)
CASES = [
    # no match: the last token 4 never occurred before
    ([1, 2, 3, 4], 1, 3, 3, 100, []),
    # the only earlier occurrence ends right before the last token: draft that last token
    ([3, 4, 4], 1, 1, 3, 100, [4]),
    # the match is followed by the suffix itself: drafts run on into it
    ([7, 8, 9, 7, 8], 2, 2, 3, 100, [9, 7, 8]),
    # two equally long matches of [1, 2] (followed by 9 and by 8): the EARLIEST one wins
    ([1, 2, 9, 1, 2, 8, 1, 2], 2, 2, 1, 100, [9]),
    # ... the same with min 1: [1, 2] is still the longest, the earliest still wins
    ([1, 2, 9, 1, 2, 8, 1, 2], 1, 3, 3, 100, [9, 1, 2]),
    # a longer match [0, 1, 2] (followed by 8) beats an earlier shorter [1, 2] (followed by 9)
    ([3, 1, 2, 9, 0, 1, 2, 8, 0, 1, 2], 1, 3, 2, 100, [8, 0]),
    # ... but with max 2 both are length-2 matches, so the earliest [1, 2] wins
    ([3, 1, 2, 9, 0, 1, 2, 8, 0, 1, 2], 1, 2, 2, 100, [9, 0]),
    # min 2: only the 1-gram [3] recurs, too short
    ([5, 6, 7, 1, 2, 3, 8, 3], 2, 3, 2, 100, []),
    # ... with min 1 the 1-gram counts
    ([5, 6, 7, 1, 2, 3, 8, 3], 1, 3, 2, 100, [8, 3]),
    # overlapping occurrence: [1, 1, 1] ends at index 2, one before the last; only 1 token follows
    ([1, 1, 1, 1], 1, 5, 3, 100, [1]),
    # max 2 caps a run: the earliest [1, 1] ends at index 1, four tokens follow
    ([1, 1, 1, 1, 1, 1], 1, 2, 4, 100, [1, 1, 1, 1]),
    # the proposal is cut by the end of the sequence: 2 tokens, not k = 5
    ([1, 2, 1, 2], 2, 2, 5, 100, [1, 2]),
    # k capped by max_model_len: one slot left, so one draft
    ([1, 2, 3, 1, 2], 2, 2, 3, 6, [3]),
    # at max_model_len: no drafts
    ([1, 2, 3, 1, 2], 2, 2, 3, 5, []),
    # past max_model_len: no drafts
    ([1, 2, 3, 1, 2], 2, 2, 3, 4, []),
    # k = 0 (a row that does not draft this step): no drafts
    ([1, 2, 3, 1, 2], 2, 2, 0, 100, []),
    # context shorter than min: no drafts
    ([1, 1], 3, 3, 3, 100, []),
    # empty context
    ([], 1, 1, 3, 100, []),
    # a single token has nothing before it
    ([1], 1, 1, 3, 100, []),
]


@pytest.mark.parametrize(("tokens", "lo", "hi", "k", "max_len", "expected"), CASES)
def test_hand_cases(tokens, lo, hi, k, max_len, expected) -> None:
    assert _ours(tokens, lo, hi, k, max_len) == expected


@pytest.mark.parametrize(("tokens", "lo", "hi", "k", "max_len", "expected"), CASES)
def test_hand_cases_agree_with_jitted_vllm(vllm_ngram, tokens, lo, hi, k, max_len, expected):
    jitted = vllm_ngram._find_longest_matched_ngram_and_propose_tokens
    assert _theirs(jitted, tokens, lo, hi, k, max_len) == expected


@pytest.mark.parametrize("seed", range(8))
def test_long_contexts_agree_with_jitted_vllm(vllm_ngram, seed: int) -> None:
    jitted = vllm_ngram._find_longest_matched_ngram_and_propose_tokens
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1000, 4097))
    # a small vocabulary plus copied spans: long matches, as in code or quoting a prompt
    tokens = rng.integers(0, 50, size=n).astype(np.int64)  # [n]
    for _ in range(5):
        src, dst, span = rng.integers(0, n // 2), rng.integers(n // 2, n), rng.integers(1, 40)
        span = min(span, n - dst)
        tokens[dst : dst + span] = tokens[src : src + span]
    for lo, hi in [(1, 1), (1, 5), (3, 3), (2, 8), (1, 64)]:
        for k in (1, 5, 10):
            args = (tokens, lo, hi, k, n + 8)
            assert _ours(*args) == _theirs(jitted, *args)


# Sequences over a small alphabet (matches are common), and repeats of a short pattern with a
# few changed tokens (long and overlapping matches). Token ids far apart exercise int64.
ALPHABETS = st.lists(st.integers(0, 2**40), min_size=2, max_size=6, unique=True)


@st.composite
def token_sequences(draw: st.DrawFn) -> list[int]:
    alphabet = draw(ALPHABETS)
    symbol = st.sampled_from(alphabet)
    if draw(st.booleans()):
        return draw(st.lists(symbol, max_size=200))
    pattern = draw(st.lists(symbol, min_size=1, max_size=8))
    tokens = (pattern * (200 // len(pattern) + 1))[: draw(st.integers(0, 200))]
    for _ in range(draw(st.integers(0, 4))):
        if tokens:
            tokens[draw(st.integers(0, len(tokens) - 1))] = draw(symbol)
    return tokens


@settings(max_examples=2500, deadline=None)
@given(
    tokens=token_sequences(),
    lo=st.integers(1, 5),
    extra=st.integers(0, 4),
    k=st.integers(1, 6),
    room=st.integers(-2, 8),
)
def test_equals_vllm(vllm_ngram, tokens: list[int], lo: int, extra: int, k: int, room: int):
    hi = min(lo + extra, 5)
    args = (tokens, lo, hi, k, len(tokens) + room)  # max_model_len around the length
    oracle = vllm_ngram._find_longest_matched_ngram_and_propose_tokens.py_func
    assert _ours(*args) == _theirs(oracle, *args)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(token_sequences(), st.integers(0, 6)), max_size=6),
    lo=st.integers(1, 3),
    extra=st.integers(0, 3),
    max_len=st.integers(0, 220),
)
def test_batch_equals_per_row(rows: list[tuple[list[int], int]], lo: int, extra: int, max_len: int):
    config = NgramConfig(lo, lo + extra)
    token_rows = [np.asarray(tokens, dtype=np.int64) for tokens, _ in rows]
    k_per_row = np.asarray([k for _, k in rows], dtype=np.int64)  # [B]
    drafts, num_drafted = propose_ngram_rows(token_rows, k_per_row, config, max_len)
    width = max((k for _, k in rows), default=0)
    assert drafts.shape == (len(rows), width) and drafts.dtype == np.int64
    assert num_drafted.shape == (len(rows),) and num_drafted.dtype == np.int64
    for row, (tokens, k) in enumerate(zip(token_rows, k_per_row, strict=True)):
        expected = propose_ngram(tokens, config, int(k), max_len)
        assert num_drafted[row] == expected.shape[0]
        assert drafts[row, : num_drafted[row]].tolist() == expected.tolist()
        assert not drafts[row, num_drafted[row] :].any()  # padding is 0


def test_batch_of_no_rows() -> None:
    drafts, num_drafted = propose_ngram_rows([], np.zeros(0, dtype=np.int64), NgramConfig(), 10)
    assert drafts.shape == (0, 0) and num_drafted.shape == (0,)


def test_batch_rejects_mismatched_k() -> None:
    with pytest.raises(ValueError, match="k_per_row"):
        propose_ngram_rows([np.arange(3)], np.array([1, 2]), NgramConfig(), 10)


@pytest.mark.parametrize(
    ("lo", "hi", "message"),
    [
        (0, 3, "prompt_lookup_min: must be an integer >= 1, got 0"),
        (True, 3, "prompt_lookup_min: must be an integer >= 1, got True"),
        (2.0, 3, "prompt_lookup_min: must be an integer >= 1, got 2.0"),
        (3, 2, "prompt_lookup_max: must be an integer >= 3, got 2"),
        (1, None, "prompt_lookup_max: must be an integer >= 1, got None"),
    ],
)
def test_config_rejects(lo, hi, message: str) -> None:
    with pytest.raises(InputError) as caught:
        NgramConfig(lo, hi)
    assert str(caught.value) == message


def test_config_defaults_are_vllms() -> None:
    config = NgramConfig()
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    assert NgramConfig(2, 2).prompt_lookup_max == 2
