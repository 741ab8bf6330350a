"""Re-score a committed real-hardware report's cells with another simulator setting.

Re-runs only the simulated side of every cell (seconds, against the hour the measured side took),
from the report's own profile and config (priced by its `profile_retimed.json` when the report
re-timed), with the acceptance and latency models asked for, and prints each one's mean-TPOT and
mean-TTFT error against the same measurements; `--policy SPEC` adds a policy's simulated gap to
the best static K (docs/validation.md). For example:

    python -m dsd.validation.rescore results/validation/2026-11-25-cpu-smollm2 \
        --acceptance-model heterogeneous --acceptance-model empirical

It writes nothing; the report's files stay what was measured.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np

from dsd.common.errors import InputError
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.config import ACCEPTANCE_MODEL_KINDS, AcceptanceKind
from dsd.sim.models.latency import LatencyModelKind
from dsd.validation.record import ValidationRecord


def keyed_profile(profile: Profile) -> tuple[Profile, str]:
    """The profile with prompt keys, and how they were found."""
    if profile.draft_outcome_keys or not profile.draft_outcomes:
        return profile, "as recorded" if profile.draft_outcome_keys else "none"
    from dsd.traces.registry import build_workload

    meta = profile.metadata
    if not {"dataset", "num_prompts", "seed"} <= set(meta):
        return profile, "none (the metadata does not name the acceptance workload)"
    workload = build_workload(
        str(meta["dataset"]), num_prompts=int(meta["num_prompts"]), seed=int(meta["seed"])
    )
    if len(workload.requests) != len(profile.draft_outcomes):
        return profile, "none (some acceptance prompts left no sample)"
    keys = tuple(request.prompt_key or "" for request in workload.requests)
    return dataclasses.replace(profile, draft_outcome_keys=keys), "from the profile's workload"


def cells_prompts(config: ValidationRecord) -> dict[str, bool]:
    """How the report's cells took their prompts (`held_out_prompts`, `shuffle`), so the
    simulated side re-runs on the same prompts. Reports before `shuffle` was recorded: a hardware
    report shuffled its prompts once they were held out, `dsd validate` when told to."""
    held_out = bool(config.extra.get("held_out_prompts", False))
    command = config.command.split()
    shuffled = (held_out and "hardware-report" in command) or "--shuffle" in command
    return {"held_out_prompts": held_out, "shuffle": bool(config.extra.get("shuffle", shuffled))}


def committed_level_lines(rows: list[dict[str, str]], trials: list[dict[str, str]]) -> list[str]:
    """The Level line of a report's simulated side as it wrote it: cells.csv `rows`, trials.csv
    `trials` (nothing without trials)."""
    from dsd.validation.cells import CellResult
    from dsd.validation.report import as_number, level_lines

    tpot = "mean_tpot_ms"
    cells = [
        CellResult(
            row["policy"],
            int(row["max_concurrency"]),
            measured={tpot: as_number(row[f"measured_{tpot}"])},
            simulated={tpot: as_number(row[f"simulated_{tpot}"])},
        )
        for row in rows
    ]
    return [f"as committed: {line}" for line in level_lines(cells, trials) if line]


def rescore(
    folder: Path,
    models: list[AcceptanceKind],
    latency_model: LatencyModelKind = "auto",
    policies: tuple[str, ...] = (),
    prompts_per_concurrency: int | None = None,
) -> list[str]:
    """One summary line per acceptance model (and per cell under it). The simulated side is
    priced as the report priced it: by `profile_retimed.json` when the report re-timed.
    `policies`: also simulate these SPECs and every static K = 0..k_max on each concurrency's
    workload (`prompts_per_concurrency` x C prompts where given), and print each one's gap to
    the best static K (simulated only) in mean TPOT and in the TPOT outside prefill steps."""
    from dsd.backend.pair import load_pair
    from dsd.backend.real import resolve_real
    from dsd.backend.threads import set_threads
    from dsd.policies.spec import parse_policy
    from dsd.sim.config import RunConfig
    from dsd.sim.resolve import with_latency_from
    from dsd.traces.registry import WorkloadOptions
    from dsd.validation.cells import CellResult, simulated_run
    from dsd.validation.record import CellRecord
    from dsd.validation.report import as_number, level_lines, tpot_error_summary

    config = ValidationRecord.from_json(
        json.loads((folder / "config.json").read_text()), str(folder / "config.json")
    )
    rows = list(csv.DictReader((folder / "cells.csv").open()))
    trials_path = folder / "trials.csv"
    trials = list(csv.DictReader(trials_path.open())) if trials_path.is_file() else []
    profile, how = keyed_profile(load_profile(folder / "profile.json"))
    retimed_path = folder / "profile_retimed.json"
    retimed = load_profile(retimed_path) if retimed_path.is_file() else None
    first = config.cells[0]
    for spec in policies:  # a bad SPEC is refused before any simulation runs
        parse_policy(spec, profile=profile, k_max=first.k_max, max_num_seqs=first.max_num_seqs)
    set_threads(1)  # the simulator's work does not depend on it; loading the pair is quicker
    pair = load_pair(config.target, config.draft, device="cpu")
    # Simulate each policy as it ran (older reports' plain SPECs scored the per-position rates)
    as_run = {name: config.acceptance_as_run(name) for name in ("goodput", "online", "per-request")}
    taken = cells_prompts(config)
    lines = [
        f"{folder}: {len(rows)} cells; prompt keys {how}; "
        + ("held-out prompts" if taken["held_out_prompts"] else "the profile's prompts")
        + (", shuffled" if taken["shuffle"] else "")
        + f"; latency {latency_model} from "
        + ("profile_retimed.json" if retimed is not None else "profile.json")
        + f"; as run: {', '.join(as_run.values())}"
    ]
    lines += committed_level_lines(rows, trials)
    tpot, ttft = "mean_tpot_ms", "mean_ttft_ms"

    def simulate(
        policy: str, recorded: CellRecord, model: AcceptanceKind, num_prompts: int | None = None
    ) -> dict[str, Any]:
        """A cell's simulated metrics with `policy` on the cell's workload (`num_prompts` of
        the report's prompt set where given) and limits."""
        workload = WorkloadOptions(
            num_prompts=num_prompts or recorded.num_prompts,
            max_concurrency=recorded.max_concurrency,
            output_len=config.output_len,
            seed=config.seed,
            shuffle=taken["shuffle"],
        )
        run = RunConfig(
            **workload.arguments(),
            held_out_prompts=taken["held_out_prompts"],
            dataset=config.dataset,
            profile=str(folder / "profile.json"),
            policy=policy,
            max_num_seqs=recorded.max_num_seqs,
            k_max=recorded.k_max,
            acceptance_model=model,
            latency_model=latency_model,
        )
        resolved = dataclasses.replace(
            resolve_real(run, pair, config.fast_path),
            profile=profile,
            prefill_forward=config.prefill_forward,
        )
        if retimed is not None:
            resolved = with_latency_from(resolved, retimed)
        return simulated_run(resolved).metrics

    in_prefill_steps = "mean_tpot_in_prefill_steps_ms"
    for model in models:
        cells = []
        for row in rows:
            concurrency = int(row["max_concurrency"])
            recorded = config.cell(row["policy"], concurrency)
            policy = as_run.get(row["policy"], row["policy"])
            simulated = simulate(policy, recorded, model)
            cell = CellResult(
                row["policy"],
                concurrency,
                # an empty field (or "nan", as older reports wrote it): missing
                measured={key: as_number(row[f"measured_{key}"]) for key in (tpot, ttft)},
                simulated={key: simulated[key] for key in (tpot, ttft)},
                replayed={tpot: as_number(row[f"replayed_{tpot}"])},
            )
            cells.append(cell)
            lines.append(
                f"  {model} {cell.policy} C={concurrency}: simulated {cell.simulated[tpot]:.1f} "
                f"ms, measured {cell.measured[tpot]:.1f}, error {cell.error_pct(tpot):+.1f}%; "
                f"mean TTFT error {cell.error_pct(ttft):+.1f}%"
            )
        summary = tpot_error_summary(cells)
        ttft_errors = np.abs([cell.error_pct(ttft) for cell in cells])
        lines.append(
            f"{model}: |mean-TPOT error| median {summary['median_abs_tpot_error_pct']:.1f}%, "
            f"max {summary['max_abs_tpot_error_pct']:.1f}%; acceptance part median "
            f"{summary['median_abs_acceptance_error_pct']:.1f}%, "
            f"max {summary['max_abs_acceptance_error_pct']:.1f}%; |mean-TTFT error| median "
            f"{np.median(ttft_errors):.1f}%, max {np.max(ttft_errors):.1f}%"
        )
        lines += [f"  {line}" for line in level_lines(cells, trials) if line]
        concurrencies = sorted({int(row["max_concurrency"]) for row in rows})
        for concurrency in concurrencies if policies else []:
            recorded = next(c for c in config.cells if c.max_concurrency == concurrency)
            num_prompts = (
                None if prompts_per_concurrency is None else prompts_per_concurrency * concurrency
            )
            static = [f"static:{k}" for k in range(recorded.k_max + 1)]
            metrics = {
                spec: simulate(spec, recorded, model, num_prompts) for spec in (*static, *policies)
            }
            prompts = f", {num_prompts} prompts" if num_prompts else ""
            decode_steps = {spec: m[tpot] - m[in_prefill_steps] for spec, m in metrics.items()}
            for what, tpots in (
                ("", {spec: m[tpot] for spec, m in metrics.items()}),
                ("outside prefill steps: ", decode_steps),
            ):
                best = min(static, key=tpots.__getitem__)
                gaps = ", ".join(
                    f"{spec} {100 * (tpots[spec] / tpots[best] - 1):+.1f}%" for spec in policies
                )
                lines.append(
                    f"{model} C={concurrency}: {what}best static {best} {tpots[best]:.1f} ms "
                    f"(simulated{prompts}); gap to it: {gaps}"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a dsd hardware-report folder")
    parser.add_argument(
        "--acceptance-model", action="append", choices=ACCEPTANCE_MODEL_KINDS, required=True
    )
    parser.add_argument("--latency-model", choices=("auto", "table", "parametric"), default="auto")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help="also simulate this SPEC and static K = 0..k_max per C; print its gap (repeatable)",
    )
    parser.add_argument(
        "--prompts-per-concurrency",
        type=int,
        metavar="N",
        help="with --policy: simulate the gaps on N x C prompts of the report's prompt set",
    )
    args = parser.parse_args(argv)
    if args.prompts_per_concurrency is not None and (
        not args.policy or args.prompts_per_concurrency < 1
    ):
        print("error: --prompts-per-concurrency needs --policy and N >= 1", file=sys.stderr)
        return 2
    for name in ("config.json", "cells.csv", "profile.json"):
        if not (args.folder / name).is_file():
            print(
                f"error: {args.folder}: no {name} (not a hardware-report folder)", file=sys.stderr
            )
            return 2
    try:
        for line in rescore(
            args.folder,
            cast(list[AcceptanceKind], args.acceptance_model),
            cast(LatencyModelKind, args.latency_model),
            tuple(args.policy),
            args.prompts_per_concurrency,
        ):
            print(line, flush=True)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (KeyError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        print(
            f"error: {args.folder}: its files are not as dsd hardware-report writes them "
            f"({type(error).__name__}: {error})",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
