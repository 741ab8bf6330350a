"""Host time a K policy adds to each engine step: choose_k and observe, microseconds per step.

A speed figure, so it lives here and not in a timed unit test. On a GPU a small model's step
takes a few ms (SmolLM2-135M on CUDA graphs: 4-6 ms), so a policy's own Python time is a visible
part of TPOT that the simulator's host-overhead model, measured with static policies, does not
charge. Each repeat runs every (policy, D) pair in turn, in a rotated order, over the same
synthetic steps: D decode requests with fixed ids, K capped at the profile's k_max, accepted
drafts drawn from a seeded generator. Median (min-max) over the repeats.

    python benchmarks/policy_overhead.py [--profile P] [--policy SPEC ...] [--batch-sizes 1,2,8]
        [--steps 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.policies.spec import parse_policy
from dsd.policies.types import KPolicy, StepFeedback, StepView

DEFAULT_PROFILE = (
    Path(__file__).resolve().parents[1]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)
DEFAULT_POLICIES = ("static:3", "goodput", "online", "per-request")


def run_steps(policy: KPolicy, num_decode: int, k_max: int, first_step: int, steps: int) -> float:
    """Seconds for `steps` steps of choose_k + observe over `num_decode` requests."""
    rng = np.random.default_rng(first_step)
    ids = np.arange(num_decode, dtype=np.int64)
    contexts = np.full(num_decode, 200, dtype=np.int64)
    accepted_draws = rng.integers(0, k_max + 1, size=(steps, num_decode))  # drawn before timing
    start_s = time.perf_counter()
    for offset in range(steps):
        step = first_step + offset
        view = StepView(
            step, 0.0, num_decode, num_decode, ids, contexts, k_max, num_tokens=num_decode
        )
        ks = np.broadcast_to(np.asarray(policy.choose_k(view), dtype=np.int64), (num_decode,))
        accepted = np.minimum(ks, accepted_draws[offset])
        policy.observe(StepFeedback(step, 0.0, num_decode, ids, ks, accepted, 0.005, num_decode))
    return time.perf_counter() - start_s


def measure(
    profile: Profile, specs: list[str], batch_sizes: list[int], steps: int, repeats: int
) -> dict[tuple[str, int], list[float]]:
    """(spec, D) -> microseconds per step, one per repeat."""
    pairs = [(spec, d) for spec in specs for d in batch_sizes]
    max_num_seqs = max(batch_sizes)
    policies = {
        pair: parse_policy(pair[0], profile=profile, k_max=profile.k_max, max_num_seqs=max_num_seqs)
        for pair in pairs
    }
    for (_spec, d), policy in policies.items():  # warm-up: imports, memoized tables, caches
        run_steps(policy, d, profile.k_max, 0, 200)
    samples: dict[tuple[str, int], list[float]] = {pair: [] for pair in pairs}
    for repeat in range(repeats):
        rotation = repeat % len(pairs)
        for spec, d in pairs[rotation:] + pairs[:rotation]:
            seconds = run_steps(policies[spec, d], d, profile.k_max, (repeat + 1) * steps, steps)
            samples[spec, d].append(seconds / steps * 1e6)
    return samples


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
    samples = measure(profile, specs, batch_sizes, args.steps, args.repeats)
    for (spec, d), micros in samples.items():
        print(
            f"{spec:<14} D={d:<4} {statistics.median(micros):7.0f} us/step "
            f"(min {min(micros):.0f}, max {max(micros):.0f})"
        )


if __name__ == "__main__":
    main()
