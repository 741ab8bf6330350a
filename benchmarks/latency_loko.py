"""How well a latency model predicts ITL(B, K) between profiled batch sizes: leave one knot out.

For every interior batch size B of a profile (neither the smallest nor the largest), all its
points (every K, every context) are dropped, the model is fitted on the rest, and the dropped
points are predicted: error % = predicted / measured - 1, per (B, K). The table model reads the
remaining table with goodput's interpolation; the parametric model is refitted. The fit on all
points is printed beside them, and the model `--latency-model auto` picks from these figures.

    python benchmarks/latency_loko.py                      # the PR #32374 H100 profile
    python benchmarks/latency_loko.py --profile P.json --json out.json

Pure arithmetic on the profile's medians: the figures do not depend on the machine. The goal of
the latency-model issue is max |error| <= 5% at every held-out interior knot.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from dsd.common.atomic import atomic_write_json
from dsd.common.errors import InputError
from dsd.policies.profile_io import load_profile
from dsd.sim.models.latency import LatencyModelKind
from dsd.sim.models.latency_choice import (
    fit_latency_model,
    knot_error_pct,
    leave_one_knot_out,
    select_latency_model,
)

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
KINDS: tuple[LatencyModelKind, ...] = ("table", "parametric")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=PROFILE, help="profile file (ours or PR #32374's)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.profile)
    except InputError as exc:  # names the file itself
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"error: {args.profile}: {exc}", file=sys.stderr)
        return 2
    batch_sizes = profile.batch_sizes()
    interior = batch_sizes[1:-1]
    if not interior:
        print(f"error: {args.profile}: needs >= 3 batch sizes to leave one out", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    print(f"{args.profile}: B = {batch_sizes}, K = {profile.spec_token_values()}")
    print(f"{'model':<11} {'B':>5}  {'held out: error % per K':<36} {'fitted on all points':<30}")
    for kind in KINDS:
        for knot in leave_one_knot_out(profile, kind):
            batch_size, out = knot.batch_size, knot.error_pct
            fit = knot_error_pct(fit_latency_model(profile, kind=kind), profile, batch_size)
            rows.append(
                {"model": kind, "batch_size": batch_size, "held_out_pct": out, "fitted_pct": fit}
            )
            held = " ".join(f"K={k}:{v:+.1f}" for k, v in out.items())
            full = " ".join(f"{v:+.1f}" for v in fit.values())
            print(f"{kind:<11} {batch_size:>5}  {held:<36} {full:<30}")
        worst = max(
            abs(v) for row in rows if row["model"] == kind for v in row["held_out_pct"].values()
        )
        print(f"{kind:<11} worst held-out |error| {worst:.1f}% (goal <= 5%)")
    _model, choice = select_latency_model(profile)
    print(f"--latency-model auto uses {choice.kind}: {choice.reason}")
    if args.json:
        atomic_write_json(
            args.json,
            {"profile": args.profile, "rows": rows, "auto": dataclasses.asdict(choice)},
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
