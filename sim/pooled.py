"""Exact summary statistics of a long stream of floats in bounded memory.

`PooledValues` takes values in batches (`add`) and answers count, mean, median, population std
and linear percentiles with numpy's definitions (`np.mean`, `np.median`, `np.std`,
`np.percentile`), so a run's pooled ITL list (one value per output chunk, millions in a
simulated hour) needs no more memory than `max_in_memory` values.

How: values are buffered in memory; when the buffer reaches `max_in_memory` it is sorted and
written as one run (raw float64) to a private temporary folder, removed by `close()` or when
the object is collected; of each run only every 1,024th value stays in memory (its index).
Order statistics are then found exactly by a binary search over the float64 bit patterns
(monotone for sortable keys), counting the values at or below a candidate in every run with the
run's index and one block of 1,024 values read from its file, and interpolated with numpy
itself on the two neighbouring order statistics, so medians and percentiles are bit-for-bit
numpy's. Mean and std are sums over the runs, read a slice at a time: equal to numpy's up to
the rounding of a different summation order (numpy sums pairwise in input order). No run is
memory-mapped: the pages of a map stay resident, and a search touching every run grew the
process by the whole pool (200 MB at 100,000 requests). While nothing has spilled, every
statistic is numpy's on the values in `add` order.

What it does not do: keep the input order after a spill, accept NaN, or write anything a user
sees (the spill folder is temporary and private).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray

DEFAULT_MAX_IN_MEMORY = 1 << 18  # values (2 MiB) buffered before a sorted run is spilled
_READ_CHUNK = 1 << 20  # values per slice when summing spilled runs
_INDEX_STEP = 1 << 10  # a spilled run keeps every this-many-th value in memory
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


@dataclass
class _SortedRun:
    """Sorted values, in memory or in a raw float64 file with every `_INDEX_STEP`-th in memory."""

    count: int  # values, >= 1
    first: float
    last: float
    path: Path | None = None  # the file of a spilled run
    index: FloatArray | None = None  # [ceil(count / _INDEX_STEP)] values[::_INDEX_STEP] (file)
    values: FloatArray | None = None  # [count] all of them (in memory)
    # the block last read (its start, its values): a binary search reads the same block again
    # and again once it has narrowed down
    _last_block: tuple[int, FloatArray] | None = None

    @staticmethod
    def spill(values: FloatArray, path: Path) -> _SortedRun:
        values.tofile(path)
        index = values[::_INDEX_STEP].copy()
        return _SortedRun(values.shape[0], float(values[0]), float(values[-1]), path, index)

    @staticmethod
    def in_memory(values: FloatArray) -> _SortedRun:
        return _SortedRun(values.shape[0], float(values[0]), float(values[-1]), values=values)

    def _read(self, start: int, count: int) -> FloatArray:
        assert self.path is not None
        with self.path.open("rb") as file:
            file.seek(start * 8)
            return np.fromfile(file, dtype=np.float64, count=count)

    def at_or_below(self, value: float) -> int:
        """How many values are <= `value` (np.searchsorted side="right")."""
        if self.values is not None:
            return int(np.searchsorted(self.values, value, side="right"))
        assert self.index is not None
        # Blocks whose first value is <= value: all of their predecessors' values are too
        blocks = int(np.searchsorted(self.index, value, side="right"))
        if blocks == 0:
            return 0
        start = (blocks - 1) * _INDEX_STEP
        if self._last_block is None or self._last_block[0] != start:
            self._last_block = (start, self._read(start, min(_INDEX_STEP, self.count - start)))
        return start + int(np.searchsorted(self._last_block[1], value, side="right"))

    def chunks(self) -> Iterator[FloatArray]:
        """The values in order, `_READ_CHUNK` at a time."""
        for start in range(0, self.count, _READ_CHUNK):
            count = min(_READ_CHUNK, self.count - start)
            if self.values is not None:
                yield self.values[start : start + count]
            else:
                yield self._read(start, count)


class PooledValues:
    """A multiset of floats with numpy's summary statistics, spilling sorted runs past a cap."""

    def __init__(self, max_in_memory: int = DEFAULT_MAX_IN_MEMORY) -> None:
        if max_in_memory < 1:
            raise ValueError(f"max_in_memory must be >= 1, got {max_in_memory}")
        self.max_in_memory = max_in_memory
        self._buffer: list[FloatArray] = []  # batches not yet spilled, in add order
        self._num_buffered = 0
        self._runs: list[_SortedRun] = []  # spilled sorted runs
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
        path = self._spill_dir / f"run{len(self._runs):06d}.f64"
        self._runs.append(_SortedRun.spill(run, path))
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
            count = values.shape[0]
            ranks = _median_ranks(count) + [
                rank for q in percentiles for rank in _linear_ranks(count, q)[:2]
            ]
            part = np.partition(values, sorted(set(ranks)))  # one pass for every order statistic
            result = {
                "mean": float(np.mean(values)),
                "median": _median(count, part.item),
                "std": float(np.std(values)),
            }
            for q in percentiles:
                result[f"p{q}"] = _percentile(count, q, part.item)
            return result
        runs = list(self._runs)
        if self._buffer:
            runs.append(_SortedRun.in_memory(np.sort(np.concatenate(self._buffer))))
        mean = self._total(runs, lambda chunk: float(np.sum(chunk))) / self.count
        squares = self._total(runs, lambda chunk: float(np.sum((chunk - mean) ** 2)))

        def kth(rank: int) -> float:
            return self._kth(runs, rank)

        result = {
            "mean": mean,
            "median": _median(self.count, kth),
            "std": math.sqrt(squares / self.count),
        }
        for q in percentiles:
            result[f"p{q}"] = _percentile(self.count, q, kth)
        return result

    @staticmethod
    def _total(runs: list[_SortedRun], chunk_sum: Callable[[FloatArray], float]) -> float:
        total = 0.0
        for run in runs:
            for chunk in run.chunks():
                total += chunk_sum(chunk)
        return total

    def _kth(self, runs: list[_SortedRun], rank: int) -> float:
        """The rank-th smallest value (0-based) over all runs."""
        low = min(int(_sort_keys(np.array([run.first]))[0]) for run in runs)
        high = max(int(_sort_keys(np.array([run.last]))[0]) for run in runs)
        # Smallest key whose value has more than `rank` values at or below it: a stored value.
        while low < high:
            middle = (low + high) // 2
            value = _key_value(middle)
            at_or_below = sum(run.at_or_below(value) for run in runs)
            if at_or_below > rank:
                high = middle
            else:
                low = middle + 1
        return _key_value(low)


