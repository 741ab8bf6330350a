"""Is a profile's timing trustworthy? Spread and monotonicity checks on its latency points.

A step verifying more tokens cannot be cheaper, so at one context length the median ITL(B, K)
must not fall as K grows at fixed B, nor as B grows at fixed K, and prefill time must not fall
as the prompt grows; a point whose middle 80% of samples spans much of its median was measured
on a disturbed machine. `check_profile` lists every such problem as one readable line per
point; what the profiler and `dsd validate` do with them: docs/validation.md, "Profiles you
can trust". Points without p10/p90 (PR #32374 files) are checked for monotonicity only.

It does not measure, re-measure, or decide what a caller does with the problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsd.common.errors import InputError, require_number
from dsd.policies.profile import LatencyPoint, PrefillPoint, Profile

DEFAULT_MAX_SPREAD = 0.25  # (p90 - p10) / median above this: a noisy point
DEFAULT_TOLERANCE = 0.05  # a median may sit this fraction below a cheaper point's (noise)


@dataclass(frozen=True)
class QualityLimits:
    """Thresholds of `check_profile`."""

    max_spread: float = DEFAULT_MAX_SPREAD  # (p90 - p10) / median of one point, > 0
    tolerance: float = DEFAULT_TOLERANCE  # allowed fall below a cheaper point, in [0, 1)

    def __post_init__(self) -> None:
        require_number(self.max_spread, "max_spread", minimum=0.0)
        require_number(self.tolerance, "tolerance", minimum=0.0)
        if self.max_spread == 0 or self.tolerance >= 1:
            raise InputError(
                f"quality limits: need max_spread > 0 and tolerance < 1, got "
                f"{self.max_spread}, {self.tolerance}"
            )


@dataclass(frozen=True)
class PointProblem:
    """One latency or prefill point that fails a check."""

    kind: str  # "noisy", "falls-with-k", "falls-with-b" or "prefill-falls"
    point: str  # the point, e.g. "B=4 K=3 ctx=129" or "prefill 128 tokens"
    detail: str  # numbers behind the verdict
    batch_size: int | None = None  # the decode point's (B, K, context), None for prefill
    num_spec_tokens: int | None = None
    context_len: int | None = None
    num_tokens: int | None = None  # the prefill point's prompt tokens

    def __str__(self) -> str:
        return f"{self.point}: {self.detail}"


def point_label(point: LatencyPoint) -> str:
    context = "" if point.context_len is None else f" ctx={point.context_len}"
    return f"B={point.batch_size} K={point.num_spec_tokens}{context}"


def _problem(kind: str, point: LatencyPoint, detail: str) -> PointProblem:
    return PointProblem(
        kind,
        point_label(point),
        detail,
        batch_size=point.batch_size,
        num_spec_tokens=point.num_spec_tokens,
        context_len=point.context_len,
    )


def _spread(point: LatencyPoint) -> float | None:
    if point.p10_ms is None or point.p90_ms is None:
        return None
    return (point.p90_ms - point.p10_ms) / point.median_ms


def _falls(
    ordered: Sequence[LatencyPoint], kind: str, axis: str, limits: QualityLimits
) -> list[PointProblem]:
    """Points below (1 - tolerance) x the largest median of a cheaper point in `ordered`."""
    problems = []
    highest: LatencyPoint | None = None
    for point in ordered:
        if highest is not None and point.median_ms < highest.median_ms * (1 - limits.tolerance):
            cheaper = getattr(highest, axis)
            problems.append(
                _problem(
                    kind,
                    point,
                    f"median {point.median_ms:.3g} ms is below {highest.median_ms:.3g} ms at "
                    f"{'K' if axis == 'num_spec_tokens' else 'B'}={cheaper}",
                )
            )
        if highest is None or point.median_ms > highest.median_ms:
            highest = point
    return problems


def check_latency(
    points: Sequence[LatencyPoint], limits: QualityLimits | None = None
) -> list[PointProblem]:
    """Noisy points, and points whose median falls as K or B grows (same context length)."""
    limits = limits or QualityLimits()
    problems = []
    for point in points:
        spread = _spread(point)
        if spread is not None and spread > limits.max_spread:
            problems.append(
                _problem(
                    "noisy",
                    point,
                    f"p10-p90 {point.p10_ms:.3g}-{point.p90_ms:.3g} ms spans "
                    f"{spread:.0%} of the median {point.median_ms:.3g} ms "
                    f"(limit {limits.max_spread:.0%})",
                )
            )
    by_context: dict[int | None, list[LatencyPoint]] = {}
    for point in points:
        by_context.setdefault(point.context_len, []).append(point)
    for group in by_context.values():
        for b in sorted({p.batch_size for p in group}):
            row = sorted((p for p in group if p.batch_size == b), key=lambda p: p.num_spec_tokens)
            problems += _falls(row, "falls-with-k", "num_spec_tokens", limits)
        for k in sorted({p.num_spec_tokens for p in group}):
            column = sorted(
                (p for p in group if p.num_spec_tokens == k), key=lambda p: p.batch_size
            )
            problems += _falls(column, "falls-with-b", "batch_size", limits)
    return problems


def check_prefill(
    points: Sequence[PrefillPoint], limits: QualityLimits | None = None
) -> list[PointProblem]:
    """Prefill points whose median falls as the prompt grows (same batch size)."""
    limits = limits or QualityLimits()
    problems = []
    highest: PrefillPoint | None = None
    for point in sorted(points, key=lambda p: (p.batch_size, p.num_tokens)):
        if highest is not None and highest.batch_size != point.batch_size:
            highest = None
        if highest is not None and point.median_ms < highest.median_ms * (1 - limits.tolerance):
            problems.append(
                PointProblem(
                    "prefill-falls",
                    f"prefill {point.num_tokens} tokens",
                    f"median {point.median_ms:.3g} ms is below {highest.median_ms:.3g} ms "
                    f"for {highest.num_tokens} tokens",
                    num_tokens=point.num_tokens,
                )
            )
        if highest is None or point.median_ms > highest.median_ms:
            highest = point
    return problems


def check_profile(profile: Profile, limits: QualityLimits | None = None) -> list[PointProblem]:
    """Every problem of the profile's latency and prefill points (empty: trustworthy)."""
    return check_latency(profile.latency, limits) + check_prefill(profile.prefill, limits)


def problems_line(problems: Sequence[PointProblem], limit: int = 4) -> str:
    """The problems on one line: the first `limit` in full, then a count."""
    shown = "; ".join(str(p) for p in problems[:limit])
    more = len(problems) - limit
    return shown + (f"; and {more} more" if more > 0 else "")
