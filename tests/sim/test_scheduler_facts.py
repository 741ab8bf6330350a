"""vLLM scheduler facts, table-driven: spec-decode stats, stops inside drafts, no drafts on
prefill chunks, rollback of rejected drafts, draft room at max_model_len, admission.

Cases already in test_scheduler.py (vLLM's single [1, 2, 3] / [1, 5] example, the K=0 no-waste
count, the max_tokens trim, the budget trim of drafts, preempt-the-last) are not repeated.
"""

from __future__ import annotations

import numpy as np
import pytest
from utils import create_requests, create_scheduler

from dsd.common.errors import InputError
from dsd.sim.scheduler import Scheduler, drafter_reservations
from dsd.sim.testing.fakes import ScriptedExecutor
from dsd.sim.types import ScheduledBatch, StepOutcome


def _prefill_all(scheduler: Scheduler, num_requests: int) -> None:
    """One step that prefills every request (roomy budget) and emits their first tokens."""
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    assert batch.num_decode_reqs == 0 and batch.batch_size == num_requests
    scheduler.update(batch, ScriptedExecutor().execute(batch))
    scheduler.check_invariants()


def _decode_step(scheduler: Scheduler, k: list[int]) -> ScheduledBatch:
    plan = scheduler.plan_step()
    batch = scheduler.commit_step(plan, np.array(k, dtype=np.int64))
    scheduler.check_invariants()
    return batch


# vLLM test_schedule_spec_decoding_stats, our way: per request the drafts proposed and the
# target's output; accepted = leading drafts the output repeats (the last output token is the
# bonus or recovered one).
@pytest.mark.parametrize(
    ("drafts", "outputs", "num_drafts", "num_draft_tokens", "num_accepted", "accepted_at_pos"),
    [
        ([[]], [[1]], 0, 0, 0, [0, 0, 0]),  # no drafts: no draft counted
        ([[1, 2, 3]], [[1, 2, 3, 4]], 1, 3, 3, [1, 1, 1]),  # all accepted + bonus
        ([[1, 2, 3]], [[5]], 1, 3, 0, [0, 0, 0]),  # first draft rejected
        ([[1, 2], [3]], [[1, 2, 5], [3, 4]], 2, 3, 3, [2, 1, 0]),  # two requests, all accepted
        ([[1], [2, 3]], [[1, 5], [2, 3, 4]], 2, 3, 3, [2, 1, 0]),  # mixed K, all accepted
        ([[1], [2, 3]], [[5], [6]], 2, 3, 0, [0, 0, 0]),  # both rejected at position 1
        ([[], [2, 3]], [[1], [2, 6]], 1, 2, 1, [1, 0, 0]),  # K=0 row is not a draft
    ],
)
def test_spec_decode_stats_like_vllm(
    drafts, outputs, num_drafts, num_draft_tokens, num_accepted, accepted_at_pos
):
    scheduler = create_scheduler(k_timing="same-step", k_max=3)
    num_requests = len(drafts)
    for req_id, spec in enumerate(create_requests(num_requests, prompt_len=4, output_len=20)):
        scheduler.add_request(req_id, spec)
    _prefill_all(scheduler, num_requests)
    batch = _decode_step(scheduler, [len(d) for d in drafts])
    accepted = []
    for draft, output in zip(drafts, outputs, strict=True):
        count = 0
        while count < len(draft) and output[count] == draft[count]:
            count += 1
        accepted.append(count)
    result = scheduler.update(batch, StepOutcome(0.01, np.array(accepted, dtype=np.int64)))
    stats = scheduler.spec_stats
    assert stats.num_drafts == num_drafts
    assert stats.num_draft_tokens == num_draft_tokens
    assert stats.num_accepted_tokens == num_accepted
    assert stats.accepted_at_pos.tolist() == accepted_at_pos
    assert stats.drafted_at_pos.tolist() == [sum(len(d) >= i for d in drafts) for i in range(1, 4)]
    # every decode row emits accepted + 1 output tokens (len(output))
    assert result.num_output_tokens.tolist() == [len(o) for o in outputs]


