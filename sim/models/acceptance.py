"""Acceptance models: what each decode row drafts and accepts, per step.

Every model implements `sim.types.AcceptanceModel`, vectorised over rows (per-request state in
dense arrays indexed by req_id), and draws common random numbers (`dsd.common.streams`), so a
request's outcomes depend on its own K at its own positions only. `PerPositionAcceptance` treats
every request alike, `HeterogeneousAcceptance` and `EmpiricalAcceptance` let requests differ,
`CategoryAcceptance` routes by `RequestSpec.tag`; replay of recorded sequences is
`sim.models.replay`. The math, the extrapolation past k_max and the draws are in docs/models.md §2.

It does not model acceptance at temperature > 0 from probabilities, acceptance that depends on
context length or on the batch, or any timing (that is `sim.models.latency`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import BoolArray, FloatArray, IntArray
from dsd.common.special import betaincinv
from dsd.common.streams import CounterStream
from dsd.policies.goodput import conditional_rates
from dsd.policies.profile import Profile, outcome_matrices
from dsd.sim.types import AcceptanceModel
from dsd.traces.workload import RequestSpec

# Spread (standard deviation over requests) of the per-request r_1 when a profile has no
# per-request samples: 0.08, what the bundled recording shows at exit layer 27 (per-prompt match
# rate std 0.092 over ~120 tokens per prompt, less ~0.046 of binomial noise in quadrature).
DEFAULT_SPREAD = 0.08

# Heterogeneous requests' rates are drawn for this many consecutive req_ids at once.
_RATE_BLOCK = 1024

# Purposes of a model's counter streams; fixed so a seed's draws stay stable as code evolves.
_ACCEPT = 0  # counter = token position: is the draft for that token accepted
_DRAFT = 1  # counter = token position: does the drafter propose that token (past k_max)
_STEP = 2  # counter = a step's output position: its (d, a) cell or its draft count
_REQUEST = 3  # counter 0: a request's once-only draw (strength, recorded request)


class ModelStreams:
    """The counter streams of one acceptance model, one per purpose, from its seed."""

    def __init__(self, seed: np.random.SeedSequence) -> None:
        self.accept = CounterStream(seed, _ACCEPT)
        self.draft = CounterStream(seed, _DRAFT)
        self.step = CounterStream(seed, _STEP)
        self.request = CounterStream(seed, _REQUEST)


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _validated_rates(rates: Sequence[float] | FloatArray, what: str) -> FloatArray:
    values = np.asarray(rates, dtype=np.float64)  # [k_max]
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{what}: need a non-empty list of per-position rates")
    if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1):
        raise ValueError(f"{what}: rates must be in [0, 1], got {values.tolist()}")
    return values


def _widen(cond: FloatArray, width: int) -> FloatArray:
    """Conditional rates [..., k] cut or padded to `width` columns by repeating the last one."""
    have = cond.shape[-1]
    if width <= have:
        return cond[..., :width]
    pad = np.repeat(cond[..., -1:], width - have, axis=-1)
    widened: FloatArray = np.concatenate([cond, pad], axis=-1)
    return widened


def count_leading(ok: BoolArray, num_spec_tokens: IntArray) -> IntArray:
    """Leading True count per row of `ok` [n, w], capped at K [n] (columns >= K ignored)."""
    width = ok.shape[1]
    inside = np.arange(width)[None, :] < num_spec_tokens[:, None]  # [n, w]
    run = np.logical_and.accumulate(ok & inside, axis=1)  # [n, w]
    counts: IntArray = run.sum(axis=1, dtype=np.int64)
    return counts


def _leading_successes(
    stream: CounterStream,
    req_ids: IntArray,
    starts: IntArray,
    cond: FloatArray,
    num_spec_tokens: IntArray,
) -> IntArray:
    """Accepted counts for rows with conditional rates `cond` ([k] shared or [n, k] per row),
    draft i of a row tested with `stream`'s draw at counter start + i - 1."""
    num_rows = int(num_spec_tokens.shape[0])
    width = int(np.maximum.reduce(num_spec_tokens)) if num_rows else 0
    if width <= 0:
        return np.zeros(num_rows, dtype=np.int64)
    return leading_successes(stream.leading_columns(req_ids, starts, width), cond, num_spec_tokens)


