"""Loaders for real serving traces and workload files, into the one Workload schema.

Reads the Azure 2023 and Mooncake traces, our table schema (CSV or parquet, as traces.export
writes it) and vLLM bench's `custom` JSONL; keeps rows in time order (stable), applies the same
`TraceOptions` to every trace, and raises InputError naming the file and line of a malformed row
(docs/workloads.md).

It does not generate synthetic arrivals and does not keep prefix-cache hashes (Mooncake's
hash_ids are read past: the Workload schema has no prefix sharing).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from dsd.common.errors import InputError
from dsd.common.user_files import parse_user_json, read_user_text
from dsd.common.user_paths import check_input_file
from dsd.traces.workload import RequestSpec, Workload

TRACES_DIR = Path(__file__).resolve().parent / "data" / "traces"
TOKENIZER_PATH = Path(__file__).resolve().parent.parent / "backend/data/tokenizer/tokenizer.json"

# trace name -> (file under traces/data/traces, format)
TRACE_FILES: dict[str, tuple[str, str]] = {
    "azure-code": ("azure2023_code.csv", "azure"),
    "azure-conv": ("azure2023_conv.csv", "azure"),
    "mooncake-conversation": ("mooncake_conversation.jsonl", "mooncake"),
    "mooncake-synthetic": ("mooncake_synthetic.jsonl", "mooncake"),
}
TRACE_NAMES: tuple[str, ...] = tuple(TRACE_FILES)

# Largest token count or millisecond timestamp read: 2**53 is exact in float64 and far from
# int64 overflow (a bigger value is a corrupt row, not a request).
MAX_FIELD_VALUE = 2**53


def _short(value: object) -> str:
    """repr of a cell, cut to a readable length (a corrupt row may hold a huge value)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


