"""`dsd report` on a small swept folder (tables, envelope distances, PNGs, the commands), the
Pareto frontier helper, and the Ray path on a local two-CPU Ray when ray is installed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from dsd.cli import main
from dsd.cli import report as cmd_report
from dsd.cli import simulate as cmd_sim
from dsd.reports.paired import paired_gap
from dsd.reports.report import envelope_table, pareto_frontier

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
GRID = f"""
profile = "{H100}"
policies = ["static:0", "static:3", "goodput"]
max_concurrency = [1, 4]
num_prompts_per_concurrency = 2
[[workloads]]
dataset = "mt-bench"
output_len = 32
"""


def _app() -> typer.Typer:
    app = typer.Typer()
    cmd_sim.register(app)
    cmd_report.register(app)
    return app


def test_report_has_tables_envelope_distance_plots_and_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "sweep"
    # Through the entry point, which records the command line each output states.
    main(["sweep", "--grid", str(grid), "--out", str(out), "--workers", "1"])
    main(["report", str(out)])
    text = (out / "report.md").read_text()
    assert "dsd sweep" in text and "dsd report" in text  # the commands that produced it
    assert "6 of 6 cells finished." in text
    assert "| max_concurrency | static:0 | static:3 | goodput |" in text
    # Envelope: best static K per C and goodput's distance in %.
    envelope = re.search(r"\| max_concurrency \| best_static_k \|.*?\n\n", text, re.S)
    assert envelope is not None
    rows = [line.split("|")[1:-1] for line in envelope.group(0).splitlines()[2:] if line]
    assert [int(r[0]) for r in rows] == [1, 4]
    assert all(int(r[1]) in (0, 3) for r in rows)
    for row in rows:  # distance = (goodput - envelope) / envelope, in %
        envelope_ms, goodput_ms, distance = float(row[2]), float(row[3]), float(row[4])
        assert distance == pytest.approx((goodput_ms - envelope_ms) / envelope_ms * 100, abs=0.1)
    for name in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "Cell `" in text and "k_trace.png" in text


def test_report_rejects_an_unknown_k_trace_cell_and_a_non_sweep_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["report", str(tmp_path)])
    assert result.exit_code != 0
    assert "grid.resolved.json: no such file" in str(result.exception)


@pytest.mark.parametrize(
    ("throughput", "tpot", "expected"),
    [
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0, 1, 2]),  # a clean trade-off: all on it
        ([3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [0]),  # one cell dominates
        ([2.0, 2.0, 1.0], [1.0, 1.0, 0.5], [2, 0]),  # ties: one of the equal cells
    ],
)
def test_pareto_frontier_keeps_only_undominated_cells(
    throughput: list[float], tpot: list[float], expected: list[int]
) -> None:
    got = pareto_frontier(np.array(throughput), np.array(tpot))
    assert list(got) == expected


@pytest.mark.slow
def test_ray_path_gives_the_local_pool_results(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    runner = CliRunner()
    local = runner.invoke(
        _app(), ["sweep", "--grid", str(grid), "--out", str(tmp_path / "a"), "--workers", "2"]
    )
    on_ray = runner.invoke(
        _app(),
        ["sweep", "--grid", str(grid), "--out", str(tmp_path / "b"), "--workers", "2", "--ray"],
    )
    assert local.exit_code == 0 and on_ray.exit_code == 0, on_ray.output
    for name in ("sweep.csv", "sweep.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def _frame(num_seeds: int) -> pd.DataFrame:
    """static:0, static:3 and goodput at C = 1, 4 over `num_seeds` sweep seeds."""
    rows = []
    for seed in range(num_seeds):
        for c in (1, 4):
            base = 10.0 * c + seed  # seeds differ a lot, pairs much less
            for policy, tpot in (
                ("static:0", base + 3.0),
                ("static:3", base),
                ("goodput", base * (1.0 + 0.01 * (seed - 1))),
            ):
                row = {"policy": policy, "max_concurrency": c, "sweep_seed": seed}
                rows.append({**row, "mean_tpot_ms": tpot})
    return pd.DataFrame(rows)


def test_envelope_table_adds_the_paired_interval_with_several_seeds() -> None:
    table = envelope_table(_frame(3))
    assert table is not None
    assert table["best_static_k"].tolist() == [3, 3]
    column = "goodput ± % (95%, paired seeds)"
    for c, width in zip(table["max_concurrency"], table[column], strict=True):
        ref = [10.0 * c + s for s in range(3)]
        mine = [r * (1.0 + 0.01 * (s - 1)) for s, r in enumerate(ref)]
        assert width == pytest.approx(100 * paired_gap(mine, ref).half_width)
    single = envelope_table(_frame(1))
    assert single is not None and column not in single.columns


def test_paired_gap_needs_the_same_seeds_on_both_sides() -> None:
    with pytest.raises(ValueError, match="same seeds"):
        paired_gap([1.0, 2.0], [1.0])


def _write_trace(folder: Path, cell_id: str, mean_k: list[float]) -> None:
    from dsd.reports.sweep import k_trace_file

    steps = len(mean_k)
    trace = pd.DataFrame(
        {
            "step_index": range(steps),
            "start_s": np.arange(steps) * 0.01,
            "duration_s": [0.01] * steps,
            "batch_size": [4] * steps,
            "num_decode_reqs": [4] * steps,
            "k_min": [int(k) for k in mean_k],
            "k_max": [int(np.ceil(k)) for k in mean_k],
            "mean_k": mean_k,
        }
    )
    path = k_trace_file(folder, cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    trace.to_parquet(path)


def test_the_k_trace_cell_is_the_one_whose_k_moves_most(tmp_path: Path) -> None:
    from dsd.reports.report import default_k_trace_cell, k_movement

    frame = pd.DataFrame(
        {
            "variant": ["base"] * 4,
            "policy": ["goodput", "online", "hysteresis:goodput", "static:3"],
            "max_concurrency": [4, 4, 16, 4],
            "request_rate": [np.inf] * 4,
            "scheduling": ["sync"] * 4,
            "cell_id": ["flat", "moves", "moves-more", "static"],
        }
    )
    _write_trace(tmp_path, "flat", [3.0] * 6)
    _write_trace(tmp_path, "moves", [3.0, 3.0, 2.0, 2.0, 3.0, 3.0])
    _write_trace(tmp_path, "moves-more", [4.0, 1.0, 4.0, 1.0, 4.0, 1.0])
    _write_trace(tmp_path, "static", [3.0] * 6)
    assert k_movement(pd.read_parquet(tmp_path / "cells" / "flat.ktrace.parquet")) == 0.0
    assert default_k_trace_cell(frame, tmp_path) == "moves-more"
    # Where no K moves, the first non-static cell at the median C, as before.
    for cell_id in ("moves", "moves-more"):
        _write_trace(tmp_path, cell_id, [2.0] * 6)
    assert default_k_trace_cell(frame, tmp_path) == "flat"


def test_plots_label_k_and_b_with_integer_ticks_and_each_point_with_its_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsd.reports import report

    figures: list = []  # type: ignore[type-arg]
    monkeypatch.setattr(report, "figure_png_bytes", lambda figure, dpi: figures.append(figure))
    trace = pd.DataFrame(
        {"start_s": [0.0, 0.1, 0.2], "batch_size": [1, 3, 2], "num_decode_reqs": [1, 3, 2],
         "k_max": [3, 3, 3], "mean_k": [3.0, 3.0, 3.0]}
    )  # fmt: skip
    report._k_trace_plot(trace, "flat K")
    axis = figures[0].axes[0]
    assert [text.get_text() for text in axis.get_legend().get_texts()] == [
        "mean K (decode rows)",
        "batch size B",
    ]
    ticks = [tick for tick in axis.get_yticks() if axis.get_ylim()[0] <= tick <= axis.get_ylim()[1]]
    assert ticks and all(float(tick).is_integer() for tick in ticks) and len(ticks) >= 2
    group = pd.DataFrame(
        {"policy": ["static:0", "static:0", "goodput"], "max_concurrency": [1, 16, np.nan],
         "mean_tpot_ms": [5.0, 9.0, 7.0], "output_throughput": [100.0, 900.0, 500.0]}
    )  # fmt: skip
    report._frontier_plot(group, "frontier")
    labels = sorted(text.get_text() for text in figures[1].axes[0].texts)
    assert labels == ["C=1", "C=16", "no cap"]
