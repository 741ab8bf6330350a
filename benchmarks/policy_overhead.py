"""Host time a K policy adds to each engine step: choose_k and observe, microseconds per step.

A speed figure, so it lives here and not in a timed unit test. On a GPU a small model's step
takes a few ms (SmolLM2-135M on CUDA graphs: 4-6 ms), so a policy's own Python time is a visible
part of TPOT that the simulator's host-overhead model, measured with static policies, does not
charge unless the profile timed the policy (`dsd.policies.host_time`, whose steps this runs).
Each repeat runs every (policy, D) pair in turn, in a rotated order, over the same synthetic
steps: D decode requests with fixed ids, K capped at the profile's k_max, accepted drafts drawn
from a seeded generator. Median (min-max) over the repeats.

    python benchmarks/policy_overhead.py [--profile P] [--policy SPEC ...] [--batch-sizes 1,2,8]
        [--steps 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from dsd.policies.host_time import policy_step_us
from dsd.policies.profile_io import load_profile

DEFAULT_PROFILE = (
    Path(__file__).resolve().parents[1]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)
DEFAULT_POLICIES = ("static:3", "goodput", "online", "per-request")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--policy", action="append", help="a policy SPEC (repeatable)")
    parser.add_argument("--batch-sizes", default="1,2,8,64")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    specs = list(args.policy or DEFAULT_POLICIES)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(
        f"profile {args.profile.name}, k_max {profile.k_max}; {args.steps} steps x "
        f"{args.repeats} repeats; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    samples = policy_step_us(profile, specs, batch_sizes, args.steps, args.repeats)
    for (spec, d), micros in samples.items():
        print(
            f"{spec:<14} D={d:<4} {statistics.median(micros):7.0f} us/step "
            f"(min {min(micros):.0f}, max {max(micros):.0f})"
        )


if __name__ == "__main__":
    main()
