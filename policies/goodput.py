"""The goodput K policy (vLLM PR #32374 rules) and the ITL interpolation it shares with the sim.

`GoodputPolicy` picks, per batch size B, the K maximising AL(K) / ITL(B, K) (the smallest on
ties) from a table precomputed for B = 1..max_num_seqs, so `choose_k` is a lookup. AL comes
from the profile's per-position rates, or from walking its greedy draft sequences where it has
them (`sequence_acceptance`); ITL from the profiled table by piecewise-linear interpolation
(`ItlTable`, `interpolate_itl_ms`), which the simulator's table latency model calls rather than
re-implements, so that the policy and the simulated engine agree on ITL exactly; with a drafter
that may draft fewer than K, its expectation over drafted counts (`expected_itl_ms`). The rule
and the interpolation: docs/policies.md, "goodput".

This module does not read files (see `policies.profile_io`), does not learn at run time (see
`policies.online`), and does not model prefill or context length: ITL here is a function of
(B, K) only, as in the PR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError, require_int
from dsd.policies.profile import Profile
from dsd.policies.types import MAX_NUM_SEQS, StepFeedback, StepView


def _linear_weights(points: FloatArray, query: FloatArray) -> tuple[IntArray, IntArray, FloatArray]:
    """Bracketing indices and weight of `query` on sorted `points`, clamped at both ends.

    value(query) = (1 - w) * value[lo] + w * value[hi].
    """
    clamped = np.clip(query, points[0], points[-1])
    # hi is the first point >= query (side="left"), so an exact hit gets w == 1 on itself.
    hi = np.searchsorted(points, clamped, side="left").astype(np.int64)
    hi = np.clip(hi, 0, len(points) - 1)
    lo = np.maximum(hi - 1, 0)
    span = points[hi] - points[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        weight = np.where(span > 0, (clamped - points[lo]) / np.where(span > 0, span, 1.0), 1.0)
    return lo, hi, weight.astype(np.float64)


@dataclass(frozen=True)
class ItlTable:
    """A profiled ITL(B, K) table with every K filled in per profiled B. Build with `build`."""

    batch_sizes: IntArray  # [nB] profiled B, strictly increasing, >= 1
    ks: IntArray  # [nK] every K profiled at some B, strictly increasing, >= 0
    itl_ms: FloatArray  # [nB, nK] ITL in ms; K gaps of a row filled linearly in K; finite > 0

    @staticmethod
    def build(batch_sizes: npt.ArrayLike, ks: npt.ArrayLike, itl_grid: npt.ArrayLike) -> ItlTable:
        """From a grid with NaN where a (B, K) was not profiled (as `Profile.itl_grid()` gives).

        Each row needs at least one profiled K. Missing K of a row are filled linearly in K
        between that row's profiled K, clamped at the row's smallest/largest profiled K.
        """
        bs = np.asarray(batch_sizes, dtype=np.int64)  # [nB]
        k_values = np.asarray(ks, dtype=np.int64)  # [nK]
        grid = np.asarray(itl_grid, dtype=np.float64)  # [nB, nK]
        if bs.ndim != 1 or k_values.ndim != 1 or grid.shape != (len(bs), len(k_values)):
            raise ValueError(
                f"ITL grid shape {grid.shape} does not match {len(bs)} B x {len(k_values)} K"
            )
        if len(bs) == 0 or len(k_values) == 0:
            raise ValueError("ITL grid is empty")
        if np.any(np.diff(bs) <= 0) or np.any(np.diff(k_values) <= 0):
            raise ValueError("ITL grid axes must be strictly increasing")
        filled = np.empty_like(grid)  # [nB, nK]
        k_float = k_values.astype(np.float64)
        for row in range(len(bs)):
            profiled = np.isfinite(grid[row])  # [nK]
            if not profiled.any():
                raise ValueError(f"ITL grid row B={int(bs[row])} has no profiled K")
            filled[row] = np.interp(k_float, k_float[profiled], grid[row, profiled])
        filled.setflags(write=False)
        bs.setflags(write=False)
        k_values.setflags(write=False)
        return ItlTable(batch_sizes=bs, ks=k_values, itl_ms=filled)

    @staticmethod
    def from_profile(profile: Profile) -> ItlTable:
        """The profile's decode table (points at several context lengths averaged)."""
        bs, ks, grid = profile.itl_grid()
        return ItlTable.build(bs, ks, grid)

    def itl_ms_at(self, batch_size: npt.ArrayLike, num_spec_tokens: npt.ArrayLike) -> FloatArray:
        """ITL(B, K) in ms, bilinear on the filled grid, clamped at the profiled ends.

        `batch_size` and `num_spec_tokens` broadcast against each other; fractional values are
        allowed. Returns a float64 array of the broadcast shape (0-d for two scalars).
        """
        b_query, k_query = np.broadcast_arrays(
            np.asarray(batch_size, dtype=np.float64), np.asarray(num_spec_tokens, dtype=np.float64)
        )
        b_lo, b_hi, b_w = _linear_weights(self.batch_sizes.astype(np.float64), b_query)
        k_lo, k_hi, k_w = _linear_weights(self.ks.astype(np.float64), k_query)
        grid = self.itl_ms
        at_b_lo = (1.0 - k_w) * grid[b_lo, k_lo] + k_w * grid[b_lo, k_hi]
        at_b_hi = (1.0 - k_w) * grid[b_hi, k_lo] + k_w * grid[b_hi, k_hi]
        return np.asarray((1.0 - b_w) * at_b_lo + b_w * at_b_hi, dtype=np.float64)