def leading_successes(
    uniforms: FloatArray, cond: FloatArray, num_spec_tokens: IntArray
) -> IntArray:
    """Leading count of `uniforms` [n, w] below `cond` ([k] or [n, k], widened to w), capped
    at K [n]; w must be at least the largest K."""
    num_rows, width = uniforms.shape
    # ok[:, :w] = draft i accepted given the earlier ones; a False column w stops every row, so
    # argmin (first False) is the number of leading successes, then capped at the row's K.
    ok = np.zeros((num_rows, width + 1), dtype=np.bool_)  # [n, w+1]
    np.less(uniforms, _widen(cond, width), out=ok[:, :width])  # a shared [w] row broadcasts
    leading = ok.argmin(axis=1)  # [n]
    counts: IntArray = np.minimum(leading, num_spec_tokens)
    return counts


class DenseRows:
    """Per-request rows of a fixed width in a growable array indexed by req_id."""

    def __init__(self, width: int, fill: float, dtype: type[np.generic]) -> None:
        self.fill = fill
        self.values = np.full((64, width), fill, dtype=dtype)  # [capacity, width]
        self.present = np.zeros(64, dtype=np.bool_)  # [capacity]

    def set(self, req_id: int, row: npt.ArrayLike) -> None:
        if req_id < 0:
            raise ValueError(f"req_id must be >= 0, got {req_id}")
        if req_id >= self.values.shape[0]:
            capacity = max(2 * self.values.shape[0], req_id + 1)
            values = np.full((capacity, self.values.shape[1]), self.fill, dtype=self.values.dtype)
            values[: self.values.shape[0]] = self.values
            present = np.zeros(capacity, dtype=np.bool_)
            present[: self.present.shape[0]] = self.present
            self.values, self.present = values, present
        self.values[req_id] = row
        self.present[req_id] = True

    def remove(self, req_id: int) -> None:
        if 0 <= req_id < self.present.shape[0]:
            self.present[req_id] = False
            self.values[req_id] = self.fill

    def gather(self, req_ids: IntArray) -> npt.NDArray[Any]:
        """Rows of `req_ids` [n] -> [n, width]; every id must have been added."""
        self.check_present(req_ids)
        return self.values[req_ids]

    def check_present(self, req_ids: IntArray) -> None:
        """KeyError unless every id of `req_ids` [n] (>= 0) was added and not removed."""
        try:
            present = self.present[req_ids]  # [n]; IndexError past the ids ever added
        except IndexError:
            present = None
        if present is None or not np.logical_and.reduce(present):
            missing = [int(r) for r in req_ids if r >= self.present.shape[0] or not self.present[r]]
            raise KeyError(f"requests never added (or already removed): {missing[:5]}")


def comonotone_joint(rates: FloatArray, draft_rates: FloatArray) -> FloatArray:
    """[k+1, k+1] P(d, a) with one uniform U per step: d = #{i: U < s_i}, a = #{i: U < r_i}.

    The joint a profile implies when it gives only the marginals r_i = P(a >= i) and
    s_i = P(d >= i) (no histograms): it has exactly those marginals, and a <= d because
    r_i <= s_i (both made non-increasing, r capped at s). Steps that draft more accept more.
    """
    drafts = np.minimum.accumulate(np.clip(draft_rates, 0.0, 1.0))  # [k]
    accepts = np.minimum(np.minimum.accumulate(np.clip(rates, 0.0, 1.0)), drafts)  # [k]
    edges = np.unique(np.concatenate(([0.0, 1.0], drafts, accepts)))  # [m] sorted
    low, high = edges[:-1], edges[1:]  # [m-1] U in [low, high)
    # s_i > U for every U in [low, high) iff s_i >= high (s_i is one of the edges).
    num_drafted = (drafts[None, :] >= high[:, None]).sum(axis=1)  # [m-1]
    num_accepted = (accepts[None, :] >= high[:, None]).sum(axis=1)  # [m-1]
    joint = np.zeros((len(rates) + 1, len(rates) + 1))  # [k+1, k+1]
    np.add.at(joint, (num_drafted, num_accepted), high - low)
    return joint