# numpy's median and 'linear' percentile from order statistics (`kth(rank)`: the rank-th
# smallest value), bit for bit: the same ranks, weights and float operations as numpy's own
# (np.median, np.percentile, whose first call also imports numpy.ma: ~15 ms).


def _median_ranks(count: int) -> list[int]:
    return [count // 2] if count % 2 else [count // 2 - 1, count // 2]


def _median(count: int, kth: Callable[[int], float]) -> float:
    middle = [kth(rank) for rank in _median_ranks(count)]
    return middle[0] if len(middle) == 1 else (middle[0] + middle[1]) / 2  # numpy's mean


def _linear_ranks(count: int, q: float) -> tuple[int, int, float]:
    """The ranks below and above numpy's virtual index (count - 1) * q / 100, and its weight."""
    virtual_index = (count - 1) * (np.float64(q) / 100)
    below = int(np.floor(virtual_index))
    return below, min(below + 1, count - 1), float(virtual_index - below)


def _percentile(count: int, q: float, kth: Callable[[int], float]) -> float:
    below_rank, above_rank, weight = _linear_ranks(count, q)
    below, above = kth(below_rank), kth(above_rank)
    # numpy's _lerp: from the nearer end
    difference = above - below
    if weight >= 0.5:
        return above - difference * (1 - weight)
    return below + difference * weight
