"""The validation pipeline: `run_cells` (every (policy, C) cell on the simulator and the real
pair, with the record of how they ran), `validate` (those cells into a report folder),
`hardware_report` (load, `profile_stage`, `speedup_stage`, cells, report) and
`validate_vllm` (the simulator against a `vllm bench serve` result). Flags and defaults are the
CLI's and the API's; the cells are `validation.cells`, the writers `validation.report` and
`validation.hardware`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsd.common import invocation
from dsd.common.errors import InputError, require_int, require_unique
from dsd.common.progress import ProgressFactory, no_progress
from dsd.common.user_paths import check_output_folder
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile, save_profile
from dsd.policies.spec import policy_sources
from dsd.sim.interval import VALIDATION_INTERVAL_RUNS
from dsd.sim.run_fields import run_config
from dsd.traces.datasets import PROMPT_SET_NAMES
from dsd.validation.plan import (
    HARDWARE_PLANS,
    REPORT_WRITE_RESERVE_S,
    RETIMED_PROFILE_NAME,
    HardwarePlan,
    validation_cell_config,
)
from dsd.validation.record import CellRecord, ValidationRecord

if TYPE_CHECKING:
    from dsd.backend.pair import ModelPair
    from dsd.validation.cells import CellResult
    from dsd.validation.speedup import Arm, SpeedupResult

DEFAULT_VALIDATE_POLICIES: tuple[str, ...] = ("static:0", "static:3", "goodput")
DEFAULT_VALIDATE_CONCURRENCY: tuple[int, ...] = (1, 4)
# `hardware_report`'s stages: all in one call, or the profile and then the cells (two calls)
HARDWARE_STAGES: tuple[str, ...] = ("all", "profile", "cells")


def with_drawn_acceptance(profile_path: Path, acceptance_profile: str) -> None:
    """The profile at `profile_path` rewritten with `acceptance_profile`'s acceptance
    (`Profile.with_acceptance_of`): what the cells draw from under drawn acceptance."""
    source = load_profile(acceptance_profile)
    try:
        combined = load_profile(profile_path).with_acceptance_of(
            source, Path(acceptance_profile).name
        )
    except ValueError as exc:
        raise InputError(f"acceptance profile {acceptance_profile}: {exc}") from None
    save_profile(combined, profile_path)


def b1_plain_decode_ms(profile_path: Path) -> float | None:
    """The profile's plain decode step at B = 1 (K = 0; the shortest context's), ms: the figure
    beside vLLM's (PR #32374: 6.3 ms on an H100); None where it has no such point."""
    points = [
        point
        for point in load_profile(profile_path).latency
        if point.batch_size == 1 and point.num_spec_tokens == 0
    ]
    if not points:
        return None
    return min(points, key=lambda point: point.context_len or 0).expected_ms


def validate(
    pair: ModelPair,
    *,
    profile: str,
    out: str | Path,
    policies: Sequence[str] = DEFAULT_VALIDATE_POLICIES,
    max_concurrency: Sequence[int] = DEFAULT_VALIDATE_CONCURRENCY,
    num_prompts_per_concurrency: int = 20,
    trials: int = 3,
    fast_path: str = "off",
    allow_noisy_profile: bool = False,
    retime: bool = True,
    held_out_prompts: bool = True,
    progress: ProgressFactory = no_progress,
    **fields: Any,
) -> list[CellResult]:
    """Every (policy, C) cell on the simulator fitted from `profile` and on the real pair, with
    num_prompts = per_concurrency x C and max_num_seqs = C (unless given); a report folder in
    `out`. `fields` are run fields shared by every cell (dataset, output_len, seed, ...).
    Each cell's real side runs `trials` times (rounds in which the cells of one C run
    interleaved, `validation_cells`). `retime`: the profile's points are timed again around
    every group of real runs and the simulated
    side is priced by them (`validation.retime.TimingRounds`; `profile_retimed.json` in `out`).
    A profile that fails the timing checks (`policies.profile_quality`) is refused before
    anything runs, unless `allow_noisy_profile` (then its problems go into the report).
    `held_out_prompts`: the cells take none of the prompts the profile recorded acceptance for
    (a prediction; False: the profile's own prompts, a check of timing alone). Each cell's
    simulated side states a 90% interval over `interval_runs` (a run field, default
    `VALIDATION_INTERVAL_RUNS`) re-draws of its acceptance."""
    from dsd.validation.report import write_validation_report

    check_output_folder(out, "out")  # before the real runs, not after them
    cells, record, retimed = run_cells(
        pair,
        profile=profile,
        policies=policies,
        max_concurrency=max_concurrency,
        num_prompts_per_concurrency=num_prompts_per_concurrency,
        trials=trials,
        fast_path=fast_path,
        allow_noisy_profile=allow_noisy_profile,
        retime=retime,
        held_out_prompts=held_out_prompts,
        progress=progress,
        **fields,
    )
    write_validation_report(out, cells, record.to_json())
    if retimed is not None:
        save_profile(retimed, Path(out) / RETIMED_PROFILE_NAME)
    return cells


