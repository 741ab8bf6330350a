"""The measured profile that policies and the simulator read (docs/formats.md).

A `Profile` holds what was measured of one (target, draft, device) setup: step latency points
ITL(B, K, context), prefill points, per-position acceptance counts, per-request acceptance
samples, how often the drafter proposes fewer than K tokens (n-gram lookup: `draft_rates` and
per-request (drafted, accepted) histograms), an optional measured host-overhead model of the
engine loop, and metadata. It is data
only: loading/validation is in `policies.profile_io`, fitting latency models is in
`sim.models.latency`,
fitting the host overhead is in `backend.profiler`, the PR #32374 file format is in
`backend.vllm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class LatencyPoint:
    """One measured decode step latency."""

    batch_size: int  # B >= 1
    num_spec_tokens: int  # K >= 0
    median_ms: float  # median step latency, ms; finite, > 0
    context_len: int | None = None  # mean context tokens per request; None: not recorded
    p10_ms: float | None = None  # 10th percentile, ms
    p90_ms: float | None = None  # 90th percentile, ms
    n: int | None = None  # number of timed steps behind the median
    mean_ms: float | None = None  # mean step latency, ms; None: not recorded

    @property
    def expected_ms(self) -> float:
        """What a step at this point costs on average: the mean when recorded, else the median.
        A run's TPOT is a sum of step times, so the simulator and the ITL table charge this."""
        return self.median_ms if self.mean_ms is None else self.mean_ms


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """One measured prefill step: `num_tokens` prompt tokens computed in one forward."""

    num_tokens: int  # prompt tokens in the step, >= 1
    median_ms: float  # finite, > 0
    batch_size: int = 1  # requests in the step
    n: int | None = None
    mean_ms: float | None = None  # mean, ms; None: not recorded

    @property
    def expected_ms(self) -> float:
        """The mean when recorded, else the median (as `LatencyPoint.expected_ms`)."""
        return self.median_ms if self.mean_ms is None else self.mean_ms


@dataclass(frozen=True, slots=True)
class PrefillInDecodePoint:
    """What a prefill chunk of `num_tokens` tokens adds to a decode step of `decode_rows` rows
    (K = 0) when both run in ONE forward (a fused engine's mixed step): per timed round, the
    mixed step minus the decode step alone, and the median of those differences."""

    num_tokens: int  # chunk tokens, >= 1
    decode_rows: int  # decode rows of the step, >= 1
    added_ms: float  # finite, >= 0
    n: int | None = None  # rounds


@dataclass(frozen=True, slots=True)
class HostOverheadLine:
    """Host ms of one engine-loop iteration as a line in the step's batch size B."""

    intercept_ms: float  # ms at B = 0 (the line's constant part); finite, >= 0
    per_row_ms: float  # ms per scheduled request (per-row numpy work); finite, >= 0

    def at(self, batch_size: int) -> float:
        return self.intercept_ms + self.per_row_ms * batch_size


