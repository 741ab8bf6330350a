"""A latency form the simulator does not use, scored as `latency_loko.py` scores the ones it does.

The "tokens" form prices a decode step by its total verified tokens T = B * (K + 1) through a
free, non-decreasing, piecewise-linear curve G(T) (one knot per profiled T), plus costs per row,
per context token held (B * context), per drafting step and per draft pass (K, K * B):

    ITL = G(T) + r * B + kv * B * L + s * [K > 0] + d0 * K + d1 * K * B     (all >= 0)

It asks whether a step's cost on a CPU is a function of its token count (the GEMM's rows) rather
than of B and K apart, and how far the points themselves lie from any such function: its error
fitted on all points is a floor for smooth forms in (T, B, context). Fitted by non-negative least
squares on relative residuals; each interior B is held out and predicted as in
`sim.models.latency_choice.leave_one_knot_out` (the measured side the mean over contexts per K).
docs/models.md 1.2 has the figures and why the form was not adopted.

    python benchmarks/latency_forms.py --profile P.json [--profile Q.json ...]

Pure arithmetic on the profile: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.optimize import lsq_linear

from dsd.common.arrays import FloatArray
from dsd.common.errors import InputError
from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.models.latency_choice import model_scores


def _features(points: tuple[LatencyPoint, ...], knots: list[int]) -> FloatArray:
    """[n, f]: a constant and G's ramps between `knots` (the last one extrapolates), then the
    per-row, context, drafting-step and draft-pass columns."""
    rows = []
    for point in points:
        batch, k = point.batch_size, point.num_spec_tokens
        tokens = batch * (k + 1)
        ramps = [
            max(0.0, (tokens if j == len(knots) - 2 else min(tokens, knots[j + 1])) - knots[j])
            for j in range(len(knots) - 1)
        ]
        context = float(point.context_len or 0)
        rows.append([1.0, *ramps, batch, batch * context, float(k > 0), k, k * batch])
    return np.asarray(rows, dtype=np.float64)


def _knots(points: tuple[LatencyPoint, ...]) -> list[int]:
    tokens = sorted({p.batch_size * (p.num_spec_tokens + 1) for p in points})
    return [1, *(t for t in tokens if t > 1)] if len(tokens) > 1 else [1, 2]


def fit_tokens_form(points: tuple[LatencyPoint, ...]) -> tuple[list[int], FloatArray]:
    """(knots, coefficients >= 0) of the tokens form fitted to `points`."""
    knots = _knots(points)
    measured = np.asarray([p.expected_ms for p in points])
    weights = 1.0 / measured  # relative residuals
    solution = lsq_linear(
        _features(points, knots) * weights[:, None], measured * weights, bounds=(0.0, np.inf)
    )
    return knots, np.asarray(solution.x)


def tokens_form_scores(profile: Profile) -> dict[str, float]:
    """Worst |error| % of the tokens form at a held-out interior B and fitted on all points."""
    points = profile.latency
    knots, coef = fit_tokens_form(points)
    measured = np.asarray([p.expected_ms for p in points])
    fitted = float(np.max(np.abs(_features(points, knots) @ coef / measured - 1.0))) * 100.0
    held_out = 0.0
    for batch_size in profile.batch_sizes()[1:-1]:
        rest = tuple(p for p in points if p.batch_size != batch_size)
        dropped = tuple(p for p in points if p.batch_size == batch_size)
        knots, coef = fit_tokens_form(rest)
        predicted = _features(dropped, knots) @ coef
        for k in sorted({p.num_spec_tokens for p in dropped}):
            at_k = [i for i, p in enumerate(dropped) if p.num_spec_tokens == k]
            ratio = float(
                np.mean(predicted[at_k]) / np.mean([dropped[i].expected_ms for i in at_k])
            )
            held_out = max(held_out, abs(ratio - 1.0) * 100.0)
    return {"held_out_max_abs_pct": held_out, "fitted_max_abs_pct": fitted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", required=True, help="profile JSON")
    args = parser.parse_args(argv)
    print(f"{'profile':<62} {'form':<11} {'held out':>9} {'fitted':>8}  (worst |error| %)")
    for path in args.profile:
        try:
            profile = load_profile(path)
        except (InputError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if len(profile.batch_sizes()) < 3:
            print(f"error: {path}: fewer than 3 batch sizes, none to hold out", file=sys.stderr)
            return 2
        scores = {kind: model_scores(profile, kind) for kind in ("table", "parametric")}
        scores["tokens"] = tokens_form_scores(profile)
        for form, score in scores.items():
            print(
                f"{path:<62} {form:<11} {score['held_out_max_abs_pct']:>8.1f}% "
                f"{score['fitted_max_abs_pct']:>7.1f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
