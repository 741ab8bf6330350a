"""sim/vllm_oracle.py: vLLM 0.33's real scheduler behind our call protocol (`VllmScheduler`);
smoke tests, and the differential test against ours.

Runs where vLLM 0.33 is importable (CI installs it, see README) and is skipped elsewhere. vLLM
is imported once per module (a module fixture): the import takes about ten seconds.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from utils import create_scheduler, drive

from dsd.sim.policy_check import random_case
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.types import ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec


@pytest.fixture(scope="module")
def oracle() -> ModuleType:
    """dsd.sim.vllm_oracle with vLLM's scheduler modules imported (skips without vLLM)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    pytest.importorskip("vllm.v1.core.sched.scheduler")
    pytest.importorskip("vllm.v1.core.sched.async_scheduler")
    from dsd.sim import vllm_oracle

    return vllm_oracle


def _config(**overrides: Any) -> SchedulerConfig:
    params: dict[str, Any] = {
        "max_model_len": 256,
        "num_kv_blocks": 64,
        "k_max": 3,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
    }
    return create_scheduler(**{**params, **overrides}).config


def _all(step: int, req: int, drafted: int) -> int:
    return drafted


def _none(step: int, req: int, drafted: int) -> int:
    return 0


def _mixed(step: int, req: int, drafted: int) -> int:
    return (7 * step + 13 * req) % (drafted + 1)


class _PerStepK:
    def __init__(self, ks: list[int]) -> None:
        self.ks = ks

    def choose_k(self, view: Any) -> int:
        return self.ks[min(view.step_index, len(self.ks) - 1)]

    def observe(self, feedback: Any) -> None:
        pass


class _Accepting:
    def __init__(self, accepted: Callable[[int, int, int], int]) -> None:
        self.accepted = accepted

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        pass

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        rows = range(batch.num_decode_reqs)
        num_accepted = [
            self.accepted(batch.step_index, int(batch.req_ids[i]), int(batch.num_spec_tokens[i]))
            if batch.num_spec_tokens[i]
            else 0
            for i in rows
        ]
        return StepOutcome(duration_s=0.01, num_accepted=np.array(num_accepted, dtype=np.int64))


Steps = list[dict[int, tuple[int, int]]]  # per step: {request: (tokens, drafts)}


def _run(
    scheduler: Any,
    requests: list[RequestSpec],
    ks: list[int] | int,
    accepted: Callable[[int, int, int], int],
) -> tuple[Steps, dict[int, int]]:
    """Drive a scheduler (ours or vLLM's behind our protocol) the engine's way, K per step
    (drafted after step t, verified at t + 1) and accepted counts given; (steps, emitted)."""
    for index, spec in enumerate(requests):
        scheduler.add_request(index, spec)
    policy = _PerStepK(ks if isinstance(ks, list) else [ks])
    log = drive(scheduler, _Accepting(accepted), policy)
    steps = [
        {
            int(r): (int(n), int(k))
            for r, n, k in zip(b.req_ids, b.num_scheduled_tokens, b.num_spec_tokens, strict=True)
        }
        for b in log.batches
    ]
    return steps, log.emitted


def _ours(config, requests, ks, accepted) -> Steps:
    return _run(Scheduler(config), requests, ks, accepted)[0]


def _theirs(oracle, config, requests, ks, accepted) -> tuple[Steps, dict[int, int]]:
    return _run(oracle.VllmScheduler(config), requests, ks, accepted)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("k_max", [0, 3])
def test_single_request_without_drafts(oracle: ModuleType, scheduling: str, k_max: int) -> None:
    """K = 0: the prompt in one step, then output_len - 1 single-token steps (no waste)."""
    steps, emitted = _theirs(
        oracle, _config(k_max=k_max, scheduling=scheduling), [RequestSpec(10, 6)], 0, _all
    )
    assert steps == [{0: (10, 0)}] + [{0: (1, 0)}] * 5
    assert emitted == {0: 6}


@pytest.mark.parametrize(
    ("output_len", "expected"),
    [
        # 1 + 4 + 4 = 9 >= 8: the second decode step's last draft is trimmed.
        (8, [(10, 0), (4, 3), (4, 3)]),
        # 1 + 4 + 4 = 9 < 10: one more decode step, 13 trimmed to 10.
        (10, [(10, 0), (4, 3), (4, 3), (4, 3)]),
    ],
)
def test_always_accept_k3(
    oracle: ModuleType, output_len: int, expected: list[tuple[int, int]]
) -> None:
    """K = 3 every step, all accepted: 1 + 3 tokens per decode step (the prompt-completing
    step's drafts are verified at the first decode), exactly output_len outputs in the end."""
    steps, emitted = _theirs(oracle, _config(), [RequestSpec(10, output_len)], 3, _all)
    assert steps == [{0: row} for row in expected]
    assert emitted == {0: output_len}


def test_k_chosen_at_a_step_is_verified_at_the_next(oracle: ModuleType) -> None:
    """vLLM's drafter runs after step t with step t's K; step t+1 verifies those drafts."""
    steps, _ = _theirs(oracle, _config(), [RequestSpec(10, 9)], [3, 1, 2, 0], _none)
    assert steps == [{0: (10, 0)}, {0: (4, 3)}, {0: (2, 1)}, {0: (3, 2)}] + [{0: (1, 0)}] * 5


