"""vLLM range-table semantics (`num_speculative_tokens_per_batch_size`) and compiling to it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.policies.range_table import (
    RangeTablePolicy,
    compile_range_table,
    read_ranges,
    synthetic_view,
)
from dsd.policies.static import StaticPolicy

LOOKUP_CASES = [
    # (ranges, k_max, max_num_seqs, {B: expected K})
    # one range covering everything
    ([[1, 8, 3]], 5, 8, {1: 3, 8: 3}),
    # two adjacent ranges, inclusive bounds
    ([[1, 4, 5], [5, 8, 2]], 5, 8, {4: 5, 5: 2, 8: 2}),
    # gap 5..9 takes the previous range's K
    ([[1, 4, 4], [10, 16, 1]], 5, 16, {4: 4, 5: 4, 9: 4, 10: 1}),
    # B past the last range takes the last range's K
    ([[1, 4, 4], [5, 8, 2]], 5, 256, {9: 2, 256: 2}),
    # unsorted input is sorted by start
    ([[9, 16, 0], [1, 8, 3]], 5, 16, {1: 3, 8: 3, 9: 0, 16: 0}),
    # K above num_speculative_tokens is clamped to it
    ([[1, 4, 9], [5, 8, 2]], 3, 8, {1: 3, 4: 3, 5: 2}),
    # K = 0 is allowed (plain decoding)
    ([[1, 1, 0], [2, 8, 4]], 4, 8, {1: 0, 2: 4}),
    # ranges reaching past max_num_seqs are fine: only B > max_num_seqs is an error
    ([[1, 512, 2]], 5, 64, {64: 2}),
]


@pytest.mark.parametrize(("ranges", "k_max", "max_num_seqs", "expected"), LOOKUP_CASES)
def test_range_table_lookup_cases(
    ranges: list[list[int]], k_max: int, max_num_seqs: int, expected: dict[int, int]
) -> None:
    policy = RangeTablePolicy(ranges, k_max, max_num_seqs)
    for batch_size, k in expected.items():
        assert policy.choose_k(synthetic_view(batch_size, k_max)) == k, batch_size


ERROR_CASES = [
    # (ranges, message fragment)
    # empty list
    ([], "must not be empty"),
    # must start at 1
    ([[2, 8, 3]], "the first range must start at batch size 1, got 2"),
    # overlap
    ([[1, 8, 3], [8, 16, 1]], "overlap (batch size 8)"),
    # overlap given out of order
    ([[5, 16, 1], [1, 6, 3]], "overlap"),
    # start > end
    ([[1, 4, 3], [9, 5, 1]], "start_bs 9 > end_bs 5"),
    # negative K
    ([[1, 8, -1]], "K must be >= 0, got -1"),
    # zero bound
    ([[0, 8, 1]], "batch size bounds must be > 0"),
    # not a triple
    ([[1, 8]], "expected [start_bs, end_bs, K] integers"),
    # float instead of int
    ([[1, 8.5, 2]], "expected [start_bs, end_bs, K] integers"),
    # not a list
    ("1-8:3", "expected a list"),
]


@pytest.mark.parametrize(("ranges", "fragment"), ERROR_CASES)
def test_invalid_range_tables_are_input_errors(ranges: object, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        RangeTablePolicy(ranges, 5, 256)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_integers_beyond_64_bits_are_a_valid_table_and_clamp_like_vllm() -> None:
    # vLLM accepts bounds and K of any size (Python ints) and clamps K to num_speculative_tokens;
    # numpy int64 would overflow, so the table clamps before converting.
    from dsd.policies.spec import parse_policy

    huge = 2**70
    policy = parse_policy(
        f"table:[[1, 3, {huge}], [{huge}, {huge}, 0]]", profile=None, k_max=4, max_num_seqs=8
    )
    assert [policy.choose_k(synthetic_view(b, 4)) for b in range(1, 9)] == [4] * 8


def test_batch_size_above_max_num_seqs_is_an_error() -> None:
    policy = RangeTablePolicy([[1, 8, 3]], 5, 8)
    with pytest.raises(InputError, match="batch size 9 exceeds max_num_seqs 8"):
        policy.choose_k(synthetic_view(9, 5))


def test_empty_step_reads_the_batch_size_one_row() -> None:
    policy = RangeTablePolicy([[1, 1, 4], [2, 8, 1]], 5, 8)
    assert policy.choose_k(synthetic_view(0, 5)) == 4


def test_read_ranges_accepts_inline_json_files_and_speculative_configs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert read_ranges("[[1, 4, 3], [5, 8, 1]]") == [[1, 4, 3], [5, 8, 1]]
    path = tmp_path / "spec.json"
    path.write_text(
        '{"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 2, 3]]}'
    )
    assert read_ranges(str(path)) == [[1, 2, 3]]
    with pytest.raises(InputError, match="line 1 column"):
        read_ranges("[[1, 2, 3],]")


@st.composite
def range_tables(draw: st.DrawFn) -> tuple[list[list[int]], int, int]:
    """Random valid tables (with gaps, shuffled), a k_max and a max_num_seqs."""
    num_ranges = draw(st.integers(1, 6))
    ranges, start = [], 1
    for _ in range(num_ranges):
        end = start + draw(st.integers(0, 20))
        ranges.append([start, end, draw(st.integers(0, 8))])
        start = end + 1 + draw(st.integers(0, 10))  # optional gap
    shuffled = draw(st.permutations(ranges))
    return [list(r) for r in shuffled], draw(st.integers(0, 8)), draw(st.integers(1, 200))


def _brute_force_k(ranges: list[list[int]], k_max: int, batch_size: int) -> int:
    """The last range (by start) whose start <= B, K clamped: the documented rule, spelled out."""
    chosen = None
    for start, _end, k in sorted(ranges):
        if start <= batch_size:
            chosen = k
    assert chosen is not None
    return min(chosen, k_max)


@given(range_tables())
def test_range_table_equals_brute_force_lookup(case: tuple[list[list[int]], int, int]) -> None:
    ranges, k_max, max_num_seqs = case
    policy = RangeTablePolicy(ranges, k_max, max_num_seqs)
    for batch_size in range(1, max_num_seqs + 1):
        got = policy.choose_k(synthetic_view(batch_size, k_max))
        assert got == _brute_force_k(ranges, k_max, batch_size)
        assert 0 <= got <= k_max


@given(range_tables())
def test_compiled_table_reproduces_the_policy(case: tuple[list[list[int]], int, int]) -> None:
    ranges, k_max, max_num_seqs = case
    policy = RangeTablePolicy(ranges, k_max, max_num_seqs)
    compiled = compile_range_table(policy, k_max, max_num_seqs)
    # merged: consecutive ranges differ in K, they tile 1..max_num_seqs exactly
    assert compiled[0][0] == 1 and compiled[-1][1] == max_num_seqs
    for previous, current in itertools.pairwise(compiled):
        assert current[0] == previous[1] + 1 and current[2] != previous[2]
    reloaded = RangeTablePolicy(compiled, k_max, max_num_seqs)
    assert np.array_equal(reloaded.k_by_batch, policy.k_by_batch)


def test_compile_static_policy_is_one_range() -> None:
    assert compile_range_table(StaticPolicy(3), 5, 64) == [[1, 64, 3]]


class _PerRequestPolicy:
    def choose_k(self, view):  # type: ignore[no-untyped-def]
        return np.arange(view.num_decode_reqs) % 2

    def observe(self, feedback):  # type: ignore[no-untyped-def]
        pass


def test_per_request_policy_does_not_compile() -> None:
    with pytest.raises(InputError, match="only batch-level policies compile"):
        compile_range_table(_PerRequestPolicy(), 5, 4)
