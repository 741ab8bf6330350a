"""The decode fast path: buckets, graph keys, agreement with the reference step, CUDA graphs.

CPU tests run the eager runner (same padding and keys as the CUDA-graph runner); the graph
runner's own tests are marked gpu.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from mock_models import (
    MockModel,
    make_engine,
    perturbed_copy,
    random_prompt,
    shallow_target,
    target_rule,
    tiny_target,
)

from dsd.backend import fast_path
from dsd.backend.engine import (
    AnyDraft,
    Draft,
    NgramDraft,
    SpecDecodeConfig,
    SpecDecodeEngine,
    target_greedy_decode,
)
from dsd.backend.executor import TorchExecutor
from dsd.backend.fast_path import (
    EnginePool,
    FastSpecDecodeEngine,
    GraphKey,
    batch_buckets,
    bucket_for,
    build_spec_decode_engine,
    kv_len_bucket,
    kv_len_buckets,
)
from dsd.backend.ngram import NgramConfig
from dsd.sim.engine import Engine, LoopConfig
from dsd.sim.models.shapes import StepShapes
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.testing.fakes import ScriptedK
from dsd.sim.types import ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec, Workload


def fast_engine(
    target,
    draft,
    *,
    runner: str = "eager",
    num_slots: int = 4,
    k_max: int = 5,
    min_kv_len: int = 16,
    device: str | None = None,
) -> FastSpecDecodeEngine:
    config = SpecDecodeConfig(num_slots=num_slots, max_model_len=96, k_max=k_max)
    return FastSpecDecodeEngine(target, draft, config, runner=runner, min_kv_len=min_kv_len)  # type: ignore[arg-type]


def run_pair(
    engines: list[SpecDecodeEngine],
    prompts: list[np.ndarray],
    num_new_tokens: int,
    k_for_step: Callable[[int, int], np.ndarray],
    arrival_steps: list[int] | None = None,
    chunk: int = 4,
) -> list[tuple[list[list[int]], list[list[int]]]]:
    """Drive several engines through the same continuous-batching schedule in lockstep.

    Returns per engine: (outputs per request, accepted counts per step). The schedule (which
    slots step, with which K) is computed once from the first engine and replayed on all, so
    the comparison is step by step.
    """
    arrivals = arrival_steps or [0] * len(prompts)
    slot_of: list[dict[int, int]] = [{} for _ in engines]
    outputs: list[dict[int, list[int]]] = [{} for _ in engines]
    accepted_logs: list[list[list[int]]] = [[] for _ in engines]
    step_index = 0
    while len(outputs[0]) < len(prompts):
        for req, prompt in enumerate(prompts):
            if arrivals[req] == step_index:
                for index, engine in enumerate(engines):
                    slot_of[index][req] = engine.alloc_slot(prompt)
        first = engines[0]
        decoding = [r for r, s in slot_of[0].items() if first.is_decoding(s)]
        prefilling = [r for r, s in slot_of[0].items() if not first.is_decoding(s)]
        ks = np.asarray(k_for_step(step_index, len(decoding)), dtype=np.int64)
        for index, engine in enumerate(engines):
            if decoding:
                slots = np.array([slot_of[index][r] for r in decoding])
                result = engine.step(slots, ks)
                accepted_logs[index].append(result.num_accepted.tolist())
            if prefilling:
                slots = np.array([slot_of[index][r] for r in prefilling])
                engine.prefill(slots, np.full(len(prefilling), chunk))
            for req in list(slot_of[index]):
                slot = slot_of[index][req]
                generated = engine.sequence(slot)[len(prompts[req]) :]
                if generated.size >= num_new_tokens:
                    outputs[index][req] = generated[:num_new_tokens].tolist()
                    engine.free_slot(slot)
                    del slot_of[index][req]
        step_index += 1
    return [
        ([outputs[i][r] for r in range(len(prompts))], accepted_logs[i])
        for i in range(len(engines))
    ]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def close_draft(target) -> torch.nn.Module:
    return perturbed_copy(target, noise_std=0.006, seed=1)


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [
        (1, (1,)),  # a single slot: one bucket
        (4, (1, 2, 4)),  # a power of two ends the list
        (6, (1, 2, 4, 6)),  # otherwise max_num_seqs closes it
        (64, (1, 2, 4, 8, 16, 32, 64)),
    ],
)
def test_batch_buckets_are_powers_of_two_then_max(max_num_seqs: int, expected) -> None:
    assert batch_buckets(max_num_seqs) == expected


@pytest.mark.parametrize(
    ("num_rows", "expected"),
    [(1, 1), (2, 2), (3, 4), (5, 6), (6, 6)],  # rows round up to the next bucket of (1,2,4,6)
)
def test_bucket_for_rounds_rows_up(num_rows: int, expected: int) -> None:
    assert bucket_for(num_rows, (1, 2, 4, 6)) == expected


def test_bucket_for_rejects_too_many_rows() -> None:
    with pytest.raises(ValueError, match="exceed"):
        bucket_for(7, (1, 2, 4, 6))


@pytest.mark.parametrize(
    ("needed", "cache_len", "min_kv_len", "expected"),
    [
        (1, 1000, 256, 256),  # short spans round up to the minimum
        (256, 1000, 256, 256),  # exact fit
        (257, 1000, 256, 512),  # doubles
        (900, 1000, 256, 1000),  # capped at the whole cache
        (5, 100, 1, 8),  # min 1: plain powers of two
    ],
)
def test_kv_len_bucket(needed: int, cache_len: int, min_kv_len: int, expected: int) -> None:
    assert kv_len_bucket(needed, cache_len, min_kv_len) == expected


@given(cache_len=st.integers(1, 3000), min_kv_len=st.integers(1, 600))
def test_kv_len_buckets_are_exactly_the_spans_a_step_can_take(cache_len, min_kv_len) -> None:
    spans = kv_len_buckets(cache_len, min_kv_len)
    assert spans == tuple(
        sorted({kv_len_bucket(n, cache_len, min_kv_len) for n in range(1, cache_len + 1)})
    )


def test_fast_eager_agrees_with_reference_token_for_token(target, close_draft) -> None:
    rng = np.random.default_rng(7)
    prompts = [random_prompt(rng, n) for n in (2, 15, 9, 21, 5)]
    k_rng = np.random.default_rng(8)
    reference = make_engine(target, Draft(close_draft), k_max=5, num_slots=4)
    fast = fast_engine(target, Draft(close_draft), k_max=5, num_slots=4)
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [reference, fast],
        prompts,
        20,
        lambda step, rows: k_rng.integers(0, 6, size=rows),  # K per row, new every step
        arrival_steps=[0, 0, 2, 12, 40],  # continuous arrivals, odd batch sizes (3 -> bucket 4)
    )
    assert fast_out == ref_out
    assert fast_acc == ref_acc
    for prompt, output in zip(prompts, fast_out, strict=True):
        assert output == target_greedy_decode(target, prompt, 20)
    assert sum(map(sum, fast_acc)) > 0


@pytest.mark.parametrize("exit_layer", [1, 2])
def test_fast_eager_agrees_with_reference_for_early_exit_draft(exit_layer: int) -> None:
    target = shallow_target(seed=2, num_layers=3)
    rng = np.random.default_rng(3)
    prompts = [random_prompt(rng, n) for n in (6, 11, 4)]
    k_rng = np.random.default_rng(4)
    reference = make_engine(target, Draft.early_exit(target, exit_layer), k_max=4)
    fast = fast_engine(target, Draft.early_exit(target, exit_layer), k_max=4)
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [reference, fast], prompts, 25, lambda step, rows: k_rng.integers(0, 5, size=rows)
    )
    assert fast_out == ref_out
    assert fast_acc == ref_acc


def test_fast_eager_agrees_with_reference_for_ngram_draft(target) -> None:
    # Prompts that repeat themselves, so prompt lookup finds drafts (and sometimes none).
    rng = np.random.default_rng(5)
    prompts = [np.tile(random_prompt(rng, n), 3) for n in (3, 5, 4, 7)]
    k_rng = np.random.default_rng(6)
    draft = NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    reference = make_engine(target, draft, k_max=5, num_slots=4)
    fast = fast_engine(target, draft, k_max=5, num_slots=4)
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [reference, fast],
        prompts,
        24,
        lambda step, rows: k_rng.integers(0, 6, size=rows),
        arrival_steps=[0, 0, 3, 9],
    )
    assert fast_out == ref_out
    assert fast_acc == ref_acc
    for prompt, output in zip(prompts, fast_out, strict=True):
        assert output == target_greedy_decode(target, prompt, 24)
    assert sum(map(sum, fast_acc)) > 0  # drafts were found and accepted
    # A step's K is the widest lookup found (<= the asked K): keys below k_max appear
    assert {key.num_spec_tokens for key in fast.runner.keys_seen} - {0}


def test_graph_keys_stay_fixed_when_k_flips(target, close_draft) -> None:
    fast = fast_engine(target, Draft(close_draft), k_max=4, min_kv_len=128)
    rng = np.random.default_rng(0)
    slots = np.array([fast.alloc_slot(random_prompt(rng, 5)) for _ in range(3)])
    fast.prefill(slots, np.full(3, 5))
    schedule = [0, 3, 1, 0, 3, 3, 1, 0]  # K flips every step
    for k in schedule:  # first pass: every (bucket, K) is seen once
        fast.step(slots, np.full(3, k))
    keys_after_first_pass = set(fast.runner.keys_seen)
    # 3 rows -> bucket 4; min_kv_len 128 exceeds the 102-position cache, so one span: all of it.
    cache_len = fast.config.cache_len
    assert keys_after_first_pass == {GraphKey(4, k, cache_len) for k in (0, 1, 3)}
    for k in schedule * 2:  # flipping K again adds no key
        fast.step(slots, np.full(3, k))
    assert fast.runner.keys_seen == keys_after_first_pass


def test_fast_path_draft_does_no_work_at_k0_and_catches_up_eagerly() -> None:
    target = MockModel(target_rule)
    draft = MockModel(target_rule)
    config = SpecDecodeConfig(num_slots=2, max_model_len=64, k_max=3)
    engine = FastSpecDecodeEngine(target, Draft(draft), config, min_kv_len=8)  # type: ignore[arg-type]
    slot = engine.alloc_slot(np.array([5, 6, 7]))
    engine.prefill(np.array([slot]), np.array([3]))
    draft.calls.clear()
    for _ in range(4):
        engine.step(np.array([slot]), np.array([0]))
    assert draft.calls == []  # K = 0: no draft forward, not even a padded one
    assert engine.draft_cache is not None and engine.draft_cache.lengths[slot] == 3
    result = engine.step(np.array([slot]), np.array([2]))
    # Eager catch-up of the 4 lagging tokens, then two fixed-shape width-1 forwards (bucket 1).
    assert draft.calls == [(1, 4), (1, 1), (1, 1)]
    assert int(result.num_accepted[0]) == 2


def test_fast_path_rejects_sampling_temperature(target, close_draft) -> None:
    config = SpecDecodeConfig(num_slots=2, max_model_len=32, k_max=2, temperature=0.7)
    with pytest.raises(ValueError, match="greedy only"):
        FastSpecDecodeEngine(target, Draft(close_draft), config)


def test_build_engine_picks_the_path(target, close_draft) -> None:
    config = SpecDecodeConfig(num_slots=2, max_model_len=32, k_max=2)
    assert (
        type(build_spec_decode_engine(target, Draft(close_draft), config, "off"))
        is SpecDecodeEngine
    )
    assert isinstance(
        build_spec_decode_engine(target, Draft(close_draft), config, "eager"), FastSpecDecodeEngine
    )
    with pytest.raises(ValueError, match="fast_path"):
        build_spec_decode_engine(target, Draft(close_draft), config, "turbo")


def _loop_outputs(
    target, draft, fast_path: str, engines: EnginePool | None = None
) -> tuple[dict[int, list[int]], list[int]]:
    """(output ids per request, accepted tokens per step) of a short run in the engine loop."""
    executor, accepted = _loop_run(target, draft, fast_path, engines)
    return _outputs(executor), accepted


def _outputs(executor: TorchExecutor) -> dict[int, list[int]]:
    return {r: ids.tolist() for r, ids in sorted(executor.all_output_ids().items())}


def _loop_run(
    target, draft, fast_path: str, engines: EnginePool | None
) -> tuple[TorchExecutor, list[int]]:
    """(the executor, accepted tokens per step) of a short run in the engine loop."""
    executor = TorchExecutor(
        target,
        Draft(draft),
        max_num_seqs=4,
        max_model_len=96,
        k_max=4,
        ignore_eos=True,
        fast_path=fast_path,
        engines=engines,
    )
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=96,
            num_kv_blocks=128,
            block_size=4,
            k_max=4,
            max_num_seqs=4,
            max_num_batched_tokens=32,
        )
    )
    requests = tuple(RequestSpec(prompt_len=n, output_len=18) for n in (5, 9, 3, 14, 7, 2))
    policy = ScriptedK([3, 0, 4, 1, 2, 0, 4])  # K flips every step, back to 0 at times
    result = Engine(
        scheduler,
        executor,
        policy,
        Workload("t", requests, max_concurrency=3),
        LoopConfig(clock="wall"),
    ).run()
    return executor, result.steps["num_accepted_tokens"].tolist()


def test_executor_fast_path_matches_reference_in_the_engine_loop(target, close_draft) -> None:
    reference = _loop_outputs(target, close_draft, "off")
    fast = _loop_outputs(target, close_draft, "eager")
    assert fast == reference  # same outputs and the same accepted count at every step
    assert len(reference[0]) == 6
    assert sum(reference[1]) > 0


class _RecordingExecutor:
    """A TorchExecutor that keeps each step's batch and outcome (what the simulator sees)."""

    def __init__(self, inner: TorchExecutor) -> None:
        self.inner = inner
        self.steps: list[tuple[ScheduledBatch, StepOutcome]] = []

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        self.inner.add_request(req_id, spec)

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        outcome = self.inner.execute(batch)
        self.steps.append((batch, outcome))
        return outcome


