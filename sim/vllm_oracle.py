"""vLLM 0.33's real v1 scheduler behind our scheduler's call protocol: `VllmScheduler`.

`VllmScheduler(config)` builds vLLM's `Scheduler` (sync) or `AsyncScheduler` (async) from our
`SchedulerConfig` (`build_vllm_scheduler` says how the config maps) and answers `plan_step` /
`commit_step` / `update` as `sim.scheduler.Scheduler` does, playing vLLM's model runner and
drafter. It is what `--scheduler vllm` runs, and the oracle of
tests/sim/test_vllm_scheduler_differential.py, which drives ours and this one on the same random
workloads and demands the same steps. What the comparison covers and the differences left:
docs/simulator.md, "vLLM, differentially".

It is NOT a vLLM engine: no model, no worker, no tokenizer, no EOS (requests run to max_tokens);
prefix caching is off. It needs vLLM 0.33 importable (CPU-only is enough). vLLM's modules are
imported with importlib (`_vllm`) so that mypy does not analyse vLLM (it ships py.typed and is
large).
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dsd.common import strict_json
from dsd.common.arrays import IntArray
from dsd.common.errors import InputError
from dsd.sim.scheduler import (
    SchedulerConfig,
    SpecDecodeStats,
    StepPlan,
    StepResult,
    outcome_accepted,
    split_k,
)
from dsd.sim.types import ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec

# Token ids: prompts use ids >= _FIRST_PROMPT_TOKEN, samples and drafts _SAMPLED_TOKEN; none is
# the config's EOS (2) or BOS (1), and requests ignore EOS anyway.
# The vLLM whose scheduler this module drives (its semantics were read from this version).
VLLM_VERSION = "0.33.0"
_FIRST_PROMPT_TOKEN = 10
_SAMPLED_TOKEN = 7
_VOCAB_SIZE = 1000


# Our speculative_method -> vLLM's (method, parallel_drafting). vLLM builds MTP only from an
# MTP checkpoint; its scheduler reserves for "mtp" what it reserves for "eagle" (both are
# `use_eagle()`: lookahead K, no draft slots), so the oracle stands in an EAGLE drafter.
_VLLM_METHODS: dict[str, tuple[str, bool]] = {
    "eagle": ("eagle", False),
    "eagle3": ("eagle3", False),
    "mtp": ("eagle", False),
    "draft_model": ("draft_model", False),
    "pard": ("draft_model", True),
    "p-eagle": ("eagle3", True),
}


def _vllm(name: str) -> Any:
    """A vLLM module, typed Any (see the module docstring)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # Its warnings about this CPU (no Triton, no AVX2 kernels, block sizes) are noise here.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return importlib.import_module(name)


