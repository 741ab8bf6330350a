"""The Python API of dsd: every command's work as one call that returns plain results.

Each `dsd` command is a declaration of flags over one function here, and notebooks call the same
functions; results are dicts with vLLM bench keys, pandas frames and frozen dataclasses.

    import dsd
    out = dsd.simulate(profile="policies/profiles/pr32374_llama31_8b_eagle_h100.json",
                       policy="goodput", max_concurrency=16, num_prompts=160)
    out.metrics["mean_tpot_ms"], out.requests, out.steps

A run is described by flat keyword fields: the fields of `sim.config.RunConfig` (policy,
profile, dataset, scheduler limits, models, seed) and the workload knobs of
`traces.registry.WorkloadOptions` (num_prompts, max_concurrency, request_rate, random_*,
rollout_*, ...); `run_config(**fields)` builds the config they describe. Torch is imported only
by the functions that run real models.

This module orchestrates; the work itself lives in the packages (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsd.common import invocation
from dsd.common.errors import InputError, require_int
from dsd.common.progress import ProgressFactory, no_progress
from dsd.common.user_paths import check_output_file, check_output_folder
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile as _load_profile
from dsd.policies.profile_io import profile_to_pr32374, save_pr32374, save_profile
from dsd.policies.range_table import RangeTable, compile_range_table, evaluate_policy
from dsd.policies.spec import parse_policy as _parse_policy
from dsd.policies.spec import split_policy_list as _split_policy_list
from dsd.policies.speculative_config import (
    method_from_speculative_config,
    spec_from_speculative_config,
    speculative_config,
)
from dsd.policies.types import KPolicy
from dsd.reports.run_outputs import (
    StepParquetSink,
    bench_result,
    outputs_jsonl,
    request_frame,
    simulator_settings,
    step_parquet_sink,
    write_run_outputs,
)
from dsd.sim.build import build_engine, fitted_executor, learned_profile
from dsd.sim.config import DEFAULT_MAX_NUM_SEQS, RunConfig
from dsd.sim.engine import Engine, LoopConfig, RunResult
from dsd.sim.latency_choice import held_out_summary
from dsd.sim.metrics import discard_steps
from dsd.sim.resolve import ResolvedRun, resolve, resolved_config_dict
from dsd.traces.registry import WorkloadOptions, build_workload
from dsd.traces.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

    from dsd.backend.generate import GenerationReport
    from dsd.backend.pair import ModelPair
    from dsd.backend.validate import CellResult
    from dsd.backend.zoo import DistillResult, PairResult
    from dsd.reports.sweep import SweepOutcome as SweepOutcome

_RUN_CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(RunConfig))
_WORKLOAD_FIELDS = frozenset(field.name for field in dataclasses.fields(WorkloadOptions))
DEFAULT_SWEEP_POLICIES: tuple[str, ...] = ("static:0", "static:3", "goodput")
DEFAULT_SWEEP_CONCURRENCY: tuple[int, ...] = (1, 4, 16, 64)
DEFAULT_VALIDATE_CONCURRENCY: tuple[int, ...] = (1, 4)


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def run_config(*, speculative_config: str | None = None, **fields: Any) -> RunConfig:
    """The `RunConfig` that flat fields describe (RunConfig's own fields and the workload
    knobs of `WorkloadOptions`). `speculative_config` (a vLLM --speculative-config, inline JSON
    or a file) gives the policy and k_max instead of `policy`."""
    unknown = sorted(set(fields) - _RUN_CONFIG_FIELDS - _WORKLOAD_FIELDS)
    if unknown:
        raise InputError(f"unknown run field(s): {', '.join(unknown)}")
    if speculative_config is not None:
        if fields.get("policy") is not None:
            raise InputError("give exactly one of --policy and --speculative-config")
        fields["policy"], config_k_max = spec_from_speculative_config(speculative_config)
        if fields.get("k_max") not in (None, config_k_max):
            raise InputError(
                f"--num-spec-tokens {fields['k_max']} conflicts with the speculative config's "
                f"num_speculative_tokens {config_k_max}"
            )
        fields["k_max"] = config_k_max
        config_method = method_from_speculative_config(speculative_config)
        if config_method is not None:
            if fields.get("speculative_method") not in (None, config_method):
                raise InputError(
                    f"--speculative-method {fields['speculative_method']} conflicts with the "
                    f"speculative config's method ({config_method})"
                )
            fields["speculative_method"] = config_method
    if fields.get("speculative_method") is None:
        fields.pop("speculative_method", None)  # RunConfig's default: ngram
    if fields.get("policy") is None:
        raise InputError("give exactly one of --policy and --speculative-config")
    options = WorkloadOptions(**{k: v for k, v in fields.items() if k in _WORKLOAD_FIELDS})
    own = {k: v for k, v in fields.items() if k in _RUN_CONFIG_FIELDS and k not in _WORKLOAD_FIELDS}
    return RunConfig(**options.arguments(), **own)


def dataset_source(dataset_name: str | None, dataset_path: str | None) -> str:
    """The workload of vLLM's `--dataset-name` / `--dataset-path` flags (default mt-bench)."""
    from dsd.traces.registry import dataset_source as source

    return source(dataset_name, dataset_path)


def split_policy_list(text: str) -> list[str]:
    """Policy SPECs from comma-separated text (`static:0,online:decay=0.9,warmup_steps=5`)."""
    return _split_policy_list(text)


def _config(config: RunConfig | None, fields: dict[str, Any]) -> RunConfig:
    if config is None:
        return run_config(**fields)
    if fields:
        raise InputError(f"give a RunConfig or fields, not both (got {', '.join(sorted(fields))})")
    return config


# --------------------------------------------------------------------------------------------
# Runs (simulated and real)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOutcome:
    """What `simulate` and `run` return. `requests` and `steps` are DataFrames built when first
    read (so a run printed as JSON never loads pandas)."""

    metrics: dict[str, Any]  # result.json: vLLM bench keys, ours, the run's settings
    run: RunResult  # what the engine measured (its tables as numpy columns)
    resolved: ResolvedRun  # the config with every default chosen
    learned_profile: Profile | None  # the profile a learning policy (bandit) built, else None
    out: Path | None  # the folder written (result.json, requests.csv, steps.parquet, ...)
    output_ids: dict[int, list[int]] | None = None  # real runs: req_id -> generated token ids

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (requests.csv: asked and measured)."""
        return request_frame(self.run, self.resolved)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per step; empty when `keep_steps` is off or steps streamed."""
        return self.run.steps