def interpolate_itl_ms(
    batch_sizes: npt.ArrayLike,
    ks: npt.ArrayLike,
    itl_grid: npt.ArrayLike,
    batch_size: npt.ArrayLike,
    num_spec_tokens: npt.ArrayLike,
) -> FloatArray:
    """ITL(B, K) in ms from a profiled grid (NaN = not profiled); vectorised over B and K.

    Exactly the goodput policy's interpolation: per profiled B linear in K, then linear in B,
    clamped at the profiled ends. Hot callers should build an `ItlTable` once instead.
    """
    return ItlTable.build(batch_sizes, ks, itl_grid).itl_ms_at(batch_size, num_spec_tokens)


def acceptance_lengths(acceptance_rates: Sequence[float] | FloatArray, k_max: int) -> FloatArray:
    """[k_max + 1] AL(k) = 1 + sum_{i<=k} r_i for k = 0..k_max."""
    rates = np.asarray(acceptance_rates, dtype=np.float64)[:k_max]  # [k_max]
    if len(rates) < k_max:
        raise ValueError(f"need {k_max} acceptance rates, got {len(rates)}")
    return np.concatenate(([1.0], 1.0 + np.cumsum(rates)))  # [k_max + 1]


@dataclass(frozen=True)
class SequenceAcceptance:
    """AL(k) and drafted counts per k from greedy draft sequences (`sequence_acceptance`)."""

    acceptance_length: FloatArray  # [k_max + 1] output tokens per step at k = 0..k_max
    # [k_max + 1, k_max] row k: P(d >= i) for i = 1..k_max at the steps of a run at k (0 past k)
    draft_rates: FloatArray
    # [k_max + 1] E[a | d] for d = 0..k_max: the accepted drafts of the steps of a run at k = d
    # that drafted all d (what a row that drafted d is expected to accept; per-request's level)
    accepted_given_drafted: FloatArray