def _llama_config(max_model_len: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": _VOCAB_SIZE,
        "max_position_embeddings": max(max_model_len, 2048),
        "torch_dtype": "float32",
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def build_vllm_scheduler(config: SchedulerConfig) -> Any:
    """vLLM's Scheduler (sync) or AsyncScheduler (async) for our config.

    max_model_len, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill and
    long_prefill_token_threshold go to vLLM's SchedulerConfig; block_size to CacheConfig and one
    FullAttentionSpec KV group of num_kv_blocks + 1 blocks (vLLM's BlockPool takes one as its
    null block). k_max with ngram is SpeculativeConfig(method="ngram") in sync mode and
    "ngram_gpu" in async mode: VllmConfig refuses async + "ngram" with the V1 model runner, which
    a machine without Triton gets (the V2 runner, the GPU default, accepts both), and the
    scheduler treats the two alike (no lookahead slots). Another method is vLLM's own
    (`_VLLM_METHODS`) with the same small Llama folder as its draft checkpoint, checked to
    reserve the KV lookahead and draft slots our config says it does; k_max = 0 has no
    SpeculativeConfig. Everything else is vLLM's default (scheduler_reserve_full_isl=True,
    watermark 0, FCFS, pipeline parallel 1). vLLM's CPU platform forces async_scheduling off in
    the VllmConfig; it is set back (the scheduler reads it only for pipeline parallelism).
    """
    vconfig = _vllm("vllm.config")
    kv_interface = _vllm("vllm.v1.kv_cache_interface")
    structured = _vllm("vllm.v1.structured_output")
    is_async = config.scheduling == "async"
    with tempfile.TemporaryDirectory(prefix="dsd-vllm-oracle-") as folder:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as out:
            out.write(strict_json.dumps(_llama_config(config.max_model_len)))
        model_config = vconfig.ModelConfig(
            model=folder,
            skip_tokenizer_init=True,
            max_model_len=config.max_model_len,
            dtype="float32",
            seed=0,
        )
        scheduler_config = vconfig.SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            async_scheduling=is_async,
        )
        cache_config = vconfig.CacheConfig(
            block_size=config.block_size, enable_prefix_caching=False
        )
        speculative_config = None
        if config.k_max > 0 and config.speculative_method == "ngram":
            speculative_config = vconfig.SpeculativeConfig(
                method="ngram_gpu" if is_async else "ngram",
                num_speculative_tokens=config.k_max,
                prompt_lookup_min=1,
                prompt_lookup_max=3,
            )
        elif config.k_max > 0:
            # A drafter with weights of its own: the same small Llama folder serves as its
            # checkpoint (the scheduler never loads it).
            method, parallel = _VLLM_METHODS[config.speculative_method]
            speculative_config = vconfig.SpeculativeConfig(
                method=method,
                model=folder,
                num_speculative_tokens=config.k_max,
                parallel_drafting=parallel,
                target_model_config=model_config,
                target_parallel_config=vconfig.ParallelConfig(),
            )
        vllm_config = vconfig.VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            speculative_config=speculative_config,
        )
    # vLLM's CPU platform turns async scheduling off; the GPU default keeps it.
    vllm_config.scheduler_config.async_scheduling = is_async
    reserved = (
        vllm_config.num_lookahead_tokens,
        0 if speculative_config is None else speculative_config.max_num_new_slots_for_drafting,
    )
    if reserved != (config.num_lookahead_tokens, config.num_draft_slots):
        raise RuntimeError(
            f"vLLM reserves (lookahead, draft slots) {reserved} for "
            f"{config.speculative_method} at K={config.k_max}, dsd "
            f"{(config.num_lookahead_tokens, config.num_draft_slots)}"
        )
    # +1: BlockPool reserves one block as the null block, so vLLM's usable pool is
    # num_blocks - 1 = our num_kv_blocks.
    num_blocks = config.num_kv_blocks + 1
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = kv_interface.FullAttentionSpec(
        block_size=config.block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=vllm_config.model_config.dtype,  # a torch.dtype, without importing torch here
    )
    kv_cache_config = kv_interface.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[kv_interface.KVCacheGroupSpec(["layer"], spec)],
    )
    if is_async:
        cls = _vllm("vllm.v1.core.sched.async_scheduler").AsyncScheduler
    else:
        cls = _vllm("vllm.v1.core.sched.scheduler").Scheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=structured.StructuredOutputManager(vllm_config),
        block_size=config.block_size,
        log_stats=False,
    )


def _make_request(index: int, spec: RequestSpec) -> Any:
    sampling = _vllm("vllm.sampling_params")
    request_module = _vllm("vllm.v1.request")
    prompt = [
        _FIRST_PROMPT_TOKEN + (j % (_VOCAB_SIZE - _FIRST_PROMPT_TOKEN))
        for j in range(spec.prompt_len)
    ]
    params = sampling.SamplingParams(max_tokens=spec.output_len, ignore_eos=True, temperature=0.0)
    return request_module.Request(
        request_id=str(index),
        prompt_token_ids=prompt,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
    )


@dataclass(frozen=True)
class _Committed:
    """A committed step, kept until its outcome: vLLM's output and the drafts proposed after it."""

    output: Any  # vLLM's SchedulerOutput
    batch: ScheduledBatch
    # per scheduled request id (vLLM's str): drafts the drafter proposes after this step (sync)
    next_drafts: dict[str, int]