def _execute(
    resolved: ResolvedRun,
    engine_for: Callable[[Any], Engine],
    executor_settings: dict[str, Any],
    *,
    out: str | Path | None,
    keep_steps: bool,
    record: dict[str, Any],
    pair: ModelPair | None = None,
) -> RunOutcome:
    """Build the engine with a step sink, run it, and write `out` when given (nothing is written
    when the run fails). `pair`: a real run's, whose outputs are read back."""
    if out is not None:
        check_output_folder(out)
    with contextlib.ExitStack() as stack:
        sink: StepParquetSink | None = None
        if out is not None:
            sink = stack.enter_context(step_parquet_sink(out))
        engine = engine_for(sink if sink is not None else (None if keep_steps else discard_steps))
        result = engine.run()
        metrics = bench_result(result, resolved, executor_settings)
        learned = learned_profile(engine.policy)
        output_ids = outputs = None
        if pair is not None:
            from dsd.backend.real import run_output_ids

            output_ids = run_output_ids(engine, result)
            outputs = outputs_jsonl(output_ids, pair.detokenize)
        if out is not None:
            config_record = {
                **resolved_config_dict(resolved.config, resolved),
                "command_line": invocation.command_line(),
                **record,
            }
            write_run_outputs(
                out,
                result,
                resolved,
                metrics,
                config_record,
                streamed_steps=sink,
                learned=learned,
                outputs=outputs,
            )
    return RunOutcome(
        metrics=metrics,
        run=result,
        resolved=resolved,
        learned_profile=learned,
        out=None if out is None else Path(out),
        output_ids=output_ids,
    )


def run_text(outcome: RunOutcome, *, as_json: bool = False) -> str:
    """What `dsd simulate` and `dsd run` print: the result as one JSON object, or the
    `vllm bench serve` summary (and the files written)."""
    from dsd.reports.run_outputs import (
        LEARNED_PROFILE_FILE,
        OUTPUTS_FILE,
        format_summary,
        result_json_text,
    )
    from dsd.sim.resolve import latency_description

    if as_json:
        return result_json_text(outcome.metrics)
    text = format_summary(outcome.metrics, latency_description(outcome.resolved))
    if outcome.out is not None:
        extra = f", {LEARNED_PROFILE_FILE}" if outcome.learned_profile is not None else ""
        extra += f", {OUTPUTS_FILE}" if outcome.output_ids is not None else ""
        text += (
            f"\nwrote {outcome.out}/ (result.json, requests.csv, steps.parquet, config.json{extra})"
        )
    return text


def simulate(
    config: RunConfig | None = None,
    /,
    *,
    out: str | Path | None = None,
    keep_steps: bool = True,
    speculative_config: str | None = None,
    **fields: Any,
) -> RunOutcome:
    """One simulated serving run (like `vllm bench serve`) from a profile and a K policy.

    `out`: write result.json, requests.csv, steps.parquet (streamed as the run goes),
    config.json and, for a learning policy, learned_profile.json there."""
    if speculative_config is not None:
        fields["speculative_config"] = speculative_config
    run = _config(config, fields)
    resolved = resolve(run)
    executor = fitted_executor(resolved)
    return _execute(
        resolved,
        lambda sink: build_engine(resolved, executor, LoopConfig(step_sink=sink)),
        simulator_settings(resolved),
        out=out,
        keep_steps=keep_steps,
        record={"speculative_config": speculative_config},
    )


def load_pair(
    target: str | None = None,
    draft: str = "none",
    *,
    device: str = "cpu",
    dtype: str = "auto",
    seed: int = 0,
    threads: int | None = None,
) -> ModelPair:
    """A target and its draft from specs (`backend.pair`: named shapes with random weights,
    `smollm2-135m`, .gguf files, checkpoint folders; drafts also `early-exit:N`, `ngram` and
    `none`). `threads`: torch's CPU threads for the whole process (None: torch's default)."""
    from dsd.backend.pair import load_pair as load
    from dsd.backend.threads import MAX_THREADS, set_threads

    require_int(threads, "--threads", 1, MAX_THREADS, optional=True)
    set_threads(threads)

    if target is None:
        raise InputError(
            "--target: give the target model (a named shape, smollm2-135m, a .gguf file or a "
            "checkpoint folder)"
        )
    return load(target, draft, device=device, dtype=dtype, seed=seed)


def run(
    pair: ModelPair,
    config: RunConfig | None = None,
    /,
    *,
    temperature: float = 0.0,
    fast_path: str = "off",
    ignore_eos: bool = False,
    out: str | Path | None = None,
    keep_steps: bool = True,
    **fields: Any,
) -> RunOutcome:
    """A workload through the real SD engine in the simulator's loop (wall clock).

    The same config gives the same scheduler, policy, limits and seeds as `simulate`; prompt
    lengths are re-measured with the target's tokenizer (`backend.pair`), and without a draft
    the run is plain decoding (k_max 0)."""
    from dsd.backend.fast_path import check_fast_path
    from dsd.backend.real import real_engine, resolve_real

    check_fast_path(fast_path, str(pair.device))
    resolved = resolve_real(_config(config, fields), pair, fast_path)
    from dsd.backend.threads import thread_settings
    from dsd.common.machine import load_average

    settings = {
        "backend": "dsd-torch",
        **pair.describe(),
        "threads": thread_settings(),
        "load_average": load_average(),
        "temperature": temperature,
        "fast_path": fast_path,
        "ignore_eos": ignore_eos,
        "max_model_len": resolved.max_model_len,
    }

    def engine_for(sink: Any) -> Engine:
        return real_engine(
            resolved,
            pair,
            temperature=temperature,
            ignore_eos=ignore_eos,
            fast_path=fast_path,
            step_sink=sink,
        )

    return _execute(
        resolved,
        engine_for,
        settings,
        out=out,
        keep_steps=keep_steps,
        record={"pair": settings},
        pair=pair,
    )


# --------------------------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------------------------


