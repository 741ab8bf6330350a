"""validation.rescore: prompt keys for a profile that predates them; refusing a non-report
folder."""

from __future__ import annotations

import dataclasses
import re

from dsd.policies.profile import LatencyPoint, Profile
from dsd.traces.registry import build_workload
from dsd.validation.rescore import keyed_profile, main


def _profile(num_outcomes: int, **metadata: object) -> Profile:
    row = ((1,), (0, 1))  # k_max 1: one step drafted 0, one drafted 1 and accepted it
    return Profile(
        k_max=1,
        latency=(LatencyPoint(1, 0, 1.0), LatencyPoint(1, 1, 1.5)),
        acceptance_rates=(0.5,),
        draft_outcomes=(row,) * num_outcomes,
        metadata=dict(metadata),
    )


def test_keys_come_from_the_workload_the_metadata_names() -> None:
    profile = _profile(3, dataset="instructcoder", num_prompts=3, seed=0)
    keyed, how = keyed_profile(profile)
    workload = build_workload("instructcoder", num_prompts=3, seed=0)
    assert how == "from the profile's workload"
    assert keyed.draft_outcome_keys == tuple(r.prompt_key for r in workload.requests)
    # recorded keys are kept; a sample count that differs from the prompts gives none
    assert keyed_profile(keyed) == (keyed, "as recorded")
    short = dataclasses.replace(profile, draft_outcomes=profile.draft_outcomes[:2])
    assert keyed_profile(short)[1] == "none (some acceptance prompts left no sample)"
    assert keyed_profile(_profile(3))[1].startswith("none (the metadata")


def test_a_folder_without_a_report_is_refused(tmp_path, capsys) -> None:
    assert main([str(tmp_path), "--acceptance-model", "empirical"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path}: no config.json (not a hardware-report folder)"
    )


