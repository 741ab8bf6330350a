"""Request and step metrics of a run, with `vllm bench serve` definitions and key names.

`MetricsRecorder` is fed by the engine loop (`record_sends`, `record_step`) into numpy buffers;
at the end `bench_metrics` gives the result dict and `request_columns` / `step_columns` the
tables. Memory grows with the number of requests, not with tokens or steps (finished requests'
chunks fold into a `sim.pooled.PooledValues`; step rows can go to a `step_sink`). Each key's
definition and the memory bounds are in docs/simulator.md ("Metrics").

It does not decide anything, know about SimPy, or write output files (the step sink decides
where step rows go; ITL spill files are private and temporary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray, IntArray
from dsd.sim.pooled import DEFAULT_MAX_IN_MEMORY, PooledValues
from dsd.sim.scheduler import SpecDecodeStats, StepResult
from dsd.sim.types import ScheduledBatch

Columns = dict[str, npt.NDArray[Any]]  # a table as named columns of equal length
StepSink = Callable[[Columns], None]  # receives blocks of step rows


def discard_steps(steps: Columns) -> None:
    """The step sink of a run whose step rows nobody reads (flat memory on long runs)."""


# The TPOT and TTFT summary keys that comparisons and tables show first (vLLM bench names).
TPOT_TTFT_KEYS: tuple[str, ...] = (
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
)
STEP_BLOCK_ROWS = 1 << 16  # step rows per block handed to a step sink
COMPACT_MIN_CHUNKS = 1 << 18  # pending chunks that trigger turning finished requests into ITLs
COMPACT_MAX_STEPS = 1 << 13  # ... or pending steps (each holds a small array object)


class MetricsRecorder:
    """Collects per-request token times and per-step records of one run, in bounded memory.

    Hot path: `record_step` runs every step, so it appends the step's scalars as one tuple and
    its K histogram as one row of a small array (sums, extremes and means of K are taken per
    block of steps), and keeps the emitting rows' request ids as a reference (the batch's
    arrays are read-only by contract) instead of copying them.

    Memory: what grows with the run is per request (a few numbers each), not per token or per
    step. Chunks are turned into ITLs in batches ("compaction") once their request finished;
    only the chunks of requests still in flight are kept. The pooled ITLs live in a
    `PooledValues` (exact statistics, sorted runs spilled to a temporary folder past its cap).
    Step rows are kept for `step_table()` unless a `step_sink` is given: then they are handed
    to it in blocks of `STEP_BLOCK_ROWS` and not kept.
    """

    _STEP_INT_FIELDS = (
        "step_index",
        "batch_size",
        "num_decode_reqs",
        "num_tokens",
        "num_spec_tokens",
        "num_accepted_tokens",
        "num_output_tokens",
        "k_min",
        "k_max",
    )
    _STEP_FLOAT_FIELDS = ("start_s", "duration_s", "mean_k")

    def __init__(
        self,
        num_requests: int,
        k_max: int,
        *,
        step_sink: StepSink | None = None,
        max_itl_in_memory: int | None = None,
    ) -> None:
        self.k_max = k_max
        self.prompt_len = np.zeros(num_requests, dtype=np.int64)  # [N] tokens
        self.send_s = np.full(num_requests, np.nan)  # [N] time the client sent it
        self.first_token_s = np.full(num_requests, np.nan)  # [N] first chunk time
        self.finish_s = np.full(num_requests, np.nan)  # [N] last chunk time
        self.num_output_tokens = np.zeros(num_requests, dtype=np.int64)  # [N]
        # [N] time a request spent, after its first token, in steps that also computed prefill
        # chunks (other requests' prompts): the part of its TPOT that prefill stalls make
        self.prefill_step_s = np.zeros(num_requests)
        self._num_chunks = np.zeros(num_requests, dtype=np.int64)  # [N] counted at compaction
        # Chunks (request, step that emitted tokens for it) not yet turned into ITLs: per
        # pending step the emitting request ids [E], the step's end time and E; plus the
        # chunks of requests that were unfinished at the last compaction, in time order.
        # Pending chunks in parts: every request of a part's ids [E] emitted at each of its
        # times (one step's end, or a plain decode stretch's W step ends): ids, and where its
        # times start in `_pending_ends` and how many.
        self._chunk_parts: list[tuple[IntArray, int, int]] = []
        self._pending_ends: list[float] = []  # step end times of the pending parts, in order
        self._num_pending_chunks = 0
        self._num_pending_chunk_steps = 0  # steps that emitted chunks (a stretch counts W)
        # Items (a request's chunks within one step or stretch) of requests unfinished at the
        # last compaction: request, first time in `_retained_time_s` and length [R] each; only
        # the times they use are kept (a stretch's B items share theirs).
        self._retained_req = np.zeros(0, dtype=np.int64)  # [R]
        self._retained_start = np.zeros(0, dtype=np.int64)  # [R]
        self._retained_len = np.zeros(0, dtype=np.int64)  # [R]
        self._retained_time_s = np.zeros(0, dtype=np.float64)  # [T]
        self._compact_at_chunks = COMPACT_MIN_CHUNKS
        self._itl_ms = PooledValues(
            DEFAULT_MAX_IN_MEMORY if max_itl_in_memory is None else max_itl_in_memory
        )
        # Step rows of the current block: per step (step, B, D, tokens, accepted, output
        # tokens, start_s, duration_s) and its decode rows per K [rows, k_max+1] (grown by
        # doubling); at STEP_BLOCK_ROWS rows the block is closed into int and float arrays,
        # kept or handed to the sink.
        self._step_sink = step_sink
        self._block_rows: list[tuple[int, int, int, int, int, int, float, float]] = []
        self._block_k_counts = np.zeros((256, k_max + 1), dtype=np.int64)
        self._kept_blocks: list[tuple[IntArray, FloatArray]] = []
        self._num_steps = 0
        self._closed_k_histogram = np.zeros(k_max + 1, dtype=np.int64)  # [k_max+1]

    def record_sends(self, req_ids: range, time_s: float, prompt_lens: list[int]) -> None:
        """Requests `req_ids` (consecutive ids) were sent at `time_s`."""
        sent = slice(req_ids.start, req_ids.stop)
        self.send_s[sent] = time_s
        self.prompt_len[sent] = prompt_lens

    def record_step(
        self,
        batch: ScheduledBatch,
        result: StepResult,
        start_s: float,
        duration_s: float,
    ) -> int:
        """One step that started at `start_s`; its tokens are emitted at start_s + duration_s.

        Returns the output tokens the step emitted (all rows)."""
        end_s = start_s + duration_s
        num_decode = batch.num_decode_reqs
        emitted = result.num_output_tokens  # [B]
        index = self._next_row_index()
        if num_decode:
            # The step's K histogram gives its K sum, min, max and mean (at block close).
            self._block_k_counts[index] = np.bincount(
                batch.num_spec_tokens[:num_decode], minlength=self.k_max + 1
            )
            if num_decode < emitted.shape[0]:  # prefill rows follow the decode rows
                self.prefill_step_s[batch.req_ids[:num_decode]] += duration_s
        num_emitted = int(np.add.reduce(emitted))
        self._block_rows.append(
            (
                batch.step_index,
                emitted.shape[0],
                num_decode,
                batch.total_num_scheduled_tokens,
                result.num_accepted_tokens,
                num_emitted,
                start_s,
                duration_s,
            )
        )
        self._num_steps += 1

        num_chunks = int(np.count_nonzero(emitted))
        if num_chunks:
            if num_chunks == emitted.shape[0]:
                req_ids, chunk_tokens = batch.req_ids, emitted  # [E] (every row emitted)
            else:
                emitting = emitted > 0  # [B]
                req_ids, chunk_tokens = batch.req_ids[emitting], emitted[emitting]  # [E]
            self.num_output_tokens[req_ids] += chunk_tokens
            if num_decode < emitted.shape[0]:
                # Only a prefill row can emit a request's first token: a decode row's request
                # emitted it in the step that completed its prompt, an earlier step.
                prefill_req = batch.req_ids[num_decode:][emitted[num_decode:] > 0]  # [P]
                first = np.isnan(self.first_token_s[prefill_req])  # [P]
                self.first_token_s[prefill_req[first]] = end_s
        if result.finished_req_ids:
            self.finish_s[list(result.finished_req_ids)] = end_s
        if num_chunks:
            self._add_chunks(req_ids, [end_s], num_chunks)
        return num_emitted

    def record_plain_decode_steps(
        self, req_ids: IntArray, first_step_index: int, starts_s: list[float], duration_s: float
    ) -> None:
        """Steps `first_step_index`, ... that started at `starts_s` [W] and lasted `duration_s`
        each, in which every row of `req_ids` [B] decoded with K = 0 and emitted one token and
        nothing else happened: the rows and chunks `record_step` would record for them."""
        num_rows = int(req_ids.shape[0])
        k_counts = np.zeros(self.k_max + 1, dtype=np.int64)  # [k_max+1] every row at K = 0
        k_counts[0] = num_rows
        self.num_output_tokens[req_ids] += len(starts_s)
        done = 0
        while done < len(starts_s):
            index = self._next_row_index()  # may grow or replace the block's arrays
            count = min(len(starts_s) - done, self._block_k_counts.shape[0] - index)
            self._block_k_counts[index : index + count] = k_counts
            # step, B, D, tokens (1 per row), accepted, output tokens (1 per row), start, duration
            first = first_step_index + done
            self._block_rows.extend(
                (first + offset, num_rows, num_rows, num_rows, 0, num_rows, start_s, duration_s)
                for offset, start_s in enumerate(starts_s[done : done + count])
            )
            self._num_steps += count
            done += count
        ends_s = [start_s + duration_s for start_s in starts_s]  # [W] as record_step's sums
        done = 0
        while done < len(ends_s):
            # As many steps as fit before a compaction is due, exactly where step by step
            # recording would compact (ceil: the step that reaches the chunk threshold).
            to_threshold = -(-(self._compact_at_chunks - self._num_pending_chunks) // num_rows)
            to_cap = COMPACT_MAX_STEPS - self._num_pending_chunk_steps
            steps = max(1, min(len(ends_s) - done, to_threshold, to_cap))
            self._add_chunks(req_ids, ends_s[done : done + steps], num_rows)
            done += steps

    def _next_row_index(self) -> int:
        """Index of the next step row in the current block (closing or growing it if full)."""
        index = len(self._block_rows)
        if index == self._block_k_counts.shape[0]:
            self._grow_or_close_block()
            index = len(self._block_rows)
        return index

    def _add_chunks(self, req_ids: IntArray, ends_s: list[float], num_rows: int) -> None:
        """The chunks of consecutive steps in which the same rows (request ids [E]) emitted
        (one step, or a plain decode stretch's steps ending at `ends_s`); compact when due
        (after the same steps whatever path recorded them, so pooled ITLs sum in the same
        order)."""
        self._chunk_parts.append((req_ids, len(self._pending_ends), len(ends_s)))
        self._pending_ends.extend(ends_s)
        self._num_pending_chunks += num_rows * len(ends_s)
        self._num_pending_chunk_steps += len(ends_s)
        if (
            self._num_pending_chunks >= self._compact_at_chunks
            or self._num_pending_chunk_steps >= COMPACT_MAX_STEPS
        ):
            self._compact()

    @property
    def num_steps(self) -> int:
        return self._num_steps

    @property
    def num_chunks(self) -> IntArray:
        """[N] steps that emitted tokens for each request."""
        self._compact()
        return self._num_chunks

    def _compact(self) -> None:
        """Count pending chunks; pool the ITLs of finished requests; keep the others' chunks.

        Works on items (a request's chunks within one part: 1 for a step, W for a stretch)
        rather than chunks, so a stretch's B x W chunks are sorted as B items; the pooled gaps
        are the values and the order of gaps computed chunk by chunk (`item_gaps`)."""
        num_requests = self._num_chunks.shape[0]
        # Times: the retained items' own, then the pending parts' step ends.
        times_s = np.concatenate(
            [self._retained_time_s, np.asarray(self._pending_ends, dtype=np.float64)]
        )  # [T' + T]
        item_req, item_start, item_len = (
            self._retained_req,
            self._retained_start,
            self._retained_len,
        )  # [R] each
        parts = self._chunk_parts
        if parts:
            part_req = [part[0] for part in parts]
            rows = np.array([ids.shape[0] for ids in part_req], dtype=np.int64)  # [Q]
            new_req = np.concatenate(part_req)  # [I - R]
            first_time = np.array([part[1] for part in parts]) + self._retained_time_s.shape[0]
            new_start = np.repeat(first_time, rows)  # [I - R] index of its first time in times_s
            new_len = np.repeat(np.array([part[2] for part in parts], dtype=np.int64), rows)
            self._num_chunks += np.bincount(
                new_req, weights=new_len, minlength=num_requests
            ).astype(np.int64)
            item_req = np.concatenate([item_req, new_req])  # [I]
            item_start = np.concatenate([item_start, new_start])  # [I]
            item_len = np.concatenate([item_len, new_len])  # [I]
            parts.clear()
            self._pending_ends.clear()
            self._num_pending_chunks = self._num_pending_chunk_steps = 0
        finished = ~np.isnan(self.finish_s[item_req])  # [I]
        if finished.any():
            gaps_s = item_gaps(
                item_req[finished], item_start[finished], item_len[finished], times_s, num_requests
            )
            self._itl_ms.add(gaps_s * 1000.0)
            unfinished = ~finished
            item_req, item_start, item_len = (
                item_req[unfinished],
                item_start[unfinished],
                item_len[unfinished],
            )
        self._retained_req, self._retained_len = item_req, item_len
        self._retained_start, self._retained_time_s = _times_in_use(item_start, item_len, times_s)
        num_retained_chunks = int(item_len.sum())
        # Re-compact after new chunks at least as many as kept ones: linear total cost.
        self._compact_at_chunks = max(COMPACT_MIN_CHUNKS, num_retained_chunks)

    def itl_ms(self) -> PooledValues:
        """The pooled ITLs (ms) of every finished request (requests finished so far)."""
        self._compact()
        return self._itl_ms

    def close(self) -> None:
        """Free the pooled ITLs' spill files (after the last `bench_metrics`)."""
        self._itl_ms.close()

    def request_columns(self) -> Columns:
        """One row per request (NaN times for requests that were not sent or did not finish)."""
        ttft_s = self.first_token_s - self.send_s
        e2el_s = self.finish_s - self.send_s
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot_s = np.where(
                self.num_output_tokens > 1,
                (e2el_s - ttft_s) / (self.num_output_tokens - 1),
                np.nan,
            )
            in_prefill_steps_s = np.where(
                self.num_output_tokens > 1,
                self.prefill_step_s / (self.num_output_tokens - 1),
                np.nan,
            )
        # The recorder's own arrays, not copies: it records nothing more once asked (the run is
        # over), and a DataFrame built from these copies them anyway.
        return {
            "req_id": np.arange(self.prompt_len.shape[0]),
            "prompt_len": self.prompt_len,
            "num_output_tokens": self.num_output_tokens,
            "num_chunks": self.num_chunks,
            "send_s": self.send_s,
            "first_token_s": self.first_token_s,
            "finish_s": self.finish_s,
            "ttft_ms": ttft_s * 1000.0,
            "tpot_ms": tpot_s * 1000.0,
            "tpot_in_prefill_steps_ms": in_prefill_steps_s * 1000.0,
            "e2el_ms": e2el_s * 1000.0,
        }

    @property
    def k_histogram(self) -> IntArray:
        """[k_max+1] decode rows per K over the steps so far."""
        rows = len(self._block_rows)
        open_block: IntArray = self._block_k_counts[:rows].sum(axis=0)
        return self._closed_k_histogram + open_block

    def _grow_or_close_block(self) -> None:
        capacity = self._block_k_counts.shape[0]
        if capacity < STEP_BLOCK_ROWS:
            grown = np.zeros((2 * capacity, self.k_max + 1), dtype=np.int64)
            grown[:capacity] = self._block_k_counts
            self._block_k_counts = grown
            return
        self._close_block()

    def _block_arrays(self) -> tuple[IntArray, FloatArray]:
        """The current block's step rows as int [rows, len(_STEP_INT_FIELDS)] and float
        [rows, len(_STEP_FLOAT_FIELDS)] arrays."""
        rows = len(self._block_rows)
        if rows == 0:
            return self._no_rows()
        scalars = np.array(self._block_rows, dtype=np.float64)  # [rows, 8] ints < 2**53 exact
        given = scalars[:, :6].astype(np.int64)  # step, B, D, tokens, accepted, output
        counts = self._block_k_counts[:rows]  # [rows, k_max+1]
        num_decode = given[:, 2]  # [rows]
        num_spec = counts @ np.arange(self.k_max + 1)  # [rows]
        present = counts > 0  # [rows, k_max+1]
        decoding = num_decode > 0  # [rows]
        k_min = np.where(decoding, present.argmax(axis=1), -1)  # [rows]
        k_max = np.where(decoding, self.k_max - present[:, ::-1].argmax(axis=1), -1)  # [rows]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_k = np.where(decoding, num_spec / num_decode, np.nan)  # [rows]
        step, batch_size, tokens, accepted, output = given[:, [0, 1, 3, 4, 5]].T  # [rows] each
        columns = [step, batch_size, num_decode, tokens, num_spec, accepted, output, k_min, k_max]
        ints = np.stack(columns, axis=1)  # [rows, len(_STEP_INT_FIELDS)]
        floats = np.stack([scalars[:, 6], scalars[:, 7], mean_k], axis=1)  # [rows, 3]
        return ints, floats

    def _close_block(self) -> None:
        """Hand the current block's rows to the sink, or keep them; start an empty block."""
        rows = len(self._block_rows)
        if rows == 0:
            return
        ints, floats = self._block_arrays()
        if self._step_sink is not None:
            self._step_sink(self._step_columns(ints, floats))
        else:
            self._kept_blocks.append((ints, floats))
        self._closed_k_histogram += self._block_k_counts[:rows].sum(axis=0)
        self._block_k_counts[:rows] = 0
        self._block_rows.clear()

    def flush_steps(self) -> None:
        """With a step sink: hand it the rows not yet handed over (call once, at the end)."""
        if self._step_sink is not None:
            self._close_block()

    def step_columns(self) -> Columns:
        """One row per step; empty when a step sink took the rows (see `flush_steps`)."""
        if self._step_sink is not None:
            return self._step_columns(*self._no_rows())
        blocks = [*self._kept_blocks, self._block_arrays()]
        ints = np.concatenate([block[0] for block in blocks])  # [steps, fields]
        floats = np.concatenate([block[1] for block in blocks])  # [steps, fields]
        return self._step_columns(ints, floats)

    @classmethod
    def _no_rows(cls) -> tuple[IntArray, FloatArray]:
        return (
            np.zeros((0, len(cls._STEP_INT_FIELDS)), dtype=np.int64),
            np.zeros((0, len(cls._STEP_FLOAT_FIELDS)), dtype=np.float64),
        )

    @classmethod
    def _step_columns(cls, ints: IntArray, floats: FloatArray) -> Columns:
        int_column = {name: i for i, name in enumerate(cls._STEP_INT_FIELDS)}
        float_column = {name: i for i, name in enumerate(cls._STEP_FLOAT_FIELDS)}
        columns: dict[str, npt.NDArray[Any]] = {
            "step_index": ints[:, int_column["step_index"]].copy(),
            "start_s": floats[:, float_column["start_s"]].copy(),
            "duration_s": floats[:, float_column["duration_s"]].copy(),
        }
        for name in cls._STEP_INT_FIELDS[1:]:
            columns[name] = ints[:, int_column[name]].copy()
        columns["mean_k"] = floats[:, float_column["mean_k"]].copy()
        return columns

    def bench_metrics(
        self, spec_stats: SpecDecodeStats, percentiles: tuple[float, ...] = (99.0,)
    ) -> dict[str, Any]:
        """The `vllm bench serve` result dict (see module docstring), plus our own keys."""
        completed = ~np.isnan(self.finish_s)  # [N]
        ttft_s = (self.first_token_s - self.send_s)[completed]
        e2el_s = (self.finish_s - self.send_s)[completed]
        num_output = self.num_output_tokens[completed]
        multi = num_output > 1
        tpot_s = (e2el_s[multi] - ttft_s[multi]) / (num_output[multi] - 1)
        in_prefill_steps_s = self.prefill_step_s[completed][multi] / (num_output[multi] - 1)
        return bench_metrics_from(
            prompt_len=self.prompt_len[completed],
            num_output_tokens=num_output,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            tpot_in_prefill_steps_s=in_prefill_steps_s,
            itl_ms=self.itl_ms(),
            e2el_s=e2el_s,
            duration_s=float(self.finish_s[completed].max()) if completed.any() else 0.0,
            spec_stats=spec_stats,
            k_histogram=self.k_histogram,
            num_steps=self._num_steps,
            percentiles=percentiles,
        )


def _item_times(item_start: IntArray, item_len: IntArray, times_s: FloatArray) -> FloatArray:
    """Chunk times [C] of items [I] in order: item i is `item_len[i]` chunks at
    times_s[item_start[i] : item_start[i] + item_len[i]]."""
    total = int(item_len.sum())
    if total == item_len.shape[0]:  # one chunk per item (no stretch among them)
        single: FloatArray = times_s[item_start]
        return single
    first = np.cumsum(item_len) - item_len  # [I] where each item's chunks begin
    index = np.arange(total) + np.repeat(item_start - first, item_len)  # [C]
    chunk_times: FloatArray = times_s[index]
    return chunk_times


def _times_in_use(
    item_start: IntArray, item_len: IntArray, times_s: FloatArray
) -> tuple[IntArray, FloatArray]:
    """The times items [I] use, in order, and each item's first index into them (an item's
    times stay contiguous: the times dropped lie outside every item)."""
    bound = times_s.shape[0]
    ends = np.bincount(item_start + item_len, minlength=bound + 1)[:bound]  # [T]
    starts = np.bincount(item_start, minlength=bound)  # [T]
    in_use = np.cumsum(starts - ends) > 0  # [T] inside some item
    new_index = np.cumsum(in_use) - 1  # [T]
    start: IntArray = new_index[item_start]
    kept: FloatArray = times_s[in_use]
    return start, kept


def item_gaps(
    item_req: IntArray,
    item_start: IntArray,
    item_len: IntArray,
    times_s: FloatArray,
    num_requests: int,
) -> FloatArray:
    """Gaps between successive chunks of each request, requests in id order, from items (see
    `_item_times`) in time order within each request. Items are grouped by request with a
    stable sort (of items, not chunks), then expanded into their chunk times."""
    order = _stable_order(item_req, num_requests)  # [I]
    times_grouped = _item_times(item_start[order], item_len[order], times_s)
    if times_grouped.shape[0] < 2:
        return np.zeros(0, dtype=np.float64)
    gaps: FloatArray = times_grouped[1:] - times_grouped[:-1]  # [C-1]
    # Drop the gaps that span two requests: they end where a request's chunks end.
    chunks_per_request = np.bincount(item_req, weights=item_len, minlength=num_requests)  # [N]
    counts = chunks_per_request[chunks_per_request > 0].astype(np.int64)  # [G]
    group_ends = np.cumsum(counts)[:-1] - 1  # [G-1]
    within = np.ones(gaps.shape[0], dtype=np.bool_)  # [C-1]
    within[group_ends] = False
    kept: FloatArray = gaps[within]
    return kept


def _stable_order(keys: IntArray, key_bound: int) -> IntArray:
    """argsort(keys, kind="stable") for keys in [0, key_bound).

    numpy sorts 16-bit keys stably with a radix sort (linear time), several times faster than
    its merge sort on int64; request ids below 65536 are one 16-bit digit, below 2**32 two
    (least significant digit first, then a stable pass on the high digit).
    """
    if key_bound <= 1 << 16:
        order: IntArray = np.argsort(keys.astype(np.uint16), kind="stable")
        return order
    if key_bound <= 1 << 32:
        order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        high = (keys >> 16).astype(np.uint16)  # [C]
        stable_high: IntArray = order[np.argsort(high[order], kind="stable")]
        return stable_high
    order = np.argsort(keys, kind="stable")
    return order


def _percentile_key(percentile: float) -> str:
    return str(int(percentile)) if int(percentile) == percentile else str(percentile)


def bench_metrics_from(
    *,
    prompt_len: IntArray,
    num_output_tokens: IntArray,
    ttft_s: FloatArray,
    tpot_s: FloatArray,
    tpot_in_prefill_steps_s: FloatArray,
    itl_ms: PooledValues,
    e2el_s: FloatArray,
    duration_s: float,
    spec_stats: SpecDecodeStats,
    k_histogram: IntArray,
    num_steps: int,
    percentiles: tuple[float, ...] = (99.0,),
) -> dict[str, Any]:
    """The result dict from per-request values of the completed requests (seconds in) and the
    pooled ITLs (ms) of the same requests."""
    total_input = int(prompt_len.sum())
    total_output = int(num_output_tokens.sum())
    completed = int(num_output_tokens.shape[0])

    def per_s(count: float) -> float:
        return count / duration_s if duration_s > 0 else float("nan")

    result: dict[str, Any] = {
        "completed": completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "duration": duration_s,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
    }
    pooled_ms = {
        "ttft": PooledValues.of(ttft_s * 1000.0),
        "tpot": PooledValues.of(tpot_s * 1000.0),
        "itl": itl_ms,
        "e2el": PooledValues.of(e2el_s * 1000.0),
    }
    for name, values_ms in pooled_ms.items():
        stats = values_ms.summary(percentiles)
        result[f"mean_{name}_ms"] = stats["mean"]
        result[f"median_{name}_ms"] = stats["median"]
        result[f"std_{name}_ms"] = stats["std"]
        for percentile in percentiles:
            key = f"p{_percentile_key(percentile)}_{name}_ms"
            result[key] = stats[f"p{percentile}"]
    num_drafts = spec_stats.num_drafts
    with np.errstate(invalid="ignore", divide="ignore"):
        given_drafted = spec_stats.accepted_at_pos / spec_stats.drafted_at_pos
    result["spec_decode_num_drafts"] = num_drafts
    result["spec_decode_draft_tokens"] = spec_stats.num_draft_tokens
    result["spec_decode_accepted_tokens"] = spec_stats.num_accepted_tokens
    result["spec_decode_acceptance_rate"] = (
        100.0 * spec_stats.num_accepted_tokens / spec_stats.num_draft_tokens
        if spec_stats.num_draft_tokens
        else float("nan")
    )
    result["spec_decode_acceptance_length"] = spec_stats.acceptance_length if num_drafts else 0.0
    result["spec_decode_per_position_acceptance_rates"] = (
        [float(n) / num_drafts for n in spec_stats.accepted_at_pos.tolist()] if num_drafts else []
    )
    result["acceptance_length"] = spec_stats.acceptance_length
    result["per_position_acceptance_given_drafted"] = [float(r) for r in given_drafted]
    result["spec_decode_drafted_at_pos"] = spec_stats.drafted_at_pos.tolist()
    result["spec_decode_accepted_at_pos"] = spec_stats.accepted_at_pos.tolist()
    # ours: the part of mean TPOT spent in steps that also computed prefill chunks (0.0 with
    # no TPOT, like vLLM's empty means)
    result["mean_tpot_in_prefill_steps_ms"] = (
        float(np.mean(tpot_in_prefill_steps_s)) * 1000.0 if tpot_in_prefill_steps_s.size else 0.0
    )
    result["k_histogram"] = {k: int(n) for k, n in enumerate(k_histogram.tolist()) if n}
    result["num_steps"] = num_steps
    return result