def sweep(
    out: str | Path,
    *,
    grid: str | Path | None = None,
    policies: Sequence[str] | None = None,
    max_concurrency: Sequence[int] | None = None,
    num_prompts_per_concurrency: int | None = None,
    workers: int | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    progress: ProgressFactory = no_progress,
    **fields: Any,
) -> SweepOutcome:
    """A grid of simulations into `out` (resumable: finished cells are reused).

    The grid is a TOML file (`grid`, docs/sweeps.md), or `policies` x `max_concurrency` closed
    loops over one config (`fields`, with `profile`), `num_prompts = per_concurrency x C`
    (default 20 x C) or a fixed `num_prompts`."""
    from dsd.reports.grid import expand_grid, load_grid
    from dsd.reports.sweep import sweep_cells, sweep_to_folder

    if grid is not None:
        given = [
            name
            for name, value in (
                ("policies", policies),
                ("max_concurrency", max_concurrency),
                ("num_prompts_per_concurrency", num_prompts_per_concurrency),
            )
            if value is not None
        ] + sorted(fields)
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise InputError(
                f"--grid: {flag} cannot be combined with a grid file (put it in the grid)"
            )
        cells = expand_grid(load_grid(grid))
        record: dict[str, Any] = {
            "grid_file": str(Path(grid).resolve()),
            "grid_toml": _grid_text(grid),
        }
        title = Path(grid).name
    else:
        if fields.get("profile") is None:
            raise InputError("give --profile (or --grid FILE)")
        num_prompts = fields.pop("num_prompts", None)
        if num_prompts is not None and num_prompts_per_concurrency is not None:
            raise InputError("give one of --num-prompts and --num-prompts-per-concurrency")
        if num_prompts_per_concurrency is not None and num_prompts_per_concurrency < 1:
            raise InputError(
                f"--num-prompts-per-concurrency: must be >= 1, got {num_prompts_per_concurrency}"
            )
        specs = list(DEFAULT_SWEEP_POLICIES if policies is None else policies)
        concurrencies = list(
            DEFAULT_SWEEP_CONCURRENCY if max_concurrency is None else max_concurrency
        )
        _check_unique("--policies", specs)
        _check_unique("--max-concurrency", concurrencies)
        seed = int(fields.get("seed", 0))
        fields.pop("max_concurrency", None)
        base = run_config(policy=specs[0], **fields)
        per_concurrency = None if num_prompts is not None else (num_prompts_per_concurrency or 20)
        cells = sweep_cells(
            base,
            specs,
            concurrencies,
            num_prompts_per_concurrency=per_concurrency,
            num_prompts=num_prompts,
            seed=seed,
        )
        record = {
            "policies": specs,
            "max_concurrency": concurrencies,
            "num_prompts_per_concurrency": per_concurrency,
            "num_prompts": num_prompts,
            "seed": seed,
        }
        title = Path(str(fields["profile"])).name
    return sweep_to_folder(
        cells,
        out,
        grid_record=record,
        title=title,
        workers=workers,
        use_ray=ray,
        ray_address=ray_address,
        progress=progress,
    )


def _grid_text(path: str | Path) -> str:
    from dsd.common.user_files import read_user_text

    return read_user_text(path)  # as load_grid read it (BOM dropped)


def _check_unique(name: str, values: Sequence[Any]) -> None:
    if not values:
        raise InputError(f"{name}: give at least one value")
    if len(set(values)) != len(values):
        raise InputError(f"{name}: duplicate values in {list(values)}")


def report(out: str | Path, *, k_trace_cell: str | None = None) -> Path:
    """The markdown report (and PNGs) of a sweep folder; returns the report's path."""
    from dsd.reports.report import build_report

    return build_report(out, k_trace_cell=k_trace_cell, command_line=invocation.command_line())


# --------------------------------------------------------------------------------------------
# Profiles, validation
# --------------------------------------------------------------------------------------------


def profile(
    pair: ModelPair,
    *,
    out: str | Path,
    batch_sizes: Sequence[int] = (1, 4, 16),
    k: Sequence[int] = (0, 1, 3, 5),
    context_lens: Sequence[int] = (128,),
    prefill_tokens: Sequence[int] = (32, 128, 512),
    dataset: str = "mt-bench",
    num_prompts: int | None = None,
    output_len: int | None = None,
    warmup: int = 3,
    iters: int = 10,
    max_remeasure: int = 2,
    allow_noisy: bool = False,
    adaptive_target_pct: float | None = None,
    adaptive_budget_s: float = 600.0,
    host_overhead_output_len: int = 32,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    seed: int = 0,
    fast_path: str = "off",
    file_format: str = "dsd-profile",
    progress: ProgressFactory = no_progress,
) -> Profile:
    """Measure ITL(B, K, context), prefill, acceptance and the loop's host overhead of a pair
    into a profile written to `out` (`file_format` dsd-profile, or dsd-json for PR #32374's
    file); returns it. Points that fail the timing checks (`policies.profile_quality`) are
    measured again up to `max_remeasure` times; a profile that still fails is refused (an
    InputError naming the points) unless `allow_noisy`. `adaptive_target_pct`: add batch sizes
    where the ITL table interpolates worst until each interior B is predicted from its
    neighbours within that many percent, or `adaptive_budget_s` runs out. `ignore_eos`: the
    acceptance prompts run to their output length past an EOS (as `dsd validate` runs them)."""
    from dsd.backend.fast_path import check_fast_path
    from dsd.backend.profiler import ProfileConfig, dataset_prompts, profile_pair

    if file_format not in ("dsd-profile", "dsd-json"):
        raise InputError(f"--format: choose dsd-profile or dsd-json, got {file_format!r}")
    check_output_file(out, "--out")  # before minutes of measuring, not after
    check_fast_path(fast_path, str(pair.device))
    if pair.draft is None:
        raise InputError("--draft: profiling needs a draft (a model spec or early-exit:N)")
    eos = (
        () if pair.tokenizer_name is None or ignore_eos else tuple(pair.target.config.eos_token_ids)
    )
    config = ProfileConfig(
        batch_sizes=tuple(batch_sizes),
        spec_tokens=tuple(k),
        context_lens=tuple(context_lens),
        prefill_token_counts=tuple(prefill_tokens),
        num_warmup=warmup,
        num_iters=iters,
        max_remeasure=max_remeasure,
        allow_noisy=allow_noisy,
        adaptive_target_pct=adaptive_target_pct,
        adaptive_budget_s=adaptive_budget_s,
        host_overhead_output_len=host_overhead_output_len,
        acceptance_output_len=output_len,
        temperature=temperature,
        seed=seed,
        fast_path=fast_path,
        eos_token_ids=eos,
    )
    prompts, output_lens, prompt_keys = dataset_prompts(
        pair, dataset, num_prompts=num_prompts, output_len=output_len, seed=seed
    )
    metadata = {
        "target": pair.target_spec,
        "draft": pair.draft_spec,
        "dataset": dataset,
        "num_prompts": len(prompts),
        "command": invocation.command_line(),
        "temperature": temperature,
        "ignore_eos": ignore_eos,
    }
    with progress(config.num_units(len(prompts)), "profiling") as advance:
        measured = profile_pair(
            pair.target, pair.draft, config, prompts, output_lens, metadata, advance, prompt_keys
        )
    if file_format == "dsd-json":
        save_pr32374(measured, out)
    else:
        save_profile(measured, out)
    return measured


