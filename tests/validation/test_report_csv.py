"""validation.report and validation.hardware CSV tables: a missing value is an empty field (never
the text `nan`), and rescore reads such a field, and an older report's `nan`, as missing."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pandas as pd

from dsd.validation.cells import CellResult
from dsd.validation.hardware import crossover, crossover_csv
from dsd.validation.report import write_validation_report
from dsd.validation.rescore import committed_level_lines


def _steps(mean_k: list[float]) -> pd.DataFrame:
    count = len(mean_k)
    return pd.DataFrame(
        {
            "step_index": range(count),
            "batch_size": [1] * count,
            "num_decode_reqs": [1] * count,
            "num_tokens": [1] * count,
            "num_spec_tokens": [0] * count,
            "num_accepted_tokens": [0] * count,
            "mean_k": mean_k,
            "duration_s": [0.002] * count,
            "execute_s": [0.001] * count,
        }
    )


def _cells() -> list[CellResult]:
    trials = ({"mean_tpot_ms": 10.0}, {"mean_tpot_ms": 12.0})
    return [
        CellResult(  # K = 0: no acceptance on either side, a step with no decode rows
            "static:0",
            2,
            {"mean_tpot_ms": 11.0, "acceptance_length": math.nan},
            {"mean_tpot_ms": 10.0, "acceptance_length": math.nan},
            measured_steps=_steps([math.nan, 0.0]),
            measured_trials=trials,
            trial_speeds=(1.0, math.inf),
        ),
        CellResult("goodput", 2, {"mean_tpot_ms": math.nan}, {"mean_tpot_ms": 9.0}),
    ]


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


def test_report_tables_write_missing_values_as_empty_fields(tmp_path: Path) -> None:
    write_validation_report(tmp_path, _cells(), {})
    for name in ("cells.csv", "trials.csv", "steps.csv"):
        assert "nan" not in (tmp_path / name).read_text().lower(), name
    static, goodput = _rows(tmp_path / "cells.csv")
    assert static["measured_acceptance_length"] == static["simulated_acceptance_length"] == ""
    assert static["measured_mean_tpot_ms"] == "11.0"
    assert goodput["measured_mean_tpot_ms"] == goodput["error_pct_mean_tpot_ms"] == ""
    assert [row["machine_speed"] for row in _rows(tmp_path / "trials.csv")] == ["1.0", ""]
    steps = _rows(tmp_path / "steps.csv")
    assert [row["mean_k"] for row in steps] == ["", "0.0"]
    assert [row["wall_ms"] for row in steps] == ["2.0", "2.0"]
    # rescore's reading of the committed side takes the empty field as missing
    lines = committed_level_lines(_rows(tmp_path / "cells.csv"), _rows(tmp_path / "trials.csv"))
    assert len(lines) == 1 and "over all 2 trials" in lines[0]


def test_rescore_reads_an_older_reports_nan_as_missing() -> None:
    rows = [
        {"policy": "static:0", "max_concurrency": "2", "measured_mean_tpot_ms": "nan",
         "simulated_mean_tpot_ms": "10.0"},
        {"policy": "static:2", "max_concurrency": "2", "measured_mean_tpot_ms": "",
         "simulated_mean_tpot_ms": "9.0"},
    ]  # fmt: skip
    trials = [
        {"policy": "static:0", "max_concurrency": "2", "mean_tpot_ms": "11.0"},
        {"policy": "static:0", "max_concurrency": "2", "mean_tpot_ms": "12.0"},
    ]
    assert len(committed_level_lines(rows, trials)) == 1


def test_crossover_table_writes_a_missing_tpot_as_an_empty_field() -> None:
    cells = [
        CellResult("static:0", 4, {"mean_tpot_ms": 10.0}, {}),
        CellResult("goodput", 4, {"mean_tpot_ms": math.nan}, {}),
    ]
    text = crossover_csv(crossover(cells))
    assert "nan" not in text.lower()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["policy"], r["mean_tpot_ms"], r["gap_to_envelope_pct"]) for r in rows] == [
        ("static:0", "10.0", "0.0"),
        ("goodput", "", ""),
    ]


def test_the_acceptance_length_interval_is_written_and_judged() -> None:
    """cells.csv carries the simulated AL interval and whether the measured AL lies inside;
    the report's interval sentence counts the cells that drafted (a profile whose prompts draft
    unlike the cells' shows there)."""
    from dsd.validation.report import cells_csv, interval_lines, tpot_error_summary

    def cell(policy: str, measured_al: float | None) -> CellResult:
        simulated = {"mean_tpot_ms": 10.0, "mean_tpot_ms_lo": 9.0, "mean_tpot_ms_hi": 11.0}
        measured = {"mean_tpot_ms": 10.5}
        if measured_al is not None:
            simulated |= {"acceptance_length": 2.0, "acceptance_length_lo": 1.8,
                          "acceptance_length_hi": 2.2}  # fmt: skip
            measured["acceptance_length"] = measured_al
        return CellResult(policy, 1, measured=measured, simulated=simulated)

    cells = [cell("static:0", None), cell("static:2", 2.1), cell("static:4", 2.9)]
    rows = list(csv.DictReader(io.StringIO(cells_csv(cells))))
    assert [r["measured_acceptance_length_inside_interval"] for r in rows] == ["", "1", "0"]
    row = rows[1]
    assert (row["simulated_acceptance_length_lo"], row["simulated_acceptance_length_hi"]) == (
        "1.8", "2.2"
    )  # fmt: skip
    sentence = interval_lines(cells, tpot_error_summary(cells))[0]
    assert "in 100% of 3 cells" in sentence
    assert (
        "acceptance length inside its 90% interval (the sampling alone) in 1 of 2 cells" in sentence
    )
