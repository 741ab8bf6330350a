"""Exact summary statistics of a long stream of floats in bounded memory.

`PooledValues` takes values in batches (`add`) and answers count, mean, median, population std
and linear percentiles with numpy's definitions (`np.mean`, `np.median`, `np.std`,
`np.percentile`), so a run's pooled ITL list (one value per output chunk, millions in a
simulated hour) needs no more memory than `max_in_memory` values.

How: values are buffered in memory; when the buffer reaches `max_in_memory` it is sorted and
written as one run (an .npy file) to a private temporary folder, removed by `close()` or when
the object is collected. Order statistics are then found exactly by a binary search over the
float64 bit patterns (monotone for sortable keys) counting `searchsorted` over the memory-mapped
sorted runs, and interpolated with numpy itself on the two neighbouring order statistics, so
medians and percentiles are bit-for-bit numpy's. Mean and std are sums over the runs: equal to
numpy's up to the rounding of a different summation order (numpy sums pairwise in input order).
While nothing has spilled, every statistic is numpy's on the values in `add` order.

What it does not do: keep the input order after a spill, accept NaN, or write anything a user
sees (the spill folder is temporary and private).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray

DEFAULT_MAX_IN_MEMORY = 1 << 18  # values (2 MiB) buffered before a sorted run is spilled
_READ_CHUNK = 1 << 20  # values per slice when summing spilled runs
_SIGN_BIT = np.uint64(1 << 63)


def _sort_keys(values: FloatArray) -> npt.NDArray[np.uint64]:
    """Unsigned keys whose order is the float order (negative floats flip all bits)."""
    bits = values.view(np.uint64)
    negative = (bits & _SIGN_BIT) != 0
    keys: npt.NDArray[np.uint64] = np.where(negative, ~bits, bits | _SIGN_BIT)
    return keys


def _key_value(key: int) -> float:
    """The float whose sort key is `key` (inverse of `_sort_keys`)."""
    as_u64 = np.array([key], dtype=np.uint64)
    bits = np.where((as_u64 & _SIGN_BIT) != 0, as_u64 & ~_SIGN_BIT, ~as_u64)
    return float(bits.view(np.float64)[0])


class PooledValues:
    """A multiset of floats with numpy's summary statistics, spilling sorted runs past a cap."""

    def __init__(self, max_in_memory: int = DEFAULT_MAX_IN_MEMORY) -> None:
        if max_in_memory < 1:
            raise ValueError(f"max_in_memory must be >= 1, got {max_in_memory}")
        self.max_in_memory = max_in_memory
        self._buffer: list[FloatArray] = []  # batches not yet spilled, in add order
        self._num_buffered = 0
        self._runs: list[Path] = []  # spilled sorted runs
        self._num_spilled = 0
        self._spill_dir: Path | None = None
        self._cleanup: Callable[[], object] | None = None  # a weakref.finalize

    @classmethod
    def of(cls, values: npt.ArrayLike) -> PooledValues:
        """All of `values`, in memory."""
        array = np.asarray(values, dtype=np.float64).ravel()
        pooled = cls(max(1, array.shape[0]))
        pooled.add(array)
        return pooled

    @property
    def count(self) -> int:
        return self._num_buffered + self._num_spilled

    @property
    def num_spilled_runs(self) -> int:
        return len(self._runs)

    def add(self, values: FloatArray) -> None:
        """Add a batch (copied only when it is spilled; do not modify it afterwards)."""
        if values.shape[0] == 0:
            return
        if np.isnan(values).any():
            raise ValueError("PooledValues does not take NaN")
        self._buffer.append(values)
        self._num_buffered += values.shape[0]
        if self._num_buffered >= self.max_in_memory:
            self._spill()

    def _spill(self) -> None:
        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="dsd-pooled-"))
            self._cleanup = weakref.finalize(
                self, shutil.rmtree, str(self._spill_dir), ignore_errors=True
            )
        run = np.sort(np.concatenate(self._buffer))  # [max_in_memory or a little more]
        path = self._spill_dir / f"run{len(self._runs):06d}.npy"
        np.save(path, run)
        self._runs.append(path)
        self._num_spilled += run.shape[0]
        self._buffer.clear()
        self._num_buffered = 0

    def close(self) -> None:
        """Delete the spilled runs (the statistics are gone with them)."""
        if self._cleanup is not None:
            self._cleanup()
        self._runs.clear()
        self._num_spilled = 0

    # -- statistics --------------------------------------------------------------------------

    def summary(self, percentiles: tuple[float, ...] = ()) -> dict[str, float]:
        """{"mean", "median", "std", "p<q>" for q in percentiles}; empty reads as [0] (vLLM)."""
        if not self._runs:
            # `add` keeps no empty batch, so an empty buffer is the only empty case.
            values = np.concatenate(self._buffer) if self._buffer else np.zeros(1)
            result = {
                "mean": float(np.mean(values)),
                "median": float(np.median(values)),
                "std": float(np.std(values)),
            }
            for q in percentiles:
                result[f"p{q}"] = float(np.percentile(values, q))
            return result
        runs = self._sorted_runs()
        mean = self._total(runs, lambda chunk: float(np.sum(chunk))) / self.count
        squares = self._total(runs, lambda chunk: float(np.sum((chunk - mean) ** 2)))
        result = {
            "mean": mean,
            "median": self._median(runs),
            "std": math.sqrt(squares / self.count),
        }
        for q in percentiles:
            result[f"p{q}"] = self._percentile(runs, q)
        return result

    def _sorted_runs(self) -> list[FloatArray]:
        runs: list[FloatArray] = [np.load(path, mmap_mode="r") for path in self._runs]
        if self._buffer:
            runs.append(np.sort(np.concatenate(self._buffer)))
        return runs

    @staticmethod
    def _total(runs: list[FloatArray], chunk_sum: Callable[[FloatArray], float]) -> float:
        total = 0.0
        for run in runs:
            for start in range(0, run.shape[0], _READ_CHUNK):
                total += chunk_sum(np.asarray(run[start : start + _READ_CHUNK]))
        return total

    def _kth(self, runs: list[FloatArray], rank: int) -> float:
        """The rank-th smallest value (0-based) over all runs."""
        low = min(int(_sort_keys(np.asarray(run[:1]))[0]) for run in runs)
        high = max(int(_sort_keys(np.asarray(run[-1:]))[0]) for run in runs)
        # Smallest key whose value has more than `rank` values at or below it: a stored value.
        while low < high:
            middle = (low + high) // 2
            value = _key_value(middle)
            at_or_below = sum(int(np.searchsorted(run, value, side="right")) for run in runs)
            if at_or_below > rank:
                high = middle
            else:
                low = middle + 1
        return _key_value(low)

    def _median(self, runs: list[FloatArray]) -> float:
        n = self.count
        if n % 2:
            return self._kth(runs, n // 2)
        middle = np.array([self._kth(runs, n // 2 - 1), self._kth(runs, n // 2)])
        return float(np.median(middle))  # numpy's mean of the two middle values

    def _percentile(self, runs: list[FloatArray], q: float) -> float:
        # numpy's linear method: virtual index (n - 1) * q / 100 between two order statistics,
        # interpolated by numpy itself on [below, above] at the same fractional weight.
        n = self.count
        virtual_index = (n - 1) * (np.float64(q) / 100)
        below_rank = int(np.floor(virtual_index))
        weight = float(virtual_index - below_rank)
        below = self._kth(runs, below_rank)
        above = self._kth(runs, min(below_rank + 1, n - 1))
        return float(np.quantile(np.array([below, above]), weight))
