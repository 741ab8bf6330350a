"""The oracle envelope: the best static K per concurrency, from a sweep of static-K runs.

`StaticSweep.best_static_k` picks, per concurrency, the static K with the lowest mean TPOT in a
table of static-K runs (simulated or real; the sweep itself belongs to the evaluation, not
here): the envelope that dynamic policies are compared to. `EnvelopePolicy` (SPEC
`envelope:PATH`) applies it by batch size, since a closed loop at concurrency C runs at B ~ C:
B takes the K of the swept concurrency nearest to it on a log scale; `to_range_table` gives the
same map as a vLLM range table. The rule and the table file: docs/policies.md, "envelope".

It does not run anything and does not interpolate TPOT between concurrencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError, require_int
from dsd.common.user_files import parse_user_json, read_user_text
from dsd.policies.range_table import RangeTable, compile_range_table
from dsd.policies.types import MAX_NUM_SEQS, StepFeedback, StepView


@dataclass(frozen=True)
class StaticSweep:
    """Mean TPOT of static-K runs on a (concurrency, K) grid; NaN where a cell was not run."""

    concurrencies: IntArray  # [nC] strictly increasing, >= 1
    ks: IntArray  # [nK] strictly increasing, >= 0
    mean_tpot_ms: FloatArray  # [nC, nK] finite > 0, or NaN (not run)

    def __post_init__(self) -> None:
        if self.mean_tpot_ms.shape != (len(self.concurrencies), len(self.ks)):
            raise InputError(
                f"static sweep: TPOT shape {self.mean_tpot_ms.shape} does not match "
                f"{len(self.concurrencies)} concurrencies x {len(self.ks)} K"
            )
        if len(self.concurrencies) == 0 or self.concurrencies[0] < 1:
            raise InputError("static sweep: needs concurrencies >= 1")
        if np.any(np.diff(self.concurrencies) <= 0) or np.any(np.diff(self.ks) <= 0):
            raise InputError("static sweep: concurrencies and K must be strictly increasing")
        if len(self.ks) == 0 or self.ks[0] < 0:
            raise InputError("static sweep: needs K >= 0")
        run = ~np.isnan(self.mean_tpot_ms)
        if np.any(run & ~(np.isfinite(self.mean_tpot_ms) & (self.mean_tpot_ms > 0))):
            raise InputError("static sweep: mean_tpot_ms must be finite and > 0")
        empty = np.flatnonzero(~run.any(axis=1))
        if empty.size:
            raise InputError(
                f"static sweep: concurrency {int(self.concurrencies[empty[0]])} has no K run"
            )

    @staticmethod
    def from_records(records: Sequence[Any], source: str = "static sweep") -> StaticSweep:
        """From `[{"concurrency": C, "k": K, "mean_tpot_ms": T}, ...]` (any order)."""
        if not isinstance(records, list | tuple) or not records:
            raise InputError(f"{source}: expected a non-empty list of records")
        cells: dict[tuple[int, int], float] = {}
        for index, record in enumerate(records):
            where = f"{source}[{index}]"
            if not isinstance(record, dict):
                raise InputError(f"{where}: expected an object, got {record!r}")
            for key in ("concurrency", "k", "mean_tpot_ms"):
                if key not in record:
                    raise InputError(f"{where}: missing {key!r}")
            concurrency, k, tpot = record["concurrency"], record["k"], record["mean_tpot_ms"]
            require_int(concurrency, f"{where}: concurrency", 1)
            require_int(k, f"{where}: k", 0)
            if (
                isinstance(tpot, bool)
                or not isinstance(tpot, int | float)
                or not (np.isfinite(tpot) and tpot > 0)
            ):
                raise InputError(f"{where}: mean_tpot_ms must be finite and > 0, got {tpot!r}")
            if (concurrency, k) in cells:
                raise InputError(f"{where}: duplicate cell concurrency={concurrency}, k={k}")
            cells[(concurrency, k)] = float(tpot)
        concurrencies = sorted({c for c, _ in cells})
        ks = sorted({k for _, k in cells})
        grid = np.full((len(concurrencies), len(ks)), np.nan)
        for (c, k), tpot in cells.items():
            grid[concurrencies.index(c), ks.index(k)] = tpot
        return StaticSweep(
            concurrencies=np.array(concurrencies, dtype=np.int64),
            ks=np.array(ks, dtype=np.int64),
            mean_tpot_ms=grid,
        )

    @staticmethod
    def read(path: str) -> StaticSweep:
        # NaN passes: a sweep's table marks a cell it could not run so
        data = parse_user_json(read_user_text(path), path, allow_nonfinite=True)
        return StaticSweep.from_records(data, path)

    def best_static_k(self, tie_tolerance: float = 0.0) -> tuple[IntArray, FloatArray]:
        """([nC] best K, [nC] its mean TPOT ms): smallest K within tie_tolerance of the min."""
        tpot = np.where(np.isnan(self.mean_tpot_ms), np.inf, self.mean_tpot_ms)  # [nC, nK]
        best_tpot = tpot.min(axis=1)  # [nC]
        near_best = tpot <= best_tpot[:, None] * (1.0 + tie_tolerance)  # [nC, nK]
        choice = np.argmax(near_best, axis=1)  # first True: smallest K
        rows = np.arange(len(self.concurrencies))
        return self.ks[choice].astype(np.int64), tpot[rows, choice]


def nearest_concurrency(concurrencies: IntArray, max_num_seqs: int) -> IntArray:
    """[max_num_seqs] index of the swept concurrency nearest to B = 1..max_num_seqs in log B.

    The boundary between neighbours C_i < C_j is sqrt(C_i C_j); a B exactly on it goes to C_i.
    Compared in integers (B^2 against C_i C_j), so no rounding decides a boundary.
    """
    batch_sizes = np.arange(1, max_num_seqs + 1, dtype=np.int64)  # [N]
    c = concurrencies.astype(np.int64)  # [nC]
    # B belongs above boundary i (between c[i] and c[i+1]) when B^2 > c[i] c[i+1].
    products = c[:-1] * c[1:]  # [nC - 1]
    above = batch_sizes[:, None] ** 2 > products[None, :]  # [N, nC - 1]
    owner: IntArray = above.sum(axis=1).astype(np.int64)  # [N]
    return owner


class EnvelopePolicy:
    """Best static K per concurrency, applied by batch size (nearest swept C on a log scale)."""

    BATCH_SIZE_ONLY: ClassVar[bool] = True  # K = f(B, k_max); observe learns nothing

    def __init__(self, sweep: StaticSweep, max_num_seqs: int, tie_tolerance: float = 0.0) -> None:
        require_int(max_num_seqs, "envelope: max_num_seqs", 1, MAX_NUM_SEQS)
        self.sweep = sweep
        self.max_num_seqs = max_num_seqs
        self.best_k, self.best_tpot_ms = sweep.best_static_k(tie_tolerance)  # [nC] each
        self.k_by_batch = self.best_k[nearest_concurrency(sweep.concurrencies, max_num_seqs)]

    def choose_k(self, view: StepView) -> int:
        if view.batch_size > self.max_num_seqs:
            raise InputError(
                f"envelope: batch size {view.batch_size} exceeds max_num_seqs {self.max_num_seqs}"
            )
        return min(int(self.k_by_batch[max(view.batch_size, 1) - 1]), max(view.k_max, 0))

    def observe(self, feedback: StepFeedback) -> None:
        """A fixed map: nothing to learn."""

    def to_range_table(self, k_max: int) -> RangeTable:
        return compile_range_table(self, k_max, self.max_num_seqs)
