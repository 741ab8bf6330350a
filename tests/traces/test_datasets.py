"""Prompt sets with shipped token lengths, and vLLM bench's random dataset."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.traces.datasets import (
    DEFAULT_OUTPUT_LEN,
    PROMPT_LENGTHS_PATH,
    PROMPT_SET_NAMES,
    PROMPT_SET_REFERENCE_READERS,
    PROMPTS_DIR,
    RandomLengths,
    load_prompt_set,
    prompt_set_workload,
    random_workload,
)
from dsd.traces.registry import build_workload

MT_BENCH_CATEGORIES = {
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
}  # fmt: skip


def test_mt_bench_has_80_prompts_10_per_category_and_256_output_tokens() -> None:
    workload = prompt_set_workload("mt-bench")
    assert len(workload.requests) == 80
    tags = [r.tag for r in workload.requests]
    assert set(tags) == MT_BENCH_CATEGORIES
    assert all(tags.count(category) == 10 for category in MT_BENCH_CATEGORIES)
    assert all(r.output_len == DEFAULT_OUTPUT_LEN == 256 for r in workload.requests)
    assert all(r.arrival_s == 0.0 and r.prompt for r in workload.requests)
    assert workload.requests[0].prompt.startswith("Compose an engaging travel blog post")


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("mt-bench", 80),  # FastChat first turns
        ("spec-bench", 480),  # 6 tasks x 80
        ("humaneval", 164),  # all HumanEval problems
        ("gsm8k", 1319),  # GSM8K test split
        ("eagle-gsm8k", 80),  # EAGLE's subsets
        ("eagle-humaneval", 80),
        ("eagle-qa", 80),
        ("eagle-sum", 80),
        ("instructcoder", 194),  # InstructCoder's EditEval tasks
    ],
)
def test_every_prompt_set_loads_with_positive_lengths(name: str, size: int) -> None:
    records = load_prompt_set(name)
    assert len(records) == size
    assert all(r.raw_len >= 1 and r.chat_len > r.raw_len for r in records)


def test_chat_template_adds_the_same_system_preamble_to_every_prompt() -> None:
    # SmolLM2's template adds a fixed system turn and role markers: 29-30 tokens (one fewer when
    # the text's last character merges with the following newline)
    for name in PROMPT_SET_NAMES:
        extra = {r.chat_len - r.raw_len for r in load_prompt_set(name)}
        assert extra <= {29, 30}, name


def test_only_sets_with_references_have_per_prompt_output_lengths() -> None:
    for name in PROMPT_SET_NAMES:
        has_references = name in PROMPT_SET_REFERENCE_READERS
        lengths = {r.output_len is not None for r in load_prompt_set(name)}
        assert lengths == {has_references}, name
        if not has_references:
            workload = prompt_set_workload(name)
            assert {r.output_len for r in workload.requests} == {DEFAULT_OUTPUT_LEN}, name


def _instructcoder_rows() -> list[dict[str, str]]:
    path = PROMPTS_DIR / "instructcoder_edit_eval.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_instructcoder_loads_194_edit_tasks_with_the_stored_lengths() -> None:
    workload = prompt_set_workload("instructcoder")
    entry = json.loads(PROMPT_LENGTHS_PATH.read_text(encoding="utf-8"))["datasets"]["instructcoder"]
    assert len(workload.requests) == entry["num_prompts"] == 194
    assert [r.prompt_len for r in workload.requests] == entry["chat_len"]
    assert [r.output_len for r in workload.requests] == entry["output_len"]
    raw = prompt_set_workload("instructcoder", chat_template=False)
    assert [r.prompt_len for r in raw.requests] == entry["raw_len"]
    assert {r.tag for r in workload.requests} == {"code-edit"}
    assert all(r.arrival_s == 0.0 for r in workload.requests)
    # the reference answers are real code, not a constant: lengths vary, none is the default
    assert len(set(entry["output_len"])) > 50 and min(entry["output_len"]) >= 1


def test_instructcoder_prompt_is_instruction_blank_line_then_fenced_code() -> None:
    rows = _instructcoder_rows()
    texts = [r.prompt or "" for r in prompt_set_workload("instructcoder").requests]
    assert texts == [
        row["instruction"].strip() + "\n\n```python\n" + row["input"].rstrip() + "\n```"
        for row in rows
    ]
    assert texts[0].startswith("Change the function so that it checks if all numbers")
    assert "\n\n```python\nfrom typing import List\n\ndef has_close_elements(" in texts[0]
    assert texts[0].endswith("    return False\n```")


def test_instructcoder_output_lengths_follow_the_references_unless_overridden() -> None:
    references = [row["output"] for row in _instructcoder_rows()]
    assert PROMPT_SET_REFERENCE_READERS["instructcoder"]() == references
    stored = [r.output_len for r in load_prompt_set("instructcoder")]
    # cycling and shuffling carry each prompt's own reference length along
    cycled = prompt_set_workload("instructcoder", num_prompts=400)
    assert [r.output_len for r in cycled.requests] == [stored[i % 194] for i in range(400)]
    shuffled = build_workload("instructcoder", shuffle=True, seed=4)
    by_text = {r.prompt: r.output_len for r in cycled.requests}
    assert all(r.output_len == by_text[r.prompt] for r in shuffled.requests)
    # an explicit output length (--output-len) overrides every request
    for workload in (
        prompt_set_workload("instructcoder", output_len=64),
        build_workload("instructcoder", num_prompts=300, output_len=64),
    ):
        assert {r.output_len for r in workload.requests} == {64}


def test_stale_reference_lengths_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    edited = [text + " # edited" for text in PROMPT_SET_REFERENCE_READERS["instructcoder"]()]
    monkeypatch.setitem(PROMPT_SET_REFERENCE_READERS, "instructcoder", lambda: edited)
    with pytest.raises(InputError, match="do not match the reference answers"):
        load_prompt_set.__wrapped__("instructcoder")


def test_raw_prompt_option_uses_raw_lengths() -> None:
    raw = prompt_set_workload("mt-bench", chat_template=False)
    chat = prompt_set_workload("mt-bench")
    assert [r.prompt_len + 30 for r in raw.requests] == [r.prompt_len for r in chat.requests]


def test_more_prompts_than_the_set_cycles_in_file_order() -> None:
    workload = prompt_set_workload("mt-bench", num_prompts=200, output_len=64)
    texts = [r.prompt for r in workload.requests]
    assert texts[80:160] == texts[:80] and texts[160:] == texts[:40]
    assert all(r.output_len == 64 for r in workload.requests)


def test_shuffle_is_a_seeded_permutation() -> None:
    first = prompt_set_workload("mt-bench", shuffle=True, rng=np.random.default_rng(3))
    again = prompt_set_workload("mt-bench", shuffle=True, rng=np.random.default_rng(3))
    plain = prompt_set_workload("mt-bench")
    assert first == again
    assert first != plain
    assert sorted(r.prompt or "" for r in first.requests) == sorted(
        r.prompt or "" for r in plain.requests
    )


def test_unknown_prompt_set_lists_known_names() -> None:
    with pytest.raises(InputError, match="known: mt-bench"):
        prompt_set_workload("mt_bench")


@pytest.mark.parametrize(
    ("input_len", "output_len", "ratio"),
    [
        (1024, 128, 0.0),  # vLLM default: fixed lengths
        (1000, 200, 0.5),  # [500, 1500] and [100, 300]
        (100, 1, 0.9),  # output low end clamps to 1
        (7, 3, 0.3),  # floor/ceil on non-integer bounds: [4, 10] and [2, 4]
    ],
)
def test_random_lengths_stay_in_vllm_bounds(input_len: int, output_len: int, ratio: float) -> None:
    lengths = RandomLengths(input_len, output_len, ratio)
    workload = random_workload(4000, lengths, rng=np.random.default_rng(0))
    prompt_lens = np.array([r.prompt_len for r in workload.requests])
    output_lens = np.array([r.output_len for r in workload.requests])
    input_low, input_high = math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio))
    output_low = max(1, math.floor(output_len * (1 - ratio)))
    output_high = max(1, math.ceil(output_len * (1 + ratio)))
    assert prompt_lens.min() == input_low and prompt_lens.max() == input_high
    assert output_lens.min() == output_low and output_lens.max() == output_high


def test_random_dataset_is_seeded() -> None:
    lengths = RandomLengths(100, 50, 0.5)
    first = random_workload(100, lengths, rng=np.random.default_rng(5))
    assert first == random_workload(100, lengths, rng=np.random.default_rng(5))
    assert first != random_workload(100, lengths, rng=np.random.default_rng(6))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"range_ratio": 1.0}, "random_range_ratio"),  # vLLM requires r < 1
        ({"range_ratio": -0.1}, "random_range_ratio"),  # negative ratio
        ({"input_len": 0}, "random_input_len"),  # empty prompts
        ({"output_len": 0}, "random_output_len"),  # empty outputs
        ({"input_len": 1, "range_ratio": 0.5}, "random_input_len"),  # floor(0.5) = 0 tokens
    ],
)
def test_bad_random_lengths_raise(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InputError, match=field):
        RandomLengths(**kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
def test_shipped_lengths_equal_a_fresh_tokenization() -> None:
    # prompt lengths of every set and the reference-answer output lengths (instructcoder)
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    from dsd.traces.scripts.compute_prompt_lengths import compute_lengths

    shipped = json.loads(PROMPT_LENGTHS_PATH.read_text(encoding="utf-8"))
    fresh = compute_lengths()
    datasets = fresh["datasets"]
    assert isinstance(datasets, dict) and set(datasets) == set(PROMPT_SET_NAMES)
    for name, entry in datasets.items():
        assert ("output_len" in entry) == (name in PROMPT_SET_REFERENCE_READERS), name
    assert shipped == fresh