class JointOutcomes:
    """Sampling (d, a) from joint histograms at k_max, clipped at K and extended past k_max.

    `joints` [R, k+1, k+1] (counts or probabilities, a <= d) holds one joint per recorded
    request (R = 1 for a global joint). Rows clip both counts at their K, which keeps
    P(a >= i) and P(d >= i) for every i <= K. Past k_max (K > k_max): a row that drafted k_max
    drafts on with the pooled last conditional draft rate s_k / s_{k-1}, and one that accepted
    k_max accepts on with the last conditional rate r_k / r_{k-1}, never past its drafts.
    """

    def __init__(self, joints: npt.ArrayLike) -> None:
        counts = np.asarray(joints, dtype=np.float64)  # [R, k+1, k+1]
        if counts.ndim != 3 or counts.shape[1] != counts.shape[2] or counts.shape[1] < 2:
            raise ValueError(
                f"joint histograms must be [R, k+1, k+1] with k >= 1, got {counts.shape}"
            )
        if not np.all(np.isfinite(counts)) or np.any(counts < 0):
            raise ValueError("joint histograms must be finite and >= 0")
        if np.any(np.triu(counts, k=1) > 0):
            raise ValueError("joint histograms put mass on a > d (accepted more than drafted)")
        totals = counts.sum(axis=(1, 2))  # [R]
        if np.any(totals <= 0):
            raise ValueError("every joint histogram needs some steps")
        self.k_max = counts.shape[1] - 1
        cells = counts.reshape(counts.shape[0], -1) / totals[:, None]  # [R, (k+1)^2]
        cdf = np.cumsum(cells, axis=1)  # [R, (k+1)^2]
        cdf[:, -1] = 1.0  # rounding must not leave a uniform beyond the last cell
        self.cdf = cdf
        pooled = counts.sum(axis=0) / totals.sum()  # [k+1, k+1]
        positions = range(1, self.k_max + 1)
        self.rates = np.array([pooled[:, i:].sum() for i in positions])  # [k] P(a >= i)
        self.draft_rates = np.array([pooled[i:].sum() for i in positions])  # [k] P(d >= i)
        # Every step drafted k_max: d = K at any K (the executor's fast path).
        self.always_drafts = bool(counts[:, : self.k_max].sum() == 0)
        self._draft_tail = float(conditional_rates(self.draft_rates)[-1])
        self._accept_tail = float(conditional_rates(self.rates)[-1])

    def sample(
        self,
        streams: ModelStreams,
        req_ids: IntArray,
        positions: IntArray,
        num_spec_tokens: IntArray,
        which: IntArray | None = None,
    ) -> tuple[IntArray, IntArray]:
        """(d [n], a [n]) for rows `req_ids` [n] at output `positions` [n] with K [n], from
        joint `which` [n] (None: the only one)."""
        num_rows = int(num_spec_tokens.shape[0])
        uniforms = streams.step.uniforms(req_ids, positions)  # [n]
        if which is None:
            cell = np.searchsorted(self.cdf[0], uniforms, side="right")  # [n]
        else:
            # First cell whose cumulative probability exceeds the uniform, per row's own joint.
            cell = (self.cdf[which] <= uniforms[:, None]).sum(axis=1)  # [n]
        drafted, accepted = np.divmod(cell.astype(np.int64), self.k_max + 1)  # [n] each
        if num_rows and int(np.maximum.reduce(num_spec_tokens)) > self.k_max:
            self._extend(streams, req_ids, positions, drafted, accepted, num_spec_tokens)
        np.minimum(drafted, num_spec_tokens, out=drafted)
        np.minimum(accepted, num_spec_tokens, out=accepted)
        return drafted, accepted

    def _extend(
        self,
        streams: ModelStreams,
        req_ids: IntArray,
        positions: IntArray,
        drafted: IntArray,
        accepted: IntArray,
        num_spec_tokens: IntArray,
    ) -> None:
        """Drafts and accepts past k_max for rows with K > k_max (in place): the token
        positions past the joint's, p + k_max onwards, drawn per token."""
        rows = np.flatnonzero((num_spec_tokens > self.k_max) & (drafted == self.k_max))  # [m]
        if rows.size == 0:
            return
        ids, starts = req_ids[rows], positions[rows] + self.k_max  # [m] each
        beyond = num_spec_tokens[rows] - self.k_max  # [m]
        more_drafted = _leading_successes(
            streams.draft, ids, starts, np.array([self._draft_tail]), beyond
        )
        drafted[rows] += more_drafted
        full = accepted[rows] == self.k_max  # [m]
        tail = np.array([self._accept_tail])
        more_accepted = _leading_successes(
            streams.accept, ids[full], starts[full], tail, more_drafted[full]
        )
        accepted[rows[full]] += more_accepted


