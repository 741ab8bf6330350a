"""The Python API of dsd: every command's work as one call that returns plain results.

Each `dsd` command is a declaration of flags over one function here, and notebooks call the same
functions; results are dicts with vLLM bench keys, pandas frames and frozen dataclasses.

    import dsd
    out = dsd.simulate(profile="policies/profiles/pr32374_llama31_8b_eagle_h100.json",
                       policy="goodput", max_concurrency=16, num_prompts=160)
    out.metrics["mean_tpot_ms"], out.requests, out.steps

A run is described by flat keyword fields (`sim.run_fields`: `RunConfig`'s and the workload
knobs); `run_config(**fields)` builds the config they describe. Torch is imported only by the
functions that run real models. A thin surface: the work lives in the packages
(docs/architecture.md), and errors name fields (the CLI says the flags).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsd.common import invocation
from dsd.common.errors import InputError, require_int, require_unique
from dsd.common.progress import ProgressFactory, no_progress
from dsd.common.user_paths import check_output_folder
from dsd.policies.engine_configs import export_sglang as export_sglang
from dsd.policies.engine_configs import export_trtllm as export_trtllm
from dsd.policies.engine_configs import export_vllm as export_vllm
from dsd.policies.engine_configs import sglang_launch_note as sglang_launch_note  # for the CLI
from dsd.policies.plugin import policy_spec as _policy_spec
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile as _load_profile
from dsd.policies.profile_io import profile_to_pr32374
from dsd.policies.spec import parse_policy as _parse_policy
from dsd.policies.spec import split_policy_list as _split_policy_list
from dsd.policies.types import KPolicy

# The validation pipeline's entry points are part of the API as they are.
from dsd.reports.console import generation_text as generation_text
from dsd.reports.console import profile_text as profile_text
from dsd.reports.console import run_text as run_text
from dsd.reports.explain import PolicyExplanation as PolicyExplanation
from dsd.reports.explain import explain_policy as explain_policy
from dsd.reports.run_outputs import RunOutcome as RunOutcome
from dsd.reports.run_outputs import (
    StepParquetSink,
    bench_result,
    outputs_jsonl,
    simulator_settings,
    step_parquet_sink,
    write_run_outputs,
)
from dsd.sim.build import build_engine, fitted_executor, learned_profile
from dsd.sim.config import DEFAULT_MAX_NUM_SEQS, RunConfig
from dsd.sim.engine import Engine, LoopConfig
from dsd.sim.metrics import discard_steps
from dsd.sim.resolve import ResolvedRun, resolve, resolved_config_dict
from dsd.sim.run_fields import WORKLOAD_FIELDS
from dsd.sim.run_fields import run_config as run_config
from dsd.traces.registry import WorkloadOptions, build_workload
from dsd.traces.workload import Workload
from dsd.validation.pipeline import hardware_report as hardware_report
from dsd.validation.pipeline import validate as validate
from dsd.validation.pipeline import validate_vllm as validate_vllm

if TYPE_CHECKING:
    from dsd.backend.generate import GenerationReport
    from dsd.backend.pair import ModelPair
    from dsd.backend.zoo import DistillResult, PairResult
    from dsd.reports.sweep import SweepOutcome as SweepOutcome
    from dsd.sim.policy_check import PolicyCheck

DEFAULT_SWEEP_POLICIES: tuple[str, ...] = ("static:0", "static:3", "goodput")
DEFAULT_SWEEP_CONCURRENCY: tuple[int, ...] = (1, 4, 16, 64)


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


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
        check_output_folder(out, "out")
    with contextlib.ExitStack() as stack:
        sink: StepParquetSink | None = None
        if out is not None:
            sink = stack.enter_context(step_parquet_sink(out))
        engine = engine_for(sink if sink is not None else (None if keep_steps else discard_steps))
        result = engine.run()
        metrics = bench_result(result, resolved, executor_settings, simulated=pair is None)
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
    `none`). `threads`: torch's CPU threads for the whole process (None: 1 on CPU, torch's
    default on CUDA: `backend.threads`)."""
    from dsd.backend.pair import load_pair as load
    from dsd.backend.threads import MAX_THREADS, set_threads

    require_int(threads, "threads", 1, MAX_THREADS, optional=True)
    set_threads(threads, device)

    if target is None:
        raise InputError(
            "target: give the target model (a named shape, smollm2-135m, a .gguf file or a "
            "checkpoint folder)"
        )
    return load(target, draft, device=device, dtype=dtype, seed=seed)


def policy_names() -> list[str]:
    """Every registered K policy's name (`policies.spec.POLICY_BUILDERS`), sorted."""
    from dsd.policies.spec import POLICY_BUILDERS

    return sorted(POLICY_BUILDERS)