@dataclass(frozen=True, slots=True)
class HostOverhead:
    """Measured host time per step of the real engine loop that the step timing does not see.

    Per iteration: loop wall time minus the model forwards' time (scheduler plan/commit/update,
    policy choose_k/observe, metrics, the executor's Python bookkeeping, SimPy). Fitted per
    class of step by `backend.profiler`; `docs/formats.md` has the JSON form.
    """

    plain: HostOverheadLine  # steps where no row drafts (every K = 0, prefill-only steps)
    spec: HostOverheadLine  # steps where some decode row drafts (K > 0)
    residual_ms: float  # RMS of the per-(class, B) medians about their line, ms; >= 0
    num_steps: int  # loop iterations behind the fit, >= 1
    max_batch_size: int  # largest B measured, >= 1 (beyond it the line extrapolates)
    # The part of it spent planning the step (admissions, plan, policy, commit): what async
    # scheduling overlaps with the previous step. None: not measured (older profiles).
    planning_plain: HostOverheadLine | None = None
    planning_spec: HostOverheadLine | None = None
    # By policy name (goodput, online, per-request): the host ms per step that the policy's own
    # choose_k and observe take beyond a static policy's, timed on synthetic steps
    # (`policies.host_time`). The lines above were measured with static policies. () where not
    # measured (older profiles).
    policies: tuple[tuple[str, HostOverheadLine], ...] = ()

    def for_policy(self, name: str) -> HostOverhead:
        """The model of a run whose policy is `name`: its own line (where measured) added to
        every step's host time. It is not counted as planning: async scheduling does not hide
        it (the conservative reading: observe runs after the step)."""
        extra = dict(self.policies).get(name)
        if extra is None:
            return self

        def plus(line: HostOverheadLine) -> HostOverheadLine:
            return HostOverheadLine(
                line.intercept_ms + extra.intercept_ms, line.per_row_ms + extra.per_row_ms
            )

        return replace(self, plain=plus(self.plain), spec=plus(self.spec))

    def overhead_ms(self, batch_size: int, has_spec: bool) -> float:
        """Host ms of one step of `batch_size` rows; `has_spec`: some row drafts K > 0."""
        return (self.spec if has_spec else self.plain).at(batch_size)

    def planning_ms(self, batch_size: int, has_spec: bool) -> float:
        """The planning part of `overhead_ms` (at most all of it); 0 when not measured."""
        line = self.planning_spec if has_spec else self.planning_plain
        if line is None:
            return 0.0
        return min(line.at(batch_size), self.overhead_ms(batch_size, has_spec))