# --------------------------------------------------------------------------------------------
# Homogeneous per-position rates
# --------------------------------------------------------------------------------------------


class PerPositionAcceptance:
    """All requests share the unconditional per-position rates r_1..r_kmax (and the draft rates
    s_1..s_kmax, or the joint of (d, a) at k_max, when the drafter drafts fewer than K)."""

    def __init__(
        self,
        rates: Sequence[float] | FloatArray,
        seed: np.random.SeedSequence,
        draft_rates: Sequence[float] | FloatArray | None = None,
        joint: npt.ArrayLike | None = None,
    ) -> None:
        """`joint` [k+1, k+1] (d, a) counts at k_max; else `draft_rates` s_i, from which the
        comonotone joint is built; neither: every step drafts its K."""
        self.rates = _validated_rates(rates, "PerPositionAcceptance")  # [k_max]
        self.cond = conditional_rates(self.rates)  # [k_max]
        self.streams = ModelStreams(seed)
        if joint is None and draft_rates is not None:
            s = _validated_rates(draft_rates, "PerPositionAcceptance draft rates")
            if s.shape != self.rates.shape:
                raise ValueError(f"need {len(self.rates)} draft rates, got {len(s)}")
            if not np.all(s == 1.0):
                joint = comonotone_joint(self.rates, s)
        # None: every step drafts its K, sampled from the rates alone (the fast path).
        self.joint: JointOutcomes | None = None
        if joint is not None:
            outcomes = JointOutcomes(np.asarray(joint, dtype=np.float64)[None])
            if outcomes.k_max != len(self.rates):
                raise ValueError(
                    f"joint is for k_max {outcomes.k_max}, rates for {len(self.rates)}"
                )
            if not outcomes.always_drafts:
                self.joint = outcomes

    @staticmethod
    def from_profile(profile: Profile, seed: np.random.SeedSequence) -> PerPositionAcceptance:
        """The profile's rates, with its (d, a) histograms summed (or its draft rates)."""
        return PerPositionAcceptance(
            profile.acceptance_rates,
            seed,
            draft_rates=profile.draft_rates,
            joint=profile.draft_outcome_matrix(),
        )

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        """Requests are alike: nothing to draw."""

    def remove_request(self, req_id: int) -> None:
        """No per-request state."""

    def sample_outcomes(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> tuple[IntArray, IntArray]:
        if self.joint is None:
            accepted = _leading_successes(
                self.streams.accept, req_ids, num_output_tokens, self.cond, num_spec_tokens
            )
            return num_spec_tokens, accepted
        return self.joint.sample(self.streams, req_ids, num_output_tokens, num_spec_tokens)


# --------------------------------------------------------------------------------------------
# Heterogeneous requests
# --------------------------------------------------------------------------------------------


def concentration_from_spread(mean_rate: float, spread: float) -> float:
    """Beta concentration kappa with std `spread` at mean `mean_rate` (var = m(1-m)/(kappa+1))."""
    if not (0.0 < mean_rate < 1.0):
        raise ValueError(f"mean rate must be in (0, 1) to have a spread, got {mean_rate}")
    if not (0.0 < spread < math.sqrt(mean_rate * (1.0 - mean_rate))):
        raise ValueError(
            f"spread must be in (0, sqrt(m(1-m)) = {math.sqrt(mean_rate * (1 - mean_rate)):.3f}) "
            f"at mean r_1 = {mean_rate:.3f}, got {spread}"
        )
    return mean_rate * (1.0 - mean_rate) / spread**2 - 1.0


def _concentration_for_rates(rates: FloatArray, spread: float | None) -> float:
    """Concentration for `spread` at the first position whose rate can vary (0 < r < 1).

    Rates of exactly 0 or 1 (e.g. a draft identical to the target) leave no room for a spread and
    are passed through unchanged by `per_request_rates`; when every rate is degenerate the
    concentration is unused. `spread=None` means DEFAULT_SPREAD capped at half of
    sqrt(m(1-m)), so near-0 or near-1 rates still get a valid Beta; an explicit spread that the
    mean cannot have is an error.
    """
    inner = rates[(rates > 0.0) & (rates < 1.0)]
    if inner.size == 0:
        return 1.0
    mean_rate = float(inner[0])
    if spread is None:
        spread = min(DEFAULT_SPREAD, 0.5 * math.sqrt(mean_rate * (1.0 - mean_rate)))
    return concentration_from_spread(mean_rate, spread)


def per_request_rates(rates: FloatArray, concentration: float, strength: FloatArray) -> FloatArray:
    """Per-request unconditional rates [n, k]: the `strength` [n] quantile of Beta(mean r_i, kappa).

    One common strength per request across positions (a comonotone draw): Beta(m kappa,
    (1-m) kappa) grows stochastically with m, so rates stay non-increasing in i for every
    request, and E over strength of the quantile is exactly r_i.
    """
    mean = np.clip(rates, 0.0, 1.0)[None, :]  # [1, k]
    inner = (mean > 0) & (mean < 1)  # [1, k]
    a = np.where(inner, mean * concentration, 1.0)  # [1, k]
    b = np.where(inner, (1.0 - mean) * concentration, 1.0)  # [1, k]
    quantile = betaincinv()(a, b, strength[:, None])  # [n, k]
    out: FloatArray = np.where(inner, quantile, mean)
    return out


class HeterogeneousAcceptance:
    """Each request has its own per-position rates (see module doc), drawn when it first drafts:
    they depend on its id alone, so when makes no difference, and a run that never drafts never
    computes a Beta quantile (nor loads scipy's compiled special functions for it).

    The concentration kappa comes from, in order: `concentration` if given; else the variance of
    the profile's per-request r_1 samples (method of moments; it includes each sample's own
    counting noise, so it reads high when samples are short); else `spread` (std of per-request
    r_1 over the population; None: DEFAULT_SPREAD, capped where the mean cannot have it).

    Draft rates s_i < 1 (a drafter that drafts fewer than K): every row draws d from s_i alone
    (d = #{i: U < s_i}, one uniform, clipped at K; requests alike in what they draft) and
    accepts min(d, A), A the leading successes of its request's rates given drafted, whose
    population mean is q_i = r_i / s_i. Since d and A are independent, P(a >= i) = s_i q_i = r_i
    (exactly when q_i is non-increasing; else its non-increasing envelope, slightly lower).
    """

    def __init__(
        self,
        rates: Sequence[float] | FloatArray,
        seed: np.random.SeedSequence,
        spread: float | None = None,
        concentration: float | None = None,
        draft_rates: Sequence[float] | FloatArray | None = None,
    ) -> None:
        validated = _validated_rates(rates, "HeterogeneousAcceptance")
        # [k_max] s_i, or None when every step drafts its K (the fast path, rates as given)
        self.draft_rates: FloatArray | None = None
        if draft_rates is not None:
            s = np.minimum.accumulate(
                _validated_rates(draft_rates, "HeterogeneousAcceptance draft rates")
            )
            if s.shape != validated.shape:
                raise ValueError(f"need {len(validated)} draft rates, got {len(s)}")
            if not np.all(s == 1.0):
                self.draft_rates = s
                with np.errstate(divide="ignore", invalid="ignore"):
                    validated = np.clip(np.where(s > 0, validated / s, 0.0), 0.0, 1.0)
                self._draft_ascending = s[::-1].copy()  # [k_max] for the inverse-CDF draw
                self._draft_tail = float(conditional_rates(s)[-1])
        # The non-increasing envelope: a comonotone draw needs non-increasing means.
        self.rates = np.minimum.accumulate(validated)  # [k_max] (given drafted, with s_i < 1)
        if concentration is None:
            concentration = _concentration_for_rates(self.rates, spread)
        if not (math.isfinite(concentration) and concentration > 0):
            raise ValueError(f"concentration must be finite and > 0, got {concentration}")
        self.concentration = float(concentration)
        self.streams = ModelStreams(seed)
        # [req, k_max] conditional rates of the requests added; NaN until the request drafts
        self._cond = DenseRows(len(self.rates), 0.0, np.float64)
        self._undrawn = np.full(len(self.rates), np.nan)  # [k_max] the row of an added request
        self._block_first = -1  # first req_id of the block whose conditional rates are drawn
        self._block_cond = np.zeros((0, len(self.rates)))  # [block, k_max]

    @staticmethod
    def from_profile(
        profile: Profile, seed: np.random.SeedSequence, spread: float | None = None
    ) -> HeterogeneousAcceptance:
        """Spread from the profile's per-request samples when it has >= 2, else `spread`."""
        first = [s[0] for s in profile.per_request_rates if len(s) >= 1]
        concentration: float | None = None
        if len(first) >= 2:
            mean = float(profile.acceptance_rates[0])
            variance = float(np.var(first, ddof=1))
            draft_rate = 1.0 if profile.draft_rates is None else float(profile.draft_rates[0])
            if draft_rate < 1.0 and draft_rate > 0:
                # The Beta is over rates given drafted: r_1 / s_1 per request.
                mean, variance = mean / draft_rate, variance / draft_rate**2
            if variance > 0 and 0 < mean < 1:
                concentration = max(mean * (1.0 - mean) / variance - 1.0, 1e-3)
        return HeterogeneousAcceptance(
            profile.acceptance_rates,
            seed,
            spread=spread,
            concentration=concentration,
            draft_rates=profile.draft_rates,
        )

    def request_rates(self, req_id: int) -> FloatArray:
        """The rates drawn for one request [k_max] (for tests and reports): unconditional, or
        given drafted when the model has draft rates below 1."""
        cond = self._drawn_rows(np.array([req_id], dtype=np.int64))[0]  # [k_max]
        rates: FloatArray = np.cumprod(cond)
        return rates

    def draw_rates(self, req_ids: IntArray) -> FloatArray:
        """[n, k_max] the rates requests `req_ids` [n] get (population checks): the quantile
        of each one's strength, its stream's draw at counter 0."""
        strength = self.streams.request.uniforms(req_ids, np.zeros_like(req_ids))  # [n]
        return per_request_rates(self.rates, self.concentration, strength)

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        self._cond.set(req_id, self._undrawn)

    def _drawn_rows(self, req_ids: IntArray) -> FloatArray:
        """[n, k_max] conditional rates of added requests, drawing the ones not drawn yet. A
        request's rates depend on its id only, so they are drawn for a block of ids at once
        (requests arrive, and first draft, in about id order); one block is kept, so memory
        stays flat."""
        cond = self._cond.gather(req_ids)  # [n, k_max]
        undrawn = np.isnan(cond[:, 0])  # [n]
        if not undrawn.any():
            return cond
        for req_id in req_ids[undrawn].tolist():
            first = req_id - req_id % _RATE_BLOCK
            if first != self._block_first:
                ids = np.arange(first, first + _RATE_BLOCK, dtype=np.int64)  # [block]
                self._block_cond = conditional_rates(self.draw_rates(ids))  # [block, k_max]
                self._block_first = first
            self._cond.values[req_id] = self._block_cond[req_id - first]
        drawn: FloatArray = self._cond.values[req_ids]
        return drawn

    def remove_request(self, req_id: int) -> None:
        self._cond.remove(req_id)

    def sample_outcomes(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> tuple[IntArray, IntArray]:
        width = int(np.maximum.reduce(num_spec_tokens)) if num_spec_tokens.shape[0] else 0
        if width > 0:
            cond = self._drawn_rows(req_ids)  # [n, k_max]
            uniforms = self.streams.accept.leading_columns(req_ids, num_output_tokens, width)
            accepted = leading_successes(uniforms, cond, num_spec_tokens)  # [n]
        else:
            self._cond.check_present(req_ids)  # nothing drafted: the rows are only checked
            accepted = np.zeros(num_spec_tokens.shape[0], dtype=np.int64)
        if self.draft_rates is None:
            return num_spec_tokens, accepted
        drafted = self._sample_drafted(req_ids, num_output_tokens, num_spec_tokens)  # [n]
        return drafted, np.minimum(accepted, drafted)

    def _sample_drafted(
        self, req_ids: IntArray, positions: IntArray, num_spec_tokens: IntArray
    ) -> IntArray:
        """d [n] = #{i: U < s_i} (P(d >= i) = s_i), past k_max by the last conditional draft
        rate (per token from p + k_max), clipped at K."""
        k_max = self._draft_ascending.shape[0]
        uniforms = self.streams.step.uniforms(req_ids, positions)  # [n]
        # s is non-increasing, so #{i: s_i > U} = k - #{ascending s <= U}
        drafted = k_max - np.searchsorted(self._draft_ascending, uniforms, side="right")  # [n]
        drafted = drafted.astype(np.int64)
        rows = np.flatnonzero((num_spec_tokens > k_max) & (drafted == k_max))  # [m]
        if rows.size:
            drafted[rows] += _leading_successes(
                self.streams.draft,
                req_ids[rows],
                positions[rows] + k_max,
                np.array([self._draft_tail]),
                num_spec_tokens[rows] - k_max,
            )
        clipped: IntArray = np.minimum(drafted, num_spec_tokens)
        return clipped


# --------------------------------------------------------------------------------------------
# Empirical per-request histograms
# --------------------------------------------------------------------------------------------


def per_request_joints(profile: Profile) -> FloatArray:
    """[R, k+1, k+1] each measured request's (d, a) distribution at k_max.

    From `draft_outcomes` when the profile has them; else from `per_request_rates` with d = k_max
    (a model draft): P(a = i) = r_i - r_{i+1}, a sample shorter than k_max extended by its last
    conditional rate. ValueError when the profile has neither.
    """
    if profile.draft_outcomes:
        return outcome_matrices(profile.draft_outcomes, profile.k_max).astype(np.float64)
    if not profile.per_request_rates:
        raise ValueError(
            "the profile has no per-request samples (draft_outcomes or per_request_rates); "
            "use per-position or heterogeneous"
        )
    k_max = profile.k_max
    joints = np.zeros((len(profile.per_request_rates), k_max + 1, k_max + 1))
    for index, sample in enumerate(profile.per_request_rates):
        given = _validated_rates(sample, f"per_request_rates[{index}]")  # [<= k_max]
        rates = np.cumprod(_widen(conditional_rates(given), k_max))  # [k_max]
        at_least = np.concatenate(([1.0], np.minimum.accumulate(rates), [0.0]))  # [k_max + 2]
        joints[index, k_max] = np.maximum(at_least[:-1] - at_least[1:], 0.0)
    return joints


class EmpiricalAcceptance:
    """Each request samples (d, a) every step from one measured request's joint histogram.

    At add_request a request whose prompt text was profiled (its `prompt_key` is one of `keys`)
    is given that recorded request: the same prompt drafts and accepts as it did when measured.
    Any other request is given a recorded request drawn uniformly with replacement by its own
    once-only draw (so its pick depends on the seed and its id only). Each step it draws one
    cell of that histogram, clipped at K (`JointOutcomes`). Requests therefore differ
    exactly as the measured ones did, in acceptance and in what their drafter finds, without a
    parametric form; the price is that the population is the measured prompt set.

    A greedy profile also records each request's draft sequence (`Profile.draft_sequences`:
    per output position p, the drafts available and how many of them match the target's own
    outputs, as `sim.models.replay` reads them). A request then drafts and accepts what its
    recorded request did at its position p for any K: d = min(K, available[p]),
    a = min(d, matched[p]) (positions past the recording sample the histogram). For a prompt
    matched by its key that is exact; any other replays the request it was given, because the
    histogram counts steps at k_max and would under-weight long matched runs at a smaller K
    (docs/models.md 2.2b).
    """

    def __init__(
        self,
        joints: npt.ArrayLike,
        seed: np.random.SeedSequence,
        keys: Sequence[str] = (),
        sequences: Sequence[tuple[IntArray, IntArray]] = (),
    ) -> None:
        """`joints` [R, k+1, k+1]: (d, a) counts or probabilities per recorded request;
        `keys`: () or per recorded request its prompt key ("" for none); `sequences`: () or
        per recorded request its (available [n], matched [n]) draft sequence."""
        self.outcomes = JointOutcomes(joints)
        self.num_recorded = int(self.outcomes.cdf.shape[0])
        if keys and len(keys) != self.num_recorded:
            raise ValueError(f"{len(keys)} prompt keys for {self.num_recorded} recorded requests")
        if sequences and len(sequences) != self.num_recorded:
            raise ValueError(
                f"{len(sequences)} draft sequences for {self.num_recorded} recorded requests"
            )
        # the first recorded request of each prompt (a prompt profiled twice keeps its first)
        self._recorded_by_key: dict[str, int] = {}
        for index, key in enumerate(keys):
            if key:
                self._recorded_by_key.setdefault(key, index)
        self.streams = ModelStreams(seed)
        self._recorded_of = DenseRows(1, -1, np.int64)  # [req, 1] recorded request
        self._has_sequences = bool(sequences)
        lengths = np.array([len(available) for available, _ in sequences], dtype=np.int64)  # [R]
        self._sequence_lengths = lengths
        self._sequence_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self._available = np.concatenate([a for a, _ in sequences] or [np.zeros(0, np.int64)])
        self._matched = np.concatenate([m for _, m in sequences] or [np.zeros(0, np.int64)])

    @staticmethod
    def from_profile(profile: Profile, seed: np.random.SeedSequence) -> EmpiricalAcceptance:
        keys = profile.draft_outcome_keys if profile.draft_outcomes else ()
        sequences = [
            (np.array(available, dtype=np.int64), np.array(matched, dtype=np.int64))
            for available, matched in profile.draft_sequences
        ]
        return EmpiricalAcceptance(per_request_joints(profile), seed, keys, sequences)

    def recorded_of(self, req_id: int) -> int:
        """Index of the measured request whose histogram a request samples."""
        return int(self._recorded_of.gather(np.array([req_id], dtype=np.int64))[0, 0])

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        if req_id < 0:
            raise ValueError(f"req_id must be >= 0, got {req_id}")
        key = spec.prompt_key if self._recorded_by_key else None
        recorded = self._recorded_by_key.get(key, -1) if key else -1
        if recorded < 0:
            recorded = int(self.streams.request.uniform(req_id) * self.num_recorded)
        self._recorded_of.set(req_id, [recorded])  # its histogram and, if any, its sequence

    def remove_request(self, req_id: int) -> None:
        self._recorded_of.remove(req_id)

    def sample_outcomes(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> tuple[IntArray, IntArray]:
        recorded = self._recorded_of.gather(req_ids)[:, 0]  # [n]
        drafted, accepted = self.outcomes.sample(
            self.streams, req_ids, num_output_tokens, num_spec_tokens, recorded
        )
        if self._has_sequences:
            replayed = num_output_tokens < self._sequence_lengths[recorded]  # [n]
            if replayed.any():
                rows = np.flatnonzero(replayed)
                at = self._sequence_starts[recorded[rows]] + num_output_tokens[rows]  # [m]
                drafted = np.array(drafted)  # copies: the sampler's arrays stay as they were
                accepted = np.array(accepted)
                drafted[rows] = np.minimum(num_spec_tokens[rows], self._available[at])
                accepted[rows] = np.minimum(drafted[rows], self._matched[at])
                return drafted, accepted
        if self.outcomes.always_drafts:
            return num_spec_tokens, accepted  # d == K on every row: the executor's fast path
        return drafted, accepted


# --------------------------------------------------------------------------------------------
# Per-category routing
# --------------------------------------------------------------------------------------------


class CategoryAcceptance:
    """Routes each request by `RequestSpec.tag` to its category's model (`default` otherwise)."""

    def __init__(self, by_tag: Mapping[str, AcceptanceModel], default: AcceptanceModel) -> None:
        self.models: list[AcceptanceModel] = [default, *by_tag.values()]  # index 0 is the default
        self._index_of_tag = {tag: i + 1 for i, tag in enumerate(by_tag)}
        self._route = DenseRows(1, -1, np.int64)  # [req, 1] model index

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        index = self._index_of_tag.get(spec.tag, 0) if spec.tag is not None else 0
        self._route.set(req_id, [index])
        self.models[index].add_request(req_id, spec)

    def remove_request(self, req_id: int) -> None:
        if 0 <= req_id < self._route.present.shape[0] and self._route.present[req_id]:
            index = int(self._route.values[req_id, 0])
            self.models[index].remove_request(req_id)
        self._route.remove(req_id)

    def sample_outcomes(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> tuple[IntArray, IntArray]:
        routes = self._route.gather(req_ids)[:, 0]  # [n]
        accepted = np.zeros(req_ids.shape[0], dtype=np.int64)  # [n]
        drafted: IntArray | None = None  # [n] once some model drafts fewer than K
        for index in np.unique(routes).tolist():  # a loop over models, not rows
            rows = np.flatnonzero(routes == index)
            ks = num_spec_tokens[rows]  # [m]
            model_drafted, accepted[rows] = self.models[index].sample_outcomes(
                req_ids[rows], num_output_tokens[rows], ks
            )
            if model_drafted is not ks:
                if drafted is None:
                    drafted = num_spec_tokens.copy()
                drafted[rows] = model_drafted
        return (num_spec_tokens if drafted is None else drafted), accepted
