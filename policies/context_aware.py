"""Context-aware K: the step latency depends on how much context the batch reads, not only on B.

With long contexts a decode step spends much of its time reading the KV cache, which costs the
same whatever K is, so the extra verified tokens of a larger K are relatively cheaper and the
best K at a given B can rise. Two forms (their rules: docs/policies.md, "context"):
`ContextGoodputPolicy` maximises AL(k) / ITL(B, k, context) with a latency function passed in
(`ContextLatencyFn`: policies cannot import the simulator, so the app layer hands in the sim's
fitted model) or a small measured grid (`ContextLatencyGrid`); `ContextRangeTablePolicy` reads
a `[start_bs, end_bs, start_ctx, end_ctx, K]` table, the 5-tuple form proposed for vLLM, which
`compile_context_table` builds from the first form.

Neither form learns acceptance (see `policies.online`) or chooses K per request.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError, require_int
from dsd.common.user_files import read_json_argument
from dsd.policies.goodput import (
    acceptance_lengths,
    expected_itl_ms,
    partial_draft_rates,
    table_batch_size,
)
from dsd.policies.profile import Profile
from dsd.policies.range_table import (
    check_batch_ranges,
    check_interval,
    check_k,
    integer_entries,
)
from dsd.policies.types import MAX_NUM_SEQS, StepFeedback, StepView

# (decode rows B, K values [n], total context tokens of the B rows) -> step latency ms [n].
ContextLatencyFn = Callable[[float, FloatArray, float], FloatArray]
ContextTable = list[list[int]]  # [[start_bs, end_bs, start_ctx, end_ctx, K], ...]


def _weights(points: FloatArray, query: float) -> tuple[int, int, float]:
    """Bracketing indices and weight of a scalar query on sorted points, clamped at the ends."""
    clamped = min(max(query, float(points[0])), float(points[-1]))
    hi = min(int(np.searchsorted(points, clamped, side="left")), len(points) - 1)
    lo = max(hi - 1, 0)
    span = float(points[hi] - points[lo])
    return lo, hi, (clamped - float(points[lo])) / span if span > 0 else 1.0


@dataclass(frozen=True)
class ContextLatencyGrid:
    """Measured ITL on a full (B, mean context per row, K) grid, read multilinearly, clamped."""

    batch_sizes: IntArray  # [nB] strictly increasing, >= 1
    context_lens: IntArray  # [nC] mean context per decode row, tokens, strictly increasing
    ks: IntArray  # [nK] strictly increasing, >= 0
    itl_ms: FloatArray  # [nB, nC, nK] finite, > 0

    def __post_init__(self) -> None:
        shape = (len(self.batch_sizes), len(self.context_lens), len(self.ks))
        if self.itl_ms.shape != shape or 0 in shape:
            raise InputError(f"context latency grid: shape {self.itl_ms.shape} != axes {shape}")
        for name in ("batch_sizes", "context_lens", "ks"):
            if np.any(np.diff(getattr(self, name)) <= 0):
                raise InputError(f"context latency grid: {name} must be strictly increasing")
        if not np.all(np.isfinite(self.itl_ms) & (self.itl_ms > 0)):
            raise InputError("context latency grid: every ITL must be finite and > 0")

    @staticmethod
    def from_profile(profile: Profile) -> ContextLatencyGrid:
        """From latency points that record context_len; every (B, context, K) must be present."""
        points = [p for p in profile.latency if p.context_len is not None]
        if not points:
            raise InputError("profile: no latency point records context_len")
        bs = sorted({p.batch_size for p in points})
        ctx = sorted({int(p.context_len or 0) for p in points})
        ks = sorted({p.num_spec_tokens for p in points})
        sums = np.zeros((len(bs), len(ctx), len(ks)))
        counts = np.zeros_like(sums)
        for p in points:
            index = (bs.index(p.batch_size), ctx.index(int(p.context_len or 0)))
            sums[(*index, ks.index(p.num_spec_tokens))] += p.expected_ms
            counts[(*index, ks.index(p.num_spec_tokens))] += 1
        if np.any(counts == 0):
            missing = np.argwhere(counts == 0)[0]
            raise InputError(
                f"profile: latency grid is missing B={bs[missing[0]]}, "
                f"context_len={ctx[missing[1]]}, K={ks[missing[2]]}"
            )
        return ContextLatencyGrid(
            batch_sizes=np.array(bs, dtype=np.int64),
            context_lens=np.array(ctx, dtype=np.int64),
            ks=np.array(ks, dtype=np.int64),
            itl_ms=sums / counts,
        )

    def itl_ms_at(
        self, batch_size: float, num_spec_tokens: FloatArray, context_tokens: float
    ) -> FloatArray:
        """ITL ms for one (B, total context) and an array of K, multilinear, clamped."""
        b_lo, b_hi, b_w = _weights(self.batch_sizes.astype(np.float64), batch_size)
        mean_ctx = context_tokens / max(batch_size, 1.0)
        c_lo, c_hi, c_w = _weights(self.context_lens.astype(np.float64), mean_ctx)
        plane = (
            (1 - b_w) * (1 - c_w) * self.itl_ms[b_lo, c_lo]
            + (1 - b_w) * c_w * self.itl_ms[b_lo, c_hi]
            + b_w * (1 - c_w) * self.itl_ms[b_hi, c_lo]
            + b_w * c_w * self.itl_ms[b_hi, c_hi]
        )  # [nK]
        k_query = np.asarray(num_spec_tokens, dtype=np.float64)
        return np.asarray(np.interp(k_query, self.ks.astype(np.float64), plane), dtype=np.float64)

    def __call__(
        self, batch_size: float, num_spec_tokens: FloatArray, context_tokens: float
    ) -> FloatArray:
        return self.itl_ms_at(batch_size, num_spec_tokens, context_tokens)


class ContextGoodputPolicy:
    """K* = argmax_k AL(k) / ITL(B, k, total context), read from the view every step."""

    def __init__(
        self,
        latency_ms: ContextLatencyFn,
        acceptance_rates: Sequence[float],
        k_max: int,
        draft_rates: Sequence[float] | None = None,
    ) -> None:
        """`draft_rates` s_i (None: every step drafts its K): K is then priced at its expected
        ITL over the rows' drafted counts (`policies.goodput.expected_itl_ms`)."""
        require_int(k_max, "context: k_max", 0)
        self.latency_ms = latency_ms
        self.k_max = k_max
        self.al_by_k = acceptance_lengths(acceptance_rates, k_max)  # [k_max + 1]
        self.k_values = np.arange(k_max + 1, dtype=np.float64)  # [k_max + 1]
        self.draft_rates = partial_draft_rates(draft_rates, k_max)  # [k_max] or None

    def best_k(self, num_decode: int, context_tokens: float, k_cap: int) -> int:
        """The goodput-optimal K at `num_decode` rows reading `context_tokens` in total."""
        if k_cap <= 0:
            return 0
        ks = self.k_values[: k_cap + 1]  # [k+1]
        itl = np.asarray(
            self.latency_ms(float(max(num_decode, 1)), ks, float(context_tokens)), dtype=np.float64
        )  # [k+1]
        if self.draft_rates is not None:
            itl = expected_itl_ms(itl[None, :], self.draft_rates, [max(num_decode, 1)])[0]
        return int(np.argmax(self.al_by_k[: k_cap + 1] / itl))  # first max: smallest K on ties

    def choose_k(self, view: StepView) -> int:
        k_cap = min(self.k_max, max(view.k_max, 0))
        num_decode = int(view.num_decode_reqs)
        batch_size = table_batch_size(view)
        lens = view.context_lens
        mean_context = float(np.sum(lens)) / len(lens) if num_decode and len(lens) else 0.0
        return self.best_k(batch_size, mean_context * batch_size, k_cap)

    def observe(self, feedback: StepFeedback) -> None:
        """Fixed acceptance and latency: nothing to learn."""


