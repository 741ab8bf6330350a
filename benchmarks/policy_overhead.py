"""Host time a K policy adds to each engine step: choose_k and observe, microseconds per step.

A speed figure, so it lives here and not in a timed unit test. On a GPU a small model's step
takes a few ms (SmolLM2-135M on CUDA graphs: 4-6 ms), so a policy's own Python time is a visible
part of TPOT that the simulator's host-overhead model, measured with static policies, does not
charge unless the profile timed the policy (`dsd.policies.host_time`, whose steps this runs).
Each repeat runs every (policy, D) pair in turn, in a rotated order, over the same synthetic
steps: D decode requests with fixed ids, K capped at the profile's k_max, accepted drafts drawn
from a seeded generator. Median (min-max) over the repeats. These are back-to-back times, with
warm caches.

`--target` (with `--draft`) times them as the profiler does instead (docs/models.md 1.5): the
profiler's host-overhead runs of that pair on the CPU (static:0 and static:K_max at C = B, 2 x B
requests, 32 output tokens), with one policy step in turn after each real step, at D = B.
Prints each (policy, D)'s median and the lines `dsd profile` would keep. Here the policies
always include static:K_max (the baseline), goodput, online and per-request.

    python benchmarks/policy_overhead.py [--profile P] [--policy SPEC ...] [--batch-sizes 1,2,8]
        [--steps 2000] [--repeats 5]
    python benchmarks/policy_overhead.py --target smollm2-135m --draft ngram:2-6 \
        --profile results/validation/2026-11-27f-cpu-smollm2/profile.json --batch-sizes 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from dsd.common.errors import InputError, int_list
from dsd.policies.host_time import fit_policy_host_lines, policy_step_us
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile

DEFAULT_PROFILE = (
    Path(__file__).resolve().parents[1]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)
DEFAULT_POLICIES = ("static:3", "goodput", "online", "per-request")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--policy", action="append", help="a policy SPEC (repeatable)")
    parser.add_argument("--batch-sizes", default="1,2,8,64")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target", help="time in the profiler's host-overhead runs of this pair")
    parser.add_argument("--draft", default="ngram:2-6")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (with --target)")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    specs = list(args.policy or DEFAULT_POLICIES)
    try:
        batch_sizes = list(int_list("--batch-sizes", args.batch_sizes, 1))
    except InputError as error:
        print(f"policy_overhead.py: {error}", file=sys.stderr)
        return 2
    settings = (
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    if args.target is not None:
        in_loop(profile, args.target, args.draft, batch_sizes, args.threads, settings)
        return 0
    print(
        f"profile {args.profile.name}, k_max {profile.k_max}; {args.steps} steps x "
        f"{args.repeats} repeats; {settings}"
    )
    samples = policy_step_us(profile, specs, batch_sizes, args.steps, args.repeats)
    for (spec, d), micros in samples.items():
        print(
            f"{spec:<14} D={d:<4} {statistics.median(micros):7.0f} us/step "
            f"(min {min(micros):.0f}, max {max(micros):.0f})"
        )
    return 0


def in_loop(
    profile: Profile,
    target: str,
    draft: str,
    batch_sizes: list[int],
    threads: int,
    settings: str,
) -> None:
    """The policies timed after each step of the profiler's host-overhead runs of the pair."""
    import torch

    from dsd.backend.host_overhead import measure_host_overhead
    from dsd.backend.pair import load_pair
    from dsd.backend.profiler import ProfileConfig

    torch.set_num_threads(threads)
    pair = load_pair(target, draft)
    config = ProfileConfig(
        batch_sizes=tuple(batch_sizes), spec_tokens=(0, 1, profile.k_max), context_lens=(64,)
    )
    print(
        f"{target} + {draft} on the CPU, {threads} torch thread(s); policies built on the "
        f"profile (k_max {profile.k_max}); {settings}"
    )
    _model, _samples, samples = measure_host_overhead(
        pair.target, pair.draft, config, policy_profile=profile
    )
    for (spec, d), micros in sorted(samples.items()):
        print(
            f"{spec:<14} D={d:<4} {statistics.median(micros):7.0f} us/step over {len(micros)} steps"
        )
    baseline = f"static:{profile.k_max}"
    for name, line in fit_policy_host_lines(samples, baseline):
        print(
            f"{name:<14} {line.intercept_ms:.4f} + {line.per_row_ms:.5f} x D ms beyond {baseline}"
        )


if __name__ == "__main__":
    sys.exit(main())
