"""A `RunConfig` resolved: its files loaded, its workload built, every default chosen.

`resolve(config, workload=None)` is the one place where the defaults a config leaves open are
chosen (k_max, max_num_seqs, max_model_len, the KV pool, the latency model, the host overhead)
and where a bad input fails, before anything runs; `resolved_config_dict` records all of it
beside a run's outputs; `sim_seed_streams` gives the simulator its seed stream
(docs/simulator.md). Profiles, fits and recordings are cached per process (keyed by path, size
and mtime) because a sweep resolves hundreds of cells.

It builds no engine (`sim.build` does) and writes no files.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dsd.common.errors import InputError
from dsd.common.user_paths import check_input_file
from dsd.policies.profile import HostOverhead, Profile
from dsd.policies.profile_io import host_overhead_to_native, load_profile
from dsd.policies.spec import parse_policy, policy_name, policy_source, run_k_max
from dsd.policies.types import KPolicy
from dsd.sim.config import DEFAULT_BLOCK_SIZE, DEFAULT_K_MAX, DEFAULT_MAX_NUM_SEQS, RunConfig
from dsd.sim.models.latency import (
    AttentionSpan,
    LatencyModelKind,
    MixedKCosting,
    ParametricLatencyModel,
    PrefillForward,
    PrefillRows,
    TableLatencyModel,
    context_latency_fn,
    table_covers,
)
from dsd.sim.models.latency_choice import LatencyChoice, select_latency_model
from dsd.sim.models.replay import ReplayRecording, load_replay_recording
from dsd.sim.models.shapes import StepShapes
from dsd.sim.scheduler import SchedulerConfig
from dsd.traces.datasets import PROMPT_SET_NAMES
from dsd.traces.registry import build_workload
from dsd.traces.workload import Workload

HostOverheadSource = Literal["measured", "flag", "none"]

# Child of SeedSequence(seed) that roots the simulator's streams; children 0..2 are the
# workload's (traces.registry spawns three). Fixed so results stay stable as code evolves.
SIM_STREAMS_SPAWN_KEY = 3
SIM_STREAM_NAMES: tuple[str, ...] = ("acceptance", "latency_noise", "policy")


# --------------------------------------------------------------------------------------------
# Per-process caches (files are keyed by path, size and mtime so an edited file is re-read)
# --------------------------------------------------------------------------------------------


def _file_key(path: str, what: str = "profile") -> tuple[str, int, int]:
    expanded = Path(path).expanduser()
    # checked (named as given, unless "~" was expanded) before resolve(), which raises
    # RuntimeError on a symlink loop
    stat = check_input_file(path if str(expanded) == str(Path(path)) else expanded, f"{what} file")
    return str(expanded.resolve()), stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=32)
def _cached_profile(key: tuple[str, int, int]) -> Profile:
    return load_profile(key[0])


@functools.lru_cache(maxsize=64)
def _cached_latency_model(
    key: tuple[str, int, int], kind: LatencyModelKind, k_max: int, mixed_k: MixedKCosting
) -> tuple[TableLatencyModel | ParametricLatencyModel, LatencyChoice]:
    try:
        return select_latency_model(_cached_profile(key), kind, k_max, mixed_k)
    except ValueError as exc:
        raise InputError(f"{key[0]}: cannot build a {kind} latency model: {exc}") from None


@functools.lru_cache(maxsize=1)
def cached_recording() -> ReplayRecording:
    """The bundled replay recording, read once per process."""
    return load_replay_recording()


@functools.lru_cache(maxsize=8)
def _cached_recording_file(key: tuple[str, int, int]) -> ReplayRecording:
    return load_replay_recording(key[0])


def replay_recording_for(config: RunConfig, num_requests: int) -> ReplayRecording | None:
    """The recording `config.replay_recording` names (None: none named), parsed once per
    process; a recording of a run must hold every request of the workload that replays it."""
    if config.replay_recording is None:
        return None
    recording = _cached_recording_file(_file_key(config.replay_recording, "replay recording"))
    if recording.in_request_order and recording.num_requests < num_requests:
        raise InputError(
            f"replay_recording: {config.replay_recording} records {recording.num_requests} "
            f"requests, the workload has {num_requests} (request i replays recorded request i)"
        )
    return recording


def load_profile_cached(path: str) -> Profile:
    """The profile at `path`, parsed once per process (re-read when the file changes)."""
    return _cached_profile(_file_key(path))


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedRun:
    """A config with every default chosen and every input loaded (not picklable: holds models)."""

    config: RunConfig  # what was asked
    profile: Profile | None  # the loaded profile (None: the config names none)
    workload: Workload  # the requests, in send order, with the concurrency cap
    k_max: int  # num_speculative_tokens of the run
    max_num_seqs: int  # running-set cap
    max_model_len: int  # longest context, tokens
    num_kv_blocks: int  # KV pool, blocks of block_size tokens
    block_size: int  # tokens per KV block
    # The fitted decode + prefill model (None without a profile).
    latency: TableLatencyModel | ParametricLatencyModel | None
    # Which model and why ("auto" chooses; None without a profile)
    latency_choice: LatencyChoice | None
    # Where the per-step host overhead comes from: "flag" (config.host_overhead_ms, a
    # constant), "measured" (the profile's model), "none" (neither: 0).
    host_overhead_source: HostOverheadSource = "none"
    host_overhead_ms: float = 0.0  # the constant when the source is "flag", else 0
    host_overhead_model: HostOverhead | None = None  # the model when the source is "measured"
    # The planning part of host_overhead_ms (source "flag"; the model has its own split)
    host_planning_ms: float = 0.0
    # The recording config.replay_recording names (None: not named; replay reads the bundled one)
    replay_recording: ReplayRecording | None = None
    # How the simulated engine runs prefill chunks beside decode rows: "fused" in one forward
    # (vLLM), "separate" as a forward of their own (dsd's torch engine: `resolve_real`)
    prefill_forward: PrefillForward = "fused"
    # How the engine lays out a step's prefill rows: each its own length ("ragged", vLLM) or
    # all padded to the longest chunk ("padded", dsd's torch engine: `resolve_real`); a
    # "separate" prefill forward is always padded
    prefill_rows: PrefillRows = "ragged"
    # What a decode row's attention reads: its own context ("ragged", vLLM) or the step's
    # longest row's span ("padded", dsd's torch engine: `resolve_real`)
    attention_span: AttentionSpan = "ragged"
    # The fixed shapes the engine runs its decode steps at (dsd's fast path: `resolve_real`);
    # None: each step runs at its own shape
    step_shapes: StepShapes | None = None
    # Whether async scheduling hides the planning part of the host time behind the device:
    # vLLM's engine, and dsd's on CUDA; dsd's engine on a CPU runs async steps serially
    # (`resolve_real` sets False there)
    host_overlap: bool = True

    @property
    def latency_kind(self) -> str | None:
        """ "table" or "parametric": the model the run uses (None without a profile)."""
        return None if self.latency_choice is None else self.latency_choice.kind

    @property
    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's limits of the run (`resolve` has checked that they build)."""
        config = self.config
        return SchedulerConfig(
            max_model_len=self.max_model_len,
            num_kv_blocks=self.num_kv_blocks,
            k_max=self.k_max,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=int(config.max_num_batched_tokens),
            block_size=self.block_size,
            scheduling=config.scheduling,
            k_timing=config.k_timing,
            speculative_method=config.speculative_method,
        )

    @property
    def max_running(self) -> int:
        """Most requests that can run at once: min(max_num_seqs, requests, concurrency cap)."""
        cap = self.workload.max_concurrency
        running = min(self.max_num_seqs, len(self.workload.requests))
        return running if cap is None else min(running, cap)

    def build_policy(self, seed: np.random.SeedSequence | None = None) -> KPolicy:
        """A fresh policy of the run's SPEC (policies hold state: one per run). `seed` feeds
        policies that sample (the bandit); the `context` policy optimises against the run's
        fitted latency model when there is one."""
        return parse_policy(
            self.config.policy,
            profile=self.profile,
            k_max=self.k_max,
            max_num_seqs=self.max_num_seqs,
            seed=seed,
            context_latency=None if self.latency is None else context_latency_fn(self.latency),
        )


