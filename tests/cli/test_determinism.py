"""Same seed, same inputs -> byte-identical results across processes, one test per command.

Each command runs twice in fresh `python -m dsd.cli` subprocesses (no state shared through
imports, caches or RNG), and the outputs are compared byte for byte. Wall-clock fields (real
runs, training time) are the only thing removed before comparing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
H100 = REPO_ROOT / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"


def _dsd(args: list[str], cwd: Path) -> bytes:
    completed = subprocess.run(
        [sys.executable, "-m", "dsd.cli", *args],
        cwd=cwd,
        capture_output=True,
        timeout=300,
        check=False,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr.decode(errors="replace")[-2000:]
    return completed.stdout


def _twice(args: list[str], tmp_path: Path) -> tuple[Path, Path, bytes, bytes]:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    return first, second, _dsd(args, first), _dsd(args, second)


def _without_wall_times(value: Any) -> Any:
    """Drop keys that measure the wall clock (they legitimately differ run to run)."""
    wall = ("wall", "elapsed", "duration", "_s_wall", "time_s", "seconds", "throughput", "date")
    if isinstance(value, dict):
        return {
            key: _without_wall_times(item)
            for key, item in value.items()
            if not any(word in key for word in wall)
        }
    if isinstance(value, list):
        return [_without_wall_times(item) for item in value]
    return value


@pytest.mark.parametrize(
    ("command", "out_name"),
    [
        (["traces", "export", "azure-conv", "--num-rows", "200", "--seed", "7"], "w.jsonl"),
        (["traces", "convert", "random", "--num-prompts", "50", "--seed", "7",
          "--random-range-ratio", "0.5", "--request-rate", "3"], "w.csv"),
        (["traces", "convert", "azure-code", "--fraction", "0.01", "--seed", "7"], "w.parquet"),
    ],
)  # fmt: skip
def test_traces_outputs_are_byte_identical_for_the_same_seed(
    command: list[str], out_name: str, tmp_path: Path
) -> None:
    first, second, _, _ = _twice([*command, "--out", out_name], tmp_path)
    assert (first / out_name).read_bytes() == (second / out_name).read_bytes()


def test_simulate_json_is_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    args = ["simulate", "--profile", str(H100), "--policy", "goodput", "--dataset-name",
            "random", "--num-prompts", "60", "--max-concurrency", "8", "--random-range-ratio",
            "0.5", "--random-input-len", "256", "--random-output-len", "64",
            "--latency-jitter", "0.05", "--seed", "11", "--json"]  # fmt: skip
    _, _, out_a, out_b = _twice(args, tmp_path)
    assert out_a == out_b
    assert json.loads(out_a)["completed"] == 60


def test_sweep_table_is_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    args = ["sweep", "--profile", str(H100), "--out", "grid", "--policies", "static:1,goodput",
            "--max-concurrency", "1,4", "--num-prompts", "8", "--dataset-name", "random",
            "--random-input-len", "64", "--random-output-len", "16", "--workers", "1",
            "--seed", "3"]  # fmt: skip
    first, second, _, _ = _twice(args, tmp_path)
    tables_a = sorted(p for p in (first / "grid").rglob("*") if p.suffix in (".csv", ".md"))
    assert tables_a, "sweep wrote no table"
    for path in tables_a:
        twin = second / path.relative_to(first)
        assert path.read_bytes() == twin.read_bytes(), path.name


@pytest.mark.slow
def test_zoo_train_weights_are_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    args = ["zoo", "train", "--out", "pair", "--steps", "3", "--batch-size", "2", "--seq-len",
            "32", "--max-corpus-chars", "30000", "--eval-windows", "2", "--eval-k", "2",
            "--target-config", "hidden=32,layers=1,heads=2,ffn=64",
            "--draft-config", "hidden=16,layers=1,heads=2,ffn=32", "--seed", "5"]  # fmt: skip
    first, second, _, _ = _twice(args, tmp_path)
    weights = sorted((first / "pair").rglob("*.safetensors"))
    assert weights
    for path in weights:
        assert path.read_bytes() == (second / path.relative_to(first)).read_bytes(), path.name
    for path in sorted((first / "pair").rglob("*.json")):
        a = _without_wall_times(json.loads(path.read_text()))
        b = _without_wall_times(json.loads((second / path.relative_to(first)).read_text()))
        assert a == b, path.name


def test_run_tokens_and_acceptance_are_identical_for_the_same_seed(tmp_path: Path) -> None:
    args = ["run", "--target", "tiny", "--draft", "early-exit:1", "--policy", "static:2",
            "--num-spec-tokens", "2", "--num-prompts", "3", "--output-len", "8",
            "--max-model-len", "256", "--dataset-name", "mt-bench", "--temperature", "0.8",
            "--seed", "9", "--json"]  # fmt: skip
    _, _, out_a, out_b = _twice(args, tmp_path)
    a, b = json.loads(out_a), json.loads(out_b)
    keys = ("completed", "total_output_tokens", "spec_decode_acceptance_length",
            "spec_decode_per_position_acceptance_rates", "k_histogram", "num_steps")  # fmt: skip
    assert "total_output_tokens" in a
    for key in keys:
        if key in a:
            assert a[key] == b[key], key
    assert _without_wall_times(a).keys() == _without_wall_times(b).keys()
