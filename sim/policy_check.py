"""`dsd check-policy`: the project's property tests of scheduler accounting, run on a user's policy.

Two checks of one policy SPEC (a built-in or a user's, `policies.plugin`):

- the hypothesis stateful machine of `sim.testing.machine` (scheduler accounting, KV blocks, sync
  and async, preemption, chunked prefill, per-row K, drafters' reservations, the naive reference
  scheduler) with the policy choosing every step's K, for `examples` examples; a violation is
  shrunk by hypothesis and reported with its reproducer (the machine's calls, one per line);
- where vLLM 0.33 is importable, the differential check: our scheduler and vLLM's own
  (`sim.vllm_oracle`) driven on the same random small workloads with two fresh copies of the
  policy, which must schedule the same tokens and drafts at every step.

Deterministic: hypothesis runs derandomized and the differential cases come from `seed`. The
machine needs hypothesis (the `dev` extra); this module imports it only when a check runs. It
does not time anything, and it reports violations rather than raising them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np

from dsd.common.errors import InputError
from dsd.policies.profile import Profile
from dsd.policies.spec import parse_policy
from dsd.policies.types import KPolicy
from dsd.sim.scheduler import SPECULATIVE_METHODS, Scheduler, SchedulerConfig, drafter_reservations
from dsd.sim.types import ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec

LARGEST_K_MAX = 5  # the differential workloads draw k_max in 0..5, the machine's in 0..4
# per step: {request: (scheduled tokens, drafts)}
Steps = list[dict[int, tuple[int, int]]]


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: passed, failed (with what and a reproducer) or skipped (why)."""

    name: str  # what was checked, for the report
    status: str  # "passed", "failed" or "skipped"
    detail: str  # one line: how much was checked, the violation, or why it was skipped
    reproducer: list[str] = field(default_factory=list)  # the shrunk example's lines


@dataclass(frozen=True)
class PolicyCheck:
    """What `check_policy` found."""

    spec: str
    results: list[CheckResult]

    @property
    def passed(self) -> bool:
        return all(result.status != "failed" for result in self.results)

    def text(self) -> str:
        """The report `dsd check-policy` prints."""
        lines = [f"check-policy {self.spec}"]
        for result in self.results:
            lines.append(f"{result.name}: {result.status}: {result.detail}")
            lines += [f"    {line}" for line in result.reproducer]
        lines.append("no accounting violation found" if self.passed else "VIOLATION FOUND")
        return "\n".join(lines)


def check_policy(
    spec: str,
    *,
    profile: Profile | None = None,
    examples: int = 100,
    steps: int = 40,
    differential_cases: int = 100,
    seed: int = 0,
) -> PolicyCheck:
    """Both checks (see the module doc) of the policy `spec` names; a bad SPEC is an
    InputError before anything runs."""
    if examples < 1 or steps < 1 or differential_cases < 0:
        raise InputError("check-policy: --examples and --steps must be >= 1, --cases >= 0")

    def factory(config: SchedulerConfig) -> KPolicy:
        return parse_policy(
            spec,
            profile=profile,
            k_max=config.k_max,
            max_num_seqs=config.max_num_seqs,
            seed=np.random.SeedSequence(seed),
        )

    # The k_max the policy can be built at (`static:3` refuses k_max < 3): the checks draw
    # their configs among those; a SPEC that builds at none is the InputError of the first.
    buildable: list[int] = []
    refusal: InputError | None = None
    for k_max in range(LARGEST_K_MAX + 1):
        try:
            factory(
                SchedulerConfig(max_model_len=64, num_kv_blocks=64, k_max=k_max, max_num_seqs=8)
            )
        except InputError as error:
            refusal = refusal or error
        else:
            buildable.append(k_max)
    if not buildable:
        assert refusal is not None
        raise refusal
    stateful = _stateful(factory, examples, steps, (min(buildable), min(max(buildable), 4)))
    if stateful.status == "failed":
        differential = CheckResult(
            "differential against vLLM's scheduler", "skipped", "fix the violation above first"
        )
    else:
        differential = _differential(factory, differential_cases, seed, set(buildable))
    results = [stateful, differential]
    if refusal is not None:
        results.append(
            CheckResult("k_max", "skipped", f"checked at k_max {buildable} only ({refusal})")
        )
    return PolicyCheck(spec, results)


