"""A stateful property-test machine for the scheduler, shipped for every policy and executor.

`SchedulerMachine` is a hypothesis `RuleBasedStateMachine` that drives the REAL
`sim.scheduler.Scheduler` through random calls (add, schedule with any K, deliver any outcome,
abort, async steps in flight) on tiny configs where preemption and chunked prefill are common.
After every rule it checks the scheduler's own `check_invariants()`, a ledger kept from public
data only, and the naive `sim.testing.reference.ReferenceScheduler` run on the same calls; at
teardown it runs to completion. `make_scheduler_machine(configs, policy_factory=...,
executor_factory=...)` puts a policy's K or an executor's outcomes in place of the drawn ones
and checks their contracts. The rules, the invariants, what they catch and how to reuse the
machine: docs/testing.md.

Needs the `dev` extra (hypothesis); nothing in the package imports this module. What it
deliberately does not do: time (the engine's clock), latency or acceptance realism, or choose
hypothesis settings (the caller sets `TestCase.settings`; see docs/testing.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dsd.common.arrays import IntArray

try:
    from hypothesis import event, note
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        initialize,
        invariant,
        rule,
    )
except ImportError as error:  # pragma: no cover - the dev extra is missing
    raise ImportError("sim.testing.machine needs hypothesis: pip install 'dsd[dev]'") from error

from dsd.common.errors import InputError
from dsd.policies.types import K_TIMINGS, KPolicy, StepFeedback
from dsd.sim.kv import cdiv
from dsd.sim.scheduler import (
    SPECULATIVE_METHODS,
    Scheduler,
    SchedulerConfig,
    StepPlan,
    drafter_reservations,
)
from dsd.sim.testing.reference import ReferenceBatch, ReferencePlan, ReferenceScheduler
from dsd.sim.types import Executor, ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec

PolicyFactory = Callable[[SchedulerConfig], KPolicy]
ExecutorFactory = Callable[[SchedulerConfig, np.random.Generator], Executor]

_STEP_S = 0.01  # duration reported by drawn outcomes (the scheduler never reads it)
_LARGEST_DRAWN = 6  # drawn K and accepted counts go up to here (past any k_max drawn below)


@st.composite
def scheduler_configs(
    draw: st.DrawFn,
    scheduling: str | None = None,
    max_model_len: tuple[int, int] = (2, 40),
    k_max: tuple[int, int] = (0, 4),
    max_num_seqs: tuple[int, int] = (1, 6),
    max_num_batched_tokens: tuple[int, int] = (1, 48),
    pool_slack_blocks: tuple[int, int] = (0, 12),
) -> SchedulerConfig:
    """Small scheduler configs where budgets, pools and max_model_len bind often.

    The pool holds one max_model_len request plus `pool_slack_blocks` blocks (tiny: preemption
    is common); the budget is tiny (chunked prefill, trimmed drafts); some configs disable
    chunked prefill or cap chunks with long_prefill_token_threshold.
    """
    mode = draw(st.sampled_from(["sync", "async"])) if scheduling is None else scheduling
    model_len = draw(st.integers(*max_model_len))
    block_size = draw(st.integers(1, 8))
    chunked = draw(st.sampled_from([True, True, True, False]))
    low, high = max_num_batched_tokens
    budget = (
        draw(st.integers(low, high)) if chunked else draw(st.integers(model_len, model_len + 8))
    )
    drafts = draw(st.integers(*k_max))
    # ngram (no reservations) half the time; ngram where the lookahead would not fit the budget
    method = draw(st.sampled_from(("ngram",) * len(SPECULATIVE_METHODS) + SPECULATIVE_METHODS))
    lookahead, slots = drafter_reservations(method, drafts)
    if lookahead >= budget or (not chunked and budget < model_len + slots):
        method = "ngram"  # configs SchedulerConfig refuses
    return SchedulerConfig(
        max_model_len=model_len,
        num_kv_blocks=cdiv(model_len, block_size) + draw(st.integers(*pool_slack_blocks)),
        k_max=drafts,
        max_num_seqs=draw(st.integers(*max_num_seqs)),
        max_num_batched_tokens=budget,
        block_size=block_size,
        scheduling=mode,  # type: ignore[arg-type]
        k_timing="next-step" if mode == "async" else draw(st.sampled_from(K_TIMINGS)),
        enable_chunked_prefill=chunked,
        # Only with chunked prefill (SchedulerConfig rejects a threshold without it).
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 0, 1, 3, 8])) if chunked else 0,
        speculative_method=method,
    )


@dataclass
class _Ledger:
    """The machine's own account of one request, built from public data only."""

    spec: RequestSpec  # as added
    max_output: int  # min(max_tokens, max_model_len - prompt_len)
    state: str = "waiting"  # waiting | running | finished | aborted (preemptions as reported)
    num_output: int = 0  # confirmed output tokens (sum of the rows' emitted tokens)
    num_computed: int = 0  # KV tokens: scheduled - rejected drafts, 0 after a preemption
    # most tokens its KV blocks were allocated for (rejected drafts' blocks stay, as vLLM)
    kv_tokens: int = 0
    prefill_target: int = 0  # tokens its current prefill must cover
    in_prefill: bool = True  # its next row is a prefill chunk
    pending_k: int = 0  # next-step K timing: K chosen at its previous step
    placeholders: dict[int, int] = field(default_factory=dict)  # step_index -> in-flight outputs
    num_lives: int = 0  # preemptions reported so far
    num_scheduled_total: int = 0  # tokens scheduled for it over all steps
    drafted: bool = False  # some decode row carried K > 0
    preempted: bool = False  # was preempted at least once
    stopped: bool = False  # finished on a stop token


