"""One simulated serving run from one config: the entry point every higher layer builds on.

`SimulationConfig` holds every knob of a run (profile, policy SPEC, workload, scheduler limits,
model kinds, ablation switches, seed); it is a frozen, picklable dataclass validated on
construction without touching the file system. `run_simulation(config)` resolves the defaults
(k_max, max_num_seqs, max_model_len, KV pool), builds the workload, the fitted executor, the
policy and the scheduler, runs the engine loop and returns `sim.engine.RunResult`.
`resolved_config_dict(config)` is the fully resolved config (every default as chosen, the seed
streams, the latency model's provenance, versions) for writing beside a run's outputs.

Randomness: the run seed `s` roots one `np.random.SeedSequence(s)`. Its children 0..2 are the
workload's streams (lengths, prompt order, arrivals), spawned inside `traces.registry`, so
`dsd simulate`, `dsd run` and `dsd traces export` with the same seed see the same requests; its
child 3 is spawned into the simulator's streams: acceptance draws, latency noise, and the policy
(handed to `parse_policy(seed=...)`: the bandit samples from it; deterministic policies ignore
it). Same config -> identical
result, in any process.

Speed for many calls (sweeps, validation): profiles, fitted latency models and the replay
recording are cached per process, keyed by the file's resolved path, size and mtime (a
parametric fit is tens of milliseconds; a sweep runs hundreds of cells).

Host overhead per step (`host_overhead_ms`): a number is a constant added to every step (source
"flag"); None (the default) uses the profile's measured `HostOverhead` model when it has one
(source "measured"), else nothing (source "none"). The source goes into the resolved config.

Ablation switches (for the fidelity report, docs/fidelity.md) are ordinary fields:
`prefill_cost="free"` charges nothing for prompt tokens; `fixed_batch_size=C` charges every
decode step and shows the policy B = C whatever the real batch is (no closed-loop fluctuation).

What this module deliberately does not do: print or write files (the CLI and `reports.*` do),
run real models (`backend`), or pick a policy (the SPEC string does).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
import simpy

from dsd.common.arrays import FloatArray, IntArray
from dsd.common.errors import InputError
from dsd.policies.profile import HostOverhead, Profile
from dsd.policies.profile_io import host_overhead_to_native, load_profile
from dsd.policies.spec import parse_policy
from dsd.policies.types import MAX_NUM_SEQS, KPolicy, SchedulingMode, StepFeedback, StepView
from dsd.sim.acceptance import (
    CategoryAcceptance,
    HeterogeneousAcceptance,
    PerPositionAcceptance,
    ReplayAcceptance,
    ReplayRecording,
    load_replay_recording,
)
from dsd.sim.engine import Engine, EngineConfig, RunResult
from dsd.sim.executor import AcceptanceKind, FittedExecutor, LatencyJitter
from dsd.sim.latency import (
    LatencyModelKind,
    MixedKCosting,
    ParametricLatencyModel,
    PrefillCost,
    TableLatencyModel,
    fit_latency_model,
    table_covers,
)
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.types import AcceptanceModel, LatencyModel, ScheduledBatch
from dsd.traces.datasets import RandomLengths
from dsd.traces.loaders import TraceOptions
from dsd.traces.registry import build_workload
from dsd.traces.rollout import RolloutConfig
from dsd.traces.workload import Workload

PrefillCostMode = Literal["profile", "free"]
HostOverheadSource = Literal["measured", "flag", "none"]

LATENCY_MODEL_KINDS: tuple[str, ...] = ("auto", "table", "parametric")
ACCEPTANCE_MODEL_KINDS: tuple[str, ...] = ("heterogeneous", "per-position", "replay")
PREFILL_COST_MODES: tuple[str, ...] = ("profile", "free")
MIXED_K_COSTINGS: tuple[str, ...] = ("padded", "token-equivalent")

# vLLM's engine defaults (V1, OpenAI server) used when the config leaves them open.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_BLOCK_SIZE = 16
# Child of SeedSequence(seed) that roots the simulator's streams; children 0..2 are the
# workload's (traces.registry spawns three). Fixed so results stay stable as code evolves.
SIM_STREAMS_SPAWN_KEY = 3
SIM_STREAM_NAMES: tuple[str, ...] = ("acceptance", "latency_noise", "policy")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is_int(value) or int(value) < minimum:  # type: ignore[call-overload]
        raise InputError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _check_float(name: str, value: object, *, minimum: float, allow_inf: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{name}: must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf) or number < minimum:
        bound = f">= {minimum}" + (" (inf allowed)" if allow_inf else ", finite")
        raise InputError(f"{name}: must be {bound}, got {value!r}")


def _check_category_acceptance(value: object) -> None:
    if not isinstance(value, tuple):
        raise InputError(f"category_acceptance: must be a tuple of (tag, rates), got {value!r}")
    seen: set[str] = set()
    for index, item in enumerate(value):
        where = f"category_acceptance[{index}]"
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise InputError(f"{where}: must be a (tag, rates) pair, got {item!r}")
        tag, rates = item
        if not tag or tag in seen:
            raise InputError(f"{where}: tag must be non-empty and unique, got {tag!r}")
        seen.add(tag)
        if not isinstance(rates, tuple) or not rates:
            raise InputError(f"{where}: rates must be a non-empty tuple, got {rates!r}")
        for position, rate in enumerate(rates):
            if (
                isinstance(rate, bool)
                or not isinstance(rate, int | float)
                or not (0.0 <= float(rate) <= 1.0)
            ):
                raise InputError(f"{where}: rates[{position}] must be in [0, 1], got {rate!r}")


@dataclass(frozen=True)
class SimulationConfig:
    """Every knob of one simulated run. Validated on construction; reads no files."""

    # Profile file (our JSON or PR #32374's): latency table, acceptance rates, k_max.
    profile: str
    # K policy SPEC (policies.spec): static:K, table:JSON_OR_PATH, goodput, online[:...].
    policy: str
    # Workload name (traces.registry.KNOWN_NAMES) or a .csv/.parquet/.jsonl workload file.
    dataset: str = "mt-bench"
    # Requests to send (None: the whole set / trace; 1000 for random), like --num-prompts.
    num_prompts: int | None = None
    # Cap on requests in flight (None: no cap), like --max-concurrency; closed loop with inf rate.
    max_concurrency: int | None = None
    # Mean requests/s of the arrivals; inf sends at 0 (or keeps a trace's own times).
    request_rate: float = math.inf
    # Gamma shape of the inter-arrival gaps (1.0 = Poisson), like --burstiness.
    burstiness: float = 1.0
    # Override every request's output tokens (max_tokens); None keeps the dataset's.
    output_len: int | None = None
    # Prompt-set lengths counted with the chat template (vLLM bench default).
    chat_template: bool = True
    # Permute a prompt set with the seed before taking num_prompts.
    shuffle: bool = False
    # The `random` dataset's lengths (--random-input-len/--random-output-len/--random-range-ratio).
    random_lengths: RandomLengths = field(default_factory=RandomLengths)
    # Window / sampling / caps / time scale for traces and workload files (None: defaults).
    trace_options: TraceOptions | None = None
    # The rl-rollout shape (None: defaults).
    rollout: RolloutConfig | None = None
    # "sync": plan after each outcome; "async": plan step t+1 while step t runs (vLLM async).
    scheduling: SchedulingMode = "sync"
    # Most requests running at once; None: 256 (vLLM's default).
    max_num_seqs: int | None = None
    # Token budget per step (decode rows with drafts + prefill chunks); vLLM's default 8192.
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    # Longest context, tokens; None: longest request (prompt + output) + k_max + 1, so no
    # request is cut and drafts are never trimmed by it.
    max_model_len: int | None = None
    # KV pool in blocks of 16 tokens; None: every running sequence can hold its longest request
    # (min(max_num_seqs, requests) x ceil(max_model_len / 16)), so nothing is ever preempted.
    num_kv_blocks: int | None = None
    # Largest K (num_speculative_tokens); None: the profile's k_max.
    k_max: int | None = None
    # Step latency model: "table" (the profile, goodput's interpolation), "parametric" (fitted,
    # extrapolates), "auto" (table when it covers K=0..k_max at every profiled B).
    latency_model: LatencyModelKind = "auto"
    # Acceptance model: "heterogeneous" (requests differ), "per-position" (all alike), "replay"
    # (the bundled recorded match sequences).
    acceptance_model: AcceptanceKind = "heterogeneous"
    # Host time per step that the profile's step timing did not see, ms, >= 0, added to every
    # step; None: the profile's measured host-overhead model if it has one, else 0.
    host_overhead_ms: float | None = None
    # Lognormal step-latency noise sigma (0: none); duration *= exp(sigma * Z).
    jitter_sigma: float = 0.0
    # Ablation: "profile" charges prompt tokens from the profile; "free" charges nothing for them.
    prefill_cost: PrefillCostMode = "profile"
    # Ablation: charge every decode step at this B and show it to the policy (None: the real B).
    fixed_batch_size: int | None = None
    # Run seed, >= 0: roots every random stream (see the module docstring).
    seed: int = 0
    # How the table model charges a step whose rows draft different K: "padded" ITL(D, max K)
    # (what the draft's max-K passes cost) or "token-equivalent" ITL(D, sum(K_i + 1) / D - 1).
    # The parametric model has its own decomposition and ignores this.
    mixed_k: MixedKCosting = "padded"
    # Per-category acceptance: (tag, per-position rates r_1..r_n) pairs; a request whose
    # RequestSpec.tag is listed draws from those rates (per-position model), the rest from
    # `acceptance_model`. Empty: no routing. Lets a workload's acceptance move with its mix.
    category_acceptance: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        for name in ("profile", "policy", "dataset"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"{name}: must be a non-empty string, got {value!r}")
        _check_int("num_prompts", self.num_prompts, 1, optional=True)
        _check_int("max_concurrency", self.max_concurrency, 1, optional=True)
        _check_float("request_rate", self.request_rate, minimum=0.0, allow_inf=True)
        if self.request_rate == 0:
            raise InputError("request_rate: must be > 0 (inf sends everything at once)")
        _check_float("burstiness", self.burstiness, minimum=0.0)
        if self.burstiness == 0:
            raise InputError("burstiness: must be > 0, got 0")
        _check_int("output_len", self.output_len, 1, optional=True)
        if not isinstance(self.random_lengths, RandomLengths):
            raise InputError("random_lengths: must be a traces.datasets.RandomLengths")
        if self.trace_options is not None and not isinstance(self.trace_options, TraceOptions):
            raise InputError("trace_options: must be a traces.loaders.TraceOptions or None")
        if self.rollout is not None and not isinstance(self.rollout, RolloutConfig):
            raise InputError("rollout: must be a traces.rollout.RolloutConfig or None")
        if self.scheduling not in ("sync", "async"):
            raise InputError(f"scheduling: must be sync or async, got {self.scheduling!r}")
        _check_int("max_num_seqs", self.max_num_seqs, 1, optional=True)
        if self.max_num_seqs is not None and int(self.max_num_seqs) > MAX_NUM_SEQS:
            raise InputError(f"max_num_seqs: must be <= {MAX_NUM_SEQS}, got {self.max_num_seqs!r}")
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("max_model_len", self.max_model_len, 2, optional=True)
        _check_int("num_kv_blocks", self.num_kv_blocks, 1, optional=True)
        _check_int("k_max", self.k_max, 0, optional=True)
        if self.latency_model not in LATENCY_MODEL_KINDS:
            raise InputError(
                f"latency_model: choose from {', '.join(LATENCY_MODEL_KINDS)}, "
                f"got {self.latency_model!r}"
            )
        if self.acceptance_model not in ACCEPTANCE_MODEL_KINDS:
            raise InputError(
                f"acceptance_model: choose from {', '.join(ACCEPTANCE_MODEL_KINDS)}, "
                f"got {self.acceptance_model!r}"
            )
        if self.host_overhead_ms is not None:
            _check_float("host_overhead_ms", self.host_overhead_ms, minimum=0.0)
        _check_float("jitter_sigma", self.jitter_sigma, minimum=0.0)
        if self.prefill_cost not in PREFILL_COST_MODES:
            raise InputError(
                f"prefill_cost: choose from {', '.join(PREFILL_COST_MODES)}, "
                f"got {self.prefill_cost!r}"
            )
        _check_int("fixed_batch_size", self.fixed_batch_size, 1, optional=True)
        _check_int("seed", self.seed, 0)
        if self.mixed_k not in MIXED_K_COSTINGS:
            raise InputError(
                f"mixed_k: choose from {', '.join(MIXED_K_COSTINGS)}, got {self.mixed_k!r}"
            )
        _check_category_acceptance(self.category_acceptance)


# --------------------------------------------------------------------------------------------
# Per-process caches (files are keyed by path, size and mtime so an edited file is re-read)
# --------------------------------------------------------------------------------------------


def _file_key(path: str) -> tuple[str, int, int]:
    resolved = Path(path).expanduser().resolve()
    if resolved.is_dir():
        raise InputError(f"{path}: is a directory, expected a profile file")
    if not resolved.is_file():
        raise InputError(f"{path}: no such file")
    stat = resolved.stat()
    return str(resolved), stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=32)
def _cached_profile(key: tuple[str, int, int]) -> Profile:
    return load_profile(key[0])


@functools.lru_cache(maxsize=64)
def _cached_latency_model(
    key: tuple[str, int, int], kind: LatencyModelKind, k_max: int, mixed_k: MixedKCosting
) -> TableLatencyModel | ParametricLatencyModel:
    try:
        return fit_latency_model(_cached_profile(key), kind=kind, k_max=k_max, mixed_k=mixed_k)
    except ValueError as exc:
        raise InputError(f"{key[0]}: cannot build a {kind} latency model: {exc}") from None


@functools.lru_cache(maxsize=1)
def _cached_recording() -> ReplayRecording:
    return load_replay_recording()


def load_profile_cached(path: str) -> Profile:
    """The profile at `path`, parsed once per process (re-read when the file changes)."""
    return _cached_profile(_file_key(path))


# --------------------------------------------------------------------------------------------
# Ablation wrappers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FreePrefillLatency:
    """A latency model whose prompt tokens cost nothing (ablation "prefill free").

    Relies on the composition rule of `sim.latency`: a step with decode rows costs
    decode + prefill.marginal_ms(prompt tokens); a prefill-only step costs
    prefill.curve_ms(prompt tokens). Here the marginal part is dropped and a prefill-only step
    costs one forward of a single token, curve_ms(1) (a step cannot take zero time).
    """

    inner: TableLatencyModel | ParametricLatencyModel  # the model with real prefill cost

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        prefill_tokens = float(batch.num_scheduled_tokens[num_decode:].sum())
        prefill = self.inner.prefill
        if num_decode == 0:
            return prefill.curve_ms(1.0)
        return self.inner.step_ms(batch) - prefill.marginal_ms(prefill_tokens)

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        return self.inner.decode_itl_ms(batch_size, num_spec_tokens)


@dataclass(frozen=True)
class FixedBatchLatency:
    """Charges every step that decodes as a decode step of `batch_size` rows (ablation).

    Decode cost = decode_itl_ms(batch_size, max K of the step) (mixed K charged padded) plus
    the marginal cost of the step's prompt tokens; prefill-only steps keep the inner cost.
    """

    inner: LatencyModel  # the model that prices the real steps
    prefill: PrefillCost  # cost of prompt tokens (the inner model's, or free)
    batch_size: int  # B every decode step is charged at, >= 1

    def step_ms(self, batch: ScheduledBatch) -> float:
        num_decode = batch.num_decode_reqs
        if num_decode == 0:
            return self.inner.step_ms(batch)
        k_charged = int(batch.num_spec_tokens[:num_decode].max())
        prefill_tokens = float(batch.num_scheduled_tokens[num_decode:].sum())
        decode_ms = self.inner.decode_itl_ms(self.batch_size, k_charged)
        return decode_ms + self.prefill.marginal_ms(prefill_tokens)

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        return self.inner.decode_itl_ms(batch_size, num_spec_tokens)


class FixedBatchPolicy:
    """Shows the wrapped policy B = `batch_size` on every step (ablation "no fluctuation")."""

    def __init__(self, inner: KPolicy, batch_size: int) -> None:
        self.inner = inner
        self.batch_size = batch_size

    def choose_k(self, view: StepView) -> int | IntArray:
        return self.inner.choose_k(dataclasses.replace(view, batch_size=self.batch_size))

    def observe(self, feedback: StepFeedback) -> None:
        self.inner.observe(feedback)


def learned_profile(policy: KPolicy) -> Profile | None:
    """The profile a learning policy built during its run (the bandit's), else None."""
    while isinstance(policy, FixedBatchPolicy):
        policy = policy.inner
    learn = getattr(policy, "learned_profile", None)
    return learn() if callable(learn) else None


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedSimulation:
    """A config with every default chosen and every input loaded (not picklable: holds models)."""

    config: SimulationConfig  # what was asked
    profile: Profile  # the loaded profile
    workload: Workload  # the requests, in send order, with the concurrency cap
    k_max: int  # num_speculative_tokens of the run
    max_num_seqs: int  # running-set cap
    max_model_len: int  # longest context, tokens
    num_kv_blocks: int  # KV pool, blocks of block_size tokens
    block_size: int  # tokens per KV block
    latency: TableLatencyModel | ParametricLatencyModel  # the fitted decode + prefill model
    latency_kind: str  # "table" or "parametric": what "auto" chose
    # Where the per-step host overhead comes from: "flag" (config.host_overhead_ms, a
    # constant), "measured" (the profile's model), "none" (neither: 0).
    host_overhead_source: HostOverheadSource = "none"
    host_overhead_ms: float = 0.0  # the constant when the source is "flag", else 0
    host_overhead_model: HostOverhead | None = None  # the model when the source is "measured"


def resolve(config: SimulationConfig) -> ResolvedSimulation:
    """Load the profile and workload and choose every default (InputError on bad input)."""
    key = _file_key(config.profile)
    profile = _cached_profile(key)
    k_max = profile.k_max if config.k_max is None else int(config.k_max)
    if config.latency_model == "table" and not table_covers(profile, [k_max]):
        raise InputError(
            f"latency_model: the table of {config.profile} does not cover K=0..{k_max} at every "
            "profiled B; use parametric or auto"
        )
    workload = build_workload(
        config.dataset,
        num_prompts=config.num_prompts,
        max_concurrency=config.max_concurrency,
        request_rate=config.request_rate,
        burstiness=config.burstiness,
        seed=config.seed,
        output_len=config.output_len,
        chat_template=config.chat_template,
        shuffle=config.shuffle,
        random_lengths=config.random_lengths,
        trace_options=config.trace_options,
        rollout=config.rollout,
    )
    if not workload.requests:
        raise InputError(f"dataset: {config.dataset} yields no requests")
    longest = max(r.prompt_len + r.output_len for r in workload.requests)
    longest_prompt = max(r.prompt_len for r in workload.requests)
    max_model_len = (
        longest + k_max + 1 if config.max_model_len is None else int(config.max_model_len)
    )
    if longest_prompt >= max_model_len:
        raise InputError(
            f"max_model_len: {max_model_len} must exceed the longest prompt ({longest_prompt} "
            "tokens)"
        )
    max_num_seqs = DEFAULT_MAX_NUM_SEQS if config.max_num_seqs is None else int(config.max_num_seqs)
    block_size = DEFAULT_BLOCK_SIZE
    if config.num_kv_blocks is None:
        running = min(max_num_seqs, len(workload.requests))
        num_kv_blocks = running * math.ceil(max_model_len / block_size)
    else:
        num_kv_blocks = int(config.num_kv_blocks)
    latency = _cached_latency_model(key, config.latency_model, k_max, config.mixed_k)
    # Parse the policy once here so a bad SPEC fails before anything runs (runs build their own:
    # policies may hold state).
    parse_policy(
        config.policy,
        profile=profile,
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        context_latency=context_latency_fn(latency),
    )
    latency_kind = "table" if isinstance(latency, TableLatencyModel) else "parametric"
    host_source, host_ms, host_model = resolve_host_overhead(config, profile)
    return ResolvedSimulation(
        config=config,
        profile=profile,
        workload=workload,
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        latency=latency,
        latency_kind=latency_kind,
        host_overhead_source=host_source,
        host_overhead_ms=host_ms,
        host_overhead_model=host_model,
    )


def resolve_host_overhead(
    config: SimulationConfig, profile: Profile
) -> tuple[HostOverheadSource, float, HostOverhead | None]:
    """(source, constant ms, measured model): the flag wins, then the profile's model."""
    if config.host_overhead_ms is not None:
        return "flag", float(config.host_overhead_ms), None
    if profile.host_overhead is not None:
        return "measured", 0.0, profile.host_overhead
    return "none", 0.0, None


def sim_seed_streams(seed: int) -> dict[str, np.random.SeedSequence]:
    """The simulator's seed streams of a run (see the module docstring), by name."""
    root = np.random.SeedSequence(seed, spawn_key=(SIM_STREAMS_SPAWN_KEY,))
    return dict(zip(SIM_STREAM_NAMES, root.spawn(len(SIM_STREAM_NAMES)), strict=True))


def _acceptance_model(
    kind: str,
    profile: Profile,
    seed: np.random.SeedSequence,
    category_acceptance: tuple[tuple[str, tuple[float, ...]], ...] = (),
) -> AcceptanceModel:
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
        return CategoryAcceptance(by_tag, _acceptance_model(kind, profile, seed))
    if kind == "per-position":
        return PerPositionAcceptance.from_profile(profile, seed)
    if kind == "heterogeneous":
        try:
            return HeterogeneousAcceptance.from_profile(profile, seed)
        except ValueError as exc:
            raise InputError(f"acceptance_model heterogeneous: {exc}") from None
    return ReplayAcceptance(_cached_recording(), seed)


def _latency_model(resolved: ResolvedSimulation) -> LatencyModel:
    config = resolved.config
    model: LatencyModel = resolved.latency
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


def context_latency_fn(
    latency: TableLatencyModel | ParametricLatencyModel,
) -> Callable[[float, FloatArray, float], FloatArray]:
    """ITL(B, K [n], total context tokens) ms [n] of the run's fitted decode model.

    What the `context` policy optimises against: the parametric model prices the KV read of
    `context_tokens` (uniform K per row, so B (K + 1) verified tokens); the table model has no
    context axis and reads ITL(B, K).
    """
    if isinstance(latency, ParametricLatencyModel):
        parametric = latency

        def parametric_ms(batch_size: float, ks: FloatArray, context_tokens: float) -> FloatArray:
            k_values = np.asarray(ks, dtype=np.float64)  # [n]
            return np.array(
                [
                    parametric._decode_ms(batch_size, k, batch_size * (k + 1.0), context_tokens)
                    for k in k_values.tolist()
                ],
                dtype=np.float64,
            )  # [n]

        return parametric_ms
    table = latency.itl_table

    def table_ms(batch_size: float, ks: FloatArray, context_tokens: float) -> FloatArray:
        del context_tokens  # the PR table has no context axis
        return np.asarray(table.itl_ms_at(batch_size, ks), dtype=np.float64)  # [n]

    return table_ms


def build_engine(resolved: ResolvedSimulation, engine_config: EngineConfig | None = None) -> Engine:
    """The engine of one run, ready to `run()` (for callers that want the pieces)."""
    config = resolved.config
    streams = sim_seed_streams(config.seed)
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=resolved.max_model_len,
            num_kv_blocks=resolved.num_kv_blocks,
            k_max=resolved.k_max,
            max_num_seqs=resolved.max_num_seqs,
            max_num_batched_tokens=int(config.max_num_batched_tokens),
            block_size=resolved.block_size,
            scheduling=config.scheduling,
        ),
        capacity=max(64, min(resolved.max_num_seqs, len(resolved.workload.requests)) * 2),
    )
    policy = parse_policy(
        config.policy,
        profile=resolved.profile,
        k_max=resolved.k_max,
        max_num_seqs=resolved.max_num_seqs,
        seed=streams["policy"],
        context_latency=context_latency_fn(resolved.latency),
    )
    if config.fixed_batch_size is not None:
        policy = FixedBatchPolicy(policy, int(config.fixed_batch_size))
    jitter = (
        LatencyJitter(float(config.jitter_sigma), streams["latency_noise"])
        if config.jitter_sigma > 0
        else None
    )
    executor = FittedExecutor(
        _latency_model(resolved),
        _acceptance_model(
            config.acceptance_model,
            resolved.profile,
            streams["acceptance"],
            config.category_acceptance,
        ),
        host_overhead_ms=resolved.host_overhead_ms,
        jitter=jitter,
        host_overhead_model=resolved.host_overhead_model,
    )
    return Engine(scheduler, executor, policy, resolved.workload, engine_config)