@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
def test_the_simulator_prices_the_shape_the_fast_path_runs_each_step_at(
    target, close_draft, draft_kind: str
) -> None:
    # sim.models.shapes on each step's batch and drafted counts (all the simulator knows) names the
    # GraphKey the engine ran: padded rows, the widest drafts found, the kv bucket
    draft: AnyDraft = (
        Draft(close_draft)
        if draft_kind == "model"
        else NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    )
    max_model_len, k_max, max_num_seqs = 300, 4, 4
    executor = TorchExecutor(
        target,
        draft,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        k_max=k_max,
        ignore_eos=True,
        fast_path="eager",
    )
    runner = executor.engine.runner  # type: ignore[attr-defined]
    keys: list[GraphKey] = []
    run_key = runner.run

    def recording_run(key: GraphKey, host_inputs):  # type: ignore[no-untyped-def]
        keys.append(key)
        return run_key(key, host_inputs)

    runner.run = recording_run
    recording = _RecordingExecutor(executor)
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=max_model_len,
            num_kv_blocks=400,
            block_size=4,
            k_max=k_max,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=64,
        )
    )
    requests = tuple(RequestSpec(prompt_len=n, output_len=20) for n in (5, 246, 3, 14, 240))
    Engine(
        scheduler,
        recording,
        ScriptedK([3, 0, 4, 1, 2, 0, 4]),
        Workload("t", requests, max_concurrency=4),
        LoopConfig(clock="wall"),
    ).run()
    shapes = StepShapes.of_engine(max_num_seqs, max_model_len, k_max)
    decode_steps = [(b, o) for b, o in recording.steps if b.num_decode_reqs > 0]
    assert len(decode_steps) == len(keys)
    for (batch, outcome), key in zip(decode_steps, keys, strict=True):
        rows = batch.num_decode_reqs
        drafted = (
            batch.num_spec_tokens[:rows] if outcome.num_drafted is None else outcome.num_drafted
        )
        k = int(drafted.max())
        longest = int(batch.num_computed_tokens[:rows].max())
        assert key == GraphKey(shapes.rows(rows), k, shapes.span(longest, k))
    assert {key.kv_len for key in keys} == {256, shapes.cache_len}
    assert {key.num_rows for key in keys} >= {1, 4}
    assert any(batch.num_decode_reqs == 3 for batch, _ in decode_steps)  # run as 4 rows


