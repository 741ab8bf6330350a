"""Shared pieces of the fuzz suite: case counters, structured JSON mutations, a CLI runner.

The counters record how many generated cases each input path saw in this process (xdist
workers each count their own); tests/fuzz/conftest.py prints them at the end of the session
and, when DSD_FUZZ_COUNTS names a file, writes them there as JSON.

This module checks nothing by itself; the properties live in the test files.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from dsd.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO_ROOT / "policies" / "profiles"
H100_PROFILE = PROFILES_DIR / "pr32374_llama31_8b_eagle_h100.json"
FIXTURE_PROFILE = PROFILES_DIR / "pr32374_branch_test_fixture.json"

# input path name -> cases tried in this process
CASE_COUNTS: Counter[str] = Counter()
# input path name -> outcome ("ok" / "error") -> count, to show the fuzzers reach both sides
OUTCOME_COUNTS: Counter[tuple[str, str]] = Counter()


def count_case(input_path: str, outcome: str) -> None:
    """Record one case for `input_path` that ended in `outcome` ("ok" or "error")."""
    CASE_COUNTS[input_path] += 1
    OUTCOME_COUNTS[(input_path, outcome)] += 1


def scaled_settings(share: float, minimum: int = 10) -> settings:
    """The loaded hypothesis profile with max_examples scaled by `share` (costly cases)."""
    base = settings.default
    return settings(base, max_examples=max(minimum, int(base.max_examples * share)))


# ------------------------------------------------------------------ structured JSON mutations

# Values that break typed fields: wrong kinds, non-finite, negative, huge, nested wrongly.
BAD_SCALARS: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    -0.5,
    0.5,
    1.5,
    2**63,
    10**400,  # larger than any float
    1e308,
    -1e308,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "1",
    "abc",
    "１",  # a Unicode digit: str.isdigit() says yes, int() may not
    "²",  # a superscript: isdigit() is True, int() raises
    " 4 ",
    "-3",
    [],
    {},
    [1, 2],
    {"x": 1},
    [[[]]],
)


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys/indices) into a decoded JSON value, the root included."""
    paths = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            paths.extend(json_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths.extend(json_paths(child, (*prefix, index)))
    return paths


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


@dataclass(frozen=True)
class Mutation:
    """One edit of a decoded JSON document at a path."""

    kind: str  # drop | rename | retype | wrap | scale | duplicate_key_text
    path: tuple[Any, ...]  # where, from the root
    value: Any  # the new value or key, by kind


def apply_mutation(document: Any, mutation: Mutation) -> Any:
    """A new document with `mutation` applied (the input is not changed)."""
    document = json.loads(json.dumps(document))
    if not mutation.path:
        if mutation.kind == "wrap":
            return [document]
        if mutation.kind == "retype":
            return mutation.value
        return document
    parent = _get(document, mutation.path[:-1])
    key = mutation.path[-1]
    if mutation.kind == "drop":
        del parent[key]
    elif mutation.kind == "rename" and isinstance(parent, dict):
        parent[str(mutation.value)] = parent.pop(key)
    elif mutation.kind == "retype":
        parent[key] = mutation.value
    elif mutation.kind == "wrap":
        parent[key] = [parent[key]]
    elif (
        mutation.kind == "scale"
        and isinstance(parent[key], int | float)
        and not isinstance(parent[key], bool)
    ):
        try:
            parent[key] = parent[key] * mutation.value
        except OverflowError:  # an integer past float range times a float
            negative = (parent[key] < 0) != (math.copysign(1, mutation.value) < 0)
            parent[key] = -math.inf if negative else math.inf
    return document


@st.composite
def mutated_documents(draw: st.DrawFn, document: Any, max_mutations: int = 3) -> Any:
    """`document` with 0..max_mutations structured mutations at random paths."""
    for _ in range(draw(st.integers(0, max_mutations))):
        paths = json_paths(document)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(("drop", "rename", "retype", "retype", "wrap", "scale")))
        if kind == "drop" and not path:
            kind = "retype"
        if kind == "rename":
            value: Any = draw(
                st.sampled_from(
                    ("", "x", "1", "0", "-1", "²", "１", " 2", "batch_stats", "Latency")
                )
            )
        elif kind == "retype":
            value = draw(st.sampled_from(BAD_SCALARS) | st.floats() | st.integers())
        elif kind == "scale":
            value = draw(st.sampled_from((-1, 0, 0.5, 1e-300, 1e300, 1.0000001)))
        else:
            value = None
        document = apply_mutation(document, Mutation(kind, path, value))
    return document