def profiled_prompt_keys(config: RunConfig) -> frozenset[str]:
    """The prompt keys of the config's profile's acceptance run, which `held_out_prompts`
    leaves out (empty unless the config asks for held-out prompts): those its per-request
    outcomes record, else the first `num_prompts` of the prompt set its metadata names (as
    `dsd profile` takes them: in file order). InputError when the profile says neither."""
    if not config.held_out_prompts:
        return frozenset()
    if config.profile is None:
        raise InputError("held_out_prompts: needs a profile (its acceptance prompts are left out)")
    profile = _cached_profile(_file_key(config.profile))
    keys = frozenset(key for key in profile.draft_outcome_keys if key)
    dataset, count = profile.metadata.get("dataset"), profile.metadata.get("num_prompts")
    if not keys and dataset in PROMPT_SET_NAMES and isinstance(count, int) and count > 0:
        profiled = build_workload(str(dataset), num_prompts=count).requests
        keys = frozenset(request.prompt_key or "" for request in profiled) - {""}
    if not keys:
        raise InputError(
            f"held_out_prompts: the profile {config.profile} records no prompts to leave out "
            "(profile again with `dsd profile`, which records them; validate: --in-sample)"
        )
    return keys


def config_workload(config: RunConfig) -> Workload:
    """The requests the config's dataset and workload fields describe (without the profile's
    acceptance prompts under `held_out_prompts`)."""
    return build_workload(
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
        exclude_prompt_keys=profiled_prompt_keys(config),
    )


