"""Factories for simulator tests: schedulers, requests, and a plain (clock-free) step driver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dsd.policies.types import KPolicy
from dsd.sim.scheduler import Scheduler, SchedulerConfig, StepResult
from dsd.sim.types import Executor, ScheduledBatch
from dsd.traces.workload import RequestSpec


def create_scheduler(**overrides: Any) -> Scheduler:
    """A scheduler with roomy defaults; any SchedulerConfig field may be overridden."""
    params: dict[str, Any] = {
        "max_model_len": 4096,
        "num_kv_blocks": 4096,
        "k_max": 4,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "block_size": 16,
        "scheduling": "sync",
    }
    capacity = overrides.pop("capacity", 4)
    params.update(overrides)
    return Scheduler(SchedulerConfig(**params), capacity=capacity)


def create_requests(
    num_requests: int, prompt_len: int | Sequence[int] = 8, output_len: int | Sequence[int] = 4
) -> list[RequestSpec]:
    """`num_requests` requests, all arriving at 0; lengths scalar or per request."""
    prompts = [prompt_len] * num_requests if isinstance(prompt_len, int) else list(prompt_len)
    outputs = [output_len] * num_requests if isinstance(output_len, int) else list(output_len)
    return [RequestSpec(prompt_len=p, output_len=o) for p, o in zip(prompts, outputs, strict=True)]


@dataclass
class DriveLog:
    """What `drive` saw, step by step."""

    batches: list[ScheduledBatch] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)
    emitted: dict[int, int] = field(default_factory=dict)  # req_id -> output tokens in total
    finished: list[int] = field(default_factory=list)  # req_ids in finish order


def drive(
    scheduler: Scheduler,
    executor: Executor,
    policy: KPolicy,
    max_steps: int = 100_000,
) -> DriveLog:
    """Run the scheduler to completion without a clock, checking invariants after every call.

    Sync: plan, commit, execute, update. Async: plan and commit step t+1 before applying the
    outcome of step t (the engine's order).
    """
    log = DriveLog()
    cfg = scheduler.config
    in_flight: tuple[ScheduledBatch, Any] | None = None
    for _ in range(max_steps):
        batch = None
        plan = scheduler.plan_step()
        scheduler.check_invariants()
        if plan is not None:
            view = plan.view(0.0, cfg)
            batch = scheduler.commit_step(plan, policy.choose_k(view))
            scheduler.check_invariants()
        if cfg.scheduling == "sync":
            if batch is None:
                break
            in_flight = (batch, executor.execute(batch))
        if in_flight is not None:
            done_batch, outcome = in_flight
            result = scheduler.update(done_batch, outcome)
            scheduler.check_invariants()
            log.batches.append(done_batch)
            log.results.append(result)
            for req_id, num in zip(
                result.req_ids.tolist(), result.num_output_tokens.tolist(), strict=True
            ):
                log.emitted[req_id] = log.emitted.get(req_id, 0) + num
            log.finished.extend(result.finished_req_ids)
            in_flight = None
        if cfg.scheduling == "async":
            if batch is None:
                if not scheduler.has_unfinished():
                    break
                continue
            in_flight = (batch, executor.execute(batch))
    else:
        raise AssertionError("drive: did not finish within max_steps")
    assert not scheduler.has_unfinished()
    assert not scheduler.has_inflight()
    return log