class VllmScheduler:
    """`sim.scheduler.Scheduler`'s call protocol (`plan_step`, `commit_step`, `update`) over
    vLLM 0.33's own Scheduler / AsyncScheduler: what `--scheduler vllm` runs.

    `plan_step` is vLLM's `schedule()`; the K it verifies per row are the drafts vLLM already
    holds (next-step K timing, the only one vLLM has). `commit_step(plan, k)` fixes the drafts
    proposed after the step: sync, handed over by `update_draft_token_ids` after the outcome,
    as EngineCore does; async, the placeholders the AsyncScheduler reserved for the next step
    are resized to K per request (what a dynamic K table does, per row). `update` samples
    a + 1 tokens per decode row into vLLM's `update_from_output` and reads back what vLLM kept.
    Rows are ordered as ours: decode rows in running order, then prefill rows. Spec-decode
    counters are ours, over the rows whose request had not finished. Stop tokens (EOS) are not
    supported: requests run to max_tokens, as in the simulator.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        if config.k_timing != "next-step":
            raise InputError("scheduler vllm: vLLM verifies a step's K at the next step only")
        self.config = config
        self._outputs = _vllm("vllm.v1.outputs")
        self._vllm = build_vllm_scheduler(config)
        self._async = config.scheduling == "async"
        self.spec_stats = SpecDecodeStats(config.k_max)
        self.num_preemptions = 0
        self._requests: dict[int, Any] = {}  # every vLLM Request added, by our id
        self._prefill_end: dict[int, int] = {}  # requests computing a (re)prompt: its tokens
        self._finished: set[int] = set()
        self._finished_since_last: list[int] = []
        self._preempted_since_last: list[int] = []
        # the plan, vLLM's SchedulerOutput, [P] tokens in each prefill row's KV before the step
        self._pending: tuple[StepPlan, Any, IntArray] | None = None
        self._inflight: dict[int, _Committed] = {}
        self._step_index = 0

    def add_requests(self, req_ids: Sequence[int], specs: Sequence[RequestSpec]) -> None:
        for req_id, spec in zip(req_ids, specs, strict=True):
            self.add_request(req_id, spec)

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        if req_id in self._requests:
            raise ValueError(f"request {req_id} is already in the scheduler")
        if spec.prompt_len >= self.config.max_model_len:
            raise InputError(
                f"request {req_id}: prompt_len {spec.prompt_len} leaves no room for output "
                f"tokens within max_model_len {self.config.max_model_len}"
            )
        request = _make_request(req_id, spec)
        self._requests[req_id] = request
        self._prefill_end[req_id] = spec.prompt_len
        self._vllm.add_request(request)

    def has_unfinished(self) -> bool:
        return bool(self._vllm.get_num_unfinished_requests())

    def has_inflight(self) -> bool:
        return bool(self._inflight)

    def num_output_tokens(self, req_id: int) -> int:
        return int(self._requests[req_id].num_output_tokens)

    def running_positions(self, batch: ScheduledBatch) -> ScheduledBatch:
        """`batch` with its rows' confirmed output tokens as of now (see Scheduler's)."""
        positions = np.array(
            [self._requests[int(r)].num_output_tokens for r in batch.req_ids], dtype=np.int64
        )  # [B]
        return replace(batch, num_output_tokens=positions)

    def check_invariants(self) -> None:
        """Nothing of ours to check: vLLM keeps the accounting (and asserts its own)."""

    def plain_decode_steps_ahead(self) -> int:
        """vLLM's scheduler runs every step itself: never a stretch at once."""
        return 0

    def advance_plain_decode(self, num_steps: int) -> tuple[IntArray, int]:
        raise RuntimeError("VllmScheduler runs every step (plain_decode_steps_ahead is 0)")

    def plan_step(self) -> StepPlan | None:
        if self._pending is not None:
            raise RuntimeError("plan_step called twice without commit_step")
        if not self._async and self._inflight:
            raise RuntimeError("sync scheduling: update the previous step before planning")
        if not self.has_unfinished():
            return None
        out = self._vllm.schedule()
        for req_id in sorted(int(r) for r in out.preempted_req_ids or ()):
            self.num_preemptions += 1
            self._preempted_since_last.append(req_id)
        if out.total_num_scheduled_tokens == 0:
            return None  # async: the rows that fit wait for their in-flight outcome
        admitted = [int(data.req_id) for data in out.scheduled_new_reqs]
        resumed = out.scheduled_cached_reqs.resumed_req_ids
        admitted += [int(r) for r in out.scheduled_cached_reqs.req_ids if r in resumed]
        for req_id in admitted:  # a (re)prompt: the prompt and the outputs so far
            self._prefill_end[req_id] = int(self._requests[req_id].num_tokens)
        decode: list[tuple[int, int, int]] = []  # (id, tokens in KV before, drafts)
        prefill: list[tuple[int, int, int]] = []  # (id, tokens in KV before, chunk)
        for key, tokens in out.num_scheduled_tokens.items():
            req_id = int(key)
            before = int(self._requests[req_id].num_computed_tokens) - int(tokens)
            if req_id in self._prefill_end:
                prefill.append((req_id, before, int(tokens)))
            else:
                drafts = len(out.scheduled_spec_decode_tokens.get(key, ()))
                decode.append((req_id, before, drafts))
        decode_ids = np.array([row[0] for row in decode], dtype=np.int64)  # [D]
        prefill_ids = np.array([row[0] for row in prefill], dtype=np.int64)  # [P]
        chunks = np.array([row[2] for row in prefill], dtype=np.int64)  # [P]
        prefill_before = np.array([row[1] for row in prefill], dtype=np.int64)  # [P]
        ends = np.array([self._prefill_end[row[0]] for row in prefill], dtype=np.int64)  # [P]
        plan = StepPlan(
            step_index=self._step_index,
            decode_req_ids=decode_ids,
            decode_context_lens=np.array([row[1] for row in decode], dtype=np.int64),
            decode_draft_room=np.array([row[2] for row in decode], dtype=np.int64),
            prefill_req_ids=prefill_ids,
            prefill_chunk_lens=chunks,
            # a padded 1-token prompt (vLLM) schedules past its end: it completes too
            prefill_completes=prefill_before + chunks >= ends,
            new_req_ids=tuple(admitted),
            preempted_req_ids=tuple(self._preempted_since_last),
            finished_req_ids=tuple(self._finished_since_last),
            decode_slots=decode_ids,
            prefill_slots=prefill_ids,
        )
        self._preempted_since_last.clear()
        self._finished_since_last.clear()
        self._pending = (plan, out, prefill_before)
        return plan

    def commit_step(self, plan: StepPlan, k: int | IntArray) -> ScheduledBatch:
        if self._pending is None or plan is not self._pending[0]:
            raise RuntimeError("commit_step needs the plan returned by the last plan_step")
        _, out, prefill_before = self._pending
        self._pending = None
        cfg = self.config
        num_decode = plan.num_decode_reqs
        per_row, k_default = split_k(k, num_decode, cfg.k_max)
        k_rows = np.full(num_decode, k_default, dtype=np.int64) if per_row is None else per_row
        # The drafter proposes after this step for every row that will decode next: decode
        # rows their own K, rows that complete their prompt the step's K (vLLM's drafter).
        next_drafts = {
            str(int(r)): int(n) for r, n in zip(plan.decode_req_ids, k_rows, strict=True)
        }
        for req_id, done in zip(plan.prefill_req_ids, plan.prefill_completes, strict=True):
            if done:
                next_drafts[str(int(req_id))] = k_default
                del self._prefill_end[int(req_id)]
        if self._async and cfg.k_max:
            for key, num in next_drafts.items():
                self._vllm.requests[key].spec_token_ids = [-1] * num
        ids = np.concatenate([plan.decode_req_ids, plan.prefill_req_ids])  # [B]
        num_spec = plan.decode_draft_room  # [D] the drafts vLLM scheduled
        num_prefill = plan.prefill_req_ids.shape[0]
        num_scheduled = np.concatenate([num_spec + 1, plan.prefill_chunk_lens])  # [B]
        completes = np.zeros(ids.shape[0], dtype=np.bool_)  # [B]
        completes[num_decode:] = plan.prefill_completes
        batch = ScheduledBatch(
            step_index=plan.step_index,
            req_ids=ids,
            num_decode_reqs=num_decode,
            num_scheduled_tokens=num_scheduled,
            num_spec_tokens=np.concatenate([num_spec, np.zeros(num_prefill, dtype=np.int64)]),
            num_computed_tokens=np.concatenate([plan.decode_context_lens, prefill_before]),
            num_output_tokens=np.array(
                [self._requests[int(r)].num_output_tokens for r in ids], dtype=np.int64
            ),
            completes_prompt=completes,
            total_num_scheduled_tokens=int(out.total_num_scheduled_tokens),
            new_req_ids=plan.new_req_ids,
            finished_req_ids=plan.finished_req_ids,
            preempted_req_ids=plan.preempted_req_ids,
        )
        self._inflight[plan.step_index] = _Committed(out, batch, next_drafts)
        self._step_index += 1
        return batch

    def update(self, batch: ScheduledBatch, outcome: StepOutcome) -> StepResult:
        committed = self._inflight.pop(batch.step_index, None)
        if committed is None:
            raise RuntimeError(f"step {batch.step_index} is not in flight")
        if outcome.stop_index is not None and (np.asarray(outcome.stop_index) >= 0).any():
            raise ValueError("scheduler vllm: stop tokens are not supported")
        out = committed.output
        num_decode = batch.num_decode_reqs
        accepted = outcome_accepted(batch.step_index, outcome, num_decode)  # [D]
        if ((accepted < 0) | (accepted > batch.num_spec_tokens[:num_decode])).any():
            raise ValueError(f"outcome of step {batch.step_index}: accepted outside [0, K]")
        sampled: dict[str, list[int]] = {}
        for row, req_id in enumerate(batch.req_ids.tolist()):
            if row < num_decode:
                count = int(accepted[row]) + 1
            else:
                count = int(batch.completes_prompt[row])
            sampled[str(req_id)] = [_SAMPLED_TOKEN] * count
        keys = list(out.num_scheduled_tokens)
        live_decode = np.array(
            [int(r) not in self._finished for r in batch.req_ids[:num_decode].tolist()],
            dtype=np.bool_,
        )  # [D]
        before = {key: self._requests[int(key)].num_output_tokens for key in keys}
        self._vllm.update_from_output(
            out,
            self._outputs.ModelRunnerOutput(
                req_ids=keys,
                req_id_to_index={key: i for i, key in enumerate(keys)},
                sampled_token_ids=[sampled[key] for key in keys],
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=[],
            ),
        )
        drafted = batch.num_spec_tokens[:num_decode]
        if outcome.num_drafted is not None:
            drafted = np.asarray(outcome.num_drafted, dtype=np.int64)
        self.spec_stats.observe(drafted[live_decode], accepted[live_decode])
        if not self._async and self.config.k_max:
            # EngineCore.post_step: the drafts proposed after this step
            ids = list(committed.next_drafts)
            drafts = [[_SAMPLED_TOKEN] * committed.next_drafts[key] for key in ids]
            self._vllm.update_draft_token_ids(self._outputs.DraftTokenIds(ids, drafts))
        emitted = np.array(
            [self._requests[int(r)].num_output_tokens - before[str(r)] for r in batch.req_ids],
            dtype=np.int64,
        )  # [B]
        finished = tuple(
            int(r)
            for r in batch.req_ids.tolist()
            if int(r) not in self._finished and self._requests[int(r)].is_finished()
        )
        self._finished.update(finished)
        self._finished_since_last.extend(finished)
        return StepResult(
            step_index=batch.step_index,
            req_ids=batch.req_ids,
            num_output_tokens=emitted,
            finished_req_ids=finished,
            num_accepted_tokens=int(accepted.sum()),
        )
