"""The one engine build: a resolved run and an executor become an engine loop.

`build_engine(resolved, executor, loop)` is how every command gets its engine (docs/
architecture.md): the scheduler from the resolved limits, a fresh policy from the SPEC with the
run's policy seed stream, the workload, and the loop with its clock. Only the executor differs:
`fitted_executor(resolved)` for the simulator (this module), `backend.executor.torch_executor`
for the real engine; `run_acceptance_model(resolved)` is the acceptance both draw from (the real
engine under drawn acceptance). `run_simulation(config)` is the simulator's whole run in one call;
`build_fitted_executor(profile, seed, ...)` the simulator's executor without a run config
(tests, benchmarks), built the same way.

This module chooses no defaults (`sim.resolve` does) and writes no files.
"""

from __future__ import annotations

import numpy as np

from dsd.common.errors import InputError
from dsd.policies.profile import HostOverhead, Profile
from dsd.policies.types import KPolicy
from dsd.sim.config import AcceptanceKind, RunConfig
from dsd.sim.engine import Engine, LoopConfig, RunResult, StepScheduler
from dsd.sim.executor import FittedExecutor, LatencyJitter
from dsd.sim.models.ablation import FixedBatchLatency, FixedBatchPolicy, FreePrefillLatency
from dsd.sim.models.acceptance import (
    CategoryAcceptance,
    EmpiricalAcceptance,
    HeterogeneousAcceptance,
    PerPositionAcceptance,
)
from dsd.sim.models.latency import (
    LatencyModelKind,
    ParametricLatencyModel,
    PrefillCost,
    TableLatencyModel,
)
from dsd.sim.models.latency_choice import fit_latency_model
from dsd.sim.models.replay import ReplayAcceptance, ReplayRecording
from dsd.sim.models.step_cost import FixedShapeSteps, PaddedAttention, PaddedPrefill
from dsd.sim.resolve import ResolvedRun, cached_recording, resolve, sim_seed_streams
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.types import AcceptanceModel, Executor, LatencyModel


def build_engine(
    resolved: ResolvedRun, executor: Executor, loop: LoopConfig | None = None
) -> Engine:
    """The engine of one run, ready to `run()`: every command builds its engine here."""
    config = resolved.config
    scheduler_config = resolved.scheduler_config
    scheduler: StepScheduler
    if config.scheduler == "vllm":
        scheduler = _vllm_scheduler(scheduler_config)
    else:
        scheduler = Scheduler(
            scheduler_config,
            capacity=max(64, min(resolved.max_num_seqs, len(resolved.workload.requests)) * 2),
        )
    policy: KPolicy = resolved.build_policy(sim_seed_streams(config.seed)["policy"])
    if config.fixed_batch_size is not None:
        policy = FixedBatchPolicy(policy, int(config.fixed_batch_size))
    return Engine(scheduler, executor, policy, resolved.workload, loop)


def _vllm_scheduler(config: SchedulerConfig) -> StepScheduler:
    """vLLM's own scheduler behind ours (`--scheduler vllm`); a one-line error without vLLM."""
    from importlib import metadata as importlib_metadata

    from dsd.sim.vllm_oracle import VLLM_VERSION, VllmScheduler

    try:
        version = importlib_metadata.version("vllm")
    except importlib_metadata.PackageNotFoundError:
        raise InputError(
            f"scheduler vllm: vLLM is not installed (pip install --no-deps vllm=={VLLM_VERSION}, "
            "as the README's setup does)"
        ) from None
    if version != VLLM_VERSION:
        raise InputError(f"scheduler vllm: needs vLLM {VLLM_VERSION}, found {version}")
    return VllmScheduler(config)


def fitted_executor(resolved: ResolvedRun) -> FittedExecutor:
    """The simulator's executor: the profile's fitted latency and acceptance models."""
    config = resolved.config
    if resolved.profile is None or resolved.latency is None:
        raise InputError("profile: the simulator needs a profile (--profile)")
    streams = sim_seed_streams(config.seed)
    jitter = (
        LatencyJitter(float(config.jitter_sigma), streams["latency_noise"])
        if config.jitter_sigma > 0
        else None
    )
    return FittedExecutor(
        _latency_model(resolved),
        run_acceptance_model(resolved),
        host_overhead_ms=resolved.host_overhead_ms,
        jitter=jitter,
        host_overhead_model=resolved.host_overhead_model,
        host_planning_ms=resolved.host_planning_ms,
        overlap_planning=config.scheduling == "async" and resolved.host_overlap,
    )