def run_cells(
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
    held_out_prompts: bool = True,
    prompts_per_cell: int | None = None,
    drawn_acceptance: bool = False,
    interleave: bool = True,
    **fields: Any,
) -> tuple[list[CellResult], ValidationRecord, Profile | None]:
    """The cells of `validate`, the record of how they ran (the report's config.json) and the
    re-timed profile their simulated side was priced by (None: not re-timed).
    `drawn_acceptance`: the real runs accept counts drawn from the cells' acceptance model
    (`backend.executor`; tokens meaningless); `interleave`: see `validation_cells`."""
    fields.setdefault("interval_runs", VALIDATION_INTERVAL_RUNS)
    from dsd.backend.environment import environment_metadata, machine_differences
    from dsd.backend.fast_path import check_fast_path
    from dsd.backend.real import resolve_real
    from dsd.policies.profile_quality import check_profile, problems_line
    from dsd.validation.cells import validation_cells
    from dsd.validation.retime import TimingRounds

    require_unique("policies", list(policies))
    require_unique("max_concurrency", list(max_concurrency))
    check_fast_path(fast_path, str(pair.device))
    loaded_profile = load_profile(profile)
    elsewhere = machine_differences(
        loaded_profile.metadata, environment_metadata(pair.device, pair.dtype)
    )
    if elsewhere and not retime:
        raise InputError(
            f"profile {profile}: taken on another machine ({'; '.join(elsewhere)}); its step "
            "times price nothing here unless re-timed: drop --no-retime, or profile here"
        )
    problems = check_profile(loaded_profile)
    if problems and not allow_noisy_profile:
        raise InputError(
            f"profile {profile}: its timing fails the checks ({problems_line(problems)}); "
            "profile again on a quiet machine, or --allow-noisy-profile"
        )
    if num_prompts_per_concurrency < 1:
        raise InputError(
            f"num_prompts_per_concurrency: must be >= 1, got {num_prompts_per_concurrency}"
        )
    configs = [
        validation_cell_config(
            profile,
            spec,
            concurrency,
            num_prompts_per_concurrency,
            held_out_prompts=held_out_prompts,
            prompts_per_cell=prompts_per_cell,
            **fields,
        )
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
            drawn_acceptance=drawn_acceptance,
            interleave=interleave,
        )
    retimed = None if timing is None else timing.profile()
    if timing is not None:
        timing.free()
    first = configs[0]
    record = ValidationRecord(
        command=invocation.command_line(),
        profile=profile,
        target=pair.target_spec,
        draft=pair.draft_spec,
        policies=tuple(policies),
        max_concurrency=tuple(max_concurrency),
        dataset=first.dataset,
        num_prompts_per_concurrency=num_prompts_per_concurrency,
        trials=trials,
        trials_done=len(cells[0].measured_trials),
        output_len=first.output_len,
        seed=first.seed,
        scheduling=first.scheduling,
        latency_model=first.latency_model,
        acceptance_model=first.acceptance_model,
        host_overhead_ms=first.host_overhead_ms,
        host_overhead_source=resolved[0].host_overhead_source,
        fast_path=fast_path,
        prefill_forward=resolved[0].prefill_forward,
        ignore_eos=True,
        profile_problems=tuple(str(problem) for problem in problems),
        goodput_acceptance="sequences",
        online_acceptance="sequences",
        per_request_acceptance="sequences",
        retime=(
            {"status": retime_note}
            if timing is None
            else {"status": retime_note, **timing.counts(), "profile": RETIMED_PROFILE_NAME}
        ),
        environment=environment_metadata(pair.device, pair.dtype),
        cells=tuple(
            CellRecord(
                policy=r.config.policy,
                max_concurrency=r.workload.max_concurrency,
                num_prompts=len(r.workload.requests),
                k_max=r.k_max,
                max_num_seqs=r.max_num_seqs,
                max_model_len=r.max_model_len,
                num_kv_blocks=r.num_kv_blocks,
                latency_model=r.latency_kind,
                host_overhead_source=r.host_overhead_source,
            )
            for r in resolved
        ),
    )
    # a user's policy: its file, class and the file's sha256, by the SPEC the cells ran
    record = record.with_extra(
        held_out_prompts=held_out_prompts,
        shuffle=first.shuffle,  # with held_out_prompts: which prompts the cells took
        interval_runs=first.interval_runs,
        **(
            {"acceptance": f"drawn ({first.acceptance_model}; tokens meaningless)"}
            if drawn_acceptance
            else {}
        ),
        **({} if interleave else {"interleaved": False}),
        **policy_sources(r.config.policy for r in resolved),
    )
    return cells, record, retimed