def _json_text(document: Any) -> str:
    """JSON as a user might write it; NaN/inf spelled as Python's json does."""
    return json.dumps(document, indent=2)


@st.composite
def corrupted_bytes(draw: st.DrawFn, text: str) -> bytes:
    """The file bytes of `text`, possibly truncated or with non-UTF-8 bytes spliced in."""
    data = text.encode("utf-8")
    how = draw(st.sampled_from(("as_is", "as_is", "truncate", "bad_utf8", "bom", "empty")))
    if how == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how == "bad_utf8":
        cut = draw(st.integers(0, len(data)))
        junk = draw(st.sampled_from((b"\xff", b"\xc3", b"\x80\x80", b"\xfe\xff", b"\x00")))
        data = data[:cut] + junk + data[cut:]
    elif how == "bom":
        data = b"\xef\xbb\xbf" + data
    elif how == "empty":
        data = b""
    return data


@st.composite
def mutated_json_files(draw: st.DrawFn, document: Any) -> bytes:
    """Bytes of a JSON file derived from a valid `document` by mutations and corruption."""
    return draw(corrupted_bytes(_json_text(draw(mutated_documents(document)))))


# ------------------------------------------------------------------ TOML


def _toml_value(value: Any) -> str | None:
    """One TOML value written inline; None for what TOML cannot hold (null), which is left out."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)  # past 64 bits this is invalid TOML, which is a case too
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, list):
        items = [text for text in map(_toml_value, value) if text is not None]
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        pairs = [
            f"{json.dumps(str(key))} = {text}"
            for key, item in value.items()
            if (text := _toml_value(item)) is not None
        ]
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_text(document: Any) -> str:
    """A decoded document as TOML text: `key = value` lines with inline arrays and tables.

    A non-table root (a mutation can make one) comes out as a bare value, which is invalid
    TOML on purpose.
    """
    if not isinstance(document, dict):
        return _toml_value(document) or ""
    lines = []
    for key, value in document.items():
        text = _toml_value(value)
        if text is not None:
            lines.append(f"{json.dumps(str(key))} = {text}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ CLI


@dataclass(frozen=True)
class CliResult:
    """What one in-process `dsd ...` call did."""

    exit_code: int  # 0 on success
    stdout: str  # everything printed to stdout
    stderr: str  # everything printed to stderr


def run_cli(argv: list[str]) -> CliResult:
    """Run `dsd.cli.main(argv)` in this process, capturing stdout/stderr and the exit code.

    An exception other than SystemExit escapes (the test then fails with its traceback, which
    is exactly the bug: the user would have seen a traceback).
    """
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue())


def assert_cli_contract(result: CliResult, argv: list[str]) -> str:
    """Exit 0, or exit 2 with exactly one `error: ...` line on stderr; returns the outcome."""
    assert "Traceback" not in result.stderr, (argv, result.stderr)
    if result.exit_code == 0:
        return "ok"
    assert result.exit_code == 2, (argv, result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, (argv, result.stderr)
    assert lines[0].startswith("error: ") and len(lines[0]) > len("error: "), (argv, lines)
    return "error"


def leftover_files(folder: Path) -> list[Path]:
    """Files under folder (temp files of an aborted atomic write show up here)."""
    return sorted(p for p in folder.rglob("*") if p.is_file())
