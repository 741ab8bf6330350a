"""A naive reference scheduler: the documented semantics of `sim.scheduler`, spelled out slowly.

Same call protocol as `sim.scheduler.Scheduler` (`add_request`, `abort`, `plan_step`,
`commit_step`, `update`), same rules (FCFS, greedy token budget in running order, drafts trimmed
before a decode row is dropped, the K fixed at the row's previous step under next-step K
timing (vLLM's one-step lag, sync and async) and a `k_max` draft reserve released at commit
under same-step K timing, KV blocks of `block_size` from a fixed pool, preempt-the-last by
recompute, optimistic accounting with rollback of rejected drafts, never beyond
`max_tokens`/`max_model_len`).
It is written for obviousness, not speed: one Python object per request, block *ids* held in
lists and handed out one block at a time, output tokens appended one by one with a stop check
after each, placeholders kept per in-flight step. The property-test machine (`sim.testing.machine`)
runs it beside the real scheduler on the same calls and demands identical plans, batches and
results.

What this module deliberately does not do: anything fast, numpy, time, or any feature the real
scheduler lacks. Nothing in the simulator or the engine imports it; it exists for tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dsd.sim.scheduler import SchedulerConfig
from dsd.traces.workload import RequestSpec


@dataclass
class ReferenceRequest:
    """One request's whole state, in plain Python."""

    req_id: int  # the caller's id
    prompt_len: int  # prompt tokens
    max_output: int  # min(max_tokens, max_model_len - prompt_len): output tokens it may emit
    state: str = "waiting"  # "waiting" | "running" | "finished" (finished or aborted)
    num_computed: int = 0  # tokens in the KV cache (optimistic: in-flight drafts included)
    num_output: int = 0  # confirmed output tokens
    blocks: list[int] = field(default_factory=list)  # ids of the KV blocks it holds
    blocks_before_plan: int = 0  # len(blocks) when the pending plan started
    in_prefill: bool = True  # computing its prompt (or prompt + outputs after a preemption)
    prefill_end: int = 0  # tokens the current prefill covers
    pending_k: int = 0  # next-step K: K chosen at its last step, used at its next decode step
    num_preemptions: int = 0  # times preempted: an in-flight step of an older life is stale
    inflight: dict[int, int] = field(default_factory=dict)  # step_index -> placeholders

    @property
    def num_placeholders(self) -> int:
        """Output tokens of steps in flight (unknown until their outcomes arrive)."""
        return sum(self.inflight.values())


@dataclass(frozen=True)
class ReferencePlan:
    """The rows of one step before K is chosen (lists, running order then admission order)."""

    step_index: int  # index the step will have
    decode_req_ids: list[int]  # decode rows
    decode_context_lens: list[int]  # tokens in each decode row's KV cache before the step
    decode_draft_room: list[int]  # most drafts each decode row may carry
    prefill_req_ids: list[int]  # prefill rows
    prefill_chunk_lens: list[int]  # prompt tokens each prefill row computes
    prefill_completes: list[bool]  # the chunk ends the prompt: the row samples a token
    new_req_ids: tuple[int, ...]  # admitted in this step
    preempted_req_ids: tuple[int, ...]  # preempted since the previous batch
    finished_req_ids: tuple[int, ...]  # finished or aborted since the previous batch


@dataclass(frozen=True)
class ReferenceBatch:
    """One committed step, row by row (decode rows first)."""

    step_index: int  # the step
    req_ids: list[int]  # [B]
    num_decode_reqs: int  # leading decode rows
    num_scheduled_tokens: list[int]  # [B] 1 + K (decode) or the chunk (prefill)
    num_spec_tokens: list[int]  # [B] K; 0 on prefill rows
    num_computed_tokens: list[int]  # [B] KV tokens before the step
    num_output_tokens: list[int]  # [B] confirmed outputs at commit
    completes_prompt: list[bool]  # [B]


@dataclass(frozen=True)
class ReferenceResult:
    """What one outcome did."""

    step_index: int  # the step
    req_ids: list[int]  # [B] as in the batch
    num_output_tokens: list[int]  # [B] output tokens appended per row
    finished_req_ids: tuple[int, ...]  # finished in this update, row order


@dataclass(frozen=True)
class _Row:
    """What update needs to remember about one row of a committed step."""

    request: ReferenceRequest  # the request object itself (not a reusable slot)
    num_preemptions: int  # the request's preemption count at commit
    is_decode: bool  # decode row (else prefill chunk)
    num_spec: int  # K of a decode row, 0 otherwise
    completes_prompt: bool  # prefill chunk that ends the prompt