def validate_context_ranges(entries: Any, source: str = "context table") -> ContextTable:
    """Entries sorted by (start_bs, start_ctx), checked against the rules in the docstring."""
    checked = integer_entries(entries, source, ("start_bs", "end_bs", "start_ctx", "end_ctx", "K"))
    for index, (start_bs, end_bs, start_ctx, end_ctx, k) in enumerate(checked):
        where = f"{source}[{index}]"
        check_interval(where, "batch size", (start_bs, end_bs), ("start_bs", "end_bs"))
        check_interval(where, "context", (start_ctx, end_ctx), ("start_ctx", "end_ctx"))
        check_k(where, k)
    checked.sort(key=lambda e: (e[0], e[2]))
    b_ranges = sorted({(e[0], e[1]) for e in checked})
    check_batch_ranges(source, b_ranges)
    for b_range in b_ranges:
        group = [e for e in checked if (e[0], e[1]) == b_range]
        if group[0][2] != 0:
            raise InputError(
                f"{source}: batch size range {list(b_range)}: the first context range must "
                f"start at 0, got {group[0][2]}"
            )
        for previous_entry, current_entry in itertools.pairwise(group):
            if current_entry[2] <= previous_entry[3]:
                raise InputError(
                    f"{source}: entries {previous_entry} and {current_entry} overlap in context"
                )
    return checked


