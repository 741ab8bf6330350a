"""`dsd profile` and `dsd validate`: wiring of the profiler, the validation runs and the report.

- `dsd profile`: builds the pair (same model specs as `dsd run`), tokenizes the dataset's prompts
  (or synthesizes ids for random weights), runs `backend.profiler.profile_pair` under a progress
  bar and writes the native profile (or PR #32374's file with `--format dsd-json`).
- `dsd validate --profile P --target T --draft D --policies ... --max-concurrency ...`: every
  (policy, C) cell on the real backend and on the simulator fitted from P; a report folder.
- `dsd validate --measured FILE.json --profile P --policy SPEC`: the simulator against a
  `vllm bench serve --save-result` file.

No logic of its own beyond wiring and formatting.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from dsd.cli import invocation
from dsd.common.errors import InputError

PROFILE_FORMATS = ("dsd-profile", "dsd-json")


def _int_list(text: str, flag: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise InputError(f"{flag}: every value must be an integer >= {minimum}, got {text!r}")
    return values


def _check_fast_path(fast_path: str, device: str) -> None:
    """--fast-path names a known kind that the device can run (checked before any model)."""
    from dsd.backend.fast_path import FAST_PATH_KINDS

    if fast_path not in FAST_PATH_KINDS:
        raise InputError(f"--fast-path: choose {', '.join(FAST_PATH_KINDS)}, got {fast_path!r}")
    if fast_path == "cuda-graphs" and not device.startswith("cuda"):
        raise InputError(f"--fast-path cuda-graphs: needs --device cuda, got {device!r}")


def _command_line() -> str:
    return invocation.command_line()


def _load_pair(
    target: str, draft: str, device: str, dtype_name: str, seed: int
) -> tuple[Any, Any, str | None, Any]:
    """(target model, Draft or None, tokenizer name, torch dtype) as `dsd run` builds them."""
    import torch

    from dsd.backend.engine import Draft
    from dsd.backend.weights import check_pair
    from dsd.cli.run import _build_model, _dtype

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InputError(f"--device: choose cpu or cuda, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: CUDA is not available on this machine")
    dtype = _dtype(dtype_name, device)
    target_model, tokenizer_name = _build_model(target, device, dtype, seed)
    if draft.lower() == "none":
        return target_model, None, tokenizer_name, dtype
    if draft.startswith("early-exit:"):
        depth = draft.removeprefix("early-exit:")
        if not depth.isdigit() or not 1 <= int(depth) < target_model.config.num_layers:
            raise InputError(
                f"--draft {draft}: K must be an integer in [1, "
                f"{target_model.config.num_layers - 1}]"
            )
        return target_model, Draft.early_exit(target_model, int(depth)), tokenizer_name, dtype
    draft_model, draft_tokenizer = _build_model(draft, device, dtype, seed + 1)
    check_pair(target_model.config, draft_model.config, tokenizer_name, draft_tokenizer)
    return target_model, Draft(draft_model), tokenizer_name, dtype


def _tokenizer_fn(tokenizer_name: str | None) -> Callable[[str], list[int]] | None:
    if tokenizer_name is None:
        return None
    from dsd.backend.tokenizer import chat_prompt, load_tokenizer

    tokenizer = load_tokenizer(tokenizer_name)

    def tokenize(text: str) -> list[int]:
        return list(tokenizer.encode(chat_prompt(text)))

    return tokenize


def _real_workload(workload: Any, tokenize: Callable[[str], list[int]] | None) -> Any:
    """Prompt lengths re-measured with the model's tokenizer, or text dropped (random weights)."""
    if tokenize is None:
        requests = tuple(dataclasses.replace(r, prompt=None) for r in workload.requests)
    else:
        requests = tuple(
            dataclasses.replace(r, prompt_len=len(tokenize(r.prompt))) if r.prompt else r
            for r in workload.requests
        )
    return dataclasses.replace(workload, requests=requests)


def _progress(total: int, label: str) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        transient=True,
    )
    return progress


