"""benchmarks/k_lag_cost.py's real mode on the tiny model: paired rows, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "tests/data/profiles/cpu_smollm2_ngram_2026-11-25.json"


def test_real_mode_pairs_both_timings_and_records_their_work(
    load_benchmark, tmp_path, capsys
) -> None:
    out = tmp_path / "lag.json"
    argv = ["--target", "tiny", "--draft", "ngram:2-6", "--profile", str(PROFILE)]
    argv += ["--concurrency", "1", "--repeats", "2", "--policy", "per-request", "--json", str(out)]
    assert load_benchmark("k_lag_cost").main(argv) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["seeds"] == 2 and set(row["measured_tpot_ms"]) == {"next-step", "same-step"}
    # greedy outputs and a policy that learns from acceptance only: the same work every repeat
    for timing in ("next-step", "same-step"):
        first, second = row["work"][timing]
        assert first == second and first[0] > 0 and first[1] > first[0]
    assert "simulated_gap_pct" in row and result["threads"]
    assert "per-request" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(load_benchmark, capsys) -> None:
    module = load_benchmark("k_lag_cost")
    assert module.main(["--target", "tiny"]) == 2  # no --profile
    assert module.main(["--seeds", "1"]) == 2
    assert module.main(["--target", "tiny", "--profile", str(PROFILE), "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
