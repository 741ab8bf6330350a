"""`dsd simulate` end to end: JSON keys, byte-identical output across processes, --out files,
the readable summary, and bad inputs (one error line, exit 2, no output folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dsd.cli import main
from dsd.policies.profile_io import load_profile

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
SMALL = ["--max-concurrency", "4", "--num-prompts", "8"]
GOODPUT = ["--profile", str(H100), "--policy", "goodput"]

# vLLM bench result keys (plus ours) that `--json` must carry.
REQUIRED_KEYS = {
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "spec_decode_acceptance_length",
    "spec_decode_per_position_acceptance_rates",
    "k_histogram",
    "num_steps",
    "max_concurrency",
    "num_prompts",
    "request_rate",
    "burstiness",
} | {
    f"{stat}_{metric}_ms"
    for stat in ("mean", "median", "std", "p99")
    for metric in ("ttft", "tpot", "itl", "e2el")
}


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _simulate_subprocess(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONHASHSEED="random")
    return subprocess.run(
        [sys.executable, "-m", "dsd.cli", "simulate", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
        timeout=120,
    )


def test_json_prints_one_object_with_the_vllm_bench_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(
        ["simulate", "--profile", str(H100), "--policy", "goodput", *SMALL, "--json"], capsys
    )
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert set(result) >= REQUIRED_KEYS
    assert list(result) == sorted(result)
    assert result["completed"] == 8
    assert result["request_rate"] == "inf"
    assert len(result["spec_decode_per_position_acceptance_rates"]) == 5
    assert sum(result["k_histogram"].values()) > 0


def test_json_is_byte_identical_across_two_processes() -> None:
    argv = ["--profile", str(H100), "--policy", "static:3", *SMALL, "--json", "--seed", "7"]
    first, second = _simulate_subprocess(argv), _simulate_subprocess(argv)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stdout.strip()


def test_a_different_seed_changes_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--profile", str(H100), "--policy", "static:3", *SMALL, "--json"]
    _, out_a, _ = run_cli([*base, "--seed", "1"], capsys)
    _, out_b, _ = run_cli([*base, "--seed", "2"], capsys)
    assert json.loads(out_a)["mean_tpot_ms"] != json.loads(out_b)["mean_tpot_ms"]


def test_summary_has_the_vllm_layout_the_spec_block_and_the_model_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(
        ["simulate", "--profile", str(H100), "--policy", "goodput", *SMALL, "-v"], capsys
    )
    assert code == 0
    for text in (
        "============ Serving Benchmark Result ============",
        "Successful requests:                     8",
        "Mean TPOT (ms):",
        "Mean TPOT in prefill steps (ms):",
        "---------------Speculative Decoding---------------",
        "Acceptance length:",
        "K=3:",
        "latency model: parametric (asked auto: worst |error| at a profiled B, held out or "
        "fitted: table 21.4%, parametric ",
        "(the fit replaces the table below 0.5x its error)); prefill cost: "
        "estimated-from-physical-model",
    ):
        assert text in out


def test_parametric_summary_reports_the_fit_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--profile", str(H100), "--policy", "static:2", *SMALL]
    code, out, _ = run_cli([*argv, "--latency-model", "parametric", "--verbose"], capsys)
    assert code == 0
    assert "latency model: parametric" in out and "max |err|" in out


def test_the_latency_model_line_only_with_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--profile", str(H100), "--policy", "static:2", *SMALL]
    code, out, _ = run_cli([*argv, "--out", str(tmp_path / "run")], capsys)
    assert code == 0 and "latency model" not in out
    assert out.splitlines()[-2].startswith("policy: static:2; k_max 5;")
    config = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    assert config["resolved"]["latency_model"]["choice"]["reason"]  # the line's content is kept


def test_out_writes_readable_run_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "run"
    argv = ["simulate", "--profile", str(H100), "--policy", "goodput", *SMALL]
    code, out, _ = run_cli([*argv, "--json", "--out", str(out_dir)], capsys)
    assert code == 0
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "config.json",
        "requests.csv",
        "result.json",
        "steps.parquet",
    ]
    result = json.loads((out_dir / "result.json").read_text())
    assert result == json.loads(out)
    requests = pd.read_csv(out_dir / "requests.csv")
    assert len(requests) == 8 and {"ttft_ms", "tpot_ms", "e2el_ms", "tag"} <= set(requests)
    assert requests["tpot_ms"].mean() == pytest.approx(result["mean_tpot_ms"])
    steps = pd.read_parquet(out_dir / "steps.parquet")
    assert len(steps) == result["num_steps"]
    expected = {"batch_size", "num_decode_reqs", "num_tokens", "num_spec_tokens", "duration_s"}
    assert expected | {"num_accepted_tokens", "num_output_tokens"} <= set(steps)
    assert int(steps["num_output_tokens"].sum()) == result["total_output_tokens"]
    config = json.loads((out_dir / "config.json").read_text())
    assert config["config"]["policy"] == "goodput"
    assert config["command_line"].startswith("dsd ")
    assert set(config["versions"]) == {"dsd", "python", "numpy", "simpy"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_a_bandit_run_writes_the_profile_it_learned_and_a_next_run_starts_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first"
    argv = ["simulate", "--profile", str(H100), *SMALL, "--num-prompts", "16"]
    code, out, _ = run_cli([*argv, "--policy", "bandit", "--out", str(first)], capsys)
    assert code == 0 and "learned_profile.json" in out
    learned = load_profile(first / "learned_profile.json")
    assert learned.k_max == 5 and learned.batch_sizes()[0] == 1
    assert learned.metadata["observed_steps"] > 0
    # The learned file is a prior for the next run (and a profile for any profile reader).
    spec = f"bandit:prior={first / 'learned_profile.json'}"
    code, _, err = run_cli([*argv, "--policy", spec, "--out", str(tmp_path / "second")], capsys)
    assert code == 0, err
    code, _, err = run_cli(
        [
            "simulate",
            "--profile",
            str(first / "learned_profile.json"),
            "--policy",
            "goodput",
            *SMALL,
        ],
        capsys,
    )
    assert code == 0, err


def test_out_streams_steps_in_blocks_equal_to_the_kept_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    import dsd.sim.metrics
    from dsd.sim.build import run_simulation
    from dsd.sim.config import RunConfig

    monkeypatch.setattr(dsd.sim.metrics, "STEP_BLOCK_ROWS", 256)  # several row groups
    out_dir = tmp_path / "run"
    argv = ["simulate", *GOODPUT, "--max-concurrency", "8", "--num-prompts", "40"]
    code, _, _ = run_cli([*argv, "--out", str(out_dir)], capsys)
    assert code == 0
    kept = run_simulation(
        RunConfig(
            profile=str(H100),
            policy="goodput",
            dataset="mt-bench",
            num_prompts=40,
            max_concurrency=8,
        )
    ).steps
    kept["duration_ms"] = kept["duration_s"] * 1000.0
    assert pq.ParquetFile(out_dir / "steps.parquet").num_row_groups > 1
    pd.testing.assert_frame_equal(pd.read_parquet(out_dir / "steps.parquet"), kept)


def test_a_run_failing_after_streaming_steps_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dsd.reports.run_outputs

    def fail(*args: object) -> None:
        raise PermissionError("requests.csv: permission denied")

    monkeypatch.setattr(dsd.reports.run_outputs, "request_frame", fail)
    parent = tmp_path / "new" / "parent"
    code, _, err = run_cli(["simulate", *GOODPUT, *SMALL, "--out", str(parent / "run")], capsys)
    assert code == 2 and "permission denied" in err
    assert list(tmp_path.iterdir()) == []  # no temp steps file, no folders made for it


def test_speculative_config_becomes_a_table_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "spec.json"
    table = [[1, 2, 3], [3, 256, 1]]
    spec_file.write_text(
        json.dumps({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": table})
    )
    argv = ["simulate", "--profile", str(H100), "--speculative-config", str(spec_file), *SMALL]
    code, out, err = run_cli([*argv, "--json"], capsys)
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["k_max"] == 3
    assert result["policy"] == "table:[[1,2,3],[3,256,1]]"
    assert set(result["k_histogram"]) <= {"1", "3"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--profile", "/no/such.json", "--policy", "goodput"], "no such file"),  # bad profile
        (["--profile", str(H100), "--policy", "warp:3"], "unknown policy"),  # bad policy
        (
            ["--profile", str(H100), "--policy", "static:9", "--num-spec-tokens", "5"],
            "exceeds k_max",
        ),  # K too big
        (
            ["--profile", str(H100), "--policy", "goodput", "--dataset-name", "nope"],
            "unknown workload",
        ),  # bad dataset
        (["--profile", str(H100)], "exactly one of --policy and --speculative-config"),  # none
        (
            [
                "--profile",
                str(H100),
                "--policy",
                "goodput",
                "--speculative-config",
                '{"num_speculative_tokens": 2}',
            ],
            "exactly one of --policy and --speculative-config",
        ),  # conflicting policy flags
        (
            [
                "--profile",
                str(H100),
                "--speculative-config",
                '{"num_speculative_tokens": 2}',
                "--num-spec-tokens",
                "3",
            ],
            "conflicts",
        ),  # conflicting k_max
        (
            [*GOODPUT, "--dataset-name", "random", "--dataset-path", "x.csv"],
            "give one",
        ),  # conflicting dataset flags
        (
            ["--profile", str(H100), "--policy", "goodput", "--scheduling", "eager"],
            "scheduling: choose",
        ),
        (["--profile", str(H100), "--policy", "goodput", "--max-concurrency", "0"], ">= 1"),
        (["--profile", str(H100), "--speculative-config", "{oops"], "invalid JSON"),  # bad JSON
        ([*GOODPUT, "--speculative-method", "medusa"], "--speculative-method: choose"),
        ([*GOODPUT, "--scheduler", "sglang"], "scheduler: choose"),
        ([*GOODPUT, "--host-planning-ms", "0.5"], "must be a part of host_overhead_ms"),
        # found by the CLI fuzz test: a KV cache sized by it overflowed torch
        (
            [*GOODPUT, "--num-spec-tokens", "99999999999999999999"],
            "--num-spec-tokens: must be an integer",
        ),
        (
            [*GOODPUT, "--scheduler", "vllm", "--k-timing", "same-step"],
            "verifies a step's K at the next step",
        ),
        (
            [*GOODPUT, "--speculative-method", "eagle", "--max-num-batched-tokens", "5"],
            "lookahead",
        ),  # vLLM refuses a budget within the lookahead too
        (
            [
                "--profile",
                str(H100),
                "--speculative-config",
                '{"method": "eagle", "num_speculative_tokens": 2}',
                "--speculative-method",
                "draft_model",
            ],
            "conflicts with the speculative config's method",
        ),
        (
            [
                "--profile",
                str(H100),
                "--speculative-config",
                '{"method": "medusa", "num_speculative_tokens": 2}',
            ],
            "is not simulated",
        ),
    ],
)
def test_bad_inputs_print_one_error_line_exit_2_and_create_no_folder(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "run"
    code, out, err = run_cli(
        ["simulate", *extra, "--num-prompts", "4", "--out", str(out_dir)], capsys
    )
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_bad_profile_content_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"batch_stats": {"1": {"0": -1}}, "max_num_speculative_tokens": 1}')
    code, _, err = run_cli(
        ["simulate", "--profile", str(bad), "--policy", "static:0", "--out", str(tmp_path / "o")],
        capsys,
    )
    assert code == 2 and err.startswith("error: ") and "bad.json" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("out", ["/proc/nope/x", "/proc/nope"])
def test_an_unwritable_out_is_one_line_naming_the_path(
    out: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["simulate", *GOODPUT, *SMALL, "--out", out], capsys)
    assert code == 2 and err.startswith(f"error: --out {out}: cannot write in /proc")
    assert err.count("\n") == 1


def test_speculative_config_method_sets_the_drafters_reservations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A --speculative-config's method (and parallel_drafting) is the run's speculative_method;
    a pool tight enough to preempt shows that EAGLE's lookahead slots are reserved."""
    tight = [*SMALL, "--num-kv-blocks", "60", "--json"]
    results = {}
    for name, config in [
        ("ngram", '{"method": "ngram", "num_speculative_tokens": 3}'),
        ("p-eagle", '{"method": "eagle3", "parallel_drafting": true, "num_speculative_tokens": 3}'),
    ]:
        argv = ["simulate", "--profile", str(H100), "--speculative-config", config, *tight]
        code, out, err = run_cli(argv, capsys)
        assert (code, err) == (0, "")
        results[name] = json.loads(out)
    assert results["ngram"] != results["p-eagle"]


