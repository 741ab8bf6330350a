"""`dsd profile` and `dsd validate` end to end on CPU with a tiny pair (the pipeline smoke test).

The commands are registered on a bare typer app (dsd.cli.app adds the error contract); bad
input surfaces as InputError, which dsd.cli turns into `error: ...`, exit 2.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from dsd.cli import profile, validate
from dsd.common.errors import InputError
from dsd.policies.profile_io import load_profile, save_profile

REPO = Path(__file__).resolve().parents[2]
VLLM_RESULT = REPO / "tests" / "data" / "vllm_bench_result_small.json"
H100_PROFILE = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    torch.set_num_threads(1)
    application = typer.Typer()
    profile.register(application)
    validate.register(application)
    return application


PROFILE_ARGS = [
    "profile",
    "--target", "tiny",
    "--draft", "tiny-draft",
    "--batch-sizes", "1,4",
    "--k", "0,1,3",
    "--context-lens", "32",
    "--prefill-tokens", "16,64",
    "--num-prompts", "6",
    "--output-len", "16",
    "--allow-noisy-profile",  # millisecond steps of tiny models on a shared CPU are noisy
    "--warmup", "1",
    "--iters", "3",
]  # fmt: skip


@pytest.fixture(scope="module")
def profile_path(app, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    result = CliRunner().invoke(app, [*PROFILE_ARGS, "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert "threads: 1 (the CPU default" in result.output  # which threads the timings ran on
    return path


def test_profile_writes_a_loadable_native_profile(profile_path) -> None:
    profile = load_profile(profile_path)
    assert profile.host_overhead is not None  # measured by default
    assert profile.host_overhead.max_batch_size == 4
    assert profile.k_max == 3
    assert {(p.batch_size, p.num_spec_tokens) for p in profile.latency} == {
        (b, k) for b in (1, 4) for k in (0, 1, 3)
    }
    assert profile.metadata["target"] == "tiny"
    assert profile.metadata["command"].startswith("dsd")
    assert profile.metadata["acceptance"]["num_requests"] == 6


def test_profile_dsd_json_format_is_pr32374(app, tmp_path) -> None:
    path = tmp_path / "dynamic_speculative_config.json"
    result = CliRunner().invoke(app, [*PROFILE_ARGS, "--out", str(path), "--format", "dsd-json"])
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert data["max_num_speculative_tokens"] == 3
    assert set(data["batch_stats"]) == {"1", "4"}
    assert len(data["acceptance_rate_per_pos"]) == 3


def test_validate_writes_the_report(app, profile_path, tmp_path) -> None:
    out = tmp_path / "report"
    args = [
        "validate",
        "--profile", str(profile_path),
        "--target", "tiny",
        "--draft", "tiny-draft",
        "--policies", "static:0,static:3,goodput",
        "--max-concurrency", "1,2",
        "--num-prompts-per-concurrency", "2",
        "--output-len", "12",
        "--allow-noisy-profile",
        "--out", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for name in ("report.md", "cells.csv", "config.json", "tpot_vs_concurrency.png"):
        assert (out / name).is_file()
    config = json.loads((out / "config.json").read_text())
    assert len(config["cells"]) == 6
    assert config["seed"] == 0 and "versions" in config and "device" in config
    # cells on prompts the profile never ran, each simulated side with its 90% interval
    assert config["held_out_prompts"] is True and config["interval_runs"] == 8
    rows = list(csv.DictReader((out / "cells.csv").open()))
    for row in rows:
        assert float(row["simulated_mean_tpot_ms_lo"]) <= float(row["simulated_mean_tpot_ms_hi"])
    assert "Prompts: held out" in (out / "report.md").read_text()
    assert "(90%: " in result.output
    assert "goodput C=2" in result.output.replace("  ", " ")
    assert "threads: 1 (the CPU default" in result.output
    # The profile carries a measured host overhead and no flag was given: the model is used.
    assert config["host_overhead_source"] == "measured"
    assert {cell["host_overhead_source"] for cell in config["cells"]} == {"measured"}
    assert "simulator host overhead per step: measured" in result.output


def test_validate_host_overhead_flag_overrides_the_measured_model(
    app, profile_path, tmp_path
) -> None:
    out = tmp_path / "report"
    args = [
        "validate",
        "--profile", str(profile_path),
        "--target", "tiny",
        "--draft", "tiny-draft",
        "--policies", "static:0",
        "--max-concurrency", "1",
        "--num-prompts-per-concurrency", "1",
        "--output-len", "4",
        "--host-overhead-ms", "0",
        "--allow-noisy-profile",
        "--out", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["host_overhead_source"] == "flag"
    assert config["host_overhead_ms"] == 0


def test_validate_against_vllm_file(app, tmp_path) -> None:
    profile = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
    out = tmp_path / "vllm"
    args = ["validate", "--measured", str(VLLM_RESULT), "--profile", str(profile),
            "--policy", "static:3", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "C=2" in result.output
    assert (out / "report.md").is_file()
    # every latency model scored against the measured engine, the chosen one among them
    config = json.loads((out / "config.json").read_text())
    errors = config["latency_model_errors_pct_mean_tpot_ms"]
    assert set(errors) == {"table", "parametric"}
    assert f"table {errors['table']:+.1f} %" in result.output.replace("  ", " ")
    row = next(csv.DictReader((out / "cells.csv").open()))
    assert float(row["error_pct_mean_tpot_ms"]) == pytest.approx(errors[config["latency_model"]])
    assert float(row["simulated_mean_tpot_ms_lo"]) <= float(row["simulated_mean_tpot_ms_hi"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["validate", "--profile", "p.json", "--measured", "x.json"], "--policy"),
        (["validate", "--profile", "p.json"], "--target"),
        ([*PROFILE_ARGS[:-2], "--iters", "0", "--out", "x.json"], "num_iters"),
        ([*PROFILE_ARGS, "--out", "x.json", "--batch-sizes", "1,a"], "--batch-sizes"),
        ([*PROFILE_ARGS, "--out", "x.json", "--format", "yaml"], "file_format"),
        ([*PROFILE_ARGS, "--out", "x.json", "--draft", "none"], "needs a draft"),
    ],
)
def test_bad_flags_raise_input_error(app, args, message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, InputError), result.output
    assert message in str(result.exception)


def test_validate_refuses_a_profile_whose_timing_fails_the_checks(app, tmp_path) -> None:
    """K = 1 cheaper than K = 0 cannot be physics: refused before anything runs, naming the
    point; --allow-noisy-profile goes on and records the problem in the report."""
    profile = load_profile(H100_PROFILE)
    bad_points = tuple(
        dataclasses.replace(p, median_ms=p.median_ms * 0.5)
        if (p.batch_size, p.num_spec_tokens) == (1, 1)
        else p
        for p in profile.latency
    )
    bad = tmp_path / "bad.json"
    save_profile(dataclasses.replace(profile, latency=bad_points), bad)
    args = [
        "validate",
        "--profile",
        str(bad),
        "--target",
        "tiny",
        "--draft",
        "early-exit:1",
        "--policies",
        "static:0",
        "--max-concurrency",
        "1",
        "--num-prompts-per-concurrency",
        "1",
        "--output-len",
        "4",
        "--in-sample",
    ]  # fmt: skip  (the PR profile records no prompts to hold out)
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "refused")])
    assert isinstance(result.exception, InputError), result.output
    assert "B=1 K=1" in str(result.exception) and "--allow-noisy-profile" in str(result.exception)
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "allowed"
    result = CliRunner().invoke(app, [*args, "--allow-noisy-profile", "--out", str(out)])
    assert result.exit_code == 0, result.output
    problems = json.loads((out / "config.json").read_text())["profile_problems"]
    assert problems and all("B=1 K=1" in p for p in problems)


def test_validate_refuses_a_profile_from_another_machine_unless_re_timed(
    app, profile_path, tmp_path
) -> None:
    """A profile taken elsewhere (here: another CPU model in its metadata) prices nothing on
    this machine: refused with --no-retime, naming what differs, before anything runs."""
    profile = load_profile(profile_path)
    elsewhere = tmp_path / "elsewhere.json"
    metadata = {**profile.metadata, "device": "cpu (Some Other CPU)"}
    save_profile(dataclasses.replace(profile, metadata=metadata), elsewhere)
    args = ["validate", "--profile", str(elsewhere), "--target", "tiny", "--draft", "tiny-draft",
            "--policies", "static:0", "--max-concurrency", "1", "--num-prompts-per-concurrency",
            "1", "--output-len", "4", "--allow-noisy-profile", "--no-retime",
            "--out", str(tmp_path / "refused")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, InputError), result.output
    assert "another machine" in str(result.exception)
    assert "Some Other CPU" in str(result.exception) and "--no-retime" in str(result.exception)
    assert not (tmp_path / "refused").exists()