def profile_text(measured: Profile, out: str | Path, file_format: str = "dsd-profile") -> str:
    """What `dsd profile` prints: the points written, the fitted host overhead, and how well
    the latency models hold between the profiled batch sizes."""
    rates = ", ".join(f"{r:.3f}" for r in measured.acceptance_rates)
    text = (
        f"wrote {out}: {len(measured.latency)} latency points, {len(measured.prefill)} prefill "
        f"points, acceptance rates [{rates}]"
    )
    host = measured.host_overhead
    if host is not None:
        text += (
            f"\nhost overhead per step: {host.plain.intercept_ms:.3f} + "
            f"{host.plain.per_row_ms:.4f} x B ms (K = 0), {host.spec.intercept_ms:.3f} + "
            f"{host.spec.per_row_ms:.4f} x B ms (K > 0); residual {host.residual_ms:.3f} ms "
            f"over {host.num_steps} loop steps"
            + ("" if file_format == "dsd-profile" else " (not kept by --format dsd-json)")
        )
        if host.planning_plain is not None and host.planning_spec is not None:
            text += (
                "\nof which planning (overlapped by async scheduling): "
                f"{host.planning_plain.intercept_ms:.3f} + {host.planning_plain.per_row_ms:.4f} "
                f"x B ms (K = 0), {host.planning_spec.intercept_ms:.3f} + "
                f"{host.planning_spec.per_row_ms:.4f} x B ms (K > 0)"
            )
    adaptive = measured.metadata.get("quality", {}).get("adaptive")
    if adaptive:
        added = sorted(b for row in adaptive["rounds"] for b in row["added"])
        last = adaptive["rounds"][-1]["worst_held_out_pct"]
        verdict = "met" if adaptive["met"] else "not met"
        text += (
            f"\nadaptive batch sizes: added {added or 'none'}; worst held-out ITL error "
            f"{last:.1f}% (target {adaptive['target_pct']:g}%: {verdict})"
        )
    held_out = held_out_summary(measured)
    if held_out:
        text += f"\n{held_out}"
    return text


# The profile re-timed around a validation's real runs, in its report folder (docs/validation.md)
RETIMED_PROFILE_NAME = "profile_retimed.json"


def validate(
    pair: ModelPair,
    *,
    profile: str,
    out: str | Path,
    policies: Sequence[str] = DEFAULT_SWEEP_POLICIES,
    max_concurrency: Sequence[int] = DEFAULT_VALIDATE_CONCURRENCY,
    num_prompts_per_concurrency: int = 20,
    trials: int = 3,
    fast_path: str = "off",
    allow_noisy_profile: bool = False,
    retime: bool = True,
    progress: ProgressFactory = no_progress,
    **fields: Any,
) -> list[CellResult]:
    """Every (policy, C) cell on the simulator fitted from `profile` and on the real pair, with
    num_prompts = per_concurrency x C and max_num_seqs = C (unless given); a report folder in
    `out`. `fields` are run fields shared by every cell (dataset, output_len, seed, ...).
    Each cell's real side runs `trials` times (rounds in which the cells of one C run
    interleaved, `validation_cells`). `retime`: the profile's points are timed again around
    every group of real runs and the simulated
    side is priced by them (`backend.profiler.TimingRounds`; `profile_retimed.json` in `out`).
    A profile that fails the timing checks (`policies.profile_quality`) is refused before
    anything runs, unless `allow_noisy_profile` (then its problems go into the report)."""
    from dsd.reports.validation import write_validation_report

    check_output_folder(out)  # before the real runs, not after them

    cells, record, retimed = _validation(
        pair,
        profile=profile,
        policies=policies,
        max_concurrency=max_concurrency,
        num_prompts_per_concurrency=num_prompts_per_concurrency,
        trials=trials,
        fast_path=fast_path,
        allow_noisy_profile=allow_noisy_profile,
        retime=retime,
        progress=progress,
        **fields,
    )
    write_validation_report(out, cells, record)
    if retimed is not None:
        save_profile(retimed, Path(out) / RETIMED_PROFILE_NAME)
    return cells


def validation_cell_config(
    profile: str,
    policy: str,
    concurrency: int,
    prompts_per_concurrency: int,
    *,
    max_num_seqs: int | None = None,
    **fields: Any,
) -> RunConfig:
    """One validation cell: `prompts_per_concurrency` x C requests at concurrency C, with
    max_num_seqs = C unless given; `fields`: other run fields (dataset, output_len, ...)."""
    return run_config(
        profile=profile,
        policy=policy,
        num_prompts=prompts_per_concurrency * concurrency,
        max_concurrency=concurrency,
        max_num_seqs=concurrency if max_num_seqs is None else max_num_seqs,
        **fields,
    )


