"""Per-request K: each decode request gets its own K from its own learned acceptance.

`PerRequestPolicy` (SPEC `per-request`) learns each request's acceptance online, either as one
level against the profile's walked draft sequences (`acceptance=sequences`) or as a Beta
posterior per draft depth (`rates`), and allocates the step's drafts to maximise expected
output tokens per ms of step time under one of two mixed-K cost models (`mixed_k`: `padded`
gives one K for the batch from the requests' own acceptance; `token-equivalent` an exact greedy
allocation across requests). Requests are tracked by req_id in bounded memory. The models, the
allocation and why the level replaced the rates: docs/policies.md, "per-request".

It does not split a step's cost into draft passes and verified tokens (the profile's ITL table
has no such split, so no cost model here rewards unequal K under a max-K draft), learn ITL, or
look at context length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError, require_int
from dsd.policies.goodput import (
    ItlTable,
    check_acceptance,
    conditional_rates,
    expected_itl_ms,
    partial_draft_rates,
    profile_sequences,
    sequence_itl_ms,
    table_batch_size,
)
from dsd.policies.profile import Profile
from dsd.policies.types import MAX_NUM_SEQS, StepFeedback, StepView

MixedKCost = Literal["padded", "token-equivalent"]
MIXED_K_COSTS: tuple[str, ...] = ("padded", "token-equivalent")


@dataclass(frozen=True)
class PerRequestConfig:
    """Knobs of the per-request policy (SPEC `per-request:key=value,...`)."""

    # Pseudo-trials the profile's rate at each depth is worth in each request's prior.
    prior_strength: float = 8.0
    # A tracked request not seen in this many steps is forgotten (it finished or was preempted).
    forget_after_steps: int = 64
    # Hard bound on tracked requests; the least recently seen are dropped beyond it.
    max_tracked: int = 4096
    # Step cost the allocation assumes: "padded" ITL(D, max K) or "token-equivalent".
    mixed_k: str = "padded"
    # "sequences": each request's level against a greedy profile's walked draft sequences
    # (where the profile has them); "rates": per-depth posteriors on the profile's rates
    acceptance: str = "sequences"

    def __post_init__(self) -> None:
        check_acceptance("per-request", self.acceptance)
        if not (np.isfinite(self.prior_strength) and self.prior_strength > 0):
            raise InputError(f"per-request: prior_strength must be > 0, got {self.prior_strength}")
        for name in ("forget_after_steps", "max_tracked"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"per-request: {name} must be an integer >= 1, got {value!r}")
        if self.mixed_k not in MIXED_K_COSTS:
            raise InputError(
                f"per-request: mixed_k must be one of {', '.join(MIXED_K_COSTS)}, "
                f"got {self.mixed_k!r}"
            )


def conditional_depth_rates(rates_given_drafted: FloatArray) -> FloatArray:
    """[K] c_i = q_i / q_(i-1) (q_0 = 1) from rates given drafted q_1..q_K, made non-increasing
    first; 0 where q_(i-1) = 0 (a depth never reached)."""
    q = np.minimum.accumulate(np.clip(np.asarray(rates_given_drafted, np.float64), 0.0, 1.0))
    return conditional_rates(q)


def best_uniform_k(gains: FloatArray, itl_ms_by_k: FloatArray) -> int:
    """The K in 0..K_max maximising (D + sum_j sum_{k<K} gains[j, k]) / ITL(D, K) (padded cost).

    `gains` [D, K_max] as in `best_allocation`; `itl_ms_by_k` [K_max + 1]. Smallest K on ties.
    """
    num_decode, k_max = gains.shape
    tokens = num_decode + np.concatenate(([0.0], np.cumsum(gains.sum(axis=0))))  # [K_max + 1]
    return int(np.argmax(tokens / itl_ms_by_k[: k_max + 1]))


def best_allocation(gains: FloatArray, itl_ms_by_total_drafts: FloatArray) -> IntArray:
    """[D] K per request maximising (D + tokens from drafts) / ITL(total drafts).

    `gains` [D, K_max]: gains[j, k] = expected extra output tokens from request j's (k+1)-th
    draft, non-increasing in k. `itl_ms_by_total_drafts` [D * K_max + 1]: step time when m
    drafts are made in total. Exact under the non-increasing gains (docs/policies.md,
    "per-request").
    """
    num_decode, k_max = gains.shape
    if num_decode == 0 or k_max == 0:
        return np.zeros(num_decode, dtype=np.int64)
    flat = gains.reshape(-1)  # [D*K_max], row-major: index = j * K_max + k
    # Stable sort on -gain: equal gains keep (request, position) order, so a request's drafts
    # are always taken in position order and earlier batch rows win ties.
    order = np.argsort(-flat, kind="stable")  # [D*K_max]
    tokens = num_decode + np.concatenate(([0.0], np.cumsum(flat[order])))  # [D*K_max + 1]
    objective = tokens / itl_ms_by_total_drafts  # [D*K_max + 1]
    best_total = int(np.argmax(objective))  # first max: the fewest drafts on ties
    chosen_rows = order[:best_total] // k_max  # [best_total]
    return np.bincount(chosen_rows, minlength=num_decode).astype(np.int64)  # [D]


class PerRequestPolicy:
    """K per decode request from per-request acceptance learned online, optimal under `mixed_k`
    cost."""

    def __init__(
        self, profile: Profile, max_num_seqs: int, config: PerRequestConfig | None = None
    ) -> None:
        require_int(max_num_seqs, "per-request: max_num_seqs", 1, MAX_NUM_SEQS)
        self.config = config or PerRequestConfig()
        self.k_max = profile.k_max
        self.max_num_seqs = max_num_seqs
        self.itl = ItlTable.from_profile(profile)
        # s_i (None: every step drafts its K): the padded cost is then ITL in expectation over
        # the rows' drafted counts; the token-equivalent cost keeps the requested drafts.
        self.draft_rates = partial_draft_rates(profile.draft_rates, self.k_max)
        # [k_max] s_i, 1 where every step drafts its K: the unconditional rates' ceiling.
        self.drafted = np.ones(self.k_max) if self.draft_rates is None else self.draft_rates
        strength = self.config.prior_strength
        # The walked sequences (acceptance=sequences, where the profile has them), else None.
        self.sequences = profile_sequences(profile, self.config.acceptance)
        if self.sequences is not None:
            # [2] (accepted, expected) pseudo-counts of the level: prior_strength accepted
            # drafts against as many expected
            self.prior_counts = np.array([strength, strength])
        else:
            rates = np.asarray(profile.acceptance_rates, dtype=np.float64)[: self.k_max]
            given_drafted = np.divide(
                rates, self.drafted, out=np.zeros_like(rates), where=self.drafted > 0
            )
            depth_rates = conditional_depth_rates(given_drafted)  # [k_max] c_i
            # [2 k_max] (alpha per depth, beta per depth)
            self.prior_counts = np.concatenate(
                (strength * depth_rates, strength * (1.0 - depth_rates))
            )
        # Tracked requests, sorted by id; N <= max_tracked.
        self.tracked_ids = np.zeros(0, dtype=np.int64)  # [N] request ids, strictly increasing
        self.counts = np.zeros((0, len(self.prior_counts)))  # [N, C] posterior counts per id
        self.last_seen_step = np.zeros(0, dtype=np.int64)  # step index of the latest feedback
        # The step-cost vectors choose_k reads, by (D, or 0 under padded cost; K cap; B): they
        # depend on the profile alone, and interpolating them each step cost more than choosing
        # (0.25 of 0.45 ms a step at B = 2, where a GPU step takes 4-6 ms). Bounded: cleared
        # when full.
        self._step_costs: dict[tuple[int, int, int], FloatArray] = {}

    def _lookup(self, req_ids: IntArray) -> tuple[IntArray, npt.NDArray[np.bool_]]:
        """(slot per id [n], found [n]); slot is meaningless where not found."""
        slots = np.searchsorted(self.tracked_ids, req_ids)  # [n]
        slots = np.minimum(slots, max(len(self.tracked_ids) - 1, 0))
        found = (
            (self.tracked_ids[slots] == req_ids)
            if len(self.tracked_ids)
            else np.zeros(len(req_ids), dtype=bool)
        )
        return slots.astype(np.int64), found

    def _request_counts(self, req_ids: IntArray) -> FloatArray:
        """[n, C] each request's posterior counts (the prior for an id not tracked)."""
        ids = np.asarray(req_ids, dtype=np.int64)
        counts = np.broadcast_to(self.prior_counts, (len(ids), len(self.prior_counts)))
        if len(self.tracked_ids):
            slots, found = self._lookup(ids)
            counts = np.where(found[:, None], self.counts[slots], counts)
        return counts

    def request_rates(self, req_ids: IntArray) -> FloatArray:
        """[n, k_max] each request's estimated unconditional per-position rates
        (acceptance=rates)."""
        if self.sequences is not None:
            raise ValueError("per-request: request_rates needs acceptance=rates")
        counts = self._request_counts(req_ids)
        alpha, beta = counts[:, : self.k_max], counts[:, self.k_max :]  # [n, k_max] each
        # alpha + beta >= prior_strength > 0 at every depth
        return self.drafted[None, :] * np.cumprod(alpha / (alpha + beta), axis=1)  # [n, k_max]

    def request_levels(self, req_ids: IntArray) -> FloatArray:
        """[n] each request's accepted drafts over the walked sequences' expectation for the
        same drafted counts, posterior mean (acceptance=sequences; 1 for an unseen request)."""
        if self.sequences is None:
            raise ValueError("per-request: request_levels needs acceptance=sequences")
        counts = self._request_counts(req_ids)
        return counts[:, 0] / counts[:, 1]  # [n]

    def request_gains(self, req_ids: IntArray, k_cap: int) -> FloatArray:
        """[n, k_cap] gains[j, k]: request j's expected extra output tokens from its (k+1)-th
        draft. acceptance=rates: its rate r_(k+1)(j). acceptance=sequences: the walked
        AL(k + 1) - AL(k) times its level, with AL_j(k) - 1 capped at the drafts a run at k
        makes."""
        if self.sequences is None:
            return self.request_rates(req_ids)[:, :k_cap]
        levels = self.request_levels(req_ids)  # [n]
        walked_extra = self.sequences.acceptance_length[1 : k_cap + 1] - 1.0  # [k_cap]
        drafts = self.sequences.draft_rates[1 : k_cap + 1].sum(axis=1)  # [k_cap] E[d] at k
        extra = np.minimum(levels[:, None] * walked_extra[None, :], drafts[None, :])  # [n, k]
        gains: FloatArray = np.diff(extra, axis=1, prepend=0.0)  # [n, k_cap]
        return gains

    def itl_by_total_drafts(
        self, num_decode: int, k_max: int, batch_size: int | None = None
    ) -> FloatArray:
        """[D * k_max + 1] ITL(B, m / D) ms for m = 0..D*k_max total drafts (token-equivalent).

        B is the table key (`policies.goodput.table_batch_size`; None: D).
        """
        total_drafts = np.arange(num_decode * k_max + 1, dtype=np.float64)
        key = float(num_decode if batch_size is None else max(batch_size, num_decode))
        return self.itl.itl_ms_at(key, total_drafts / num_decode)

    def choose_k(self, view: StepView) -> IntArray:
        num_decode = int(view.num_decode_reqs)
        k_cap = min(self.k_max, max(view.k_max, 0))
        if num_decode == 0 or k_cap == 0:
            return np.zeros(num_decode, dtype=np.int64)
        if view.batch_size > self.max_num_seqs:
            raise InputError(
                f"per-request: batch size {view.batch_size} exceeds max_num_seqs "
                f"{self.max_num_seqs}"
            )
        gains = self.request_gains(np.asarray(view.req_ids, dtype=np.int64), k_cap)  # [D, k]
        # The ITL table is read at the step's B (prefill chunks included), like every policy.
        batch_size = table_batch_size(view)
        step_costs = self._step_costs_of(num_decode, k_cap, batch_size)
        if self.config.mixed_k == "padded":
            k = best_uniform_k(gains, step_costs)
            return np.full(num_decode, k, dtype=np.int64)
        # the greedy allocation is exact for gains non-increasing in k (a walked AL that is
        # not concave is scored by its concave side)
        return best_allocation(np.minimum.accumulate(gains, axis=1), step_costs)

    def _step_costs_of(self, num_decode: int, k_cap: int, batch_size: int) -> FloatArray:
        """Padded: [k_cap + 1] ITL(B, K) (in expectation over the drafted counts where the
        profile has them); token-equivalent: `itl_by_total_drafts`. Memoized."""
        padded = self.config.mixed_k == "padded"
        key = (0 if padded else num_decode, k_cap, batch_size)
        costs = self._step_costs.get(key)
        if costs is not None:
            return costs
        if padded:
            costs = self.itl.itl_ms_at(float(batch_size), np.arange(k_cap + 1.0))  # [k+1]
            if self.sequences is not None:  # each k at its own run's drafted counts
                costs = sequence_itl_ms(costs[None, :], self.sequences, [batch_size])[0]
            elif self.draft_rates is not None:
                costs = expected_itl_ms(costs[None, :], self.draft_rates, [batch_size])[0]
        else:
            costs = self.itl_by_total_drafts(num_decode, k_cap, batch_size)  # [D * k + 1]
        if len(self._step_costs) >= 4096:
            self._step_costs.clear()
        self._step_costs[key] = costs
        return costs

    def observe(self, feedback: StepFeedback) -> None:
        ids = np.asarray(feedback.req_ids, dtype=np.int64)  # [n]
        if len(ids):
            num_spec = np.asarray(feedback.num_spec_tokens, dtype=np.int64)  # [n]
            num_accepted = np.minimum(np.asarray(feedback.num_accepted, dtype=np.int64), num_spec)
            slots = self._insert_missing(ids)
            # a row that drafted nothing says nothing (ids are unique within a step)
            if self.sequences is not None:
                # accepted drafts against the walked expectation for as many drafted
                drafted = np.minimum(num_spec, self.k_max)  # [n]
                self.counts[slots, 0] += num_accepted
                self.counts[slots, 1] += self.sequences.accepted_given_drafted[drafted]
            else:
                # successes at depths 1..a, a failure at a + 1 when it was drafted
                depth = np.arange(1, self.k_max + 1)[None, :]  # [1, k_max]
                accepted, drafted = num_accepted[:, None], num_spec[:, None]  # [n, 1]
                self.counts[slots, : self.k_max] += depth <= accepted
                self.counts[slots, self.k_max :] += (depth == accepted + 1) & (depth <= drafted)
            self.last_seen_step[slots] = feedback.step_index
        self._forget(feedback.step_index)

    def _insert_missing(self, ids: IntArray) -> IntArray:
        """Track the ids not yet tracked (at the prior); returns every id's slot [n]."""
        slots, found = self._lookup(ids)
        if found.all():
            return slots
        new_ids = np.unique(ids[~found])  # [m]
        all_ids = np.concatenate((self.tracked_ids, new_ids))
        order = np.argsort(all_ids, kind="stable")
        self.tracked_ids = all_ids[order]
        prior = np.broadcast_to(self.prior_counts, (new_ids.size, len(self.prior_counts)))
        self.counts = np.concatenate((self.counts, prior))[order]
        self.last_seen_step = np.concatenate(
            (self.last_seen_step, np.full(new_ids.size, -1, dtype=np.int64))
        )[order]
        return self._lookup(ids)[0]

    def _forget(self, step_index: int) -> None:
        keep = self.last_seen_step >= step_index - self.config.forget_after_steps  # [N]
        if int(keep.sum()) > self.config.max_tracked:
            # Keep the most recently seen max_tracked (ties: higher id, i.e. newer request).
            recency = np.lexsort((self.tracked_ids, self.last_seen_step))  # ascending
            keep = np.zeros_like(keep)
            keep[recency[-self.config.max_tracked :]] = True
        if keep.all():
            return
        self.tracked_ids = self.tracked_ids[keep]
        self.counts = self.counts[keep]
        self.last_seen_step = self.last_seen_step[keep]

    @property
    def num_tracked(self) -> int:
        return len(self.tracked_ids)
