"""Host time a K policy's own decisions take per engine step: choose_k and observe, timed on
synthetic steps.

On a GPU a small model's step takes a few ms (SmolLM2-135M on CUDA graphs: 4-6 ms), so a
learning policy's Python time is a visible part of TPOT (the H100 report measured per-request's
steps 0.4-0.6 ms longer outside the executor than static ones). The profiler's host-overhead
model is measured with static policies; `policy_host_lines` times each learning policy against
a static one on the profiling machine, and the profile keeps the difference per policy
(`HostOverhead.policies`), which the simulator adds to a run of that policy.
`benchmarks/policy_overhead.py` prints the raw times. Not a model of the engine loop's own host
work.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from scipy.optimize import nnls

from dsd.policies.profile import HostOverheadLine, Profile
from dsd.policies.spec import parse_policy
from dsd.policies.types import KPolicy, StepFeedback, StepView

# The built-in policies whose decisions cost host time beyond a static table lookup
TIMED_POLICIES: tuple[str, ...] = ("goodput", "online", "per-request")


def time_policy_steps(
    policy: KPolicy, num_decode: int, k_max: int, first_step: int, steps: int
) -> float:
    """Seconds for `steps` synthetic steps of choose_k + observe over `num_decode` requests
    (fixed ids, context 200, accepted drafts drawn from a generator seeded by `first_step`)."""
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


def policy_step_us(
    profile: Profile,
    specs: list[str],
    batch_sizes: list[int],
    steps: int,
    repeats: int,
    warmup_steps: int = 200,
) -> dict[tuple[str, int], list[float]]:
    """(spec, D) -> microseconds per step, one sample per repeat. Each repeat runs every pair
    in turn, in a rotated order; each policy is built once and warmed up first."""
    pairs = [(spec, d) for spec in specs for d in batch_sizes]
    max_num_seqs = max(batch_sizes)
    policies = {
        pair: parse_policy(pair[0], profile=profile, k_max=profile.k_max, max_num_seqs=max_num_seqs)
        for pair in pairs
    }
    for (_spec, d), policy in policies.items():  # imports, memoized tables, caches
        time_policy_steps(policy, d, profile.k_max, 0, warmup_steps)
    samples: dict[tuple[str, int], list[float]] = {pair: [] for pair in pairs}
    for repeat in range(repeats):
        rotation = repeat % len(pairs)
        for spec, d in pairs[rotation:] + pairs[:rotation]:
            first_step = warmup_steps + repeat * steps
            seconds = time_policy_steps(policies[spec, d], d, profile.k_max, first_step, steps)
            samples[spec, d].append(seconds / steps * 1e6)
    return samples


def policy_host_lines(
    profile: Profile,
    batch_sizes: list[int],
    names: tuple[str, ...] = TIMED_POLICIES,
    steps: int = 300,
    repeats: int = 3,
) -> tuple[tuple[str, HostOverheadLine], ...]:
    """Per policy name, the line in D (intercept, per row; both >= 0, least squares; a
    constant from one batch size) of its median ms per step beyond static:k_max's, over
    `batch_sizes`."""
    baseline = f"static:{profile.k_max}"
    samples = policy_step_us(
        profile, [baseline, *names], batch_sizes, steps, repeats, warmup_steps=min(200, steps)
    )
    design = np.column_stack((np.ones(len(batch_sizes)), np.asarray(batch_sizes, float)))
    lines = []
    for name in names:
        extra_ms = np.array(
            [
                max(
                    statistics.median(samples[name, d]) - statistics.median(samples[baseline, d]),
                    0.0,
                )
                / 1000.0
                for d in batch_sizes
            ]
        )  # [nB]
        if len(batch_sizes) == 1:  # one B says nothing of a slope: a constant
            intercept_ms, per_row_ms = float(extra_ms[0]), 0.0
        else:
            (intercept_ms, per_row_ms), _residual = nnls(design, extra_ms)
        lines.append((name, HostOverheadLine(float(intercept_ms), float(per_row_ms))))
    return tuple(sorted(lines, key=lambda item: item[0]))  # by name, as a profile file lists them