def sequence_acceptance(
    draft_sequences: Sequence[tuple[Sequence[int], Sequence[int]]], k_max: int
) -> SequenceAcceptance:
    """Walk every (available, matched) sequence at each k = 0..k_max: at output position p a
    step drafts d = min(available[p], k), accepts a = min(matched[p], d), emits a + 1 tokens and
    moves to p + a + 1. AL(k) = tokens / steps over all sequences, and the drafted counts of
    those steps give P(d >= i) at k, and those that drafted all k their mean accepted count."""
    if not draft_sequences:
        raise ValueError("no draft sequences")
    al = np.ones(k_max + 1)  # [k_max + 1]
    rates = np.zeros((k_max + 1, k_max))  # [k_max + 1, k_max]
    accepted_given_drafted = np.zeros(k_max + 1)  # [k_max + 1]
    for k in range(1, k_max + 1):
        drafted_counts = np.zeros(k + 1)  # [k + 1] steps per drafted count d
        tokens = 0
        accepted_at_full = 0  # accepted drafts of the steps that drafted all k
        for available, matched in draft_sequences:
            position, length = 0, len(available)
            while position < length:
                drafted = min(available[position], k)
                accepted = min(matched[position], drafted)
                drafted_counts[drafted] += 1
                tokens += accepted + 1
                accepted_at_full += accepted if drafted == k else 0
                position += accepted + 1
        steps = drafted_counts.sum()
        if steps == 0:
            raise ValueError("draft sequences without a position")
        al[k] = tokens / steps
        at_least = np.cumsum(drafted_counts[::-1])[::-1] / steps  # [k + 1] P(d >= i), i = 0..k
        rates[k, :k] = at_least[1:]
        # no step drafted k (no sequence has k drafts available anywhere): k's rows accept as
        # k - 1's, the nearest measured
        accepted_given_drafted[k] = (
            accepted_at_full / drafted_counts[k]
            if drafted_counts[k]
            else accepted_given_drafted[k - 1]
        )
    return SequenceAcceptance(al, rates, accepted_given_drafted)


def profile_sequences(profile: Profile, acceptance: str) -> SequenceAcceptance | None:
    """The profile's walked draft sequences at k = 0..k_max when `acceptance` is "sequences"
    and the profile has them, else None (the policy scores the per-position rates)."""
    if acceptance != "sequences" or not profile.draft_sequences:
        return None
    return sequence_acceptance(profile.draft_sequences, profile.k_max)


def sequence_itl_ms(
    raw_itl_ms: FloatArray, sequences: SequenceAcceptance, num_rows: npt.ArrayLike
) -> FloatArray:
    """[N, k + 1] column k: ITL(B, k) in expectation over the drafted counts of a run at k (the
    walked `sequences.draft_rates[k]`), from ITL(B, j) `raw_itl_ms` [N, k + 1], j = 0..k, with
    k <= the sequences' k_max. `num_rows` [N] is B per row."""
    itl_by_k = np.array(raw_itl_ms, dtype=np.float64)  # [N, k + 1]
    for k in range(1, itl_by_k.shape[1]):
        rates_k = partial_draft_rates(sequences.draft_rates[k, :k], k)  # [k] or None
        itl_by_k[:, k] = expected_itl_ms(raw_itl_ms[:, : k + 1], rates_k, num_rows)[:, k]
    return itl_by_k


def conditional_rates(unconditional: FloatArray) -> FloatArray:
    """c_i = r_i / r_{i-1} along the last axis (r_0 = 1; c_i = 0 where r_{i-1} = 0).

    Clipped to [0, 1]: rates measured with varying K can rise with i by noise, and a
    conditional probability above 1 cannot be sampled.
    """
    previous = np.concatenate(
        [np.ones_like(unconditional[..., :1]), unconditional[..., :-1]], axis=-1
    )  # [..., k_max]
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = np.where(previous > 0, unconditional / np.where(previous > 0, previous, 1.0), 0.0)
    clipped: FloatArray = np.clip(cond, 0.0, 1.0)
    return clipped


def partial_draft_rates(
    draft_rates: Sequence[float] | FloatArray | None, k_max: int
) -> FloatArray | None:
    """[k_max] s_1..s_kmax when some step drafts fewer than its K, else None (every s_i = 1).

    None keeps the cost at ITL(B, K) on the very code path that predates draft rates, so
    model-draft profiles give bit-identical tables. Positions past the given rates reuse the
    last one (an extrapolation, like the acceptance models').
    """
    if draft_rates is None or k_max <= 0:
        return None
    rates = np.asarray(draft_rates, dtype=np.float64)[:k_max]  # [<= k_max]
    if rates.size == 0 or bool(np.all(rates == 1.0)):
        return None
    if rates.size < k_max:
        rates = np.concatenate((rates, np.full(k_max - rates.size, rates[-1])))  # [k_max]
    return rates


