"""Re-score a committed real-hardware report's cells with another simulator setting.

The measured side of a report (cells.csv: measured and replayed mean TPOT per cell) took an
hour of a quiet machine; the simulated side takes seconds. This re-runs only the simulated side
of every cell, from the report's own profile and config, with the acceptance models asked for,
and prints each one's error against the same measurements:

    python -m dsd.reports.rescore reports/validation/2026-11-25-cpu-smollm2 \
        --acceptance-model heterogeneous --acceptance-model empirical

A profile made before prompt keys were recorded gets them from the acceptance workload its
metadata names (dataset, num_prompts, seed), when every one of those prompts left a sample.
This module writes nothing; the report's files stay what was measured.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any, cast

from dsd.common.errors import InputError
from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.config import ACCEPTANCE_MODEL_KINDS, AcceptanceKind


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


def rescore(folder: Path, models: list[AcceptanceKind]) -> list[str]:
    """One summary line per acceptance model (and per cell under it)."""
    from dsd.backend.pair import load_pair
    from dsd.backend.real import resolve_real
    from dsd.backend.threads import set_threads
    from dsd.backend.validate import simulated_run
    from dsd.sim.config import RunConfig
    from dsd.traces.registry import WorkloadOptions

    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    rows = list(csv.DictReader((folder / "cells.csv").open()))
    profile, how = keyed_profile(load_profile(folder / "profile.json"))
    set_threads(1)  # the simulator's work does not depend on it; loading the pair is quicker
    pair = load_pair(str(config["target"]), str(config["draft"]), device="cpu")
    plan = config.get("plan", {})
    lines = [f"{folder}: {len(rows)} cells; prompt keys {how}"]
    for model in models:
        errors, acceptance_errors = [], []
        for row in rows:
            concurrency = int(row["max_concurrency"])
            workload = WorkloadOptions(
                num_prompts=int(plan.get("prompts_per_concurrency", 1)) * concurrency,
                max_concurrency=concurrency,
                output_len=config.get("output_len"),
                seed=int(config["seed"]),
            )
            cell = RunConfig(
                **workload.arguments(),
                dataset=str(config["dataset"]),
                profile=str(folder / "profile.json"),
                policy=row["policy"],
                max_num_seqs=concurrency,
                k_max=max(plan.get("k_values", [0])),
                acceptance_model=model,
            )
            resolved = dataclasses.replace(resolve_real(cell, pair), profile=profile)
            simulated = float(simulated_run(resolved).metrics["mean_tpot_ms"])
            measured = float(row["measured_mean_tpot_ms"])
            replayed = float(row["replayed_mean_tpot_ms"])
            errors.append((simulated - measured) / measured * 100.0)
            acceptance_errors.append((simulated - replayed) / replayed * 100.0)
            lines.append(
                f"  {model} {row['policy']} C={concurrency}: simulated {simulated:.1f} ms, "
                f"measured {measured:.1f}, error {errors[-1]:+.1f}%"
            )
        absolute = [abs(e) for e in errors]
        part = [abs(e) for e in acceptance_errors]
        lines.append(
            f"{model}: |mean-TPOT error| median {statistics.median(absolute):.1f}%, max "
            f"{max(absolute):.1f}%; acceptance part median {statistics.median(part):.1f}%, "
            f"max {max(part):.1f}%"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a dsd hardware-report folder")
    parser.add_argument(
        "--acceptance-model", action="append", choices=ACCEPTANCE_MODEL_KINDS, required=True
    )
    args = parser.parse_args(argv)
    for name in ("config.json", "cells.csv", "profile.json"):
        if not (args.folder / name).is_file():
            print(
                f"error: {args.folder}: no {name} (not a hardware-report folder)", file=sys.stderr
            )
            return 2
    try:
        for line in rescore(args.folder, cast(list[AcceptanceKind], args.acceptance_model)):
            print(line, flush=True)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