def test_pooled_fast_engine_serves_every_run_of_its_config_with_the_same_results(
    target, close_draft
) -> None:
    engines = EnginePool()
    reference = _loop_outputs(target, close_draft, "off", engines)
    first_executor, first_accepted = _loop_run(target, close_draft, "eager", engines)
    first = (_outputs(first_executor), first_accepted)
    pooled = first_executor.engine
    assert pooled.num_free_slots < pooled.config.num_slots  # the last finished still hold slots
    shapes = set(pooled.runner.keys_seen)  # type: ignore[attr-defined]
    again_executor, again_accepted = _loop_run(target, close_draft, "eager", engines)
    assert again_executor.engine is pooled
    assert reference == first == (_outputs(again_executor), again_accepted)  # as a fresh one
    assert _outputs(first_executor) == first[0]  # released: its outputs kept, not overwritten
    assert len(engines) == 1  # one engine for the two eager runs; none kept for "off"
    assert pooled.runner.keys_seen == shapes  # type: ignore[attr-defined]  # nothing new ran


def test_engine_pool_keys_by_config_and_refuses_an_engine_that_holds_requests(
    target, close_draft
) -> None:
    engines = EnginePool()
    config = SpecDecodeConfig(num_slots=2, max_model_len=32, k_max=2, temperature=0.0, seed=3)
    first = engines.engine(target, Draft(close_draft), config, "eager")
    assert engines.engine(target, Draft(close_draft), config, "eager") is first
    other = dataclasses.replace(config, max_model_len=48)
    assert engines.engine(target, Draft(close_draft), other, "eager") is not first
    plain = dataclasses.replace(config, k_max=0)
    assert engines.engine(target, None, plain, "off") is not engines.engine(
        target, None, plain, "off"
    )  # the reference path is never pooled
    first.alloc_slot(np.array([1, 2, 3]))  # a user that gives no release keeps its slots
    with pytest.raises(RuntimeError, match="still holds requests"):
        engines.engine(target, Draft(close_draft), config, "eager")


