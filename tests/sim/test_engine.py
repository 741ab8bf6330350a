"""Engine loop: exact timelines, client behaviour, sync/async order, clock modes, determinism."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from utils import create_scheduler

from dsd.sim.engine import Engine, EngineEvent, LoopConfig, run_interleaved
from dsd.sim.testing.fakes import RandomAcceptanceExecutor, ScriptedExecutor, ScriptedK, StaticK
from dsd.traces.workload import RequestSpec, Workload

STEP_S = 0.01


def run(requests, policy, executor=None, max_concurrency=None, **scheduler_fields):
    scheduler = create_scheduler(**scheduler_fields)
    workload = Workload("test", tuple(requests), max_concurrency=max_concurrency)
    engine = Engine(
        scheduler,
        executor or ScriptedExecutor(STEP_S),
        policy,
        workload,
        LoopConfig(record_events=True, check_invariants=True),
    )
    return engine.run()


def test_two_request_timeline_is_exact():
    # K=2. Request 0: prompt 4, 5 tokens, accepts 2 then 0. Request 1: prompt 6, 3 tokens,
    # accepts 1. Steps of 10 ms:
    #   step 0 [0, 10ms): both prefill -> 1 token each at 10 ms
    #   step 1 [10, 20ms): both decode K=2 -> r0 +3 (4), r1 +2 (3, done) at 20 ms
    #   step 2 [20, 30ms): r0 decodes K=2, accepts 0 -> +1 (5, done) at 30 ms
    executor = ScriptedExecutor(STEP_S, accept_script={0: [2, 0], 1: [1]})
    requests = [RequestSpec(4, 5), RequestSpec(6, 3)]
    result = run(requests, StaticK(2), executor, k_max=2)
    assert result.events == (
        EngineEvent(0.0, "send", 0, -1, 4),
        EngineEvent(0.0, "send", 1, -1, 6),
        EngineEvent(0.0, "step", -1, 0, 2),
        EngineEvent(0.01, "emit", 0, 0, 1),
        EngineEvent(0.01, "emit", 1, 0, 1),
        EngineEvent(0.01, "step", -1, 1, 2),
        EngineEvent(0.02, "emit", 0, 1, 3),
        EngineEvent(0.02, "emit", 1, 1, 2),
        EngineEvent(0.02, "finish", 1, 1, 3),
        EngineEvent(0.02, "step", -1, 2, 1),
        EngineEvent(0.03, "emit", 0, 2, 1),
        EngineEvent(0.03, "finish", 0, 2, 5),
    )
    m = result.metrics
    # TTFT: both 10 ms. E2EL: 30 and 20 ms. TPOT: (30-10)/4 = 5 and (20-10)/2 = 5 ms.
    # ITL gaps: r0 10, 10; r1 10 ms.
    assert m["completed"] == 2
    assert m["total_input_tokens"] == 10
    assert m["total_output_tokens"] == 8
    assert m["duration"] == pytest.approx(0.03)
    assert m["output_throughput"] == pytest.approx(8 / 0.03)
    assert m["request_throughput"] == pytest.approx(2 / 0.03)
    assert m["total_token_throughput"] == pytest.approx(18 / 0.03)
    assert m["mean_ttft_ms"] == pytest.approx(10.0)
    assert m["mean_tpot_ms"] == pytest.approx(5.0)
    assert m["std_tpot_ms"] == pytest.approx(0.0)
    assert m["mean_itl_ms"] == pytest.approx(10.0)
    assert m["mean_e2el_ms"] == pytest.approx(25.0)
    assert m["median_e2el_ms"] == pytest.approx(25.0)
    assert m["std_e2el_ms"] == pytest.approx(5.0)  # population std of [30, 20]
    assert m["p99_e2el_ms"] == pytest.approx(20.0 + 0.99 * 10.0)  # numpy linear percentile
    # 3 drafting rows, 6 drafts, 3 accepted: AL = 1 + 3/3; position 1: 2 of 3, position 2: 1 of 3
    assert m["spec_decode_num_drafts"] == 3
    assert m["spec_decode_draft_tokens"] == 6
    assert m["spec_decode_accepted_tokens"] == 3
    assert m["spec_decode_acceptance_length"] == pytest.approx(2.0)
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx([2 / 3, 1 / 3])
    assert m["per_position_acceptance_given_drafted"] == pytest.approx([2 / 3, 1 / 3])
    assert m["k_histogram"] == {2: 3}
    assert m["num_steps"] == 3
    table = result.requests.set_index("req_id")
    assert table.loc[0, "tpot_ms"] == pytest.approx(5.0)
    assert table.loc[1, "e2el_ms"] == pytest.approx(20.0)
    assert result.steps["batch_size"].tolist() == [2, 2, 1]
    assert result.steps["num_output_tokens"].tolist() == [2, 5, 1]
    assert result.steps["start_s"].tolist() == pytest.approx([0.0, 0.01, 0.02])


def test_tpot_excludes_first_token_and_single_token_requests():
    # r0: 1 token (no TPOT). r1: 3 tokens, K=0: chunks at 10, 20, 30 ms -> TPOT (30-10)/2 = 10.
    result = run([RequestSpec(4, 1), RequestSpec(4, 3)], StaticK(0))
    m = result.metrics
    assert m["mean_tpot_ms"] == pytest.approx(10.0)
    assert m["median_tpot_ms"] == pytest.approx(10.0)
    assert m["mean_ttft_ms"] == pytest.approx(10.0)
    assert np.isnan(result.requests.loc[0, "tpot_ms"])
    # ITL pools only r1's two gaps
    assert m["mean_itl_ms"] == pytest.approx(10.0)


def test_closed_loop_never_exceeds_concurrency_and_refills_at_finish():
    requests = [RequestSpec(5, 2 + (i % 4)) for i in range(20)]
    result = run(requests, StaticK(1), max_concurrency=3)
    in_flight = 0
    finish_times = []
    for event in result.events:
        if event.kind == "send":
            in_flight += 1
            assert in_flight <= 3
            if event.req_id >= 3:
                # closed loop: each new request is sent the instant a slot frees
                assert event.time_s in finish_times
        elif event.kind == "finish":
            in_flight -= 1
            finish_times.append(event.time_s)
    assert result.metrics["completed"] == 20


def test_open_loop_request_joins_the_next_step():
    # r1 arrives at 15 ms, during step 1 [10, 20ms): it is sent at 15 ms and prefilled in
    # step 2 [20, 30ms): TTFT = 30 - 15 = 15 ms.
    requests = [RequestSpec(4, 5), RequestSpec(4, 2, arrival_s=0.015)]
    result = run(requests, StaticK(0))
    table = result.requests.set_index("req_id")
    assert table.loc[1, "send_s"] == pytest.approx(0.015)
    assert table.loc[1, "ttft_ms"] == pytest.approx(15.0)


def test_async_request_sent_during_a_step_joins_two_steps_later():
    # Async: step 2 is planned at 10 ms (start of step 1), before r1 is sent at 15 ms, so r1
    # is prefilled in step 3 [30, 40ms): TTFT = 25 ms.
    requests = [RequestSpec(4, 6), RequestSpec(4, 2, arrival_s=0.015)]
    result = run(requests, StaticK(0), scheduling="async")
    assert result.requests.set_index("req_id").loc[1, "ttft_ms"] == pytest.approx(25.0)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_no_drafts_wastes_no_step(scheduling):
    requests = [RequestSpec(3 + i, 1 + 3 * i) for i in range(6)]
    result = run(requests, StaticK(0), scheduling=scheduling, max_num_seqs=2)
    assert result.steps["num_tokens"].sum() == sum(
        r.prompt_len + r.output_len - 1 for r in requests
    )
    assert result.metrics["total_output_tokens"] == sum(r.output_len for r in requests)


def test_async_k_chosen_at_t_is_verified_at_t_plus_1():
    policy = ScriptedK([2, 0, 3, 1, 4])
    executor = ScriptedExecutor(STEP_S, accept_script={0: [0]}, record=True)
    run([RequestSpec(4, 30)], policy, executor, scheduling="async")
    used = [int(b.num_spec_tokens[0]) for b in executor.batches]
    assert used[:5] == [0, 2, 0, 3, 1]
    # the policy saw feedback for step t after choosing K for step t+1
    assert policy.feedback[0].step_index == 0
    assert len(policy.views) == len(policy.feedback)


def test_preemption_in_tiny_pool_completes_every_request():
    requests = [RequestSpec(8, 16) for _ in range(5)]
    result = run(requests, StaticK(2), num_kv_blocks=12, block_size=4, max_model_len=48)
    assert result.num_preemptions > 0
    assert result.metrics["completed"] == 5
    assert result.requests["num_output_tokens"].tolist() == [16] * 5


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_same_seed_gives_identical_results(scheduling):
    def once(seed):
        rng = np.random.default_rng(seed)
        requests = [RequestSpec(int(p), int(o)) for p, o in rng.integers(1, 60, (30, 2))]
        executor = RandomAcceptanceExecutor(STEP_S, [0.8, 0.6, 0.4], rng)
        result = run(
            requests, StaticK(3), executor, max_concurrency=8, scheduling=scheduling, k_max=3
        )
        return result

    first, second, other = once(5), once(5), once(6)
    assert first.metrics == second.metrics
    assert first.steps.equals(second.steps)
    assert first.requests.equals(second.requests)
    assert first.events == second.events
    assert first.metrics != other.metrics


def test_wall_clock_advances_by_measured_time():
    scheduler = create_scheduler()
    workload = Workload("wall", tuple(RequestSpec(4, 5) for _ in range(3)))
    engine = Engine(
        scheduler, ScriptedExecutor(1.0), StaticK(1), workload, LoopConfig(clock="wall")
    )
    result = engine.run()
    durations = result.steps["duration_s"].to_numpy()
    # real iterations take microseconds, not the executor's modelled 1 s
    assert (durations > 0).all() and (durations < 0.5).all()
    assert result.metrics["completed"] == 3
    assert np.all(np.diff(result.steps["start_s"].to_numpy()) > 0)


def test_engine_runs_once():
    scheduler = create_scheduler()
    engine = Engine(scheduler, ScriptedExecutor(), StaticK(0), Workload("w", (RequestSpec(2, 2),)))
    engine.run()
    with pytest.raises(RuntimeError):
        engine.run()


def test_executor_sees_every_request_before_it_is_scheduled():
    executor = ScriptedExecutor(STEP_S, record=True)
    run([RequestSpec(3, 2), RequestSpec(3, 2, arrival_s=0.05)], StaticK(1), executor)
    assert executor.added == [0, 1]
    scheduled = [rid for b in executor.batches for rid in b.new_req_ids]
    assert scheduled == [0, 1]
    # the finished request is announced to the executor in the next batch
    assert any(0 in b.finished_req_ids for b in executor.batches)


def test_tpot_in_prefill_steps_counts_the_steps_that_also_ran_a_prompt():
    # K=0, 10 ms steps, at most 2 requests in flight; r2 is sent when r0 finishes (30 ms):
    #   step 0 [0, 10): prefill r0, r1       step 3 [30, 40): decode r1 + prefill r2
    #   steps 1-2: decode r0, r1 (r0 done)   steps 4-5: decode r1, r2 (both done at 60 ms)
    # r1 decodes from 10 to 60 ms (5 gaps, TPOT 10 ms), 10 ms of it in step 3 -> 2 ms per token;
    # r0 and r2 decode only in steps without a prompt -> 0.
    requests = [RequestSpec(4, 3), RequestSpec(4, 6), RequestSpec(4, 3)]
    result = run(requests, StaticK(0), max_concurrency=2, k_max=0)
    table = result.requests.set_index("req_id")
    assert table["tpot_ms"].tolist() == pytest.approx([10.0, 10.0, 10.0])
    assert table["tpot_in_prefill_steps_ms"].tolist() == pytest.approx([0.0, 2.0, 0.0])
    assert result.metrics["mean_tpot_in_prefill_steps_ms"] == pytest.approx(2.0 / 3)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(2, 30)), min_size=1, max_size=12),
    max_concurrency=st.integers(1, 5),
    k=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_tpot_in_prefill_steps_is_the_prefill_steps_inside_each_requests_decode(
    lengths, max_concurrency, k, seed
):
    """Per request: the steps with prefill rows (B > D) that end inside its decode window
    (first token, finish], over its output tokens - 1; never more than its TPOT. No preemption
    here (ample KV), so a decoding request is a row of every step of its window."""
    requests = [RequestSpec(prompt, output) for prompt, output in lengths]
    executor = RandomAcceptanceExecutor(STEP_S, [0.7, 0.5, 0.3], np.random.default_rng(seed))
    result = run(requests, StaticK(k), executor, max_concurrency=max_concurrency, k_max=3)
    steps = result.steps
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
    with_prefill = (steps["batch_size"] > steps["num_decode_reqs"]).to_numpy()
    for row in result.requests.itertuples():
        if row.num_output_tokens < 2:
            continue
        inside = (ends > row.first_token_s + 1e-12) & (ends <= row.finish_s + 1e-12)
        want_s = steps["duration_s"].to_numpy()[inside & with_prefill].sum()
        want_ms = 1000.0 * want_s / (row.num_output_tokens - 1)
        assert row.tpot_in_prefill_steps_ms == pytest.approx(want_ms)
        assert row.tpot_in_prefill_steps_ms <= row.tpot_ms + 1e-9
    multi = result.requests[result.requests["num_output_tokens"] > 1]
    assert result.metrics["mean_tpot_in_prefill_steps_ms"] == pytest.approx(
        multi["tpot_in_prefill_steps_ms"].mean() if len(multi) else 0.0
    )


def _engine(requests, policy, executor, clock="model", max_concurrency=2):
    workload = Workload("test", tuple(requests), max_concurrency=max_concurrency)
    return Engine(create_scheduler(k_max=3), executor, policy, workload, LoopConfig(clock=clock))


def test_interleaved_engines_give_exactly_their_solo_runs_under_the_model_clock():
    arms = [  # (requests, K, acceptance seed): different lengths, so they finish apart
        ([RequestSpec(8, 30), RequestSpec(5, 12), RequestSpec(9, 20)], 3, 1),
        ([RequestSpec(4, 7)], 0, 2),
        ([RequestSpec(6, 25), RequestSpec(6, 25)], 1, 3),
    ]

    def engines():
        return [
            _engine(
                requests,
                StaticK(k),
                RandomAcceptanceExecutor(STEP_S, [0.7, 0.5, 0.3], np.random.default_rng(seed)),
            )
            for requests, k, seed in arms
        ]

    solo = [engine.run() for engine in engines()]
    together = run_interleaved(engines())
    for alone, interleaved in zip(solo, together, strict=True):
        # NaN keys (K = 0 has no acceptance) compare equal as JSON
        assert json.dumps(interleaved.metrics, sort_keys=True) == json.dumps(
            alone.metrics, sort_keys=True
        )
        assert interleaved.steps.equals(alone.steps)


class _SleepingExecutor(ScriptedExecutor):
    """Sleeps `sleep_s` in every step (a wall-clock step of known length)."""

    def __init__(self, sleep_s):
        super().__init__(STEP_S)
        self.sleep_s = sleep_s

    def execute(self, batch):
        time.sleep(self.sleep_s)
        return super().execute(batch)


def test_interleaved_wall_clock_steps_are_each_engines_own():
    """A 2 ms engine beside a 30 ms one: were the other's step counted, its steps would last
    >= 32 ms; each engine's clock holds its own steps only."""
    fast, slow = (
        _engine([RequestSpec(4, 10)], StaticK(0), _SleepingExecutor(sleep_s), clock="wall")
        for sleep_s in (0.002, 0.03)
    )
    fast_run, slow_run = run_interleaved([fast, slow])
    assert fast_run.steps["duration_s"].median() < 0.02
    assert slow_run.steps["duration_s"].median() >= 0.03
    assert fast_run.metrics["completed"] == slow_run.metrics["completed"] == 1


def test_between_runs_after_every_step_outside_the_engines_time():
    """A 40 ms callback after each 2 ms step: it runs once per step, and no step lasts it."""
    engine = _engine([RequestSpec(4, 6)], StaticK(0), _SleepingExecutor(0.002), clock="wall")
    calls = []
    (result,) = run_interleaved([engine], between=lambda: calls.append(time.sleep(0.04)))
    assert len(calls) == len(result.steps) > 1
    assert result.steps["duration_s"].max() < 0.03


def test_interleaving_needs_closed_loop_workloads():
    arriving = _engine([RequestSpec(4, 3, arrival_s=0.5)], StaticK(0), ScriptedExecutor(STEP_S))
    with pytest.raises(ValueError, match="closed-loop"):
        run_interleaved([arriving])