def run_simulation(config: SimulationConfig) -> RunResult:
    """Run one simulation. Same config -> identical result (metrics, tables), any process."""
    return build_engine(resolve(config)).run()


# --------------------------------------------------------------------------------------------
# The resolved config, for config.json
# --------------------------------------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def plain_config_value(value: Any) -> Any:
    """JSON-ready, canonical form of config values (dataclasses, inf, tuples, numpy scalars)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain_config_value(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, tuple | list):
        return [plain_config_value(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def latency_description(resolved: ResolvedSimulation) -> dict[str, Any]:
    """Which latency model and prefill source a run used, and the fit error when parametric."""
    latency = resolved.latency
    info: dict[str, Any] = {
        "kind": resolved.latency_kind,
        "requested": resolved.config.latency_model,
        "prefill_source": latency.prefill_source,
        "prefill_cost": resolved.config.prefill_cost,
    }
    if isinstance(latency, ParametricLatencyModel):
        report = latency.fit_report
        info["fit_median_abs_pct"] = report.median_abs_pct
        info["fit_max_abs_pct"] = report.max_abs_pct
        info["fit_summary"] = report.summary()
    else:
        info["mixed_k"] = latency.mixed_k
    return info


def host_overhead_description(resolved: ResolvedSimulation) -> dict[str, Any]:
    """Which host overhead a run charged per step: its source and the constant or the model."""
    info: dict[str, Any] = {"source": resolved.host_overhead_source}
    model = resolved.host_overhead_model
    if model is not None:
        info["model"] = host_overhead_to_native(model)
    else:
        info["ms"] = resolved.host_overhead_ms
    return info


def resolved_config_dict(
    config: SimulationConfig, resolved: ResolvedSimulation | None = None
) -> dict[str, Any]:
    """The fully resolved config: what was asked, what was chosen, seeds, versions."""
    resolved = resolved if resolved is not None else resolve(config)
    streams = sim_seed_streams(config.seed)
    profile_path = str(Path(config.profile).expanduser().resolve())
    return {
        "config": plain_config_value(config),
        "resolved": {
            "profile_path": profile_path,
            "profile_k_max": resolved.profile.k_max,
            "k_max": resolved.k_max,
            "max_num_seqs": resolved.max_num_seqs,
            "max_model_len": resolved.max_model_len,
            "num_kv_blocks": resolved.num_kv_blocks,
            "block_size": resolved.block_size,
            "num_kv_blocks_rule": (
                "given"
                if config.num_kv_blocks is not None
                else "min(max_num_seqs, num_requests) * ceil(max_model_len / block_size)"
            ),
            "max_model_len_rule": (
                "given"
                if config.max_model_len is not None
                else "longest prompt + output + k_max + 1"
            ),
            "num_requests": len(resolved.workload.requests),
            "workload_name": resolved.workload.name,
            "latency_model": latency_description(resolved),
            "host_overhead": host_overhead_description(resolved),
        },
        "seeds": {
            "seed": config.seed,
            "workload": f"SeedSequence({config.seed}) children 0..2 (traces.registry)",
            **{
                name: {"entropy": stream.entropy, "spawn_key": list(stream.spawn_key)}
                for name, stream in streams.items()
            },
        },
        "versions": {
            "dsd": _version("dsd"),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "simpy": getattr(simpy, "__version__", _version("simpy")),
        },
    }