def resolved_plan(
    plan: str,
    quick: bool,
    trials: int | None,
    prompts_per_concurrency: int | None,
    speedup_arms: Sequence[str] | None,
) -> HardwarePlan:
    """The hardware report's plan by name (its quick form where `quick`) with the command's
    overrides (`hardware_report`'s arguments of the same names) put in."""
    if plan not in HARDWARE_PLANS:
        raise InputError(f"plan {plan}: choose {', '.join(HARDWARE_PLANS)}")
    chosen = HARDWARE_PLANS[plan][1 if quick else 0]
    if trials is not None:
        if trials < 1:
            raise InputError(f"trials {trials}: must be at least 1")
        chosen = dataclasses.replace(chosen, trials=trials)
    if prompts_per_concurrency is not None:
        require_int(prompts_per_concurrency, "prompts_per_concurrency", 1)
        chosen = dataclasses.replace(
            chosen, prompts_per_concurrency=prompts_per_concurrency, prompts_per_cell=None
        )
    if speedup_arms is not None:
        chosen = dataclasses.replace(chosen, speedup_extra_arms=tuple(speedup_arms))
    return chosen


def profile_stage(
    pair: ModelPair,
    chosen: HardwarePlan,
    profile_path: Path,
    dataset: str,
    *,
    seed: int,
    fast_path: str,
    progress: ProgressFactory,
) -> None:
    """The hardware report's profile of `pair` into `profile_path`: the plan's grid timed, its
    acceptance run on `dataset`'s first prompts."""
    from dsd.backend.profiling import profile_to_file

    profile_to_file(
        pair,
        out=profile_path,
        batch_sizes=chosen.batch_sizes,
        k=sorted({0, 1, *chosen.k_values}),
        context_lens=chosen.context_lens,
        prefill_tokens=chosen.prefill_tokens,
        dataset=dataset,
        num_prompts=chosen.acceptance_prompts,
        output_len=chosen.output_len,
        warmup=chosen.profile_warmup,
        iters=chosen.profile_iters,
        allow_noisy=chosen.allow_noisy_profile,
        adaptive_target_pct=chosen.adaptive_target_pct,
        adaptive_budget_s=chosen.adaptive_budget_s,
        # the cells run every request to its length (vllm bench --ignore-eos); so do the
        # acceptance prompts, whose draft sequences the cells' simulated side replays
        ignore_eos=True,
        seed=seed,
        fast_path=fast_path,
        progress=progress,
    )


