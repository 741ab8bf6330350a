"""The measured profile that policies and the simulator read (DESIGN §6).

A `Profile` holds what was measured of one (target, draft, device) setup: step latency points
ITL(B, K, context), prefill points, per-position acceptance counts, per-request acceptance
samples and metadata. It is data only: loading/validation is in `policies.profile_io`, fitting
latency models is in `sim.latency`, the PR #32374 file format is in `backend.vllm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


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


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """One measured prefill step: `num_tokens` prompt tokens computed in one forward."""

    num_tokens: int  # prompt tokens in the step, >= 1
    median_ms: float  # finite, > 0
    batch_size: int = 1  # requests in the step
    n: int | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    """Everything dsd knows about one (target, draft, device) setup."""

    k_max: int  # largest profiled K (num_speculative_tokens)
    latency: tuple[LatencyPoint, ...]  # decode step latency points
    acceptance_rates: tuple[float, ...]  # r_1..r_kmax, unconditional per-position rates
    drafted_at_pos: tuple[int, ...] | None = None  # counts behind the rates, if known
    accepted_at_pos: tuple[int, ...] | None = None
    prefill: tuple[PrefillPoint, ...] = ()
    # per-request samples: each request's own unconditional per-position rates (len <= k_max)
    per_request_rates: tuple[tuple[float, ...], ...] = ()
    temperature: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)  # models, device, versions, command...

    def batch_sizes(self) -> list[int]:
        return sorted({p.batch_size for p in self.latency})

    def spec_token_values(self) -> list[int]:
        return sorted({p.num_spec_tokens for p in self.latency})

    def itl_grid(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]:
        """(batch_sizes [nB], ks [nK], itl_ms [nB, nK]) with NaN where a (B, K) is missing.

        Points at several context lengths for one (B, K) are averaged (context-aware models
        read `latency` directly).
        """
        bs = np.array(self.batch_sizes(), dtype=np.int64)
        ks = np.array(self.spec_token_values(), dtype=np.int64)
        sums = np.zeros((len(bs), len(ks)))
        counts = np.zeros((len(bs), len(ks)))
        b_index = {int(b): i for i, b in enumerate(bs)}
        k_index = {int(k): j for j, k in enumerate(ks)}
        for p in self.latency:
            i, j = b_index[p.batch_size], k_index[p.num_spec_tokens]
            sums[i, j] += p.median_ms
            counts[i, j] += 1
        with np.errstate(invalid="ignore"):
            grid = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return bs, ks, grid

    def acceptance_length(self, k: int) -> float:
        """AL(k) = 1 + sum_{i<=k} r_i."""
        return 1.0 + float(sum(self.acceptance_rates[:k]))