def test_every_shape_runs_once_up_front_and_leaves_the_results_alone(target, close_draft) -> None:
    fast = fast_engine(target, Draft(close_draft), k_max=3, num_slots=4, min_kv_len=32)
    count = fast.run_every_shape()
    # buckets 1, 2, 4; K 0..3; spans 32, 64 and the cache length (99)
    assert count == len(fast.all_graph_keys()) == 3 * 4 * 3
    assert fast.runner.keys_seen == set(fast.all_graph_keys())
    rng = np.random.default_rng(11)
    prompts = [random_prompt(rng, n) for n in (4, 9, 6)]
    k_rng = np.random.default_rng(12)
    reference = make_engine(target, Draft(close_draft), k_max=3, num_slots=4)
    (ref_out, ref_acc), (fast_out, fast_acc) = run_pair(
        [reference, fast], prompts, 16, lambda step, rows: k_rng.integers(0, 4, size=rows)
    )
    assert (fast_out, fast_acc) == (ref_out, ref_acc)
    assert fast.runner.keys_seen == set(fast.all_graph_keys())  # no step ran a new shape


def test_the_matrix_library_follows_the_rows_of_the_target_forward(monkeypatch, target) -> None:
    """DSD_CUBLASLT_MAX_ROWS=N: steps of bucket x (K + 1) <= N rows on cuBLASLt, the others on
    cuBLAS; unset or 0: torch's choice; not an integer: one line naming the variable. On the
    CPU the runner ignores it."""
    from dsd.backend.fast_path import GraphKey, cublaslt_max_rows, step_blas_library
    from dsd.common.errors import InputError

    monkeypatch.delenv("DSD_CUBLASLT_MAX_ROWS", raising=False)
    assert cublaslt_max_rows() == 0
    monkeypatch.setenv("DSD_CUBLASLT_MAX_ROWS", " 16 ")
    assert cublaslt_max_rows() == 16
    rows = {(1, 6): "cublaslt", (2, 7): "cublaslt", (4, 3): "cublaslt", (8, 2): "cublas"}
    for (bucket, k), library in rows.items():
        assert step_blas_library(GraphKey(bucket, k, 64), 16) == library
    assert step_blas_library(GraphKey(1, 0, 64), 0) is None
    for bad in ("-1", "16.5", "lt"):
        monkeypatch.setenv("DSD_CUBLASLT_MAX_ROWS", bad)
        with pytest.raises(InputError, match=f"DSD_CUBLASLT_MAX_ROWS: .*{bad!r}"):
            cublaslt_max_rows()
    cpu = fast_engine(target, None, k_max=0)  # the variable is not read off CUDA
    assert cpu.runner.cublaslt_max_rows == 0


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("cublaslt_max_rows", ["", "16"])
def test_cuda_graph_runner_agrees_with_reference_and_captures_once_per_key(
    monkeypatch, cublaslt_max_rows
) -> None:
    # also with the matrix library chosen per step shape: float32 tokens must not change
    monkeypatch.setenv("DSD_CUBLASLT_MAX_ROWS", cublaslt_max_rows)
    device = torch.device("cuda")
    torch.manual_seed(0)
    target = tiny_target(seed=0).to(device)
    draft = perturbed_copy(tiny_target(seed=0), noise_std=0.006, seed=1).to(device)
    rng = np.random.default_rng(7)
    prompts = [random_prompt(rng, n) for n in (2, 15, 9, 21, 5)]
    k_rng = np.random.default_rng(8)
    reference = make_engine(target, Draft(draft), k_max=5, num_slots=4)
    graphs = fast_engine(target, Draft(draft), runner="cuda-graphs", k_max=5, num_slots=4)
    (ref_out, ref_acc), (graph_out, graph_acc) = run_pair(
        [reference, graphs],
        prompts,
        20,
        lambda step, rows: k_rng.integers(0, 6, size=rows),
        arrival_steps=[0, 0, 2, 12, 40],
    )
    assert graph_out == ref_out
    assert graph_acc == ref_acc
    runner = graphs.runner
    assert runner.num_captures == len(runner.keys_seen)  # type: ignore[attr-defined]


