"""Export: table round trip, vLLM custom JSONL, exact-length synthetic prompts, summaries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.traces.export import (
    SYNTHETIC_WORDS,
    summarize,
    synthetic_prompt,
    write_vllm_custom_jsonl,
    write_workload_table,
)
from dsd.traces.loaders import TOKENIZER_PATH, load_workload_file
from dsd.traces.registry import build_workload


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("name", ["mt-bench", "azure-code", "rl-rollout"])
def test_table_round_trip_preserves_the_workload(tmp_path: Path, suffix: str, name: str) -> None:
    workload = build_workload(
        name, num_prompts=60, request_rate=3.0 if name == "mt-bench" else float("inf")
    )
    path = tmp_path / f"w{suffix}"
    write_workload_table(workload, path)
    loaded = load_workload_file(path)
    assert [(r.prompt_len, r.output_len, r.tag, r.prompt) for r in loaded.requests] == [
        (r.prompt_len, r.output_len, r.tag, r.prompt) for r in workload.requests
    ]
    np.testing.assert_allclose(
        [r.arrival_s for r in loaded.requests], [r.arrival_s for r in workload.requests], rtol=1e-8
    )


def test_custom_jsonl_has_vllm_fields_and_reads_back(tmp_path: Path) -> None:
    workload = build_workload("azure-conv", num_prompts=30)
    path = tmp_path / "azure.jsonl"
    write_vllm_custom_jsonl(workload, path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 30
    assert all(isinstance(row["prompt"], str) and row["output_tokens"] >= 1 for row in rows)
    assert len({row["prompt"] for row in rows}) == 30  # distinct prompts: no shared prefixes
    loaded = load_workload_file(path)
    assert [(r.prompt_len, r.output_len) for r in loaded.requests] == [
        (r.prompt_len, r.output_len) for r in workload.requests
    ]


def test_synthetic_prompts_have_exact_smollm2_token_counts() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER_PATH))
    assert all(len(tokenizer.encode(word).ids) == 1 for word in SYNTHETIC_WORDS)
    cases = [(1, 0), (3, 65535), (4, 1234), (17, 7), (1000, 40_000), (32_768, 3)]
    for num_tokens, index in cases:
        assert len(tokenizer.encode(synthetic_prompt(num_tokens, index)).ids) == num_tokens


def test_synthetic_prompts_differ_by_index() -> None:
    prompts = {synthetic_prompt(8, index) for index in range(4096)}
    assert len(prompts) == 4096


def test_bad_output_suffixes_raise(tmp_path: Path) -> None:
    workload = build_workload("eagle-qa")
    with pytest.raises(InputError, match=r"\.csv or \.parquet"):
        write_workload_table(workload, tmp_path / "w.json")
    with pytest.raises(InputError, match=r"\.jsonl"):
        write_vllm_custom_jsonl(workload, tmp_path / "w.json")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_summary_of_a_trace() -> None:
    summary = summarize(build_workload("azure-code"))
    assert summary.num_requests == 8819
    assert summary.duration_s / 60 == pytest.approx(57.27, abs=0.01)
    assert summary.request_rate == pytest.approx(8819 / summary.duration_s)
    assert summary.prompt.p50 == 1469 and summary.output.p50 == 13
    assert summary.prompt.p50 <= summary.prompt.p90 <= summary.prompt.p99 <= summary.prompt.max
    assert summary.tags == {"azure-code": 8819}
