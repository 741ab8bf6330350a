"""`dsd simulate` and `dsd sweep`: the simulator from the command line.

Wiring and formatting only: flags become a `sim.runner.SimulationConfig` (flag names mirror
`vllm bench serve` where it has them; the workload flags are the ones of dsd.options, shared
with `dsd traces` and `dsd run`), runs go through `sim.runner.run_simulation`, outputs through
`reports.run_outputs` and `reports.sweep`.

`--speculative-config` (a vLLM JSON object, inline or a file) becomes a `table:` SPEC (or
`static:K` when it has no range table) with k_max = its `num_speculative_tokens`.

Every input is loaded and checked (profile, policy, workload, flags) before anything runs, and
output folders are written only after the runs succeed, so a bad input prints one
`error: ...` line, exits 2 and leaves no folder behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from dsd.cli import invocation
from dsd.cli.flags import (
    Burstiness,
    DatasetName,
    DatasetPath,
    EndS,
    Fraction,
    MaxConcurrency,
    MaxOutputLen,
    MaxPromptLen,
    NumPrompts,
    NumRows,
    OutputLen,
    RandomInputLen,
    RandomOutputLen,
    RandomRangeRatio,
    RawPrompt,
    RequestRate,
    RolloutAlpha,
    RolloutDist,
    RolloutMax,
    RolloutMedian,
    RolloutMin,
    RolloutPromptLen,
    RolloutPromptSet,
    RolloutSigma,
    Shuffle,
    StartS,
    TimeScale,
    WorkloadFlags,
    dataset_source,
)
from dsd.common.errors import InputError
from dsd.common.user_files import read_user_text

Profile = Annotated[
    str, typer.Option(help="Profile JSON (ours or vLLM PR #32374's dynamic_speculative_config).")
]
Scheduling = Annotated[str, typer.Option(help="sync or async (vLLM async scheduling).")]
MaxNumSeqs = Annotated[int | None, typer.Option(help="Running-set cap (default 256).")]
MaxNumBatchedTokens = Annotated[int, typer.Option(help="Token budget per step.")]
MaxModelLen = Annotated[
    int | None, typer.Option(help="Longest context (default: longest request + k_max + 1).")
]
NumKvBlocks = Annotated[
    int | None, typer.Option(help="KV pool in 16-token blocks (default: no preemption).")
]
NumSpecTokens = Annotated[
    int | None, typer.Option(help="k_max, num_speculative_tokens (default: the profile's).")
]
LatencyModel = Annotated[str, typer.Option(help="auto, table or parametric.")]
AcceptanceModel = Annotated[str, typer.Option(help="heterogeneous, per-position or replay.")]
HostOverhead = Annotated[
    float | None,
    typer.Option(
        help="Extra host time per step, ms (default: the profile's measured model, if any)."
    ),
]
Jitter = Annotated[float, typer.Option(help="Lognormal step-latency noise sigma (0: none).")]
Seed = Annotated[int, typer.Option(help="Run seed (workload, acceptance, noise).")]


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InputError(f"{flag}: choose from {', '.join(choices)}; got {value!r}")
    return value


def _base_config(
    *,
    profile: str,
    policy: str,
    dataset: str,
    k_max: int | None,
    options: dict[str, Any],
) -> Any:
    """A SimulationConfig from flags (sim.runner validates every field)."""
    from dsd.sim.runner import ACCEPTANCE_MODEL_KINDS, LATENCY_MODEL_KINDS, SimulationConfig

    _choice("--scheduling", options["scheduling"], ("sync", "async"))
    _choice("--latency-model", options["latency_model"], LATENCY_MODEL_KINDS)
    _choice("--acceptance-model", options["acceptance_model"], ACCEPTANCE_MODEL_KINDS)
    return SimulationConfig(
        profile=profile,
        policy=policy,
        dataset=dataset,
        **WorkloadFlags.from_values(options).arguments(),
        scheduling=options["scheduling"],
        max_num_seqs=options["max_num_seqs"],
        max_num_batched_tokens=options["max_num_batched_tokens"],
        max_model_len=options["max_model_len"],
        num_kv_blocks=options["num_kv_blocks"],
        k_max=k_max,
        latency_model=options["latency_model"],
        acceptance_model=options["acceptance_model"],
        host_overhead_ms=options["host_overhead_ms"],
        jitter_sigma=options["latency_jitter"],
    )


def policy_from_spec_config(text: str) -> tuple[str, int]:
    """(policy SPEC, k_max) of a vLLM --speculative-config given inline or as a file path."""
    from dsd.backend.vllm import read_speculative_config
    from dsd.policies.range_table import TABLE_FIELD, validate_ranges

    if text.lstrip().startswith("{"):
        source = "--speculative-config"
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{source}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(config, dict):
            raise InputError(f"{source}: expected a JSON object")
    else:
        source = text
        config = read_speculative_config(text)
    k_max = config.get("num_speculative_tokens")
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise InputError(f"{source}: num_speculative_tokens must be an integer >= 0, got {k_max!r}")
    table = config.get(TABLE_FIELD)
    if table is None:
        return f"static:{k_max}", k_max
    # The full check (and K clamped to k_max) happens when the run parses the table: SPEC.
    checked = validate_ranges(table, f"{source}: {TABLE_FIELD}")
    return "table:" + json.dumps([list(entry) for entry in checked], separators=(",", ":")), k_max


# --------------------------------------------------------------------------------------------
# The readable summary (vLLM bench's layout)
# --------------------------------------------------------------------------------------------


def _line(label: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{label:<40} {value:<10.2f}"
    return f"{label:<40} {value!s:<10}"


def format_summary(result: dict[str, Any], latency_info: dict[str, Any]) -> str:
    """The `vllm bench serve` result block, a speculative-decoding block and the K histogram."""
    lines = ["{:=^50}".format(" Serving Benchmark Result ")]
    lines.append(_line("Successful requests:", result["completed"]))
    if result.get("max_concurrency") is not None:
        lines.append(_line("Maximum request concurrency:", result["max_concurrency"]))
    lines += [
        _line("Benchmark duration (s):", float(result["duration"])),
        _line("Total input tokens:", result["total_input_tokens"]),
        _line("Total generated tokens:", result["total_output_tokens"]),
        _line("Request throughput (req/s):", float(result["request_throughput"])),
        _line("Output token throughput (tok/s):", float(result["output_throughput"])),
        _line("Total Token throughput (tok/s):", float(result["total_token_throughput"])),
    ]
    sections = (
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    )
    for key, title, short in sections:
        lines.append(f"{title:-^50}")
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            lines.append(_line(f"{label} {short} (ms):", float(result[f"{stat}_{key}_ms"])))
    lines.append("{:-^50}".format("Speculative Decoding"))
    rate = result["spec_decode_acceptance_rate"]
    lines.append(_line("Acceptance rate (%):", float(rate) * 100.0))
    lines.append(_line("Acceptance length:", float(result["spec_decode_acceptance_length"])))
    lines.append(_line("Drafts:", result["spec_decode_num_drafts"]))
    lines.append(_line("Draft tokens:", result["spec_decode_draft_tokens"]))
    lines.append(_line("Accepted tokens:", result["spec_decode_accepted_tokens"]))
    per_position = result["spec_decode_per_position_acceptance_rates"]
    shown = ", ".join("-" if math.isnan(r) else f"{100 * r:.1f}" for r in per_position)
    lines.append(_line("Per-position acceptance (%):", shown or "-"))
    lines.append("{:-^50}".format("K histogram (decode rows)"))
    histogram = result["k_histogram"]
    total_rows = sum(histogram.values())
    for k in sorted(histogram):
        share = 100.0 * histogram[k] / total_rows if total_rows else 0.0
        lines.append(f"{f'K={k}:':<40} {histogram[k]:<10} ({share:.1f}%)")
    lines.append(_line("Steps:", result["num_steps"]))
    lines.append(_line("Preemptions:", result["num_preemptions"]))
    lines.append("=" * 50)
    latency_line = (
        f"latency model: {latency_info['kind']} (asked {latency_info['requested']}); "
        f"prefill cost: {latency_info['prefill_source']}"
    )
    if "fit_summary" in latency_info:
        latency_line += f"; {latency_info['fit_summary']}"
    lines.append(latency_line)
    lines.append(
        f"policy: {result['policy']}; k_max {result['k_max']}; acceptance model: "
        f"{result['acceptance_model']}; scheduling: {result['scheduling']}; seed {result['seed']}"
    )
    return "\n".join(lines)


def _discard_steps(steps: Any) -> None:
    """The step sink of a run whose step rows nobody reads (`dsd simulate` without --out)."""


def _command_line() -> str:
    return invocation.command_line()


def _int_list(flag: str, text: str) -> list[int]:
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise InputError(f"{flag}: expected comma-separated integers >= 1, got {text!r}")
        values.append(int(item))
    if len(set(values)) != len(values):
        raise InputError(f"{flag}: duplicate values in {text!r}")
    return values


def _policy_list(text: str) -> list[str]:
    """Comma-separated SPECs; commas inside [...] (inline tables) do not split."""
    specs: list[str] = []
    depth = 0
    current = ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            specs.append(current.strip())
            current = ""
        else:
            current += char
    specs.append(current.strip())
    if any(not spec for spec in specs):
        raise InputError(f"--policies: empty SPEC in {text!r}")
    if len(set(specs)) != len(specs):
        raise InputError(f"--policies: duplicate SPEC in {text!r}")
    return specs


def register(app: typer.Typer) -> None:
    """Add `simulate` and `sweep` to the app."""

    @app.command("simulate")
    def simulate(
        profile: Profile,
        policy: Annotated[
            str | None, typer.Option(help="K policy SPEC: static:K, table:..., goodput, online.")
        ] = None,
        speculative_config: Annotated[
            str | None,
            typer.Option(help="vLLM --speculative-config JSON (inline or file), instead of SPEC."),
        ] = None,
        max_concurrency: MaxConcurrency = None,
        num_prompts: NumPrompts = None,
        dataset_name: DatasetName = None,
        dataset_path: DatasetPath = None,
        request_rate: RequestRate = math.inf,
        burstiness: Burstiness = 1.0,
        output_len: OutputLen = None,
        raw_prompt: RawPrompt = False,
        shuffle: Shuffle = False,
        random_input_len: RandomInputLen = 1024,
        random_output_len: RandomOutputLen = 128,
        random_range_ratio: RandomRangeRatio = 0.0,
        time_scale: TimeScale = 1.0,
        start_s: StartS = 0.0,
        end_s: EndS = math.inf,
        fraction: Fraction = None,
        num_rows: NumRows = None,
        max_prompt_len: MaxPromptLen = None,
        max_output_len: MaxOutputLen = None,
        rollout_dist: RolloutDist = "lognormal",
        rollout_median: RolloutMedian = 1024.0,
        rollout_sigma: RolloutSigma = 1.0,
        rollout_alpha: RolloutAlpha = 1.5,
        rollout_min: RolloutMin = 256.0,
        rollout_max: RolloutMax = 16384,
        rollout_prompt_len: RolloutPromptLen = 512,
        rollout_prompt_set: RolloutPromptSet = None,
        scheduling: Scheduling = "sync",
        max_num_seqs: MaxNumSeqs = None,
        max_num_batched_tokens: MaxNumBatchedTokens = 8192,
        max_model_len: MaxModelLen = None,
        num_kv_blocks: NumKvBlocks = None,
        num_spec_tokens: NumSpecTokens = None,
        latency_model: LatencyModel = "auto",
        acceptance_model: AcceptanceModel = "heterogeneous",
        host_overhead_ms: HostOverhead = None,
        latency_jitter: Jitter = 0.0,
        seed: Seed = 0,
        json_output: Annotated[
            bool, typer.Option("--json", help="Print one JSON object (vLLM bench keys).")
        ] = False,
        out: Annotated[
            str | None,
            typer.Option(help="Write result.json, requests.csv, steps.parquet, config.json here."),
        ] = None,
    ) -> None:
        """Simulate one serving run (like `vllm bench serve`) from a profile and a K policy."""
        from dsd.reports.run_outputs import (
            bench_result,
            result_json_text,
            step_parquet_sink,
            write_run_outputs,
        )
        from dsd.sim.engine import EngineConfig
        from dsd.sim.runner import (
            build_engine,
            latency_description,
            learned_profile,
            resolve,
            resolved_config_dict,
        )

        options = dict(locals())
        if (policy is None) == (speculative_config is None):
            raise InputError("give exactly one of --policy and --speculative-config")
        k_max = num_spec_tokens
        if speculative_config is not None:
            policy, config_k_max = policy_from_spec_config(speculative_config)
            if num_spec_tokens is not None and num_spec_tokens != config_k_max:
                raise InputError(
                    f"--num-spec-tokens {num_spec_tokens} conflicts with the speculative "
                    f"config's num_speculative_tokens {config_k_max}"
                )
            k_max = config_k_max
        assert policy is not None
        if out is not None and Path(out).exists() and not Path(out).is_dir():
            raise InputError(f"--out {out}: exists and is not a folder")
        config = _base_config(
            profile=profile,
            policy=policy,
            dataset=dataset_source(dataset_name, dataset_path),
            k_max=k_max,
            options=options,
        )
        resolved = resolve(config)
        # Step rows stream to steps.parquet (or nowhere) as the run goes: flat memory.
        with contextlib.ExitStack() as stack:
            sink = None if out is None else stack.enter_context(step_parquet_sink(out))
            engine_config = EngineConfig(step_sink=_discard_steps if sink is None else sink)
            engine = build_engine(resolved, engine_config)
            run = engine.run()
            result = bench_result(run, resolved)
            learned = learned_profile(engine.policy) if out is not None else None
            if out is not None:
                config_dict = resolved_config_dict(config, resolved)
                config_dict["command_line"] = _command_line()
                config_dict["speculative_config"] = speculative_config
                write_run_outputs(
                    out, run, resolved, result, config_dict, streamed_steps=sink, learned=learned
                )
        if json_output:
            typer.echo(result_json_text(result))
        else:
            typer.echo(format_summary(result, latency_description(resolved)))
            if out is not None:
                extra = ", learned_profile.json" if learned is not None else ""
                typer.echo(
                    f"wrote {out}/ (result.json, requests.csv, steps.parquet, config.json{extra})"
                )

    @app.command("sweep")
    def sweep(
        out: Annotated[
            str, typer.Option(help="Folder: cells/, grid.resolved.json, sweep.csv/.md, PNG.")
        ],
        grid: Annotated[
            str | None,
            typer.Option(help="TOML grid file (docs/sweeps.md) instead of the grid flags."),
        ] = None,
        profile: Annotated[
            str | None, typer.Option(help="Profile JSON (flag grid; a grid file names its own).")
        ] = None,
        policies: Annotated[
            str, typer.Option(help="Comma-separated policy SPECs.")
        ] = "static:0,static:3,goodput",
        max_concurrency: Annotated[
            str, typer.Option(help="Comma-separated concurrencies C (closed loop).")
        ] = "1,4,16,64",
        num_prompts_per_concurrency: Annotated[
            int | None, typer.Option(help="num_prompts = this x C (default 20).")
        ] = None,
        num_prompts: Annotated[
            int | None, typer.Option(help="A fixed num_prompts for every cell instead.")
        ] = None,
        dataset_name: DatasetName = None,
        dataset_path: DatasetPath = None,
        request_rate: RequestRate = math.inf,
        burstiness: Burstiness = 1.0,
        output_len: OutputLen = None,
        raw_prompt: RawPrompt = False,
        shuffle: Shuffle = False,
        random_input_len: RandomInputLen = 1024,
        random_output_len: RandomOutputLen = 128,
        random_range_ratio: RandomRangeRatio = 0.0,
        time_scale: TimeScale = 1.0,
        start_s: StartS = 0.0,
        end_s: EndS = math.inf,
        fraction: Fraction = None,
        num_rows: NumRows = None,
        max_prompt_len: MaxPromptLen = None,
        max_output_len: MaxOutputLen = None,
        rollout_dist: RolloutDist = "lognormal",
        rollout_median: RolloutMedian = 1024.0,
        rollout_sigma: RolloutSigma = 1.0,
        rollout_alpha: RolloutAlpha = 1.5,
        rollout_min: RolloutMin = 256.0,
        rollout_max: RolloutMax = 16384,
        rollout_prompt_len: RolloutPromptLen = 512,
        rollout_prompt_set: RolloutPromptSet = None,
        scheduling: Scheduling = "sync",
        max_num_seqs: MaxNumSeqs = None,
        max_num_batched_tokens: MaxNumBatchedTokens = 8192,
        max_model_len: MaxModelLen = None,
        num_kv_blocks: NumKvBlocks = None,
        num_spec_tokens: NumSpecTokens = None,
        latency_model: LatencyModel = "auto",
        acceptance_model: AcceptanceModel = "heterogeneous",
        host_overhead_ms: HostOverhead = None,
        latency_jitter: Jitter = 0.0,
        workers: Annotated[
            int | None, typer.Option(help="Processes / Ray CPUs (default: CPU cores).")
        ] = None,
        ray: Annotated[
            bool, typer.Option("--ray", help="Run cells as Ray tasks (a local Ray by default).")
        ] = False,
        ray_address: Annotated[
            str | None,
            typer.Option(help="With --ray: the cluster to join (ray.init(address=...))."),
        ] = None,
        seed: Seed = 0,
    ) -> None:
        """Run a grid of simulations (a TOML grid, or policies x concurrencies from flags).

        Each finished cell is saved in OUT/cells/; re-running the same command skips them.
        """
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from dsd.reports.sweep import (
            RESOLVED_GRID_FILE,
            WorkerDied,
            default_workers,
            identify,
            run_sweep_to_dir,
            write_sweep_outputs,
        )
        from dsd.sim.runner import resolve, resolved_config_dict

        options = dict(locals())
        if workers is not None and workers < 1:
            raise InputError(f"--workers: must be >= 1, got {workers}")
        if Path(out).exists() and not Path(out).is_dir():
            raise InputError(f"--out {out}: exists and is not a folder")
        if grid is not None:
            cells, grid_record, title = _grid_cells(grid, options)
        else:
            cells, grid_record, title = _flag_cells(options)
        cells = identify(cells)
        # Check every cell here (profile, policy, workload) so a bad input fails before the pool.
        for cell in cells:
            resolve(cell.config)
        num_workers = workers or default_workers()
        use_ray = ray
        if ray_address is not None and not ray:
            raise InputError("--ray-address needs --ray")
        started_s = time.perf_counter()
        resolved_grid = {
            "command_line": _command_line(),
            **grid_record,
            "cell_seed_rule": (
                "closed loop: SeedSequence([seed, C]).generate_state(1)[0]; finite rate r: "
                "SeedSequence([seed, C or 0, 1, round(1000 r)]); shared by policies"
            ),
            "cell_id_rule": "sha256(spec_json)[:16]",
            "cells": [
                {
                    "cell_id": c.cell_id,
                    "index": c.index,
                    "policy": c.policy,
                    "max_concurrency": c.max_concurrency,
                    "labels": dict(c.labels),
                    "sweep_seed": c.sweep_seed,
                    "seed": c.config.seed,
                }
                for c in cells
            ],
            "base": resolved_config_dict(cells[0].config),
        }
        from dsd.common.atomic import atomic_write_text
        from dsd.reports.run_outputs import result_json_text

        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(out) / RESOLVED_GRID_FILE, result_json_text(resolved_grid) + "\n")
        runner = f"ray {ray_address or 'local'}" if use_ray else f"{num_workers} workers"
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        ) as progress:
            task = progress.add_task(f"sweep ({runner})", total=len(cells))
            try:
                run = run_sweep_to_dir(
                    cells,
                    out,
                    num_workers,
                    use_ray=use_ray,
                    ray_address=ray_address,
                    on_done=lambda _cell: progress.advance(task),
                )
            except WorkerDied as exc:
                typer.echo(
                    f"error: {exc}; finished cells are saved in {out}/cells; "
                    "run the same command again to resume",
                    err=True,
                )
                raise typer.Exit(1) from None
        elapsed_s = time.perf_counter() - started_s
        frame = write_sweep_outputs(out, run.rows, resolved_grid, title=title)
        shown = frame[["policy", "max_concurrency", "mean_tpot_ms", "output_throughput"]]
        typer.echo(shown.to_string(index=False))
        typer.echo(
            f"{len(cells)} cells ({run.num_computed} run, {run.num_reused} reused) in "
            f"{elapsed_s:.1f} s; wrote {out}/"
        )

    def _grid_cells(
        grid_file: str, options: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any], str]:
        """Cells of a TOML grid; grid flags given alongside it are an InputError."""
        import inspect

        from dsd.reports.grid import expand_grid, load_grid

        allowed = {"out", "grid", "workers", "ray", "ray_address", "seed"}
        for name, parameter in inspect.signature(sweep).parameters.items():
            if name in allowed:
                continue
            value = options[name]
            default = parameter.default
            same = value == default or (
                isinstance(value, float)
                and isinstance(default, float)
                and math.isnan(value)
                and math.isnan(default)
            )
            if not same:
                flag = "--" + name.replace("_", "-")
                raise InputError(
                    f"--grid: {flag} cannot be combined with a grid file (put it in the grid)"
                )
        if options["seed"] != 0:
            raise InputError(
                "--grid: --seed cannot be combined with a grid file (use seeds = [...])"
            )
        parsed = load_grid(grid_file)
        raw = read_user_text(grid_file)  # as load_grid read it (BOM dropped)
        record = {"grid_file": str(Path(grid_file).resolve()), "grid_toml": raw}
        title = f"{Path(grid_file).name}"
        return expand_grid(parsed), record, title

    def _flag_cells(options: dict[str, Any]) -> tuple[list[Any], dict[str, Any], str]:
        """Cells of the flag grid: policies x concurrencies (closed loop)."""
        from dsd.reports.sweep import sweep_cells

        profile = options["profile"]
        if profile is None:
            raise InputError("give --profile (or --grid FILE)")
        num_prompts = options["num_prompts"]
        num_prompts_per_concurrency = options["num_prompts_per_concurrency"]
        if num_prompts is not None and num_prompts_per_concurrency is not None:
            raise InputError("give one of --num-prompts and --num-prompts-per-concurrency")
        if num_prompts_per_concurrency is not None and num_prompts_per_concurrency < 1:
            raise InputError(
                f"--num-prompts-per-concurrency: must be >= 1, got {num_prompts_per_concurrency}"
            )
        policy_specs = _policy_list(options["policies"])
        concurrencies = _int_list("--max-concurrency", options["max_concurrency"])
        base_options = dict(options)
        base_options.pop("num_prompts")
        base_options.pop("max_concurrency")
        base = _base_config(
            profile=profile,
            policy=policy_specs[0],
            dataset=dataset_source(options["dataset_name"], options["dataset_path"]),
            k_max=options["num_spec_tokens"],
            options=base_options,
        )
        per_concurrency = None if num_prompts is not None else (num_prompts_per_concurrency or 20)
        cells = sweep_cells(
            base,
            policy_specs,
            concurrencies,
            num_prompts_per_concurrency=per_concurrency,
            num_prompts=num_prompts,
            seed=options["seed"],
        )
        record = {
            "policies": policy_specs,
            "max_concurrency": concurrencies,
            "num_prompts_per_concurrency": per_concurrency,
            "num_prompts": num_prompts,
            "seed": options["seed"],
        }
        return cells, record, Path(profile).name
