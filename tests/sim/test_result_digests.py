"""Whole `dsd simulate` runs pinned by digest: result.json, requests.csv and steps.parquet's
columns hashed together, recorded before the per-step path was optimised.

These are the regression net for speed work on the simulator: any change to the scheduler,
executor, acceptance draws or metrics that moves one bit of one run fails here. A change that is
meant to alter results updates the digests in the same commit and says why.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dsd.cli import main

REPO = Path(__file__).resolve().parents[2]
PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"  # relative: result.json names it
BASE = ["simulate", "--profile", PROFILE, "--dataset-name", "mt-bench", "--seed", "0"]

CASES = {
    # benchmarks/whole_process.py's sd-arrivals case, at a tenth of its prompts
    "sd-arrivals": (
        "--policy goodput --max-concurrency 256 --num-prompts 2048 --request-rate 50",
        "1582dbda8b3eb2fab109a4852310a0a0f7aaa888c63879f063b5068ab8630c35",
    ),
    # its k0-per-step case: the jitter keeps every step on the one-by-one path
    "k0-per-step": (
        "--policy static:0 --max-concurrency 256 --num-prompts 2048 --latency-jitter 1e-9",
        "80e9047341fd7f79656ab7ca110d728e81d31be6b40cbff429e7779dc58ac9c1",
    ),
    # async scheduling, a KV pool small enough to preempt, K per request from a policy
    "async-preempting": (
        "--policy hysteresis:goodput --max-concurrency 64 --num-prompts 384 "
        "--request-rate 40 --scheduling async --num-kv-blocks 600",
        "5d2209fb92189c6adba2a24578c35ea3418206788ff39b3ad9c8687532f74a62",
    ),
    # per-position acceptance, a static K, all requests at once, step-cost jitter
    "static-per-position": (
        "--policy static:3 --max-concurrency 32 --num-prompts 256 "
        "--acceptance-model per-position --latency-jitter 0.05",
        "dbfd74d9276e162bb27fc1fc18ad7b60733635007d75335e0036c64d8822e63e",
    ),
    # the profile's recorded acceptance replayed
    "goodput-replay": (
        "--policy goodput --max-concurrency 16 --num-prompts 64 --acceptance-model replay",
        "9fed5dbfb95ba3148c7ff6c4ecf6d5cd7167b6101a6d543d30da2cb1c4d2aad5",
    ),
}


def run_digest(out: Path) -> str:
    """sha256 over the run's result (key order fixed), request rows and step columns."""
    digest = hashlib.sha256()
    result = json.loads((out / "result.json").read_text(), parse_constant=str)
    digest.update(json.dumps(result, sort_keys=True).encode())
    digest.update((out / "requests.csv").read_bytes())
    steps = pq.read_table(out / "steps.parquet")
    for name in steps.column_names:
        digest.update(name.encode())
        digest.update(steps.column(name).to_numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulate_results_are_bit_identical_to_the_recorded_digest(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, expected = CASES[name]
    monkeypatch.chdir(REPO)
    out = tmp_path / name
    try:
        main([*BASE, *flags.split(), "--out", str(out)])
    except SystemExit as stop:
        assert stop.code in (0, None), capsys.readouterr().err
    assert run_digest(out) == expected
