"""The independent-arm bandit (SPEC `bandit:model=arms`): the baseline the bandit replaced.

Arms are K = 0..k_max per log2 bucket of B; the reward of a step is its output tokens per ms
per decode request, credited to the bucket of its B and the arm of its largest K; each arm has a
Gaussian posterior on its mean reward (docs/policies.md). It shares no evidence between buckets
or K, so it explores far longer than `policies.bandit`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsd.common.arrays import FloatArray
from dsd.common.errors import InputError, require_int
from dsd.policies.goodput import (
    ItlTable,
    acceptance_lengths,
    expected_itl_ms,
    partial_draft_rates,
)
from dsd.policies.profile import Profile
from dsd.policies.types import MAX_NUM_SEQS, StepFeedback, StepView


@dataclass(frozen=True)
class ArmsBanditConfig:
    """Knobs of the independent-arm bandit (SPEC `bandit:model=arms,key=value,...`)."""

    # Per-update multiplier of a bucket's counts, in (0, 1]; 1 never forgets.
    discount: float = 0.995
    # Floor of the reward noise, as a fraction of the bucket's mean reward.
    min_relative_std: float = 0.05
    # Rewards every arm must have before Thompson sampling starts (tried in K order).
    min_plays: int = 1

    def __post_init__(self) -> None:
        if not (0.0 < self.discount <= 1.0):
            raise InputError(f"bandit: discount must be in (0, 1], got {self.discount}")
        if not (np.isfinite(self.min_relative_std) and self.min_relative_std > 0):
            raise InputError(f"bandit: min_relative_std must be > 0, got {self.min_relative_std}")
        if isinstance(self.min_plays, bool) or not isinstance(self.min_plays, int):
            raise InputError(f"bandit: min_plays must be an integer, got {self.min_plays!r}")
        if self.min_plays < 1:
            raise InputError(f"bandit: min_plays must be >= 1, got {self.min_plays}")


def batch_bucket(batch_size: int) -> int:
    """floor(log2(B)) for B >= 1; B = 0 reads bucket 0."""
    return max(int(batch_size), 1).bit_length() - 1


def bucket_middle_batch_size(bucket: int, max_num_seqs: int) -> float:
    """Geometric middle of bucket b's B range [2^b, min(2^(b+1) - 1, max_num_seqs)]."""
    low = float(1 << bucket)
    high = float(min((1 << (bucket + 1)) - 1, max(max_num_seqs, 1 << bucket)))
    return float(np.sqrt(low * high))


def profile_prior_rewards(profile: Profile, k_max: int, max_num_seqs: int) -> FloatArray:
    """[buckets, k_max + 1] AL(k) / ITL(B_mid, k): the profile's reward per request, per arm.

    Same units as the bandit's reward (output tokens per ms per decode request). K beyond the
    profile's k_max reads its last rate as 0 (no acceptance evidence), so it is never preferred.
    """
    rates = np.zeros(k_max)  # [k_max]
    known = min(k_max, len(profile.acceptance_rates))
    rates[:known] = np.asarray(profile.acceptance_rates, dtype=np.float64)[:known]
    al_by_k = acceptance_lengths(rates, k_max)  # [k_max + 1]
    itl = ItlTable.from_profile(profile)
    num_buckets = batch_bucket(max_num_seqs) + 1
    mids = np.array([bucket_middle_batch_size(b, max_num_seqs) for b in range(num_buckets)])
    itl_ms = itl.itl_ms_at(mids[:, None], np.arange(k_max + 1.0)[None, :])  # [buckets, K+1]
    # Rows that draft fewer than K (the profile's draft rates) make K cost its expected ITL.
    itl_ms = expected_itl_ms(itl_ms, partial_draft_rates(profile.draft_rates, k_max), mids)
    return np.asarray(al_by_k[None, :] / itl_ms, dtype=np.float64)  # [buckets, K+1]


