"""Paired gaps: a policy against a reference policy, seed by seed, with a confidence interval.

Runs of two policies at one seed see the same requests and, through the simulator's common
random numbers, the same acceptance luck wherever their K agree; so the difference of a pair
is far less noisy than either run. A gap is the mean over seeds of policy / reference - 1 with
a 95% Student-t interval of that mean (docs/policies.md "Evaluation"). Used by the policy
evaluation and by `dsd report`; it runs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Gap:
    """A policy's gap to a reference over paired seeds (fractions, negative = better)."""

    mean: float  # mean over seeds of value / reference value - 1
    half_width: float  # 95% Student-t confidence half-width of the mean (inf with one seed)
    num_seeds: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def paired_gap(values: Sequence[float], reference: Sequence[float]) -> Gap:
    """The gap of `values` [seeds] to `reference` [seeds], seed i against seed i."""
    if len(values) != len(reference) or not len(values):
        raise ValueError(f"need the same seeds on both sides: {len(values)}, {len(reference)}")
    gaps = np.asarray(values, dtype=np.float64) / np.asarray(reference, dtype=np.float64) - 1.0
    n = int(gaps.shape[0])
    if n < 2:
        return Gap(float(gaps.mean()), math.inf, n)
    t = float(stats.t.ppf(0.975, n - 1))
    return Gap(float(gaps.mean()), t * float(gaps.std(ddof=1)) / math.sqrt(n), n)


def verdict(gap: Gap) -> str:
    """better / worse when the interval excludes 0, else tie."""
    if gap.high < 0:
        return "better"
    return "worse" if gap.low > 0 else "tie"