@pytest.mark.gpu
@pytest.mark.parametrize("cublaslt_max_rows", ["", "16"])
def test_cuda_graph_runner_agrees_with_reference_for_ngram_draft(
    monkeypatch, cublaslt_max_rows
) -> None:
    monkeypatch.setenv("DSD_CUBLASLT_MAX_ROWS", cublaslt_max_rows)
    target = tiny_target(seed=0).to(torch.device("cuda"))
    rng = np.random.default_rng(5)
    prompts = [np.tile(random_prompt(rng, n), 3) for n in (3, 5, 4, 7)]
    k_rng = np.random.default_rng(6)
    draft = NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    reference = make_engine(target, draft, k_max=5, num_slots=4)
    graphs = fast_engine(target, draft, runner="cuda-graphs", k_max=5, num_slots=4)
    (ref_out, ref_acc), (graph_out, graph_acc) = run_pair(
        [reference, graphs], prompts, 24, lambda step, rows: k_rng.integers(0, 6, size=rows)
    )
    assert graph_out == ref_out
    assert graph_acc == ref_acc
    assert sum(map(sum, graph_acc)) > 0
    runner = graphs.runner
    assert runner.num_captures == len(runner.keys_seen)  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_pooled_cuda_graph_engine_captures_every_shape_when_built_and_none_in_a_run() -> None:
    target = tiny_target(seed=0).to(torch.device("cuda"))
    draft = NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    config = SpecDecodeConfig(num_slots=4, max_model_len=96, k_max=5)
    engines = EnginePool()
    engine = engines.engine(target, draft, config, "cuda-graphs")
    assert isinstance(engine, FastSpecDecodeEngine)
    captures = engine.runner.num_captures  # type: ignore[attr-defined]
    assert captures == len(engine.all_graph_keys())
    rng = np.random.default_rng(5)
    prompts = [np.tile(random_prompt(rng, n), 3) for n in (3, 5, 4, 7)]
    k_rng = np.random.default_rng(6)
    reference = make_engine(target, draft, k_max=5, num_slots=4)
    (ref_out, _), (out, _) = run_pair(
        [reference, engine], prompts, 24, lambda step, rows: k_rng.integers(0, 6, size=rows)
    )
    assert out == ref_out
    assert engine.runner.num_captures == captures  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_cuda_graph_capture_count_stays_fixed_when_k_flips() -> None:
    device = torch.device("cuda")
    target = tiny_target(seed=0).to(device)
    draft = perturbed_copy(tiny_target(seed=0), noise_std=0.006, seed=1).to(device)
    engine = fast_engine(target, Draft(draft), runner="cuda-graphs", k_max=4, min_kv_len=128)
    rng = np.random.default_rng(0)
    slots = np.array([engine.alloc_slot(random_prompt(rng, 5)) for _ in range(3)])
    engine.prefill(slots, np.full(3, 5))
    schedule = [0, 3, 1, 0, 3, 3, 1, 0]
    for k in schedule:
        engine.step(slots, np.full(3, k))
    captures = engine.runner.num_captures  # type: ignore[attr-defined]
    assert captures == 3  # (bucket 4, K) for K in 0, 1, 3
    for k in schedule * 2:
        engine.step(slots, np.full(3, k))
    assert engine.runner.num_captures == captures  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_cuda_graph_bf16_greedy_matches_eager_fast_path() -> None:
    # bf16: agreement with the eager fixed-shape path (same kernels, same shapes), not with a
    # float32 reference, since bf16 rounding may flip near-ties.
    device = torch.device("cuda")
    target = tiny_target(seed=0).to(device=device, dtype=torch.bfloat16)
    draft = perturbed_copy(tiny_target(seed=0), noise_std=0.006, seed=1).to(
        device=device, dtype=torch.bfloat16
    )
    rng = np.random.default_rng(1)
    prompts = [random_prompt(rng, n) for n in (4, 8, 6)]
    eager = fast_engine(target, Draft(draft), runner="eager", k_max=3)
    graphs = fast_engine(target, Draft(draft), runner="cuda-graphs", k_max=3)
    k_rng = np.random.default_rng(2)
    (eager_out, _), (graph_out, _) = run_pair(
        [eager, graphs], prompts, 24, lambda step, rows: k_rng.integers(0, 4, size=rows)
    )
    assert graph_out == eager_out


