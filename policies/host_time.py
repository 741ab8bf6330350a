"""Host time a K policy's own decisions take per engine step: choose_k and observe, timed on
synthetic steps.

On a GPU a small model's step takes a few ms, so a learning policy's Python time is a visible
part of TPOT. The profiler's host-overhead model is measured with static policies; a learning
policy's own time beyond a static one's is kept per policy as a line in D
(`HostOverhead.policies`), which the simulator adds to a run of that policy. Where the steps
are timed matters more than what they do: in the engine loop a policy runs after the
executor's step has evicted its code and data from the host's caches, so the profiler times
one policy step right after each real step of its host-overhead runs (`PolicyStepper`,
`fit_policy_host_lines`), while `policy_step_us` times them back to back, with warm caches
(what `benchmarks/policy_overhead.py` prints). The figures: docs/models.md 1.5.

Not a model of the engine loop's own host work.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from dsd.policies.profile import HostOverheadLine, Profile
from dsd.policies.spec import parse_policy
from dsd.policies.types import KPolicy, StepFeedback, StepView

# The built-in policies whose decisions cost host time beyond a static table lookup
TIMED_POLICIES: tuple[str, ...] = ("goodput", "online", "per-request")


class PolicyStepper:
    """One policy on synthetic steps of `num_decode` requests: fixed ids, context 200, accepted
    drafts drawn from a generator seeded by `seed`. `step()` runs choose_k + observe of the
    next step and returns its seconds (the draws are made outside the timed part)."""

    def __init__(self, policy: KPolicy, num_decode: int, k_max: int, seed: int = 0) -> None:
        self.policy = policy
        self.num_decode = num_decode
        self.k_max = k_max
        self.step_index = 0
        self._rng = np.random.default_rng(seed)
        self._ids = np.arange(num_decode, dtype=np.int64)
        self._contexts = np.full(num_decode, 200, dtype=np.int64)

    def step(self) -> float:
        d, step = self.num_decode, self.step_index
        accepted_draw = self._rng.integers(0, self.k_max + 1, size=d)
        start_s = time.perf_counter()
        view = StepView(step, 0.0, d, d, self._ids, self._contexts, self.k_max, num_tokens=d)
        ks = np.broadcast_to(np.asarray(self.policy.choose_k(view), dtype=np.int64), (d,))
        accepted = np.minimum(ks, accepted_draw)
        self.policy.observe(StepFeedback(step, 0.0, d, self._ids, ks, accepted, 0.005, d))
        seconds = time.perf_counter() - start_s
        self.step_index += 1
        return seconds

    def run(self, steps: int) -> float:
        """Seconds of `steps` steps back to back."""
        return sum(self.step() for _ in range(steps))


def policy_steppers(
    profile: Profile, specs: Sequence[str], num_decode: int, max_num_seqs: int, warmup_steps: int
) -> dict[str, PolicyStepper]:
    """spec -> its stepper at D = `num_decode`, each policy built on `profile` and warmed up
    (imports, memoized tables, caches) by `warmup_steps` untimed steps."""
    steppers = {
        spec: PolicyStepper(
            parse_policy(spec, profile=profile, k_max=profile.k_max, max_num_seqs=max_num_seqs),
            num_decode,
            profile.k_max,
        )
        for spec in specs
    }
    for stepper in steppers.values():
        stepper.run(warmup_steps)
    return steppers


def policy_step_us(
    profile: Profile,
    specs: list[str],
    batch_sizes: list[int],
    steps: int,
    repeats: int,
    warmup_steps: int = 200,
) -> dict[tuple[str, int], list[float]]:
    """(spec, D) -> microseconds per step back to back, one sample per repeat. Each repeat runs
    every pair in turn, in a rotated order; each policy is built once and warmed up first."""
    max_num_seqs = max(batch_sizes)
    steppers = {
        (spec, d): stepper
        for d in batch_sizes
        for spec, stepper in policy_steppers(profile, specs, d, max_num_seqs, warmup_steps).items()
    }
    pairs = [(spec, d) for spec in specs for d in batch_sizes]
    samples: dict[tuple[str, int], list[float]] = {pair: [] for pair in pairs}
    for repeat in range(repeats):
        rotation = repeat % len(pairs)
        for pair in pairs[rotation:] + pairs[:rotation]:
            samples[pair].append(steppers[pair].run(steps) / steps * 1e6)
    return samples


def fit_policy_host_lines(
    samples_us: Mapping[tuple[str, int], Sequence[float]],
    baseline: str,
    names: Sequence[str] = TIMED_POLICIES,
) -> tuple[tuple[str, HostOverheadLine], ...]:
    """Per policy name, the line in D (intercept, per row; both >= 0, least squares; a constant
    from one D) of its median us per step beyond `baseline`'s, from (spec, D) -> samples in
    microseconds over the D that every one of them has samples at."""
    batch_sizes = sorted({d for spec, d in samples_us if spec == baseline and samples_us[spec, d]})
    batch_sizes = [d for d in batch_sizes if all(samples_us.get((name, d)) for name in names)]
    if not batch_sizes:
        raise ValueError(f"fit_policy_host_lines: no D with samples of {baseline} and {names}")
    design = np.column_stack((np.ones(len(batch_sizes)), np.asarray(batch_sizes, float)))
    lines = []
    for name in names:
        extra_ms = np.array(
            [
                max(
                    statistics.median(samples_us[name, d])
                    - statistics.median(samples_us[baseline, d]),
                    0.0,
                )
                / 1000.0
                for d in batch_sizes
            ]
        )  # [nD]
        if len(batch_sizes) == 1:  # one D says nothing of a slope: a constant
            intercept_ms, per_row_ms = float(extra_ms[0]), 0.0
        else:
            (intercept_ms, per_row_ms), _residual = nnls(design, extra_ms)
        lines.append((name, HostOverheadLine(float(intercept_ms), float(per_row_ms))))
    return tuple(sorted(lines, key=lambda item: item[0]))  # by name, as a profile file lists them
