"""`dsd hardware-report`: the quick plan end to end on the tiny random-weight pair (a dry run of
the pipeline, not a measurement), and its one-line errors before anything loads or is written."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

REPORT_FILES = {
    "report.md",
    "validation.md",
    "cells.csv",
    "trials.csv",
    "steps.csv",
    "config.json",
    "crossover.csv",
    "crossover.png",
    "speedup.json",
    "profile.json",
    "profile_retimed.json",
    "tpot_vs_concurrency.png",
    "k_over_time.png",
}


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in a JSON file")


def test_quick_report_writes_every_file_with_the_error_split(tmp_path, capsys) -> None:
    from dsd.cli import main

    out = tmp_path / "report"
    main(["hardware-report", "--quick", "--trials", "2", "--target", "tiny", "--draft",
          "ngram:1-3", "--speedup-arm", "ngram:2-4 static:4", "--out", str(out)])  # fmt: skip
    assert {path.name for path in out.iterdir()} == REPORT_FILES
    assert "report.md first" in capsys.readouterr().out

    rows = list(csv.DictReader((out / "cells.csv").open()))
    # The project check reads the first column naming an error of mean TPOT.
    first_error = next(name for name in rows[0] if "err" in name)
    assert first_error == "error_pct_mean_tpot_ms"
    assert {row["policy"] for row in rows} == {"static:0", "static:1", "static:2", "goodput"}
    for row in rows:
        # K = 0 drafts nothing: the replay and the fitted model agree exactly.
        if row["policy"] == "static:0":
            assert float(row["acceptance_error_pct_mean_tpot_ms"]) == 0.0
        assert float(row["replayed_mean_tpot_ms"]) > 0
        assert row["num_trials"] == "2"  # --trials over the quick plan's 1

    config = json.loads((out / "config.json").read_text())
    # cells on prompts the profile never ran, each with the simulator's 90% interval (the check
    # of the issue "the simulator as a design tool" reads these columns)
    assert config["held_out_prompts"] is True and config["interval_runs"] == 8
    for row in rows:
        assert float(row["simulated_mean_tpot_ms_lo"]) <= float(row["simulated_mean_tpot_ms_hi"])
        assert row["num_prompts"] == row["max_concurrency"]  # the quick plan: 1 x C
        assert row["measured_inside_interval"] in ("0", "1")
    assert "interval_coverage" in config["summary"]
    assert config["threads"]["torch_intra_op_threads"] == 1  # 1 thread on CPU by default
    assert config["quick"] is True and config["command"].startswith("dsd hardware-report")
    assert config["plan"]["trials"] == 2
    assert len(config["load_during"]["samples"]) == 4
    # The simulated side is priced by the profile re-timed around the real runs (one round
    # before the runs, one after each of the 2 trials of the 2 groups: the cells of each C run
    # together), and probed in them, one window per group
    groups = len({row["max_concurrency"] for row in rows})
    assert config["retime"]["status"] == "on" and config["retime"]["rounds"] == 1 + 2 * groups
    assert config["retime"]["probed_runs"] == 2 * groups
    retimed = json.loads((out / "profile_retimed.json").read_text())
    assert retimed["metadata"]["timing_rounds"]["rounds"] == config["retime"]["rounds"]

    # Every step of each cell's first trial, its time inside the executor within the loop's
    steps = list(csv.DictReader((out / "steps.csv").open()))
    assert {(r["policy"], r["max_concurrency"]) for r in steps} == {
        (r["policy"], r["max_concurrency"]) for r in rows
    }
    assert all(0 < float(r["execute_ms"]) <= float(r["wall_ms"]) + 1e-3 for r in steps)
    for row in rows:
        own = [r for r in steps if (r["policy"], r["max_concurrency"]) == (row["policy"],
               row["max_concurrency"])]  # fmt: skip
        assert [int(r["step_index"]) for r in own] == list(range(len(own)))
        assert 0 <= float(row["measured_outside_executor_ms"]) < float(row["measured_step_ms"])

    report = (out / "report.md").read_text()
    for fragment in ("## Goals", "B=1 speedup", "K* does not rise", "timing part",
                     "outside the executor",
                     "priced by the profile re-timed around the real runs",
                     "| static:2 | 2 |", "dsd hardware-report --quick --trials 2",
                     "Prompts: held out", "Prompts per cell: 1, 2",
                     "inside the simulator's 90% interval"):  # fmt: skip
        assert fragment in report, fragment
    # A dry run judges no goal, and shows each distinct table once.
    assert "**missed**" not in report and "**met**" not in report
    assert report.count("| dry run: no verdict |") == len(config["goals"])
    tables = [block for block in report.split("\n\n") if block.startswith("| C |")]
    assert tables and len(tables) == len(set(tables))
    assert not re.search(r"\bnan\b", report, re.IGNORECASE)  # "-" for a missing value
    # Strict JSON (no NaN): the plain arm has no acceptance length.
    speedup = json.loads((out / "speedup.json").read_text(), parse_constant=_refuse)
    assert all(arm["identical_to_first_arm"] for arm in speedup["arms"])
    assert speedup["arms"][0]["acceptance_length"] is None
    # the report's draft (plain, static:2, goodput), then the other draft's arm
    assert [arm["arm"] for arm in speedup["arms"]] == [
        "none", "ngram:1-3 static:2", "ngram:1-3 goodput", "ngram:2-4 static:4"
    ]  # fmt: skip
    assert config["plan"]["speedup_extra_arms"] == ["ngram:2-4 static:4"]
    assert "ngram:2-4 static:4" in report


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--draft", "none"], "needs a draft"),
        (["--draft", "NGRAM"], "write ngram"),
        (["--speedup-arm", "NGRAM static:2"], "write ngram"),
        (["--speedup-arm", "ngram:2-4"], "DRAFT POLICY [K_MAX]"),
        (["--speedup-arm", "none"], "always the first arm"),
        (["--threads", "0"], "--threads"),
        (["--trials", "0"], "--trials"),
        (["--time-budget", "0"], "--time-budget"),
        (["--target", "no-such-model"], "no-such-model"),
        (["--dtype", "float8"], "--dtype"),
        (["--device", "tpu"], "--device"),
        (["--fast-path", "turbo"], "--fast-path"),
        (["--fast-path", "cuda-graphs"], "needs --device cuda"),
        (["--plan", "huge"], "--plan huge: choose full, production"),
        (["--stage", "later"], "--stage later: choose all, profile, cells"),
        (["--stage", "cells"], "no profile.json (run --stage profile first)"),
        (["--prompts-per-concurrency", "0"], "--prompts-per-concurrency: must be an integer >= 1"),
        (["--dataset-name", "azure-code"], "--dataset-name: 'azure-code' is not a prompt set"),
        (["--profile-dataset-name", "nope"], "--profile-dataset-name: 'nope' is not a prompt"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(args, fragment, tmp_path, capsys) -> None:
    from dsd.cli import main

    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_info:
        main(["hardware-report", "--quick", "--target", "tiny", "--out", str(out), *args])
    assert exit_info.value.code == 2
    # Stage lines ("loading ...") may come first; the error is one last line.
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and fragment in last
    assert not out.exists()


def test_a_spent_time_budget_runs_one_round_and_says_so(tmp_path) -> None:
    from dsd.cli import main

    out = tmp_path / "report"
    # 1 s, less the reserve for writing: spent before the first round, which runs anyway.
    # On the fixed-shape decode path and a chosen dtype, both recorded; and a transfer report
    # (the profile's acceptance on MT-Bench, the cells on InstructCoder), said so.
    main(["hardware-report", "--quick", "--trials", "3", "--time-budget", "1", "--target",
          "tiny", "--draft", "ngram:1-3", "--fast-path", "eager", "--dtype", "float32",
          "--profile-dataset-name", "mt-bench", "--out", str(out)])  # fmt: skip
    rows = list(csv.DictReader((out / "cells.csv").open()))
    assert {row["num_trials"] for row in rows} == {"1"}
    config = json.loads((out / "config.json").read_text())
    assert (config["trials"], config["trials_done"], config["time_budget_s"]) == (3, 1, 1.0)
    assert config["fast_path"] == "eager" and config["dtype"] == "float32"
    profile = json.loads((out / "profile.json").read_text())
    assert profile["metadata"]["fast_path"] == "eager"
    assert profile["metadata"]["dataset"] == "mt-bench"
    assert (config["profile_dataset"], config["dataset"]) == ("mt-bench", "instructcoder")
    report = (out / "report.md").read_text()
    transfer = "Transfer: the profile's acceptance ran on mt-bench, the cells on instructcoder"
    assert transfer in report
    assert "trials per cell: 1 of the 3 planned" in (out / "report.md").read_text()


def test_out_that_is_a_file_is_refused(tmp_path, capsys) -> None:
    from dsd.cli import main

    out = tmp_path / "report"
    out.write_text("keep me")
    with pytest.raises(SystemExit):
        main(["hardware-report", "--quick", "--target", "tiny", "--out", str(out)])
    assert "exists and is not a folder" in capsys.readouterr().err
    assert out.read_text() == "keep me"


def test_the_production_plan_runs_in_two_stages_with_drawn_acceptance(tmp_path, capsys) -> None:
    # the production plan's dry run (tiny shapes): the profile in one call, the cells in the
    # next on its profile.json, as scripts/gpu_session.py's production phases split them
    from dsd.cli import main

    out = tmp_path / "report"
    common = ["hardware-report", "--plan", "production", "--quick", "--draft", "eagle",
              "--out", str(out)]  # fmt: skip
    main([*common, "--target", "tiny", "--stage", "profile"])
    assert {path.name for path in out.iterdir()} == {"profile.json"}
    profile = json.loads((out / "profile.json").read_text())
    pr_rates = json.loads(
        (
            Path(__file__).parents[2] / "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
        ).read_text()
    )["acceptance_rate_per_pos"]
    assert profile["acceptance"]["rates"] == pr_rates  # k_max 5 on both sides
    assert profile["metadata"]["acceptance_from"] == "pr32374_llama31_8b_eagle_h100.json"
    with pytest.raises(SystemExit):  # the cells stage checks the profile is the target's
        main([*common, "--target", "random:tiny", "--stage", "cells"])
    assert "its profile.json is of tiny, not random:tiny" in capsys.readouterr().err

    main([*common, "--target", "tiny", "--stage", "cells"])
    rows = list(csv.DictReader((out / "cells.csv").open()))
    assert {row["policy"] for row in rows} == {
        "static:0", "static:3", "goodput", "online", "per-request"
    }  # fmt: skip
    assert {row["max_concurrency"] for row in rows} == {"1", "2"}
    for row in rows:  # the same accepted counts on both sides: only timing differs
        assert row["measured_acceptance_length"] == row["simulated_acceptance_length"]
    config = json.loads((out / "config.json").read_text())
    assert config["acceptance"] == "drawn (per-position; tokens meaningless)"
    assert config["plan_name"] == "production" and config["dataset"] == "mt-bench"
    assert config["plan"]["prompts_per_concurrency"] == 1 and config["interleaved"] is False
    assert config["b1_plain_decode_ms"] > 0
    assert config["held_out_prompts"] is False
    report = (out / "report.md").read_text()
    for fragment in ("Acceptance: drawn", "tokens meaningless", "Plain decode at B = 1",
                     "vLLM: 6.3 ms", "Prompts: their lengths only"):  # fmt: skip
        assert fragment in report, fragment
    assert "tokens meaningless" in (out / "validation.md").read_text()
    assert not (out / "speedup.json").exists()  # no B = 1 arms in this plan