@pytest.mark.gpu
def test_cuda_graph_capture_survives_garbage_graphs_collected_during_it(monkeypatch) -> None:
    # A dropped graph engine is a cycle (engine <-> runner) holding its graphs. Here the
    # collector runs whenever a capture's forward finds it enabled, as an automatic collection
    # would: freeing the old graphs mid-capture resets them, which fails the capture (seen in
    # the profiler on an H100) unless the capture pauses the collector.
    target = tiny_target(seed=0).to(torch.device("cuda"))
    draft = NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    old = fast_engine(target, draft, runner="cuda-graphs", k_max=2, num_slots=2)
    old.run_every_shape()
    assert old.runner.num_captures > 0  # type: ignore[attr-defined]
    collector_enabled_in_capture: list[bool] = []
    real_step = fast_path.fixed_shape_step

    def step_collecting_if_enabled(*args, **kwargs):  # type: ignore[no-untyped-def]
        if torch.cuda.is_current_stream_capturing():
            collector_enabled_in_capture.append(gc.isenabled())
            if gc.isenabled():
                gc.collect()
        return real_step(*args, **kwargs)

    monkeypatch.setattr(fast_path, "fixed_shape_step", step_collecting_if_enabled)
    thresholds = gc.get_threshold()
    gc.set_threshold(10**9)  # no automatic collection before the captures: the cycle survives
    try:
        del old
        new = fast_engine(target, draft, runner="cuda-graphs", k_max=2, num_slots=2)
        count = new.run_every_shape()
    finally:
        gc.set_threshold(*thresholds)
    assert count == new.runner.num_captures == len(new.all_graph_keys())  # type: ignore[attr-defined]
    assert collector_enabled_in_capture and not any(collector_enabled_in_capture)