def resolve(config: RunConfig, workload: Workload | None = None) -> ResolvedRun:
    """Load the profile and workload and choose every default (InputError on bad input).

    `workload` replaces the dataset's (a real run re-measures prompt lengths with the model's
    tokenizer; the profiler runs synthetic requests); the defaults are derived from it.
    """
    profile_key = None if config.profile is None else _file_key(config.profile)
    profile = None if profile_key is None else _cached_profile(profile_key)
    if config.k_max is not None:
        k_max = int(config.k_max)
    else:
        # The profile's (or the default) k_max, raised to the K a static policy or a range
        # table fixes: `static:6` runs like vLLM with num_speculative_tokens 6.
        k_max = run_k_max(config.policy, DEFAULT_K_MAX if profile is None else profile.k_max)
    if (
        profile is not None
        and config.latency_model == "table"
        and not table_covers(profile, [k_max])
    ):
        raise InputError(
            f"latency_model: the table of {config.profile} does not cover K=0..{k_max} at every "
            "profiled B; use parametric or auto"
        )
    if workload is None:
        workload = config_workload(config)
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
    latency, choice = None, None
    if profile_key is not None:
        latency, choice = _cached_latency_model(
            profile_key, config.latency_model, k_max, config.mixed_k
        )
    host_source, host_ms, host_model = resolve_host_overhead(config, profile)
    recording = replay_recording_for(config, len(workload.requests))
    resolved = ResolvedRun(
        config=config,
        profile=profile,
        workload=workload,
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        latency=latency,
        latency_choice=choice,
        host_overhead_source=host_source,
        host_overhead_ms=host_ms,
        host_overhead_model=host_model,
        host_planning_ms=0.0 if config.host_planning_ms is None else config.host_planning_ms,
        replay_recording=recording,
    )
    # A bad SPEC or scheduler limit fails here, before anything runs (runs build their own:
    # policies hold state).
    resolved.build_policy()
    resolved.scheduler_config  # noqa: B018 (built for its checks)
    if config.max_num_batched_tokens < max_num_seqs:
        # vLLM's SchedulerConfig refuses it (0.33: "must be greater than or equal to
        # max_num_seqs"); run anyway, the budget would force K to 0 at every step
        raise InputError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be greater than or "
            f"equal to max_num_seqs ({max_num_seqs}), as vLLM requires: raise the budget or "
            "lower --max-num-seqs"
        )
    return resolved


def with_latency_from(resolved: ResolvedRun, timing: Profile) -> ResolvedRun:
    """The run with its latency model fitted from `timing` (the same points re-timed, e.g. by
    `validation.retime.TimingRounds`) instead of its profile; policy, acceptance and host
    overhead keep the run's own profile."""
    config = resolved.config
    try:
        latency, choice = select_latency_model(
            timing, config.latency_model, resolved.k_max, config.mixed_k
        )
    except ValueError as exc:
        raise InputError(f"re-timed profile: cannot build a latency model: {exc}") from None
    return dataclasses.replace(resolved, latency=latency, latency_choice=choice)


