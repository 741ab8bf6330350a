"""PooledValues: numpy's statistics of a stream, exact order statistics after spilling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dsd.sim.pooled import PooledValues

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)
value_arrays = arrays(np.float64, st.integers(1, 200), elements=finite)
# Ties are the common case in a simulation (every row of a step shares its ITL).
tied_arrays = arrays(np.float64, st.integers(1, 200), elements=st.sampled_from([0.0, 1.5, 7.25]))


def _pooled(values: np.ndarray, max_in_memory: int, batch: int) -> PooledValues:
    pooled = PooledValues(max_in_memory)
    for start in range(0, values.shape[0], batch):
        pooled.add(values[start : start + batch])
    return pooled


@given(
    values=st.one_of(value_arrays, tied_arrays),
    max_in_memory=st.integers(1, 9),
    batch=st.integers(1, 13),
    percentile=st.floats(0, 100),
)
def test_spilled_order_statistics_equal_numpy_bit_for_bit(values, max_in_memory, batch, percentile):
    pooled = _pooled(values, max_in_memory, batch)
    try:
        summary = pooled.summary((percentile, 99.0))
        assert pooled.count == values.shape[0]
        assert summary["median"] == float(np.median(values))
        assert summary[f"p{percentile}"] == float(np.percentile(values, percentile))
        assert summary["p99.0"] == float(np.percentile(values, 99.0))
        scale = float(np.abs(values).max()) or 1.0
        assert math.isclose(summary["mean"], float(np.mean(values)), abs_tol=1e-12 * scale)
        assert math.isclose(summary["std"], float(np.std(values)), abs_tol=1e-6 * scale)
    finally:
        pooled.close()


@given(
    values=st.one_of(value_arrays, tied_arrays),
    batch=st.integers(1, 13),
    percentile=st.floats(0, 100),
)
def test_in_memory_statistics_are_numpys_on_the_values_in_add_order(values, batch, percentile):
    pooled = _pooled(values, values.shape[0] + 1, batch)
    summary = pooled.summary((99.0, percentile))
    assert pooled.num_spilled_runs == 0
    assert summary == {
        "mean": float(np.mean(values)),
        "median": float(np.median(values)),
        "std": float(np.std(values)),
        "p99.0": float(np.percentile(values, 99.0)),
        f"p{percentile}": float(np.percentile(values, percentile)),
    }


def test_spilled_runs_hold_at_most_the_cap_and_close_deletes_them():
    pooled = _pooled(np.arange(100, dtype=np.float64)[::-1].copy(), max_in_memory=10, batch=10)
    assert pooled.num_spilled_runs == 10  # a run each time the buffer reaches the cap
    spill_dir = pooled._spill_dir
    assert spill_dir is not None and len(list(spill_dir.iterdir())) == 10
    assert pooled.summary((50.0,))["p50.0"] == 49.5
    pooled.close()
    assert not spill_dir.exists()


def test_empty_reads_as_zero_like_vllm_and_nan_is_refused():
    assert PooledValues().summary((99.0,)) == {"mean": 0.0, "median": 0.0, "std": 0.0, "p99.0": 0.0}
    with pytest.raises(ValueError, match="NaN"):
        PooledValues().add(np.array([1.0, np.nan]))