@dataclass(frozen=True, slots=True)
class Profile:
    """Everything dsd knows about one (target, draft, device) setup."""

    k_max: int  # largest profiled K (num_speculative_tokens)
    latency: tuple[LatencyPoint, ...]  # decode step latency points
    # r_1..r_kmax: r_i = P(a >= i) at a step that asked for k_max drafts, over all such steps
    # (those that drafted fewer or none included), so AL(K) = 1 + sum_{i<=K} r_i
    acceptance_rates: tuple[float, ...]
    # counts behind the rates, if known: steps that drafted >= i tokens (vLLM's per-position
    # draft count) and steps whose first i drafts were all accepted
    drafted_at_pos: tuple[int, ...] | None = None
    accepted_at_pos: tuple[int, ...] | None = None
    prefill: tuple[PrefillPoint, ...] = ()
    # measured cost of prefill chunks inside decode steps (fused engine); () where not measured
    # (the simulator then prices a chunk in a decode step from the prefill curve)
    prefill_in_decode: tuple[PrefillInDecodePoint, ...] = ()
    # per-request samples: each request's own unconditional per-position rates (len <= k_max)
    per_request_rates: tuple[tuple[float, ...], ...] = ()
    temperature: float = 0.0
    # measured host time per step of the real engine loop; None: not measured (older profiles,
    # PR #32374 files)
    host_overhead: HostOverhead | None = None
    # s_1..s_kmax: s_i = P(d >= i), the drafter proposed at least i tokens at a step that asked
    # for k_max (an n-gram lookup finds fewer or none), over the same steps as r_i; r_i <= s_i.
    # None: every step drafts its K (s_i = 1: model drafts, older profiles, PR #32374 files)
    draft_rates: tuple[float, ...] | None = None
    # steps at K = k_max behind the counts, those that drafted nothing included: then
    # r_i = accepted_at_pos / num_acceptance_steps and s_i = drafted_at_pos / it. None: counts
    # of an older profile, where every step drafted k_max (r_i = accepted / drafted)
    num_acceptance_steps: int | None = None
    # per request, its (d, a) counts at K = k_max as lower-triangular rows:
    # draft_outcomes[j][d][a] = steps of request j that drafted d and accepted a (a <= d, so
    # row d has d + 1 entries; k_max + 1 rows). Their sum is the joint the counts come from.
    draft_outcomes: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # per draft_outcomes row, the `traces.workload.prompt_key` of its request's prompt text
    # ("" where it had none); () when not recorded. Lets the empirical acceptance model give a
    # workload request with the same prompt that request's own outcomes.
    draft_outcome_keys: tuple[str, ...] = ()
    # per draft_outcomes row of a greedy profile, its request's draft sequence: per output
    # position p, (drafts available at p with K unlimited, capped at k_max; how many of them
    # from the first equal the target's outputs p, p+1, ...), as `sim.models.replay` defines them;
    # () when not recorded
    draft_sequences: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)  # models, device, versions, command...

    def batch_sizes(self) -> list[int]:
        return sorted({p.batch_size for p in self.latency})

    def spec_token_values(self) -> list[int]:
        return sorted({p.num_spec_tokens for p in self.latency})

    def itl_grid(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]:
        """(batch_sizes [nB], ks [nK], itl_ms [nB, nK]) with NaN where a (B, K) is missing.

        Each point's `expected_ms`; points at several context lengths for one (B, K) are
        averaged (context-aware models read `latency` directly).
        """
        bs = np.array(self.batch_sizes(), dtype=np.int64)
        ks = np.array(self.spec_token_values(), dtype=np.int64)
        sums = np.zeros((len(bs), len(ks)))
        counts = np.zeros((len(bs), len(ks)))
        b_index = {int(b): i for i, b in enumerate(bs)}
        k_index = {int(k): j for j, k in enumerate(ks)}
        for p in self.latency:
            i, j = b_index[p.batch_size], k_index[p.num_spec_tokens]
            sums[i, j] += p.expected_ms
            counts[i, j] += 1
        with np.errstate(invalid="ignore"):
            grid = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return bs, ks, grid

    def acceptance_length(self, k: int) -> float:
        """AL(k) = 1 + sum_{i<=k} r_i."""
        return 1.0 + float(sum(self.acceptance_rates[:k]))

    def draft_outcome_matrix(self) -> IntArray | None:
        """[k_max + 1, k_max + 1] counts of (d, a) summed over requests (None: not recorded)."""
        if not self.draft_outcomes:
            return None
        joint: IntArray = outcome_matrices(self.draft_outcomes, self.k_max).sum(axis=0)
        return joint  # [k+1, k+1]

    def with_acceptance_of(self, source: Profile, name: str) -> Profile:
        """This profile's timing with `source`'s acceptance (its rates cut to this k_max, and
        its per-request rates; its counts, outcomes and sequences too where both k_max agree),
        e.g. a trained pair's acceptance for timing measured on random weights. `name` (the
        source's file) goes into the metadata as `acceptance_from`. ValueError when `source`
        has fewer positions than this k_max."""
        k_max = self.k_max
        if len(source.acceptance_rates) < k_max:
            raise ValueError(
                f"its acceptance has {len(source.acceptance_rates)} positions, the profile's "
                f"k_max is {k_max}"
            )
        same = source.k_max == k_max
        return replace(
            self,
            acceptance_rates=tuple(source.acceptance_rates[:k_max]),
            drafted_at_pos=source.drafted_at_pos if same else None,
            accepted_at_pos=source.accepted_at_pos if same else None,
            per_request_rates=tuple(tuple(rates[:k_max]) for rates in source.per_request_rates),
            draft_rates=(None if source.draft_rates is None else tuple(source.draft_rates[:k_max])),
            num_acceptance_steps=source.num_acceptance_steps if same else None,
            draft_outcomes=source.draft_outcomes if same else (),
            draft_outcome_keys=source.draft_outcome_keys if same else (),
            draft_sequences=source.draft_sequences if same else (),
            metadata={**self.metadata, "acceptance_from": name},
        )


def outcome_matrices(
    draft_outcomes: tuple[tuple[tuple[int, ...], ...], ...], k_max: int
) -> IntArray:
    """[R, k_max + 1, k_max + 1] dense (d, a) counts from lower-triangular rows (0 above)."""
    dense = np.zeros((len(draft_outcomes), k_max + 1, k_max + 1), dtype=np.int64)
    for index, rows in enumerate(draft_outcomes):
        for num_drafted, counts in enumerate(rows):
            dense[index, num_drafted, : len(counts)] = counts
    return dense


def lower_triangular_rows(matrix: IntArray) -> tuple[tuple[int, ...], ...]:
    """A [k+1, k+1] (d, a) count matrix as the rows `Profile.draft_outcomes` stores."""
    return tuple(
        tuple(int(v) for v in matrix[num_drafted, : num_drafted + 1])
        for num_drafted in range(matrix.shape[0])
    )