def test_a_malformed_report_is_one_line_error(tmp_path, capsys) -> None:
    for name in ("config.json", "cells.csv", "profile.json"):
        (tmp_path / name).write_text("{not json")
    assert main([str(tmp_path), "--acceptance-model", "empirical"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not as dsd hardware-report writes them" in err


def test_the_committed_cpu_report_rescores_as_measured_and_prices_policies() -> None:
    """The CPU report's simulated side, re-run: its fidelity as committed (goodput cells
    simulated as they ran, with the per-position rates), and `--policy` gaps to the best
    static K of a K = 0..k_max sweep per concurrency."""
    from pathlib import Path

    from dsd.validation.rescore import rescore

    folder = Path(__file__).resolve().parents[2] / "results/validation/2026-11-25-cpu-smollm2"
    lines = rescore(folder, ["empirical"], policies=("goodput",))
    assert lines[0].endswith(
        "as run: goodput:acceptance=rates, online:acceptance=rates, per-request:acceptance=rates"
    )
    summary = next(line for line in lines if line.startswith("empirical: |mean-TPOT error|"))
    # 2.2% / 7.5% with the per-request policy that ran; its cells now simulate per-request's
    # per-depth posteriors (2026-11-28), which take other K than the run took
    assert "median 2.4%, max 7.7%" in summary
    cells = [line for line in lines if line.startswith("  empirical ")]
    assert len(cells) == 28  # 7 policies x 4 C, each with its TPOT and TTFT errors
    assert all(re.search(r"error [+-]\d+\.\d%; mean TTFT error [+-]\d+\.\d%$", c) for c in cells)
    gaps = [line for line in lines if line.startswith("empirical C=")]
    assert [line.split(":")[0] for line in gaps] == [
        f"empirical C={c}" for c in (1, 1, 2, 2, 4, 4, 8, 8)
    ]
    assert all("gap to it: goodput " in line for line in gaps)
    total, decode_steps = gaps[-2:]  # C=8: mean TPOT, then outside prefill steps
    assert "best static static:0" in total and total.endswith("goodput +0.0%")
    # K = 0 keeps the C = 8 requests in step (same output lengths), so their prompts run when
    # nothing decodes; outside prefill steps K = 1 beats it, and goodput (K = 0 at B = 8) not
    assert "outside prefill steps: best static static:1" in decode_steps
    assert not decode_steps.endswith("goodput +0.0%")


def test_prompts_per_concurrency_needs_a_policy(capsys) -> None:
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "results/validation/2026-11-25-cpu-smollm2"
    argv = [str(folder), "--acceptance-model", "empirical", "--prompts-per-concurrency", "4"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --prompts-per-concurrency needs --policy and N >= 1\n"


def test_a_bad_policy_spec_is_refused_before_any_simulation(capsys) -> None:
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "results/validation/2026-11-25-cpu-smollm2"
    argv = [str(folder), "--acceptance-model", "empirical", "--policy", "goodput:acceptance=x"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the first line of results
    assert captured.err == "error: goodput: acceptance must be sequences or rates, got 'x'\n"


def test_the_committed_level_reads_cells_and_trials() -> None:
    """2026-11-27c, the noisiest hour: cells up to 27% off, yet over its 84 trials the
    simulated side sat at the measured one's median."""
    import csv
    from pathlib import Path

    from dsd.validation.rescore import committed_level_lines

    folder = Path(__file__).resolve().parents[2] / "results/validation/2026-11-27c-cpu-smollm2"
    rows = list(csv.DictReader((folder / "cells.csv").open()))
    trials = list(csv.DictReader((folder / "trials.csv").open()))
    (line,) = committed_level_lines(rows, trials)
    assert line.startswith("as committed: Level: over all 84 trials")
    assert "median 1.003, p10-p90 0.84-1.27" in line
    assert committed_level_lines(rows, []) == []


def test_a_held_out_report_rescores_on_the_prompts_its_cells_ran() -> None:
    """A held-out report's cells took shuffled prompts the profile never ran: the re-run takes
    the same ones (it once took the first prompts of the set, mostly the profile's own, and
    scored another workload). The figures are the 2026-11-29b cells with each held-out prompt
    replaying its recorded request's draft sequence (docs/models.md 2.2b); as committed, with
    the step-sampled histogram, they were median 3.5%, max 10.6%."""
    from pathlib import Path

    from dsd.validation.rescore import rescore

    folder = Path(__file__).resolve().parents[2] / "results/validation/2026-11-29b-cpu-smollm2"
    lines = rescore(folder, ["empirical"])
    assert "; held-out prompts, shuffled; " in lines[0]
    summary = next(line for line in lines if line.startswith("empirical: |mean-TPOT error|"))
    assert "median 1.5%, max 5.4%; acceptance part median 0.7%, max 2.4%" in summary


def test_the_cells_prompts_are_read_from_the_record_or_its_command() -> None:
    import json
    from pathlib import Path

    from dsd.validation.record import ValidationRecord
    from dsd.validation.rescore import cells_prompts

    path = Path(__file__).resolve().parents[2] / "results/validation/2026-11-25-cpu-smollm2"
    base = ValidationRecord.from_json(json.loads((path / "config.json").read_text()), "config")

    def record(command: str, **extra: object) -> ValidationRecord:
        return dataclasses.replace(base, command=command, extra=extra)

    report = "dsd hardware-report --out x"
    assert cells_prompts(record(report)) == {"held_out_prompts": False, "shuffle": False}
    assert cells_prompts(record(report, held_out_prompts=True)) == {
        "held_out_prompts": True, "shuffle": True  # held-out hardware reports always shuffled
    }  # fmt: skip
    assert cells_prompts(record("dsd validate --shuffle", held_out_prompts=True))["shuffle"]
    assert not cells_prompts(record("dsd validate", held_out_prompts=True))["shuffle"]
    assert not cells_prompts(record(report, held_out_prompts=True, shuffle=False))["shuffle"]