def _stateful(
    factory: Callable[[SchedulerConfig], KPolicy],
    examples: int,
    steps: int,
    k_max: tuple[int, int],
) -> CheckResult:
    try:
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis.stateful import run_state_machine_as_test
    except ImportError:
        raise InputError("check-policy needs hypothesis: pip install 'dsd[dev]'") from None
    from dsd.sim.testing.machine import make_scheduler_machine, scheduler_configs

    name = "stateful scheduler machine"
    machine = make_scheduler_machine(
        scheduler_configs(k_max=k_max), policy_factory=factory, name="PolicyMachine"
    )
    chosen = settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        # no explain phase: it re-runs the failure many times to list the lines it covers
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )
    try:
        run_state_machine_as_test(machine, settings=chosen)
    except Exception as error:
        message = " ".join(str(error).split()) or type(error).__name__
        # hypothesis attaches the shrunk example to the error (PEP 678 notes), one call a line
        notes = "\n".join(getattr(error, "__notes__", []))
        reproducer = [" ".join(line.split()) for line in _calls(notes)]
        return CheckResult(name, "failed", f"{type(error).__name__}: {message}", reproducer)
    return CheckResult(
        name,
        "passed",
        f"{examples} examples of up to {steps} calls (sync and async, preemption, chunked "
        "prefill, per-row K, drafters' reservations, the reference scheduler)",
    )


def _calls(notes: str) -> list[str]:
    """The reproducer's lines: each call (joined when hypothesis wraps its arguments over
    several lines) and the machine's notes, up to hypothesis's explanation."""
    lines: list[str] = []
    depth = 0
    for raw in notes.splitlines():
        if raw.startswith("Explanation:") and depth == 0:
            break
        if depth > 0:
            lines[-1] += " " + raw.strip()
        elif raw.strip():
            lines.append(raw.strip())
        depth += raw.count("(") - raw.count(")")
    return lines


# --------------------------------------------------------------------------------------------
# Differential check against vLLM's scheduler
# --------------------------------------------------------------------------------------------


def _differential(
    factory: Callable[[SchedulerConfig], KPolicy], cases: int, seed: int, buildable: set[int]
) -> CheckResult:
    from dsd.sim.vllm_oracle import VLLM_VERSION

    name = "differential against vLLM's scheduler"
    if cases == 0:
        return CheckResult(name, "skipped", "--cases 0")
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return CheckResult(name, "skipped", f"vLLM {VLLM_VERSION} is not installed")
    if version != VLLM_VERSION:
        return CheckResult(name, "skipped", f"needs vLLM {VLLM_VERSION}, found {version}")
    from dsd.sim.vllm_oracle import VllmScheduler

    ran = 0
    for case in range(20 * cases):  # case numbers name the random draws, skipped ones included
        if ran == cases:
            break
        rng = random.Random(seed * 1_000_003 + case)
        config, requests = random_case(rng)
        if config.k_max not in buildable:
            continue
        ran += 1
        salt = rng.randint(0, 1000)
        workload = [(r.prompt_len, r.output_len) for r in requests]
        try:
            ours = drive(Scheduler(config), requests, factory(config), salt)
            theirs = drive(VllmScheduler(config), requests, factory(config), salt)
        except InputError as error:  # the policy broke its contract on this workload
            return CheckResult(
                name,
                "failed",
                f"case {case}: {error}",
                [f"config: {config}", f"requests (prompt, output tokens): {workload}"],
            )
        if ours != theirs:
            step = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            return CheckResult(
                name,
                "failed",
                f"case {case}: step {step} differs (request: (tokens, drafts)); ours "
                f"{ours[step] if step < len(ours) else 'finished'}, vLLM's "
                f"{theirs[step] if step < len(theirs) else 'finished'} (a policy whose K "
                "depends on more than its views, feedback and seed differs here too)",
                [
                    f"config: {config}",
                    f"requests: {[(r.prompt_len, r.output_len) for r in requests]}",
                ],
            )
    return CheckResult(
        name, "passed", f"{ran} random workloads: the same tokens and drafts at every step"
    )


