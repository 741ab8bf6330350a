"""Differential oracle: vLLM 0.33's real v1 scheduler driven on a workload, step by step.

`run_vllm` builds `vllm.v1.core.sched.scheduler.Scheduler` (sync) or `AsyncScheduler` (async)
from our `SchedulerConfig`, adds every request before the first step, and plays the model
runner itself: each step it samples the tokens we choose (`accepted`) and hands the drafter's
proposals back (`k_per_step` dummy draft ids), exactly where vLLM's EngineCore does. It records
what the scheduler scheduled each step, to compare with `dsd.sim.scheduler.Scheduler`.

It is NOT a vLLM engine: no model, no worker, no tokenizer, no timing, no EOS; prefix caching
is off, arrivals are ignored. It needs vLLM 0.33 importable (CPU-only is enough: set
`VLLM_TARGET_DEVICE=cpu` before the first import) and never runs in the simulator itself.

Config mapping: max_model_len, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
long_prefill_token_threshold -> vLLM's SchedulerConfig; block_size -> CacheConfig and one
FullAttentionSpec KV group; k_max -> SpeculativeConfig(method="ngram", num_speculative_tokens
= k_max) in sync mode, method="ngram_gpu" in async mode (VllmConfig refuses async + "ngram"
with the V1 model runner, which is what a machine without Triton gets; the V2 model runner, the
GPU default, accepts both; neither the method nor the runner changes the scheduler: no
lookahead slots, pipeline parallel 1); no SpeculativeConfig when k_max = 0. num_kv_blocks
usable blocks -> KVCacheConfig(num_blocks = num_kv_blocks + 1), because vLLM's BlockPool takes
block 0 as its null block. Everything else is vLLM's default (in particular
scheduler_reserve_full_isl=True, watermark 0, FCFS). vLLM's CPU platform forces
async_scheduling=False in the VllmConfig; we set it back (the scheduler reads it only for PP).

Step sequence, sync (EngineCore.step + post_step):
    out = scheduler.schedule()
    scheduler.update_from_output(out, model_runner_output(out))
    if out.total_num_scheduled_tokens > 0:
        scheduler.update_draft_token_ids(DraftTokenIds(scheduled ids, K drafts each))
repeated while scheduler.has_requests() (which stays True one extra, empty, step after the last
finish, to flush finished ids). K is k_per_step at that step: drafts proposed after step t are
verified at step t+1. vLLM itself ignores drafts of partial prefill chunks and finished
requests; a request whose prompt completes at step t gets step t's drafts.

Step sequence, async (EngineCore.step_with_batch_queue, batch queue of 2), one call each:
    if scheduler.has_requests():
        out = scheduler.schedule(); queue.appendleft(out)
        if len(queue) < 2 and (out has tokens or scheduler.has_requests()): next call
    elif queue is empty: stop
    scheduler.update_from_output(queue.pop(), its model_runner_output)
so schedule(t+1) runs before update_from_output(t). No update_draft_token_ids: the
AsyncScheduler gives every scheduled decode row placeholder drafts ([-1] *
out.num_spec_tokens_to_schedule) for its next step and the worker fills them in. vLLM's only
knob for that count is dynamic SD (`dynamic_sd_lookup`, by batch size): to apply k_per_step we
set `scheduler.dynamic_sd_lookup` to a constant K before each schedule() (left as vLLM builds it,
None, when k_per_step is the int k_max). Side effect of a non-None lookup: vLLM then does not pad
a newly admitted 1-token prefill to 1 + k_max tokens.

Model runner output: a row with d > 0 scheduled drafts samples a + 1 tokens, a = min(accepted(
step, request index, d), d); a row whose chunk completes its (re)prompt samples 1; a partial
chunk samples none. Decided when the step is scheduled (`request.is_prefill_chunk`). One
exception: vLLM pads a request admitted with a 1-token prefill, while other requests decode, to
1 + k_max tokens with k_max drafts of id -1 (uniform batches for CUDA graphs; not with a dynamic
SD lookup); such a row samples 1 token (a = 0, `accepted` is not asked), as no model accepts -1.

Steps are numbered over non-empty SchedulerOutputs only (what our scheduler counts); the
`VllmRun.steps` has one dict per such step: {request index: (num_scheduled_tokens,
num_scheduled_spec_tokens)}. vLLM's module is imported with importlib so that mypy does not
analyse vLLM (it ships py.typed and is large).
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dsd.sim.scheduler import SchedulerConfig
from dsd.traces.workload import RequestSpec

# Token ids: prompts use ids >= _FIRST_PROMPT_TOKEN, samples and drafts _SAMPLED_TOKEN; none is
# the config's EOS (2) or BOS (1), and requests ignore EOS anyway.
_FIRST_PROMPT_TOKEN = 10
_SAMPLED_TOKEN = 7
_VOCAB_SIZE = 1000


def _vllm(name: str) -> Any:
    """A vLLM module, typed Any (see the module docstring)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
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
    """vLLM's Scheduler (sync) or AsyncScheduler (async) for our config (see module docstring)."""
    vconfig = _vllm("vllm.config")
    kv_interface = _vllm("vllm.v1.kv_cache_interface")
    structured = _vllm("vllm.v1.structured_output")
    is_async = config.scheduling == "async"
    with tempfile.TemporaryDirectory(prefix="dsd-vllm-oracle-") as folder:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as out:
            json.dump(_llama_config(config.max_model_len), out)
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
        if config.k_max > 0:
            speculative_config = vconfig.SpeculativeConfig(
                method="ngram_gpu" if is_async else "ngram",
                num_speculative_tokens=config.k_max,
                prompt_lookup_min=1,
                prompt_lookup_max=3,
            )
        vllm_config = vconfig.VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            speculative_config=speculative_config,
        )
    # vLLM's CPU platform turns async scheduling off; the GPU default keeps it.
    vllm_config.scheduler_config.async_scheduling = is_async
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
class VllmRun:
    """What `run_vllm` saw."""

    # per non-empty step: {request index: (num_scheduled_tokens, num_scheduled_spec_tokens)}
    steps: list[dict[int, tuple[int, int]]]
    num_output_tokens: list[int]  # per request: output tokens vLLM kept (after stop trimming)
    num_preemptions: list[int]  # per request: times vLLM preempted it