def _validation(
    pair: ModelPair,
    *,
    profile: str,
    policies: Sequence[str],
    max_concurrency: Sequence[int],
    num_prompts_per_concurrency: int,
    trials: int,
    fast_path: str,
    allow_noisy_profile: bool,
    retime: bool,
    progress: ProgressFactory,
    retime_share: float = 1.0,
    deadline_s: float | None = None,
    **fields: Any,
) -> tuple[list[CellResult], dict[str, Any], Profile | None]:
    """The cells of `validate`, the record of how they ran (the report's config.json) and the
    re-timed profile their simulated side was priced by (None: not re-timed)."""
    from dsd.backend.fast_path import check_fast_path
    from dsd.backend.profiler import TimingRounds, environment_metadata
    from dsd.backend.real import resolve_real
    from dsd.backend.validate import validation_cells
    from dsd.policies.profile_quality import check_profile, problems_line

    _check_unique("--policies", list(policies))
    _check_unique("--max-concurrency", list(max_concurrency))
    check_fast_path(fast_path, str(pair.device))
    loaded_profile = _load_profile(profile)
    problems = check_profile(loaded_profile)
    if problems and not allow_noisy_profile:
        raise InputError(
            f"--profile {profile}: its timing fails the checks ({problems_line(problems)}); "
            "profile again on a quiet machine, or --allow-noisy-profile"
        )
    if num_prompts_per_concurrency < 1:
        raise InputError(
            f"--num-prompts-per-concurrency: must be >= 1, got {num_prompts_per_concurrency}"
        )
    configs = [
        validation_cell_config(profile, spec, concurrency, num_prompts_per_concurrency, **fields)
        for concurrency in max_concurrency
        for spec in policies
    ]
    resolved = [resolve_real(config, pair, fast_path) for config in configs]
    # Re-timing needs the profile's contexts (a vLLM-derived table has none)
    retime_note = "on"
    if retime and any(point.context_len is None for point in loaded_profile.latency):
        retime, retime_note = False, "off: the profile records no context for its points"
    elif not retime:
        retime_note = "off (--no-retime)"
    timing = (
        TimingRounds(
            pair.target,
            pair.draft,
            loaded_profile,
            share=retime_share,
            seed=configs[0].seed,
            fast_path=fast_path,
        )
        if retime
        else None
    )
    with progress(len(resolved) * trials, "validating") as advance:
        cells = validation_cells(
            resolved,
            pair,
            trials=trials,
            fast_path=fast_path,
            on_progress=advance,
            timing=timing,
            deadline_s=deadline_s,
        )
    retimed = None if timing is None else timing.profile()
    if timing is not None:
        timing.free()
    first = configs[0]
    report_config = {
        "command": invocation.command_line(),
        "profile": profile,
        "target": pair.target_spec,
        "draft": pair.draft_spec,
        "policies": list(policies),
        "max_concurrency": list(max_concurrency),
        "dataset": first.dataset,
        "num_prompts_per_concurrency": num_prompts_per_concurrency,
        "trials": trials,
        # fewer where a deadline (hardware-report --time-budget) stopped the rounds
        "trials_done": len(cells[0].measured_trials),
        "output_len": first.output_len,
        "seed": first.seed,
        "scheduling": first.scheduling,
        "latency_model": first.latency_model,
        "acceptance_model": first.acceptance_model,
        "host_overhead_ms": first.host_overhead_ms,
        "host_overhead_source": resolved[0].host_overhead_source,
        "fast_path": fast_path,
        # how the engine ran prefill chunks beside decode rows (rescore reads it; older
        # reports lack it: "separate")
        "prefill_forward": resolved[0].prefill_forward,
        "ignore_eos": True,
        "profile_problems": [str(problem) for problem in problems],
        # what a plain `goodput` / `online` / `per-request` SPEC scored (rescore reads them;
        # older reports lack them: "rates")
        "goodput_acceptance": "sequences",
        "online_acceptance": "sequences",
        "per_request_acceptance": "sequences",
        "retime": (
            {"status": retime_note}
            if timing is None
            else {
                "status": retime_note,
                **timing.counts(),
                "profile": RETIMED_PROFILE_NAME,
            }
        ),
        **environment_metadata(pair.device, pair.dtype),
        "cells": [
            {
                "policy": r.config.policy,
                "max_concurrency": r.workload.max_concurrency,
                "num_prompts": len(r.workload.requests),
                "k_max": r.k_max,
                "max_num_seqs": r.max_num_seqs,
                "max_model_len": r.max_model_len,
                "num_kv_blocks": r.num_kv_blocks,
                "latency_model": r.latency_kind,
                "host_overhead_source": r.host_overhead_source,
            }
            for r in resolved
        ],
    }
    return cells, report_config, retimed


@dataclass(frozen=True)
class HardwarePlan:
    """What `hardware_report` measures (the full plan, or `QUICK_HARDWARE_PLAN`)."""

    k_values: tuple[int, ...]  # static K of the crossover; the profile's K (0, 1, k_max in it)
    batch_sizes: tuple[int, ...]  # profiled B
    concurrency: tuple[int, ...]  # validated C
    dynamic_policies: tuple[str, ...]  # policies beside static K in every cell
    context_lens: tuple[int, ...]  # profiled context lengths
    prefill_tokens: tuple[int, ...]
    acceptance_prompts: int  # prompts of the profile's acceptance run
    profile_iters: int
    profile_warmup: int
    speedup_prompts: int  # prompts of the B = 1 speedup arms
    speedup_repeats: int
    speedup_k: tuple[int, ...]  # static K of the speedup arms (plus goodput)
    # more B = 1 arms, 'DRAFT POLICY [K_MAX]' (`Arm.parse`): drafts other than the report's
    speedup_extra_arms: tuple[str, ...]
    prompts_per_concurrency: int  # validation requests per cell = this x C
    trials: int  # real runs per validation cell
    retime_share: float  # share of the profile's points each timing round re-times
    output_len: int | None  # max_tokens of every request; None: the dataset's
    allow_noisy_profile: bool


# 65-90 minutes on the 2-core CPU with SmolLM2-135M at 1 thread (2026-11-25: 65 minutes, of which
# the profile 6). The validation's timing rounds re-time every profile point after each group of
# real runs (the cells of one C, run together: `backend.validate.validation_cells`), and probes
# between the group's steps add a quarter to its time (`SpeedProbes`). 96 output tokens per request,
# as in the issue's reference timings. Two contexts bracket the cells' (prompts of 60-210 tokens
# plus 96 outputs), so the latency table has a context axis; prefill sizes cover one prompt and the
# few padded together when requests finish in one step. Five trials per cell: the median over trials
# spread through the hour (its measured TPOT) is what averages the machine's minute-scale drift out.
# 20 profile rounds, not the profiler's default 10: one point's ratio to its K = 0, what goodput's K
# reads, is then within 3.1% (p90) against 5.5% at 10 rounds (`benchmarks/profile_precision.py`,
# docs/validation.md). On the AVX2 host of 2026-11-27, where every pass has noisy points and each
# context is timed three times, the profile took 22 minutes, against 13 with 10 rounds and only the
# noisy points re-timed.
# The profile is kept when points stay noisy after re-measurement: its problems are listed in the
# report rather than losing the time (dsd validate refuses them).
FULL_HARDWARE_PLAN = HardwarePlan(
    k_values=(0, 2, 4, 6),
    batch_sizes=(1, 2, 4, 8, 16),
    concurrency=(1, 2, 4, 8),
    dynamic_policies=("goodput", "online", "per-request"),
    context_lens=(64, 320),
    prefill_tokens=(32, 64, 128, 256, 512),
    acceptance_prompts=40,
    profile_iters=20,
    profile_warmup=3,
    speedup_prompts=8,
    speedup_repeats=3,
    speedup_k=(4, 6),
    # none by default: ngram:3-10 static:10 measured 1.75x and 1.42x against ngram:2-6
    # static:4's 1.55x and 1.62x in two runs of one hour (reports/engine/2026-11-28-cpu-b1-drafts)
    speedup_extra_arms=(),
    prompts_per_concurrency=2,
    trials=5,
    retime_share=1.0,
    output_len=96,
    allow_noisy_profile=True,
)
# Seconds a time-budgeted report keeps for what follows the last trial round: the simulated
# side of every cell (simulator runs, no model), the plots and the files.
REPORT_WRITE_RESERVE_S = 30.0