# A stop token (EOS) among the tokens a decode step emits: K=4, a accepted -> a+1 tokens; the
# step's first token is output index 1 (the prefill emitted index 0).
@pytest.mark.parametrize(
    ("accepted", "stop_index", "max_tokens", "emitted", "finished"),
    [
        (4, 2, 50, 3, True),  # stop on the 3rd token: drafts after it trimmed
        (4, 0, 50, 1, True),  # stop on the first token of the step: every draft trimmed
        (4, 4, 50, 5, True),  # stop on the bonus token: nothing to trim
        (1, 1, 50, 2, True),  # stop on the recovered token after a rejection
        (4, -1, 50, 5, False),  # no stop
        (4, 3, 3, 2, True),  # max_tokens (2 more) comes before the stop: trimmed at 2
        (4, 1, 3, 2, True),  # stop exactly at the max_tokens boundary
    ],
)
def test_stop_inside_drafts_trims_the_rest(accepted, stop_index, max_tokens, emitted, finished):
    scheduler = create_scheduler(k_timing="same-step", k_max=4)
    scheduler.add_request(0, create_requests(1, prompt_len=5, output_len=max_tokens)[0])
    _prefill_all(scheduler, 1)
    batch = _decode_step(scheduler, [4])
    stop = np.array([stop_index], dtype=np.int64)
    result = scheduler.update(batch, StepOutcome(0.01, np.array([accepted]), stop))
    scheduler.check_invariants()
    assert result.num_output_tokens.tolist() == [emitted]
    assert result.finished_req_ids == ((0,) if finished else ())
    if not finished:
        assert scheduler.num_output_tokens(0) == 1 + emitted


# Prefill chunks never carry drafts, whatever K the policy asks for; only decode rows do.
@pytest.mark.parametrize(
    ("prompt_lens", "budget", "scheduling"),
    [
        ([10], 4, "sync"),  # one prompt in three chunks
        ([3, 9], 6, "sync"),  # a decode row beside another request's chunks
        ([10, 2, 7], 5, "async"),  # async: K chosen during a prefill applies to decode only
        ([1, 1, 1], 2, "sync"),  # one-token prompts split over steps by a tiny budget
    ],
)
def test_prefill_chunks_get_no_drafts(prompt_lens, budget, scheduling):
    scheduler = create_scheduler(k_max=3, max_num_batched_tokens=budget, scheduling=scheduling)
    for req_id, spec in enumerate(create_requests(len(prompt_lens), prompt_lens, 6)):
        scheduler.add_request(req_id, spec)
    executor = ScriptedExecutor()
    saw_prefill = False
    while scheduler.has_unfinished() or scheduler.has_inflight():
        plan = scheduler.plan_step()
        if plan is not None:
            batch = scheduler.commit_step(plan, 3)
            prefill_k = batch.num_spec_tokens[batch.num_decode_reqs :]
            assert not prefill_k.any()
            saw_prefill |= batch.batch_size > batch.num_decode_reqs
            scheduler.update(batch, executor.execute(batch))
        scheduler.check_invariants()
    assert saw_prefill