@dataclass
class _InFlight:
    """A committed step waiting for its outcome."""

    batch: ScheduledBatch  # the real scheduler's batch
    reference: ReferenceBatch | None  # the reference scheduler's batch
    lives: list[int]  # [B] each row's ledger.num_lives at commit
    outcome: StepOutcome | None  # the executor's outcome (executor_factory), else drawn later


class SchedulerMachine(RuleBasedStateMachine):
    """Drives the real scheduler (its rules and invariants: docs/testing.md). Subclass via
    make_scheduler_machine."""

    configs: ClassVar[st.SearchStrategy[SchedulerConfig]] = scheduler_configs()
    policy_factory: ClassVar[PolicyFactory | None] = None
    executor_factory: ClassVar[ExecutorFactory | None] = None
    use_reference: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.config: SchedulerConfig | None = None
        self._in_rule = False  # a rule is running: if it raised, teardown does not drain

    # ------------------------------------------------------------------ setup

    @initialize(
        config=st.runner().flatmap(lambda machine: machine.configs),
        seed=st.integers(0, 2**32 - 1),
    )
    def setup(self, config: SchedulerConfig, seed: int) -> None:
        factory = type(self).policy_factory
        # first: a policy that cannot be built is the report (teardown skips an unset machine)
        self.policy = factory(config) if factory is not None else None
        self.config = config
        self.scheduler = Scheduler(config, capacity=2)  # tiny: slot growth gets exercised
        self.reference = ReferenceScheduler(config) if self.use_reference else None
        make_executor = type(self).executor_factory
        rng = np.random.default_rng(seed)
        self.executor = make_executor(config, rng) if make_executor is not None else None
        self.depth = 2 if config.scheduling == "async" else 1  # steps in flight at most
        self.ledgers: dict[int, _Ledger] = {}
        self.next_req_id = 0
        self.next_step_index = 0
        self.inflight: list[_InFlight] = []  # oldest first
        self.finished_unreported: list[int] = []  # finished/aborted since the last batch
        self.num_preemptions_reported = 0
        self.num_drafts = 0  # ledger's spec-decode counters (live decode rows)
        self.num_accepted_tokens = 0
        note(f"config: {config}")

    # ------------------------------------------------------------------ rules

    @rule(prompt_len=st.integers(1, 48), output_len=st.integers(1, 48))
    def add_request(self, prompt_len: int, output_len: int) -> None:
        """A new request; prompts past max_model_len - 1 are clamped to the edge."""
        self._in_rule = True
        cfg = self._cfg()
        prompt = min(prompt_len, cfg.max_model_len - 1)
        spec = RequestSpec(prompt_len=prompt, output_len=output_len)
        req_id = self.next_req_id
        self.next_req_id += 1
        self.scheduler.add_request(req_id, spec)
        if self.reference is not None:
            self.reference.add_request(req_id, spec)
        if self.executor is not None:
            self.executor.add_request(req_id, spec)
        max_output = min(output_len, cfg.max_model_len - prompt)
        self.ledgers[req_id] = _Ledger(spec=spec, max_output=max_output, prefill_target=prompt)
        note(f"add request {req_id}: prompt {prompt}, max_tokens {output_len} -> {max_output}")
        self._in_rule = False

    @rule(extra=st.integers(0, 3))
    def add_request_too_long(self, extra: int) -> None:
        """A prompt that leaves no room for output is an InputError and changes nothing."""
        self._in_rule = True
        cfg = self._cfg()
        spec = RequestSpec(prompt_len=cfg.max_model_len + extra, output_len=1)
        try:
            self.scheduler.add_request(10**9, spec)
        except InputError:
            pass
        else:
            raise AssertionError("a prompt >= max_model_len was accepted")
        self._in_rule = False

    @rule(
        k=st.integers(-1, _LARGEST_DRAWN),
        k_per_row=st.none() | st.lists(st.integers(-1, _LARGEST_DRAWN), min_size=1, max_size=6),
    )
    def schedule(self, k: int, k_per_row: list[int] | None) -> None:
        """Plan and commit one step: one K (out of range values get clamped) or K per row.

        With the engine's depth of steps already in flight the rule does nothing (no
        preconditions: hypothesis wastes whole examples when rules are filtered out).
        """
        self._in_rule = True
        if len(self.inflight) < self.depth:
            self._schedule(k, k_per_row)
        self._in_rule = False

    @rule(
        accepted=st.lists(st.integers(0, _LARGEST_DRAWN), min_size=1, max_size=6),
        stops=st.none() | st.lists(st.integers(-1, 3), min_size=1, max_size=6),
    )
    def deliver(self, accepted: list[int], stops: list[int] | None) -> None:
        """The oldest in-flight step's outcome: row i accepts min(K_i, accepted[i % n]).

        `stops[i % n]` is row i's stop position among its emitted tokens when it is one (else
        no stop). Does nothing with no step in flight.
        """
        self._in_rule = True
        if self.inflight:
            self._deliver(accepted, stops)
        self._in_rule = False

    @rule(pick=st.integers(0, 1000))
    def abort(self, pick: int) -> None:
        """Abort a waiting or running request (maybe one with a step in flight)."""
        self._in_rule = True
        live = sorted(r for r, led in self.ledgers.items() if led.state in ("waiting", "running"))
        if not live:
            self._in_rule = False
            return
        req_id = live[pick % len(live)]
        ledger = self.ledgers[req_id]
        note(f"abort request {req_id} ({len(ledger.placeholders)} of its steps in flight)")
        if ledger.placeholders:
            event("abort: with a step in flight")
        self.scheduler.abort(req_id)
        if self.reference is not None:
            self.reference.abort(req_id)
        ledger.state = "aborted"
        ledger.num_computed = ledger.kv_tokens = 0
        self.finished_unreported.append(req_id)
        try:
            self.scheduler.abort(req_id)
        except KeyError:
            pass
        else:
            raise AssertionError(f"request {req_id} aborted twice")
        self._in_rule = False

    # ------------------------------------------------------------------ one step

    def _schedule(self, k: int, k_per_row: list[int] | None) -> bool:
        cfg = self._cfg()
        plan = self.scheduler.plan_step()
        self.scheduler.check_invariants()
        reference_plan = self.reference.plan_step() if self.reference is not None else None
        if plan is None:
            assert reference_plan is None or self.reference is None, (
                f"reference plans {reference_plan} where the scheduler plans nothing"
            )
            note("plan: nothing to run")
            event("plan: nothing to run")
            return False
        if self.reference is not None:
            assert reference_plan is not None, "the scheduler plans a step the reference does not"
            _compare_plans(plan, reference_plan)
        num_decode = plan.num_decode_reqs
        if self.policy is not None:
            view = plan.view(plan.step_index * _STEP_S, cfg)
            answer = self.policy.choose_k(view)
            if isinstance(answer, int | np.integer):
                assert 0 <= int(answer) <= cfg.k_max, f"policy K {answer} outside [0, k_max]"
                k_rows = [int(answer)] * num_decode
                k_arg: int | IntArray = int(answer)
            else:
                k_array = np.asarray(answer, dtype=np.int64)  # [D]
                assert k_array.shape == (num_decode,), f"policy K shape {k_array.shape}"
                assert ((k_array >= 0) & (k_array <= cfg.k_max)).all(), "policy K out of range"
                k_rows = k_array.tolist()
                k_arg = k_array
        elif k_per_row is None:
            k_rows = [min(max(k, 0), cfg.k_max)] * num_decode
            k_arg = k
        else:
            raw = [k_per_row[i % len(k_per_row)] for i in range(num_decode)]
            k_rows = [min(max(value, 0), cfg.k_max) for value in raw]
            k_arg = np.array(raw, dtype=np.int64)  # [D]
        if isinstance(k_arg, int):
            k_default = min(max(k_arg, 0), cfg.k_max)
        else:
            k_default = max(k_rows) if k_rows else 0
        batch = self.scheduler.commit_step(plan, k_arg)
        self.scheduler.check_invariants()
        reference_batch = None
        if self.reference is not None:
            assert reference_plan is not None
            ref_k: int | list[int] = k_arg if isinstance(k_arg, int) else k_arg.tolist()
            reference_batch = self.reference.commit_step(reference_plan, ref_k)
            _compare_batches(batch, reference_batch)
        lives = self._check_and_book_batch(plan, batch, k_rows, k_default)
        if batch.preempted_req_ids:
            event("step: reports a preemption")
        if batch.num_decode_reqs and batch.batch_size > batch.num_decode_reqs:
            event("step: decode rows and prefill chunks together")
        if (plan.decode_draft_room < cfg.k_max).any():
            event("step: draft room trimmed (budget or max_model_len)")
        if len(self.inflight) == 1:
            event("step: planned with another step in flight")
        outcome = None
        if self.executor is not None:
            outcome = self.executor.execute(batch)
            self._check_executor_outcome(batch, outcome)
        self.inflight.append(_InFlight(batch, reference_batch, lives, outcome))
        note(
            f"step {batch.step_index}: rows {batch.req_ids.tolist()} "
            f"(decode {batch.num_decode_reqs}) tokens {batch.num_scheduled_tokens.tolist()} "
            f"K {batch.num_spec_tokens[: batch.num_decode_reqs].tolist()} "
            f"(asked {k_rows}) completes {batch.completes_prompt.tolist()} "
            f"new {list(batch.new_req_ids)} preempted {list(batch.preempted_req_ids)} "
            f"finished {list(batch.finished_req_ids)}"
        )
        return True

    def _check_and_book_batch(
        self, plan: StepPlan, batch: ScheduledBatch, k_rows: list[int], k_default: int
    ) -> list[int]:
        """Check one batch against the ledger and the limits, then book it; returns row lives."""
        cfg = self._cfg()
        assert batch.step_index == self.next_step_index, (
            f"step index {batch.step_index}, expected {self.next_step_index}"
        )
        self.next_step_index += 1
        assert list(batch.finished_req_ids) == self.finished_unreported, (
            f"batch reports finished {list(batch.finished_req_ids)}, "
            f"expected {self.finished_unreported}"
        )
        self.finished_unreported = []
        for req_id in batch.preempted_req_ids:
            ledger = self.ledgers[req_id]
            if ledger.state in ("finished", "aborted"):
                continue  # preempted, then finished or aborted before the report
            assert ledger.state == "running", f"preempted request {req_id} was {ledger.state}"
            ledger.state = "waiting"
            ledger.num_computed = ledger.kv_tokens = 0
            ledger.in_prefill = True
            ledger.num_lives += 1
            ledger.preempted = True
        self.num_preemptions_reported += len(batch.preempted_req_ids)
        for req_id in batch.new_req_ids:
            ledger = self.ledgers[req_id]
            assert ledger.state == "waiting", f"admitted request {req_id} was {ledger.state}"
            assert not ledger.placeholders, f"request {req_id} admitted with a step in flight"
            ledger.state = "running"
            ledger.in_prefill = True
            ledger.prefill_target = ledger.spec.prompt_len + ledger.num_output

        # requests running or waiting (vLLM lifts long_prefill_token_threshold for a lone one)
        num_live = sum(led.state in ("waiting", "running") for led in self.ledgers.values())
        req_ids = batch.req_ids.tolist()
        scheduled = batch.num_scheduled_tokens.tolist()
        spec = batch.num_spec_tokens.tolist()
        computed = batch.num_computed_tokens.tolist()
        outputs = batch.num_output_tokens.tolist()
        completes = batch.completes_prompt.tolist()
        num_decode = batch.num_decode_reqs
        assert len(set(req_ids)) == len(req_ids), f"a request twice in one step: {req_ids}"
        assert 0 < len(req_ids) <= cfg.max_num_seqs, f"B = {len(req_ids)}"
        assert batch.total_num_scheduled_tokens == sum(scheduled)
        # every scheduled row also takes the drafter's per-row slots of the budget (vLLM)
        used = sum(scheduled) + cfg.num_draft_slots * len(scheduled)
        assert used <= cfg.max_num_batched_tokens, (
            f"{sum(scheduled)} tokens + {cfg.num_draft_slots} draft slots per row > budget "
            f"{cfg.max_num_batched_tokens}"
        )
        assert set(batch.new_req_ids) <= set(req_ids[num_decode:]), "a new request not prefilling"
        draft_room = plan.decode_draft_room.tolist()
        lives: list[int] = []
        for row, req_id in enumerate(req_ids):
            ledger = self.ledgers[req_id]
            lives.append(ledger.num_lives)
            where = f"step {batch.step_index} request {req_id}"
            assert ledger.state == "running", f"{where}: scheduled while {ledger.state}"
            assert computed[row] == ledger.num_computed, (
                f"{where}: num_computed_tokens {computed[row]}, ledger says {ledger.num_computed}"
            )
            assert outputs[row] == ledger.num_output, (
                f"{where}: num_output_tokens {outputs[row]}, ledger says {ledger.num_output}"
            )
            assert computed[row] + scheduled[row] <= cfg.max_model_len - 1, (
                f"{where}: positions up to {computed[row] + scheduled[row]} "
                f">= max_model_len {cfg.max_model_len}"
            )
            in_flight_outputs = sum(ledger.placeholders.values())
            if row < num_decode:
                assert not ledger.in_prefill, f"{where}: decode row while prefilling"
                expected = ledger.spec.prompt_len + ledger.num_output + in_flight_outputs - 1
                assert computed[row] == expected, (
                    f"{where}: KV tokens {computed[row]} != prompt + outputs + in-flight - 1 "
                    f"= {expected}"
                )
                # vLLM's async rule: never schedule behind an in-flight step that surely ends
                # the request (it emits >= 1 token); one that only might end it is allowed.
                surely_done = in_flight_outputs > 0 and ledger.num_output + 1 >= ledger.max_output
                assert ledger.num_output < ledger.max_output and not surely_done, (
                    f"{where}: a step behind one that surely ends the request (outputs "
                    f"{ledger.num_output}, in flight {in_flight_outputs}, max {ledger.max_output})"
                )
                assert 0 <= draft_room[row] <= cfg.k_max
                lagged = cfg.k_timing == "next-step"
                wanted_k = ledger.pending_k if lagged else k_rows[row]
                assert spec[row] == min(wanted_k, draft_room[row]), (
                    f"{where}: K {spec[row]}, expected min({wanted_k}, room {draft_room[row]}) "
                    f"({cfg.scheduling}, {cfg.k_timing})"
                )
                assert scheduled[row] == 1 + spec[row]
                if cfg.long_prefill_token_threshold and num_live > 1:  # vLLM caps decode rows too
                    assert scheduled[row] <= cfg.long_prefill_token_threshold
                ledger.pending_k = k_rows[row]
                ledger.placeholders[batch.step_index] = 1 + spec[row]
                ledger.drafted |= spec[row] > 0
            else:
                assert ledger.in_prefill, f"{where}: prefill row of a decoding request"
                assert spec[row] == 0, f"{where}: drafts on a prefill chunk"
                assert scheduled[row] >= 1
                assert computed[row] + scheduled[row] <= ledger.prefill_target
                if cfg.long_prefill_token_threshold and num_live > 1:
                    assert scheduled[row] <= cfg.long_prefill_token_threshold
                done = computed[row] + scheduled[row] == ledger.prefill_target
                assert completes[row] == done, f"{where}: completes_prompt {completes[row]}"
                if done:
                    ledger.in_prefill = False
                    ledger.placeholders[batch.step_index] = 1
                    if cfg.k_timing == "next-step":
                        ledger.pending_k = k_default
            ledger.num_computed += scheduled[row]
            # plus the drafter's lookahead slots, within the model (vLLM's allocate_slots)
            ledger.kv_tokens = max(
                ledger.kv_tokens,
                min(ledger.num_computed + cfg.num_lookahead_tokens, cfg.max_model_len),
            )
            ledger.num_scheduled_total += scheduled[row]
        return lives

    def _check_executor_outcome(self, batch: ScheduledBatch, outcome: StepOutcome) -> None:
        num_decode = batch.num_decode_reqs
        accepted = np.asarray(outcome.num_accepted)  # [D]
        assert math.isfinite(outcome.duration_s) and outcome.duration_s > 0, "duration <= 0"
        assert accepted.shape == (num_decode,), f"accepted shape {accepted.shape}"
        spec = batch.num_spec_tokens[:num_decode]  # [D]
        assert ((accepted >= 0) & (accepted <= spec)).all(), "executor accepted outside [0, K]"
        if outcome.stop_index is not None:
            stop = np.asarray(outcome.stop_index)  # [B]
            assert stop.shape == (batch.batch_size,), f"stop_index shape {stop.shape}"
            raw = np.concatenate([accepted + 1, batch.completes_prompt[num_decode:]])  # [B]
            assert ((stop >= -1) & (stop < np.maximum(raw, 1))).all(), "stop_index out of range"

    def _deliver(self, accepted_draw: list[int], stops_draw: list[int] | None) -> None:
        step = self.inflight.pop(0)
        batch = step.batch
        num_decode = batch.num_decode_reqs
        spec = batch.num_spec_tokens.tolist()
        if step.outcome is not None:
            outcome = step.outcome
        else:
            accepted = [
                min(spec[i], accepted_draw[i % len(accepted_draw)]) for i in range(num_decode)
            ]
            stop_index = None
            if stops_draw is not None:
                raw = [a + 1 for a in accepted] + batch.completes_prompt[num_decode:].tolist()
                drawn = [stops_draw[i % len(stops_draw)] for i in range(batch.batch_size)]
                stop_index = np.array(
                    [s if 0 <= s < raw[i] else -1 for i, s in enumerate(drawn)], dtype=np.int64
                )  # [B]
            outcome = StepOutcome(_STEP_S, np.array(accepted, dtype=np.int64), stop_index)
        accepted_rows = np.asarray(outcome.num_accepted).tolist()
        stop_rows = (
            [-1] * batch.batch_size
            if outcome.stop_index is None
            else np.asarray(outcome.stop_index).tolist()
        )
        result = self.scheduler.update(batch, outcome)
        self.scheduler.check_invariants()
        if self.reference is not None:
            assert step.reference is not None
            reference_result = self.reference.update(
                batch.step_index,
                accepted_rows,
                None if outcome.stop_index is None else stop_rows,
            )
            assert result.num_output_tokens.tolist() == reference_result.num_output_tokens, (
                f"step {batch.step_index}: emitted {result.num_output_tokens.tolist()}, "
                f"reference {reference_result.num_output_tokens}"
            )
            assert result.finished_req_ids == reference_result.finished_req_ids, (
                f"step {batch.step_index}: finished {result.finished_req_ids}, "
                f"reference {reference_result.finished_req_ids}"
            )

        # The ledger's expectation, row by row.
        emitted_rows = result.num_output_tokens.tolist()
        expected_finished: list[int] = []
        for row, req_id in enumerate(batch.req_ids.tolist()):
            ledger = self.ledgers[req_id]
            ledger.placeholders.pop(batch.step_index, None)
            live = ledger.state in ("waiting", "running")
            if row < num_decode:
                a = accepted_rows[row]
                if live and step.lives[row] == ledger.num_lives:
                    ledger.num_computed -= spec[row] - a  # roll back the rejected drafts
                if live:
                    self.num_drafts += int(spec[row] > 0)
                    self.num_accepted_tokens += a
                raw = a + 1
            else:
                raw = int(batch.completes_prompt[row])
            expected = min(raw, ledger.max_output - ledger.num_output) if live else 0
            stop = stop_rows[row]
            stopped = live and 0 <= stop < expected
            if stopped:
                expected = stop + 1
            assert emitted_rows[row] == expected, (
                f"step {batch.step_index} request {req_id}: emitted {emitted_rows[row]}, "
                f"expected {expected} (raw {raw}, outputs {ledger.num_output}/"
                f"{ledger.max_output}, stop {stop}, live {live})"
            )
            ledger.num_output += expected
            assert ledger.num_output <= ledger.max_output
            if live and expected < raw and not stopped:
                event("outcome: tokens trimmed at the length limit")
            if stopped:
                event("outcome: stop token")
            if live and (stopped or ledger.num_output == ledger.max_output):
                expected_finished.append(req_id)
                ledger.state = "finished"
                ledger.stopped = stopped
                ledger.num_computed = ledger.kv_tokens = 0
                self._check_finished(req_id, ledger)
        assert list(result.finished_req_ids) == expected_finished, (
            f"step {batch.step_index}: finished {result.finished_req_ids}, "
            f"expected {expected_finished}"
        )
        self.finished_unreported.extend(expected_finished)
        note(
            f"outcome {batch.step_index}: accepted {accepted_rows} stop {stop_rows} -> "
            f"emitted {emitted_rows} finished {list(result.finished_req_ids)}"
        )
        if self.policy is not None:
            self.policy.observe(
                StepFeedback(
                    step_index=batch.step_index,
                    time_s=(batch.step_index + 1) * _STEP_S,
                    batch_size=batch.batch_size,
                    req_ids=batch.req_ids[:num_decode],
                    num_spec_tokens=batch.num_spec_tokens[:num_decode],
                    num_accepted=np.asarray(outcome.num_accepted, dtype=np.int64),
                    duration_s=outcome.duration_s,
                    num_output_tokens=int(result.num_output_tokens.sum()),
                )
            )

    def _check_finished(self, req_id: int, ledger: _Ledger) -> None:
        """A request that ran its course: exact outputs and, without drafts, no wasted token."""
        if ledger.stopped:
            return
        assert ledger.num_output == ledger.max_output
        if not ledger.drafted and not ledger.preempted:
            expected = ledger.spec.prompt_len + ledger.max_output - 1
            assert ledger.num_scheduled_total == expected, (
                f"request {req_id}: {ledger.num_scheduled_total} tokens scheduled without "
                f"drafts, expected prompt + max_tokens - 1 = {expected}"
            )

    # ------------------------------------------------------------------ invariants

    @invariant()
    def accounting_holds(self) -> None:
        if self.config is None:
            return
        cfg = self.config
        scheduler = self.scheduler
        scheduler.check_invariants()
        live = [r for r, led in self.ledgers.items() if led.state in ("waiting", "running")]
        assert scheduler.num_running + scheduler.num_waiting == len(live), (
            f"scheduler has {scheduler.num_running} running + {scheduler.num_waiting} waiting, "
            f"ledger {len(live)} live"
        )
        assert scheduler.num_running <= cfg.max_num_seqs
        assert scheduler.has_unfinished() == bool(live)
        assert scheduler.has_inflight() == bool(self.inflight)
        for req_id in live:
            ledger = self.ledgers[req_id]
            assert scheduler.num_output_tokens(req_id) == ledger.num_output, (
                f"request {req_id}: scheduler has {scheduler.num_output_tokens(req_id)} outputs, "
                f"ledger {ledger.num_output}"
            )
        pool = scheduler.kv
        held = pool.num_total_blocks - pool.num_free_blocks
        assert 0 <= pool.num_free_blocks <= pool.num_total_blocks
        if scheduler.num_preemptions == self.num_preemptions_reported:
            # The ledger knows every preemption: it can count the blocks itself.
            running = [r for r in live if self.ledgers[r].state == "running"]
            assert scheduler.num_running == len(running)
            expected_held = sum(cdiv(self.ledgers[r].kv_tokens, cfg.block_size) for r in running)
            assert held == expected_held, (
                f"{held} blocks held, ledger's running requests hold {expected_held} (the most "
                "tokens each was allocated since its admission)"
            )
        if not live:
            assert held == 0, f"{held} blocks leak with no request left"
        stats = scheduler.spec_stats
        assert stats.num_drafts == self.num_drafts
        assert stats.num_accepted_tokens == self.num_accepted_tokens
        if self.reference is not None:
            reference = self.reference
            reference.check_invariants()
            assert pool.num_free_blocks == len(reference.free_blocks), (
                f"free blocks {pool.num_free_blocks}, reference {len(reference.free_blocks)}"
            )
            assert scheduler.num_preemptions == reference.num_preemptions
            assert stats.num_draft_tokens == reference.num_draft_tokens
            assert stats.drafted_at_pos.tolist() == reference.drafted_at_pos
            assert stats.accepted_at_pos.tolist() == reference.accepted_at_pos

    # ------------------------------------------------------------------ teardown

    def teardown(self) -> None:
        """Run what is left to completion: no deadlock, exact outputs, no leaked blocks."""
        if self.config is None or self._in_rule:
            return  # not set up, or a rule failed: its error is the report
        cfg = self.config
        limit = 20 + 4 * sum(led.spec.prompt_len + led.max_output for led in self.ledgers.values())
        for _ in range(limit):
            if not self.inflight and not self.scheduler.has_unfinished():
                break
            ran = False
            if len(self.inflight) < self.depth and self.scheduler.has_unfinished():
                ran = self._schedule(cfg.k_max, None)
            if not ran:
                assert self.inflight, "deadlock: requests left, nothing planned, nothing in flight"
                self._deliver([_LARGEST_DRAWN], None)
            self.accounting_holds()
        else:
            raise AssertionError(f"not finished after {limit} iterations")
        pool = self.scheduler.kv
        assert pool.num_free_blocks == pool.num_total_blocks, "blocks leak after the last request"
        for req_id, ledger in self.ledgers.items():
            assert ledger.state in ("finished", "aborted"), f"request {req_id} {ledger.state}"
            if ledger.state == "finished" and not ledger.stopped:
                assert ledger.num_output == ledger.max_output

    def _cfg(self) -> SchedulerConfig:
        assert self.config is not None
        return self.config