def resolve_host_overhead(
    config: RunConfig, profile: Profile | None
) -> tuple[HostOverheadSource, float, HostOverhead | None]:
    """(source, constant ms, measured model): the flag wins, then the profile's model, with
    the host time of the run's policy added where the profile timed it (`HostOverhead.policies`,
    by the SPEC's name, `policies.spec.policy_name`)."""
    if config.host_overhead_ms is not None:
        return "flag", float(config.host_overhead_ms), None
    if profile is not None and profile.host_overhead is not None:
        return "measured", 0.0, profile.host_overhead.for_policy(policy_name(config.policy))
    return "none", 0.0, None


def sim_seed_streams(seed: int) -> dict[str, np.random.SeedSequence]:
    """The simulator's seed streams of a run (see the module docstring), by name."""
    root = np.random.SeedSequence(seed, spawn_key=(SIM_STREAMS_SPAWN_KEY,))
    return dict(zip(SIM_STREAM_NAMES, root.spawn(len(SIM_STREAM_NAMES)), strict=True))


# --------------------------------------------------------------------------------------------
# The resolved config, for config.json
# --------------------------------------------------------------------------------------------


def _version(package: str) -> str:
    # importlib.metadata costs ~25 ms to import (email, socket): only config.json needs it
    from importlib import metadata as importlib_metadata

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


def latency_description(resolved: ResolvedRun) -> dict[str, Any]:
    """Which latency model and prefill source a run used, and the fit error when parametric."""
    latency = resolved.latency
    if latency is None:
        return {"kind": None, "requested": resolved.config.latency_model}
    info: dict[str, Any] = {
        "kind": resolved.latency_kind,
        "requested": resolved.config.latency_model,
        "choice": None if resolved.latency_choice is None else resolved.latency_choice.describe(),
        "prefill_source": latency.prefill_source,
        "prefill_cost": resolved.config.prefill_cost,
        "prefill_forward": resolved.prefill_forward,
        # where a fused step's prefill part comes from: "measured-in-decode" (the profile's
        # prefill_in_decode points) or "prefill-curve-marginal"
        "prefill_in_decode": latency.prefill.in_decode_source,
        "prefill_rows": resolved.prefill_rows,
        "attention_span": resolved.attention_span,
    }
    if isinstance(latency, TableLatencyModel) and latency.context_tables:
        info["context_lens"] = [level for level, _table in latency.context_tables]
    if isinstance(latency, ParametricLatencyModel):
        report = latency.fit_report
        info["fit_median_abs_pct"] = report.median_abs_pct
        info["fit_max_abs_pct"] = report.max_abs_pct
        info["fit_summary"] = report.summary()
        info["fit_params"] = report.params
        info["fit_param_std"] = {  # "inf": the points do not pin it down (JSON has no inf)
            name: plain_config_value(std) for name, std in report.param_std.items()
        }
    else:
        info["mixed_k"] = latency.mixed_k
    return info


def host_overhead_description(resolved: ResolvedRun) -> dict[str, Any]:
    """Which host overhead a run charged per step: its source and the constant or the model."""
    info: dict[str, Any] = {"source": resolved.host_overhead_source}
    model = resolved.host_overhead_model
    if model is not None:
        info["model"] = host_overhead_to_native(model)
    else:
        info["ms"] = resolved.host_overhead_ms
        info["planning_ms"] = resolved.host_planning_ms
    # async scheduling plans step t+1 during step t (vLLM, and dsd's engine on CUDA): the
    # planning part of the host time hides behind the device
    info["planning_overlaps"] = resolved.config.scheduling == "async" and resolved.host_overlap
    return info


def resolved_config_dict(config: RunConfig, resolved: ResolvedRun | None = None) -> dict[str, Any]:
    """The fully resolved config: what was asked, what was chosen, seeds, versions."""
    resolved = resolved if resolved is not None else resolve(config)
    streams = sim_seed_streams(config.seed)
    profile = resolved.profile
    source = policy_source(config.policy)
    return {
        "config": plain_config_value(config),
        "resolved": {
            # a user's policy: the file and class that made the run, and the file's sha256
            **({"policy_source": source} if source is not None else {}),
            "profile_path": (
                None if config.profile is None else str(Path(config.profile).expanduser().resolve())
            ),
            "profile_k_max": None if profile is None else profile.k_max,
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
            "simpy": _version("simpy"),
        },
    }