def run_profile(
    *,
    target: str,
    draft: str,
    batch_sizes: str,
    k: str,
    context_lens: str,
    prefill_tokens: str,
    dataset_name: str,
    num_prompts: int | None,
    output_len: int | None,
    warmup: int,
    iters: int,
    device: str,
    dtype_name: str,
    temperature: float,
    seed: int,
    fast_path: str,
    out: str,
    file_format: str,
    show_progress: bool = True,
    host_overhead_output_len: int = 32,
) -> Any:
    """Measure and write a profile; returns the Profile."""
    from dsd.backend.profiler import ProfileConfig, profile_pair, synthetic_ids
    from dsd.policies.profile_io import save_pr32374, save_profile
    from dsd.traces.registry import build_workload

    if file_format not in PROFILE_FORMATS:
        raise InputError(f"--format: choose {' or '.join(PROFILE_FORMATS)}, got {file_format!r}")
    _check_fast_path(fast_path, device)
    target_model, draft_obj, tokenizer_name, _dtype = _load_pair(
        target, draft, device, dtype_name, seed
    )
    if draft_obj is None:
        raise InputError("--draft: profiling needs a draft (a model spec or early-exit:K)")
    eos = () if tokenizer_name is None else tuple(target_model.config.eos_token_ids)
    config = ProfileConfig(
        batch_sizes=_int_list(batch_sizes, "--batch-sizes", 1),
        spec_tokens=_int_list(k, "--k", 0),
        context_lens=_int_list(context_lens, "--context-lens", 1),
        prefill_token_counts=_int_list(prefill_tokens, "--prefill-tokens", 1),
        num_warmup=warmup,
        num_iters=iters,
        host_overhead_output_len=host_overhead_output_len,
        acceptance_output_len=output_len,
        temperature=temperature,
        seed=seed,
        fast_path=fast_path,
        eos_token_ids=eos,
    )
    workload = build_workload(
        dataset_name, num_prompts=num_prompts, seed=seed, output_len=output_len
    )
    tokenize = _tokenizer_fn(tokenizer_name)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
    specials = set(target_model.config.eos_token_ids) | (
        {target_model.config.bos_token_id} - {None}
    )
    prompts = []
    for request in workload.requests:
        if tokenize is not None and request.prompt:
            prompts.append(np.asarray(tokenize(request.prompt), dtype=np.int64))
        else:
            prompts.append(
                synthetic_ids(
                    rng, request.prompt_len, target_model.config.vocab_size, sorted(specials)
                )
            )
    output_lens = [max(2, r.output_len) for r in workload.requests]
    total = (
        len(config.batch_sizes) * len(config.spec_tokens) * len(config.context_lens)
        + len(config.prefill_token_counts)
        + len(prompts)
        + (2 * len(config.batch_sizes) if config.host_overhead_output_len > 0 else 0)
    )
    metadata = {
        "target": target,
        "draft": draft,
        "dataset": dataset_name,
        "num_prompts": len(prompts),
        "command": _command_line(),
        "temperature": temperature,
    }
    if show_progress:
        progress = _progress(total, "profiling")
        with progress:
            task = progress.add_task("", total=total)

            def advance(label: str) -> None:
                progress.update(task, advance=1, description=label)

            profile = profile_pair(
                target_model, draft_obj, config, prompts, output_lens, metadata, advance
            )
    else:
        profile = profile_pair(target_model, draft_obj, config, prompts, output_lens, metadata)
    if file_format == "dsd-json":
        save_pr32374(profile, out)
    else:
        save_profile(profile, out)
    return profile


def _versions_and_device(target_model: Any, dtype: Any) -> dict[str, Any]:
    from dsd.backend.profiler import environment_metadata

    param = next(target_model.parameters())
    return environment_metadata(param.device, dtype)