def _compare_plans(plan: StepPlan, reference: ReferencePlan) -> None:
    got = (
        plan.step_index,
        plan.decode_req_ids.tolist(),
        plan.decode_context_lens.tolist(),
        plan.decode_draft_room.tolist(),
        plan.prefill_req_ids.tolist(),
        plan.prefill_chunk_lens.tolist(),
        plan.prefill_completes.tolist(),
        plan.new_req_ids,
        plan.preempted_req_ids,
        plan.finished_req_ids,
    )
    want = (
        reference.step_index,
        reference.decode_req_ids,
        reference.decode_context_lens,
        reference.decode_draft_room,
        reference.prefill_req_ids,
        reference.prefill_chunk_lens,
        reference.prefill_completes,
        reference.new_req_ids,
        reference.preempted_req_ids,
        reference.finished_req_ids,
    )
    assert got == want, f"plan differs from the reference:\n  scheduler {got}\n  reference {want}"


def _compare_batches(batch: ScheduledBatch, reference: ReferenceBatch) -> None:
    got = (
        batch.req_ids.tolist(),
        batch.num_decode_reqs,
        batch.num_scheduled_tokens.tolist(),
        batch.num_spec_tokens.tolist(),
        batch.num_computed_tokens.tolist(),
        batch.num_output_tokens.tolist(),
        batch.completes_prompt.tolist(),
    )
    want = (
        reference.req_ids,
        reference.num_decode_reqs,
        reference.num_scheduled_tokens,
        reference.num_spec_tokens,
        reference.num_computed_tokens,
        reference.num_output_tokens,
        reference.completes_prompt,
    )
    assert got == want, f"batch differs from the reference:\n  scheduler {got}\n  reference {want}"


def make_scheduler_machine(
    configs: st.SearchStrategy[SchedulerConfig] | None = None,
    policy_factory: PolicyFactory | None = None,
    executor_factory: ExecutorFactory | None = None,
    use_reference: bool = True,
    name: str = "SchedulerMachine",
) -> type[SchedulerMachine]:
    """A SchedulerMachine subclass with its own configs, policy and executor.

    Its `.TestCase` is a unittest class pytest collects; set `.TestCase.settings` to choose
    max_examples and stateful_step_count.
    """
    attributes: dict[str, Any] = {
        "configs": configs if configs is not None else scheduler_configs(),
        "policy_factory": staticmethod(policy_factory) if policy_factory else None,
        "executor_factory": staticmethod(executor_factory) if executor_factory else None,
        "use_reference": use_reference,
    }
    return type(name, (SchedulerMachine,), attributes)
