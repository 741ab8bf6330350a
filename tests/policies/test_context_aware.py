"""Context-aware K: goodput over (B, K, context), the 5-tuple table, compiling one to the other."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.policies.context_aware import (
    ContextGoodputPolicy,
    ContextLatencyGrid,
    ContextRangeTablePolicy,
    compile_context_table,
    validate_context_ranges,
)
from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.range_table import synthetic_view
from dsd.policies.spec import parse_policy

RATES = (0.7, 0.45, 0.25, 0.12, 0.06)


def kv_bound_latency_ms(batch_size: float, ks: np.ndarray, context_tokens: float) -> np.ndarray:
    """Draft passes + max(memory, compute): long contexts make the forward memory-bound."""
    memory_ms = 5.0 + 0.02 * batch_size + 2e-5 * context_tokens
    compute_ms = 0.03 * batch_size * (ks + 1.0)
    return 1.0 + 0.4 * ks + np.maximum(memory_ms, compute_ms)


def _view(batch_size: int, context_len: int, k_max: int = 5):  # type: ignore[no-untyped-def]
    return synthetic_view(batch_size, k_max, context_len)


def test_k_rises_with_context_at_large_b() -> None:
    policy = ContextGoodputPolicy(kv_bound_latency_ms, RATES, 5)
    short = policy.choose_k(_view(128, 256))
    long = policy.choose_k(_view(128, 16384))
    assert long > short


@pytest.mark.parametrize(
    ("batch_size", "context_len"), [(1, 0), (8, 1000), (64, 4000), (256, 32000)]
)
def test_goodput_choice_is_the_argmax(batch_size: int, context_len: int) -> None:
    policy = ContextGoodputPolicy(kv_bound_latency_ms, RATES, 5)
    ks = np.arange(6, dtype=np.float64)
    al = 1.0 + np.concatenate(([0.0], np.cumsum(RATES)))
    itl = kv_bound_latency_ms(batch_size, ks, batch_size * context_len)
    assert policy.choose_k(_view(batch_size, context_len)) == int(np.argmax(al / itl))


def test_view_k_max_caps_the_choice() -> None:
    policy = ContextGoodputPolicy(kv_bound_latency_ms, RATES, 5)
    assert policy.choose_k(_view(1, 16000, k_max=1)) <= 1


TABLE = [
    [1, 16, 0, 2047, 3],  # small B, short context
    [1, 16, 2048, 1_000_000, 4],  # small B, long context
    [17, 128, 0, 4095, 1],
    [17, 128, 8192, 1_000_000, 3],  # gap 4096..8191 takes the previous context range
    [200, 256, 0, 1_000_000, 0],  # gap 129..199 takes the B range before it
]


@pytest.mark.parametrize(
    ("batch_size", "mean_context", "k"),
    [
        (1, 0, 3),  # first cell
        (16, 2048, 4),  # context edge
        (40, 5000, 1),  # context gap carries the previous range
        (40, 9000, 3),  # long context
        (150, 9000, 3),  # B gap carries the previous B range
        (256, 100, 0),  # last B range
        (256, 10_000_000, 0),  # past the last context
    ],
)
def test_table_lookup(batch_size: int, mean_context: int, k: int) -> None:
    policy = ContextRangeTablePolicy(TABLE, 5, 256)
    assert policy.choose_k(_view(batch_size, mean_context)) == k


def test_table_k_clamped_and_b_bound() -> None:
    policy = ContextRangeTablePolicy(TABLE, 2, 256)
    assert policy.choose_k(_view(1, 5000)) == 2  # K=4 clamped to k_max 2
    with pytest.raises(InputError, match="exceeds max_num_seqs"):
        ContextRangeTablePolicy(TABLE, 5, 64).choose_k(_view(65, 0))


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([], "must not be empty"),  # empty
        ([[1, 4, 0, 10]], "integers"),  # four fields
        ([[0, 4, 0, 10, 1]], "bounds must be > 0"),  # B = 0
        ([[1, 4, -1, 10, 1]], "context bounds must be >= 0"),  # negative context
        ([[4, 1, 0, 10, 1]], "start_bs 4 > end_bs 1"),  # reversed B
        ([[1, 4, 10, 0, 1]], "start_ctx 10 > end_ctx 0"),  # reversed context
        ([[1, 4, 0, 10, -1]], "K must be >= 0"),  # negative K
        ([[2, 4, 0, 10, 1]], "must start at batch size 1"),  # B does not start at 1
        ([[1, 4, 5, 10, 1]], "must start at 0"),  # context does not start at 0
        ([[1, 4, 0, 10, 1], [3, 8, 0, 10, 1]], "overlap"),  # B ranges overlap
        ([[1, 4, 0, 10, 1], [1, 4, 10, 20, 2]], "overlap in context"),  # context overlap
    ],
)
def test_table_validation(entries, fragment: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=fragment):
        validate_context_ranges(entries)


def test_compiled_table_agrees_with_the_goodput_form_at_bucket_midpoints() -> None:
    policy = ContextGoodputPolicy(kv_bound_latency_ms, RATES, 5)
    edges = [0, 1024, 4096, 16384]
    table = compile_context_table(policy, 256, edges, 65536)
    compiled = ContextRangeTablePolicy(table, 5, 256)
    midpoints = [511.5, 2559.5, 10239.5, 40960.0]  # (start + end) / 2 of each bucket
    for batch_size in range(1, 257):
        for mid in midpoints:
            assert compiled.k_for(batch_size, mid) == policy.best_k(batch_size, batch_size * mid, 5)
    # The table is coarse: far fewer entries than B x buckets.
    assert len(table) < 64


def _context_profile() -> Profile:
    latency = tuple(
        LatencyPoint(
            batch_size=b,
            num_spec_tokens=k,
            median_ms=float(kv_bound_latency_ms(b, np.array([float(k)]), b * ctx)[0]),
            context_len=ctx,
        )
        for b in (1, 16, 64, 256)
        for ctx in (256, 4096, 16384)
        for k in (0, 1, 3, 5)
    )
    return Profile(k_max=5, latency=latency, acceptance_rates=RATES)


def test_grid_from_profile_interpolates_exactly_at_points() -> None:
    grid = ContextLatencyGrid.from_profile(_context_profile())
    ks = np.array([0.0, 1.0, 3.0, 5.0])
    np.testing.assert_allclose(
        grid(64, ks, 64 * 4096), kv_bound_latency_ms(64, ks, 64 * 4096), rtol=1e-12
    )


def test_spec_builds_both_forms() -> None:
    profile = _context_profile()
    from_grid = parse_policy("context", profile=profile, k_max=5, max_num_seqs=256)
    from_fn = parse_policy(
        "context",
        profile=profile,
        k_max=5,
        max_num_seqs=256,
        context_latency=kv_bound_latency_ms,
    )
    table = parse_policy(
        "context:table=[[1,256,0,100,2],[1,256,101,100000,4]]",
        profile=None,
        k_max=5,
        max_num_seqs=256,
    )
    assert isinstance(from_grid, ContextGoodputPolicy)
    assert isinstance(from_fn, ContextGoodputPolicy)
    assert table.choose_k(_view(3, 500)) == 4
    for batch_size, ctx in [(1, 256), (64, 4096), (256, 16384)]:  # grid points: same answer
        assert from_grid.choose_k(_view(batch_size, ctx)) == from_fn.choose_k(
            _view(batch_size, ctx)
        )


def test_profile_without_context_is_input_error() -> None:
    from policy_factories import h100_profile

    with pytest.raises(InputError, match="context_len"):
        parse_policy("context", profile=h100_profile(), k_max=5, max_num_seqs=64)


def test_a_step_with_prefill_chunks_is_read_at_b_with_the_decode_rows_mean_context() -> None:
    # 82 decode rows (context 1000 each) + 77 prefill chunks: the latency function is asked at
    # B = 159 (the key every policy uses) with 159 rows' worth of the decode rows' mean context.
    calls: list[tuple[float, float]] = []

    def recording_ms(batch_size: float, ks: np.ndarray, context_tokens: float) -> np.ndarray:
        calls.append((batch_size, context_tokens))
        return kv_bound_latency_ms(batch_size, ks, context_tokens)

    policy = ContextGoodputPolicy(recording_ms, RATES, 5)
    view = dataclasses.replace(
        _view(82, 1000), batch_size=159, num_tokens=82 + 7700
    )  # decode rows keep their ids and contexts
    k = policy.choose_k(view)
    assert calls == [(159.0, 159.0 * 1000)]
    assert k == policy.choose_k(_view(159, 1000))
