"""TorchExecutor inside the simulator's engine loop: real outputs, preemption, async, EOS.

(Named test_torch_executor.py: tests/sim/test_executor.py exists and pytest's default import
mode needs unique test-module basenames.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mock_models import MockModel, perturbed_copy, tiny_target

from dsd.backend.engine import Draft, target_greedy_decode
from dsd.backend.executor import TorchExecutor
from dsd.common.errors import InputError
from dsd.sim.engine import Engine, LoopConfig
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.testing.fakes import ScriptedK, StaticK
from dsd.traces.workload import RequestSpec, Workload


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    return perturbed_copy(target, noise_std=0.006, seed=1)


def run_loop(
    executor: TorchExecutor,
    requests: list[RequestSpec],
    policy,
    *,
    k_max: int,
    scheduling: str = "sync",
    num_kv_blocks: int = 64,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 32,
    max_concurrency: int | None = None,
    overlap: bool | None = True,
):
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=48,
            num_kv_blocks=num_kv_blocks,
            block_size=4,
            k_max=k_max,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            scheduling=scheduling,
        )
    )
    workload = Workload("test", tuple(requests), max_concurrency=max_concurrency)
    loop = LoopConfig(clock="wall", check_invariants=True, overlap=overlap)
    return Engine(scheduler, executor, policy, workload, loop).run()


def make_executor(target, draft, k_max: int = 4, **kw) -> TorchExecutor:
    return TorchExecutor(
        target,
        None if draft is None else Draft(draft),
        max_num_seqs=4,
        max_model_len=96,
        k_max=k_max,
        ignore_eos=True,
        **kw,
    )


def synthetic_prompt(executor: TorchExecutor, req_id: int) -> np.ndarray:
    state = executor._requests.get(req_id)
    assert state is not None
    return state.token_ids[: state.num_prompt_tokens].copy()


# (scheduling mode, policy factory, KV blocks, prefill forward): blocks of 4 tokens; 12 blocks
# force preemptions; "fused" runs steps that admit prompts beside decode rows in one forward
LOOP_CASES = [
    ("sync", lambda: StaticK(3), 64, "fused"),  # plain continuous batching, static K
    ("sync", lambda: StaticK(3), 64, "separate"),  # the same, prefill in a forward of its own
    ("async", lambda: StaticK(3), 64, "fused"),  # optimistic scheduling, one-step K lag
    ("sync", lambda: ScriptedK([0, 4, 1, 3, 2, 0, 4]), 64, "fused"),  # K changing every step
    ("sync", lambda: StaticK(2), 12, "fused"),  # KV pool too small: preemption by recompute
    ("async", lambda: ScriptedK([4, 0, 2]), 12, "fused"),  # async + preemption + changing K
    ("async", lambda: ScriptedK([4, 0, 2]), 12, "separate"),
]


@pytest.mark.parametrize(("scheduling", "policy", "num_kv_blocks", "prefill_forward"), LOOP_CASES)
def test_engine_loop_outputs_equal_target_greedy(
    target, draft, scheduling, policy, num_kv_blocks, prefill_forward
):
    executor = make_executor(target, draft, seed=3, prefill_forward=prefill_forward)
    fused_calls: list[int] = []
    real_fused = executor.engine.step_with_prefill

    def counting(*args):  # type: ignore[no-untyped-def]
        fused_calls.append(1)
        return real_fused(*args)

    executor.engine.step_with_prefill = counting  # type: ignore[method-assign]
    requests = [
        RequestSpec(prompt_len=p, output_len=o)
        for p, o in [(9, 12), (20, 7), (3, 16), (14, 10), (6, 9), (11, 12)]
    ]
    prompts: dict[int, np.ndarray] = {}
    original_add = executor.add_request

    def add_and_remember(req_id: int, spec: RequestSpec) -> None:
        original_add(req_id, spec)
        prompts[req_id] = synthetic_prompt(executor, req_id)

    executor.add_request = add_and_remember  # type: ignore[method-assign]
    result = run_loop(
        executor, requests, policy(), k_max=4, scheduling=scheduling, num_kv_blocks=num_kv_blocks
    )
    assert result.metrics["completed"] == len(requests)
    if num_kv_blocks == 12:
        assert result.num_preemptions > 0
    outputs = executor.all_output_ids()
    for req_id, spec in enumerate(requests):
        expected = target_greedy_decode(target, prompts[req_id], spec.output_len)
        assert outputs[req_id][: spec.output_len].tolist() == expected, req_id
    assert (result.steps["duration_s"] > 0).all()  # measured wall time of each step
    steps = result.steps
    decoding = steps["num_decode_reqs"]
    mixed = int(((steps["batch_size"] > decoding) & (decoding > 0)).sum())  # prompts beside decodes
    assert mixed > 0
    assert len(fused_calls) == (mixed if prefill_forward == "fused" else 0)


def test_synthetic_prompts_are_seeded_per_request(target) -> None:
    first = make_executor(target, None, k_max=0, seed=7)
    second = make_executor(target, None, k_max=0, seed=7)
    first.add_request(0, RequestSpec(prompt_len=12, output_len=1))
    first.add_request(1, RequestSpec(prompt_len=12, output_len=1))
    second.add_request(1, RequestSpec(prompt_len=12, output_len=1))  # other order, same ids
    assert np.array_equal(synthetic_prompt(first, 1), synthetic_prompt(second, 1))
    assert not np.array_equal(synthetic_prompt(first, 0), synthetic_prompt(first, 1))
    assert not np.isin(synthetic_prompt(first, 0), [1, 2]).any()  # no BOS/EOS ids


def test_text_prompt_length_must_match_tokenizer(target) -> None:
    executor = make_executor(target, None, k_max=0, tokenize=lambda text: [ord(c) for c in text])
    executor.add_request(0, RequestSpec(prompt_len=3, output_len=2, prompt="abc"))
    assert synthetic_prompt(executor, 0).tolist() == [97, 98, 99]
    with pytest.raises(InputError, match="request 1: prompt tokenizes to 2 tokens"):
        executor.add_request(1, RequestSpec(prompt_len=3, output_len=2, prompt="ab"))


def test_eos_sets_stop_index_and_finishes_early() -> None:
    eos = 2
    # The mock target emits EOS as the token at position 9, else counts up.
    target = MockModel(lambda token, position: eos if position + 1 == 9 else token + 1)
    draft = MockModel(lambda token, position: eos if position + 1 == 9 else token + 1)
    executor = TorchExecutor(
        target, Draft(draft), max_num_seqs=2, max_model_len=96, k_max=3, eos_token_ids=[eos]
    )
    executor.tokenize = lambda text: [10, 11, 12, 13]
    result = run_loop(
        executor,
        [RequestSpec(prompt_len=4, output_len=50, prompt="x")],
        StaticK(3),
        k_max=3,
    )
    # Prompt positions 0..3; outputs at positions 4..9, the last one (position 9) is EOS.
    assert result.requests["num_output_tokens"].tolist() == [6]
    assert executor.all_output_ids()[0][:6].tolist() == [14, 15, 16, 17, 18, eos]


def test_async_overlap_runs_the_step_on_a_worker_and_changes_no_token(target, draft) -> None:
    """Async with real overlap (step t on a worker thread while step t+1 is planned; requests
    sent meanwhile reach the executor after step t) gives the same tokens and the same drafted
    and accepted counts as async run serially and as sync: what a race of the kind vLLM's
    async x spec-decode PR found (a buffer overwritten while the step used it: fewer drafts
    accepted under async) would change."""
    import threading

    requests = [
        RequestSpec(prompt_len=p, output_len=o)
        for p, o in [(9, 12), (20, 7), (3, 16), (14, 10), (6, 9), (11, 12)]
    ]
    runs = {}
    step_threads: dict[str, set[threading.Thread]] = {}
    for name, scheduling, overlap in [
        ("sync", "sync", True),
        ("async serial", "async", False),
        ("async overlap", "async", True),
        # the default: overlap where the executor says it pays (CUDA), serially on a CPU
        ("async default", "async", None),
        ("async overlap again", "async", True),
    ]:
        executor = make_executor(target, draft, seed=3)
        threads: set[threading.Thread] = set()
        execute = executor.execute

        def recorded(batch, execute=execute, threads=threads):
            threads.add(threading.current_thread())
            return execute(batch)

        executor.execute = recorded  # type: ignore[method-assign]
        # a cap of 2: requests are sent while steps run (deferred to the executor under overlap)
        result = run_loop(
            executor,
            requests,
            StaticK(3),
            k_max=4,
            scheduling=scheduling,
            max_concurrency=2,
            overlap=overlap,
        )
        stats = result.spec_stats
        outputs = executor.all_output_ids()
        runs[name] = (
            [outputs[i][: spec.output_len].tolist() for i, spec in enumerate(requests)],
            (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens),
        )
        step_threads[name] = threads
        on_worker = any(t.name.startswith("dsd-step") for t in threads)
        default_overlaps = executor.overlaps_host  # dsd's engine: only on CUDA
        assert default_overlaps == (executor.engine.device.type == "cuda")
        expect_worker = name.startswith("async overlap") or (
            name == "async default" and default_overlaps
        )
        assert on_worker == expect_worker, (name, threads)
    assert runs["async overlap"] == runs["async serial"] == runs["sync"] == runs["async default"]
    assert runs["async overlap again"] == runs["async overlap"]
    # One step thread for the process (per-thread state stays warm from run to run)
    assert step_threads["async overlap again"] == step_threads["async overlap"]
    assert len(step_threads["async overlap"]) == 1