def run_validate_cells(
    *,
    profile: str,
    target: str,
    draft: str,
    policies: str,
    max_concurrency: str,
    dataset_name: str,
    num_prompts_per_concurrency: int,
    output_len: int | None,
    device: str,
    dtype_name: str,
    seed: int,
    scheduling: str,
    latency_model: str,
    acceptance_model: str,
    host_overhead_ms: float | None,
    fast_path: str,
    out: str,
    show_progress: bool = True,
) -> list[Any]:
    """Every (policy, C) cell on both sides; writes the report; returns the cells."""
    from dsd.backend.validate import compare_cell, workload_resolved
    from dsd.reports.validation import write_validation_report
    from dsd.sim.runner import SimulationConfig, resolve

    policy_specs = [p.strip() for p in policies.split(",") if p.strip()]
    # "static:0,static:3": split on commas, but a SPEC may itself hold commas after ':' keys
    # (online:warmup_steps=5,decay=0.9); rejoin pieces that are key=value continuations.
    merged: list[str] = []
    for piece in policy_specs:
        if merged and "=" in piece and ":" not in piece:
            merged[-1] += "," + piece
        else:
            merged.append(piece)
    if not merged:
        raise InputError("--policies: give at least one policy SPEC")
    concurrencies = _int_list(max_concurrency, "--max-concurrency", 1)
    _check_fast_path(fast_path, device)
    if num_prompts_per_concurrency < 1:
        raise InputError(
            f"--num-prompts-per-concurrency: must be >= 1, got {num_prompts_per_concurrency}"
        )
    target_model, draft_obj, tokenizer_name, dtype = _load_pair(
        target, draft, device, dtype_name, seed
    )
    tokenize = _tokenizer_fn(tokenizer_name)
    cells = []
    plan = [(spec, c) for c in concurrencies for spec in merged]
    configs = []
    for spec, concurrency in plan:
        config = SimulationConfig(
            profile=profile,
            policy=spec,
            dataset=dataset_name,
            num_prompts=num_prompts_per_concurrency * concurrency,
            max_concurrency=concurrency,
            output_len=output_len,
            scheduling=scheduling,  # type: ignore[arg-type]
            max_num_seqs=concurrency,
            latency_model=latency_model,  # type: ignore[arg-type]
            acceptance_model=acceptance_model,  # type: ignore[arg-type]
            host_overhead_ms=host_overhead_ms,
            seed=seed,
            # No draft: both sides run the target alone (K = 0), so a SPEC asking for K > 0 is
            # refused by the policy check instead of reaching the engine.
            k_max=0 if draft_obj is None else None,
        )
        base = resolve(config)
        resolved = workload_resolved(config, _real_workload(base.workload, tokenize))
        configs.append(resolved)

    def run_all(advance: Callable[[str], None] | None) -> None:
        for resolved in configs:
            cell = compare_cell(
                resolved, target_model, draft_obj, tokenize=tokenize, fast_path=fast_path
            )
            cells.append(cell)
            if advance is not None:
                advance(f"{cell.policy} C={cell.max_concurrency}")

    if show_progress:
        progress = _progress(len(configs), "validating")
        with progress:
            task = progress.add_task("", total=len(configs))
            run_all(lambda label: progress.update(task, advance=1, description=label))
    else:
        run_all(None)
    report_config = {
        "command": _command_line(),
        "profile": profile,
        "target": target,
        "draft": draft,
        "policies": merged,
        "max_concurrency": list(concurrencies),
        "dataset": dataset_name,
        "num_prompts_per_concurrency": num_prompts_per_concurrency,
        "output_len": output_len,
        "seed": seed,
        "scheduling": scheduling,
        "latency_model": latency_model,
        "acceptance_model": acceptance_model,
        "host_overhead_ms": host_overhead_ms,
        "host_overhead_source": configs[0].host_overhead_source,
        "fast_path": fast_path,
        "ignore_eos": True,
        **_versions_and_device(target_model, dtype),
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
            for r in configs
        ],
    }
    write_validation_report(out, cells, report_config)
    return cells


