"""`dsd sweep` end to end on a tiny grid: table + PNG written, deterministic across worker
counts, bad inputs fail before anything runs; and `reports.sweep` seeds per cell."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_simulate import H100, run_cli

from dsd.reports.sweep import cell_seed, sweep_cells
from dsd.sim.config import RunConfig

TINY = [
    "sweep",
    "--profile",
    str(H100),
    "--policies",
    "static:0,goodput",
    "--max-concurrency",
    "1,4",
    "--num-prompts-per-concurrency",
    "2",
    "--output-len",
    "32",
]


def test_sweep_writes_table_markdown_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "sweep"
    code, out, err = run_cli([*TINY, "--workers", "2", "--out", str(out_dir)], capsys)
    assert code == 0, err
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == [
        "cells",
        "grid.resolved.json",
        "sweep.csv",
        "sweep.md",
        "sweep_config.json",
        "tpot_vs_concurrency.png",
    ]
    # One result file and one K trace per cell.
    assert len(list((out_dir / "cells").glob("*.ktrace.parquet"))) == 4
    assert len(list((out_dir / "cells").glob("*.parquet"))) == 8
    table = pd.read_csv(out_dir / "sweep.csv")
    assert list(zip(table["policy"], table["max_concurrency"], strict=True)) == [
        ("static:0", 1),
        ("goodput", 1),
        ("static:0", 4),
        ("goodput", 4),
    ]
    assert list(table["num_prompts"]) == [2, 2, 8, 8]
    assert (table["completed"] == table["num_prompts"]).all()
    for column in ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms"):
        assert (table[column] > 0).all()
    assert {"output_throughput", "acceptance_length"} <= set(table)
    # Policies at one concurrency share the cell seed (common random numbers).
    assert table.groupby("max_concurrency")["seed"].nunique().eq(1).all()
    markdown = (out_dir / "sweep.md").read_text()
    assert markdown.startswith("| policy | max_concurrency |") and markdown.count("\n") == 6
    assert (out_dir / "tpot_vs_concurrency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "4 cells" in out


def test_sweep_is_deterministic_whatever_the_worker_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code_a, _, _ = run_cli([*TINY, "--workers", "2", "--out", str(tmp_path / "a")], capsys)
    code_b, _, _ = run_cli([*TINY, "--workers", "1", "--out", str(tmp_path / "b")], capsys)
    assert code_a == code_b == 0
    for name in ("sweep.csv", "sweep.md", "tpot_vs_concurrency.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policies", "static:0,bogus"], "unknown policy"),  # one bad SPEC in the list
        (["--max-concurrency", "1,x"], "--max-concurrency"),  # not an integer
        (["--max-concurrency", "4,4"], "duplicate"),  # the same cell twice
        (["--num-prompts", "3"], "give one of --num-prompts"),  # conflicting prompt counts
        (["--workers", "0"], "--workers"),  # no workers
        (["--dataset-name", "nope"], "unknown workload"),  # bad dataset
    ],
)
def test_sweep_bad_inputs_fail_with_one_line_and_no_folder(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "sweep"
    code, out, err = run_cli([*TINY, *extra, "--out", str(out_dir)], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert not out_dir.exists()


def test_another_grid_into_a_sweep_folder_is_refused_and_the_same_grid_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "sweep"
    code, _, err = run_cli([*TINY, "--out", str(out_dir)], capsys)
    assert code == 0, err
    before = {path.name: path.read_bytes() for path in out_dir.iterdir() if path.is_file()}
    cells_before = sorted(path.name for path in (out_dir / "cells").iterdir())
    other = [*TINY]
    other[other.index("static:0,goodput")] = "static:0,static:2"
    code, out, err = run_cli([*other, "--out", str(out_dir)], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {out_dir} holds another sweep")
    assert "policies static:0,goodput there, static:0,static:2 here" in lines[0]
    assert "give a new --out" in lines[0]
    # nothing replaced, no cell of the other grid beside the old ones
    assert before == {path.name: path.read_bytes() for path in out_dir.iterdir() if path.is_file()}
    assert sorted(path.name for path in (out_dir / "cells").iterdir()) == cells_before
    # other settings than policies and concurrencies are named too
    code, _, err = run_cli([*TINY, "--seed", "7", "--out", str(out_dir)], capsys)
    assert code == 2 and "settings differ: seed" in err, err
    code, _, err = run_cli([*TINY, "--output-len", "16", "--out", str(out_dir)], capsys)
    assert code == 2 and "settings differ: output_len" in err, err
    # the same grid resumes: every cell reused
    code, out, err = run_cli([*TINY, "--out", str(out_dir)], capsys)
    assert code == 0, err
    assert "(0 run, 4 reused)" in out


def test_cell_seeds_depend_on_seed_and_concurrency_only() -> None:
    base = RunConfig(profile=str(H100), policy="static:0")
    cells = sweep_cells(base, ["static:0", "goodput"], [1, 16], num_prompts_per_concurrency=3)
    seeds = {(c.policy, c.max_concurrency): c.config.seed for c in cells}
    assert seeds[("static:0", 1)] == seeds[("goodput", 1)] == cell_seed(0, 1)
    assert seeds[("static:0", 1)] != seeds[("static:0", 16)]
    assert cell_seed(0, 16) != cell_seed(1, 16)
    assert [c.config.num_prompts for c in cells] == [3, 3, 48, 48]
    assert [c.index for c in cells] == [0, 1, 2, 3]


def test_ablation_report_runs_on_a_tiny_grid_and_rows_differ_as_documented(tmp_path: Path) -> None:
    from dsd.reports.ablation import main as ablation_main

    out_dir = tmp_path / "fidelity"
    argv = ["--out", str(out_dir), "--concurrency", "4", "--prompts-per-concurrency", "2"]
    ablation_main([*argv, "--workers", "1"])
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "ablation.csv",
        "ablation.png",
        "config.json",
        "report.md",
    ]
    table = pd.read_csv(out_dir / "ablation.csv")
    assert len(table) == 5 * 3  # rows x policies at one C
    tpot = table.set_index(["variant", "policy"])["mean_tpot_ms"]
    # Host overhead 0 removes 0.5 ms from every step: TPOT falls for every policy.
    for policy in ("static:0", "static:3", "goodput"):
        assert tpot[("host overhead 0", policy)] < tpot[("baseline", policy)]
    # Homogeneous acceptance changes nothing without drafts.
    assert tpot[("homogeneous acceptance", "static:0")] == tpot[("baseline", "static:0")]
    report = (out_dir / "report.md").read_text()
    assert report.startswith("# Fidelity ablation") and "python -m dsd.reports.ablation" in report


def test_a_policy_spec_with_several_keys_is_one_cell_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (before: sweep split "online:warmup_steps=10,decay=0.99" at every comma and failed on
    # "unknown policy 'decay=0.99'"; validate kept it whole: one parser now)
    argv = ["sweep", "--profile", str(H100), "--policies",
            "online:warmup_steps=10,decay=0.99,static:3", "--max-concurrency", "1",
            "--num-prompts", "4", "--workers", "1", "--out", str(tmp_path / "sw")]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert sorted(frame["policy"]) == ["online:warmup_steps=10,decay=0.99", "static:3"]