# vLLM: num_computed_tokens grows by 1 + K at schedule time and shrinks by the rejected drafts
# when the outcome arrives, so the next step starts at prompt + outputs - 1; the blocks stay.
@pytest.mark.parametrize(
    ("k", "accepted", "next_computed"),
    [
        (3, 3, 4 + 1 + 4 - 1),  # all accepted: 1 + 3 more tokens
        (3, 1, 4 + 1 + 2 - 1),  # 2 rejected drafts rolled back
        (3, 0, 4 + 1 + 1 - 1),  # all rejected: only the recovered token remains
        (0, 0, 4 + 1 + 1 - 1),  # plain decoding
    ],
)
def test_rejected_drafts_are_rolled_back(k, accepted, next_computed):
    scheduler = create_scheduler(k_timing="same-step", k_max=3, block_size=2)
    scheduler.add_request(0, create_requests(1, prompt_len=4, output_len=30)[0])
    _prefill_all(scheduler, 1)
    batch = _decode_step(scheduler, [k])
    assert batch.num_computed_tokens.tolist() == [4]
    scheduler.update(batch, StepOutcome(0.01, np.array([accepted])))
    scheduler.check_invariants()
    # vLLM keeps the blocks of rejected drafts (the next tokens reuse them): still
    # ceil((4 + 1 + K) / 2) held, whatever was rejected
    assert scheduler.kv.num_total_blocks - scheduler.kv.num_free_blocks == -(-(4 + 1 + k) // 2)
    plan = scheduler.plan_step()
    assert plan.decode_context_lens.tolist() == [next_computed]


# vLLM caps a row's new tokens at max_model_len - 1 - num_computed: drafts near the end of the
# context shrink (before the row is ever dropped) and never reach position max_model_len.
@pytest.mark.parametrize(
    ("prompt_len", "max_model_len", "draft_room"),
    [
        (10, 32, 4),  # far from the end: k_max drafts
        (28, 32, 2),  # computed 28 -> positions 28..30: 2 drafts
        (29, 32, 1),  # one draft
        (30, 32, 0),  # no draft: the last position is the token itself
    ],
)
def test_draft_room_shrinks_at_max_model_len(prompt_len, max_model_len, draft_room):
    scheduler = create_scheduler(
        k_timing="same-step", k_max=4, max_model_len=max_model_len, num_kv_blocks=8
    )
    scheduler.add_request(0, create_requests(1, prompt_len=prompt_len, output_len=50)[0])
    _prefill_all(scheduler, 1)
    plan = scheduler.plan_step()
    assert plan.decode_draft_room.tolist() == [draft_room]
    batch = scheduler.commit_step(plan, 4)
    assert batch.num_spec_tokens.tolist() == [draft_room]
    assert int(batch.num_computed_tokens[0] + batch.num_scheduled_tokens[0]) <= max_model_len - 1


# Admission facts (vLLM): FCFS with a token budget; without chunked prefill a prompt that does
# not fit the budget left waits (and blocks the queue behind it).
@pytest.mark.parametrize(
    ("chunked", "prompt_lens", "budget", "first_step_rows", "first_step_tokens"),
    [
        (True, [6, 4], 8, [0, 1], [6, 2]),  # second prompt chunked into the budget left
        (False, [6, 4], 8, [0], [6]),  # no chunking: the second prompt waits for a step
        (False, [6, 4, 1], 8, [0], [6]),  # ... and blocks the one-token prompt behind it (FCFS)
        (True, [3, 3, 3], 8, [0, 1, 2], [3, 3, 2]),  # the last admitted request gets a chunk
    ],
)
def test_admission_under_the_token_budget(
    chunked, prompt_lens, budget, first_step_rows, first_step_tokens
):
    scheduler = create_scheduler(
        enable_chunked_prefill=chunked, max_num_batched_tokens=budget, max_model_len=8
    )
    for req_id, spec in enumerate(create_requests(len(prompt_lens), prompt_lens, 1)):
        scheduler.add_request(req_id, spec)
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    assert batch.req_ids.tolist() == first_step_rows
    assert batch.num_scheduled_tokens.tolist() == first_step_tokens


# A 3-token model in a 3-token budget without chunked prefill: prompts of up to 2 tokens.
_UNCHUNKED_TINY = {
    "max_model_len": 3,
    "num_kv_blocks": 3,
    "block_size": 1,
    "max_num_batched_tokens": 3,
    "enable_chunked_prefill": False,
}


# Configs under which some request could never be scheduled, or that vLLM refuses: one error.
@pytest.mark.parametrize(
    ("params", "message"),
    [
        # Found by the stateful machine: the cap made a 2-token prompt a 1-token chunk that
        # chunking forbids, so the request waited forever (plan_step returned None for good).
        (
            {**_UNCHUNKED_TINY, "k_max": 0, "long_prefill_token_threshold": 1},
            "long_prefill_token_threshold",
        ),
        # Found by the stateful machine: a prompt and its row's draft slots must fit one step
        # (PARD at K = 2 takes 2 of the 3-token budget: a 2-token prompt never fits).
        ({**_UNCHUNKED_TINY, "k_max": 2, "speculative_method": "pard"}, "2 draft slots"),
        # vLLM refuses max_num_batched_tokens <= num_lookahead_tokens: no row fits.
        ({"k_max": 4, "speculative_method": "eagle", "max_num_batched_tokens": 4}, "lookahead"),
        ({"speculative_method": "medusa"}, "speculative_method"),
    ],
)
def test_configs_no_request_could_run_under_are_input_errors(params, message):
    with pytest.raises(InputError, match=message):
        create_scheduler(**params)


# vLLM's async stop rule (v1/core/sched/scheduler.py, 0.33): with a step in flight, a request is
# skipped only when that step reaches max_tokens even if all its drafts are rejected
# (num_computed + 2 - placeholders >= prompt + max_tokens, i.e. confirmed outputs + 1 >=
# max_tokens). A step that only might reach it is scheduled; if the in-flight step did finish the
# request, the extra row emits nothing. One request, prompt 4, static K = 4.
@pytest.mark.parametrize(
    ("max_tokens", "accepted", "decode_rows", "empty_rows", "idle_plans"),
    [
        # idle plans: a plan with nothing to schedule while a step is in flight; only the last
        # step of the request waits (the old rule, outputs + 1 + K >= max_tokens, idled
        # whenever the in-flight step might end the request)
        (1, 0, 0, 0, 1),  # the prefill emits the only token: nothing after it is scheduled
        (6, 0, 5, 0, 1),  # every step emits 1: a row per remaining token
        (6, 4, 2, 1, 1),  # the first decode emits 5 (done); the row after it emits nothing
        (11, 4, 3, 1, 1),  # 1 + 5 + 5: the third decode row is scheduled and emits nothing
        (3, 1, 2, 1, 1),  # 1 + 2: the second decode row is scheduled and emits nothing
    ],
)
def test_async_skips_a_request_only_when_its_step_in_flight_surely_ends_it(
    max_tokens: int, accepted: int, decode_rows: int, empty_rows: int, idle_plans: int
) -> None:
    scheduler = create_scheduler(scheduling="async", k_max=4)
    scheduler.add_request(0, create_requests(1, prompt_len=4, output_len=max_tokens)[0])
    executor = ScriptedExecutor(accept_script={0: [accepted]})
    in_flight: tuple[ScheduledBatch, StepOutcome] | None = None
    rows, empty, idle = 0, 0, 0
    while scheduler.has_unfinished() or in_flight is not None:
        plan = scheduler.plan_step()
        batch = None if plan is None else scheduler.commit_step(plan, 4)
        if plan is None and in_flight is not None:
            idle += 1
        if in_flight is not None:
            result = scheduler.update(*in_flight)
            if in_flight[0].num_decode_reqs:
                rows += 1
                empty += int(result.num_output_tokens.sum() == 0)
            in_flight = None
        scheduler.check_invariants()
        if batch is not None:
            in_flight = (batch, executor.execute(batch))
    assert (rows, empty, idle) == (decode_rows, empty_rows, idle_plans)


# Token budget per decode row: under next-step K timing (vLLM, sync and async) the row's K was
# fixed at its previous step, so it budgets exactly 1 + K, as vLLM budgets the drafts it already
# holds, and a prefill chunk beside it gets the rest; same-step timing asks K after the plan, so
# it reserves 1 + k_max (released at commit).
@pytest.mark.parametrize(
    ("scheduling", "k_timing", "k", "decode_tokens", "chunk_tokens"),
    [
        ("sync", "same-step", 1, 2, 3),  # 8 - (1 + k_max = 5) = 3 for the chunk; verifies 1
        ("sync", "next-step", 1, 2, 6),  # 8 - (1 + K = 2) = 6 for the chunk
        ("async", "next-step", 1, 2, 6),
        ("async", "next-step", 4, 5, 3),  # K = k_max: the same as same-step
    ],
)
def test_decode_rows_budget_the_k_they_verify(
    scheduling: str, k_timing: str, k: int, decode_tokens: int, chunk_tokens: int
) -> None:
    scheduler = create_scheduler(
        scheduling=scheduling, k_timing=k_timing, k_max=4, max_num_batched_tokens=8
    )
    scheduler.add_request(0, create_requests(1, prompt_len=4, output_len=50)[0])
    first = scheduler.commit_step(scheduler.plan_step(), k)  # request 0's prefill
    in_flight = (first, ScriptedExecutor().execute(first))
    if scheduling == "sync":
        scheduler.update(*in_flight)
    else:  # one decode step planned behind the prefill, so that K is fixed from here on
        second = scheduler.commit_step(scheduler.plan_step(), k)
        scheduler.update(*in_flight)
        in_flight = (second, ScriptedExecutor().execute(second))
        scheduler.update(*in_flight)
    scheduler.add_request(1, create_requests(1, prompt_len=20, output_len=5)[0])
    batch = scheduler.commit_step(scheduler.plan_step(), k)
    scheduler.check_invariants()
    assert batch.num_scheduled_tokens.tolist() == [decode_tokens, chunk_tokens]


# long_prefill_token_threshold caps a prefill chunk only when another request is running or
# waiting: alone, a long prompt has nobody to starve and takes the whole budget (vLLM 0.33).
@pytest.mark.parametrize(
    ("prompt_lens", "first_chunks"),
    [
        ([100], [64]),  # alone: the budget (64), not the cap (16)
        ([100, 10], [16, 10]),  # two requests: the long one is capped
        ([10, 100], [10, 16]),
    ],
)
def test_long_prefill_cap_is_lifted_for_a_lone_request(
    prompt_lens: list[int], first_chunks: list[int]
) -> None:
    scheduler = create_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=16)
    for req_id, spec in enumerate(create_requests(len(prompt_lens), prompt_lens, 4)):
        scheduler.add_request(req_id, spec)
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    scheduler.check_invariants()
    assert batch.num_scheduled_tokens.tolist() == first_chunks