def expected_itl_ms(
    itl_by_k: FloatArray, draft_rates: FloatArray | None, num_rows: npt.ArrayLike
) -> FloatArray:
    """[N, k_max + 1] E[ITL](B, K) for K = 0..k_max from ITL(B, j) [N, k_max + 1].

    The step's verification width is the widest row's drafted count, max over the B rows of
    min(d, K); rows draw d independently with P(d >= i) = s_i (`draft_rates` [>= k_max]), so
    P(max <= j) = (1 - s_{j+1})^B for j < K and 1 at j = K. `num_rows` [N] is B per table row.
    `draft_rates` None (every s_i = 1) returns `itl_by_k` itself.
    """
    if draft_rates is None:
        return itl_by_k
    num_k = itl_by_k.shape[-1] - 1  # k_max
    if num_k == 0:
        return itl_by_k
    rows = np.asarray(num_rows, dtype=np.float64).reshape(-1, 1)  # [N, 1]
    # all_at_most[:, j] = P(every row drafts <= j) = (1 - s_{j+1})^B, j = 0..k_max-1
    all_at_most = (1.0 - np.clip(draft_rates[:num_k], 0.0, 1.0))[None, :] ** rows  # [N, k_max]
    widest_is = np.diff(all_at_most, axis=1, prepend=0.0)  # [N, k_max] P(max d = j), j < k_max
    # E[ITL](K) = sum_{j<K} P(max d = j) ITL(j) + P(max d >= K) ITL(K)
    below = np.cumsum(widest_is * itl_by_k[:, :num_k], axis=1)  # [N, k_max] sum over j <= K-1
    expected = np.empty_like(itl_by_k)  # [N, k_max + 1]
    expected[:, 0] = itl_by_k[:, 0]
    expected[:, 1:] = below + (1.0 - all_at_most) * itl_by_k[:, 1:]
    return expected


@dataclass(frozen=True)
class GoodputTable:
    """Per-B decision of the goodput rule for B = 1..max_num_seqs (row i is B = i + 1)."""

    batch_sizes: IntArray  # [N] 1..max_num_seqs
    k_star: IntArray  # [N] chosen K per B, in [0, k_max]
    acceptance_length: FloatArray  # [N] AL(K*) per B
    itl_ms: FloatArray  # [N] ITL(B, K*) ms (its expectation when rows draft fewer than K)
    goodput: FloatArray  # [N] AL(K*) / ITL(B, K*), output tokens per ms per request
    goodput_by_k: FloatArray  # [N, k_max + 1] the whole objective, for explain and tests


def goodput_table(
    itl: ItlTable,
    acceptance_rates: Sequence[float] | FloatArray,
    max_num_seqs: int,
    k_max: int | None = None,
    draft_rates: Sequence[float] | FloatArray | None = None,
    sequences: SequenceAcceptance | None = None,
) -> GoodputTable:
    """The goodput rule evaluated for every B in 1..max_num_seqs and every k in 0..k_max.

    `draft_rates` (s_i; None: every step drafts its K) prices each k at its expected ITL.
    `sequences` (from greedy draft sequences) replaces both: AL(k) and each k's own drafted
    counts.
    """
    require_int(max_num_seqs, "max_num_seqs", 1, MAX_NUM_SEQS)
    num_k = len(acceptance_rates) if k_max is None else k_max
    bs = np.arange(1, max_num_seqs + 1, dtype=np.int64)  # [N]
    k_values = np.arange(num_k + 1, dtype=np.int64)  # [K+1]
    raw_itl = itl.itl_ms_at(bs[:, None], k_values[None, :])  # [N, K+1]
    if sequences is None:
        al_by_k = acceptance_lengths(acceptance_rates, num_k)  # [K+1]
        itl_by_k = expected_itl_ms(raw_itl, partial_draft_rates(draft_rates, num_k), bs)
    else:
        al_by_k = sequences.acceptance_length[: num_k + 1]  # [K+1]
        itl_by_k = sequence_itl_ms(raw_itl, sequences, bs)  # [N, K+1]
    objective = al_by_k[None, :] / itl_by_k  # [N, K+1]
    k_star = np.argmax(objective, axis=1).astype(np.int64)  # [N]; first max = smallest k on ties
    rows = np.arange(len(bs))
    return GoodputTable(
        batch_sizes=bs,
        k_star=k_star,
        acceptance_length=al_by_k[k_star],
        itl_ms=itl_by_k[rows, k_star],
        goodput=objective[rows, k_star],
        goodput_by_k=objective,
    )


