"""The naive reference scheduler: hand-checked schedules, and agreement with the real one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from utils import create_requests, create_scheduler

from dsd.sim.scheduler import Scheduler
from dsd.sim.testing.reference import ReferenceScheduler
from dsd.sim.types import StepOutcome


def _run_reference(reference: ReferenceScheduler, k: int, accept_all: bool = True):
    """Sync loop over the reference alone; returns (rows per step, emitted per request)."""
    rows, emitted = [], {}
    while reference.has_unfinished():
        plan = reference.plan_step()
        assert plan is not None
        batch = reference.commit_step(plan, k)
        reference.check_invariants()
        decode_k = batch.num_spec_tokens[: batch.num_decode_reqs]
        accepted = decode_k if accept_all else [0] * len(decode_k)
        result = reference.update(batch.step_index, accepted, None)
        reference.check_invariants()
        rows.append((batch.req_ids, batch.num_scheduled_tokens, batch.completes_prompt))
        for req_id, count in zip(result.req_ids, result.num_output_tokens, strict=True):
            emitted[req_id] = emitted.get(req_id, 0) + count
    return rows, emitted


def test_chunked_prefill_schedule_by_hand():
    # Same case as the real scheduler's test_chunked_prefill_with_tiny_budget.
    reference = ReferenceScheduler(
        create_scheduler(k_max=2, max_num_batched_tokens=4, max_model_len=64).config
    )
    for req_id, spec in enumerate(create_requests(2, prompt_len=[10, 3], output_len=[3, 2])):
        reference.add_request(req_id, spec)
    rows, emitted = _run_reference(reference, k=2)
    assert rows == [
        ([0], [4], [False]),  # chunk 1 of request 0; request 1 waits (no budget)
        ([0], [4], [False]),  # chunk 2
        ([0, 1], [2, 2], [True, False]),  # last chunk samples token 1; request 1 starts
        ([0, 1], [3, 1], [False, True]),  # decode 1 + 2 drafts; request 1 ends its prompt
        ([1], [3], [False]),  # request 0 done; request 1: 1 + 2 drafts
    ]
    assert emitted == {0: 3, 1: 2}
    assert len(reference.free_blocks) == reference.config.num_kv_blocks


def test_rejected_drafts_cost_steps_but_not_tokens():
    # All drafts rejected: one output token per decode step, K tokens wasted per step.
    reference = ReferenceScheduler(create_scheduler(k_max=3).config)
    reference.add_request(0, create_requests(1, prompt_len=5, output_len=4)[0])
    rows, emitted = _run_reference(reference, k=3, accept_all=False)
    assert emitted == {0: 4}
    assert [tokens for _, tokens, _ in rows] == [[5], [4], [4], [4]]


def test_invariant_check_sees_a_leaked_block():
    reference = ReferenceScheduler(
        create_scheduler(num_kv_blocks=8, block_size=4, max_model_len=32).config
    )
    reference.add_request(0, create_requests(1, prompt_len=6, output_len=2)[0])
    reference.commit_step(reference.plan_step(), 0)
    reference.check_invariants()
    reference.free_blocks.pop()  # a block that is neither free nor held
    with pytest.raises(AssertionError, match="block ids"):
        reference.check_invariants()


def _drive_both(scheduler: Scheduler, reference: ReferenceScheduler, k: int, rng):
    """Sync/async engine order on both schedulers with the same random outcomes."""
    is_async = scheduler.config.scheduling == "async"
    inflight = []  # (batch, reference batch)
    emitted: dict[int, int] = {}
    finish_order: list[int] = []
    reference_finish_order: list[int] = []
    for _ in range(10_000):
        if not (scheduler.has_unfinished() or inflight):
            break
        plan = scheduler.plan_step()
        reference_plan = reference.plan_step()
        assert (plan is None) == (reference_plan is None)
        if plan is not None:
            batch = scheduler.commit_step(plan, k)
            inflight.append((batch, reference.commit_step(reference_plan, k)))
        if inflight and (not is_async or plan is None or len(inflight) == 2):
            batch, _ = inflight.pop(0)
            num_spec = batch.num_spec_tokens[: batch.num_decode_reqs]
            accepted = rng.integers(0, num_spec + 1)  # [D]
            result = scheduler.update(batch, StepOutcome(0.01, accepted))
            reference_result = reference.update(batch.step_index, accepted.tolist(), None)
            assert result.num_output_tokens.tolist() == reference_result.num_output_tokens
            for req_id, count in zip(
                result.req_ids.tolist(), result.num_output_tokens.tolist(), strict=True
            ):
                emitted[req_id] = emitted.get(req_id, 0) + count
            finish_order.extend(result.finished_req_ids)
            reference_finish_order.extend(reference_result.finished_req_ids)
        scheduler.check_invariants()
        reference.check_invariants()
    else:
        raise AssertionError("did not finish")
    return emitted, finish_order, reference_finish_order


@given(
    seed=st.integers(0, 2**32 - 1),
    scheduling=st.sampled_from(["sync", "async"]),
    k=st.integers(0, 4),
    budget=st.integers(1, 48),
    num_requests=st.integers(1, 8),
)
def test_reference_and_scheduler_agree_on_outputs_and_finish_order(
    seed, scheduling, k, budget, num_requests
):
    rng = np.random.default_rng(seed)
    scheduler = create_scheduler(
        scheduling=scheduling,
        k_max=4,
        max_num_batched_tokens=budget,
        num_kv_blocks=int(rng.integers(8, 40)),
        block_size=4,
        max_model_len=32,
        max_num_seqs=int(rng.integers(1, 6)),
    )
    reference = ReferenceScheduler(scheduler.config)
    prompts = rng.integers(1, 31, num_requests).tolist()
    outputs = rng.integers(1, 40, num_requests).tolist()
    for req_id, spec in enumerate(create_requests(num_requests, prompts, outputs)):
        scheduler.add_request(req_id, spec)
        reference.add_request(req_id, spec)
    emitted, order, reference_order = _drive_both(scheduler, reference, k, rng)
    assert order == reference_order
    assert sorted(order) == list(range(num_requests))
    assert emitted == {
        i: min(o, 32 - p) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    }
    assert scheduler.num_preemptions == reference.num_preemptions
    assert (
        len(reference.free_blocks) == scheduler.kv.num_free_blocks == scheduler.config.num_kv_blocks
    )