# vLLM 0.33 caps every running row's new tokens at long_prefill_token_threshold, a decode row's
# drafts included (the differential test found this; lifted for a lone request as above).
@pytest.mark.parametrize(
    ("threshold", "decode_tokens"),
    [
        (0, [4, 4]),  # no cap: 1 + K = 4 each
        (2, [2, 2]),  # capped: 1 + 1 draft
        (4, [4, 4]),  # the cap does not bind
    ],
)
def test_long_prefill_threshold_caps_decode_rows_too(
    threshold: int, decode_tokens: list[int]
) -> None:
    scheduler = create_scheduler(
        k_max=3, max_model_len=32, num_kv_blocks=8, block_size=8,
        long_prefill_token_threshold=threshold,
    )  # fmt: skip
    add = create_requests(2, prompt_len=2, output_len=3)
    for req_id, spec in enumerate(add):
        scheduler.add_request(req_id, spec)
    first = scheduler.commit_step(scheduler.plan_step(), 3)  # prefills; K = 3 from here on
    scheduler.update(first, ScriptedExecutor().execute(first))
    batch = scheduler.commit_step(scheduler.plan_step(), 3)
    scheduler.check_invariants()
    assert batch.num_scheduled_tokens.tolist() == decode_tokens


# vLLM 0.33 admits a waiting request only if the pool can hold its whole (re)prompt
# (scheduler_reserve_full_isl, on by default), not just its first chunk.
@pytest.mark.parametrize(
    ("num_kv_blocks", "first_step"),
    [
        (4, [16]),  # 2 blocks left after request 0: request 1's 24 tokens need 3, not admitted
        (5, [16, 8]),  # 3 left: admitted, its first chunk 8 tokens of the 24-token budget
    ],
)
def test_admission_needs_room_for_the_whole_prompt(
    num_kv_blocks: int, first_step: list[int]
) -> None:
    scheduler = create_scheduler(
        max_model_len=32, num_kv_blocks=num_kv_blocks, block_size=8, k_max=0,
        max_num_batched_tokens=24,
    )  # fmt: skip
    scheduler.add_request(0, create_requests(1, prompt_len=16, output_len=4)[0])
    scheduler.add_request(1, create_requests(1, prompt_len=24, output_len=1)[0])
    batch = scheduler.commit_step(scheduler.plan_step(), 0)
    scheduler.check_invariants()
    assert batch.num_scheduled_tokens.tolist() == first_step