def run_validate_vllm(
    *,
    measured: str,
    profile: str,
    policy: str,
    seed: int,
    max_num_seqs: int | None,
    scheduling: str,
    latency_model: str,
    acceptance_model: str,
    host_overhead_ms: float | None,
    out: str | None,
) -> Any:
    """The simulator against a vLLM bench result file; writes a report when out is given."""
    from dsd.backend.validate import load_vllm_result, validate_against_vllm
    from dsd.reports.validation import write_validation_report
    from dsd.sim.runner import SimulationConfig

    result = load_vllm_result(measured, seed=seed)
    config = SimulationConfig(
        profile=profile,
        policy=policy,
        dataset="random",  # placeholder: the file's workload replaces it
        num_prompts=1,
        max_num_seqs=max_num_seqs,
        scheduling=scheduling,  # type: ignore[arg-type]
        latency_model=latency_model,  # type: ignore[arg-type]
        acceptance_model=acceptance_model,  # type: ignore[arg-type]
        host_overhead_ms=host_overhead_ms,
        seed=seed,
    )
    cell = validate_against_vllm(result, config)
    if out is not None:
        write_validation_report(
            out,
            [cell],
            {
                "command": _command_line(),
                "measured": measured,
                "profile": profile,
                "policy": policy,
                "seed": seed,
                "request_rate": "inf" if math.isinf(result.request_rate) else result.request_rate,
                "burstiness": result.burstiness,
                "host_overhead_ms": host_overhead_ms,
                "host_overhead_source": cell.host_overhead_source,
                "num_requests": len(result.workload.requests),
                "vllm_run": result.info,
            },
            title=f"Validation: simulator vs {Path(result.source).name}",
        )
    return cell


def _print_cells(cells: Sequence[Any]) -> None:
    sources = sorted({cell.host_overhead_source for cell in cells})
    typer.echo(f"simulator host overhead per step: {', '.join(sources)}")
    for cell in cells:
        typer.echo(
            f"{cell.policy:>16} C={cell.max_concurrency}: mean TPOT measured "
            f"{float(cell.measured.get('mean_tpot_ms', math.nan)):.3f} ms, simulated "
            f"{float(cell.simulated.get('mean_tpot_ms', math.nan)):.3f} ms, error "
            f"{cell.error_pct('mean_tpot_ms'):+.1f} %"
        )


