"""The online-acceptance K policy: the goodput rule with per-position rates learned at run time.

`OnlineAcceptancePolicy` (SPEC `online`) takes the profile's rates as a Beta prior and learns
from decayed runtime counts, so a position no longer drafted drifts back to its prior instead
of collapsing to 0, as PR #32374's cumulative counts do (`NaiveCumulativeAcceptancePolicy`
reproduces that estimator so a test can show the collapse; do not use it for anything else).
Its K table is goodput's, rebuilt only when some rate moved more than `recompute_tolerance`.
The estimator, drafters that draft fewer than K, and the scaling of the walked draft sequences:
docs/policies.md, "online".

It does not change the ITL model at run time (only acceptance is learned) and it does not choose
K per request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError
from dsd.policies.goodput import (
    ItlTable,
    SequenceAcceptance,
    check_acceptance,
    goodput_table,
    lookup_batch_k,
    partial_draft_rates,
    profile_sequences,
)
from dsd.policies.profile import Profile
from dsd.policies.types import StepFeedback, StepView, position_counts


@dataclass(frozen=True)
class OnlineConfig:
    """Knobs of the online estimator (SPEC `online:key=value,...`)."""

    # Steps observed before runtime estimates replace the profiled rates.
    warmup_steps: int = 20
    # Pseudo-drafts per position that the profiled rates are worth (Beta prior strength).
    prior_strength: float = 100.0
    # Per-step multiplier of the runtime counts, in (0, 1]; 1 keeps all history (no forgetting).
    # Memory is about 1 / (1 - decay) steps.
    decay: float = 0.98
    # Rebuild the K table when some estimated rate moved more than this since the last build.
    recompute_tolerance: float = 0.02
    # "sequences": scale a greedy profile's walked draft sequences by the learned rates (where
    # the profile has them); "rates": score the learned per-position rates themselves
    acceptance: str = "sequences"

    def __post_init__(self) -> None:
        check_acceptance("online", self.acceptance)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int):
            raise InputError(f"online: warmup_steps must be an integer, got {self.warmup_steps!r}")
        if self.warmup_steps < 0:
            raise InputError(f"online: warmup_steps must be >= 0, got {self.warmup_steps}")
        if not (np.isfinite(self.prior_strength) and self.prior_strength > 0):
            raise InputError(f"online: prior_strength must be > 0, got {self.prior_strength}")
        if not (0.0 < self.decay <= 1.0):
            raise InputError(f"online: decay must be in (0, 1], got {self.decay}")
        if not (np.isfinite(self.recompute_tolerance) and self.recompute_tolerance >= 0):
            raise InputError(
                f"online: recompute_tolerance must be >= 0, got {self.recompute_tolerance}"
            )


def _clipped_counts(feedback: StepFeedback, k_max: int) -> tuple[IntArray, IntArray]:
    num_spec = np.minimum(np.asarray(feedback.num_spec_tokens, dtype=np.int64), k_max)  # [n]
    num_accepted = np.minimum(np.asarray(feedback.num_accepted, dtype=np.int64), num_spec)  # [n]
    return position_counts(num_spec, num_accepted, k_max)


class OnlineAcceptancePolicy:
    """Goodput K with Beta-prior, exponentially decayed per-position acceptance estimates."""

    def __init__(
        self, profile: Profile, max_num_seqs: int, config: OnlineConfig | None = None
    ) -> None:
        self.config = config or OnlineConfig()
        self.profile = profile
        self.max_num_seqs = max_num_seqs
        self.k_max = profile.k_max
        self.itl = ItlTable.from_profile(profile)
        # [k_max] s_i, or None when every step drafts its K (then rates need no conversion)
        self.draft_rates = partial_draft_rates(profile.draft_rates, self.k_max)
        self.prior_rates = np.asarray(profile.acceptance_rates, dtype=np.float64)  # [k_max]
        # [k_max] the prior per drafted position, q_i = r_i / s_i (None where every step drafts
        # its K): fixed by the profile, so computed once, not on every step
        self.prior_given_drafted: FloatArray | None = None
        if self.draft_rates is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                given = np.where(self.draft_rates > 0, self.prior_rates / self.draft_rates, 0.0)
            self.prior_given_drafted = np.clip(given, 0.0, 1.0)
        self.drafted = np.zeros(self.k_max)  # [k_max] decayed runtime drafted_at_pos
        self.accepted = np.zeros(self.k_max)  # [k_max] decayed runtime accepted_at_pos
        self.num_observed_steps = 0
        self.num_table_builds = 0
        self.table_rates = self.prior_rates.copy()  # [k_max] rates behind the current table
        self.sequences = profile_sequences(profile, self.config.acceptance)
        self._build_table(self.prior_rates)

    def scaled_sequences(self, rates: FloatArray) -> SequenceAcceptance | None:
        """The walked sequences with AL(k) - 1 scaled by the learned over profiled accepted
        tokens at k (None without sequences)."""
        if self.sequences is None:
            return None
        learned = np.cumsum(rates)  # [k_max] expected accepted tokens at k = 1..k_max
        profiled = np.cumsum(self.prior_rates)  # [k_max]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(profiled > 0, learned / profiled, 1.0)  # [k_max]
        walked = self.sequences.acceptance_length  # [k_max + 1]
        scaled = np.concatenate(([1.0], 1.0 + (walked[1:] - 1.0) * ratio))  # [k_max + 1]
        return replace(self.sequences, acceptance_length=scaled)

    def _build_table(self, rates: FloatArray) -> None:
        self.table = goodput_table(
            self.itl,
            rates,
            self.max_num_seqs,
            self.k_max,
            draft_rates=self.draft_rates,
            sequences=self.scaled_sequences(rates),
        )
        self.table_rates = rates.copy()
        self.num_table_builds += 1

    def estimated_rates(self) -> FloatArray:
        """[k_max] posterior-mean rates r_i, made non-increasing in position."""
        strength = self.config.prior_strength
        if self.draft_rates is None or self.prior_given_drafted is None:
            posterior = (self.accepted + strength * self.prior_rates) / (self.drafted + strength)
            return np.minimum.accumulate(posterior)  # [k_max]
        # Counts are of drafted positions: estimate q_i = r_i / s_i, then r_i = q_i s_i.
        given_drafted = (self.accepted + strength * self.prior_given_drafted) / (
            self.drafted + strength
        )  # [k_max]
        return np.minimum.accumulate(given_drafted * self.draft_rates)  # [k_max]

    def current_rates(self) -> FloatArray:
        """[k_max] the rates the policy decides with now (the prior during warm-up)."""
        if self.num_observed_steps < self.config.warmup_steps:
            return self.prior_rates.copy()
        return self.estimated_rates()

    def choose_k(self, view: StepView) -> int:
        return lookup_batch_k(self.table.k_star, view, "online")

    def observe(self, feedback: StepFeedback) -> None:
        drafted, accepted = _clipped_counts(feedback, self.k_max)  # [k_max] each
        self.drafted *= self.config.decay
        self.accepted *= self.config.decay
        self.drafted += drafted
        self.accepted += accepted
        self.num_observed_steps += 1
        if self.num_observed_steps < self.config.warmup_steps:
            return
        rates = self.estimated_rates()
        if float(np.max(np.abs(rates - self.table_rates))) > self.config.recompute_tolerance:
            self._build_table(rates)


class NaiveCumulativeAcceptancePolicy:
    """vLLM PR #32374 branch's online estimator, kept only to reproduce its collapse in tests.

    After `warmup_steps`, r_i = cumulative accepted_at_pos / cumulative drafted_at_pos, and a
    position never drafted reads 0. No prior, no forgetting, no monotonicity repair.
    """

    def __init__(self, profile: Profile, max_num_seqs: int, warmup_steps: int = 20) -> None:
        self.k_max = profile.k_max
        self.max_num_seqs = max_num_seqs
        self.warmup_steps = warmup_steps
        self.itl = ItlTable.from_profile(profile)
        self.drafted = np.zeros(self.k_max, dtype=np.int64)  # [k_max] cumulative
        self.accepted = np.zeros(self.k_max, dtype=np.int64)  # [k_max] cumulative
        self.num_observed_steps = 0
        rates = np.asarray(profile.acceptance_rates, dtype=np.float64)
        self.table = goodput_table(self.itl, rates, max_num_seqs, self.k_max)

    def current_rates(self) -> FloatArray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.drafted > 0, self.accepted / np.maximum(self.drafted, 1), 0.0)

    def choose_k(self, view: StepView) -> int:
        return lookup_batch_k(self.table.k_star, view, "naive-online")

    def observe(self, feedback: StepFeedback) -> None:
        drafted, accepted = _clipped_counts(feedback, self.k_max)
        self.drafted += drafted
        self.accepted += accepted
        self.num_observed_steps += 1
        if self.num_observed_steps >= self.warmup_steps:
            self.table = goodput_table(
                self.itl, self.current_rates(), self.max_num_seqs, self.k_max
            )