# Output tokens for a vLLM `custom` JSONL row without "output_tokens" (--custom-output-len).
CUSTOM_DEFAULT_OUTPUT_LEN = 256

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True)
class TraceOptions:
    """How to cut and reshape a trace; applied in the order of the fields."""

    start_s: float = 0.0  # keep rows with start_s <= trace time < end_s; trace time is seconds
    end_s: float = math.inf  # since the first row; kept arrivals are re-zeroed at start_s
    fraction: float | None = None  # keep this share of rows, chosen with the seed, order kept
    num_rows: int | None = None  # keep this many rows, chosen with the seed, order kept
    seed: int = 0  # seed of the row sampling
    max_prompt_len: int | None = None  # clip prompt tokens to this (None: no cap)
    max_output_len: int | None = None  # clip output tokens to this (None: no cap)
    time_scale: float = 1.0  # rate multiplier: arrival_s /= time_scale (2.0 = twice as fast)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise InputError(f"start_s: must be finite and >= 0, got {self.start_s}")
        if not self.end_s > self.start_s:
            raise InputError(f"end_s: must be > start_s ({self.start_s}), got {self.end_s}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise InputError(f"fraction: must be in (0, 1], got {self.fraction}")
        if self.num_rows is not None and self.num_rows < 1:
            raise InputError(f"num_rows: must be >= 1, got {self.num_rows}")
        if self.fraction is not None and self.num_rows is not None:
            raise InputError("fraction and num_rows: give one, not both")
        caps = (("max_prompt_len", self.max_prompt_len), ("max_output_len", self.max_output_len))
        for field, cap in caps:
            if cap is not None and cap < 1:
                raise InputError(f"{field}: must be >= 1, got {cap}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise InputError(f"time_scale: must be finite and > 0, got {self.time_scale}")


@dataclass(frozen=True)
class _Columns:
    """Parsed rows before options, one entry per row, in time order."""

    arrival_s: np.ndarray  # [N] float64 seconds since the first row, non-decreasing
    prompt_lens: np.ndarray  # [N] int64 >= 1
    output_lens: np.ndarray  # [N] int64 >= 1
    tags: list[str | None]  # [N]
    prompts: list[str | None]  # [N]


def _sorted_columns(
    times_s: np.ndarray,
    prompt_lens: np.ndarray,
    output_lens: np.ndarray,
    tags: list[str | None],
    prompts: list[str | None],
) -> _Columns:
    order = np.argsort(times_s, kind="stable")  # [N]
    times_s = times_s[order]
    origin_s = times_s[0] if len(times_s) else 0.0
    return _Columns(
        arrival_s=times_s - origin_s,
        prompt_lens=prompt_lens[order],
        output_lens=output_lens[order],
        tags=[tags[i] for i in order],
        prompts=[prompts[i] for i in order],
    )


def _first_bad(mask: np.ndarray) -> int | None:
    """Index of the first True in mask, or None."""
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else None


def _int_column(
    path: Path, values: pd.Series, column: str, minimum: int, line_of: np.ndarray
) -> np.ndarray:
    """Column as int64, every value an integer >= minimum, else InputError at its line."""
    import pandas as pd  # only trace files need it (~0.3 s to import)

    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)  # [N]
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(numbers) | (numbers != np.round(numbers)) | (numbers < minimum)
        bad |= numbers > MAX_FIELD_VALUE  # would wrap around in int64
    row = _first_bad(bad)
    if row is not None:
        raise InputError(
            f"{path}: line {line_of[row]}: {column} must be an integer >= {minimum} "
            f"(at most 2**53), got {_short(values.iloc[row])}"
        )
    return numbers.astype(np.int64)


def _read_azure(path: Path) -> _Columns:
    import pandas as pd  # only trace files need it (~0.3 s to import)

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False)
    except pd.errors.ParserError as exc:
        match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
        if match:
            expected, line_no, seen = match.groups()
            raise InputError(
                f"{path}: line {line_no}: expected {expected} fields, got {seen}"
            ) from None
        raise InputError(f"{path}: not a readable CSV ({exc})") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: empty file") from None
    missing = [column for column in _AZURE_COLUMNS if column not in frame.columns]
    if missing:
        raise InputError(f"{path}: line 1: missing column {missing[0]!r}")
    if frame.empty:
        raise InputError(f"{path}: no rows")
    line_of = np.arange(len(frame)) + 2  # [N] header is line 1; blank lines are rows here
    stamps = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", errors="coerce")
    row = _first_bad(stamps.isna().to_numpy())
    if row is not None:
        raise InputError(
            f"{path}: line {line_of[row]}: TIMESTAMP must be a date-time, "
            f"got {frame['TIMESTAMP'].iloc[row]!r}"
        )
    times_s = (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)  # [N]
    prompt_lens = _int_column(path, frame["ContextTokens"], "ContextTokens", 1, line_of)
    output_lens = _int_column(path, frame["GeneratedTokens"], "GeneratedTokens", 1, line_of)
    no_text: list[str | None] = [None] * len(frame)
    return _sorted_columns(times_s, prompt_lens, output_lens, no_text, list(no_text))


def _jsonl_objects(path: Path) -> tuple[list[dict[str, object]], list[int]]:
    """Objects of a JSONL file and their line numbers; blank lines skipped."""
    rows: list[dict[str, object]] = []
    line_numbers: list[int] = []
    with path.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            rows.append(_parse_json_line(path, line, line_no))
            line_numbers.append(line_no)
    if not rows:
        raise InputError(f"{path}: no rows")
    return rows, line_numbers


def _json_int(path: Path, row: dict[str, object], key: str, minimum: int, line_no: int) -> int:
    value = row.get(key)
    # bool is an int subclass in Python; a JSON true is not a token count
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{path}: line {line_no}: {key} must be an integer, got {value!r}")
    # a JSON integer may have any number of digits: compare before converting to float
    finite = isinstance(value, int) or math.isfinite(value)
    if not (finite and value == int(value) and minimum <= value <= MAX_FIELD_VALUE):
        raise InputError(
            f"{path}: line {line_no}: {key} must be an integer >= {minimum} "
            f"(at most 2**53), got {_short(value)}"
        )
    return int(value)