def speedup_stage(
    pair: ModelPair,
    chosen: HardwarePlan,
    arms: Sequence[Arm],
    profile_path: Path,
    dataset: str,
    *,
    seed: int,
    fast_path: str,
    progress: ProgressFactory,
) -> SpeedupResult:
    """The hardware report's B = 1 arms, each `chosen.speedup_repeats` times in rotated order
    (`validation.speedup.measure_arms`) on the plan's speedup prompts of `dataset`."""
    from dsd.validation.speedup import measure_arms

    config = run_config(
        policy="static:0",
        profile=str(profile_path),
        dataset=dataset,
        num_prompts=chosen.speedup_prompts,
        max_concurrency=1,
        output_len=chosen.output_len,
        seed=seed,
    )
    with progress(len(arms) * chosen.speedup_repeats, "speedup at B=1") as advance:
        return measure_arms(
            pair,
            arms,
            config,
            repeats=chosen.speedup_repeats,
            fast_path=fast_path,
            on_run=lambda repeat, arm, record: advance(f"{arm.label} repeat {repeat + 1}"),
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
    dataset: str | None = None,
    profile_dataset: str | None = None,
    quick: bool = False,
    trials: int | None = None,
    time_budget_s: float | None = None,
    speedup_arms: Sequence[str] | None = None,
    seed: int = 0,
    plan: str = "full",
    stage: str = "all",
    prompts_per_concurrency: int | None = None,
    progress: ProgressFactory = no_progress,
    on_stage: Callable[[str], None] | None = None,
) -> list[Path]:
    """The real-hardware report (docs/validation.md): load the pair, profile it, time the
    speedup arms at B = 1, run every (policy, C) cell on the real engine (trials) and the
    simulator, and write `validation.hardware`'s folder into `out`. `quick`: a small plan that
    runs in about a minute (a dry run of the pipeline, not a measurement). `trials`: real runs
    per cell instead of the plan's (a shorter run where time is short, e.g. a lent GPU); the
    plan recorded in config.json says which. `time_budget_s`: seconds the whole report may
    take (a lent GPU's call): the validation starts no trial round that would end past it, less
    `REPORT_WRITE_RESERVE_S` (at least one round runs; config.json's `trials_done` says how
    many did). `speedup_arms`: B = 1 arms beside the report's draft, 'DRAFT POLICY [K_MAX]'
    (None: the plan's `speedup_extra_arms`). On CPU `threads` defaults to 1 (a shared
    machine's cores are not all ours).
    `dtype` and `fast_path` (the decode path: off, eager, cuda-graphs) hold for the profile, the
    speedup arms and the cells alike. `plan`: a name of `HARDWARE_PLANS` (full; production: PR
    #32374's experiment at production shapes with drawn acceptance, docs/validation.md);
    `dataset`: None for the plan's (instructcoder unless it names one). `profile_dataset`: the
    prompt set of the profile's acceptance run (None: `dataset`); another set than the cells'
    is a transfer report (docs/validation.md, "Transfer"). `stage`: all; profile
    (load and profile into `out`, then stop: one device call); cells (the rest, on the
    profile.json an earlier `profile` stage left in `out`). `prompts_per_concurrency`: N x C
    requests a cell instead of the plan's (a device call shorter or longer than it assumes)."""
    import datetime as dt
    import time

    from dsd.backend.environment import environment_metadata
    from dsd.common.machine import load_average
    from dsd.validation.hardware import write_hardware_report
    from dsd.validation.speedup import Arm

    if stage not in HARDWARE_STAGES:
        raise InputError(f"stage {stage}: choose {', '.join(HARDWARE_STAGES)}")
    plan_name = plan
    chosen = resolved_plan(plan, quick, trials, prompts_per_concurrency, speedup_arms)
    dataset = dataset or chosen.dataset or "instructcoder"
    if time_budget_s is not None and not time_budget_s > 0:
        raise InputError(f"time_budget_s {time_budget_s}: must be > 0 seconds")
    deadline_s = (
        None if time_budget_s is None else time.monotonic() + time_budget_s - REPORT_WRITE_RESERVE_S
    )
    say = on_stage or (lambda text: None)
    folder = check_output_folder(out, "out")
    if stage == "cells":  # before anything loads
        if not (folder / "profile.json").is_file():
            raise InputError(f"out {folder}: no profile.json (run --stage profile first)")
        profiled = load_profile(folder / "profile.json").metadata.get("target")
        if profiled != target:
            raise InputError(f"out {folder}: its profile.json is of {profiled}, not {target}")
    from dsd.backend.fast_path import check_fast_path
    from dsd.backend.pair import check_draft_spec, load_pair
    from dsd.backend.threads import MAX_THREADS, set_threads

    require_int(threads, "threads", 1, MAX_THREADS, optional=True)

    check_draft_spec(draft)  # a bad spelling fails before anything loads
    for field, name in (("dataset", dataset), ("profile_dataset", profile_dataset)):
        # held-out cells leave out the profile's prompts, which only a named prompt set has
        if name is not None and name not in PROMPT_SET_NAMES:
            raise InputError(
                f"{field}: {name!r} is not a prompt set; known: {', '.join(PROMPT_SET_NAMES)}"
            )
    extra_arms = [Arm.parse(text) for text in chosen.speedup_extra_arms]
    for arm in extra_arms:
        if arm.draft == "none":
            raise InputError("speedup_arms none: plain decoding is always the first arm")
        check_draft_spec(arm.draft)
    check_fast_path(fast_path, device)  # load_pair checks the device and dtype
    if draft.strip() in ("", "none"):
        raise InputError("draft: the hardware report needs a draft (e.g. ngram:2-6)")
    started = dt.datetime.now(dt.UTC)
    loads = [load_average()]
    say(f"loading {target} + {draft} on {device}")
    set_threads(threads, device)
    pair = load_pair(target, draft, device=device, dtype=dtype, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    profile_path = folder / "profile.json"
    k_max = max(chosen.k_values)
    if stage == "cells":
        say(f"profile: {profile_path}, from the profile stage")
    else:
        say(f"profiling into {profile_path}")
        profile_stage(
            pair,
            chosen,
            profile_path,
            dataset if profile_dataset is None else profile_dataset,
            seed=seed,
            fast_path=fast_path,
            progress=progress,
        )
        if chosen.acceptance_profile is not None:
            say(f"acceptance: {chosen.acceptance_profile}'s rates, drawn (tokens meaningless)")
            with_drawn_acceptance(profile_path, chosen.acceptance_profile)
        if stage == "profile":
            return [profile_path]
    loads.append(load_average())
    speedup = None
    if chosen.speedup_repeats > 0:
        say("timing the B = 1 speedup arms")
        arms = [
            Arm("none", "static:0", 0),
            *(Arm(draft, f"static:{k}", k) for k in chosen.speedup_k),
            Arm(draft, "goodput", k_max),
            *extra_arms,
        ]
        speedup = speedup_stage(
            pair, chosen, arms, profile_path, dataset, seed=seed, fast_path=fast_path,
            progress=progress,
        )  # fmt: skip
    loads.append(load_average())
    say("validating: every (policy, C) cell, real and simulated")
    static_k = chosen.k_values if chosen.static_k is None else chosen.static_k
    policies = [*(f"static:{k}" for k in static_k), *chosen.dynamic_policies]
    drawn = chosen.acceptance_profile is not None
    cells, record, retimed = run_cells(
        pair,
        profile=str(profile_path),
        policies=policies,
        max_concurrency=chosen.concurrency,
        num_prompts_per_concurrency=chosen.prompts_per_concurrency,
        prompts_per_cell=chosen.prompts_per_cell,
        trials=chosen.trials,
        fast_path=fast_path,
        allow_noisy_profile=chosen.allow_noisy_profile,
        retime=True,
        retime_share=chosen.retime_share,
        progress=progress,
        dataset=dataset,
        output_len=chosen.output_len,
        k_max=k_max,
        seed=seed,
        deadline_s=deadline_s,
        # Prompts the profile never ran (held out): each is given a recorded request's draft
        # outcomes (sim.models.acceptance.EmpiricalAcceptance), drawn anew in every re-run of the
        # prediction interval; the replay of each run's own drafts is the timing check. Under
        # drawn acceptance the real runs draw what the simulator draws: no prompt is recorded.
        acceptance_model=chosen.acceptance_model,
        held_out_prompts=not drawn,
        shuffle=True,
        drawn_acceptance=drawn,
        interleave=chosen.interleave,
    )
    loads.append(load_average())
    environment = environment_metadata(pair.device, pair.dtype)
    record = record.with_extra(
        **{
            "command": invocation.command_line(),
            "device": device,
            "device_name": environment["device"],
            **({"matmul": environment["matmul"]} if "matmul" in environment else {}),
            "quick": quick,
            "plan_name": plan_name,
            "plan": dataclasses.asdict(chosen),
            **({"b1_plain_decode_ms": b1_plain_decode_ms(profile_path)} if drawn else {}),
            "time_budget_s": time_budget_s,
            "started": started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "load_during": {"min": min(loads), "max": max(loads), "samples": loads},
            "speedup_prompts": chosen.speedup_prompts,
            "speedup_repeats": chosen.speedup_repeats,
            # only in a transfer report, so other reports keep the keys they always had
            **(
                {"profile_dataset": profile_dataset}
                if profile_dataset not in (None, dataset)
                else {}
            ),
        }
    )
    say(f"writing {folder}")
    written = [profile_path]
    if retimed is not None:
        save_profile(retimed, folder / RETIMED_PROFILE_NAME)
        written.append(folder / RETIMED_PROFILE_NAME)
    return [
        *written,
        *write_hardware_report(folder, config=record.to_json(), speedup=speedup, cells=cells),
    ]


def validate_vllm(
    measured: str | Path,
    *,
    profile: str,
    policy: str,
    out: str | Path | None = None,
    **fields: Any,
) -> CellResult:
    """The simulator on a `vllm bench serve --save-result` file's workload vs its metrics,
    with every latency model's mean-TPOT error on it (`CellResult.latency_model_errors_pct`:
    each model scored against a measured engine under load, not only at held-out knots)."""
    import math

    from dsd.sim.models.latency_choice import KINDS
    from dsd.sim.resolve import resolve
    from dsd.validation.cells import validate_against_vllm
    from dsd.validation.report import write_validation_report
    from dsd.validation.vllm_result import load_vllm_result

    seed = int(fields.get("seed", 0))
    fields.setdefault("interval_runs", VALIDATION_INTERVAL_RUNS)
    result = load_vllm_result(measured, seed=seed)
    # The file's workload replaces the dataset's: a one-request placeholder keeps resolve cheap.
    config = run_config(profile=profile, policy=policy, dataset="random", num_prompts=1, **fields)
    cell = validate_against_vllm(result, config)
    errors: dict[str, float] = {}
    for kind in KINDS:  # table, parametric
        try:
            scored = validate_against_vllm(
                result, dataclasses.replace(config, latency_model=kind, interval_runs=0)
            )
        except InputError:  # the table does not cover the run's K: no score for it
            continue
        errors[kind] = scored.error_pct("mean_tpot_ms")
    cell = dataclasses.replace(cell, latency_model_errors_pct=errors)
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
                "latency_model": resolve(config, workload=result.workload).latency_kind,
                "latency_model_errors_pct_mean_tpot_ms": errors,
                "vllm_run": result.info,
            },
            title=f"Validation: simulator vs {Path(result.source).name}",
        )
    return cell
