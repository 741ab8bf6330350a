"""Request and step metrics of a run, with `vllm bench serve` definitions and key names.

`MetricsRecorder` is fed by the engine loop: one `record_send` per request, one `record_step`
per step. It streams into growing numpy buffers (no Python object per token or per row). At the
end `bench_metrics` turns them into the result dict, `request_table` / `step_table` into
DataFrames for the CLI to write.

Definitions (as `vllm bench serve` computes them; times in ms in the result):
- TTFT = first output chunk time - send time. E2EL = last chunk time - send time.
- TPOT = (E2EL - TTFT) / (output_tokens - 1), only for requests with more than one output token.
- ITL = every gap between successive output chunks of a request (a chunk is the set of tokens
  one step emitted for it), pooled over all requests.
- mean / median / std (population, ddof=0) / pNN (numpy's default linear percentile) of each;
  an empty list reads as [0], like vLLM's `np.mean(x or 0)`.
- duration = time the last request finished - start of the run (the run starts at 0).
- request_throughput = completed / duration; output_throughput = output tokens / duration;
  total_token_throughput = (input + output tokens) / duration, counting completed requests.
- spec_decode_acceptance_length = 1 + accepted / num_drafts (mean output tokens per decode
  step that drafted); per-position rates = accepted_at_pos / drafted_at_pos (ours; vLLM's logged
  rate divides by num_drafts, which reads low when K varies).

What this module deliberately does not do: decide anything, know about SimPy, or write files.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from sim.scheduler import SpecDecodeStats, StepResult
from sim.types import ScheduledBatch

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class _Buffer:
    """A growing 1-d numpy buffer (amortised doubling)."""

    def __init__(self, dtype: type[np.generic], capacity: int = 1024) -> None:
        self.data: npt.NDArray[Any] = np.zeros(capacity, dtype=dtype)
        self.size = 0

    def reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed > self.data.shape[0]:
            grown = np.zeros(max(needed, 2 * self.data.shape[0]), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown

    def view(self) -> npt.NDArray[Any]:
        return self.data[: self.size]


class MetricsRecorder:
    """Collects per-request token times and per-step records of one run."""

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

    def __init__(self, num_requests: int, k_max: int) -> None:
        self.k_max = k_max
        self.prompt_len = np.zeros(num_requests, dtype=np.int64)  # [N] tokens
        self.send_s = np.full(num_requests, np.nan)  # [N] time the client sent it
        self.first_token_s = np.full(num_requests, np.nan)  # [N] first chunk time
        self.finish_s = np.full(num_requests, np.nan)  # [N] last chunk time
        self.num_output_tokens = np.zeros(num_requests, dtype=np.int64)  # [N]
        self.num_chunks = np.zeros(num_requests, dtype=np.int64)  # [N] steps that emitted
        # one entry per (request, step that emitted tokens for it), in time order
        self._chunk_req = _Buffer(np.int64)
        self._chunk_time_s = _Buffer(np.float64)
        self._step_ints = {name: _Buffer(np.int64, 256) for name in self._STEP_INT_FIELDS}
        self._step_floats = {name: _Buffer(np.float64, 256) for name in self._STEP_FLOAT_FIELDS}
        self._num_steps = 0
        self.k_histogram = np.zeros(k_max + 1, dtype=np.int64)  # [k_max+1] decode rows per K

    def record_send(self, req_id: int, time_s: float, prompt_len: int) -> None:
        self.send_s[req_id] = time_s
        self.prompt_len[req_id] = prompt_len

    def record_step(
        self,
        batch: ScheduledBatch,
        result: StepResult,
        start_s: float,
        duration_s: float,
    ) -> None:
        """One step that started at `start_s`; its tokens are emitted at start_s + duration_s."""
        end_s = start_s + duration_s
        num_decode = batch.num_decode_reqs
        spec = batch.num_spec_tokens[:num_decode]  # [D]
        emitted = result.num_output_tokens  # [B]
        index = self._num_steps
        if index == self._step_floats["start_s"].data.shape[0]:
            for buffer in (*self._step_ints.values(), *self._step_floats.values()):
                buffer.size = index
                buffer.reserve(1)
        ints = self._step_ints
        floats = self._step_floats
        num_spec = int(spec.sum())
        ints["step_index"].data[index] = batch.step_index
        ints["batch_size"].data[index] = batch.batch_size
        ints["num_decode_reqs"].data[index] = num_decode
        ints["num_tokens"].data[index] = batch.total_num_scheduled_tokens
        ints["num_spec_tokens"].data[index] = num_spec
        ints["num_accepted_tokens"].data[index] = result.num_accepted_tokens
        ints["num_output_tokens"].data[index] = int(emitted.sum())
        ints["k_min"].data[index] = int(spec.min()) if num_decode else -1
        ints["k_max"].data[index] = int(spec.max()) if num_decode else -1
        floats["start_s"].data[index] = start_s
        floats["duration_s"].data[index] = duration_s
        floats["mean_k"].data[index] = num_spec / num_decode if num_decode else np.nan
        self._num_steps = index + 1
        if num_decode:
            self.k_histogram += np.bincount(spec, minlength=self.k_max + 1)

        emitting = emitted > 0  # [B]
        req_ids = batch.req_ids[emitting]  # [E]
        num_chunks = req_ids.shape[0]
        if num_chunks:
            self._chunk_req.reserve(num_chunks)
            self._chunk_time_s.reserve(num_chunks)
            size = self._chunk_req.size
            self._chunk_req.data[size : size + num_chunks] = req_ids
            self._chunk_time_s.data[size : size + num_chunks] = end_s
            self._chunk_req.size += num_chunks
            self._chunk_time_s.size += num_chunks
            self.num_output_tokens[req_ids] += emitted[emitting]
            self.num_chunks[req_ids] += 1
            first = req_ids[np.isnan(self.first_token_s[req_ids])]  # [F]
            self.first_token_s[first] = end_s
        if result.finished_req_ids:
            self.finish_s[list(result.finished_req_ids)] = end_s

    @property
    def num_steps(self) -> int:
        return self._num_steps

    def itls_s(self) -> FloatArray:
        """All gaps between successive chunks of the same request, pooled, seconds."""
        return self._itls_of(np.ones(self._chunk_req.size, dtype=np.bool_))

    def request_table(self) -> pd.DataFrame:
        """One row per request (NaN times for requests that were not sent or did not finish)."""
        ttft_s = self.first_token_s - self.send_s
        e2el_s = self.finish_s - self.send_s
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot_s = np.where(
                self.num_output_tokens > 1,
                (e2el_s - ttft_s) / (self.num_output_tokens - 1),
                np.nan,
            )
        return pd.DataFrame(
            {
                "req_id": np.arange(self.prompt_len.shape[0]),
                "prompt_len": self.prompt_len,
                "num_output_tokens": self.num_output_tokens,
                "num_chunks": self.num_chunks,
                "send_s": self.send_s,
                "first_token_s": self.first_token_s,
                "finish_s": self.finish_s,
                "ttft_ms": ttft_s * 1000.0,
                "tpot_ms": tpot_s * 1000.0,
                "e2el_ms": e2el_s * 1000.0,
            }
        )

    def step_table(self) -> pd.DataFrame:
        """One row per step."""
        columns: dict[str, npt.NDArray[Any]] = {}
        for name in ("step_index", "start_s", "duration_s"):
            source = self._step_ints if name in self._step_ints else self._step_floats
            columns[name] = source[name].data[: self._num_steps].copy()
        for name in self._STEP_INT_FIELDS[1:]:
            columns[name] = self._step_ints[name].data[: self._num_steps].copy()
        columns["mean_k"] = self._step_floats["mean_k"].data[: self._num_steps].copy()
        return pd.DataFrame(columns)

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
        itl_s = self._itls_of(completed[self._chunk_req.view()])
        return bench_metrics_from(
            prompt_len=self.prompt_len[completed],
            num_output_tokens=num_output,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            itl_s=itl_s,
            e2el_s=e2el_s,
            duration_s=float(self.finish_s[completed].max()) if completed.any() else 0.0,
            spec_stats=spec_stats,
            k_histogram=self.k_histogram,
            num_steps=self._num_steps,
            percentiles=percentiles,
        )

    def _itls_of(self, chunk_mask: npt.NDArray[np.bool_]) -> FloatArray:
        req = self._chunk_req.view()[chunk_mask]
        times = self._chunk_time_s.view()[chunk_mask]
        order = np.argsort(req, kind="stable")
        same = req[order][1:] == req[order][:-1]
        gaps: FloatArray = (times[order][1:] - times[order][:-1])[same]
        return gaps


def _percentile_key(percentile: float) -> str:
    return str(int(percentile)) if int(percentile) == percentile else str(percentile)


def bench_metrics_from(
    *,
    prompt_len: IntArray,
    num_output_tokens: IntArray,
    ttft_s: FloatArray,
    tpot_s: FloatArray,
    itl_s: FloatArray,
    e2el_s: FloatArray,
    duration_s: float,
    spec_stats: SpecDecodeStats,
    k_histogram: IntArray,
    num_steps: int,
    percentiles: tuple[float, ...] = (99.0,),
) -> dict[str, Any]:
    """The result dict from per-request values of the completed requests (seconds in)."""
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
    for name, values_s in (("ttft", ttft_s), ("tpot", tpot_s), ("itl", itl_s), ("e2el", e2el_s)):
        values_ms = values_s * 1000.0 if values_s.shape[0] else np.zeros(1)
        result[f"mean_{name}_ms"] = float(np.mean(values_ms))
        result[f"median_{name}_ms"] = float(np.median(values_ms))
        result[f"std_{name}_ms"] = float(np.std(values_ms))
        for percentile in percentiles:
            key = f"p{_percentile_key(percentile)}_{name}_ms"
            result[key] = float(np.percentile(values_ms, percentile))
    with np.errstate(invalid="ignore", divide="ignore"):
        per_position = spec_stats.accepted_at_pos / spec_stats.drafted_at_pos
    result["spec_decode_num_drafts"] = spec_stats.num_drafts
    result["spec_decode_draft_tokens"] = spec_stats.num_draft_tokens
    result["spec_decode_accepted_tokens"] = spec_stats.num_accepted_tokens
    result["spec_decode_acceptance_rate"] = (
        spec_stats.num_accepted_tokens / spec_stats.num_draft_tokens
        if spec_stats.num_draft_tokens
        else float("nan")
    )
    result["spec_decode_acceptance_length"] = spec_stats.acceptance_length
    result["spec_decode_per_position_acceptance_rates"] = [float(r) for r in per_position]
    result["spec_decode_drafted_at_pos"] = spec_stats.drafted_at_pos.tolist()
    result["spec_decode_accepted_at_pos"] = spec_stats.accepted_at_pos.tolist()
    result["k_histogram"] = {k: int(n) for k, n in enumerate(k_histogram.tolist()) if n}
    result["num_steps"] = num_steps
    return result