def read_context_ranges(text_or_path: str) -> ContextTable:
    """Inline JSON (starting with '[') or the path of a JSON file holding the list."""
    data, source = read_json_argument(text_or_path, "context table", opening="[")
    return validate_context_ranges(data, source)


# Context starts above this cannot be reached (no context is that long); larger ones clamp here.
MAX_CONTEXT = 2**62


class ContextRangeTablePolicy:
    """K from a (B range, mean context range) table, looked up per step in O(log entries)."""

    def __init__(self, entries: Sequence[Sequence[int]], k_max: int, max_num_seqs: int) -> None:
        require_int(k_max, "context table: k_max", 0)
        require_int(max_num_seqs, "context table: max_num_seqs", 1, MAX_NUM_SEQS)
        self.entries = validate_context_ranges(list(entries))
        self.k_max = k_max
        self.max_num_seqs = max_num_seqs
        groups = sorted({(e[0], e[1]) for e in self.entries})
        # Clamped in Python first (like vLLM's range-table lookup): bounds and K of any size.
        group_starts = np.array([min(g[0], max_num_seqs + 1) for g in groups], dtype=np.int64)
        batch_sizes = np.arange(1, max_num_seqs + 1)  # [max_num_seqs]
        # The B range a B falls in, or the last one starting before it (gap / tail carry).
        self.group_by_batch = np.searchsorted(group_starts, batch_sizes, side="right") - 1  # [N]
        self.ctx_starts: list[IntArray] = []  # per group: [E_g] context range starts
        self.ctx_ks: list[IntArray] = []  # per group: [E_g] K, clamped to k_max
        for group in groups:
            rows = [e for e in self.entries if (e[0], e[1]) == group]
            self.ctx_starts.append(np.array([min(e[2], MAX_CONTEXT) for e in rows], dtype=np.int64))
            self.ctx_ks.append(np.array([min(e[4], k_max) for e in rows], dtype=np.int64))

    def k_for(self, batch_size: int, mean_context: float) -> int:
        if batch_size > self.max_num_seqs:
            raise InputError(
                f"context table: batch size {batch_size} exceeds max_num_seqs {self.max_num_seqs}"
            )
        group = int(self.group_by_batch[max(batch_size, 1) - 1])
        starts = self.ctx_starts[group]
        owner = max(int(np.searchsorted(starts, mean_context, side="right")) - 1, 0)
        return int(self.ctx_ks[group][owner])

    def choose_k(self, view: StepView) -> int:
        lens = view.context_lens
        mean_context = float(np.mean(lens)) if len(lens) else 0.0
        return min(self.k_for(int(view.batch_size), mean_context), max(view.k_max, 0))

    def observe(self, feedback: StepFeedback) -> None:
        """A fixed table: nothing to learn."""


def compile_context_table(
    policy: ContextGoodputPolicy,
    max_num_seqs: int,
    context_edges: Sequence[int],
    max_context: int,
) -> ContextTable:
    """The 5-tuple table of `policy` on context buckets [e_j, e_{j+1} - 1], last to max_context.

    Each bucket is decided at its midpoint mean context; B ranges are the runs of B whose K over
    all buckets is identical, and within a B range adjacent buckets with equal K are merged.
    The table is exact at the midpoints and approximate between them (that is the table's job).
    """
    edges = [int(e) for e in context_edges]
    if not edges or edges[0] != 0 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise InputError(f"context edges must start at 0 and increase, got {edges}")
    if max_context < edges[-1]:
        raise InputError(f"max_context {max_context} is below the last context edge {edges[-1]}")
    ends = [e - 1 for e in edges[1:]] + [max_context]
    midpoints = [(start + end) / 2.0 for start, end in zip(edges, ends, strict=True)]
    k_grid = np.array(
        [
            [policy.best_k(b, mid * b, policy.k_max) for mid in midpoints]
            for b in range(1, max_num_seqs + 1)
        ],
        dtype=np.int64,
    )  # [max_num_seqs, num_buckets]
    table: ContextTable = []
    start_b = 1
    for b in range(2, max_num_seqs + 2):
        if b <= max_num_seqs and np.array_equal(k_grid[b - 1], k_grid[start_b - 1]):
            continue
        row = k_grid[start_b - 1]
        bucket = 0
        for j in range(1, len(edges) + 1):
            if j < len(edges) and row[j] == row[bucket]:
                continue
            table.append([start_b, b - 1, edges[bucket], ends[j - 1], int(row[bucket])])
            bucket = j
        start_b = b
    return table
