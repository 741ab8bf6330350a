"""Fuzz the trace and workload-file loaders: Azure CSV, Mooncake JSONL, our schema, vLLM JSONL.

Property: `load_workload_file` returns a Workload whose requests all have prompt_len >= 1,
output_len >= 1 and finite, non-negative, non-decreasing arrivals, or raises a one-line
InputError naming the file (and the line, for a bad row). Rows are generated valid and then
broken cell by cell (empty, NaN, negative, fractional, text, huge), lines are dropped or cut
short, and non-UTF-8 bytes are spliced in.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from fuzz_helpers import corrupted_bytes, count_case
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.traces.loaders import load_workload_file

# Cell texts that break a token count or a timestamp.
_BAD_CELLS = ("", "nan", "inf", "-1", "0", "1.5", "abc", "1e400", "99999999999999999999999",
              "²", " 7 ", '"', "2023-13-45 00:00:00")  # fmt: skip


@st.composite
def _csv_rows(
    draw: st.DrawFn, columns: tuple[str, ...], good: dict[str, st.SearchStrategy[str]]
) -> str:
    header = list(columns)
    if draw(st.integers(0, 9)) == 0:  # drop or rename a column now and then
        header[draw(st.integers(0, len(header) - 1))] = draw(st.sampled_from(("", "x", "Tokens")))
    lines = [",".join(header)]
    for _ in range(draw(st.integers(0, 6))):
        cells = [draw(good[column]) for column in columns]
        if draw(st.integers(0, 9)) == 0:
            cells[draw(st.integers(0, len(cells) - 1))] = draw(st.sampled_from(_BAD_CELLS))
        if draw(st.integers(0, 9)) == 0:
            cells = cells[: draw(st.integers(0, len(cells)))]  # a short row
        lines.append(",".join(cells))
    if draw(st.integers(0, 9)) == 0:
        lines.insert(draw(st.integers(1, len(lines))), "")  # a blank line
    return "\n".join(lines) + draw(st.sampled_from(("\n", "")))


_token_counts = st.integers(1, 5000).map(str)
_azure_times = st.integers(0, 3600).map(
    lambda s: f"2023-11-16 18:{s // 60 % 60:02d}:{s % 60:02d}.5"
)
_azure_csv = _csv_rows(
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    {"TIMESTAMP": _azure_times, "ContextTokens": _token_counts, "GeneratedTokens": _token_counts},
)
_schema_csv = _csv_rows(
    ("prompt_len", "output_len", "arrival_s", "tag", "prompt"),
    {
        "prompt_len": _token_counts,
        "output_len": _token_counts,
        "arrival_s": st.floats(0, 1e4).map(lambda v: f"{v:.6g}"),
        "tag": st.sampled_from(("", "chat", "code")),
        "prompt": st.sampled_from(("", "hello", '"a, b"', '"two\nlines"')),
    },
)

_BAD_JSON_VALUES = (None, True, -1, 0, 1.5, "7", 10**400, 1e308, math.nan, math.inf, [], {})


@st.composite
def _jsonl_rows(draw: st.DrawFn, keys: dict[str, st.SearchStrategy[object]]) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        row = {key: draw(strategy) for key, strategy in keys.items()}
        if draw(st.integers(0, 9)) == 0:
            key = draw(st.sampled_from(sorted(keys)))
            if draw(st.booleans()):
                del row[key]
            else:
                row[key] = draw(st.sampled_from(_BAD_JSON_VALUES))
        line = json.dumps(row)
        if draw(st.integers(0, 9)) == 0:
            line = draw(st.sampled_from(("[1, 2]", "", "{", '"text"', line[: len(line) // 2])))
        lines.append(line)
    return "\n".join(lines) + "\n"


_mooncake_jsonl = _jsonl_rows(
    {
        "timestamp": st.integers(0, 3_600_000),
        "input_length": st.integers(1, 20_000),
        "output_length": st.integers(1, 2000),
        "hash_ids": st.lists(st.integers(0, 100), max_size=3),
    }
)
_custom_jsonl = _jsonl_rows(
    {
        "prompt": st.sampled_from(("hi", "What is 2 + 2?", "é ü 漢字")),
        "output_tokens": st.integers(1, 500),
        "prompt_len": st.integers(1, 500),
    }
)

# (file suffix, strategy of file text, input path name in the counts)
_FORMATS = {
    "azure": (".csv", _azure_csv),
    "schema-csv": (".csv", _schema_csv),
    "mooncake": (".jsonl", _mooncake_jsonl),
    "vllm-custom": (".jsonl", _custom_jsonl),
}


def _check_loads_or_names_the_file(data: bytes, suffix: str, input_path: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"trace{suffix}"
        path.write_bytes(data)
        try:
            workload = load_workload_file(path)
        except InputError as exc:
            message = str(exc)
            assert message.strip() and path.name in message, message
            assert "\n" not in message, message
            count_case(f"trace file ({input_path})", "error")
            return
    arrivals = [request.arrival_s for request in workload.requests]
    assert workload.requests
    assert all(request.prompt_len >= 1 and request.output_len >= 1 for request in workload.requests)
    assert all(math.isfinite(a) and a >= 0 for a in arrivals)
    assert arrivals == sorted(arrivals)
    count_case(f"trace file ({input_path})", "ok")


@given(data=st.data(), input_path=st.sampled_from(sorted(_FORMATS)))
def test_malformed_trace_file_loads_or_names_file_and_line(
    data: st.DataObject, input_path: str
) -> None:
    suffix, texts = _FORMATS[input_path]
    raw = data.draw(texts.flatmap(corrupted_bytes))
    _check_loads_or_names_the_file(raw, suffix, input_path)


@given(raw=st.binary(max_size=200), suffix=st.sampled_from((".csv", ".jsonl", ".parquet")))
def test_random_bytes_never_crash_the_loader(raw: bytes, suffix: str) -> None:
    _check_loads_or_names_the_file(raw, suffix, f"random bytes {suffix}")