QUICK_HARDWARE_PLAN = HardwarePlan(
    k_values=(0, 1, 2),
    batch_sizes=(1, 2),
    concurrency=(1, 2),
    dynamic_policies=("goodput",),
    context_lens=(32, 64),
    prefill_tokens=(16, 64),
    acceptance_prompts=2,
    profile_iters=2,
    profile_warmup=1,
    speedup_prompts=2,
    speedup_repeats=1,
    speedup_k=(2,),
    speedup_extra_arms=(),
    prompts_per_concurrency=1,
    trials=1,
    retime_share=1.0,
    output_len=12,
    allow_noisy_profile=True,
)


def hardware_cell_config(
    profile: str,
    policy: str,
    concurrency: int,
    *,
    plan: HardwarePlan = FULL_HARDWARE_PLAN,
    prompts_per_concurrency: int | None = None,
    dataset: str = "instructcoder",
    k_max: int = 6,
    seed: int = 0,
    **fields: Any,
) -> RunConfig:
    """One validation cell of a hardware report (`validation_cell_config`), as
    `hardware_report` runs it: `plan`'s
    prompts per concurrency (or `prompts_per_concurrency`) x C prompts of `dataset`, its output
    length, max_num_seqs = C, and the empirical acceptance model (the cell's prompts are among
    the profiled ones, so each replays its recorded drafts). `fields`: other run fields
    (k_timing, ...). For benchmarks that measure on the report's workload."""
    return validation_cell_config(
        profile,
        policy,
        concurrency,
        prompts_per_concurrency or plan.prompts_per_concurrency,
        dataset=dataset,
        output_len=plan.output_len,
        k_max=k_max,
        seed=seed,
        acceptance_model="empirical",
        **fields,
    )


