"""The simulator's speed paths agree with their plain definitions.

Each fast path in the per-step hot loop (bincount spec-decode counters, shift-based KV block
rounding, live-decode commit/update, radix-ordered ITLs, the goodput K tuple, the closed loop
run without SimPy) is checked against the plain computation it replaces; whole runs with the
fast paths forced off must give the same results bit for bit.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dsd.policies.goodput import GoodputPolicy, lookup_batch_k
from dsd.policies.profile_io import load_profile
from dsd.policies.types import StepFeedback, StepView, position_counts
from dsd.sim.build import build_fitted_executor
from dsd.sim.engine import Engine, LoopConfig, RunResult
from dsd.sim.kv import KVBlockPool
from dsd.sim.metrics import _stable_order, item_gaps
from dsd.sim.models.acceptance import _widen, count_leading, leading_successes
from dsd.sim.scheduler import Scheduler, SchedulerConfig, SpecDecodeStats, StepResult
from dsd.sim.types import StepOutcome
from dsd.traces.workload import RequestSpec, Workload

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILE_PATH = REPO_ROOT / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"


@given(
    k_max=st.integers(0, 6),
    rows=st.lists(st.tuples(st.integers(0, 8), st.floats(0, 1)), max_size=40),
)
def test_spec_stats_counters_equal_per_position_comparisons(k_max, rows):
    num_spec = np.array([k for k, _ in rows], dtype=np.int64)
    num_accepted = np.array([int(f * (k + 1)) if f < 1 else k for k, f in rows], dtype=np.int64)
    stats = SpecDecodeStats(k_max)
    stats.observe(num_spec, num_accepted)
    stats.observe(num_spec[::-1].copy(), num_accepted[::-1].copy())  # counters accumulate
    drafted, accepted = position_counts(num_spec, num_accepted, k_max)
    assert stats.num_drafts == 2 * int((num_spec > 0).sum())
    assert stats.num_draft_tokens == 2 * int(num_spec.sum())
    assert stats.num_accepted_tokens == 2 * int(num_accepted.sum())
    assert stats.drafted_at_pos.tolist() == (2 * drafted).tolist()
    assert stats.accepted_at_pos.tolist() == (2 * accepted).tolist()


@pytest.mark.parametrize(
    "block_size",
    [
        1,  # shift 0
        16,  # the usual power of two
        64,  # another power of two
        12,  # not a power of two: integer division
    ],
)
@given(tokens=st.lists(st.integers(-100, 10_000), min_size=1, max_size=50))
def test_blocks_for_is_ceil_division(block_size, tokens):
    pool = KVBlockPool(1000, block_size)
    num_tokens = np.array(tokens, dtype=np.int64)
    expected = [-(-n // block_size) for n in tokens]
    assert pool.blocks_for(num_tokens).tolist() == expected
    assert num_tokens.tolist() == tokens  # the input is not modified


@given(
    block_size=st.sampled_from([4, 16, 12]),
    held_tokens=st.lists(st.integers(0, 200), min_size=1, max_size=12),
    deltas=st.lists(st.integers(-60, 60), min_size=12, max_size=12),
    num_blocks=st.integers(1, 400),
)
def test_cover_many_and_shrink_equal_per_slot_updates(block_size, held_tokens, deltas, num_blocks):
    num_slots = len(held_tokens)
    start = [-(-n // block_size) for n in held_tokens]
    if sum(start) > num_blocks:
        num_blocks = sum(start)
    pool = KVBlockPool(num_blocks, block_size, capacity=num_slots)
    for slot, blocks in enumerate(start):
        assert pool.try_cover(slot, blocks * block_size)
    slots = np.arange(num_slots, dtype=np.int64)
    target = np.maximum(np.array(held_tokens) + np.array(deltas[:num_slots]), 0)
    # Reference: the all-or-nothing grow, then the shrink, slot by slot.
    need = [max(-(-int(n) // block_size) - b, 0) for n, b in zip(target, start, strict=True)]
    fits = sum(need) <= pool.num_free_blocks
    grown = [b + g for b, g in zip(start, need, strict=True)] if fits else start
    assert pool.try_cover_many(slots, target) == fits
    assert pool.num_held.tolist()[:num_slots] == grown
    pool.shrink_to(slots, target)
    shrunk = [min(b, -(-int(n) // block_size)) for b, n in zip(grown, target, strict=True)]
    assert pool.num_held.tolist()[:num_slots] == shrunk
    assert pool.num_free_blocks + sum(shrunk) == num_blocks


@pytest.mark.parametrize(
    "key_bound",
    [
        1,  # a single request
        5000,  # one 16-bit digit
        70_000,  # two digits
        1 << 40,  # past 32 bits: plain merge sort
    ],
)
def test_stable_order_equals_numpy_stable_argsort(key_bound):
    keys = np.random.default_rng(0).integers(0, key_bound, 20_000)
    assert np.array_equal(_stable_order(keys, key_bound), np.argsort(keys, kind="stable"))


def test_item_gaps_equal_gaps_of_each_requests_chunks_in_time_order():
    """Items (a request's run of consecutive chunk times: one chunk, or a stretch's W) give
    the gaps of the expanded chunks, per request in id order, time order within."""
    rng = np.random.default_rng(1)
    for _ in range(50):
        num_requests = int(rng.integers(1, 30))
        num_items = int(rng.integers(0, 60))
        item_req = rng.integers(0, num_requests, num_items).astype(np.int64)
        item_len = rng.integers(1, 5, num_items).astype(np.int64)  # 1: a step's chunk
        times = np.sort(rng.random(int(item_len.sum())))  # the items' times, back to back
        item_start = np.cumsum(item_len) - item_len
        chunk_req = np.repeat(item_req, item_len)  # chunks in time order
        expected = [gap for r in range(num_requests) for gap in np.diff(times[chunk_req == r])]
        gaps = item_gaps(item_req, item_start, item_len, times, num_requests)
        assert gaps.tolist() == expected


def test_goodput_choose_k_equals_the_table_lookup():
    profile = load_profile(PROFILE_PATH)
    policy = GoodputPolicy(profile, max_num_seqs=64)
    empty = np.zeros(0, dtype=np.int64)
    for batch_size in range(0, 65):
        for k_max in (0, 2, 5, 9):
            view = StepView(0, 0.0, batch_size, 0, empty, empty, k_max)
            assert policy.choose_k(view) == lookup_batch_k(policy.table.k_star, view, "goodput")


# ---------------------------------------------------------------- whole runs, fast paths off


class _CountingScheduler(Scheduler):
    """The real scheduler, counting the steps that took the live-decode update."""

    num_fast_updates = 0

    def _update_live(self, batch, step, accepted, drafted):  # type: ignore[no-untyped-def]
        self.num_fast_updates += 1
        return super()._update_live(batch, step, accepted, drafted)


class _GeneralPathScheduler(_CountingScheduler):
    """Counts a (fake) event before every commit, so commit_step and update never take their
    live-decode fast paths: every step goes through the general code."""

    def commit_step(self, plan, k):  # type: ignore[no-untyped-def]
        self._num_events += 1
        return super().commit_step(plan, k)


class _PerRowK:
    """K per decode row from its request id: mixed K in every step."""

    def choose_k(self, view: StepView):  # type: ignore[no-untyped-def]
        return (view.req_ids % 6).astype(np.int64)

    def observe(self, feedback: StepFeedback) -> None:
        pass


def _run(scheduler_class, config: SchedulerConfig, policy_name: str) -> tuple[RunResult, int]:
    profile = load_profile(PROFILE_PATH)
    rng = np.random.default_rng(7)
    requests = tuple(
        RequestSpec(prompt_len=int(p), output_len=int(o))
        for p, o in zip(rng.integers(5, 300, 120), rng.integers(1, 90, 120), strict=True)
    )
    workload = Workload("mixed", requests, max_concurrency=config.max_num_seqs)
    policy = (
        GoodputPolicy(profile, max_num_seqs=config.max_num_seqs)
        if policy_name == "goodput"
        else _PerRowK()
    )
    executor = build_fitted_executor(profile, np.random.SeedSequence(3), latency_kind="table")
    scheduler = scheduler_class(config, capacity=4)
    engine = Engine(
        scheduler,
        executor,
        policy,
        workload,
        LoopConfig(check_invariants=True, record_events=True),
    )
    return engine.run(), scheduler.num_fast_updates


@pytest.mark.parametrize(
    ("scheduling", "policy_name", "num_kv_blocks", "budget"),
    [
        ("sync", "goodput", 4096, 8192),  # roomy: almost every step is all-decode
        ("async", "goodput", 4096, 8192),  # async: placeholders, one-step K lag
        ("sync", "per-row", 4096, 8192),  # mixed K per row
        ("sync", "goodput", 300, 256),  # short pool and budget: preemption, trimmed drafts
        ("async", "per-row", 300, 256),  # the same, async with mixed K
    ],
)
def test_runs_with_fast_paths_off_give_identical_results(
    scheduling, policy_name, num_kv_blocks, budget
):
    config = _scheduler_config(scheduling, num_kv_blocks, budget)
    fast, num_fast = _run(_CountingScheduler, config, policy_name)
    general, num_fast_when_off = _run(_GeneralPathScheduler, config, policy_name)
    assert num_fast >= 10  # the fast path ran (the rest: steps with finishes or prefills)
    assert num_fast_when_off == 0
    _assert_identical(fast, general)
    assert fast.metrics["completed"] == 120


def _scheduler_config(scheduling: str, num_kv_blocks: int, budget: int) -> SchedulerConfig:
    return SchedulerConfig(
        max_model_len=1024,
        num_kv_blocks=num_kv_blocks,
        k_max=5,
        max_num_seqs=32,
        max_num_batched_tokens=budget,
        scheduling=scheduling,
    )


def _assert_identical(one: RunResult, other: RunResult) -> None:
    """Metrics (as JSON text: NaN rates of positions never drafted compare equal), tables,
    event logs and preemptions, to the last bit."""
    assert json.dumps(one.metrics, sort_keys=True) == json.dumps(other.metrics, sort_keys=True)
    assert one.requests.equals(other.requests)
    assert one.steps.equals(other.steps)
    assert one.events == other.events
    assert one.num_preemptions == other.num_preemptions


@pytest.mark.parametrize(
    ("scheduling", "policy_name", "num_kv_blocks", "budget"),
    [
        ("sync", "goodput", 4096, 8192),  # roomy
        ("async", "per-row", 300, 256),  # async, mixed K, preemption, trimmed drafts
    ],
)
def test_a_closed_loop_runs_the_same_with_and_without_simpy(
    scheduling, policy_name, num_kv_blocks, budget, monkeypatch
):
    """Every request arrives at 0: the loop runs without SimPy; forced through SimPy (the
    open-loop driver) the run is identical, times to the last bit."""
    config = _scheduler_config(scheduling, num_kv_blocks, budget)
    drivers: list[str] = []
    run_direct, run_simpy = Engine._run_without_simpy, Engine._run_with_simpy
    monkeypatch.setattr(
        Engine, "_run_without_simpy", lambda self: (drivers.append("direct"), run_direct(self))
    )
    direct, _ = _run(_CountingScheduler, config, policy_name)
    monkeypatch.setattr(
        Engine, "_run_without_simpy", lambda self: (drivers.append("simpy"), run_simpy(self))
    )
    simpy_run, _ = _run(_CountingScheduler, config, policy_name)
    assert drivers == ["direct", "simpy"]
    _assert_identical(direct, simpy_run)
    assert direct.metrics["completed"] == 120


@pytest.mark.parametrize(
    "fields",
    [
        {"policy": "static:0"},  # long stretches of plain decode
        # K = 0 at large B, > 0 as B drains; auto picks the parametric model on this profile
        {"policy": "goodput", "max_concurrency": 256},
        {"policy": "goodput", "max_concurrency": 256, "latency_model": "table"},
        {"policy": "static:0", "k_timing": "same-step"},  # plan reserves 1 + k_max per row
        {"policy": "static:0", "num_kv_blocks": 700},  # short pool: preemptions
        {"policy": "static:0", "max_model_len": 1400},  # rows near max_model_len
        {"policy": "static:0", "max_num_batched_tokens": 300},  # budget < B x (1 + K) at times
        {"policy": "static:0", "acceptance_model": "replay"},
        {"policy": "table:[[1,8,3],[9,256,0]]"},  # vLLM's range table
        {"policy": "static:0", "jitter_sigma": 0.1},  # noise: no stretch may be skipped
    ],
)
def test_stretches_of_plain_decode_run_at_once_with_identical_results(fields, monkeypatch):
    """A closed loop under sync scheduling runs stretches of plain decode steps at once
    (`Scheduler.plain_decode_steps_ahead`); with that off, step by step, the run is identical."""
    from dsd.sim.build import run_simulation
    from dsd.sim.config import RunConfig

    config = RunConfig(
        profile=str(PROFILE_PATH),
        dataset="mt-bench",
        num_prompts=300,
        max_concurrency=fields.pop("max_concurrency", 200),
        seed=5,
        **fields,
    )
    stretches: list[int] = []
    ahead = Scheduler.plain_decode_steps_ahead

    def counted(self):  # type: ignore[no-untyped-def]
        steps = ahead(self)
        stretches.append(steps)
        return steps

    monkeypatch.setattr(Scheduler, "plain_decode_steps_ahead", counted)
    at_once = run_simulation(config)
    monkeypatch.setattr(Scheduler, "plain_decode_steps_ahead", lambda self: 0)
    one_by_one = run_simulation(config)
    if "jitter_sigma" in fields:
        assert stretches == []  # the executor's noise rules it out
    else:
        assert sum(stretches) >= 100  # steps that ran at once
    _assert_identical(at_once, one_by_one)


@pytest.mark.parametrize("shared_rates", [True, False])  # one [k] row, or [n, k] per request
def test_sampled_accepted_counts_equal_leading_successes_of_the_same_uniforms(shared_rates):
    shape_rng = np.random.default_rng(6)
    for _ in range(300):
        num_rows = int(shape_rng.integers(0, 30))
        k_max = int(shape_rng.integers(1, 7))
        num_spec = shape_rng.integers(0, k_max + 1, num_rows)
        cond = shape_rng.random(k_max) if shared_rates else shape_rng.random((num_rows, k_max))
        width = int(num_spec.max()) if num_rows else 0
        uniforms = shape_rng.random((num_rows, width))
        got = leading_successes(uniforms, cond, num_spec)
        expected = count_leading(uniforms < _widen(cond, width), num_spec)
        assert got.dtype == np.int64
        assert got.tolist() == expected.tolist()


@settings(max_examples=300, deadline=None)
@given(
    block_size=st.sampled_from([1, 4, 12, 16]),
    k_max=st.integers(0, 4),
    k_timing=st.sampled_from(["next-step", "same-step"]),
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60)), min_size=1, max_size=32),
    budget=st.integers(2, 160),
    num_kv_blocks=st.integers(8, 200),
    max_model_len=st.integers(48, 140),
    warmup=st.integers(0, 40),
    last_k=st.integers(0, 4),
)
def test_plain_decode_steps_ahead_equal_the_same_steps_one_by_one(
    block_size, k_max, k_timing, lengths, budget, num_kv_blocks, max_model_len, warmup, last_k
):
    """`advance_plain_decode(W)` leaves the scheduler exactly as W steps of plan, commit at
    K = 0 and update with nothing accepted do, and each of those W steps is a plain decode
    step of every running row (no admission, finish, preemption or trimmed row)."""
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=max_model_len,
            num_kv_blocks=max(num_kv_blocks, -(-max_model_len // block_size)),
            block_size=block_size,
            k_max=k_max,
            max_num_seqs=32,
            max_num_batched_tokens=budget,
            k_timing=k_timing,
        ),
        capacity=4,
    )
    for req_id, (prompt, output) in enumerate(lengths):
        scheduler.add_request(req_id, RequestSpec(prompt_len=prompt, output_len=output))

    def step(target: Scheduler, k: int = 0) -> StepResult | None:
        plan = target.plan_step()
        if plan is None:
            return None
        batch = target.commit_step(plan, k)
        zeros = np.zeros(batch.num_decode_reqs, dtype=np.int64)
        return target.update(batch, StepOutcome(duration_s=1.0, num_accepted=zeros))

    for index in range(warmup):  # the last one chooses `last_k` (next-step: verified later)
        if step(scheduler, last_k if index == warmup - 1 else 0) is None:
            break
    ahead = scheduler.plain_decode_steps_ahead()
    event(f"steps ahead: {'0' if ahead == 0 else '1-9' if ahead < 10 else '10+'}")
    if ahead == 0:
        return
    twin = copy.deepcopy(scheduler)
    req_ids, first_step = scheduler.advance_plain_decode(ahead)
    assert first_step == twin._step_index
    preemptions = twin.num_preemptions
    for _ in range(ahead):
        result = step(twin)
        assert result is not None and not result.finished_req_ids
        assert result.req_ids.tolist() == req_ids.tolist()  # every running row, in order
        assert result.num_output_tokens.tolist() == [1] * req_ids.shape[0]
    assert twin.num_preemptions == preemptions
    for name in ("_num_computed", "_num_output", "_num_placeholders", "_in_prefill"):
        assert getattr(scheduler, name).tolist() == getattr(twin, name).tolist(), name
    assert scheduler.kv.num_held.tolist() == twin.kv.num_held.tolist()
    assert scheduler.kv.num_free_blocks == twin.kv.num_free_blocks
    assert scheduler._step_index == twin._step_index
    scheduler.check_invariants()
