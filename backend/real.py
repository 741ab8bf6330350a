"""A real run: a `RunConfig` and a `ModelPair` through the one engine build, on the wall clock.

`resolve_real(config, pair)` resolves the config against the workload the pair really serves
(prompt lengths re-measured with its tokenizer; k_max 0 without a draft); `real_engine` builds
the engine with `sim.build.build_engine` and a `TorchExecutor`, so scheduler, policy, limits
and seeds are exactly the simulator's for the same config (docs/architecture.md).
`run_output_ids` / `run_prompt_ids` read back what each request generated (as the scheduler
counted it) and the prompt ids it was given; `run_step_table` the steps with the executor's own
time beside the loop's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from dsd.backend.engine import AnyDraft
from dsd.backend.executor import TorchExecutor, engine_prefill_forward
from dsd.backend.fast_path import EnginePool
from dsd.backend.model import Transformer
from dsd.backend.pair import ModelPair
from dsd.common.errors import InputError
from dsd.sim.build import build_engine, run_acceptance_model
from dsd.sim.config import RunConfig
from dsd.sim.engine import Engine, LoopConfig, RunResult
from dsd.sim.metrics import StepSink
from dsd.sim.models.shapes import StepShapes
from dsd.sim.resolve import ResolvedRun, config_workload, resolve


def resolve_real(config: RunConfig, pair: ModelPair, fast_path: str = "off") -> ResolvedRun:
    """`sim.resolve.resolve` on the workload the pair serves; no draft runs at k_max 0. Its
    simulated twin charges steps as the engine (with `fast_path`) runs them: prefill chunks in
    the verify forward or in one of their own (`engine_prefill_forward`), every decode row's
    attention over the longest row's span, on the fast path at its fixed shapes (batch and kv
    buckets), and async steps overlapped with the planning only on CUDA (as the engine loop
    runs them)."""
    if config.scheduler != "dsd":
        raise InputError("scheduler: real runs use dsd's scheduler (--scheduler vllm simulates)")
    if pair.draft is None:
        config = dataclasses.replace(config, k_max=0)
    resolved = resolve(config, workload=pair.real_workload(config_workload(config)))
    if resolved.profile is not None and config.profile is not None:
        from dsd.backend.environment import environment_metadata, warn_if_elsewhere

        here = environment_metadata(pair.device, pair.dtype)
        warn_if_elsewhere(config.profile, resolved.profile.metadata, here)
    return dataclasses.replace(
        resolved,
        prefill_forward=engine_prefill_forward(fast_path),
        prefill_rows="padded",
        attention_span="padded",
        step_shapes=(
            None
            if fast_path == "off"
            else StepShapes.of_engine(resolved.max_running, resolved.max_model_len, resolved.k_max)
        ),
        host_overlap=pair.device.type == "cuda",
    )


def torch_executor(
    resolved: ResolvedRun,
    target: Transformer,
    draft: AnyDraft | None,
    *,
    tokenize: Callable[[str], Sequence[int]] | None = None,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    fast_path: str = "off",
    engines: EnginePool | None = None,
    drawn_acceptance: bool = False,
) -> TorchExecutor:
    """The real executor of a resolved run: slots for the most requests that can run at once,
    and the run's max_model_len, k_max and seed; its engine from `engines` when given.
    `drawn_acceptance`: accepted counts drawn from the run's acceptance model as the simulator
    draws them (`sim.build.run_acceptance_model`; tokens meaningless, EOS ignored)."""
    return TorchExecutor(
        target,
        draft,
        max_num_seqs=resolved.max_running,
        max_model_len=resolved.max_model_len,
        k_max=resolved.k_max,
        temperature=temperature,
        seed=resolved.config.seed,
        tokenize=tokenize,
        ignore_eos=ignore_eos,
        fast_path=fast_path,
        prefill_forward=resolved.prefill_forward,
        engines=engines,
        acceptance=run_acceptance_model(resolved) if drawn_acceptance else None,
    )


def real_engine(
    resolved: ResolvedRun,
    pair: ModelPair,
    *,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    fast_path: str = "off",
    step_sink: StepSink | None = None,
    engines: EnginePool | None = None,
    drawn_acceptance: bool = False,
) -> Engine:
    """The engine of a real run (wall clock), ready to `run()`; `engines`: the pool of the
    measurement it belongs to (`backend.fast_path.EnginePool`); `drawn_acceptance`: see
    `torch_executor`."""
    executor = torch_executor(
        resolved,
        pair.target,
        pair.draft,
        tokenize=pair.tokenize,
        temperature=temperature,
        ignore_eos=ignore_eos,
        fast_path=fast_path,
        engines=engines,
        drawn_acceptance=drawn_acceptance,
    )
    return build_engine(resolved, executor, LoopConfig(clock="wall", step_sink=step_sink))


def _torch_executor(engine: Engine) -> TorchExecutor:
    executor = engine.executor
    if not isinstance(executor, TorchExecutor):
        raise TypeError("a real run's engine (a TorchExecutor) is needed")
    return executor


def run_step_table(engine: Engine, result: RunResult) -> Any:
    """A finished real run's step table (pandas) with `execute_s`: each step's time inside the
    executor (model work; on CUDA up to its synchronize), beside the loop's wall `duration_s`
    of the step, which adds the host's planning, policy and bookkeeping around it."""
    steps = result.steps
    execute_s = _torch_executor(engine).execute_s
    if len(execute_s) != len(steps):
        raise RuntimeError(f"{len(execute_s)} executor steps for {len(steps)} engine steps")
    return steps.assign(execute_s=execute_s)


def run_prompt_ids(engine: Engine) -> dict[int, list[int]]:
    """req_id -> the prompt ids each request of a real run was given."""
    return {req_id: ids.tolist() for req_id, ids in _torch_executor(engine).prompt_ids.items()}


def run_output_ids(engine: Engine, result: RunResult) -> dict[int, list[int]]:
    """req_id -> the output token ids of a finished real run, cut to the tokens the scheduler
    counted (the engine may have emitted past max_tokens or an EOS within its last step)."""
    generated = _torch_executor(engine).all_output_ids()
    requests = result.requests
    counted = zip(requests["req_id"].tolist(), requests["num_output_tokens"].tolist(), strict=True)
    return {
        req_id: generated[req_id][:count].tolist()
        for req_id, count in counted
        if req_id in generated
    }