def run_acceptance_model(resolved: ResolvedRun) -> AcceptanceModel:
    """The run's acceptance model on its acceptance seed stream: the simulator's (in
    `fitted_executor`), and the real engine's under drawn acceptance
    (`backend.executor.TorchExecutor`), so both draw the same counts for the same run."""
    config = resolved.config
    if resolved.profile is None:
        raise InputError("profile: acceptance is drawn from a profile's rates (--profile)")
    return _acceptance_model(
        config.acceptance_model,
        resolved.profile,
        sim_seed_streams(config.seed)["acceptance"],
        config.category_acceptance,
        resolved.replay_recording,
    )


def run_simulation(config: RunConfig) -> RunResult:
    """Run one simulation. Same config -> identical result (metrics, tables), any process."""
    resolved = resolve(config)
    return build_engine(resolved, fitted_executor(resolved)).run()


def learned_profile(policy: KPolicy) -> Profile | None:
    """The profile a learning policy built during its run (the bandit's), else None."""
    while isinstance(policy, FixedBatchPolicy):
        policy = policy.inner
    learn = getattr(policy, "learned_profile", None)
    return learn() if callable(learn) else None


def _acceptance_model(
    kind: str,
    profile: Profile,
    seed: np.random.SeedSequence,
    category_acceptance: tuple[tuple[str, tuple[float, ...]], ...] = (),
    recording: ReplayRecording | None = None,
) -> AcceptanceModel:
    """The run's acceptance model; `recording` is the replay file's (None: the bundled one)."""
    if category_acceptance:
        # The default model keeps the stream it has without routing (spawn_key unchanged), so
        # untagged requests draw as before; each category gets its own child stream.
        children = np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, 1 << 20)).spawn(
            len(category_acceptance)
        )
        by_tag: dict[str, AcceptanceModel] = {
            tag: PerPositionAcceptance(rates, child)
            for (tag, rates), child in zip(category_acceptance, children, strict=True)
        }
        return CategoryAcceptance(by_tag, _acceptance_model(kind, profile, seed, (), recording))
    if kind == "per-position":
        return PerPositionAcceptance.from_profile(profile, seed)
    if kind == "heterogeneous":
        try:
            return HeterogeneousAcceptance.from_profile(profile, seed)
        except ValueError as exc:
            raise InputError(f"acceptance_model heterogeneous: {exc}") from None
    if kind == "empirical":
        try:
            return EmpiricalAcceptance.from_profile(profile, seed)
        except ValueError as exc:
            raise InputError(f"acceptance_model empirical: {exc}") from None
    # A run's own recording replays request i as recorded request i (by id); the bundled
    # early-exit recording round-robins over its prompts by category.
    return ReplayAcceptance(cached_recording() if recording is None else recording, seed)


def _latency_model(resolved: ResolvedRun) -> LatencyModel:
    config = resolved.config
    assert resolved.latency is not None  # fitted_executor checked it
    fused: TableLatencyModel | ParametricLatencyModel | PaddedAttention | FixedShapeSteps
    fused = resolved.latency
    if resolved.step_shapes is not None:  # padded rows and spans subsume padded attention
        fused = FixedShapeSteps.of_profile(resolved.latency, resolved.step_shapes, resolved.profile)
    elif resolved.attention_span == "padded":
        fused = PaddedAttention(resolved.latency)
    model: LatencyModel = fused
    if resolved.prefill_forward == "separate" or resolved.prefill_rows == "padded":
        model = PaddedPrefill(fused, engine_fuses=resolved.prefill_forward == "fused")
    prefill = resolved.latency.prefill
    if config.prefill_cost == "free":
        model = FreePrefillLatency(resolved.latency)
        prefill = PrefillCost(
            num_tokens=(1.0,),
            latency_ms=(prefill.curve_ms(1.0),),
            source=prefill.source,
            tail_ms_per_token=0.0,
        )
    if config.fixed_batch_size is not None:
        model = FixedBatchLatency(model, prefill, int(config.fixed_batch_size))
    return model


def build_fitted_executor(
    profile: Profile,
    seed: np.random.SeedSequence,
    latency_kind: LatencyModelKind = "auto",
    acceptance_kind: AcceptanceKind = "per-position",
    k_max: int | None = None,
    host_overhead_ms: float = 0.0,
    jitter_sigma: float = 0.0,
    host_overhead_model: HostOverhead | None = None,
) -> FittedExecutor:
    """A `FittedExecutor` straight from a profile, without a run config (tests, benchmarks):
    latency from `fit_latency_model`, acceptance as a run builds it ("replay": the bundled
    recording). `seed` is split into one stream for acceptance and one for latency noise."""
    acceptance_seed, jitter_seed = seed.spawn(2)
    return FittedExecutor(
        fit_latency_model(profile, kind=latency_kind, k_max=k_max),
        _acceptance_model(acceptance_kind, profile, acceptance_seed),
        host_overhead_ms=host_overhead_ms,
        jitter=LatencyJitter(jitter_sigma, jitter_seed) if jitter_sigma > 0 else None,
        host_overhead_model=host_overhead_model,
    )
