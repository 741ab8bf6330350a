"""Real-trace loaders: row counts and ranges on the shipped files, options, malformed rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.traces.loaders import (
    TRACE_FILES,
    TRACES_DIR,
    TraceOptions,
    load_azure_trace,
    load_mooncake_trace,
    load_trace,
    load_workload_file,
)
from dsd.traces.workload import Workload


def _arrivals(workload: Workload) -> np.ndarray:
    return np.array([r.arrival_s for r in workload.requests])


@pytest.mark.parametrize(
    ("name", "num_rows", "span_min"),
    [
        ("azure-code", 8_819, 57.27),  # Azure LLM inference 2023, code
        ("azure-conv", 19_366, 58.36),  # Azure LLM inference 2023, conversation
        ("mooncake-conversation", 12_031, 58.95),  # Mooncake FAST'25 conversation
        ("mooncake-synthetic", 3_993, 17.03),  # Mooncake synthetic: Poisson arrivals, 17 min
    ],
)
def test_shipped_traces_load_with_expected_rows_and_span(
    name: str, num_rows: int, span_min: float
) -> None:
    workload = load_trace(name)
    arrivals_s = _arrivals(workload)
    assert len(workload.requests) == num_rows
    assert arrivals_s[0] == 0.0
    assert np.all(np.diff(arrivals_s) >= 0)
    assert arrivals_s[-1] / 60 == pytest.approx(span_min, abs=0.01)
    assert min(r.prompt_len for r in workload.requests) >= 1
    assert min(r.output_len for r in workload.requests) >= 1
    assert {r.tag for r in workload.requests} == {name}


def test_file_loaders_match_named_loaders() -> None:
    azure = load_azure_trace(TRACES_DIR / TRACE_FILES["azure-code"][0])
    mooncake = load_mooncake_trace(TRACES_DIR / TRACE_FILES["mooncake-synthetic"][0])
    assert [r.prompt_len for r in azure.requests] == [
        r.prompt_len for r in load_trace("azure-code").requests
    ]
    assert _arrivals(mooncake).tolist() == _arrivals(load_trace("mooncake-synthetic")).tolist()
    assert load_workload_file(TRACES_DIR / "azure2023_conv.csv").requests[5].tag == "azure"


def test_azure_code_lengths_match_published_medians() -> None:
    # shared data README: Azure code context p50 1469, generated p50 13
    workload = load_trace("azure-code")
    assert np.median([r.prompt_len for r in workload.requests]) == 1469
    assert np.median([r.output_len for r in workload.requests]) == 13


def test_time_scale_divides_arrivals() -> None:
    plain = _arrivals(load_trace("azure-code"))
    fast = _arrivals(load_trace("azure-code", TraceOptions(time_scale=4.0)))
    np.testing.assert_allclose(fast, plain / 4.0)


def test_window_keeps_rows_in_range_and_rezeroes() -> None:
    plain = _arrivals(load_trace("azure-conv"))
    windowed = load_trace("azure-conv", TraceOptions(start_s=600.0, end_s=900.0))
    expected = plain[(plain >= 600.0) & (plain < 900.0)] - 600.0
    np.testing.assert_allclose(_arrivals(windowed), expected)
    assert _arrivals(windowed)[0] >= 0.0 and _arrivals(windowed)[-1] < 300.0


def test_caps_clip_lengths() -> None:
    capped = load_trace(
        "mooncake-conversation", TraceOptions(max_prompt_len=4096, max_output_len=64)
    )
    assert max(r.prompt_len for r in capped.requests) == 4096
    assert max(r.output_len for r in capped.requests) == 64


@pytest.mark.parametrize(
    "options",
    [
        TraceOptions(fraction=0.1, seed=11),  # keep ~10 %
        TraceOptions(num_rows=500, seed=11),  # keep exactly 500
    ],
)
def test_sampling_is_deterministic_per_seed_and_keeps_order(options: TraceOptions) -> None:
    first = load_trace("azure-conv", options)
    again = load_trace("azure-conv", options)
    other = load_trace(
        "azure-conv", TraceOptions(fraction=options.fraction, num_rows=options.num_rows, seed=12)
    )
    assert first == again
    assert first != other
    expected = 500 if options.num_rows else round(0.1 * 19_366)
    assert len(first.requests) == expected
    assert np.all(np.diff(_arrivals(first)) >= 0)


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_AZURE_ROW = "2023-11-16 18:17:03.9799600,4808,10\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # row on line 3 has a non-numeric ContextTokens
        (GOOD_AZURE_ROW + "2023-11-16 18:17:04.0,abc,10\n", "line 3: ContextTokens"),
        # zero generated tokens on line 2
        ("2023-11-16 18:17:04.0,100,0\n", "line 2: GeneratedTokens must be an integer >= 1"),
        # a broken timestamp on line 4
        (GOOD_AZURE_ROW * 2 + "yesterday,1,1\n", "line 4: TIMESTAMP"),
        # an extra field on line 3
        (GOOD_AZURE_ROW + "2023-11-16 18:17:04.0,1,1,9\n", "line 3: expected 3 fields, got 4"),
        # a blank line 3 inside the data
        (GOOD_AZURE_ROW + "\n" + GOOD_AZURE_ROW, "line 3: "),
        # fractional token count on line 2
        ("2023-11-16 18:17:04.0,12.5,3\n", "line 2: ContextTokens"),
    ],
)
def test_malformed_azure_rows_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad_azure.csv"
    path.write_text(AZURE_HEADER + body, encoding="utf-8")
    with pytest.raises(InputError, match=message) as raised:
        load_azure_trace(path)
    assert str(raised.value).startswith(f"{path}: ")  # the path as given, not its name
    assert "\n" not in str(raised.value)


def test_azure_missing_column_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "cols.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:04.0,1\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"cols\.csv: line 1: missing column 'GeneratedTokens'"):
        load_azure_trace(path)


GOOD_MOONCAKE = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # not JSON on line 2
        (GOOD_MOONCAKE + "{oops\n", "line 2 column 2: invalid JSON"),
        # missing output_length on line 3 (a blank line 2 is skipped but counted)
        (GOOD_MOONCAKE + "\n" + '{"timestamp": 5, "input_length": 3}\n', "line 3: output_length"),
        # negative timestamp on line 1
        ('{"timestamp": -1, "input_length": 3, "output_length": 1}\n', "line 1: timestamp"),
        # zero input length on line 2
        (
            GOOD_MOONCAKE + '{"timestamp": 1, "input_length": 0, "output_length": 1}\n',
            "line 2: input_length",
        ),
        # a boolean is not a count
        ('{"timestamp": 1, "input_length": true, "output_length": 1}\n', "line 1: input_length"),
        # a JSON array instead of an object on line 2
        (GOOD_MOONCAKE + "[1, 2]\n", "line 2: expected a JSON object"),
    ],
)
def test_malformed_mooncake_rows_name_file_and_line(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "bad_mooncake.jsonl"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(InputError, match=message) as raised:
        load_mooncake_trace(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_unsorted_rows_are_stably_sorted(tmp_path: Path) -> None:
    path = tmp_path / "unsorted.jsonl"
    path.write_text(
        '{"timestamp": 2000, "input_length": 1, "output_length": 1}\n'
        '{"timestamp": 1000, "input_length": 2, "output_length": 1}\n'
        '{"timestamp": 1000, "input_length": 3, "output_length": 1}\n',
        encoding="utf-8",
    )
    workload = load_mooncake_trace(path)
    assert [r.prompt_len for r in workload.requests] == [2, 3, 1]
    assert _arrivals(workload).tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("options_kwargs", "field"),
    [
        ({"time_scale": 0.0}, "time_scale"),  # would divide by zero
        ({"start_s": 10.0, "end_s": 5.0}, "end_s"),  # empty window
        ({"fraction": 1.5}, "fraction"),  # more than all rows
        ({"fraction": 0.5, "num_rows": 3}, "fraction and num_rows"),  # ambiguous
        ({"max_output_len": 0}, "max_output_len"),  # cap below one token
    ],
)
def test_bad_trace_options_raise(options_kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InputError, match=field):
        TraceOptions(**options_kwargs)  # type: ignore[arg-type]


def test_window_with_no_rows_raises() -> None:
    with pytest.raises(InputError, match="no rows left"):
        load_trace("mooncake-synthetic", TraceOptions(start_s=5000.0))


def test_custom_jsonl_reads_prompt_and_output_tokens(tmp_path: Path) -> None:
    path = tmp_path / "custom.jsonl"
    path.write_text(
        '{"prompt": "hello there", "output_tokens": 7, "prompt_len": 2}\n'
        '{"prompt": "no length given", "prompt_len": 3}\n',
        encoding="utf-8",
    )
    workload = load_workload_file(path)
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(2, 7), (3, 256)]
    assert workload.requests[0].prompt == "hello there"


def test_custom_jsonl_without_prompt_len_is_tokenized(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    path = tmp_path / "custom.jsonl"
    path.write_text('{"prompt": "Hello world", "output_tokens": 3}\n', encoding="utf-8")
    assert load_workload_file(path).requests[0].prompt_len == 2


def test_schema_csv_error_names_the_line_even_with_multiline_prompts(tmp_path: Path) -> None:
    path = tmp_path / "ours.csv"
    path.write_text(
        'prompt_len,output_len,arrival_s,tag,prompt\n3,4,0.0,a,"two\nlines"\n5,-1,0.5,b,x\n',
        encoding="utf-8",
    )
    with pytest.raises(InputError, match=r"ours\.csv: line 4: output_len"):
        load_workload_file(path)


def test_unsupported_suffix_and_unknown_jsonl_raise(tmp_path: Path) -> None:
    other = tmp_path / "w.txt"
    other.write_text("x", encoding="utf-8")
    with pytest.raises(InputError, match="unsupported file type"):
        load_workload_file(other)
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"a": 1}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"odd\.jsonl: line 1: neither"):
        load_workload_file(odd)