class ArmsBanditPolicy:
    """Thompson sampling over K in 0..k_max per log2 batch-size bucket."""

    def __init__(
        self,
        k_max: int,
        max_num_seqs: int,
        seed: int | np.random.SeedSequence,
        config: ArmsBanditConfig | None = None,
        prior_rewards: FloatArray | None = None,
        prior_plays: float = 4.0,
    ) -> None:
        require_int(k_max, "bandit: k_max", 0)
        require_int(max_num_seqs, "bandit: max_num_seqs", 1, MAX_NUM_SEQS)
        self.k_max = k_max
        self.max_num_seqs = max_num_seqs
        self.config = config or ArmsBanditConfig()
        self.rng = np.random.default_rng(seed)
        num_buckets = batch_bucket(max_num_seqs) + 1
        shape = (num_buckets, k_max + 1)
        self.plays = np.zeros(shape)  # [buckets, K+1] discounted number of rewards
        self.reward_sum = np.zeros(shape)  # [buckets, K+1] discounted sum of rewards
        self.reward_sq_sum = np.zeros(shape)  # [buckets, K+1] discounted sum of squares
        self.raw_plays = np.zeros(shape, dtype=np.int64)  # [buckets, K+1] undiscounted count
        # Arms with a prior count as tried (no forced exploration); None: every arm untried.
        self.has_prior = np.zeros(shape, dtype=bool)  # [buckets, K+1]
        if prior_rewards is not None:
            prior = np.asarray(prior_rewards, dtype=np.float64)
            if prior.shape != shape or not np.all(np.isfinite(prior)) or np.any(prior < 0):
                raise InputError(
                    f"bandit: prior_rewards must be finite, >= 0 and of shape {shape}, "
                    f"got shape {prior.shape}"
                )
            if not (np.isfinite(prior_plays) and prior_plays > 0):
                raise InputError(f"bandit: prior_plays must be > 0, got {prior_plays}")
            self.plays[:] = prior_plays
            self.reward_sum[:] = prior_plays * prior
            self.reward_sq_sum[:] = prior_plays * prior * prior
            self.has_prior[:] = True

    def posterior(self, bucket: int) -> tuple[FloatArray, FloatArray]:
        """(mean [K+1], standard error [K+1]) of each arm's mean reward in the bucket."""
        plays = self.plays[bucket]
        safe = np.maximum(plays, 1e-12)
        means = np.where(plays > 0, self.reward_sum[bucket] / safe, 0.0)  # [K+1]
        total = float(plays.sum())
        if total > 0:
            bucket_mean = float(self.reward_sum[bucket].sum() / total)
            # Pooled within-arm variance: E[x^2] - mean_arm^2, averaged over the bucket.
            within = float(
                np.maximum(self.reward_sq_sum[bucket] - plays * means**2, 0.0).sum() / total
            )
        else:
            bucket_mean, within = 0.0, 0.0
        floor = (self.config.min_relative_std * abs(bucket_mean)) ** 2
        std_error = np.sqrt(max(within, floor) / safe)  # [K+1]
        return means, std_error

    def choose_k(self, view: StepView) -> int:
        k_cap = min(self.k_max, max(view.k_max, 0))
        if view.batch_size > self.max_num_seqs:
            raise InputError(
                f"bandit: batch size {view.batch_size} exceeds max_num_seqs {self.max_num_seqs}"
            )
        bucket = batch_bucket(view.batch_size)
        untried = np.flatnonzero(
            (self.raw_plays[bucket, : k_cap + 1] < self.config.min_plays)
            & ~self.has_prior[bucket, : k_cap + 1]
        )
        if untried.size:
            return int(untried[0])
        means, std_error = self.posterior(bucket)
        samples = self.rng.normal(means[: k_cap + 1], std_error[: k_cap + 1])  # [k_cap + 1]
        return int(np.argmax(samples))

    def observe(self, feedback: StepFeedback) -> None:
        num_spec = np.asarray(feedback.num_spec_tokens, dtype=np.int64)  # [D]
        num_decode = int(num_spec.size)
        duration_ms = feedback.duration_s * 1e3
        if num_decode == 0 or not (duration_ms > 0):
            return  # a prefill-only step says nothing about K
        k = min(int(num_spec.max()), self.k_max)
        output_tokens = float(np.asarray(feedback.num_accepted).sum()) + num_decode
        reward = output_tokens / num_decode / duration_ms
        bucket = min(batch_bucket(feedback.batch_size), self.plays.shape[0] - 1)
        discount = self.config.discount
        self.plays[bucket] *= discount
        self.reward_sum[bucket] *= discount
        self.reward_sq_sum[bucket] *= discount
        self.plays[bucket, k] += 1.0
        self.reward_sum[bucket, k] += reward
        self.reward_sq_sum[bucket, k] += reward * reward
        self.raw_plays[bucket, k] += 1