class ReferenceScheduler:
    """Slow, obvious twin of `sim.scheduler.Scheduler` (same calls, list-based answers)."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.requests: dict[int, ReferenceRequest] = {}  # every request ever added
        self.waiting: list[ReferenceRequest] = []  # FCFS queue, front first
        self.running: list[ReferenceRequest] = []  # running order
        self.free_blocks: list[int] = list(range(config.num_kv_blocks))  # ids of free blocks
        self.inflight: dict[int, list[_Row]] = {}  # step_index -> rows of a committed step
        self.pending_plan: ReferencePlan | None = None
        self.pending_rows: tuple[list[tuple[ReferenceRequest, int]], ...] = ([], [])
        self.finished_since_last: list[int] = []
        self.preempted_since_last: list[int] = []
        self.step_index = 0
        self.num_preemptions = 0
        # Spec-decode counters, one position at a time.
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.drafted_at_pos = [0] * config.k_max
        self.accepted_at_pos = [0] * config.k_max

    # ------------------------------------------------------------------ KV blocks

    def _cover(self, request: ReferenceRequest, num_tokens: int) -> bool:
        """Hand out blocks one at a time until `num_tokens` fit; all-or-nothing."""
        block_size = self.config.block_size
        needed = 0
        while (len(request.blocks) + needed) * block_size < num_tokens:
            needed += 1
        if needed > len(self.free_blocks):
            return False
        for _ in range(needed):
            request.blocks.append(self.free_blocks.pop())
        return True

    def _with_lookahead(self, num_tokens: int) -> int:
        """Tokens a scheduled row's KV must cover: its own plus the drafter's lookahead slots
        (vLLM's num_lookahead_tokens), never past max_model_len."""
        return min(num_tokens + self.config.num_lookahead_tokens, self.config.max_model_len)

    def _shrink(self, request: ReferenceRequest, keep: int) -> None:
        """Give back blocks the request's computed tokens (and lookahead) no longer need, but
        keep at least `keep` blocks."""
        block_size = self.config.block_size
        while len(request.blocks) > keep and (
            len(request.blocks) - 1
        ) * block_size >= self._with_lookahead(request.num_computed):
            self.free_blocks.append(request.blocks.pop())

    def _free_all(self, request: ReferenceRequest) -> None:
        while request.blocks:
            self.free_blocks.append(request.blocks.pop())

    # ------------------------------------------------------------------ requests

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        if req_id in self.requests:
            raise ValueError(f"request {req_id} was already added")
        max_output = min(spec.output_len, self.config.max_model_len - spec.prompt_len)
        if max_output < 1:
            raise ValueError(f"request {req_id}: prompt leaves no room for output")
        request = ReferenceRequest(req_id, spec.prompt_len, max_output)
        request.prefill_end = spec.prompt_len
        self.requests[req_id] = request
        self.waiting.append(request)

    def abort(self, req_id: int) -> None:
        request = self.requests.get(req_id)
        if request is None or request.state == "finished":
            raise KeyError(f"request {req_id} is not waiting or running")
        self._finish(request)

    def _finish(self, request: ReferenceRequest) -> None:
        if request.state == "waiting":
            self.waiting.remove(request)
        else:
            self.running.remove(request)
        request.state = "finished"
        self._free_all(request)
        request.num_computed = 0
        self.finished_since_last.append(request.req_id)

    def _preempt(self, request: ReferenceRequest) -> None:
        self.running.remove(request)
        self._free_all(request)
        request.num_computed = 0
        request.in_prefill = True
        request.state = "waiting"
        request.num_preemptions += 1
        self.waiting.insert(0, request)
        self.num_preemptions += 1
        self.preempted_since_last.append(request.req_id)

    # ------------------------------------------------------------------ one step

    def plan_step(self) -> ReferencePlan | None:
        if self.pending_plan is not None:
            raise RuntimeError("plan_step called twice without commit_step")
        is_async = self.config.scheduling == "async"
        lagged = self.config.k_timing == "next-step"
        if not is_async and self.inflight:
            raise RuntimeError("sync scheduling: update the previous step before planning")
        if not self.running and not self.waiting:
            return None
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        slots = cfg.num_draft_slots  # budget every scheduled row takes beyond its tokens
        for request in self.running:
            request.blocks_before_plan = len(request.blocks)
        # no cap with one request in all (running + waiting): nobody to starve, as vLLM
        cap = cfg.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        # 1. What each running request gets from the budget, greedily in running order.
        wanted: list[tuple[ReferenceRequest, int]] = []  # running order
        for request in self.running:
            if request.in_prefill:
                want = request.prefill_end - request.num_computed
            else:
                # next-step K: the K this row verifies was fixed at its previous step
                want = 1 + (request.pending_k if lagged else cfg.k_max)
            if cap:
                want = min(want, cap)  # vLLM caps decode rows (their drafts) too
            want = min(want, cfg.max_model_len - 1 - request.num_computed)
            # vLLM's async rule: wait only for an in-flight step that surely ends the request
            # (it emits at least one token).
            saturated = (
                request.num_placeholders > 0 and request.num_output + 1 >= request.max_output
            )
            if is_async and not request.in_prefill and saturated:
                want = 0
            got = min(want, budget - slots) if want and budget > slots else 0
            if got:
                budget -= got + slots
            wanted.append((request, got))
        # 2. KV blocks in running order; preempt the last running request while short.
        preempted_now = False
        index = 0
        while index < len(self.running):
            request = self.running[index]
            got = wanted[index][1]
            covered = self._with_lookahead(request.num_computed + got)
            if got and not self._cover(request, covered):
                while True:
                    victim = self.running[-1]
                    self._preempt(victim)
                    wanted.pop()
                    preempted_now = True
                    if victim is request or self._cover(request, covered):
                        break
                if victim is request:
                    break
            index += 1
        decode_rows: list[tuple[ReferenceRequest, int]] = []
        prefill_rows: list[tuple[ReferenceRequest, int]] = []
        budget = cfg.max_num_batched_tokens
        for request, got in wanted:
            if got == 0:
                continue
            budget -= got + slots
            if request.in_prefill:
                prefill_rows.append((request, got))
            else:
                decode_rows.append((request, got))
        # 3. Admit waiting requests FCFS (none in a step that preempted).
        new_ids: list[int] = []
        if not preempted_now:
            for request in list(self.waiting):
                if budget <= slots or len(self.running) >= cfg.max_num_seqs:
                    break
                if request.num_placeholders:
                    continue  # outputs of an in-flight step unknown: cannot recompute yet
                target = request.prompt_len + request.num_output
                chunk = min(target, budget - slots)
                if cap:
                    chunk = min(chunk, cap)
                if chunk < target and not cfg.enable_chunked_prefill:
                    break
                # vLLM admits only if the pool holds the whole (re)prompt
                full = min(target, cfg.max_model_len)
                if -(-full // cfg.block_size) > len(self.free_blocks):
                    break
                if not self._cover(request, self._with_lookahead(chunk)):
                    break
                self.waiting.remove(request)
                self.running.append(request)
                request.state = "running"
                request.in_prefill = True
                request.prefill_end = target
                prefill_rows.append((request, chunk))
                new_ids.append(request.req_id)
                budget -= chunk + slots
        if not decode_rows and not prefill_rows:
            return None  # preemptions are reported with the next batch
        plan = ReferencePlan(
            step_index=self.step_index,
            decode_req_ids=[r.req_id for r, _ in decode_rows],
            decode_context_lens=[r.num_computed for r, _ in decode_rows],
            decode_draft_room=[got - 1 for _, got in decode_rows],
            prefill_req_ids=[r.req_id for r, _ in prefill_rows],
            prefill_chunk_lens=[chunk for _, chunk in prefill_rows],
            prefill_completes=[
                r.num_computed + chunk == r.prefill_end for r, chunk in prefill_rows
            ],
            new_req_ids=tuple(new_ids),
            preempted_req_ids=tuple(self.preempted_since_last),
            finished_req_ids=tuple(self.finished_since_last),
        )
        self.preempted_since_last = []
        self.finished_since_last = []
        self.pending_plan = plan
        self.pending_rows = (decode_rows, prefill_rows)
        return plan

    def commit_step(self, plan: ReferencePlan, k: int | Sequence[int]) -> ReferenceBatch:
        if plan is not self.pending_plan:
            raise RuntimeError("commit_step needs the plan returned by the last plan_step")
        cfg = self.config
        decode_rows, prefill_rows = self.pending_rows
        self.pending_plan = None
        if isinstance(k, int):
            k_rows = [min(max(k, 0), cfg.k_max)] * len(decode_rows)
            k_default = min(max(k, 0), cfg.k_max)
        else:
            if len(k) != len(decode_rows):
                raise ValueError(f"K per row has {len(k)} entries for {len(decode_rows)} rows")
            k_rows = [min(max(int(value), 0), cfg.k_max) for value in k]
            k_default = max(k_rows) if k_rows else 0
        step = plan.step_index
        rows: list[_Row] = []
        req_ids: list[int] = []
        scheduled: list[int] = []
        spec: list[int] = []
        computed_before: list[int] = []
        outputs: list[int] = []
        completes: list[bool] = []
        for (request, got), k_row in zip(decode_rows, k_rows, strict=True):
            draft_room = got - 1
            if cfg.k_timing == "next-step":
                num_spec = min(request.pending_k, draft_room)  # decided one step ago
                request.pending_k = k_row
            else:
                num_spec = min(k_row, draft_room)
            req_ids.append(request.req_id)
            scheduled.append(1 + num_spec)
            spec.append(num_spec)
            computed_before.append(request.num_computed)
            outputs.append(request.num_output)
            completes.append(False)
            request.num_computed += 1 + num_spec
            # same-step K: drop the unused part of the k_max reserve (not blocks held before)
            self._shrink(request, request.blocks_before_plan)
            request.inflight[step] = 1 + num_spec
            rows.append(_Row(request, request.num_preemptions, True, num_spec, False))
        for request, chunk in prefill_rows:
            done = request.num_computed + chunk == request.prefill_end
            req_ids.append(request.req_id)
            scheduled.append(chunk)
            spec.append(0)
            computed_before.append(request.num_computed)
            outputs.append(request.num_output)
            completes.append(done)
            request.num_computed += chunk
            if done:
                request.in_prefill = False
                request.inflight[step] = 1
                if cfg.k_timing == "next-step":
                    request.pending_k = k_default
            else:
                request.inflight[step] = 0
            rows.append(_Row(request, request.num_preemptions, False, 0, done))
        self.inflight[step] = rows
        self.step_index += 1
        return ReferenceBatch(
            step_index=step,
            req_ids=req_ids,
            num_decode_reqs=len(decode_rows),
            num_scheduled_tokens=scheduled,
            num_spec_tokens=spec,
            num_computed_tokens=computed_before,
            num_output_tokens=outputs,
            completes_prompt=completes,
        )

    def update(
        self, step_index: int, num_accepted: Sequence[int], stop_index: Sequence[int] | None
    ) -> ReferenceResult:
        rows = self.inflight.pop(step_index)
        decode = [row for row in rows if row.is_decode]
        if len(num_accepted) != len(decode):
            raise ValueError("one accepted count per decode row")
        emitted_per_row: list[int] = []
        finished: list[int] = []
        for index, row in enumerate(rows):
            request = row.request
            del request.inflight[step_index]
            live = request.state != "finished"
            if row.is_decode:
                accepted = int(num_accepted[index])
                if not 0 <= accepted <= row.num_spec:
                    raise ValueError("accepted outside [0, K]")
                if live and row.num_preemptions == request.num_preemptions:
                    # roll back rejected drafts; their blocks stay held (vLLM reuses them)
                    request.num_computed -= row.num_spec - accepted
                if live:
                    self._count(row.num_spec, accepted)
                new_tokens = accepted + 1
            else:
                new_tokens = 1 if row.completes_prompt else 0
            stop = -1 if stop_index is None else int(stop_index[index])
            emitted = 0
            done = False
            if live:
                for position in range(new_tokens):
                    if request.num_output >= request.max_output:
                        break
                    request.num_output += 1
                    emitted += 1
                    if position == stop:
                        done = True  # a stop token: the tokens after it are trimmed
                        break
                if request.num_output >= request.max_output:
                    done = True
            emitted_per_row.append(emitted)
            if done:
                self._finish(request)
                finished.append(request.req_id)
        return ReferenceResult(
            step_index=step_index,
            req_ids=[row.request.req_id for row in rows],
            num_output_tokens=emitted_per_row,
            finished_req_ids=tuple(finished),
        )

    def _count(self, num_spec: int, accepted: int) -> None:
        if num_spec > 0:
            self.num_drafts += 1
        self.num_draft_tokens += num_spec
        self.num_accepted_tokens += accepted
        for position in range(1, self.config.k_max + 1):
            if num_spec >= position:
                self.drafted_at_pos[position - 1] += 1
            if accepted >= position:
                self.accepted_at_pos[position - 1] += 1

    # ------------------------------------------------------------------ invariants

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def check_invariants(self) -> None:
        """Every block id is held once (by a running request) or free; nothing else holds any."""
        held: list[int] = []
        for request in self.requests.values():
            if request.state != "running":
                assert not request.blocks, f"request {request.req_id} holds blocks while idle"
            held.extend(request.blocks)
        every = sorted(held + self.free_blocks)
        assert every == list(range(self.config.num_kv_blocks)), "block ids lost or duplicated"
        for request in self.running:
            covered = request.num_computed
            if self.pending_plan is not None:
                rows = self.pending_rows[0] + self.pending_rows[1]
                covered += sum(got for r, got in rows if r is request)
            covered = self._with_lookahead(covered)
            needed = -(-covered // self.config.block_size)
            assert len(request.blocks) >= needed, (
                f"request {request.req_id} holds {len(request.blocks)} blocks for {covered} tokens"
            )
        for request in self.requests.values():
            assert 0 <= request.num_output <= request.max_output
            assert all(count >= 0 for count in request.inflight.values())