def test_scheduler_vllm_without_vllm_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib import metadata

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    code, out, err = run_cli(["simulate", *GOODPUT, *SMALL, "--scheduler", "vllm"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == (
        "error: --scheduler vllm: vLLM is not installed (pip install --no-deps vllm==0.33.0, as "
        "the README's setup does)"
    )


@pytest.mark.parametrize("argv", [[], ["traces"], ["export"]])
def test_a_command_group_alone_shows_its_help_as_it_is(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`dsd` (or a group) with nothing after it: the group's help on stderr, line by line, and
    exit 2; not the help squeezed onto one `error:` line."""
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"Usage: dsd {' '.join(argv)}".rstrip() + " [OPTIONS] COMMAND")
    assert "\nCommands:\n" in err and "error:" not in err


def test_help_loads_neither_rich_help_renderers_nor_a_second_click() -> None:
    """`dsd --help` is click's plain help: typer's rich help imports rich's markdown renderer
    (and pygments), +0.2 s of every `--help`; with a typer that bundles its own click, the click
    package is not loaded beside it (docs/simulator.md "Speed")."""
    script = (
        "import sys\n"
        "from dsd.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "import importlib.util\n"
        "bundled = importlib.util.find_spec('typer._click') is not None\n"
        "heavy = ['rich.markdown', 'typer.rich_utils', *(['click'] if bundled else [])]\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert "Usage: " in done.stdout and "Commands:" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("policy", "unloaded"),
    [
        # drafts: the heterogeneous model's Beta quantiles load scipy's compiled special
        # functions alone (dsd.common.special), not the scipy.special package
        ("goodput", ("scipy.special",)),
        ("static:0", ("scipy.special", "scipy.special._ufuncs")),  # never drafts
    ],
)
def test_simulate_json_leaves_the_heavy_libraries_unloaded(
    policy: str, unloaded: tuple[str, ...]
) -> None:
    """Start-up is most of a short simulate: pandas, pyarrow and scipy.optimize load only where
    a table is read or written or a model is fitted, the command line parses without pydantic,
    and a closed loop runs without SimPy (issue "simulator speed"). The profile's latency fits
    are memoized on disk (`dsd.common.disk_memo`), so the first run on a profile fits with
    scipy.optimize and the later ones, checked here, do not: the run before the check makes that
    not depend on which tests ran earlier in the session."""
    heavy = ("pandas", "pyarrow", "scipy.optimize", "matplotlib", "torch", "pydantic", "simpy")
    heavy = (*heavy, *unloaded)
    argv = ["--profile", str(H100), "--policy", policy, *SMALL]
    script = (
        "import sys\n"
        "from dsd.cli import main\n"
        f"sys.argv = ['dsd', 'simulate', *{argv!r}, '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print(sorted(name for name in {heavy!r} if name in sys.modules))\n"
    )
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
        )
    assert done.stdout.strip().splitlines()[-1] == "[]"


CPU_PROFILE = REPO / "tests" / "data" / "profiles" / "cpu_smollm2_ngram_2026-11-27f.json"


def test_interval_runs_print_and_write_the_prediction_interval(capsys, tmp_path) -> None:
    """--interval-runs: the summary's prediction line, result.json's KEY_lo / KEY_hi, and the
    sweep's table; --held-out-prompts takes prompts the profile never ran."""
    common = ["--profile", str(CPU_PROFILE), "--dataset-name", "instructcoder", "--output-len",
              "16", "--acceptance-model", "empirical", "--held-out-prompts",
              "--interval-runs", "2"]  # fmt: skip
    code, out, _ = run_cli(["simulate", "--policy", "goodput", "--max-concurrency", "2",
                            "--num-prompts", "4", *common, "--out", str(tmp_path / "run")],
                           capsys)  # fmt: skip
    assert code == 0
    assert "prediction over 3 draws of the workload: mean TPOT " in out and "(90%: " in out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["interval_runs"] == 3
    assert result["mean_tpot_ms_lo"] <= result["mean_tpot_ms_hi"]
    code, out, _ = run_cli(["sweep", "--policies", "static:2", "--max-concurrency", "1",
                            "--num-prompts-per-concurrency", "2", *common,
                            "--out", str(tmp_path / "sweep")], capsys)  # fmt: skip
    assert code == 0 and "mean_tpot_ms_lo" in out
    assert "mean_tpot_ms_hi" in (tmp_path / "sweep" / "sweep.md").read_text()


def _ctrl_c_before(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
    """Make `owner.name` get a real SIGINT (a terminal's Ctrl-C) as it starts."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default here (ignored by the runner)")
    original = getattr(owner, name)

    def interrupted(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


@pytest.mark.parametrize("where", ["run", "files"])
def test_ctrl_c_prints_one_line_exits_130_and_writes_nothing(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import signal

    from dsd.reports import run_outputs
    from dsd.sim.engine import Engine

    if where == "run":
        _ctrl_c_before(monkeypatch, Engine, "run")
    else:  # the files staged, before the folder is renamed into place
        _ctrl_c_before(monkeypatch, run_outputs.os, "rename")
    out_dir = tmp_path / "out" / "run"
    code, _out, err = run_cli(["simulate", *GOODPUT, *SMALL, "--out", str(out_dir)], capsys)
    assert (code, err) == (130, "interrupted\n")
    assert not (tmp_path / "out").exists()  # no folder, no hidden temp files
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