def test_async_runs_to_completion(oracle: ModuleType) -> None:
    """Async scheduling, several requests, varying K and acceptance: every request finishes
    with exactly output_len outputs, prefill rows carry no drafts, decode rows 1 + d tokens."""
    requests = [RequestSpec(10 + 5 * i, 7 + 3 * i) for i in range(4)]
    steps, emitted = _theirs(
        oracle,
        _config(scheduling="async", max_num_batched_tokens=32),
        requests,
        [3, 1, 2, 0, 3, 3, 2],
        _mixed,
    )
    assert emitted == {i: spec.output_len for i, spec in enumerate(requests)}
    for step in steps:
        for tokens, drafts in step.values():
            assert drafts == 0 or tokens == 1 + drafts


def test_async_k0_schedules_no_wasted_step(oracle: ModuleType) -> None:
    """vLLM's async stop rule (its test_stop_by_max_tokens): prompt + max_tokens - 1 tokens."""
    requests = [RequestSpec(10, n) for n in (1, 2, 3, 5)]
    steps, _ = _theirs(oracle, _config(scheduling="async", k_max=0), requests, 0, _all)
    total = sum(tokens for step in steps for tokens, _ in step.values())
    assert total == sum(spec.prompt_len + spec.output_len - 1 for spec in requests)


def test_usable_blocks_match_num_kv_blocks(oracle: ModuleType) -> None:
    """vLLM's null block is added on top: the usable pool is num_kv_blocks, so a pool that
    holds exactly one max_model_len request runs it without preemption."""
    config = _config(max_model_len=32, num_kv_blocks=4, block_size=8)
    scheduler = oracle.build_vllm_scheduler(config)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 4
    adapter = oracle.VllmScheduler(config)
    adapter.add_request(0, RequestSpec(8, 24))
    log = drive(adapter, _Accepting(_none), _PerStepK([3]))
    assert log.emitted == {0: 24}
    assert adapter.num_preemptions == 0


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_agrees_with_our_scheduler_on_a_roomy_pool(oracle: ModuleType, scheduling: str) -> None:
    """A hand-written case (roomy KV pool, no 1-token prompt): vLLM and we schedule the same
    tokens each step, budget-trimmed drafts and chunked prompts included."""
    config = _config(scheduling=scheduling, max_num_batched_tokens=24, max_num_seqs=4)
    requests = [RequestSpec(12 + 3 * i, 5 + 2 * i) for i in range(5)]
    ks = [3, 1, 2, 0, 3, 3, 2, 1]
    expected, _ = _theirs(oracle, config, requests, ks, _mixed)
    assert _ours(config, requests, ks, _mixed) == expected


def _random_case(rng: random.Random) -> tuple[SchedulerConfig, list[RequestSpec], list[int] | int]:
    """A small random case where KV, budget, max_model_len, chunking and the prefill threshold
    bind often (`sim.policy_check.random_case`, what `dsd check-policy` draws); (config,
    requests, K per step or one K)."""
    config, requests = random_case(rng)
    k_max = config.k_max
    ks: list[int] | int = (
        [rng.randint(0, k_max) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.5
        else rng.randint(0, k_max)
    )
    return config, requests, ks


def test_vllm_and_we_schedule_the_same_tokens_on_1000_random_workloads(oracle: ModuleType) -> None:
    """Differential test: vLLM 0.33's Scheduler / AsyncScheduler and ours, the same workloads,
    K and accepted counts; every step's scheduled tokens and drafts per request must agree
    (sync and async, static and per-step K, chunked prefill, preemption, tight budgets, every
    drafting method's KV lookahead and per-row draft slots).
    Outside this test's cases, by construction: 1-token prompts with drafts (vLLM pads them;
    docs/simulator.md, "vLLM, differentially")."""
    differences = []
    for seed in range(1000):
        rng = random.Random(seed)
        config, requests, ks = _random_case(rng)
        salt = rng.randint(0, 1000)

        def accepted(step: int, req: int, drafted: int, salt: int = salt) -> int:
            return (7 * step + 13 * req + salt) % (drafted + 1)

        expected, _ = _theirs(oracle, config, requests, ks, accepted)
        got = _ours(config, requests, ks, accepted)
        if got != expected:
            first = next(
                (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                min(len(got), len(expected)),
            )
            differences.append((seed, config, requests, ks, first))
    assert not differences, f"{len(differences)} of 1000 differ; first: {differences[0]}"


_PROFILE = str(
    Path(__file__).resolve().parents[2] / "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
)


def _same_metrics(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal, NaN equal to NaN (acceptance of positions never drafted)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


@pytest.mark.parametrize(
    ("scheduling", "policy", "num_kv_blocks", "method"),
    [
        ("sync", "goodput", None, "ngram"),
        ("sync", "per-request", 120, "draft_model"),  # a tight pool: preemption
        ("async", "static:3", 120, "eagle"),
        ("async", "per-request", None, "ngram"),
    ],
)
def test_simulate_with_vllms_scheduler_gives_ours(
    oracle: ModuleType, scheduling: str, policy: str, num_kv_blocks: int | None, method: str
) -> None:
    """`--scheduler vllm`: the engine loop with the fitted executor and vLLM's own scheduler
    gives the same run as ours, request for request (per-row K, preemption, async)."""
    import dsd

    fields: dict[str, Any] = dict(
        profile=_PROFILE,
        policy=policy,
        dataset="mt-bench",
        num_prompts=24,
        max_concurrency=8,
        num_kv_blocks=num_kv_blocks,
        scheduling=scheduling,
        speculative_method=method,
    )
    ours = dsd.simulate(**fields)
    theirs = dsd.simulate(scheduler="vllm", **fields)
    assert _same_metrics(ours.metrics, theirs.metrics)
    assert ours.requests.equals(theirs.requests)
    if num_kv_blocks is not None:
        assert ours.metrics["num_preemptions"] > 0