def register(app: typer.Typer) -> None:
    """Add `profile` and `validate` to the app."""

    @app.command("profile")
    def profile_command(
        target: Annotated[str, typer.Option(help="Target model spec (as for dsd run).")],
        draft: Annotated[str, typer.Option(help="Draft model spec or early-exit:K.")],
        out: Annotated[str, typer.Option(help="Profile JSON to write (atomic).")],
        batch_sizes: Annotated[str, typer.Option(help="B values, e.g. 1,4,16,64.")] = "1,4,16",
        k: Annotated[str, typer.Option("--k", help="K values; include 0, 1, K_max.")] = "0,1,3,5",
        context_lens: Annotated[str, typer.Option(help="Context tokens per row.")] = "128",
        prefill_tokens: Annotated[
            str, typer.Option(help="Prompt sizes for prefill.")
        ] = "32,128,512",
        dataset_name: Annotated[str, typer.Option(help="Prompts for acceptance.")] = "mt-bench",
        num_prompts: Annotated[int | None, typer.Option(help="Prompts to run.")] = None,
        output_len: Annotated[int | None, typer.Option(help="Output tokens per prompt.")] = None,
        warmup: Annotated[int, typer.Option(help="Untimed steps per point.")] = 3,
        host_overhead_output_len: Annotated[
            int, typer.Option(help="Output tokens per request of the loop runs (0: skip).")
        ] = 32,
        iters: Annotated[int, typer.Option(help="Timed steps per point.")] = 10,
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
        temperature: Annotated[float, typer.Option(help="Acceptance temperature.")] = 0.0,
        seed: Annotated[int, typer.Option(help="Seed.")] = 0,
        fast_path: Annotated[str, typer.Option(help="off, eager, cuda-graphs.")] = "off",
        file_format: Annotated[
            str, typer.Option("--format", help="dsd-profile (native) or dsd-json (PR #32374).")
        ] = "dsd-profile",
    ) -> None:
        """Measure ITL(B, K, context), prefill and acceptance into a profile."""
        profile = run_profile(
            target=target,
            draft=draft,
            batch_sizes=batch_sizes,
            k=k,
            context_lens=context_lens,
            prefill_tokens=prefill_tokens,
            dataset_name=dataset_name,
            num_prompts=num_prompts,
            output_len=output_len,
            warmup=warmup,
            iters=iters,
            host_overhead_output_len=host_overhead_output_len,
            device=device,
            dtype_name=dtype,
            temperature=temperature,
            seed=seed,
            fast_path=fast_path,
            out=out,
            file_format=file_format,
        )
        rates = ", ".join(f"{r:.3f}" for r in profile.acceptance_rates)
        typer.echo(
            f"wrote {out}: {len(profile.latency)} latency points, {len(profile.prefill)} prefill "
            f"points, acceptance rates [{rates}]"
        )
        host = profile.host_overhead
        if host is not None:
            typer.echo(
                f"host overhead per step: {host.plain.intercept_ms:.3f} + "
                f"{host.plain.per_row_ms:.4f} x B ms (K = 0), {host.spec.intercept_ms:.3f} + "
                f"{host.spec.per_row_ms:.4f} x B ms (K > 0); residual {host.residual_ms:.3f} ms "
                f"over {host.num_steps} loop steps"
                + ("" if file_format == "dsd-profile" else " (not kept by --format dsd-json)")
            )

    @app.command("validate")
    def validate_command(
        profile: Annotated[str, typer.Option(help="Profile the simulator is fitted from.")],
        target: Annotated[str | None, typer.Option(help="Target model spec.")] = None,
        draft: Annotated[str, typer.Option(help="Draft spec, early-exit:K or none.")] = "none",
        policies: Annotated[str, typer.Option(help="Policy SPECs, comma-separated.")] = (
            "static:0,static:3,goodput"
        ),
        max_concurrency: Annotated[str, typer.Option(help="C values, e.g. 1,4,16.")] = "1,4",
        dataset_name: Annotated[str, typer.Option(help="Workload name or file.")] = "mt-bench",
        num_prompts_per_concurrency: Annotated[int, typer.Option(help="Prompts per C.")] = 20,
        output_len: Annotated[int | None, typer.Option(help="max_tokens per request.")] = None,
        measured: Annotated[
            str | None, typer.Option(help="A `vllm bench serve --save-result` JSON.")
        ] = None,
        policy: Annotated[str | None, typer.Option(help="Policy SPEC (with --measured).")] = None,
        max_num_seqs: Annotated[int | None, typer.Option(help="With --measured.")] = None,
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
        seed: Annotated[int, typer.Option(help="Run seed (both sides).")] = 0,
        scheduling: Annotated[str, typer.Option(help="sync or async.")] = "sync",
        latency_model: Annotated[str, typer.Option(help="auto, table, parametric.")] = "auto",
        acceptance_model: Annotated[
            str, typer.Option(help="heterogeneous, per-position, replay.")
        ] = "heterogeneous",
        host_overhead_ms: Annotated[
            float | None,
            typer.Option(help="Sim host ms per step (default: the profile's measured model)."),
        ] = None,
        fast_path: Annotated[str, typer.Option(help="off, eager, cuda-graphs.")] = "off",
        out: Annotated[str | None, typer.Option(help="Report folder.")] = None,
    ) -> None:
        """Simulated vs measured per (policy, C), or the simulator vs a vLLM bench result."""
        if scheduling not in ("sync", "async"):
            raise InputError(f"--scheduling: choose sync or async, got {scheduling!r}")
        if measured is not None:
            if policy is None:
                raise InputError("--measured: give the run's --policy SPEC")
            cell = run_validate_vllm(
                measured=measured,
                profile=profile,
                policy=policy,
                seed=seed,
                max_num_seqs=max_num_seqs,
                scheduling=scheduling,
                latency_model=latency_model,
                acceptance_model=acceptance_model,
                host_overhead_ms=host_overhead_ms,
                out=out,
            )
            _print_cells([cell])
            return
        if target is None:
            raise InputError("--target: needed to run the real backend (or pass --measured)")
        if out is None:
            raise InputError("--out: give the report folder")
        cells = run_validate_cells(
            profile=profile,
            target=target,
            draft=draft,
            policies=policies,
            max_concurrency=max_concurrency,
            dataset_name=dataset_name,
            num_prompts_per_concurrency=num_prompts_per_concurrency,
            output_len=output_len,
            device=device,
            dtype_name=dtype,
            seed=seed,
            scheduling=scheduling,
            latency_model=latency_model,
            acceptance_model=acceptance_model,
            host_overhead_ms=host_overhead_ms,
            fast_path=fast_path,
            out=out,
        )
        _print_cells(cells)
        typer.echo(f"wrote {out}/report.md")
