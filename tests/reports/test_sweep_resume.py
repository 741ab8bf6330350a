"""A killed `dsd sweep` loses no finished cell and a re-run computes each missing cell once;
per-cell results are identical whatever the number of pool workers; a stale cell file (same id,
other spec) is recomputed, never reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from dsd.reports.grid import expand_grid, load_grid
from dsd.reports.sweep import cell_file, identify, run_sweep_to_dir

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"

# 12 cells of ~0.3-0.6 s each: slow enough to kill the sweep part-way on 2 cores.
SLOW_GRID = f"""
profile = "{H100}"
policies = ["static:0", "static:2", "goodput"]
seeds = [0, 1, 2, 3]
max_concurrency = [128]
num_prompts_per_concurrency = 4
[[workloads]]
dataset = "mt-bench"
output_len = 512
"""


def _sweep_command(grid: Path, out: Path) -> list[str]:
    code = "import sys; from dsd.cli import main; sys.argv[0] = 'dsd'; main()"
    return [
        sys.executable,
        "-c",
        code,
        "sweep",
        "--grid",
        str(grid),
        "--out",
        str(out),
        "--workers",
        "2",
    ]


def _finished(out: Path) -> dict[str, int]:
    """cell id -> mtime_ns of every finished cell file."""
    folder = out / "cells"
    if not folder.is_dir():
        return {}
    return {
        p.name.removesuffix(".parquet"): p.stat().st_mtime_ns
        for p in folder.glob("*.parquet")
        if not p.name.endswith(".ktrace.parquet")
    }


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _start_and_kill(tmp_path: Path, kill_whole_group: bool) -> tuple[Path, Path, int]:
    grid = tmp_path / "grid.toml"
    grid.write_text(SLOW_GRID)
    out = tmp_path / "sweep"
    process = subprocess.Popen(
        _sweep_command(grid, out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so killpg hits it and its workers only
    )
    deadline = time.monotonic() + 120
    while len(_finished(out)) < 2:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert time.monotonic() < deadline, "no cell finished in 120 s"
        time.sleep(0.02)
    if kill_whole_group:
        os.killpg(process.pid, signal.SIGKILL)
    else:
        workers = _children(process.pid)
        assert workers, "the sweep has no worker processes"
        os.kill(workers[0], signal.SIGKILL)
    process.wait(timeout=60)
    if process.stderr is not None:
        stderr = process.stderr.read().decode()
        process.stderr.close()
    if not kill_whole_group:
        # The driver notices the dead worker, keeps what finished, says how to resume.
        assert process.returncode == 1
        assert "run the same command again to resume" in stderr
    else:
        assert process.returncode == -signal.SIGKILL
    return grid, out, process.returncode


@pytest.mark.parametrize(
    "kill_whole_group",
    [
        False,  # SIGKILL one pool worker: the driver stops with exit 1
        True,  # SIGKILL the whole process group (driver and workers)
    ],
)
def test_killed_sweep_resumes_and_computes_every_cell_exactly_once(
    tmp_path: Path, kill_whole_group: bool
) -> None:
    grid, out, _ = _start_and_kill(tmp_path, kill_whole_group)
    before = _finished(out)
    cells = identify(expand_grid(load_grid(grid)))
    assert 2 <= len(before) < len(cells), "the kill should land part-way through"
    resumed = subprocess.run(
        _sweep_command(grid, out), capture_output=True, text=True, timeout=300, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    after = _finished(out)
    # Every cell has exactly one result file; nothing outside the grid.
    assert sorted(after) == sorted(c.cell_id for c in cells)
    # Cells finished before the kill were reused, not recomputed (file untouched).
    assert all(after[cell_id] == mtime for cell_id, mtime in before.items())
    run_count = len(cells) - len(before)
    assert f"({run_count} run, {len(before)} reused)" in resumed.stdout
    # No half-written files were left visible: every file reads as one row with its spec.
    for cell in cells:
        row = pd.read_parquet(cell_file(out, cell.cell_id))
        assert len(row) == 1 and row["cell_spec_json"].iloc[0] == cell.spec_json


@pytest.mark.parametrize(
    ("signum", "exit_code", "said"),
    [
        (signal.SIGTERM, 128 + signal.SIGTERM, "stopped by SIGTERM"),  # `kill PID`: the driver
        (signal.SIGINT, 128 + signal.SIGINT, "stopped by Ctrl-C"),  # a terminal's Ctrl-C: all
    ],
)
def test_a_signal_stops_the_sweep_at_once_ends_its_workers_and_says_what_it_kept(
    tmp_path: Path, signum: signal.Signals, exit_code: int, said: str
) -> None:
    psutil = pytest.importorskip("psutil")
    grid = tmp_path / "grid.toml"
    grid.write_text(SLOW_GRID)
    out = tmp_path / "sweep"
    process = subprocess.Popen(
        _sweep_command(grid, out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # Ctrl-C as at a terminal: a test runner may have left SIGINT ignored, which a child keeps
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not _finished(out):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "no cell finished in 120 s"
            time.sleep(0.02)
        workers = psutil.Process(process.pid).children(recursive=True)
        assert len(workers) == 2, "both pool workers should be busy"
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)  # a terminal sends Ctrl-C to the whole group
        else:
            os.kill(process.pid, signum)  # to the driver alone
        sent = time.monotonic()
        process.wait(timeout=60)
        took = time.monotonic() - sent
        stderr = process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        if process.stderr is not None:
            process.stderr.close()
    assert process.returncode == exit_code, stderr
    assert took < 5.0, f"the sweep took {took:.1f} s to stop"  # not after the running cells
    _gone, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == [], f"pool workers left running: {[p.pid for p in alive]}"
    # One line: what was kept, and that the same command resumes it.
    kept = len(_finished(out))
    assert stderr.strip() == (
        f"{said}: {kept} of 12 cells are saved in {out}/cells; run the same command again to "
        "resume (saved cells are reused)"
    )
    resumed = subprocess.run(
        _sweep_command(grid, out), capture_output=True, text=True, timeout=300, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"({12 - kept} run, {kept} reused)" in resumed.stdout


TINY_GRID = f"""
profile = "{H100}"
policies = ["static:0", "goodput"]
max_concurrency = [1, 4, 8]
num_prompts_per_concurrency = 2
[[workloads]]
dataset = "mt-bench"
output_len = 32
"""


def _rows_by_id(out: Path, workers: int, grid: Path) -> dict[str, dict[str, object]]:
    cells = identify(expand_grid(load_grid(grid)))
    run = run_sweep_to_dir(cells, out, workers)
    assert run.num_computed == len(cells) and run.num_reused == 0
    return {str(row["cell_id"]): row for row in run.rows}


def test_cell_files_are_identical_whatever_the_pool_size(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    one = _rows_by_id(tmp_path / "one", 1, grid)
    two = _rows_by_id(tmp_path / "two", 2, grid)
    assert one.keys() == two.keys()
    for cell_id in one:
        assert one[cell_id]["metrics_json"] == two[cell_id]["metrics_json"], cell_id
        a = pd.read_parquet(tmp_path / "one" / "cells" / f"{cell_id}.ktrace.parquet")
        b = pd.read_parquet(tmp_path / "two" / "cells" / f"{cell_id}.ktrace.parquet")
        pd.testing.assert_frame_equal(a, b)


def test_a_cell_file_with_another_spec_or_damaged_is_recomputed(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    cells = identify(expand_grid(load_grid(grid)))
    out = tmp_path / "sweep"
    run_sweep_to_dir(cells, out, 1)
    # Cell 0's file now claims another spec; cell 1's file is truncated garbage.
    stale = pd.read_parquet(cell_file(out, cells[0].cell_id))
    stale["cell_spec_json"] = '{"other": true}'
    stale.to_parquet(cell_file(out, cells[0].cell_id), index=False)
    cell_file(out, cells[1].cell_id).write_bytes(b"PAR1 not really")
    again = run_sweep_to_dir(cells, out, 1)
    assert (again.num_computed, again.num_reused) == (2, len(cells) - 2)
    for cell in cells[:2]:
        row = pd.read_parquet(cell_file(out, cell.cell_id))
        assert row["cell_spec_json"].iloc[0] == cell.spec_json


def test_changing_the_grid_gives_new_cell_ids(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    ids = {c.cell_id for c in identify(expand_grid(load_grid(grid)))}
    grid.write_text(TINY_GRID.replace("output_len = 32", "output_len = 33"))
    changed = {c.cell_id for c in identify(expand_grid(load_grid(grid)))}
    assert ids.isdisjoint(changed)
    # Same content in another folder: same ids (content-derived, not path-derived).
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "grid.toml").write_text(TINY_GRID)
    assert {c.cell_id for c in identify(expand_grid(load_grid(other / "grid.toml")))} == ids