def _read_mooncake(path: Path) -> _Columns:
    rows, line_numbers = _jsonl_objects(path)
    count = len(rows)
    times_ms = np.empty(count, dtype=np.float64)  # [N]
    prompt_lens = np.empty(count, dtype=np.int64)  # [N]
    output_lens = np.empty(count, dtype=np.int64)  # [N]
    for index, (row, line_no) in enumerate(zip(rows, line_numbers, strict=True)):
        times_ms[index] = _json_int(path, row, "timestamp", 0, line_no)
        prompt_lens[index] = _json_int(path, row, "input_length", 1, line_no)
        output_lens[index] = _json_int(path, row, "output_length", 1, line_no)
    no_text: list[str | None] = [None] * count
    return _sorted_columns(times_ms / 1000.0, prompt_lens, output_lens, no_text, list(no_text))


def _read_custom_jsonl(path: Path) -> _Columns:
    rows, line_numbers = _jsonl_objects(path)
    count = len(rows)
    prompts: list[str | None] = []
    prompt_lens = np.empty(count, dtype=np.int64)  # [N]
    output_lens = np.empty(count, dtype=np.int64)  # [N]
    to_tokenize: list[int] = []
    for index, (row, line_no) in enumerate(zip(rows, line_numbers, strict=True)):
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise InputError(f"{path}: line {line_no}: 'prompt' must be non-empty text")
        prompts.append(prompt)
        if "prompt_len" in row:
            prompt_lens[index] = _json_int(path, row, "prompt_len", 1, line_no)
        else:
            to_tokenize.append(index)
        if "output_tokens" in row:
            output_lens[index] = _json_int(path, row, "output_tokens", 1, line_no)
        else:
            output_lens[index] = CUSTOM_DEFAULT_OUTPUT_LEN
    if to_tokenize:
        lengths = _token_counts(path, [str(prompts[i]) for i in to_tokenize])
        for index, length in zip(to_tokenize, lengths, strict=True):
            if length < 1:
                raise InputError(f"{path}: line {line_numbers[index]}: prompt has 0 tokens")
            prompt_lens[index] = length
    times_s = np.zeros(count, dtype=np.float64)  # [N] custom datasets carry no times
    return _sorted_columns(times_s, prompt_lens, output_lens, [None] * count, prompts)