def table_batch_size(view: StepView) -> int:
    """The B at which a step's K is read from a (B, K) latency or K table, >= 1.

    Every policy keys its table on the same row count: the scheduled requests, prefill chunks
    included (vLLM's key for its range table, and what `goodput`, `online`, `table` and
    `envelope` read), never fewer than the decode rows. Keying some policies on the decode rows
    alone made them draft more in ramp-up steps, where a burst of prefill chunks shares the step
    with few decode rows (B = 159 with 82 decode rows at the start of an MT-Bench C=256 run): a
    K that the whole batch would not get once its prefills finish.
    """
    return max(view.batch_size, view.num_decode_reqs, 1)


def lookup_batch_k(k_by_batch: IntArray, view: StepView, policy_name: str) -> int:
    """K for `view.batch_size` from a per-B table (row i is B = i + 1), clamped to view.k_max.

    B = 0 (no request scheduled) reads the B = 1 row; a B past the table is an input error.
    """
    batch_size = max(view.batch_size, 1)
    if batch_size > len(k_by_batch):
        raise InputError(
            f"{policy_name}: batch size {view.batch_size} exceeds max_num_seqs {len(k_by_batch)}"
        )
    return int(min(int(k_by_batch[batch_size - 1]), max(view.k_max, 0)))


GOODPUT_ACCEPTANCE = ("sequences", "rates")


def check_acceptance(policy: str, acceptance: str) -> None:
    """The `acceptance` key of goodput and online: one of GOODPUT_ACCEPTANCE."""
    if acceptance not in GOODPUT_ACCEPTANCE:
        raise InputError(
            f"{policy}: acceptance must be {' or '.join(GOODPUT_ACCEPTANCE)}, got {acceptance!r}"
        )


@dataclass(frozen=True)
class GoodputConfig:
    """Knobs of the goodput rule (SPEC `goodput:key=value`)."""

    # "sequences": score a greedy profile's draft sequences where it has them (and no
    # acceptance rates are given); "rates": the per-position rates (PR #32374's rule)
    acceptance: str = "sequences"

    def __post_init__(self) -> None:
        check_acceptance("goodput", self.acceptance)


class GoodputPolicy:
    """K* = argmax_k AL(k) / ITL(B, k) from the profile, precomputed for B = 1..max_num_seqs
    (ITL in expectation over drafted counts when the profile's draft rates are below 1)."""

    BATCH_SIZE_ONLY: ClassVar[bool] = True  # K = f(B, k_max); observe learns nothing

    def __init__(
        self,
        profile: Profile,
        max_num_seqs: int,
        acceptance_rates: Sequence[float] | None = None,
        config: GoodputConfig | None = None,
    ) -> None:
        self.config = config or GoodputConfig()
        self.profile = profile
        self.max_num_seqs = max_num_seqs
        self.k_max = profile.k_max
        self.itl = ItlTable.from_profile(profile)
        rates = profile.acceptance_rates if acceptance_rates is None else acceptance_rates
        # A greedy profile's draft sequences give AL and drafted counts per K exactly (given
        # rates override them: they are what the caller wants scored)
        sequences = (
            profile_sequences(profile, self.config.acceptance) if acceptance_rates is None else None
        )
        self.table = goodput_table(
            self.itl,
            rates,
            max_num_seqs,
            profile.k_max,
            draft_rates=profile.draft_rates,
            sequences=sequences,
        )
        # choose_k runs every step: K* per B as a tuple of ints (row i is B = i + 1), rebuilt
        # if `table` is replaced.
        self._k_star_of_table: tuple[GoodputTable, tuple[int, ...]] = (
            self.table,
            tuple(self.table.k_star.tolist()),
        )

    def choose_k(self, view: StepView) -> int:
        table, k_by_batch = self._k_star_of_table
        if table is not self.table:
            table, k_by_batch = self.table, tuple(self.table.k_star.tolist())
            self._k_star_of_table = (table, k_by_batch)
        batch_size = view.batch_size
        if 1 <= batch_size <= len(k_by_batch):
            # == lookup_batch_k, without numpy scalars
            return min(k_by_batch[batch_size - 1], max(view.k_max, 0))
        return lookup_batch_k(table.k_star, view, "goodput")  # B = 0, or B past the table

    def observe(self, feedback: StepFeedback) -> None:
        """The offline rule does not learn."""
