"""benchmarks/envelope_gap.py on the tiny model: interleaved repeats, split figures, paired gaps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "tests/data/profiles/cpu_smollm2_ngram_2026-11-25.json"


def test_every_spec_runs_each_repeat_and_its_tpot_splits_at_prefill_steps(
    load_benchmark, tmp_path, capsys
) -> None:
    out = tmp_path / "gap.json"
    argv = ["--target", "tiny", "--draft", "ngram:2-6", "--profile", str(PROFILE)]
    argv += ["--concurrency", "2", "--static", "0,2", "--repeats", "2", "--json", str(out)]
    assert load_benchmark("envelope_gap").main(argv) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert set(row["measured"]) == {"static:0", "static:2", "goodput"}
    for spec, runs in row["measured"].items():
        assert len(runs) == 2
        for run in [*runs, row["simulated"][spec]]:
            assert run["decode_steps_ms"] + run["in_prefill_steps_ms"] == pytest.approx(
                run["tpot_ms"]
            )
        # greedy outputs, a policy that does not learn from time: the same work each repeat
        assert runs[0]["num_steps"] == runs[1]["num_steps"] > 0
    gaps = row["gaps"]["goodput"]
    assert set(gaps) == {"tpot_ms", "decode_steps_ms"}
    assert gaps["tpot_ms"]["best_static"] in {"static:0", "static:2"}
    assert result["threads"] and "goodput vs best static" in capsys.readouterr().out


def test_both_engines_run_interleaved_and_each_spec_gets_its_engine_gap(
    load_benchmark, tmp_path, capsys
) -> None:
    out = tmp_path / "engines.json"
    argv = ["--target", "tiny", "--draft", "ngram:2-6", "--profile", str(PROFILE)]
    argv += ["--concurrency", "2", "--static", "0", "--repeats", "2", "--json", str(out)]
    argv += ["--prefill-forward", "fused,separate"]
    assert load_benchmark("envelope_gap").main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    labels = {
        f"{spec}/{engine}" for spec in ("static:0", "goodput") for engine in ("fused", "separate")
    }
    assert set(row["measured"]) == labels
    for spec in ("static:0", "goodput"):
        # the engines differ in how a step runs, not in what it computes
        fused, separate = row["measured"][f"{spec}/fused"], row["measured"][f"{spec}/separate"]
        assert [r["num_tokens"] for r in fused] == [r["num_tokens"] for r in separate]
        assert row["engines"][spec]["base"] == f"{spec}/fused"
        # simulated: the separate engine pays a forward's fixed cost again in mixed steps
        simulated = row["simulated"]
        assert simulated[f"{spec}/separate"]["tpot_ms"] >= simulated[f"{spec}/fused"]["tpot_ms"]
        assert (
            simulated[f"{spec}/separate"]["in_prefill_steps_ms"]
            >= simulated[f"{spec}/fused"]["in_prefill_steps_ms"]
        )
    assert row["gaps"]["goodput/fused"]["tpot_ms"]["best_static"] == "static:0/fused"
    assert "static:0/separate vs static:0/fused on tpot_ms" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(load_benchmark, capsys) -> None:
    module = load_benchmark("envelope_gap")
    base = ["--target", "tiny", "--profile", str(PROFILE)]
    assert module.main([*base, "--repeats", "1"]) == 2
    assert module.main([*base, "--static", "0,0"]) == 2
    assert module.main([*base, "--policy", "goodput:acceptance=x"]) == 2
    assert module.main([*base, "--prefill-forward", "fused,fused"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: ") for line in err)
    assert "done" not in captured.err and captured.out == ""  # refused before any run