def _token_counts(path: Path, texts: list[str]) -> list[int]:
    """SmolLM2 token counts of raw texts; needs the optional `tokenizers` package."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError(
            f"{path}: rows without 'prompt_len' need the `tokenizers` package to count "
            "prompt tokens (pip install tokenizers), or add a 'prompt_len' field"
        ) from None
    tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
    return [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]


def _read_schema_table(path: Path) -> _Columns:
    import pandas as pd  # only trace files need it (~0.3 s to import)

    if path.suffix == ".parquet":
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a readable parquet file ({exc})") from None
        line_of = np.arange(len(frame)) + 1  # [N] parquet has rows, not lines: 1-based row
        where = "row"
    else:
        try:
            frame = pd.read_csv(path, keep_default_na=False, skip_blank_lines=False, dtype=str)
        except pd.errors.ParserError as exc:
            raise InputError(f"{path}: not a readable CSV ({exc})") from None
        except pd.errors.EmptyDataError:
            raise InputError(f"{path}: empty file") from None
        line_of = _csv_row_lines(path, len(frame))  # [N] prompts may span several lines
        where = "line"
    for column in ("prompt_len", "output_len"):
        if column not in frame.columns:
            raise InputError(f"{path}: missing column {column!r}")
    if frame.empty:
        raise InputError(f"{path}: no rows")
    try:
        prompt_lens = _int_column(path, frame["prompt_len"], "prompt_len", 1, line_of)
        output_lens = _int_column(path, frame["output_len"], "output_len", 1, line_of)
    except InputError as exc:
        raise InputError(str(exc).replace(": line ", f": {where} ", 1)) from None
    if "arrival_s" in frame.columns:
        times_s = pd.to_numeric(frame["arrival_s"], errors="coerce").to_numpy(np.float64)  # [N]
        with np.errstate(invalid="ignore"):
            row = _first_bad(~np.isfinite(times_s) | (times_s < 0))
        if row is not None:
            raise InputError(
                f"{path}: {where} {line_of[row]}: arrival_s must be finite and >= 0, "
                f"got {frame['arrival_s'].iloc[row]!r}"
            )
    else:
        times_s = np.zeros(len(frame), dtype=np.float64)  # [N]
    tags = _optional_text(frame, "tag")
    prompts = _optional_text(frame, "prompt")
    columns = _sorted_columns(times_s, prompt_lens, output_lens, tags, prompts)
    # our tables carry absolute arrival_s (a window may not start at 0): keep them as written
    origin_s = float(times_s.min())
    return _Columns(
        arrival_s=columns.arrival_s + origin_s,
        prompt_lens=columns.prompt_lens,
        output_lens=columns.output_lens,
        tags=columns.tags,
        prompts=columns.prompts,
    )


def _csv_row_lines(path: Path, num_rows: int) -> np.ndarray:
    """Line (1-based) on which each data row of a CSV starts; quoted fields may hold newlines."""
    starts = np.empty(num_rows, dtype=np.int64)  # [N]
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        next(reader, None)  # header
        line_no = reader.line_num + 1
        for index, _ in enumerate(reader):
            if index >= num_rows:
                break
            starts[index] = line_no
            line_no = reader.line_num + 1
    return starts


def _optional_text(frame: pd.DataFrame, column: str) -> list[str | None]:
    """The column as text, None where the cell is empty: None, "", pandas NA or a float NaN
    (parquet and CSV spell it differently)."""
    import pandas as pd  # only trace files need it (~0.3 s to import)

    if column not in frame.columns:
        return [None] * len(frame)
    return [
        None if value is None or value is pd.NA or value == "" or _is_nan(value) else str(value)
        for value in frame[column].tolist()
    ]


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _apply_options(columns: _Columns, options: TraceOptions) -> _Columns:
    keep = (columns.arrival_s >= options.start_s) & (columns.arrival_s < options.end_s)  # [N]
    kept = np.flatnonzero(keep)  # [M]
    if options.fraction is not None or options.num_rows is not None:
        rng = np.random.default_rng(options.seed)
        if options.num_rows is not None:
            target = min(options.num_rows, len(kept))
        else:
            assert options.fraction is not None
            target = round(options.fraction * len(kept))
        kept = np.sort(rng.choice(kept, size=target, replace=False))  # [target]
    if len(kept) == 0:
        raise InputError(
            f"trace options: no rows left (window [{options.start_s}, {options.end_s}) s, "
            f"fraction {options.fraction}, num_rows {options.num_rows})"
        )
    prompt_lens = columns.prompt_lens[kept]
    output_lens = columns.output_lens[kept]
    if options.max_prompt_len is not None:
        prompt_lens = np.minimum(prompt_lens, options.max_prompt_len)
    if options.max_output_len is not None:
        output_lens = np.minimum(output_lens, options.max_output_len)
    return _Columns(
        arrival_s=(columns.arrival_s[kept] - options.start_s) / options.time_scale,
        prompt_lens=prompt_lens,
        output_lens=output_lens,
        tags=[columns.tags[i] for i in kept],
        prompts=[columns.prompts[i] for i in kept],
    )


def _to_workload(name: str, columns: _Columns, default_tag: str | None) -> Workload:
    requests = tuple(
        RequestSpec(
            prompt_len=int(prompt_len),
            output_len=int(output_len),
            arrival_s=max(0.0, float(arrival_s)),
            tag=tag if tag is not None else default_tag,
            prompt=prompt,
        )
        for arrival_s, prompt_len, output_len, tag, prompt in zip(
            columns.arrival_s,
            columns.prompt_lens,
            columns.output_lens,
            columns.tags,
            columns.prompts,
            strict=True,
        )
    )
    return Workload(name=name, requests=requests)


def _check_file(path: Path) -> None:
    if path.suffix.lower() == ".parquet":
        check_input_file(path, "trace file")
    else:
        # Text formats: refuse bytes that are not UTF-8 here, with their line, rather than as a
        # UnicodeDecodeError from whichever reader meets them first.
        read_user_text(path)


def load_azure_trace(path: str | Path, options: TraceOptions | None = None) -> Workload:
    """An Azure LLM inference 2023 CSV; tag 'azure'."""
    path = Path(path)
    _check_file(path)
    columns = _apply_options(_read_azure(path), options or TraceOptions())
    return _to_workload(path.stem, columns, "azure")


def load_mooncake_trace(path: str | Path, options: TraceOptions | None = None) -> Workload:
    """A Mooncake FAST'25 JSONL trace; tag 'mooncake'."""
    path = Path(path)
    _check_file(path)
    columns = _apply_options(_read_mooncake(path), options or TraceOptions())
    return _to_workload(path.stem, columns, "mooncake")