def threads_text(threads: int | None, device: str = "cpu") -> str:
    """One line: the torch threads `load_pair(threads=threads, device=device)` runs with, and
    why (the given count, or the default)."""
    from dsd.backend.threads import threads_text as text

    return text(threads, device)


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
                f"grid: {flag} cannot be combined with a grid file (put it in the grid)"
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
                f"num_prompts_per_concurrency: must be >= 1, got {num_prompts_per_concurrency}"
            )
        specs = [
            _policy_spec(p) for p in (DEFAULT_SWEEP_POLICIES if policies is None else policies)
        ]
        concurrencies = list(
            DEFAULT_SWEEP_CONCURRENCY if max_concurrency is None else max_concurrency
        )
        require_unique("policies", specs)
        require_unique("max_concurrency", concurrencies)
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


def report(out: str | Path, *, k_trace_cell: str | None = None) -> Path:
    """The markdown report (and PNGs) of a sweep folder; returns the report's path."""
    from dsd.reports.report import build_report

    return build_report(out, k_trace_cell=k_trace_cell, command_line=invocation.command_line())


# --------------------------------------------------------------------------------------------
# Profiles, validation
# --------------------------------------------------------------------------------------------


def profile(pair: ModelPair, *, out: str | Path, **options: Any) -> Profile:
    """Measure a pair into a profile written to `out`; returns it. The options and their
    defaults are `backend.profiling.profile_to_file`'s."""
    from dsd.backend.profiling import profile_to_file

    return profile_to_file(pair, out=out, **options)


# --------------------------------------------------------------------------------------------
# Policies and vLLM formats
# --------------------------------------------------------------------------------------------


def load_profile(path: str | Path) -> Profile:
    """A profile file, native or PR #32374's (docs/formats.md); one-line errors on bad input."""
    return _load_profile(path)


def parse_policy(
    spec: str | object,
    *,
    profile: str | Path | Profile | None = None,
    k_max: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    seed: int | None = None,
) -> KPolicy:
    """The K policy a SPEC (or a user's KPolicy object or factory) names (docs/policies.md);
    k_max defaults to the profile's."""
    spec = _policy_spec(spec)
    loaded = _load_profile(profile) if isinstance(profile, str | Path) else profile
    if k_max is None:
        if loaded is None:
            raise InputError("k_max: give k_max or a profile")
        k_max = loaded.k_max
    return _parse_policy(spec, profile=loaded, k_max=k_max, max_num_seqs=max_num_seqs, seed=seed)


def check_policy(
    policy: str | object,
    *,
    profile: str | Path | None = None,
    examples: int = 100,
    steps: int = 40,
    cases: int = 100,
    seed: int = 0,
) -> PolicyCheck:
    """The scheduler-accounting property tests on a policy (`sim.policy_check`): the stateful
    machine for `examples` examples of up to `steps` calls, and `cases` workloads against
    vLLM's own scheduler where vLLM is installed."""
    from dsd.sim.policy_check import check_policy as check

    loaded = None if profile is None else _load_profile(profile)
    return check(
        _policy_spec(policy),
        profile=loaded,
        examples=examples,
        steps=steps,
        differential_cases=cases,
        seed=seed,
    )


def export_pr32374(profile: str | Path) -> dict[str, Any]:
    """A profile as vLLM PR #32374's dynamic_speculative_config.json object."""
    return profile_to_pr32374(_load_profile(profile))


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


def workload(source: str, **options: Any) -> Workload:
    """The requests of a workload name or file, shaped by the workload knobs of
    `WorkloadOptions` (num_prompts, request_rate, max_concurrency, random_*, rollout_*, ...)."""
    unknown = sorted(set(options) - WORKLOAD_FIELDS)
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

    return plot(workload, check_output_folder(out, "out"))


def write_workload_table(workload: Workload, out: str | Path) -> None:
    """A workload in our table schema (.csv or .parquet by the suffix), atomically."""
    from dsd.traces.export import write_workload_table as write

    write(workload, Path(out))


def write_vllm_custom_jsonl(workload: Workload, out: str | Path) -> str:
    """A workload as the JSONL `vllm bench serve --dataset-name custom` replays; returns what to
    tell the user (the file, the replay command, and what the format loses)."""
    from dsd.traces.export import replay_note, write_vllm_custom_jsonl

    write_vllm_custom_jsonl(workload, Path(out))
    return replay_note(workload, out)


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
    """Train a draft for a target by distillation (`backend.zoo`; eagle: `backend.eagle_train`)."""
    if draft_config == "eagle":
        from dsd.backend.eagle_train import train_eagle_to

        return train_eagle_to(out, target, on_step=on_step, **train)
    from dsd.backend.corpus import parse_corpus_names
    from dsd.backend.zoo import TrainConfig
    from dsd.backend.zoo import distill_draft as distill

    config = TrainConfig(out_dir=str(out), corpus=parse_corpus_names(corpus), **train)
    return distill(config, target, draft_config, loss, on_step=on_step)  # type: ignore[arg-type]