# ------------------------------------------------------------------------- GPU benchmark script
def _load_benchmark():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_gpu.py"
    spec = importlib.util.spec_from_file_location("engine_gpu", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_engine_gpu_benchmark_parses_args_and_dry_runs_on_cpu(tmp_path) -> None:
    import json

    benchmark = _load_benchmark()
    args = benchmark.parse_args(["--batch-sizes", "1,16", "--k", "2"])
    assert args.batch_size_list == [1, 16] and args.k == 2
    with pytest.raises(SystemExit, match="--variants: choose from"):
        benchmark.parse_args(["--variants", "baseline,turbo"])
    out = tmp_path / "engine_gpu.json"
    assert benchmark.main(["--dry-run", "--out", str(out)]) == 0
    text = out.read_text()
    result = json.loads(text, parse_constant=lambda word: pytest.fail(f"not strict JSON: {word}"))
    assert result["dry_run"] is True
    assert set(result) >= {"a_plain_decode", "b_k0_tax", "c_sd_speedup", "device", "versions"}
    assert result["a_plain_decode"]["by_batch_size"]["1"]["tpot_ms"] > 0
    # every variant ran at B = 1 (the compiled ones traced by dynamo), the large-B pair at B = 2
    by_b = result["by_batch_size"]
    assert set(by_b["1"]["by_variant"]) == set(benchmark.VARIANTS)
    assert set(by_b["2"]["by_variant"]) == {"baseline", "all"}
    for entry in [*by_b["1"]["by_variant"].values(), *by_b["2"]["by_variant"].values()]:
        assert entry["error"] is None and len(entry["rounds_ms"]) == 2 and entry["tpot_ms"] > 0
        assert entry["achieved_gb_s"] > 0 and entry["achieved_tflop_s"] > 0
    assert set(result["k0_tax"]) == {"baseline", "all"} and set(result["sd_step"]) == {"baseline"}
    for part in ("k0_tax", "sd_step"):
        assert all(not entry["errors"] for entry in result[part].values())
    assert result["b_k0_tax"]["variant"] == "all" and result["c_sd_speedup"]["itl_k_ms"] > 0
    assert result["compile_stats"]["unique_graphs"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_engine_gpu_benchmark_exits_with_a_message_without_cuda(tmp_path) -> None:
    benchmark = _load_benchmark()
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        benchmark.main(["--out", str(tmp_path / "x.json")])