def run_vllm(
    config: SchedulerConfig,
    requests: Sequence[RequestSpec],
    k_per_step: Sequence[int] | int,
    accepted: Callable[[int, int, int], int],
    max_steps: int = 10_000,
) -> VllmRun:
    """Run vLLM's scheduler on `requests` (all added before the first step) to completion.

    `k_per_step`: the drafter's K after each step (one int, or one per step; steps past the end
    reuse the last entry), clamped to [0, k_max]. `accepted(step, request index, d)`: accepted
    drafts of a row that verifies d > 0 drafts (clamped to [0, d]). Returns the scheduled steps
    and each request's output tokens and preemptions at the end. Raises RuntimeError if the
    requests do not all finish within `max_steps` scheduler calls; vLLM's own config checks
    raise too (e.g. it wants max_num_batched_tokens >= max_num_seqs).
    """
    outputs_module = _vllm("vllm.v1.outputs")
    scheduler = build_vllm_scheduler(config)
    is_async = config.scheduling == "async"
    if isinstance(k_per_step, int):
        ks: list[int] = [k_per_step]
    else:
        ks = [int(k) for k in k_per_step]
        if not ks:
            raise ValueError("k_per_step: empty sequence")
    ks = [min(max(k, 0), config.k_max) for k in ks]
    default_lookup = isinstance(k_per_step, int) and ks[0] == config.k_max

    def k_at(step: int) -> int:
        return ks[min(step, len(ks) - 1)]

    vllm_requests = [_make_request(index, spec) for index, spec in enumerate(requests)]
    for request in vllm_requests:
        scheduler.add_request(request)

    steps: list[dict[int, tuple[int, int]]] = []

    def schedule() -> tuple[Any, Any]:
        """One schedule() call and the model runner output of the step it builds."""
        step = len(steps)
        if is_async and config.k_max > 0 and not default_lookup:
            scheduler.dynamic_sd_lookup = [k_at(step)] * (config.max_num_seqs + 1)
        was_running = {request.request_id for request in scheduler.running}
        out = scheduler.schedule()
        req_ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        record: dict[int, tuple[int, int]] = {}
        for req_id in req_ids:
            drafts = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
            record[int(req_id)] = (int(out.num_scheduled_tokens[req_id]), drafts)
            if scheduler.requests[req_id].is_prefill_chunk:
                sampled.append([])  # partial chunk: nothing sampled
                continue
            num_accepted = 0
            # A request admitted in this step with drafts is one vLLM padded (a 1-token
            # prefill padded to 1 + k_max with -1 drafts): no model accepts those.
            if drafts and req_id in was_running:
                num_accepted = min(max(int(accepted(step, int(req_id), drafts)), 0), drafts)
            sampled.append([_SAMPLED_TOKEN] * (num_accepted + 1))
        if req_ids:
            steps.append(record)
        model_output = outputs_module.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        return out, model_output

    calls = 0
    if not is_async:
        while scheduler.has_requests():
            calls += 1
            if calls > max_steps:
                raise RuntimeError(f"vLLM oracle: not finished within {max_steps} steps")
            out, model_output = schedule()
            scheduler.update_from_output(out, model_output)
            if config.k_max > 0 and out.total_num_scheduled_tokens > 0:
                # EngineCore.post_step: take_draft_token_ids() -> update_draft_token_ids().
                # The V1 model runner's batch holds the requests scheduled in this step.
                k = k_at(len(steps) - 1)
                req_ids = list(out.num_scheduled_tokens)
                drafts = [[_SAMPLED_TOKEN] * k for _ in req_ids]
                scheduler.update_draft_token_ids(outputs_module.DraftTokenIds(req_ids, drafts))
    else:
        queue: deque[tuple[Any, Any]] = deque()
        while True:
            calls += 1
            if calls > 2 * max_steps:
                raise RuntimeError(f"vLLM oracle: not finished within {max_steps} steps")
            if scheduler.has_requests():
                out, model_output = schedule()
                queue.appendleft((out, model_output))
                executed = out.total_num_scheduled_tokens > 0
                if len(queue) < 2 and (executed or scheduler.has_requests()):
                    continue
            elif not queue:
                break
            done, model_output = queue.pop()
            scheduler.update_from_output(done, model_output)
    if scheduler.get_num_unfinished_requests():
        raise RuntimeError("vLLM oracle: requests left unfinished")
    return VllmRun(
        steps=steps,
        num_output_tokens=[int(request.num_output_tokens) for request in vllm_requests],
        num_preemptions=[int(request.num_preemptions) for request in vllm_requests],
    )
