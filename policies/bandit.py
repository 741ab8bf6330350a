"""The bandit K policy (SPEC `bandit`): Thompson sampling that learns as it runs, no profile needed.

Two posteriors are updated from every step, whatever K it used: per-position conditional
acceptance rates (Beta counts, decayed) and the step time (Bayesian linear regression on
piecewise-linear knots over decode rows, linear in K with a jump at K = 1). Each step draws
from both and plays argmax_K AL(K) / duration(B, K) at the step's B; an exploration check drops
draws the posterior mean already puts far below its best. `learned_profile()` exports the
posterior means as a profile (a warm start, `bandit:prior=FILE`). The math, priors and knobs
are in docs/policies.md; `policies.bandit_arms` holds the independent-arm baseline.
The policy chooses one K per step (not per request), models no context, reads no clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError, require_int
from dsd.policies.goodput import ItlTable, table_batch_size
from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.types import MAX_NUM_SEQS, StepFeedback, StepView

# Step-time features per knot: intercept, per-K slope, jump at K >= 1.
FEATURES_PER_KNOT = 3
# Prefill tokens enter the step-time regression in units of this many tokens (keeps the
# feature's scale near the others, so the prior and the solve are well conditioned).
PREFILL_TOKENS_UNIT = 1024.0
# Steps whose view is remembered for the prefill tokens of their feedback (async lag is 1).
MAX_PENDING_VIEWS = 8
# Further posterior draws behind a check of how often a far-from-best K is the best.
EXPLORATION_CHECK_DRAWS = 32
# Entries of the (B, k_cap, prefill) -> features cache before it is emptied.
MAX_CACHED_FEATURES = 4096
# Floor of a learned profile's step time, ms (a posterior mean far from any data can be <= 0).
MIN_LEARNED_MS = 1e-3


# --------------------------------------------------------------------------------------------
# The bandit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BanditConfig:
    """Knobs of the structured bandit (SPEC `bandit:key=value,...`)."""

    # Per-step multiplier of the acceptance counts, in (0, 1]; memory ~ 1 / (1 - discount).
    acceptance_discount: float = 0.99
    # Per-step multiplier of the step-time regression's data, in (0, 1]; 1 never forgets.
    latency_discount: float = 0.998
    # Pseudo-rows per position of the profile-free acceptance prior (mean 0.5 each), > 0.
    acceptance_prior_rows: float = 2.0
    # Pseudo-rows per position of the profile's acceptance prior (prior=profile), > 0.
    profile_prior_rows: float = 50.0
    # Floor of the step-time noise standard deviation, as a fraction of the mean duration.
    min_relative_noise: float = 0.02
    # Prior standard deviation of each knot's K-slope and K>0 jump, as a fraction of scale_ms.
    slope_prior_std: float = 0.5
    # Random-walk standard deviation between neighbouring knots' K-terms, fraction of scale_ms.
    smoothness_std: float = 0.5
    # Relative standard deviation of the profile's step-time prior (prior=profile), > 0.
    profile_latency_std: float = 0.1
    # A Thompson draw whose K the posterior mean puts more than this fraction below its own best
    # K is played only if that K is the best in at least `min_best_probability` of
    # `EXPLORATION_CHECK_DRAWS` further draws, in (0, 1]; 1 is plain Thompson.
    max_exploration_loss: float = 0.05
    # See max_exploration_loss; in [0, 1), 0 is plain Thompson.
    min_best_probability: float = 0.25

    def __post_init__(self) -> None:
        for name in ("acceptance_discount", "latency_discount", "max_exploration_loss"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 1.0):
                raise InputError(f"bandit: {name} must be in (0, 1], got {value}")
        if not (math.isfinite(self.min_best_probability) and 0.0 <= self.min_best_probability < 1):
            raise InputError(
                f"bandit: min_best_probability must be in [0, 1), got {self.min_best_probability}"
            )
        for name in (
            "acceptance_prior_rows",
            "profile_prior_rows",
            "min_relative_noise",
            "slope_prior_std",
            "smoothness_std",
            "profile_latency_std",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"bandit: {name} must be finite and > 0, got {value}")


def conditional_counts(
    num_spec_tokens: IntArray, num_accepted: IntArray, k_max: int
) -> tuple[IntArray, IntArray]:
    """Per-position (trials, successes) of the conditional acceptance, each of length k_max.

    trials[i-1] = rows that drafted position i with drafts 1..i-1 all accepted;
    successes[i-1] = rows whose first i drafts were all accepted.
    """
    num_spec = np.minimum(np.asarray(num_spec_tokens, dtype=np.int64), k_max)  # [D]
    num_acc = np.minimum(np.asarray(num_accepted, dtype=np.int64), num_spec)  # [D]
    positions = np.arange(1, k_max + 1, dtype=np.int64)  # [k_max]
    reached = num_acc[:, None] >= positions[None, :] - 1  # [D, k_max]
    trials = ((num_spec[:, None] >= positions[None, :]) & reached).sum(axis=0)  # [k_max]
    successes = (num_acc[:, None] >= positions[None, :]).sum(axis=0)  # [k_max]
    return trials.astype(np.int64), successes.astype(np.int64)


class AcceptancePosterior:
    """Discounted Beta posteriors of the conditional acceptance rate per draft position."""

    def __init__(self, prior_mean: FloatArray, prior_rows: float, discount: float) -> None:
        mean = np.clip(np.asarray(prior_mean, dtype=np.float64), 1e-3, 1.0 - 1e-3)  # [k_max]
        self.k_max = int(mean.size)
        self.prior_alpha = prior_rows * mean  # [k_max] pseudo-successes
        self.prior_beta = prior_rows * (1.0 - mean)  # [k_max] pseudo-failures
        self.discount = discount
        self.successes = np.zeros(self.k_max)  # [k_max] discounted runtime successes
        self.failures = np.zeros(self.k_max)  # [k_max] discounted runtime failures

    def observe(self, num_spec_tokens: IntArray, num_accepted: IntArray) -> None:
        trials, successes = conditional_counts(num_spec_tokens, num_accepted, self.k_max)
        self.successes *= self.discount
        self.failures *= self.discount
        self.successes += successes
        self.failures += trials - successes

    def mean_conditional(self) -> FloatArray:
        """[k_max] posterior mean of each conditional rate c_i."""
        alpha = self.prior_alpha + self.successes
        return np.asarray(alpha / (alpha + self.prior_beta + self.failures), dtype=np.float64)

    def mean_rates(self) -> FloatArray:
        """[k_max] unconditional rates r_i = prod_{l<=i} E[c_l] (the c_l are independent)."""
        return np.asarray(np.cumprod(self.mean_conditional()), dtype=np.float64)

    def sample_rates(self, rng: np.random.Generator) -> FloatArray:
        """[k_max] one posterior draw of the unconditional rates, non-increasing in i."""
        if self.k_max == 0:
            return np.zeros(0)
        conditional = rng.beta(
            self.prior_alpha + self.successes, self.prior_beta + self.failures
        )  # [k_max]
        return np.asarray(np.cumprod(conditional), dtype=np.float64)


def knot_batch_sizes(max_num_seqs: int) -> FloatArray:
    """[J+1] knots 1, 2, 4, ..., 2^J with 2^J >= max_num_seqs."""
    num_knots = max(int(max_num_seqs) - 1, 0).bit_length() + 1
    return np.asarray(2.0 ** np.arange(num_knots), dtype=np.float64)


def hat_weights(num_decode_reqs: float, knots: FloatArray) -> FloatArray:
    """[J+1] piecewise-linear interpolation weights of D on the knots (clamped at the ends)."""
    weights = np.zeros(knots.size)
    value = float(np.clip(num_decode_reqs, knots[0], knots[-1]))
    high = int(np.searchsorted(knots, value, side="left"))
    if knots[high] == value:
        weights[high] = 1.0
        return weights
    low = high - 1
    fraction = (value - knots[low]) / (knots[high] - knots[low])
    weights[low] = 1.0 - fraction
    weights[high] = fraction
    return weights


class StepTimePosterior:
    """Bayesian linear regression of step duration (ms) on knot-hat x K features + prefill.

    Data enter as discounted sufficient statistics (X'X, X'y, y'y, n); the Gaussian prior is
    kept apart and added when the posterior is formed, so forgetting fades data, not the prior.
    """

    def __init__(
        self,
        max_num_seqs: int,
        config: BanditConfig,
        profile_itl: ItlTable | None = None,
        k_max: int = 0,
    ) -> None:
        self.knots = knot_batch_sizes(max_num_seqs)  # [J+1]
        self.config = config
        self.num_features = FEATURES_PER_KNOT * self.knots.size + 1
        size = self.num_features
        self.gram = np.zeros((size, size))  # [P, P] discounted X'X
        self.moment = np.zeros(size)  # [P] discounted X'y
        self.sum_sq = 0.0  # discounted y'y, ms^2
        self.sum_y = 0.0  # discounted sum of durations, ms
        self.num_obs = 0.0  # discounted number of observed steps
        # [J+1] undiscounted hat weight of every observed step per knot: where the model has
        # seen steps (what `BanditPolicy.learned_profile` exports).
        self.knot_steps = np.zeros(self.knots.size)
        # Reference duration of the profile-free prior, ms: the shortest observed decode step
        # (a step with a large prefill chunk would make the prior far too wide).
        self.scale_ms: float | None = None
        self._profile_prior = (
            None if profile_itl is None else self._profile_prior_terms(profile_itl, k_max)
        )
        self._cache: tuple[FloatArray, FloatArray] | None = None  # (mean [P], chol cov [P, P])
        self._k_features: dict[tuple[float, int, float], FloatArray] = {}  # see k_features

    def features(
        self, num_decode_reqs: float, num_spec_tokens: FloatArray, prefill_tokens: float
    ) -> FloatArray:
        """[n, P] feature rows, one per K in `num_spec_tokens` [n]."""
        hats = hat_weights(num_decode_reqs, self.knots)  # [J+1]
        ks = np.asarray(num_spec_tokens, dtype=np.float64)  # [n]
        per_k = np.stack([np.ones_like(ks), ks, (ks > 0).astype(np.float64)], axis=1)  # [n, 3]
        knot_part = (per_k[:, None, :] * hats[None, :, None]).reshape(ks.size, -1)  # [n, 3J+3]
        prefill = np.full((ks.size, 1), prefill_tokens / PREFILL_TOKENS_UNIT)  # [n, 1]
        return np.concatenate([knot_part, prefill], axis=1)  # [n, P]

    def k_features(self, num_decode_reqs: float, k_cap: int, prefill_tokens: float) -> FloatArray:
        """[k_cap + 1, P] `features` for K = 0..k_cap, cached (read-only): every choice needs
        them at the same few (B, k_cap) several times a step."""
        key = (float(num_decode_reqs), int(k_cap), float(prefill_tokens))
        cached = self._k_features.get(key)
        if cached is None:
            if len(self._k_features) >= MAX_CACHED_FEATURES:
                self._k_features.clear()
            cached = self.features(num_decode_reqs, np.arange(k_cap + 1.0), prefill_tokens)
            cached.flags.writeable = False
            self._k_features[key] = cached
        return cached

    def observe(self, features: FloatArray, duration_ms: float) -> None:
        discount = self.config.latency_discount
        self.gram *= discount
        self.moment *= discount
        self.sum_sq *= discount
        self.sum_y *= discount
        self.num_obs *= discount
        self.gram += np.outer(features, features)
        self.moment += features * duration_ms
        self.sum_sq += duration_ms * duration_ms
        self.sum_y += duration_ms
        self.num_obs += 1.0
        self.knot_steps += features[: FEATURES_PER_KNOT * self.knots.size : FEATURES_PER_KNOT]
        if self.scale_ms is None or duration_ms < self.scale_ms:
            self.scale_ms = duration_ms
        self._cache = None

    def _profile_prior_terms(self, itl: ItlTable, k_max: int) -> tuple[FloatArray, FloatArray]:
        """(mean [P], std [P]) of the per-knot terms read from a profiled ITL table."""
        at_zero = itl.itl_ms_at(self.knots, 0.0)  # [J+1]
        at_one = itl.itl_ms_at(self.knots, 1.0)  # [J+1]
        if k_max >= 2:
            slope = (itl.itl_ms_at(self.knots, float(k_max)) - at_one) / (k_max - 1)  # [J+1]
        else:
            slope = at_one - at_zero
        jump = at_one - at_zero - slope  # [J+1]
        mean = np.stack([at_zero, slope, jump], axis=1).reshape(-1)  # [3J+3]
        relative = self.config.profile_latency_std
        # Each term is trusted to `relative` of itself (floored at 1% of the knot's intercept,
        # so a zero jump is not pinned at exactly 0).
        floor = np.repeat(0.01 * at_zero, FEATURES_PER_KNOT)  # [3J+3]
        std = np.maximum(relative * np.abs(mean), floor)  # [3J+3]
        # Prefill cost per PREFILL_TOKENS_UNIT tokens: not in the ITL table; wide around 0.
        prefill_mean, prefill_std = 0.0, 10.0 * float(at_zero.max())
        return (
            np.concatenate([mean, [prefill_mean]]).astype(np.float64),
            np.concatenate([std, [prefill_std]]).astype(np.float64),
        )

    def prior(self) -> tuple[FloatArray, FloatArray]:
        """(mean [P], precision [P, P]) of the Gaussian prior on the coefficients."""
        if self._profile_prior is not None:
            mean, std = self._profile_prior
            return mean.copy(), np.diag(1.0 / std**2)
        scale = self.scale_ms if self.scale_ms is not None else 1.0
        num_knots = self.knots.size
        per_knot_mean = np.array([scale, 0.1 * scale, 0.0])  # intercept, K-slope, jump
        per_knot_std = np.array(
            [10.0 * scale, self.config.slope_prior_std * scale, self.config.slope_prior_std * scale]
        )
        mean = np.concatenate([np.tile(per_knot_mean, num_knots), [0.0]])  # [P]
        std = np.concatenate([np.tile(per_knot_std, num_knots), [10.0 * scale]])  # [P]
        precision = np.diag(1.0 / std**2)  # [P, P]
        # Random walk between neighbouring knots' K-slope and jump: (w_j - w_{j+1})^2 / tau^2.
        tau_sq = (self.config.smoothness_std * scale) ** 2
        for term in (1, 2):
            for knot in range(num_knots - 1):
                low = FEATURES_PER_KNOT * knot + term
                high = low + FEATURES_PER_KNOT
                precision[low, low] += 1.0 / tau_sq
                precision[high, high] += 1.0 / tau_sq
                precision[low, high] -= 1.0 / tau_sq
                precision[high, low] -= 1.0 / tau_sq
        return mean, precision

    def noise_variance(self, coefficients: FloatArray) -> float:
        """Discounted mean squared residual at `coefficients`, floored (ms^2)."""
        residual_sq = (
            self.sum_sq
            - 2.0 * float(coefficients @ self.moment)
            + float(coefficients @ self.gram @ coefficients)
        )
        mean_ms = self.sum_y / self.num_obs if self.num_obs > 0 else (self.scale_ms or 1.0)
        floor = (self.config.min_relative_noise * mean_ms) ** 2
        if self.num_obs <= 0:
            return floor
        return max(residual_sq / max(self.num_obs, 1.0), floor)

    def posterior(self) -> tuple[FloatArray, FloatArray]:
        """(mean [P], lower Cholesky factor of the covariance [P, P]); cached until new data."""
        if self._cache is not None:
            return self._cache
        prior_mean, prior_precision = self.prior()
        # Two passes: the noise variance at the first-pass mean weighs the data of the second.
        variance = self.noise_variance(prior_mean) if self.num_obs > 0 else 1.0
        mean = prior_mean
        for _ in range(2):
            precision = prior_precision + self.gram / variance  # [P, P]
            mean = np.asarray(
                np.linalg.solve(precision, prior_precision @ prior_mean + self.moment / variance),
                dtype=np.float64,
            )
            variance = self.noise_variance(mean)
        precision = prior_precision + self.gram / variance
        mean = np.asarray(
            np.linalg.solve(precision, prior_precision @ prior_mean + self.moment / variance),
            dtype=np.float64,
        )
        covariance = np.linalg.inv(precision)  # [P, P]
        covariance = 0.5 * (covariance + covariance.T)
        chol = np.linalg.cholesky(covariance + 1e-12 * np.eye(self.num_features))  # [P, P]
        self._cache = (np.asarray(mean, dtype=np.float64), np.asarray(chol, dtype=np.float64))
        return self._cache

    def sample_coefficients(self, rng: np.random.Generator) -> FloatArray:
        mean, chol = self.posterior()
        return np.asarray(mean + chol @ rng.standard_normal(mean.size), dtype=np.float64)


class BanditPolicy:
    """Thompson sampling over K with a shared acceptance model and a step-time regression."""

    def __init__(
        self,
        k_max: int,
        max_num_seqs: int,
        seed: int | np.random.SeedSequence,
        config: BanditConfig | None = None,
        profile: Profile | None = None,
    ) -> None:
        require_int(k_max, "bandit: k_max", 0)
        require_int(max_num_seqs, "bandit: max_num_seqs", 1, MAX_NUM_SEQS)
        self.k_max = k_max
        self.max_num_seqs = max_num_seqs
        self.config = config or BanditConfig()
        self.rng = np.random.default_rng(seed)
        if profile is None:
            prior_conditional = np.full(k_max, 0.5)  # [k_max]
            prior_rows = self.config.acceptance_prior_rows
            itl = None
        else:
            rates = np.zeros(k_max)  # [k_max]; K past the profile's k_max: no evidence
            known = min(k_max, len(profile.acceptance_rates))
            rates[:known] = np.asarray(profile.acceptance_rates, dtype=np.float64)[:known]
            previous = np.concatenate(([1.0], rates[:-1]))  # [k_max] r_{i-1}
            prior_conditional = np.where(previous > 0, rates / np.maximum(previous, 1e-12), 0.0)
            prior_rows = self.config.profile_prior_rows
            itl = ItlTable.from_profile(profile)
        self.acceptance = AcceptancePosterior(
            prior_conditional, prior_rows, self.config.acceptance_discount
        )
        self.step_time = StepTimePosterior(max_num_seqs, self.config, itl, k_max)
        # [k_max+1] timed decode steps seen per K (the step's largest K), for learned_profile.
        self.timed_steps_per_k = np.zeros(k_max + 1, dtype=np.int64)
        # step_index -> prefill tokens of that step, from the view choose_k saw.
        self._pending_prefill: OrderedDict[int, float] = OrderedDict()

    def expected_goodput(
        self,
        num_decode_reqs: int,
        prefill_tokens: float,
        rates: FloatArray,
        coefficients: FloatArray,
        k_cap: int,
    ) -> FloatArray:
        """[k_cap + 1] AL(K) / duration(D, K, prefill) for one acceptance and step-time model."""
        al_by_k = np.concatenate(([1.0], 1.0 + np.cumsum(rates[:k_cap])))  # [K+1]
        duration_ms = (
            self.step_time.k_features(num_decode_reqs, k_cap, prefill_tokens) @ coefficients
        )
        # A draw can put a duration at or below 0 early on; floor it so the ratio stays finite.
        floor_ms = 1e-3 * (self.step_time.scale_ms or 1.0)
        return np.asarray(al_by_k / np.maximum(duration_ms, floor_ms), dtype=np.float64)

    def mean_goodput(
        self, num_rows: int, prefill_tokens: float = 0.0, k_cap: int | None = None
    ) -> FloatArray:
        """[k_cap + 1] the posterior-mean objective at `num_rows` (k_cap default: k_max)."""
        mean, _ = self.step_time.posterior()
        k_cap = self.k_max if k_cap is None else k_cap
        return self.expected_goodput(
            num_rows, prefill_tokens, self.acceptance.mean_rates(), mean, k_cap
        )

    def learned_profile(self, min_knot_steps: float = 1.0) -> Profile | None:
        """What the policy has learned, as a profile; None before a timed decode step or at K_max 0.

        The profile it "learns online": latency points at the knots B = 1, 2, 4, ... up to the
        largest one whose observed decode steps weigh at least `min_knot_steps` (hat weights
        summed; every knot below it is included because a profile must start at B = 1), for
        every K in 0..k_max, each the posterior-mean duration(B, K, 0) (floored at 1
        microsecond), with `n` = the observed steps there; acceptance rates at their posterior
        mean. Knots without steps and K values never played at a knot are the model's
        extrapolation (linear in K with a jump at K = 1, tied to neighbouring knots), and a
        position never drafted reads its prior: `metadata` lists the observed steps per knot
        and per K so a reader can tell measured from extrapolated. Feed it back with
        `bandit:prior=FILE` to start the next run warm, or to any profile reader (`goodput`,
        `dsd export`).
        """
        if self.k_max == 0:
            return None  # nothing learned about K (a profile needs k_max >= 1)
        step_time = self.step_time
        observed = np.nonzero(step_time.knot_steps >= min_knot_steps)[0]  # knot indices
        if observed.size == 0:
            return None
        mean, _ = step_time.posterior()
        points = []
        for knot in range(int(observed[-1]) + 1):
            batch_size = float(step_time.knots[knot])
            durations = step_time.k_features(batch_size, self.k_max, 0.0) @ mean  # [K+1]
            steps = round(float(step_time.knot_steps[knot]))
            for k, duration in enumerate(durations):
                points.append(
                    LatencyPoint(
                        int(batch_size),
                        k,
                        max(float(duration), MIN_LEARNED_MS),
                        n=steps if steps >= 1 else None,
                    )
                )
        metadata = {
            "source": "learned online by the structured bandit (posterior means)",
            "observed_steps": int(self.timed_steps_per_k.sum()),
            "observed_steps_per_knot": {
                str(int(b)): round(float(w), 3)
                for b, w in zip(step_time.knots, step_time.knot_steps, strict=True)
                if w > 0
            },
            "observed_steps_per_k": self.timed_steps_per_k.tolist(),
        }
        return Profile(
            k_max=self.k_max,
            latency=tuple(points),
            acceptance_rates=tuple(float(r) for r in self.acceptance.mean_rates()),
            metadata=metadata,
        )

    def choose_k(self, view: StepView) -> int:
        if view.batch_size > self.max_num_seqs:
            raise InputError(
                f"bandit: batch size {view.batch_size} exceeds max_num_seqs {self.max_num_seqs}"
            )
        num_decode = int(view.num_decode_reqs)
        prefill_tokens = float(max(int(view.num_tokens) - num_decode, 0))
        self._pending_prefill[int(view.step_index)] = prefill_tokens
        while len(self._pending_prefill) > MAX_PENDING_VIEWS:
            self._pending_prefill.popitem(last=False)
        k_cap = min(self.k_max, max(view.k_max, 0))
        if num_decode == 0 or k_cap == 0:
            return 0  # no decode row drafts (prefill-only step), or nothing to choose
        rates = self.acceptance.sample_rates(self.rng)  # [k_max]
        coefficients = self.step_time.sample_coefficients(self.rng)  # [P]
        # The prefill part of a step is paid whatever K is (a sunk cost): K is chosen by the
        # decode part's rate AL(K) / duration(B, K, 0), the rate at which the engine turns
        # time into output tokens in the long run (a ratio with the sunk cost in it would
        # favour large K in prefill steps, spending more ms per extra token than K=0 steps).
        batch_size = table_batch_size(view)
        sampled_k = int(
            np.argmax(self.expected_goodput(batch_size, 0.0, rates, coefficients, k_cap))
        )
        # Thompson explores every K in proportion to its probability of being best, however
        # much the posterior mean says that K loses. The rare draws of a K that is both far
        # below the mean's best and seldom best are the costly ones (MT-Bench C=256 with a
        # profile prior: a few K=2 steps at B=256, where the mean sees -13% goodput, each
        # costing about +0.4% mean TPOT by breaking the requests' lockstep), and they teach
        # little; a K that is far below but often best (a draft position with little evidence)
        # is still explored.
        mean_goodput = self.mean_goodput(batch_size, 0.0, k_cap)
        mean_best = int(np.argmax(mean_goodput))
        loss_limit = (1.0 - self.config.max_exploration_loss) * mean_goodput[mean_best]
        if mean_goodput[sampled_k] < loss_limit and not self._worth_exploring(
            sampled_k, mean_best, batch_size, k_cap
        ):
            return mean_best
        return sampled_k

    def _worth_exploring(self, k: int, mean_best: int, batch_size: int, k_cap: int) -> bool:
        """Whether, in EXPLORATION_CHECK_DRAWS further draws, K is the best in at least
        min_best_probability of them or the mean's best is not the best in at least that many.

        The second test keeps the check from overriding a posterior that doubts its own best
        while spreading the doubt over several K (one unidentified K-slope makes every other K
        a little likely each and none likely alone; the run it once held at K=5:
        docs/policies.md, "bandit")."""
        wins = 0
        best_losses = 0
        for _ in range(EXPLORATION_CHECK_DRAWS):
            rates = self.acceptance.sample_rates(self.rng)  # [k_max]
            coefficients = self.step_time.sample_coefficients(self.rng)  # [P]
            goodput = self.expected_goodput(batch_size, 0.0, rates, coefficients, k_cap)
            best = int(np.argmax(goodput))
            wins += best == k
            best_losses += best != mean_best
        needed = self.config.min_best_probability * EXPLORATION_CHECK_DRAWS
        return wins >= needed or best_losses >= needed

    def observe(self, feedback: StepFeedback) -> None:
        prefill_tokens = self._pending_prefill.pop(int(feedback.step_index), None)
        num_spec = np.asarray(feedback.num_spec_tokens, dtype=np.int64)  # [D]
        num_decode = int(num_spec.size)
        if num_decode == 0:
            return  # a prefill-only step says nothing about K
        num_accepted = np.asarray(feedback.num_accepted, dtype=np.int64)  # [D]
        self.acceptance.observe(num_spec, num_accepted)
        duration_ms = float(feedback.duration_s) * 1e3
        if not (math.isfinite(duration_ms) and duration_ms > 0):
            return  # no usable time (a zero or broken clock): acceptance only
        if prefill_tokens is None:
            if feedback.batch_size > num_decode:
                return  # prefill chunks of unknown size: their cost would bias the K terms
            prefill_tokens = 0.0
        k = min(int(num_spec.max()), self.k_max)
        features = self.step_time.features(num_decode, np.array([float(k)]), prefill_tokens)[0]
        self.step_time.observe(features, duration_ms)  # features: [P]
        self.timed_steps_per_k[k] += 1