def random_case(rng: random.Random) -> tuple[SchedulerConfig, list[RequestSpec]]:
    """A small workload where KV, budget, max_model_len and chunking bind often. Prompts of at
    least 2 tokens: vLLM pads 1-token prompts with drafts (docs/simulator.md)."""
    block_size = rng.choice([1, 2, 4, 8, 16])
    max_model_len = rng.randint(4, 96)
    one_request = -(-max_model_len // block_size)
    k_max = rng.randint(0, LARGEST_K_MAX)
    max_num_seqs = rng.randint(1, 8)
    chunked = rng.random() < 0.8
    budget = (
        rng.randint(max_num_seqs, 96)
        if chunked
        else rng.randint(max(max_model_len, max_num_seqs), max_model_len + 64)
    )
    threshold = rng.choice([0, 0, rng.randint(1, max_model_len)]) if chunked else 0
    method = rng.choice(["ngram"] * len(SPECULATIVE_METHODS) + list(SPECULATIVE_METHODS))
    lookahead, slots = drafter_reservations(method, k_max)
    if lookahead >= budget or (not chunked and budget < max_model_len + slots):
        method = "ngram"  # configs vLLM or SchedulerConfig refuse
    requests = [
        RequestSpec(rng.randint(2, max_model_len - 1), rng.randint(1, 40))
        for _ in range(rng.randint(1, 8))
    ]
    blocks = (
        sum(-(-(r.prompt_len + r.output_len + k_max) // block_size) for r in requests)
        if rng.random() < 0.5  # roomy: nothing is ever preempted
        else one_request + rng.choice([0, 1, 2, rng.randint(0, 4 * one_request)])
    )
    config = SchedulerConfig(
        max_model_len=max_model_len,
        num_kv_blocks=max(blocks, one_request),
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        block_size=block_size,
        scheduling=rng.choice(["sync", "async"]),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        speculative_method=method,
    )
    return config, requests


def _outcome(batch: ScheduledBatch, salt: int) -> StepOutcome:
    """Accepted counts that depend only on (step, request, drafts): both schedulers get the same."""
    accepted = [
        (7 * batch.step_index + 13 * int(batch.req_ids[i]) + salt)
        % (int(batch.num_spec_tokens[i]) + 1)
        for i in range(batch.num_decode_reqs)
    ]
    return StepOutcome(duration_s=0.01, num_accepted=np.array(accepted, dtype=np.int64))


def drive(scheduler: Any, requests: list[RequestSpec], policy: KPolicy, salt: int) -> Steps:
    """Run a scheduler (ours or vLLM's behind our protocol) to completion the engine's way, the
    policy choosing K; the scheduled tokens and drafts per request of every step."""
    from dsd.policies.types import StepFeedback

    for index, spec in enumerate(requests):
        scheduler.add_request(index, spec)
    config = scheduler.config
    steps: Steps = []
    in_flight: tuple[ScheduledBatch, StepOutcome] | None = None
    for _ in range(100_000):
        batch = None
        plan = scheduler.plan_step()
        if plan is not None:
            batch = scheduler.commit_step(plan, policy.choose_k(plan.view(0.0, config)))
        if config.scheduling == "sync":
            if batch is None:
                break
            in_flight = (batch, _outcome(batch, salt))
        if in_flight is not None:
            done, outcome = in_flight
            scheduler.update(done, outcome)
            rows = done.num_decode_reqs
            policy.observe(
                StepFeedback(
                    step_index=done.step_index,
                    time_s=0.0,
                    batch_size=done.batch_size,
                    req_ids=done.req_ids[:rows],
                    num_spec_tokens=done.num_spec_tokens[:rows],
                    num_accepted=outcome.num_accepted,
                    duration_s=outcome.duration_s,
                )
            )
            steps.append(
                {
                    int(r): (int(n), int(k))
                    for r, n, k in zip(
                        done.req_ids, done.num_scheduled_tokens, done.num_spec_tokens, strict=True
                    )
                }
            )
            in_flight = None
        if config.scheduling == "async":
            if batch is None:
                if not scheduler.has_unfinished():
                    break
                continue
            in_flight = (batch, _outcome(batch, salt))
    return steps