def hardware_report(
    *,
    out: str | Path,
    device: str = "cpu",
    target: str = "smollm2-135m",
    draft: str = "ngram:2-6",
    dtype: str = "auto",
    fast_path: str = "off",
    threads: int | None = None,
    dataset: str = "instructcoder",
    quick: bool = False,
    trials: int | None = None,
    time_budget_s: float | None = None,
    speedup_arms: Sequence[str] | None = None,
    seed: int = 0,
    progress: ProgressFactory = no_progress,
    on_stage: Callable[[str], None] | None = None,
) -> list[Path]:
    """The real-hardware report (docs/validation.md): load the pair, profile it, time the
    speedup arms at B = 1, run every (policy, C) cell on the real engine (trials) and the
    simulator, and write `reports.hardware`'s folder into `out`. `quick`: a small plan that
    runs in about a minute (a dry run of the pipeline, not a measurement). `trials`: real runs
    per cell instead of the plan's (a shorter run where time is short, e.g. a lent GPU); the
    plan recorded in config.json says which. `time_budget_s`: seconds the whole report may
    take (a lent GPU's call): the validation starts no trial round that would end past it, less
    `REPORT_WRITE_RESERVE_S` (at least one round runs; config.json's `trials_done` says how
    many did). `speedup_arms`: B = 1 arms beside the report's draft, 'DRAFT POLICY [K_MAX]'
    (None: the plan's `speedup_extra_arms`). On CPU `threads` defaults to 1 (a shared
    machine's cores are not all ours).
    `dtype` and `fast_path` (the decode path: off, eager, cuda-graphs) hold for the profile, the
    speedup arms and the cells alike."""
    import datetime as dt
    import time

    from dsd.backend.profiler import environment_metadata
    from dsd.common.machine import load_average
    from dsd.reports.hardware import write_hardware_report
    from dsd.reports.speedup import Arm, measure_arms

    plan = QUICK_HARDWARE_PLAN if quick else FULL_HARDWARE_PLAN
    if trials is not None:
        if trials < 1:
            raise InputError(f"--trials {trials}: must be at least 1")
        plan = dataclasses.replace(plan, trials=trials)
    if time_budget_s is not None and not time_budget_s > 0:
        raise InputError(f"--time-budget {time_budget_s}: must be > 0 seconds")
    deadline_s = (
        None if time_budget_s is None else time.monotonic() + time_budget_s - REPORT_WRITE_RESERVE_S
    )
    stage = on_stage or (lambda text: None)
    folder = check_output_folder(out)
    from dsd.backend.fast_path import check_fast_path
    from dsd.backend.pair import check_draft_spec

    check_draft_spec(draft)  # a bad spelling fails before anything loads
    if speedup_arms is not None:
        plan = dataclasses.replace(plan, speedup_extra_arms=tuple(speedup_arms))
    extra_arms = [Arm.parse(text) for text in plan.speedup_extra_arms]
    for arm in extra_arms:
        if arm.draft == "none":
            raise InputError("--speedup-arm none: plain decoding is always the first arm")
        check_draft_spec(arm.draft)
    check_fast_path(fast_path, device)  # load_pair checks the device and dtype
    if draft.strip() in ("", "none"):
        raise InputError("--draft: the hardware report needs a draft (e.g. ngram:2-6)")
    if threads is None and device == "cpu":
        threads = 1
    started = dt.datetime.now(dt.UTC)
    loads = [load_average()]
    stage(f"loading {target} + {draft} on {device}")
    pair = load_pair(target, draft, device=device, dtype=dtype, threads=threads, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    profile_path = folder / "profile.json"
    k_max = max(plan.k_values)
    stage(f"profiling into {profile_path}")
    profile(
        pair,
        out=profile_path,
        batch_sizes=plan.batch_sizes,
        k=sorted({0, 1, *plan.k_values}),
        context_lens=plan.context_lens,
        prefill_tokens=plan.prefill_tokens,
        dataset=dataset,
        num_prompts=plan.acceptance_prompts,
        output_len=plan.output_len,
        warmup=plan.profile_warmup,
        iters=plan.profile_iters,
        allow_noisy=plan.allow_noisy_profile,
        # the cells run every request to its length (vllm bench --ignore-eos); so do the
        # acceptance prompts, whose draft sequences the cells' simulated side replays
        ignore_eos=True,
        seed=seed,
        fast_path=fast_path,
        progress=progress,
    )
    loads.append(load_average())
    stage("timing the B = 1 speedup arms")
    arms = [
        Arm("none", "static:0", 0),
        *(Arm(draft, f"static:{k}", k) for k in plan.speedup_k),
        Arm(draft, "goodput", k_max),
        *extra_arms,
    ]
    speedup_config = run_config(
        policy="static:0",
        profile=str(profile_path),
        dataset=dataset,
        num_prompts=plan.speedup_prompts,
        max_concurrency=1,
        output_len=plan.output_len,
        seed=seed,
    )
    with progress(len(arms) * plan.speedup_repeats, "speedup at B=1") as advance:
        speedup = measure_arms(
            pair,
            arms,
            speedup_config,
            repeats=plan.speedup_repeats,
            fast_path=fast_path,
            on_run=lambda repeat, arm, record: advance(f"{arm.label} repeat {repeat + 1}"),
        )
    loads.append(load_average())
    stage("validating: every (policy, C) cell, real and simulated")
    policies = [*(f"static:{k}" for k in plan.k_values), *plan.dynamic_policies]
    cells, record, retimed = _validation(
        pair,
        profile=str(profile_path),
        policies=policies,
        max_concurrency=plan.concurrency,
        num_prompts_per_concurrency=plan.prompts_per_concurrency,
        trials=plan.trials,
        fast_path=fast_path,
        allow_noisy_profile=plan.allow_noisy_profile,
        retime=True,
        retime_share=plan.retime_share,
        progress=progress,
        dataset=dataset,
        output_len=plan.output_len,
        k_max=k_max,
        seed=seed,
        deadline_s=deadline_s,
        # The cells' prompts are among the profiled ones: each is simulated with its own
        # measured draft outcomes (sim.acceptance.EmpiricalAcceptance matches prompt keys).
        acceptance_model="empirical",
    )
    loads.append(load_average())
    environment = environment_metadata(pair.device, pair.dtype)
    record.update(
        {
            "command": invocation.command_line(),
            "device": device,
            "device_name": environment["device"],
            **({"matmul": environment["matmul"]} if "matmul" in environment else {}),
            "quick": quick,
            "plan": dataclasses.asdict(plan),
            "time_budget_s": time_budget_s,
            "started": started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "load_during": {"min": min(loads), "max": max(loads), "samples": loads},
            "speedup_prompts": plan.speedup_prompts,
            "speedup_repeats": plan.speedup_repeats,
        }
    )
    stage(f"writing {folder}")
    written = [profile_path]
    if retimed is not None:
        save_profile(retimed, folder / RETIMED_PROFILE_NAME)
        written.append(folder / RETIMED_PROFILE_NAME)
    return [*written, *write_hardware_report(folder, config=record, speedup=speedup, cells=cells)]


def validate_vllm(
    measured: str | Path,
    *,
    profile: str,
    policy: str,
    out: str | Path | None = None,
    **fields: Any,
) -> CellResult:
    """The simulator on a `vllm bench serve --save-result` file's workload vs its metrics."""
    import math

    from dsd.backend.validate import load_vllm_result, validate_against_vllm
    from dsd.reports.validation import write_validation_report

    seed = int(fields.get("seed", 0))
    result = load_vllm_result(measured, seed=seed)
    # The file's workload replaces the dataset's: a one-request placeholder keeps resolve cheap.
    config = run_config(profile=profile, policy=policy, dataset="random", num_prompts=1, **fields)
    cell = validate_against_vllm(result, config)
    if out is not None:
        write_validation_report(
            out,
            [cell],
            {
                "command": invocation.command_line(),
                "measured": str(measured),
                "profile": profile,
                "policy": policy,
                "seed": seed,
                "request_rate": "inf" if math.isinf(result.request_rate) else result.request_rate,
                "burstiness": result.burstiness,
                "host_overhead_ms": config.host_overhead_ms,
                "host_overhead_source": cell.host_overhead_source,
                "num_requests": len(result.workload.requests),
                "vllm_run": result.info,
            },
            title=f"Validation: simulator vs {Path(result.source).name}",
        )
    return cell


# --------------------------------------------------------------------------------------------
# Policies and vLLM formats
# --------------------------------------------------------------------------------------------


def load_profile(path: str | Path) -> Profile:
    """A profile file, native or PR #32374's (docs/formats.md); one-line errors on bad input."""
    return _load_profile(path)


def parse_policy(
    spec: str,
    *,
    profile: str | Path | Profile | None = None,
    k_max: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    seed: int | None = None,
) -> KPolicy:
    """The K policy a SPEC names (docs/policies.md); k_max defaults to the profile's."""
    loaded = _load_profile(profile) if isinstance(profile, str | Path) else profile
    if k_max is None:
        if loaded is None:
            raise InputError("k_max: give k_max or a profile")
        k_max = loaded.k_max
    return _parse_policy(spec, profile=loaded, k_max=k_max, max_num_seqs=max_num_seqs, seed=seed)


def export_vllm(
    profile: str | Path,
    *,
    max_num_seqs: int,
    policy: str = "goodput",
    method: str | None = None,
    draft_model: str | None = None,
) -> dict[str, Any]:
    """vLLM's --speculative-config for a policy compiled to a range table on a profile."""
    loaded = _load_profile(profile)
    chosen = _parse_policy(policy, profile=loaded, k_max=loaded.k_max, max_num_seqs=max_num_seqs)
    table = compile_range_table(chosen, loaded.k_max, max_num_seqs)
    return speculative_config(table, loaded.k_max, method=method, draft_model=draft_model)


def export_pr32374(profile: str | Path) -> dict[str, Any]:
    """A profile as vLLM PR #32374's dynamic_speculative_config.json object."""
    return profile_to_pr32374(_load_profile(profile))


@dataclass(frozen=True)
class PolicyExplanation:
    """What a batch-level policy does at every B under a profile."""

    frame: pd.DataFrame  # one row per B: B, K, AL, ITL ms, goodput tok/s/req, best K, note
    range_table: RangeTable  # the policy compiled to vLLM's range table
    k_max: int  # the profile's K_max
    # each latency model's worst error at a profiled B it was fitted without ("" below 3 B)
    held_out: str = ""


def explain_policy(
    profile: str | Path, *, max_num_seqs: int, policy: str = "goodput", show_all: bool = False
) -> PolicyExplanation:
    """B -> K, AL, ITL and goodput of a policy; without `show_all`, the rows where K changes,
    the profiled B, B = 1 and the last B."""
    loaded = _load_profile(profile)
    chosen = _parse_policy(policy, profile=loaded, k_max=loaded.k_max, max_num_seqs=max_num_seqs)
    evaluated = evaluate_policy(chosen, loaded, max_num_seqs)
    profiled = set(loaded.batch_sizes())
    changes = np.concatenate([[False], evaluated.k_star[1:] != evaluated.k_star[:-1]])  # [N]
    import pandas as pd

    frame = pd.DataFrame(
        {
            "B": evaluated.batch_sizes,
            "K": evaluated.k_star,
            "AL": evaluated.acceptance_length,
            "ITL ms": evaluated.itl_ms,
            "goodput tok/s/req": evaluated.goodput * 1000.0,
            "best K": np.argmax(evaluated.goodput_by_k, axis=1),
            "note": [
                ", ".join(
                    note
                    for note, present in (("profiled", b in profiled), ("K changes", change))
                    if present
                )
                for b, change in zip(evaluated.batch_sizes.tolist(), changes.tolist(), strict=True)
            ],
        }
    )
    if not show_all:
        batch = frame["B"]
        keep = (batch == 1) | (batch == batch.iloc[-1]) | batch.isin(profiled) | changes
        frame = frame[keep].reset_index(drop=True)
    return PolicyExplanation(
        frame=frame,
        range_table=compile_range_table(chosen, loaded.k_max, max_num_seqs),
        k_max=loaded.k_max,
        held_out=held_out_summary(loaded),
    )


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


def workload(source: str, **options: Any) -> Workload:
    """The requests of a workload name or file, shaped by the workload knobs of
    `WorkloadOptions` (num_prompts, request_rate, max_concurrency, random_*, rollout_*, ...)."""
    unknown = sorted(set(options) - _WORKLOAD_FIELDS)
    if unknown:
        raise InputError(f"unknown workload option(s): {', '.join(unknown)}")
    return build_workload(source, **WorkloadOptions(**options).arguments())


def workload_summary_rows(workload: Workload) -> list[tuple[str, str]]:
    """(label, value) rows of a workload's statistics (counts, duration, rate, lengths, tags)."""
    from dsd.traces.export import summarize, summary_rows

    return summary_rows(summarize(workload))


def plot_workload(workload: Workload, out: str | Path) -> list[Path]:
    """lengths.png and arrivals.png of a workload in folder `out`; their paths."""
    from dsd.traces.export import plot_workload as plot

    return plot(workload, check_output_folder(out))


def write_workload_table(workload: Workload, out: str | Path) -> None:
    """A workload in our table schema (.csv or .parquet by the suffix), atomically."""
    from dsd.traces.export import write_workload_table as write

    write(workload, Path(out))


def write_vllm_custom_jsonl(workload: Workload, out: str | Path) -> str:
    """A workload as the JSONL `vllm bench serve --dataset-name custom` replays; returns what to
    tell the user (the file, the replay command, and what the format loses)."""
    from dsd.traces.export import write_vllm_custom_jsonl as write

    write(workload, Path(out))
    lines = [
        f"wrote {out} ({len(workload.requests):,} requests)",
        "replay: vllm bench serve --dataset-name custom "
        f"--dataset-path {out} --num-prompts {len(workload.requests)} --custom-output-len -1 "
        "--skip-chat-template --disable-shuffle --ignore-eos "
        "[--request-rate R --burstiness X | --max-concurrency C]",
    ]
    if any(request.arrival_s > 0 for request in workload.requests):
        lines.append(
            "note: the JSONL has no arrival times; the trace's timestamps are not replayed"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Real text and the model zoo
# --------------------------------------------------------------------------------------------


def generate(
    pair: ModelPair,
    prompts: Sequence[str],
    *,
    k: int = 4,
    max_tokens: int = 64,
    temperature: float = 0.0,
    chat: bool = True,
    seed: int = 0,
) -> GenerationReport:
    """Text for each prompt: target-only decoding, or speculative decoding with the pair's
    draft (K = `k` per step)."""
    from dsd.backend.generate import GenerationConfig, generate_texts

    config = GenerationConfig(
        max_tokens=max_tokens, temperature=temperature, num_spec_tokens=k, seed=seed, chat=chat
    )
    return generate_texts(pair, prompts, config)


def generation_text(report: GenerationReport, k: int) -> str:
    """The line `dsd generate` ends with: tokens, time, speed and, with a draft, acceptance."""
    tokens_per_s = report.num_output_tokens / report.elapsed_s if report.elapsed_s > 0 else 0.0
    line = (
        f"{report.num_output_tokens} output tokens in {report.elapsed_s:.2f} s "
        f"({tokens_per_s:.1f} tok/s)"
    )
    if any(report.drafted_at_pos):
        rates = ", ".join(f"{rate:.2f}" for rate in report.per_position_rates)
        line += f"; K={k}, acceptance length {report.acceptance_length:.2f}, r_i = [{rates}]"
    return line


def train_pair(
    out: str | Path,
    *,
    target_config: str = "s-target",
    draft_config: str = "s-draft",
    corpus: str = "stdlib",
    on_step: Callable[[int, list[float]], None] | None = None,
    **train: Any,
) -> PairResult:
    """Train a target and a smaller draft from scratch on one corpus (`backend.zoo`); `train`
    holds `backend.zoo.TrainConfig` fields (tokenizer, steps, batch_size, ...)."""
    from dsd.backend.corpus import parse_corpus_names
    from dsd.backend.zoo import TrainConfig
    from dsd.backend.zoo import train_pair as train_models

    config = TrainConfig(out_dir=str(out), corpus=parse_corpus_names(corpus), **train)
    return train_models(config, target_config, draft_config, on_step=on_step)


def distill_draft(
    out: str | Path,
    *,
    target: str = "smollm2-135m",
    draft_config: str = "s-draft",
    loss: str = "kl",
    corpus: str = "prompts",
    on_step: Callable[[int, list[float]], None] | None = None,
    **train: Any,
) -> DistillResult:
    """Train a draft from scratch for a target by distillation (`backend.zoo`)."""
    from dsd.backend.corpus import parse_corpus_names
    from dsd.backend.zoo import TrainConfig
    from dsd.backend.zoo import distill_draft as distill

    config = TrainConfig(out_dir=str(out), corpus=parse_corpus_names(corpus), **train)
    return distill(config, target, draft_config, loss, on_step=on_step)  # type: ignore[arg-type]
