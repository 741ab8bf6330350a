"""The continuous-batching scheduler with speculative decoding (vLLM v1 semantics).

Decides, step by step, which requests run and how many tokens each computes, keeps the KV block
accounting, and turns a step's outcome (accepted drafts, stop positions) into output tokens, in
three calls per step: `plan_step`, `commit_step(plan, k)`, `update(batch, outcome)`. State is
struct-of-arrays indexed by a reused request slot, so the all-decode step is a few numpy
operations. Planning, K timing (`next-step` / `same-step`), preemption and the differential test
against vLLM's own scheduler are in docs/simulator.md ("Scheduler").

It never computes time (durations come from the executor; the engine owns the clock), and does
no prefix caching, priorities other than FCFS, encoder inputs, structured output or LoRA.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dsd.common.arrays import BoolArray, IntArray
from dsd.common.errors import InputError, require_choice
from dsd.policies.types import K_TIMINGS, KTiming, SchedulingMode, StepView
from dsd.sim.kv import KVBlockPool, cdiv
from dsd.sim.types import ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec

# Slot states.
_FREE = 0  # unused slot
_WAITING = 1  # in the waiting queue (new, or preempted)
_RUNNING = 2  # in the running set
_DRAINING = 3  # finished, but a step that scheduled it is still in flight (async)

# Finishing at most this many running requests removes them one by one (each a scan in C);
# more, in one Python pass over the running order.
_FEW_FINISHED = 8

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY_BOOL = np.zeros(0, dtype=np.bool_)

# vLLM 0.33's drafting methods, by what they make its scheduler reserve (K = k_max):
# (KV lookahead slots per scheduled row, extra input-budget slots per scheduled row).
# ngram drafts from the tokens alone; drafters with a forward pass of their own write KV past
# the target's query (lookahead K); a draft model's input keeps one unsliced token (1 slot),
# parallel drafting adds masked query rows (PARD: K, P-EAGLE: K - 1).
SPECULATIVE_METHODS: tuple[str, ...] = (
    "ngram",
    "eagle",
    "eagle3",
    "mtp",
    "draft_model",
    "pard",
    "p-eagle",
)


def drafter_reservations(method: str, k_max: int) -> tuple[int, int]:
    """(num_lookahead_tokens, draft slots per row) vLLM reserves for `method` at `k_max`."""
    require_choice(method, "speculative_method", SPECULATIVE_METHODS)
    if k_max == 0 or method == "ngram":
        return 0, 0  # no SpeculativeConfig at K = 0; ngram writes no KV of its own
    slots = {"draft_model": 1, "pard": k_max, "p-eagle": k_max - 1}.get(method, 0)
    return k_max, slots


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler limits, named like vLLM's engine arguments."""

    # Largest context (prompt + output tokens) of a request, tokens.
    max_model_len: int
    # KV blocks in the pool (vLLM's num_gpu_blocks); must hold one max_model_len request.
    num_kv_blocks: int
    # Largest K (vLLM's num_speculative_tokens); 0 disables drafts.
    k_max: int = 0
    # Most requests in the running set.
    max_num_seqs: int = 256
    # Most tokens computed in one step (decode rows with drafts + prefill chunks).
    max_num_batched_tokens: int = 8192
    # Tokens per KV block.
    block_size: int = 16
    # "sync": plan after the previous outcome; "async": plan step t+1 while step t is in flight.
    scheduling: SchedulingMode = "sync"
    # Prompts may be computed over several steps.
    enable_chunked_prefill: bool = True
    # > 0: a row schedules at most this many tokens, prefill chunk or decode row with its
    # drafts (vLLM's long_prefill_token_threshold), unless only one request is running or
    # waiting in all (vLLM lifts the cap then).
    long_prefill_token_threshold: int = 0
    # When the K chosen at a step is verified: "next-step" (vLLM, sync and async) or
    # "same-step" (sync only: the policy's K is this step's).
    k_timing: KTiming = "next-step"
    # vLLM's speculative method (SPECULATIVE_METHODS): what KV lookahead and per-row draft
    # slots its scheduler reserves beside the scheduled tokens (`drafter_reservations`).
    speculative_method: str = "ngram"

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise InputError(f"scheduler: max_model_len must be >= 2, got {self.max_model_len}")
        if self.k_max < 0:
            raise InputError(f"scheduler: k_max must be >= 0, got {self.k_max}")
        if self.max_num_seqs < 1:
            raise InputError(f"scheduler: max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise InputError(
                f"scheduler: max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.block_size < 1:
            raise InputError(f"scheduler: block_size must be >= 1, got {self.block_size}")
        if self.scheduling not in ("sync", "async"):
            raise InputError(
                f"scheduler: scheduling must be 'sync' or 'async', got {self.scheduling!r}"
            )
        if self.k_timing not in K_TIMINGS:
            raise InputError(
                f"scheduler: k_timing must be 'next-step' or 'same-step', got {self.k_timing!r}"
            )
        if self.k_timing == "same-step" and self.scheduling == "async":
            raise InputError(
                "scheduler: k_timing same-step needs sync scheduling (async plans a step "
                "before the previous one's drafts exist)"
            )
        require_choice(
            self.speculative_method, "scheduler: speculative_method", SPECULATIVE_METHODS
        )
        if self.long_prefill_token_threshold < 0:
            raise InputError(
                "scheduler: long_prefill_token_threshold must be >= 0, "
                f"got {self.long_prefill_token_threshold}"
            )
        if self.num_kv_blocks * self.block_size < self.max_model_len:
            raise InputError(
                f"scheduler: num_kv_blocks ({self.num_kv_blocks}) x block_size "
                f"({self.block_size}) must hold one max_model_len ({self.max_model_len}) request"
            )
        if self.max_num_batched_tokens <= self.num_lookahead_tokens:
            # vLLM refuses it too; the lookahead is at least the per-row draft slots
            raise InputError(
                f"scheduler: max_num_batched_tokens ({self.max_num_batched_tokens}) must exceed "
                f"the {self.num_lookahead_tokens} lookahead slots of {self.speculative_method} "
                f"at K={self.k_max}"
            )
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens < self.max_model_len + self.num_draft_slots
        ):
            # a whole prompt and its row's draft slots must fit one step, or it waits forever
            slots = f" + {self.num_draft_slots} draft slots" if self.num_draft_slots else ""
            raise InputError(
                "scheduler: without chunked prefill max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}){slots}"
            )
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            # A capped prompt is a chunk: without chunking it would wait forever.
            raise InputError(
                "scheduler: long_prefill_token_threshold "
                f"({self.long_prefill_token_threshold}) needs enable_chunked_prefill"
            )

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past every scheduled row's tokens (vLLM's num_lookahead_tokens)."""
        return drafter_reservations(self.speculative_method, self.k_max)[0]

    @property
    def num_draft_slots(self) -> int:
        """Input-budget slots each scheduled row takes beyond its tokens (vLLM's
        max_num_new_slots_for_drafting)."""
        return drafter_reservations(self.speculative_method, self.k_max)[1]


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The requests chosen for one step, before K is known. Pass it back to `commit_step`."""

    step_index: int  # index the step will have
    decode_req_ids: IntArray  # [D] decode rows, running order
    decode_context_lens: IntArray  # [D] tokens in each decode row's KV cache before the step
    decode_draft_room: IntArray  # [D] most drafts each decode row may get (budget, model len)
    prefill_req_ids: IntArray  # [P] prefill rows, running order then admission order
    prefill_chunk_lens: IntArray  # [P] prompt tokens each prefill row computes
    prefill_completes: BoolArray  # [P] the chunk ends the prompt: the row samples a token
    new_req_ids: tuple[int, ...]  # admitted from the waiting queue in this step
    preempted_req_ids: tuple[int, ...]  # preempted (by recompute) since the previous batch
    finished_req_ids: tuple[int, ...]  # finished or aborted since the previous step
    decode_slots: IntArray  # [D] scheduler slots of the decode rows (internal)
    prefill_slots: IntArray  # [P] scheduler slots of the prefill rows (internal)

    @property
    def num_decode_reqs(self) -> int:
        return int(self.decode_req_ids.shape[0])

    @property
    def batch_size(self) -> int:
        """B: decode rows plus prefill rows."""
        return int(self.decode_req_ids.shape[0] + self.prefill_req_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens in the step before drafts (one per decode row plus the prefill chunks)."""
        if not self.prefill_chunk_lens.shape[0]:
            return int(self.decode_req_ids.shape[0])
        return int(self.decode_req_ids.shape[0] + int(self.prefill_chunk_lens.sum()))

    def view(self, time_s: float, config: SchedulerConfig) -> StepView:
        """The policy's view of this step."""
        # Runs every step: the properties inlined.
        num_decode = self.decode_req_ids.shape[0]
        num_prefill = self.prefill_req_ids.shape[0]
        num_tokens = num_decode + int(self.prefill_chunk_lens.sum()) if num_prefill else num_decode
        return StepView(
            step_index=self.step_index,
            time_s=time_s,
            batch_size=num_decode + num_prefill,
            num_decode_reqs=num_decode,
            req_ids=self.decode_req_ids,
            context_lens=self.decode_context_lens,
            k_max=config.k_max,
            scheduling=config.scheduling,
            k_timing=config.k_timing,
            num_tokens=num_tokens,
        )


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step's outcome did to the requests, per row of its ScheduledBatch."""

    step_index: int  # the step
    req_ids: IntArray  # [B] == batch.req_ids
    num_output_tokens: IntArray  # [B] output tokens emitted this step, after trimming (>= 0)
    finished_req_ids: tuple[int, ...]  # requests that finished in this step (length or stop)
    num_accepted_tokens: int  # accepted drafts summed over the decode rows, before trimming


@dataclass
class SpecDecodeStats:
    """vLLM-style spec-decode counters, plus drafted_at_pos (K varies between steps).

    Kept as two histograms over the decode rows (of K, and of accepted drafts): a step adds two
    bincounts, and every counter is read off them (a suffix sum gives the rows with K >= i)."""

    k_max: int
    # [k_max + 1] decode rows per K (drafts verified), and per accepted count
    k_histogram: IntArray = field(default_factory=lambda: _EMPTY.copy())
    accepted_histogram: IntArray = field(default_factory=lambda: _EMPTY.copy())

    def __post_init__(self) -> None:
        if self.k_histogram.shape[0] != self.k_max + 1:
            self.k_histogram = np.zeros(self.k_max + 1, dtype=np.int64)
        if self.accepted_histogram.shape[0] != self.k_max + 1:
            self.accepted_histogram = np.zeros(self.k_max + 1, dtype=np.int64)

    def observe(self, num_spec_tokens: IntArray, num_accepted: IntArray) -> None:
        """Count the decode rows of one step ([n] K and accepted per row, each <= k_max)."""
        if num_spec_tokens.shape[0] == 0:
            return
        self.k_histogram = _counted(self.k_histogram, num_spec_tokens)
        self.accepted_histogram = _counted(self.accepted_histogram, num_accepted)

    @property
    def num_drafts(self) -> int:
        """Decode rows that carried >= 1 draft."""
        return int(self.k_histogram[1:].sum())

    @property
    def num_draft_tokens(self) -> int:
        """Sum of K over the decode rows."""
        return int(self.k_histogram @ np.arange(self.k_histogram.shape[0]))

    @property
    def num_accepted_tokens(self) -> int:
        """Sum of accepted drafts (before stop trimming)."""
        return int(self.accepted_histogram @ np.arange(self.accepted_histogram.shape[0]))

    @property
    def drafted_at_pos(self) -> IntArray:
        """[k_max] rows that drafted at least i+1 tokens."""
        return _at_least(self.k_histogram, self.k_max)

    @property
    def accepted_at_pos(self) -> IntArray:
        """[k_max] rows whose first i+1 drafts were all accepted."""
        return _at_least(self.accepted_histogram, self.k_max)

    @property
    def acceptance_length(self) -> float:
        """1 + accepted / num_drafts (vLLM's mean acceptance length); NaN without drafts."""
        num_drafts = self.num_drafts
        if num_drafts == 0:
            return float("nan")
        return 1.0 + self.num_accepted_tokens / num_drafts


def _filled(size: int, value: int) -> IntArray:
    """[size] int64 array of `value` (np.full is several times slower on small arrays)."""
    array = np.empty(size, dtype=np.int64)
    array.fill(value)
    return array


def split_k(k: int | IntArray, num_decode: int, k_max: int) -> tuple[IntArray | None, int]:
    """A policy's answer for `num_decode` decode rows, clamped to [0, k_max]: (None, K) for one
    K for every row, else (K per row, their largest: what prefill-completing rows draft)."""
    if isinstance(k, int | np.integer):
        return None, min(max(int(k), 0), k_max)
    k_rows = np.asarray(k, dtype=np.int64)  # [D]
    if k_rows.shape != (num_decode,):
        raise ValueError(f"policy returned K of shape {k_rows.shape}, expected ({num_decode},)")
    k_rows = np.clip(k_rows, 0, k_max)
    return k_rows, int(k_rows.max()) if num_decode else 0


def outcome_accepted(step_index: int, outcome: StepOutcome, num_decode: int) -> IntArray:
    """[D] an outcome's accepted drafts per decode row; ValueError unless one per decode row."""
    accepted = np.asarray(outcome.num_accepted, dtype=np.int64)  # [D]
    if accepted.shape != (num_decode,):
        raise ValueError(
            f"outcome of step {step_index}: num_accepted has shape {accepted.shape}, "
            f"expected ({num_decode},)"
        )
    return accepted


def _greedy_budget(want: IntArray, budget: int, draft_slots: int) -> IntArray:
    """[R] tokens each row gets, in order, when a scheduled row also takes `draft_slots` of the
    budget (vLLM's input budget): min(want, what is left - draft_slots), 0 once that is <= 0;
    a row that wants nothing takes nothing."""
    cost = want + draft_slots * (want > 0)  # [R]
    used_before = np.cumsum(cost) - cost  # [R]
    got: IntArray = np.clip(budget - used_before - draft_slots, 0, want)
    return got


def _counted(histogram: IntArray, values: IntArray) -> IntArray:
    """`histogram` (in place where it is long enough) plus the counts of `values` (>= 0)."""
    counts = np.bincount(values, minlength=histogram.shape[0])
    if counts.shape[0] > histogram.shape[0]:  # a value past k_max (e.g. a foreign executor's)
        counts[: histogram.shape[0]] += histogram
        return counts
    histogram += counts
    return histogram


def _at_least(histogram: IntArray, k_max: int) -> IntArray:
    """[k_max] number of values >= i for i = 1..k_max, from a histogram of them (values past
    k_max count at every i)."""
    at_least: IntArray = np.cumsum(histogram[::-1])[::-1][1 : k_max + 1]
    return at_least


@dataclass(frozen=True, slots=True)
class _CommittedStep:
    """What `update` needs to know about a committed step (kept until its outcome arrives)."""

    slots: IntArray  # [B] scheduler slots, batch row order
    epochs: IntArray  # [B] preemption count of each slot at commit time
    num_decode_reqs: int
    num_spec_tokens: IntArray  # [D] K per decode row
    completes_prompt: BoolArray  # [B] rows that sample their first token after a prefill
    placeholders: IntArray  # [B] placeholders added at commit: 1 + K, 1 or 0
    # K of every decode row when they all have the same K (known without a reduction), else -1
    uniform_k: int
    # Scheduler._num_events when the step was planned: unchanged at update means no request
    # of the step finished, was aborted or preempted since, so every row is still live.
    num_events_at_plan: int


class Scheduler:
    """vLLM v1 style scheduler; see the module docstring for the call protocol."""

    def __init__(self, config: SchedulerConfig, capacity: int = 64) -> None:
        self.config = config
        self.kv = KVBlockPool(config.num_kv_blocks, config.block_size, capacity)
        self.spec_stats = SpecDecodeStats(config.k_max)
        self._async = config.scheduling == "async"
        # The K a row verifies was fixed at its previous step (stored per slot in _pending_k).
        self._lagged = config.k_timing == "next-step"
        # vLLM's drafter reservations per scheduled row: KV slots past its tokens, and budget
        self._lookahead = config.num_lookahead_tokens
        self._draft_slots = config.num_draft_slots
        capacity = max(capacity, 1)
        # Struct of arrays, one entry per slot.
        self._req_id = np.full(capacity, -1, dtype=np.int64)  # [S] request id in the slot
        self._state = np.zeros(capacity, dtype=np.int8)  # [S] _FREE/_WAITING/_RUNNING/_DRAINING
        self._prompt_len = np.zeros(capacity, dtype=np.int64)  # [S] prompt tokens
        self._max_output = np.zeros(capacity, dtype=np.int64)  # [S] min(max_tokens, model room)
        self._num_computed = np.zeros(capacity, dtype=np.int64)  # [S] optimistic, drafts incl.
        self._num_output = np.zeros(capacity, dtype=np.int64)  # [S] confirmed output tokens
        self._num_placeholders = np.zeros(capacity, dtype=np.int64)  # [S] in-flight outputs
        self._in_prefill = np.zeros(capacity, dtype=np.bool_)  # [S] computing a (re)prompt
        self._prefill_end = np.zeros(capacity, dtype=np.int64)  # [S] tokens the prefill covers
        self._pending_k = np.zeros(capacity, dtype=np.int64)  # [S] async: K for the next step
        self._epoch = np.zeros(capacity, dtype=np.int64)  # [S] preemptions so far
        self._free_slots: list[int] = list(range(capacity - 1, -1, -1))
        self._slot_of: dict[int, int] = {}
        self._waiting: deque[int] = deque()
        self._running: list[int] = []
        self._running_array: IntArray | None = None  # cache of _running as an array
        self._draining: list[int] = []
        self._inflight: dict[int, _CommittedStep] = {}
        self._pending_plan: StepPlan | None = None
        self._finished_since_last: list[int] = []
        self._preempted_since_last: list[int] = []
        self._step_index = 0
        self.num_preemptions = 0
        # Finishes, aborts and preemptions so far: a step whose requests saw none of these
        # between plan and update takes the fast path of `update`.
        self._num_events = 0
        # Set by plan_step for commit_step: every decode row got the same full 1 + K tokens
        # (same-step K: K = k_max; next-step K: the K they all hold).
        self._pending_full_room = False
        self._uniform_pending_k = 0  # next-step K: the K all running rows hold, -1 if they differ
        self._held_before_plan = np.zeros(0, dtype=np.int64)  # [S] same-step K only
        self._pending_num_events = 0

    # ------------------------------------------------------------------ requests

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        """Queue a request at the back of the waiting queue."""
        self.add_requests([req_id], [spec])

    def add_requests(self, req_ids: Sequence[int], specs: Sequence[RequestSpec]) -> None:
        """Queue requests, in order, at the back of the waiting queue (all or none)."""
        cfg = self.config
        count = len(req_ids)
        if len(specs) != count:
            raise ValueError(f"{count} request ids for {len(specs)} specs")
        if count == 0:
            return
        for req_id, spec in zip(req_ids, specs, strict=True):
            if req_id in self._slot_of:
                raise ValueError(f"request {req_id} is already in the scheduler")
            if spec.prompt_len >= cfg.max_model_len:
                raise InputError(
                    f"request {req_id}: prompt_len {spec.prompt_len} leaves no room for output "
                    f"tokens within max_model_len {cfg.max_model_len}"
                )
        if len(set(req_ids)) != count:
            raise ValueError("request ids repeat")
        while len(self._free_slots) < count:
            self._grow(2 * self._state.shape[0])
        free = self._free_slots
        taken = free[len(free) - count :][::-1]  # popped from the end, in pop order
        del free[len(free) - count :]
        self._slot_of.update(zip(req_ids, taken, strict=True))
        # One request: plain int indices (numpy's scalar writes are several times cheaper
        # than writes through a one-element index array); more: index arrays.
        slots: int | IntArray
        ids: int | IntArray
        if count == 1:
            slots, ids = taken[0], req_ids[0]
            prompt: int | IntArray = specs[0].prompt_len
            output: int | IntArray = specs[0].output_len
        else:
            slots, ids = np.array(taken, dtype=np.int64), np.asarray(req_ids, dtype=np.int64)
            prompt = np.fromiter((spec.prompt_len for spec in specs), np.int64, count)
            output = np.fromiter((spec.output_len for spec in specs), np.int64, count)
        self._req_id[slots] = ids
        self._state[slots] = _WAITING
        self._prompt_len[slots] = prompt
        self._max_output[slots] = np.minimum(output, cfg.max_model_len - prompt)
        self._num_computed[slots] = 0
        self._num_output[slots] = 0
        self._num_placeholders[slots] = 0
        self._in_prefill[slots] = True
        self._prefill_end[slots] = prompt
        self._pending_k[slots] = 0
        self._epoch[slots] = 0
        self._waiting.extend(taken)

    def abort(self, req_id: int) -> None:
        """Drop a waiting or running request; its blocks are freed now."""
        slot = self._slot_of.get(req_id)
        if slot is None or self._state[slot] == _DRAINING:
            raise KeyError(f"request {req_id} is not waiting or running")
        self._finish_rows(np.array([slot], dtype=np.int64))

    def has_unfinished(self) -> bool:
        """Requests waiting or running (finished ones still in flight do not count)."""
        return bool(self._running or self._waiting)

    def has_inflight(self) -> bool:
        """Committed steps whose outcome has not been applied."""
        return bool(self._inflight)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def num_output_tokens(self, req_id: int) -> int:
        """Confirmed output tokens of a request that is still in the scheduler."""
        return int(self._num_output[self._slot_of[req_id]])

    def running_positions(self, batch: ScheduledBatch) -> ScheduledBatch:
        """`batch` with its rows' confirmed output tokens as of now. Async scheduling plans a
        step before the previous one's outcome is known, and runs it after: it runs at these
        positions, not at the ones it was planned with (what acceptance is keyed on)."""
        positions = self._num_output[self._inflight[batch.step_index].slots]  # [B]
        return replace(batch, num_output_tokens=positions)

    # ------------------------------------------------------------------ steady decode

    def plain_decode_steps_ahead(self) -> int:
        """Steps the running set can take next, each exactly as `plan_step`, a K = 0
        `commit_step` and an `update` with nothing accepted would run them, in which nothing
        happens but one output token per row: no admission, finish, preemption, budget, room
        or KV shortage. 0 where that cannot be guaranteed (then run steps one by one).

        Sync scheduling without drafter reservations only; the caller guarantees that the
        policy answers K = 0 at every one of these steps (under next-step K timing every row
        must also hold K = 0 already) and that no request is sent meanwhile.
        `advance_plain_decode` then applies them."""
        cfg = self.config
        if (
            self._async
            or (self._lagged and self._uniform_pending_k != 0)
            or self._lookahead
            or self._draft_slots
            or not self._running
            or self._waiting
            or self._inflight
            or self._pending_plan is not None
            or self._draining
            or self._finished_since_last
            or self._preempted_since_last
        ):
            return 0
        run = self._running_array
        if run is None:
            run = self._running_array = np.array(self._running, dtype=np.int64)  # [R]
        if np.count_nonzero(self._in_prefill[run]):
            return 0
        # What plan_step reserves per row: 1 + K (next-step K: the K = 0 the rows hold), or
        # 1 + k_max (same-step K; commit releases the drafts' part). All rows must fit the
        # budget with it, so none is dropped. (A row near max_model_len or the threshold gets
        # less, never nothing, and K = 0 leaves the same state: no check needed for those.)
        drafts = 0 if self._lagged else cfg.k_max
        if run.shape[0] * (1 + drafts) > cfg.max_num_batched_tokens:
            return 0
        computed = self._num_computed[run]  # [R]
        # No row reaches max_tokens (nor so max_model_len): the step where one does runs the
        # usual way.
        steps = int(np.minimum.reduce(self._max_output[run] - self._num_output[run])) - 1
        if steps <= 0:
            return 0
        # KV: each step reserves 1 + drafts tokens past the row, the last step the most.
        reserved = self.kv.blocks_for(computed + (steps + drafts))  # [R]
        held = self.kv.num_held[run]  # [R]
        shortfall = int(np.add.reduce(np.maximum(reserved - held, 0)))
        return steps if shortfall <= self.kv.num_free_blocks else 0

    def advance_plain_decode(self, num_steps: int) -> tuple[IntArray, int]:
        """Apply `num_steps` <= `plain_decode_steps_ahead()` plain decode steps at once:
        every running row computes and emits one token per step; a row's blocks end as the
        steps leave them (the blocks of the last step's reserve beyond its tokens released, but
        none held before). Returns the rows' request ids [R] and the first step's index."""
        run = self._running_array
        assert run is not None and num_steps >= 1, "plain_decode_steps_ahead() first"
        computed = self._num_computed[run] + num_steps  # [R]
        self._num_computed[run] = computed
        self._num_output[run] += num_steps
        held = self.kv.num_held[run]  # [R]
        target = np.maximum(self.kv.blocks_for(computed), held)  # [R]
        self.kv.num_free_blocks -= int(np.add.reduce(target)) - int(np.add.reduce(held))
        self.kv.num_held[run] = target
        first_step = self._step_index
        self._step_index += num_steps
        return self._req_id[run], first_step

    # ------------------------------------------------------------------ one step

    def plan_step(self) -> StepPlan | None:
        """Choose the rows of the next step (see module docstring); None: nothing to run."""
        if self._pending_plan is not None:
            raise RuntimeError("plan_step called twice without commit_step")
        if not self._async and self._inflight:
            raise RuntimeError("sync scheduling: update the previous step before planning")
        if not self._running and not self._waiting:
            return None
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        draft_slots = self._draft_slots
        # vLLM's long_prefill_token_threshold caps every running row's new tokens (a decode
        # row's drafts too) and admission chunks; it is lifted when one request is running or
        # waiting in all: there is nobody to starve.
        prefill_cap = (
            cfg.long_prefill_token_threshold if len(self._running) + len(self._waiting) > 1 else 0
        )
        if not self._lagged:
            # what each slot held before this plan's reserve (commit never releases below it)
            self._held_before_plan = self.kv.num_held.copy()  # [S]
        preempted: list[int] = []
        decode_slots = _EMPTY
        decode_rows_got = _EMPTY
        running_prefill_slots = _EMPTY
        running_prefill_chunks = _EMPTY
        full_room = False  # every decode row got 1 + full_k tokens
        full_k = cfg.k_max  # the K every decode row wants on the fast path
        decode_context_lens: IntArray | None = None

        if self._running:
            run = self._running_array
            if run is None:
                run = self._running_array = np.array(self._running, dtype=np.int64)  # [R]
            computed = self._num_computed[run]  # [R]
            in_prefill = self._in_prefill[run]  # [R]
            any_prefill = bool(np.count_nonzero(in_prefill))  # cheaper than .any()
            num_rows = run.shape[0]
            # vLLM keeps positions < max_model_len (matters with drafts near the end).
            # All-decode fast check: every row wants the same 1 + K (same-step: K = k_max;
            # next-step: the K every running row holds, when the last step gave them all one),
            # no row is near max_model_len, and the budget and the threshold allow it.
            full_k = self._uniform_pending_k if self._lagged else cfg.k_max
            full_room = (
                full_k >= 0
                and not any_prefill
                and not (prefill_cap and prefill_cap < 1 + full_k)
                and num_rows * (1 + full_k + draft_slots) <= budget
                and int(np.maximum.reduce(computed)) + 1 + full_k <= cfg.max_model_len - 1
            )
            # Next-step K (vLLM): it was fixed at the row's previous step, so the row wants
            # exactly 1 + that K, as vLLM budgets the drafts it already has. Same-step K: it is
            # asked after the plan, so a decode row reserves 1 + k_max (commit releases the rest).
            decode_want: int | IntArray = 1 + cfg.k_max
            if self._lagged and not full_room:
                decode_want = 1 + self._pending_k[run]
            if full_room:
                want = _filled(num_rows, 1 + full_k)  # [R]
            elif any_prefill:
                room = cfg.max_model_len - 1 - computed  # [R]
                want = np.where(in_prefill, self._prefill_end[run] - computed, decode_want)
                np.minimum(want, room, out=want)  # [R]
            else:
                want = np.minimum(cfg.max_model_len - 1 - computed, decode_want)  # [R]
            if prefill_cap and not full_room:
                np.minimum(want, prefill_cap, out=want)
            # vLLM's async rule: a request with a step in flight that will reach max_tokens
            # even if all its drafts are rejected (confirmed outputs + 1 >= max_tokens) waits
            # for that outcome; one that only might reach it (all drafts accepted) is
            # scheduled, and its row emits nothing if the in-flight step finished it (sync
            # mode: nothing is in flight here).
            if self._async:
                saturated = (
                    ~in_prefill
                    & (self._num_placeholders[run] > 0)
                    & (self._num_output[run] + 1 >= self._max_output[run])
                )
                if np.count_nonzero(saturated):
                    want[saturated] = 0
                    full_room = False
            # Greedy token budget in running order: each row takes min(want, what is left).
            if full_room:
                got = want  # R * (1 + k_max) fits the budget
            elif draft_slots:
                got = _greedy_budget(want, budget, draft_slots)
            else:
                cum = np.cumsum(want)  # [R]
                if cum[-1] <= budget:
                    got = want
                else:
                    np.minimum(cum, budget, out=cum)
                    got = cum.copy()
                    got[1:] -= cum[:-1]
            covered = computed + got  # [R]
            if self._lookahead:
                # vLLM's allocate_slots: lookahead slots past a scheduled row, within the model
                covered = np.where(got > 0, self._with_lookahead(covered), covered)
            if not self.kv.try_cover_many(run, covered):
                run, got, preempted = self._cover_with_preemption(run, got, covered)
                computed = self._num_computed[run]
                in_prefill = self._in_prefill[run]
                full_room = False
            if full_room:
                budget -= num_rows * (1 + full_k + draft_slots)
            else:
                budget -= int(got.sum())
                if draft_slots:
                    budget -= draft_slots * int(np.count_nonzero(got))
            if full_room or (not any_prefill and not preempted and got.all()):
                decode_slots, decode_rows_got = run, got  # the all-decode hot path
                decode_context_lens = computed
            else:
                scheduled = got > 0  # [R']
                decode_mask = scheduled & ~in_prefill
                prefill_mask = scheduled & in_prefill
                decode_slots = run[decode_mask]
                decode_rows_got = got[decode_mask]
                if prefill_mask.any():
                    running_prefill_slots = run[prefill_mask]
                    running_prefill_chunks = got[prefill_mask]

        new_slots: list[int] = []
        new_chunks: list[int] = []
        # vLLM admits nothing in a step that preempted.
        if self._waiting and not preempted:
            budget = self._admit(budget, new_slots, new_chunks, prefill_cap)

        if preempted:
            self._preempted_since_last.extend(int(self._req_id[s]) for s in preempted)
        if decode_slots.shape[0] == 0 and running_prefill_slots.shape[0] == 0 and not new_slots:
            # Possible in async mode only: the rows that fit are waiting for their in-flight
            # outcome. The preemptions are reported with the next batch.
            return None

        if new_slots:
            prefill_slots = np.concatenate(
                [running_prefill_slots, np.array(new_slots, dtype=np.int64)]
            )
            prefill_chunks = np.concatenate(
                [running_prefill_chunks, np.array(new_chunks, dtype=np.int64)]
            )
        else:
            prefill_slots, prefill_chunks = running_prefill_slots, running_prefill_chunks
        prefill_completes = (
            self._num_computed[prefill_slots] + prefill_chunks == self._prefill_end[prefill_slots]
            if prefill_slots.shape[0]
            else _EMPTY_BOOL
        )
        finished = tuple(self._finished_since_last)
        self._finished_since_last.clear()
        preempted_ids = tuple(self._preempted_since_last)
        self._preempted_since_last.clear()
        plan = StepPlan(
            step_index=self._step_index,
            decode_req_ids=self._req_id[decode_slots],
            decode_context_lens=(
                self._num_computed[decode_slots]
                if decode_context_lens is None
                else decode_context_lens
            ),
            decode_draft_room=(
                _filled(decode_slots.shape[0], full_k) if full_room else decode_rows_got - 1
            ),
            prefill_req_ids=self._req_id[prefill_slots] if prefill_slots.shape[0] else _EMPTY,
            prefill_chunk_lens=prefill_chunks,
            prefill_completes=prefill_completes,
            new_req_ids=tuple(self._req_id[new_slots].tolist()) if new_slots else (),
            preempted_req_ids=preempted_ids,
            finished_req_ids=finished,
            decode_slots=decode_slots,
            prefill_slots=prefill_slots,
        )
        self._pending_plan = plan
        self._pending_full_room = full_room
        self._pending_num_events = self._num_events
        return plan

    def commit_step(self, plan: StepPlan, k: int | IntArray) -> ScheduledBatch:
        """Fix K for the plan's decode rows and apply the optimistic accounting.

        `k`: one K for every decode row, or [num_decode_reqs] K per decode row. Clamped to
        [0, k_max]. Sync: it is this step's K (then also clamped to the plan's draft room).
        Async: it is stored for the next step of each request, and this step uses the K stored
        at the previous step (requests that only finished their prompt in the previous step
        get that step's scalar K, or the largest K of a per-row answer).
        """
        if plan is not self._pending_plan:
            raise RuntimeError("commit_step needs the plan returned by the last plan_step")
        cfg = self.config
        num_decode = plan.num_decode_reqs
        # [D] per-row K, None for one K for every row
        k_rows, k_default = split_k(k, num_decode, cfg.k_max)
        self._pending_plan = None
        dslots = plan.decode_slots
        pslots = plan.prefill_slots
        num_prefill = pslots.shape[0]
        # No finish, abort or preemption since plan_step: the plan's gathers are still current.
        unchanged = self._pending_num_events == self._num_events
        uniform_k = -1
        if self._lagged:
            if self._pending_full_room:  # every row verifies the one K they all hold
                num_spec = plan.decode_draft_room  # [D] (a shared, read-only array)
                uniform_k = self._uniform_pending_k
            else:
                num_spec = np.minimum(self._pending_k[dslots], plan.decode_draft_room)  # [D]
            self._pending_k[dslots] = k_default if k_rows is None else k_rows
            if num_prefill:
                self._pending_k[pslots[plan.prefill_completes]] = k_default
            # Every running row holds this step's K when K was one int and the step's rows were
            # the whole running set (nothing happened since the plan), every prefill row among
            # them completing its prompt: the next plan takes the all-decode hot path.
            everyone = (
                unchanged
                and num_decode + num_prefill == len(self._running)
                and (num_prefill == 0 or bool(np.logical_and.reduce(plan.prefill_completes)))
            )
            self._uniform_pending_k = k_default if k_rows is None and everyone else -1
        elif k_rows is not None:
            num_spec = np.minimum(k_rows, plan.decode_draft_room)  # [D]
        elif k_default == 0 or self._pending_full_room:
            # Draft room is >= 0 on every row, and == k_max on every row with full room.
            num_spec = _filled(num_decode, k_default)  # [D]
            uniform_k = k_default
        else:
            num_spec = np.minimum(plan.decode_draft_room, k_default)  # [D]
        if uniform_k < 0 and not np.count_nonzero(num_spec):
            uniform_k = 0  # no drafts at all (async K=0, or every row's room or K is 0)
        decode_tokens = num_spec + 1  # [D]
        if unchanged:
            computed_after = plan.decode_context_lens + decode_tokens  # [D]
            self._num_computed[dslots] = computed_after
        else:
            self._num_computed[dslots] += decode_tokens
            computed_after = self._num_computed[dslots]
        if self._async:
            self._num_placeholders[dslots] += decode_tokens
        else:
            # Sync: nothing is in flight, so every placeholder is 0 (an invariant).
            self._num_placeholders[dslots] = decode_tokens
        if num_prefill:
            self._num_computed[pslots] += plan.prefill_chunk_lens
            completing = pslots[plan.prefill_completes]
            self._num_placeholders[completing] += 1
            self._in_prefill[completing] = False
        # Same-step K: release the KV reserved for drafts the chosen K does not use (none if
        # K == k_max), but no block held before the plan (those of earlier rejected drafts).
        # Next-step K reserved exactly 1 + the K it verifies: nothing to release.
        if not self._lagged and (uniform_k != cfg.k_max or not self._pending_full_room):
            kept = self._held_before_plan[dslots] * cfg.block_size  # [D] tokens
            needed = computed_after
            if self._lookahead:
                needed = self._with_lookahead(computed_after)
            self.kv.shrink_to(dslots, np.maximum(needed, kept))

        if num_prefill:
            slots = np.concatenate([dslots, pslots])  # [B]
            num_scheduled = np.concatenate([decode_tokens, plan.prefill_chunk_lens])  # [B]
            spec_rows = np.concatenate([num_spec, np.zeros(num_prefill, dtype=np.int64)])  # [B]
            completes = np.zeros(slots.shape[0], dtype=np.bool_)  # [B]
            completes[num_decode:] = plan.prefill_completes
            placeholders = num_scheduled.copy()  # [B]
            placeholders[num_decode:] = plan.prefill_completes
            req_ids = self._req_id[slots]  # [B]
            computed_before = self._num_computed[slots] - num_scheduled  # [B]
        else:
            # Arrays are shared between the batch and the committed step: read-only from here.
            slots = dslots
            num_scheduled = placeholders = decode_tokens  # [B]
            spec_rows = num_spec  # [B]
            completes = np.zeros(num_decode, dtype=np.bool_)  # [B]
            if unchanged:
                req_ids = plan.decode_req_ids
                computed_before = plan.decode_context_lens
            else:
                req_ids = self._req_id[slots]
                computed_before = computed_after - decode_tokens
        if uniform_k >= 0:
            total_num_scheduled = num_decode * (1 + uniform_k) + (
                int(plan.prefill_chunk_lens.sum()) if num_prefill else 0
            )
        else:
            total_num_scheduled = int(np.add.reduce(num_scheduled))
        self._inflight[plan.step_index] = _CommittedStep(
            slots=slots,
            epochs=self._epoch[slots],
            num_decode_reqs=num_decode,
            num_spec_tokens=num_spec,
            completes_prompt=completes,
            placeholders=placeholders,
            uniform_k=uniform_k,
            num_events_at_plan=self._pending_num_events,
        )
        self._step_index += 1
        return ScheduledBatch(
            step_index=plan.step_index,
            req_ids=req_ids,
            num_decode_reqs=num_decode,
            num_scheduled_tokens=num_scheduled,
            num_spec_tokens=spec_rows,
            num_computed_tokens=computed_before,
            num_output_tokens=self._num_output[slots],
            completes_prompt=completes,
            total_num_scheduled_tokens=total_num_scheduled,
            new_req_ids=plan.new_req_ids,
            finished_req_ids=plan.finished_req_ids,
            preempted_req_ids=plan.preempted_req_ids,
        )

    def update(self, batch: ScheduledBatch, outcome: StepOutcome) -> StepResult:
        """Apply a step's outcome: resolve placeholders, emit output tokens, finish requests."""
        step = self._inflight.pop(batch.step_index, None)
        if step is None:
            raise RuntimeError(f"step {batch.step_index} is not in flight")
        num_decode = step.num_decode_reqs
        accepted = outcome_accepted(batch.step_index, outcome, num_decode)  # [D]
        drafted = step.num_spec_tokens  # [D]
        if outcome.num_drafted is not None:
            drafted = np.asarray(outcome.num_drafted, dtype=np.int64)
            if (
                drafted.shape != (num_decode,)
                or (drafted > step.num_spec_tokens).any()
                or (accepted > drafted).any()
            ):
                raise ValueError(
                    f"outcome of step {batch.step_index}: num_drafted must be one count per "
                    "decode row with accepted <= drafted <= K"
                )
        if step.num_events_at_plan == self._num_events and outcome.stop_index is None:
            return self._update_live(batch, step, accepted, drafted)
        rejected = step.num_spec_tokens - accepted  # [D]
        if num_decode and ((accepted < 0).any() or (rejected < 0).any()):
            raise ValueError(f"outcome of step {batch.step_index}: accepted outside [0, K]")
        slots = step.slots  # [B]
        self._num_placeholders[slots] -= step.placeholders
        state = self._state[slots]  # [B]
        # Rows of requests that finished or were aborted since the commit emit nothing (the
        # slot may even hold a new request by now if the row had no placeholders).
        live = ((state == _RUNNING) | (state == _WAITING)) & (self._req_id[slots] == batch.req_ids)
        # Rows of a request preempted after this commit: its KV is gone (num_computed reset).
        same_epoch = self._epoch[slots] == step.epochs  # [B]

        dslots = slots[:num_decode]
        if num_decode:
            keep = live[:num_decode] & same_epoch[:num_decode]  # [D]
            if rejected.any():
                fix = keep & (rejected > 0)
                # vLLM keeps the blocks of rejected drafts: the next tokens reuse them.
                self._num_computed[dslots[fix]] -= rejected[fix]
            live_decode = live[:num_decode]
            if live_decode.all():
                self.spec_stats.observe(drafted, accepted)
            else:
                self.spec_stats.observe(drafted[live_decode], accepted[live_decode])
            emitted = np.concatenate(
                [accepted + 1, step.completes_prompt[num_decode:].astype(np.int64)]
            )  # [B]
        else:
            emitted = step.completes_prompt.astype(np.int64)  # [B]
        # Append output tokens one by one with stop checks, vectorised: stop at max_tokens
        # (already min'd with max_model_len room) or just after a stop token, trim the rest.
        outputs = self._num_output[slots]  # [B]
        np.minimum(emitted, self._max_output[slots] - outputs, out=emitted)
        emitted[~live] = 0
        stopped = None
        if outcome.stop_index is not None:
            stop_index = np.asarray(outcome.stop_index, dtype=np.int64)  # [B]
            stopped = (stop_index >= 0) & (stop_index < emitted)  # [B]
            emitted = np.where(stopped, stop_index + 1, emitted)
        outputs += emitted
        self._num_output[slots] = outputs
        done = live & (outputs >= self._max_output[slots])  # [B]
        if stopped is not None:
            done |= stopped & live
        return self._end_update(batch, slots[done], emitted, int(accepted.sum()))

    def _end_update(
        self, batch: ScheduledBatch, done_slots: IntArray, emitted: IntArray, num_accepted: int
    ) -> StepResult:
        """Finish the requests of `done_slots`, release drained ones, report the step."""
        finished = self._finish_rows(done_slots) if done_slots.size else ()
        if self._draining:
            self._release_drained()
        return StepResult(
            step_index=batch.step_index,
            req_ids=batch.req_ids,
            num_output_tokens=emitted,
            finished_req_ids=finished,
            num_accepted_tokens=num_accepted,
        )

    def _update_live(
        self, batch: ScheduledBatch, step: _CommittedStep, accepted: IntArray, drafted: IntArray
    ) -> StepResult:
        """`update` of a step whose rows are all still live (no finish, abort or preemption
        since it was planned) and that reports no stop tokens: the same accounting as the
        general path, in a few array operations (the per-step hot path)."""
        slots = step.slots  # [B]
        num_decode = step.num_decode_reqs
        dslots = slots if num_decode == slots.shape[0] else slots[:num_decode]  # [D]
        if step.uniform_k == 0:
            # Nothing drafted: nothing rejected, and the counters do not move.
            if np.count_nonzero(accepted):
                raise ValueError(f"outcome of step {batch.step_index}: accepted outside [0, K]")
            num_accepted_tokens = 0
        else:
            rejected = step.num_spec_tokens - accepted  # [D]
            if num_decode and np.minimum.reduce(np.minimum(accepted, rejected)) < 0:
                raise ValueError(f"outcome of step {batch.step_index}: accepted outside [0, K]")
            # Rejected drafts roll back num_computed; their blocks stay held (vLLM).
            self._num_computed[dslots] -= rejected
            self.spec_stats.observe(drafted, accepted)
            num_accepted_tokens = int(np.add.reduce(accepted))
        if self._inflight:
            self._num_placeholders[slots] -= step.placeholders
        else:
            # Nothing else in flight: this step held every placeholder of its rows.
            self._num_placeholders[slots] = 0
        # Output tokens with the max_tokens check (already min'd with the max_model_len room):
        # 1 + accepted per decode row, 1 per prefill row that completes its prompt.
        emitted = accepted + 1  # [D]
        if num_decode < slots.shape[0]:
            emitted = np.concatenate([emitted, step.completes_prompt[num_decode:]])  # [B]
        outputs = self._num_output[slots]  # [B]
        left = self._max_output[slots] - outputs  # [B] >= 1: live requests are unfinished
        np.minimum(emitted, left, out=emitted)
        outputs += emitted
        self._num_output[slots] = outputs
        done = emitted == left  # [B] reached max_tokens
        return self._end_update(batch, slots[done], emitted, num_accepted_tokens)

    def _finish_rows(self, finished_slots: IntArray) -> tuple[int, ...]:
        """Finish the requests of distinct `slots` (running or waiting): free their blocks,
        keep the slots of rows still in flight (draining), release the others. Their request
        ids in row order."""
        finished = tuple(self._req_id[finished_slots].tolist())
        slots = finished_slots.tolist()
        running = self._state[finished_slots] == _RUNNING  # [F]
        if len(slots) <= _FEW_FINISHED and np.logical_and.reduce(running):
            for slot in slots:  # the usual case: list.remove scans in C
                self._running.remove(slot)
        elif np.logical_and.reduce(running):  # a wave: one pass over the running order
            gone = set(slots)
            self._running = [slot for slot in self._running if slot not in gone]
        else:
            for slot, was_running in zip(slots, running.tolist(), strict=True):
                (self._running if was_running else self._waiting).remove(slot)
        self._running_array = None
        self._num_events += len(slots)
        self.kv.free(finished_slots)
        self._num_computed[finished_slots] = 0
        self._finished_since_last.extend(finished)
        in_flight = self._num_placeholders[finished_slots] > 0  # [F]
        if in_flight.any():
            draining = finished_slots[in_flight]
            self._state[draining] = _DRAINING
            self._draining.extend(draining.tolist())
            finished_slots = finished_slots[~in_flight]
        self._release(finished_slots)
        return finished

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Cheap consistency checks; tests call this after every scheduler call."""
        cfg = self.config
        running = np.array(self._running, dtype=np.int64)  # [R]
        waiting = np.array(self._waiting, dtype=np.int64)  # [W]
        assert len(set(self._running)) == running.shape[0], "duplicate running slot"
        assert len(set(self._waiting)) == waiting.shape[0], "duplicate waiting slot"
        assert running.shape[0] <= cfg.max_num_seqs, "running set exceeds max_num_seqs"
        assert (self._state[running] == _RUNNING).all(), "running slot not in RUNNING state"
        assert (self._state[waiting] == _WAITING).all(), "waiting slot not in WAITING state"
        num_live = running.shape[0] + waiting.shape[0] + len(self._draining)
        assert len(self._slot_of) == num_live, "slot map out of sync with queues"
        assert (self._num_placeholders >= 0).all(), "negative placeholders"
        if not self._inflight:
            assert not self._num_placeholders.any(), "placeholders left with no step in flight"
            assert not self._draining, "draining slots with no step in flight"
        assert (self._num_output <= self._max_output).all(), "output tokens beyond max_tokens"
        assert (self._num_computed >= 0).all(), "negative num_computed_tokens"
        assert (self._num_computed[running] <= cfg.max_model_len - 1).all(), (
            "num_computed_tokens beyond max_model_len - 1"
        )
        assert not self._num_computed[waiting].any(), "waiting request with computed tokens"
        # Decoding requests: all tokens but the newest (plus in-flight ones) are in the KV cache.
        decoding = running[~self._in_prefill[running]]
        expected = (
            self._prompt_len[decoding]
            + self._num_output[decoding]
            + self._num_placeholders[decoding]
            - 1
        )
        bad = np.flatnonzero(self._num_computed[decoding] != expected)
        assert bad.size == 0, (
            f"request {int(self._req_id[decoding[bad[0]]])}: num_computed_tokens "
            f"{int(self._num_computed[decoding[bad[0]]])} != prompt + outputs + placeholders - 1 "
            f"= {int(expected[bad[0]])}"
        )
        prefilling = running[self._in_prefill[running]]
        assert (self._num_computed[prefilling] < self._prefill_end[prefilling]).all(), (
            "prefilling request already past its prompt"
        )
        for slot in self._draining:
            assert self._state[slot] == _DRAINING and self._num_placeholders[slot] > 0
        covered = self._num_computed.copy()  # [S]
        plan = self._pending_plan
        if plan is not None:
            # Between plan and commit the pool already covers the planned tokens.
            covered[plan.decode_slots] += 1 + plan.decode_draft_room
            covered[plan.prefill_slots] += plan.prefill_chunk_lens
        # and the lookahead slots past them (a rollback of rejected drafts keeps its blocks)
        covered = self._with_lookahead(covered)
        self.kv.check_invariants(running, covered[running])

    # ------------------------------------------------------------------ internals

    def _admit(
        self, budget: int, new_slots: list[int], new_chunks: list[int], prefill_cap: int
    ) -> int:
        """Admit waiting requests FCFS while budget, max_num_seqs and KV allow; a first chunk
        is at most `prefill_cap` tokens (0: no cap). KV must hold the whole (re)prompt, not only
        the first chunk (vLLM's scheduler_reserve_full_isl, on by default): a request is not
        admitted to be preempted again before its prompt is done."""
        cfg = self.config
        draft_slots = self._draft_slots
        skipped: list[int] = []
        waiting = self._waiting
        while waiting and budget > draft_slots and len(self._running) < cfg.max_num_seqs:
            slot = waiting[0]
            if self._num_placeholders[slot]:
                # Preempted while a step of it was in flight (async): its outputs are not
                # known yet, so its recompute length is not either. Let the others pass.
                skipped.append(waiting.popleft())
                continue
            target = int(self._num_output[slot] + self._prompt_len[slot])
            chunk = min(target, budget - draft_slots)
            if prefill_cap:
                chunk = min(chunk, prefill_cap)
            if chunk < target and not cfg.enable_chunked_prefill:
                break
            full = min(target, cfg.max_model_len)
            # chunk <= target <= max_model_len: only a drafter's lookahead needs the cap
            covered = int(self._with_lookahead(chunk)) if self._lookahead else chunk
            if cdiv(full, cfg.block_size) > self.kv.num_free_blocks or not self.kv.try_cover(
                slot, covered
            ):
                break
            waiting.popleft()
            self._running.append(slot)
            self._running_array = None
            self._state[slot] = _RUNNING
            self._in_prefill[slot] = True
            self._prefill_end[slot] = target
            new_slots.append(slot)
            new_chunks.append(chunk)
            budget -= chunk + draft_slots
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget

    def _with_lookahead(self, num_tokens: IntArray | int) -> IntArray:
        """Tokens a scheduled row's KV must cover: its own plus the drafter's lookahead slots
        (vLLM's allocate_slots), never past max_model_len."""
        covered: IntArray = np.minimum(num_tokens + self._lookahead, self.config.max_model_len)
        return covered

    def _cover_with_preemption(
        self, run: IntArray, got: IntArray, covered: IntArray
    ) -> tuple[IntArray, IntArray, list[int]]:
        """Slow path when the pool cannot cover every row: vLLM's preempt-the-last loop.

        Rows are covered in running order; when one does not fit, the LAST running request is
        preempted (blocks freed, back to the FRONT of waiting, num_computed_tokens = 0, its
        outputs kept to be recomputed as prompt) until it fits or it was itself preempted.
        """
        preempted: list[int] = []
        index = 0
        # self._running shrinks from the end as requests are preempted.
        while index < len(self._running):
            slot = int(run[index])
            if got[index] and not self.kv.try_cover(slot, int(covered[index])):
                while True:
                    victim = self._running.pop()
                    self._running_array = None
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim == slot or self.kv.try_cover(slot, int(covered[index])):
                        break
                if preempted[-1] == slot:
                    break
            index += 1
        return run[:index], got[:index], preempted

    def _preempt(self, slot: int) -> None:
        self._num_events += 1
        self.kv.free(slot)
        self._num_computed[slot] = 0
        self._in_prefill[slot] = True
        self._state[slot] = _WAITING
        self._epoch[slot] += 1
        self._waiting.appendleft(slot)
        self.num_preemptions += 1

    def _release_drained(self) -> None:
        draining = np.array(self._draining, dtype=np.int64)  # [N]
        drained = self._num_placeholders[draining] == 0  # [N]
        self._release(draining[drained])
        self._draining = draining[~drained].tolist()

    def _release(self, slots: IntArray) -> None:
        """Free distinct `slots` for new requests (reused last-freed first)."""
        slot_of = self._slot_of
        for req_id in self._req_id[slots].tolist():
            del slot_of[req_id]
        self._state[slots] = _FREE
        self._req_id[slots] = -1
        self._free_slots.extend(slots.tolist())

    def _grow(self, capacity: int) -> None:
        old = self._state.shape[0]
        for name in (
            "_req_id",
            "_state",
            "_prompt_len",
            "_max_output",
            "_num_computed",
            "_num_output",
            "_num_placeholders",
            "_in_prefill",
            "_prefill_end",
            "_pending_k",
            "_epoch",
        ):
            array = getattr(self, name)
            grown = np.zeros(capacity, dtype=array.dtype)  # [capacity]
            grown[:old] = array
            setattr(self, name, grown)
        self._req_id[old:] = -1
        self._free_slots.extend(range(capacity - 1, old - 1, -1))
        self.kv.grow(capacity)