# vLLM 0.33's reservations per drafting method (SpeculativeConfig.max_num_new_slots_for_drafting,
# VllmConfig.num_lookahead_tokens): (KV lookahead slots, extra budget slots) per scheduled row.
@pytest.mark.parametrize(
    ("method", "k_max", "lookahead", "draft_slots"),
    [
        ("ngram", 3, 0, 0),  # drafts from the tokens: writes no KV
        ("eagle", 3, 3, 0),
        ("eagle3", 3, 3, 0),
        ("mtp", 3, 3, 0),
        ("draft_model", 3, 3, 1),  # its input keeps one unsliced token
        ("pard", 3, 3, 3),  # parallel draft model: K masked query rows
        ("p-eagle", 3, 3, 2),  # parallel EAGLE: K - 1
        ("draft_model", 0, 0, 0),  # K = 0: no speculative config at all
    ],
)
def test_drafter_reservations_like_vllm(method, k_max, lookahead, draft_slots):
    assert drafter_reservations(method, k_max) == (lookahead, draft_slots)
    config = create_scheduler(k_max=k_max, speculative_method=method).config
    assert (config.num_lookahead_tokens, config.num_draft_slots) == (lookahead, draft_slots)


# KV lookahead: vLLM allocates num_lookahead_tokens slots past every scheduled row, admissions
# included, so a drafter with weights fills a pool sooner. Two prompts of 8 tokens, blocks of
# 4, a pool of 5 blocks: ngram covers 8 tokens (2 blocks) each; EAGLE at K = 3 covers 8 + 3 = 11
# (3 blocks), so the second prompt no longer fits beside the first.
@pytest.mark.parametrize(
    ("method", "first_step_rows", "blocks_held"),
    [("ngram", [0, 1], 4), ("eagle", [0], 3), ("draft_model", [0], 3)],
)
def test_lookahead_slots_are_allocated_with_every_row(method, first_step_rows, blocks_held):
    scheduler = create_scheduler(
        k_max=3, speculative_method=method, max_model_len=16, num_kv_blocks=5, block_size=4
    )
    for req_id, spec in enumerate(create_requests(2, prompt_len=8, output_len=4)):
        scheduler.add_request(req_id, spec)
    batch = scheduler.commit_step(scheduler.plan_step(), 3)
    scheduler.check_invariants()
    assert batch.req_ids.tolist() == first_step_rows
    assert scheduler.kv.num_total_blocks - scheduler.kv.num_free_blocks == blocks_held


# Draft slots: each scheduled row also takes max_num_new_slots_for_drafting of the token budget
# (vLLM's input budget). Three 4-token prompts, budget 10, K = 2.
@pytest.mark.parametrize(
    ("method", "first_step_tokens"),
    [
        ("ngram", [4, 4, 2]),  # 4 + 4 + 2 = 10
        ("eagle", [4, 4, 2]),  # lookahead only: the budget is the same
        ("draft_model", [4, 4]),  # (4 + 1) + (4 + 1) = 10: nothing left for a third
        ("pard", [4, 2]),  # (4 + 2) + (2 + 2) = 10
        ("p-eagle", [4, 4]),  # (4 + 1) + (4 + 1)
    ],
)
def test_draft_slots_take_budget_per_scheduled_row(method, first_step_tokens):
    scheduler = create_scheduler(
        k_max=2, speculative_method=method, max_num_batched_tokens=10, max_model_len=64
    )
    for req_id, spec in enumerate(create_requests(3, prompt_len=4, output_len=4)):
        scheduler.add_request(req_id, spec)
    batch = scheduler.commit_step(scheduler.plan_step(), 2)
    assert batch.num_scheduled_tokens.tolist() == first_step_tokens
