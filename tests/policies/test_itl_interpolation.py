"""The ITL interpolation shared by the goodput policy and the simulator's table latency model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_factories import fixture_profile, h100_profile

from dsd.policies.goodput import ItlTable, interpolate_itl_ms

NAN = float("nan")
BS = np.array([1, 4, 16])
KS = np.array([0, 1, 3, 5])
GRID = np.array(
    [
        [10.0, 12.0, 16.0, 20.0],
        [11.0, 13.0, NAN, 23.0],  # K=3 not profiled at B=4: filled linearly in K (18.0)
        [20.0, 30.0, 50.0, 70.0],
    ]
)


@pytest.mark.parametrize(
    ("batch_size", "num_spec_tokens", "expected_ms"),
    [
        (1, 0, 10.0),  # a profiled point reads itself
        (1, 2, 14.0),  # K=2 halfway between K=1 (12) and K=3 (16)
        (4, 3, 18.0),  # unprofiled K at a profiled B: linear in K on that row (13 -> 23)
        (10, 0, 15.5),  # B=10 halfway between B=4 (11) and B=16 (20)
        (10, 3, 34.0),  # K-filled row then B: (18 + 50) / 2
        (0, 1, 12.0),  # below the smallest B: clamped to B=1
        (256, 5, 70.0),  # past the largest B: clamped to B=16, no extrapolation
        (1, 9, 20.0),  # past the largest K: clamped
        (2.5, 4, (18.0 + 20.5) / 2),  # fractional B and K: bilinear
    ],
)
def test_interpolation_table_cases(
    batch_size: float, num_spec_tokens: float, expected_ms: float
) -> None:
    got = interpolate_itl_ms(BS, KS, GRID, batch_size, num_spec_tokens)
    assert float(got) == pytest.approx(expected_ms)


def test_interpolation_is_vectorised_and_broadcasts() -> None:
    table = ItlTable.build(BS, KS, GRID)
    batch_sizes = np.arange(1, 20)[:, None]  # [19, 1]
    ks = np.arange(0, 6)[None, :]  # [1, 6]
    grid = table.itl_ms_at(batch_sizes, ks)  # [19, 6]
    assert grid.shape == (19, 6)
    for b in (1, 7, 19):
        for k in (0, 2, 5):
            assert grid[b - 1, k] == pytest.approx(float(table.itl_ms_at(b, k)))


@pytest.mark.parametrize("profile_factory", [h100_profile, fixture_profile])
def test_profiled_points_read_back_exactly(profile_factory) -> None:  # type: ignore[no-untyped-def]
    profile = profile_factory()
    table = ItlTable.from_profile(profile)
    for point in profile.latency:
        got = float(table.itl_ms_at(point.batch_size, point.num_spec_tokens))
        assert got == pytest.approx(point.median_ms, rel=1e-12)


@given(
    b=st.floats(min_value=0.0, max_value=400.0),
    k=st.floats(min_value=0.0, max_value=6.0),
)
def test_interpolated_itl_lies_within_the_profiled_range(b: float, k: float) -> None:
    table = ItlTable.from_profile(h100_profile())
    got = float(table.itl_ms_at(b, k))
    assert table.itl_ms.min() - 1e-9 <= got <= table.itl_ms.max() + 1e-9


def test_interpolation_is_monotone_in_b_and_k_on_the_h100_table() -> None:
    # The H100 table is increasing in both B and K, and linear interpolation keeps that.
    table = ItlTable.from_profile(h100_profile())
    grid = table.itl_ms_at(np.arange(1, 300)[:, None], np.arange(0, 6)[None, :])  # [299, 6]
    assert np.all(np.diff(grid, axis=0) >= -1e-12)
    assert np.all(np.diff(grid, axis=1) > 0)


def test_row_without_any_profiled_k_is_rejected() -> None:
    grid = GRID.copy()
    grid[1, :] = NAN
    with pytest.raises(ValueError, match="B=4 has no profiled K"):
        ItlTable.build(BS, KS, grid)
