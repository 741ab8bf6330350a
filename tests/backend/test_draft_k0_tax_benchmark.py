"""benchmarks/draft_k0_tax.py on the tiny model: both engines decode the same tokens, every
step pair is timed, and bad input is one line with exit status 2."""

from __future__ import annotations

import json

import pytest


def test_both_engines_decode_the_same_tokens_and_every_pair_is_timed(
    load_benchmark, tmp_path, capsys
) -> None:
    out = tmp_path / "k0.json"
    argv = ["--target", "tiny", "--draft", "ngram:1-3", "--steps", "8", "--skip", "2"]
    assert load_benchmark("draft_k0_tax").main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["same_tokens"] is True and result["pairs"] == 6
    assert set(result["arms"]) == {"no draft", "ngram:1-3"}
    assert all(
        row["p10_ms"] <= row["median_ms"] <= row["p90_ms"] for row in result["arms"].values()
    )
    assert result["median_paired_ratio"] > 0 and result["settings"]["threads"]
    assert "paired ratios" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--steps", "3", "--skip", "3"], "--skip 3"),
        (["--k-max", "0"], "--k-max 0"),
        (["--draft", "none"], "--draft"),
        (["--draft", "NGRAM"], "write ngram"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(load_benchmark, capsys, argv, fragment) -> None:
    assert load_benchmark("draft_k0_tax").main(["--target", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err