def load_trace(name: str, options: TraceOptions | None = None) -> Workload:
    """A shipped trace by name (TRACE_NAMES); tag = the trace name."""
    if name not in TRACE_FILES:
        raise InputError(f"unknown trace {name!r}; known: {', '.join(TRACE_NAMES)}")
    file_name, file_format = TRACE_FILES[name]
    path = TRACES_DIR / file_name
    reader = _read_azure if file_format == "azure" else _read_mooncake
    columns = _apply_options(reader(path), options or TraceOptions())
    return _to_workload(name, columns, name)


def load_workload_file(path: str | Path, options: TraceOptions | None = None) -> Workload:
    """Any supported file, by content and suffix.

    .csv: Azure columns -> Azure trace, else our schema; .parquet: our schema; .jsonl: Mooncake
    keys -> Mooncake trace, "prompt" -> vLLM custom dataset.
    """
    path = Path(path)
    _check_file(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(encoding="utf-8") as handle:
            header = handle.readline().strip().split(",")
        if all(column in header for column in _AZURE_COLUMNS):
            reader, tag = _read_azure, "azure"
        else:
            reader, tag = _read_schema_table, None
    elif suffix == ".parquet":
        reader, tag = _read_schema_table, None
    elif suffix == ".jsonl":
        first = _first_json_object(path)
        if all(key in first for key in _MOONCAKE_KEYS):
            reader, tag = _read_mooncake, "mooncake"
        elif "prompt" in first:
            reader, tag = _read_custom_jsonl, None
        else:
            raise InputError(
                f"{path}: line 1: neither a Mooncake trace (timestamp, input_length, "
                "output_length) nor a vLLM custom dataset (prompt, output_tokens)"
            )
    else:
        raise InputError(f"{path}: unsupported file type {suffix!r} (.csv, .parquet, .jsonl)")
    columns = _apply_options(reader(path), options or TraceOptions())
    return _to_workload(path.stem, columns, tag)


def _first_json_object(path: Path) -> dict[str, object]:
    with path.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if line.strip():
                return _parse_json_line(path, line, line_no)
    raise InputError(f"{path}: no rows")


def _parse_json_line(path: Path, line: str, line_no: int) -> dict[str, object]:
    row = parse_user_json(line, str(path), allow_nonfinite=True, line=line_no)
    if not isinstance(row, dict):
        raise InputError(f"{path}: line {line_no}: expected a JSON object")
    return row
