"""Scheduler semantics: budget, chunked prefill, drafts, stops, KV, preemption, async lag."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from utils import create_requests, create_scheduler, drive

from dsd.common.errors import InputError
from dsd.sim.scheduler import SchedulerConfig, SpecDecodeStats
from dsd.sim.testing.fakes import RandomAcceptanceExecutor, ScriptedExecutor, ScriptedK, StaticK
from dsd.sim.types import StepOutcome
from dsd.traces.workload import RequestSpec


def add_all(scheduler, requests):
    for req_id, spec in enumerate(requests):
        scheduler.add_request(req_id, spec)


def test_spec_stats_vllm_example():
    # vLLM's test: drafts [1, 2, 3], output [1, 5] -> K=3, accepted 1.
    stats = SpecDecodeStats(k_max=3)
    stats.observe(np.array([3]), np.array([1]))
    assert stats.num_drafts == 1
    assert stats.num_draft_tokens == 3
    assert stats.num_accepted_tokens == 1
    assert stats.accepted_at_pos.tolist() == [1, 0, 0]
    assert stats.drafted_at_pos.tolist() == [1, 1, 1]
    assert stats.acceptance_length == 2.0


def test_spec_stats_through_scheduler_count_drafted_per_position():
    scheduler = create_scheduler(k_max=3)
    add_all(scheduler, create_requests(1, prompt_len=4, output_len=20))
    # K per step: prefill (K ignored), then 3, 1, 0, 2 ...; accept 1 of each when possible.
    executor = ScriptedExecutor(accept_script={0: [1]})
    drive(scheduler, executor, ScriptedK([0, 3, 1, 0, 2, 0]))
    stats = scheduler.spec_stats
    # decode steps: K=3 (a=1), K=1 (a=1), K=0, K=2 (a=1), then K=0 until done
    assert stats.num_drafts == 3
    assert stats.num_draft_tokens == 6
    assert stats.num_accepted_tokens == 3
    assert stats.drafted_at_pos.tolist() == [3, 2, 1]
    assert stats.accepted_at_pos.tolist() == [3, 0, 0]


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_no_drafts_schedules_prompt_plus_max_tokens_minus_one(scheduling):
    # With K=0 no step is wasted, in either mode: every scheduled token is needed.
    scheduler = create_scheduler(scheduling=scheduling, k_max=4)
    requests = create_requests(5, prompt_len=[3, 17, 40, 1, 9], output_len=[1, 2, 30, 7, 64])
    add_all(scheduler, requests)
    log = drive(scheduler, ScriptedExecutor(), StaticK(0))
    total = sum(b.total_num_scheduled_tokens for b in log.batches)
    assert total == sum(r.prompt_len + r.output_len - 1 for r in requests)
    assert log.emitted == {i: r.output_len for i, r in enumerate(requests)}


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_max_tokens_never_overshot_with_drafts(scheduling):
    scheduler = create_scheduler(scheduling=scheduling, k_max=4)
    requests = create_requests(3, prompt_len=5, output_len=[1, 5, 11])
    add_all(scheduler, requests)
    log = drive(scheduler, ScriptedExecutor(), StaticK(4))
    assert log.emitted == {0: 1, 1: 5, 2: 11}
    # request 1: prefill emits 1, then one decode step of 1 + 4 accepted = 5 -> trimmed to 4;
    # async (vLLM's rule) also scheduled the step after it, which might have been needed had the
    # drafts been rejected, and emits nothing
    per_step = [
        int(r.num_output_tokens[list(r.req_ids).index(1)]) for r in log.results if 1 in r.req_ids
    ]
    assert per_step == ([1, 4] if scheduling == "sync" else [1, 4, 0])


def test_stop_inside_accepted_drafts_trims_the_rest():
    scheduler = create_scheduler(k_max=4)
    add_all(scheduler, create_requests(1, prompt_len=5, output_len=50))
    # EOS is output token index 3: prefill emits token 0, decode step would emit 1..5
    log = drive(scheduler, ScriptedExecutor(eos_at={0: 3}), StaticK(4))
    assert log.emitted == {0: 4}
    assert log.finished == [0]


def test_max_model_len_caps_output_tokens():
    scheduler = create_scheduler(max_model_len=20, num_kv_blocks=4, block_size=8, k_max=4)
    add_all(scheduler, create_requests(1, prompt_len=15, output_len=100))
    log = drive(scheduler, ScriptedExecutor(), StaticK(4))
    assert log.emitted == {0: 5}
    # positions stay below max_model_len: at most 19 tokens ever in the KV cache
    for batch in log.batches:
        assert int((batch.num_computed_tokens + batch.num_scheduled_tokens).max()) <= 19


@pytest.mark.parametrize(
    ("budget", "expected_tokens"),
    [
        (10, [5, 5]),  # room for both rows with all 4 drafts
        (7, [5, 2]),  # second row keeps 1 draft
        (6, [5, 1]),  # second row loses all drafts but still decodes
        (5, [5]),  # no budget left: second row dropped this step
        (3, [3]),  # first row's drafts trimmed to 2; second dropped
    ],
)
def test_drafts_trimmed_before_a_decode_row_is_dropped(budget, expected_tokens):
    scheduler = create_scheduler(k_max=4, max_num_batched_tokens=budget, max_model_len=64)
    add_all(scheduler, create_requests(2, prompt_len=1, output_len=50))
    executor, policy = ScriptedExecutor(), StaticK(4)
    # prefill both (1 token each), then look at the first decode step
    batch = scheduler.commit_step(scheduler.plan_step(), 4)
    scheduler.update(batch, executor.execute(batch))
    scheduler.check_invariants()
    plan = scheduler.plan_step()
    batch = scheduler.commit_step(plan, policy.choose_k(plan.view(0.0, scheduler.config)))
    scheduler.check_invariants()
    assert batch.num_scheduled_tokens.tolist() == expected_tokens
    assert batch.num_spec_tokens.tolist() == [t - 1 for t in expected_tokens]


def test_chunked_prefill_with_tiny_budget():
    scheduler = create_scheduler(k_max=2, max_num_batched_tokens=4, max_model_len=64)
    add_all(scheduler, create_requests(2, prompt_len=[10, 3], output_len=[3, 2]))
    log = drive(scheduler, ScriptedExecutor(), StaticK(2))
    rows = [
        (b.req_ids.tolist(), b.num_scheduled_tokens.tolist(), b.completes_prompt.tolist())
        for b in log.batches
    ]
    assert rows == [
        ([0], [4], [False]),  # chunk 1 of request 0; request 1 waits (no budget)
        ([0], [4], [False]),  # chunk 2
        ([0, 1], [2, 2], [True, False]),  # last chunk samples token 1; request 1 starts
        ([0, 1], [3, 1], [False, True]),  # decode 1 + 2 drafts; request 1 finishes its prompt
        ([1], [3], [False]),  # request 0 done (1 + 2 tokens); request 1: 1 + 2 drafts
    ]
    assert log.emitted == {0: 3, 1: 2}
    # prefill rows never carry drafts
    for batch in log.batches:
        assert not batch.num_spec_tokens[batch.num_decode_reqs :].any()


def test_long_prefill_token_threshold_caps_chunks():
    scheduler = create_scheduler(long_prefill_token_threshold=6)
    add_all(scheduler, create_requests(2, prompt_len=15, output_len=1))
    log = drive(scheduler, ScriptedExecutor(), StaticK(0))
    # two requests, so the cap holds (alone, a request takes the budget: test_scheduler_facts)
    assert [b.num_scheduled_tokens.tolist() for b in log.batches] == [[6, 6], [6, 6], [3, 3]]


def test_max_num_seqs_caps_the_running_set():
    scheduler = create_scheduler(max_num_seqs=2)
    add_all(scheduler, create_requests(5, prompt_len=4, output_len=3))
    log = drive(scheduler, ScriptedExecutor(), StaticK(1))
    assert max(b.batch_size for b in log.batches) == 2
    assert log.finished == [0, 1, 2, 3, 4]  # FCFS


def test_preemption_under_tiny_kv_pool_still_completes():
    # 12 blocks of 4 tokens; 4 requests that each grow to 8 + 16 = 24 tokens (6 blocks).
    scheduler = create_scheduler(num_kv_blocks=12, block_size=4, max_model_len=48, k_max=2)
    requests = create_requests(4, prompt_len=8, output_len=16)
    add_all(scheduler, requests)
    log = drive(scheduler, ScriptedExecutor(), StaticK(2))
    assert scheduler.num_preemptions > 0
    assert log.emitted == {i: 16 for i in range(4)}
    preempting = [b for b in log.batches if b.preempted_req_ids]
    assert preempting
    # a preempted request is recomputed from scratch later: prompt + the outputs it had
    victim = preempting[0].preempted_req_ids[0]
    assert victim not in preempting[0].req_ids.tolist()
    resumed = next(
        b for b in log.batches[log.batches.index(preempting[0]) + 1 :] if victim in b.new_req_ids
    )
    row = resumed.req_ids.tolist().index(victim)
    assert resumed.num_computed_tokens[row] == 0
    assert resumed.num_output_tokens[row] > 0
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_total_blocks


def test_preemption_takes_the_last_running_request():
    scheduler = create_scheduler(num_kv_blocks=6, block_size=4, max_model_len=24, k_max=0)
    add_all(scheduler, create_requests(3, prompt_len=8, output_len=12))
    executor, policy = ScriptedExecutor(), StaticK(0)
    preempted = []
    while scheduler.has_unfinished():
        plan = scheduler.plan_step()
        batch = scheduler.commit_step(plan, policy.choose_k(plan.view(0.0, scheduler.config)))
        scheduler.check_invariants()
        if batch.preempted_req_ids:
            preempted.append((batch.preempted_req_ids, scheduler._waiting[0]))
            # the victim leaves the batch and heads the waiting queue
            assert scheduler._req_id[scheduler._waiting[0]] == batch.preempted_req_ids[-1]
        scheduler.update(batch, executor.execute(batch))
        scheduler.check_invariants()
    assert preempted[0][0] == (2,)  # admitted last, preempted first


def test_abort_frees_blocks_and_reports_finished():
    scheduler = create_scheduler()
    add_all(scheduler, create_requests(2, prompt_len=40, output_len=10))
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    scheduler.update(batch, ScriptedExecutor().execute(batch))
    scheduler.abort(0)
    scheduler.check_invariants()
    plan = scheduler.plan_step()
    assert plan.finished_req_ids == (0,)
    assert plan.decode_req_ids.tolist() == [1]
    with pytest.raises(KeyError):
        scheduler.abort(0)


def test_async_k_chosen_at_step_t_is_verified_at_step_t_plus_1():
    scheduler = create_scheduler(scheduling="async", k_max=4)
    add_all(scheduler, create_requests(1, prompt_len=4, output_len=40))
    policy = ScriptedK([1, 3, 0, 2, 4, 1, 2])
    log = drive(scheduler, ScriptedExecutor(accept_script={0: [0]}), policy)
    chosen = [v for v in policy.schedule]
    used = [int(b.num_spec_tokens[0]) for b in log.batches]
    # step 0 is the prefill; step t >= 1 verifies the K chosen at step t-1
    assert used[:7] == [0, *chosen[:6]]


# vLLM 0.33 sync: the drafter runs at the end of step t with that step's K and step t + 1
# verifies its drafts, so a request's first decode verifies the K of its prefill step; the
# same-step option verifies each step's own K.
@pytest.mark.parametrize(
    ("k_timing", "verified"),
    [
        ("next-step", [1, 3, 0, 2, 4, 1]),  # the K chosen one step earlier (1 at the prefill)
        ("same-step", [3, 0, 2, 4, 1, 2]),  # this step's K
    ],
)
def test_sync_k_timing(k_timing, verified):
    scheduler = create_scheduler(k_max=4, k_timing=k_timing)
    add_all(scheduler, create_requests(1, prompt_len=4, output_len=40))
    policy = ScriptedK([1, 3, 0, 2, 4, 1, 2])
    log = drive(scheduler, ScriptedExecutor(accept_script={0: [0]}), policy)
    assert [int(b.num_spec_tokens[0]) for b in log.batches][1:7] == verified


def test_same_step_k_timing_needs_sync_scheduling():
    with pytest.raises(InputError, match="same-step needs sync"):
        create_scheduler(scheduling="async", k_timing="same-step")
    with pytest.raises(InputError, match="k_timing must be"):
        create_scheduler(k_timing="lagged")


def test_per_row_k_array_is_clamped_and_checked():
    scheduler = create_scheduler(k_max=3, k_timing="same-step")
    add_all(scheduler, create_requests(2, prompt_len=4, output_len=20))
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    scheduler.update(batch, ScriptedExecutor().execute(batch))
    plan = scheduler.plan_step()
    with pytest.raises(ValueError, match="shape"):
        scheduler.commit_step(plan, np.array([1, 2, 3]))
    batch = scheduler.commit_step(plan, np.array([7, -2]))
    assert batch.num_spec_tokens.tolist() == [3, 0]


def test_outcome_with_accepted_beyond_k_is_rejected():
    scheduler = create_scheduler(k_max=2)
    add_all(scheduler, create_requests(1, prompt_len=4, output_len=20))
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    scheduler.update(batch, ScriptedExecutor().execute(batch))
    batch = scheduler.commit_step(scheduler.plan_step(), 1)
    with pytest.raises(ValueError, match="accepted outside"):
        scheduler.update(batch, StepOutcome(0.01, np.array([2])))


@pytest.mark.parametrize(
    "fields",
    [
        {"max_model_len": 1},  # no room for one output token
        {"k_max": -1},  # negative K
        {"max_num_seqs": 0},  # no request could ever run
        {"num_kv_blocks": 1},  # pool smaller than one max_model_len request
        {"scheduling": "later"},  # unknown mode
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 100},  # prompt can't fit
    ],
)
def test_bad_config_raises_input_error(fields):
    params = {"max_model_len": 256, "num_kv_blocks": 64, **fields}
    with pytest.raises(InputError, match="scheduler:"):
        SchedulerConfig(**params)


def test_prompt_that_fills_max_model_len_is_input_error():
    scheduler = create_scheduler(max_model_len=32, num_kv_blocks=2)
    with pytest.raises(InputError, match="request 7"):
        scheduler.add_request(7, RequestSpec(prompt_len=32, output_len=1))


def test_add_requests_is_all_or_none():
    scheduler = create_scheduler(max_model_len=32, num_kv_blocks=8)
    fine, too_long = RequestSpec(prompt_len=4, output_len=2), RequestSpec(32, 1)
    with pytest.raises(InputError, match="request 1: prompt_len 32"):
        scheduler.add_requests([0, 1, 2], [fine, too_long, fine])
    with pytest.raises(ValueError, match="repeat"):
        scheduler.add_requests([0, 0], [fine, fine])
    with pytest.raises(ValueError, match="2 request ids for 1 specs"):
        scheduler.add_requests([0, 1], [fine])
    assert scheduler.num_waiting == 0
    scheduler.add_requests([0, 1], [fine, fine])
    with pytest.raises(ValueError, match="request 1 is already"):
        scheduler.add_requests([2, 1], [fine, fine])
    assert scheduler.num_waiting == 2
    scheduler.check_invariants()


def test_async_admission_lets_a_preempted_request_with_a_step_in_flight_pass():
    """Async with two steps in flight: a request preempted while one of its steps is in flight
    waits at the head of the queue (its recompute length is unknown) while the requests behind
    it are admitted FCFS; the queue keeps its order otherwise."""
    for seed in range(200):
        rng = np.random.default_rng(seed)
        scheduler = create_scheduler(
            scheduling="async",
            k_max=2,
            num_kv_blocks=int(rng.integers(8, 14)),
            block_size=4,
            max_model_len=32,
            max_num_batched_tokens=int(rng.integers(8, 40)),
            max_num_seqs=4,
        )
        for req_id in range(8):
            prompt_len = int(rng.integers(1, 12))
            output_len = int(rng.integers(2, 33 - prompt_len))
            scheduler.add_request(req_id, RequestSpec(prompt_len, output_len))
        in_flight = []
        for _ in range(60):
            # white box: the waiting queue's request ids in order, and who has outputs pending
            waiting = [int(scheduler._req_id[slot]) for slot in scheduler._waiting]
            pending = [scheduler._num_placeholders[slot] > 0 for slot in scheduler._waiting]
            if any(pending) and len(waiting) >= 3 and len(in_flight) < 2:
                plan = scheduler.plan_step()
                admitted = set(plan.new_req_ids) if plan is not None else set()
                assert not admitted & {r for r, p in zip(waiting, pending, strict=True) if p}
                after = [int(scheduler._req_id[slot]) for slot in scheduler._waiting]
                assert after == [r for r in waiting if r not in admitted]
                scheduler.check_invariants()
                return
            if len(in_flight) == 2 or (in_flight and rng.random() < 0.3):
                batch = in_flight.pop(0)
                num_decode = batch.num_decode_reqs
                accepted = np.minimum(
                    rng.integers(0, 3, num_decode), batch.num_spec_tokens[:num_decode]
                )
                scheduler.update(batch, StepOutcome(duration_s=0.01, num_accepted=accepted))
                continue
            plan = scheduler.plan_step()
            if plan is None:
                if not in_flight:
                    break
                continue
            in_flight.append(scheduler.commit_step(plan, 2))
    raise AssertionError("no seed led to a preempted request with a step in flight")


@given(
    seed=st.integers(0, 2**32 - 1),
    scheduling=st.sampled_from(["sync", "async"]),
    num_kv_blocks=st.integers(8, 40),
    max_num_seqs=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 12), max_size=4),
)
def test_requests_added_in_batches_schedule_as_added_one_by_one(
    seed, scheduling, num_kv_blocks, max_num_seqs, cuts
):
    """Adding requests in batches changes nothing: the same batches, outputs and finish order
    as one request per call (with preemptions where the pool is small)."""

    def run(batched: bool) -> tuple[list[tuple[int, ...]], dict[int, int], list[int]]:
        rng = np.random.default_rng(seed)
        scheduler = create_scheduler(
            scheduling=scheduling,
            k_max=4,
            max_num_batched_tokens=24,
            num_kv_blocks=num_kv_blocks,
            block_size=4,
            max_model_len=32,
            max_num_seqs=max_num_seqs,
        )
        prompts = rng.integers(1, 20, 12).tolist()
        outputs = [int(rng.integers(1, 33 - p)) for p in prompts]
        requests = create_requests(12, prompts, outputs)
        if batched:
            bounds = [0, *sorted(cuts), 12]
            for start, stop in itertools.pairwise(bounds):
                scheduler.add_requests(list(range(start, stop)), requests[start:stop])
        else:
            add_all(scheduler, requests)
        executor = RandomAcceptanceExecutor(0.01, [0.8, 0.6, 0.4, 0.2], rng)
        log = drive(scheduler, executor, StaticK(3))
        return [tuple(batch.req_ids.tolist()) for batch in log.batches], log.emitted, log.finished

    assert run(batched=True) == run(batched=False)


@given(
    seed=st.integers(0, 2**32 - 1),
    scheduling=st.sampled_from(["sync", "async"]),
    k=st.integers(0, 4),
    budget=st.integers(1, 64),
    num_kv_blocks=st.integers(8, 40),
    num_requests=st.integers(1, 8),
)
def test_random_workloads_complete_with_exact_outputs(
    seed, scheduling, k, budget, num_kv_blocks, num_requests
):
    rng = np.random.default_rng(seed)
    scheduler = create_scheduler(
        scheduling=scheduling,
        k_max=4,
        max_num_batched_tokens=budget,
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        max_model_len=32,
        max_num_seqs=int(rng.integers(1, 6)),
    )
    prompts = rng.integers(1, 20, num_requests).tolist()
    outputs = [int(rng.integers(1, 33 - p)) for p in prompts]
    add_all(scheduler, create_requests(num_requests, prompts, outputs))
    executor = RandomAcceptanceExecutor(0.01, [0.8, 0.6, 0.4, 0.2], rng)
    log = drive(scheduler, executor, StaticK(k))
    assert log.emitted == dict(enumerate(outputs))
    assert sorted(log.finished) == list(range(num_requests))
    assert scheduler.kv.num_free_blocks == num_kv_blocks


def test_same_seed_gives_identical_schedules():
    def run(seed):
        rng = np.random.default_rng(seed)
        scheduler = create_scheduler(
            scheduling="async", num_kv_blocks=30, block_size=4, max_model_len=64
        )
        add_all(scheduler, create_requests(12, prompt_len=9, output_len=20))
        log = drive(scheduler, RandomAcceptanceExecutor(0.01, [0.7, 0.5], rng), StaticK(2))
        return [(b.req_ids.tolist(), b.num_scheduled_tokens.tolist()) for b in log.batches]

    assert run(3) == run(3)
    assert run(3) != run(4)
