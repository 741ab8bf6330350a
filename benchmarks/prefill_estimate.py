"""How well a profile without prefill points can price a prefill: estimates against measurements.

A profile that has prefill points (a `dsd profile` of the real engine) is stripped of them, and
each prompt size's prefill latency is estimated three ways from what is left (the decode table):

    decode slope   ITL(1, 0) + (N - 1) x the ms per extra row of ITL(B, 0) between the two
                   largest B (`sim.models.latency.PrefillCost`'s estimate today)
    verify slope   ITL(1, 0) + (N - 1) x the ms per extra verified token at the largest B:
                   (ITL(B, K_max) - ITL(B, K')) / (B (K_max - K')), K' the next smaller K (the
                   same rows and contexts, only tokens added)
    parametric     the fitted parametric model's one-row step verifying N tokens at context N

and compared with the measured points: error % = estimate / measured - 1.

    python benchmarks/prefill_estimate.py
    python benchmarks/prefill_estimate.py --profile P.json --json out.json

Pure arithmetic on the profile: the figures do not depend on the machine they are printed on.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import numpy as np

from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.models.latency import ParametricLatencyModel, PrefillCost

PROFILE = "results/validation/2026-11-25-cpu-smollm2/profile_retimed.json"


def _verify_slope_ms(profile: Profile) -> float:
    """ms per verified token at the largest B, from its two largest profiled K."""
    bs, ks, grid = profile.itl_grid()  # [nB], [nK], [nB, nK]
    row = grid[-1]  # [nK] the largest B
    known = np.flatnonzero(~np.isnan(row))
    if known.size < 2:
        raise InputError("the largest batch size needs >= 2 profiled K for a verify slope")
    high, low = int(known[-1]), int(known[-2])
    return float((row[high] - row[low]) / (bs[-1] * (ks[high] - ks[low])))


def estimates(profile: Profile) -> list[dict[str, Any]]:
    """One row per measured prompt size: measured ms and each estimate's ms and error %."""
    measured: dict[int, list[float]] = {}
    for point in profile.prefill:
        measured.setdefault(point.num_tokens, []).append(point.expected_ms)
    if not measured:
        raise InputError("the profile has no prefill points to compare with")
    bare = dataclasses.replace(profile, prefill=())
    decode_slope = PrefillCost.from_profile(bare)
    one_token_ms = decode_slope.curve_ms(1.0)
    verify_slope = _verify_slope_ms(bare)
    fit = ParametricLatencyModel.fit(bare)
    rows = []
    for tokens in sorted(measured):
        n = float(tokens)
        guesses = {
            "decode slope": decode_slope.curve_ms(n),
            "verify slope": one_token_ms + verify_slope * (n - 1.0),
            "parametric": fit.forward_ms(1.0, 0.0, n, n),
        }
        value = float(np.mean(measured[tokens]))
        rows.append(
            {
                "num_tokens": tokens,
                "measured_ms": value,
                **{f"{name}_ms": ms for name, ms in guesses.items()},
                **{f"{name}_error_pct": 100 * (ms / value - 1) for name, ms in guesses.items()},
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=PROFILE, help="a profile with prefill points")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        rows = estimates(load_profile(args.profile))
    except (InputError, OSError, ValueError) as error:
        print(f"error: {args.profile}: {error}", file=sys.stderr)
        return 2
    names = ("decode slope", "verify slope", "parametric")
    print(f"{args.profile}: prefill ms, measured and estimated without the prefill points")
    print(f"{'tokens':>7} {'measured':>9} " + " ".join(f"{name:>20}" for name in names))
    for row in rows:
        cells = " ".join(
            f"{row[f'{name}_ms']:9.1f} ({row[f'{name}_error_pct']:+5.0f}%)" for name in names
        )
        print(f"{row['num_tokens']:>7} {row['measured_ms']:9.1f}  {cells}")
    if args.json:
        atomic_write_json(args.json, {"profile": args.profile, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
