"""TorchExecutor inside the simulator's engine loop: real outputs, preemption, async, EOS.

(Named test_torch_executor.py: tests/sim/test_executor.py exists and pytest's default import
mode needs unique test-module basenames.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mock_models import MockModel, perturbed_copy, tiny_target

from dsd.backend.engine import Draft, target_greedy_decode
from dsd.backend.executor import TorchExecutor
from dsd.common.errors import InputError
from dsd.sim.engine import Engine, LoopConfig
from dsd.sim.fakes import ScriptedK, StaticK
from dsd.sim.scheduler import Scheduler, SchedulerConfig
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
    engine = Engine(
        scheduler, executor, policy, workload, LoopConfig(clock="wall", check_invariants=True)
    )
    return engine.run()


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


# (scheduling mode, policy factory, KV blocks): blocks of 4 tokens; 12 blocks force preemptions
LOOP_CASES = [
    ("sync", lambda: StaticK(3), 64),  # plain continuous batching, static K
    ("async", lambda: StaticK(3), 64),  # optimistic scheduling, one-step K lag
    ("sync", lambda: ScriptedK([0, 4, 1, 3, 2, 0, 4]), 64),  # K changing every step
    ("sync", lambda: StaticK(2), 12),  # KV pool too small: preemption by recompute
    ("async", lambda: ScriptedK([4, 0, 2]), 12),  # async + preemption + changing K
]


@pytest.mark.parametrize(("scheduling", "policy", "num_kv_blocks"), LOOP_CASES)
def test_engine_loop_outputs_equal_target_greedy(target, draft, scheduling, policy, num_kv_blocks):
    executor = make_executor(target, draft, seed=3)
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


def test_dsd_run_prints_vllm_bench_json(capsys) -> None:
    import json

    from dsd.cli import main

    main(
        [
            "run",
            "--target", "tiny",
            "--draft", "tiny-draft",
            "--policy", "static:2",
            "--max-concurrency", "2",
            "--num-prompts", "3",
            "--dataset-name", "mt-bench",
            "--output-len", "6",
            "--ignore-eos",
            "--json",
        ]
    )  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed"] == 3
    assert metrics["total_output_tokens"] == 18  # --ignore-eos: every request gets all 6
    assert metrics["mean_tpot_ms"] > 0 and metrics["k_histogram"] == {
        "2": metrics["spec_decode_num_drafts"]
    }


# (arguments, fragment of the one-line error)
CLI_ERRORS = [
    (["--target", "tiny", "--draft", "early-exit:5"], "early-exit:5"),  # deeper than the target
    (["--target", "no-such-model"], "no-such-model"),  # neither a shape nor a file
    (["--target", "tiny", "--device", "tpu"], "--device"),  # unknown device
]


@pytest.mark.parametrize(("args", "fragment"), CLI_ERRORS)
def test_dsd_run_bad_input_exits_2_with_one_line(args, fragment, capsys) -> None:
    from dsd.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--num-prompts", "1", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1


def test_dsd_run_writes_the_run_outputs_and_the_profile_the_bandit_learnt(tmp_path, capsys) -> None:
    from dsd.cli import main
    from dsd.policies.profile_io import load_profile

    out = tmp_path / "run"
    args = ["run", "--target", "tiny", "--draft", "early-exit:1", "--num-spec-tokens", "2",
            "--num-prompts", "3", "--output-len", "8", "--max-model-len", "256", "--json",
            "--out", str(out)]  # fmt: skip
    main([*args, "--policy", "bandit"])
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["backend"] == "dsd-torch" and metrics["completed"] == 3
    assert json.loads((out / "result.json").read_text()) == metrics
    assert {p.name for p in out.iterdir()} >= {"requests.csv", "steps.parquet", "config.json"}
    learnt = load_profile(out / "learned_profile.json")
    assert learnt.k_max == 2 and learnt.metadata["observed_steps"] > 0
    # A policy that learns nothing writes no learned profile.
    main([*args[:-1], str(tmp_path / "static"), "--policy", "static:2"])
    assert not (tmp_path / "static" / "learned_profile.json").exists()
    # An --out that is a file is refused before the run, with one line.
    with pytest.raises(SystemExit) as exit_info:
        main([*args[:-1], str(out / "result.json"), "--policy", "bandit"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and err.count("\n") == 1


def test_dsd_run_takes_the_simulators_workload_flags(capsys) -> None:
    from dsd.cli import main

    # A draining rollout of 3 requests, outputs capped at 6 tokens, prompts of 20 tokens.
    main(["run", "--target", "tiny", "--draft", "early-exit:1", "--num-spec-tokens", "2",
          "--policy", "static:2", "--dataset-name", "rl-rollout", "--num-prompts", "3",
          "--rollout-median", "4", "--rollout-max", "6", "--rollout-prompt-len", "20",
          "--max-model-len", "256", "--ignore-eos", "--json"])  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed"] == 3
    assert metrics["total_input_tokens"] == 3 * 20
    assert 3 <= metrics["total_output_tokens"] <= 3 * 6
