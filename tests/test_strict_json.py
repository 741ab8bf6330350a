"""Strict JSON: every JSON dsd writes parses without NaN/Infinity; tables say "-" instead."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.atomic import atomic_write_json
from dsd.common.disk_memo import disk_memo
from dsd.common.strict_json import MISSING, csv_text, dumps, finite_or_none, missing_text

H100 = Path(__file__).resolve().parents[1] / "policies/profiles/pr32374_llama31_8b_eagle_h100.json"


def strict_loads(text: str) -> Any:
    """What a strict parser reads: NaN, Infinity and -Infinity are errors."""

    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard constant {constant}")

    return json.loads(text, parse_constant=refuse)


def strict_files(folder: Path) -> list[Path]:
    """Every .json/.jsonl file under `folder`, each checked to parse strictly."""
    found = sorted([*folder.rglob("*.json"), *folder.rglob("*.jsonl")])
    for path in found:
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines() if path.suffix == ".jsonl" else [text]:
            strict_loads(line)
    return found


def _same(written: Any, original: Any) -> bool:
    """`written` (parsed back) is `original` with non-finite floats as None."""
    if isinstance(original, float):
        return written is None if not math.isfinite(original) else written == original
    if isinstance(original, dict):
        return written.keys() == original.keys() and all(
            _same(written[k], v) for k, v in original.items()
        )
    if isinstance(original, list | tuple):
        return len(written) == len(original) and all(map(_same, written, original))
    return bool(written == original)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(JSON_VALUES, st.sampled_from([None, 2]))
def test_dumps_is_strict_and_keeps_every_finite_value(value: Any, indent: int | None) -> None:
    assert _same(strict_loads(dumps(value, indent=indent)), value)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=6))
def test_numpy_arrays_and_scalars_become_plain_values(values: list[float]) -> None:
    array = np.array(values, dtype=np.float32)
    written = strict_loads(dumps({"array": array, "scalars": [np.float32(v) for v in values]}))
    expected = [float(v) if math.isfinite(v) else None for v in array.tolist()]
    assert written == {"array": expected, "scalars": expected}


def test_finite_or_none_maps_numpy_integers_and_nested_tuples() -> None:
    assert finite_or_none({"a": (np.int64(3), [np.float64("inf")])}) == {"a": [3, [None]]}


def test_default_results_are_mapped_too() -> None:
    class Odd:
        pass

    assert strict_loads(dumps({"x": Odd()}, default=lambda _: [math.nan, 1.5])) == {
        "x": [None, 1.5]
    }


def test_refuse_mode_raises_instead_of_writing_null() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps([math.nan], nonfinite="refuse")
    assert dumps([1.5], nonfinite="refuse") == "[1.5]"


def test_atomic_write_json_writes_null(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / "x.json", {"rate": math.nan, "ok": 1.0})
    assert strict_loads((tmp_path / "x.json").read_text()) == {"rate": None, "ok": 1.0}


def test_disk_memo_stores_no_nan_and_recomputes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path))
    calls = []

    def compute() -> float:
        calls.append(1)
        return math.nan

    for _ in range(2):
        assert math.isnan(disk_memo("strict-json-test", {"k": 1}, compute, float, float))
    assert len(calls) == 2 and not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize(
    ("value", "fmt", "text"),
    [
        (math.nan, "{:.2f}", MISSING),
        (-math.inf, "{:.2f}", MISSING),
        (np.float32("nan"), "{:.3f}", MISSING),
        (None, "{}", MISSING),
        (1.2345, "{:.2f}", "1.23"),
        (7, "{}", "7"),
    ],
)
def test_missing_text(value: Any, fmt: str, text: str) -> None:
    assert missing_text(value, fmt) == text


def test_csv_text_writes_missing_values_as_empty_fields() -> None:
    rows = [
        ["a", "b", "c", "d", "e", "f"],
        [math.nan, -math.inf, np.float32("nan"), None, 10**400, "x"],
    ]
    assert csv_text(rows) == f"a,b,c,d,e,f\n,,,,{10**400},x\n"


@given(st.lists(st.floats() | st.integers() | st.none(), min_size=1, max_size=6))
def test_csv_text_reads_back_every_finite_value(values: list[Any]) -> None:
    (field_texts,) = csv.reader(io.StringIO(csv_text([values])))
    for value, text in zip(values, field_texts, strict=True):
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            assert text == ""
        else:
            assert type(value)(text) == value


def test_simulate_json_and_files_of_a_run_without_drafts_are_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dsd.cli import main

    args = ["simulate", "--profile", str(H100), "--policy", "static:0", "--max-concurrency", "2",
            "--num-prompts", "4", "--dataset-name", "mt-bench"]  # fmt: skip
    main([*args, "--json", "--out", str(tmp_path / "sim")])
    result = strict_loads(capsys.readouterr().out)
    assert result["spec_decode_acceptance_rate"] is None  # no drafts: no rate
    assert {p.name for p in strict_files(tmp_path / "sim")} >= {"result.json", "config.json"}
    main(args)
    text = capsys.readouterr().out
    assert "nan" not in text.lower()
    assert "Acceptance rate (%):                     -" in text


def test_sweep_tables_say_dash_for_a_missing_acceptance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dsd.cli import main

    out = tmp_path / "sweep"
    main(["sweep", "--profile", str(H100), "--policies", "static:0,static:2", "--max-concurrency",
          "2", "--num-prompts", "4", "--workers", "1", "--out", str(out)])  # fmt: skip
    capsys.readouterr()
    assert {p.name for p in strict_files(out)} >= {"grid.resolved.json", "sweep_config.json"}
    import pandas as pd

    rows = [path for path in (out / "cells").glob("*.parquet") if path.stem.isalnum()]
    cells = pd.concat([pd.read_parquet(path) for path in rows])
    assert len(cells) == 2
    for text in cells["metrics_json"]:  # each cell's metrics, kept for reports
        strict_loads(text)
    table = (out / "sweep.md").read_text(encoding="utf-8")
    assert "nan" not in table.lower()
    static0 = next(line for line in table.splitlines() if line.startswith("| static:0 "))
    assert f"| {MISSING} |" in static0


def test_a_benchmarks_json_file_writes_null_for_nan(
    load_benchmark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_benchmark("prefill_estimate")
    names = ("decode slope", "verify slope", "parametric")
    row = {"num_tokens": 32, "measured_ms": 0.0}
    row |= {f"{name}_ms": 1.0 for name in names} | {f"{name}_error_pct": math.inf for name in names}
    monkeypatch.setattr(module, "load_profile", lambda path: None)
    monkeypatch.setattr(module, "estimates", lambda profile: [row])
    out = tmp_path / "estimate.json"
    assert module.main(["--json", str(out)]) == 0
    (written,) = strict_loads(out.read_text())["rows"]
    assert written["parametric_error_pct"] is None and written["measured_ms"] == 0.0


# (file, code, why) of the json.dump(s) calls in benchmarks/ and scripts/ that write no output
OWN_JSON_CALLS = [
    ("benchmarks/sim_speed.py", "hasher.update(json.dumps(", "a digest's input, not output"),
    # installs what the machine lacks before dsd can import; it writes names, versions, counts
    ("scripts/gpu_session.py", "json.dumps(", "standard library only"),
]


def test_benchmarks_and_scripts_write_json_through_strict_json() -> None:
    root = Path(__file__).resolve().parents[1]
    hits = []
    for path in sorted([*root.glob("benchmarks/*.py"), *root.glob("scripts/*.py")]):
        relative = str(path.relative_to(root))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not re.search(r"(?<![\w.])json\.dumps?\(", line):  # not strict_json.dumps
                continue
            if any(relative == file and code in line for file, code, _ in OWN_JSON_CALLS):
                continue
            hits.append(f"{relative}:{number}: {line.strip()}")
    assert not hits, "JSON written without dsd.common.strict_json:\n" + "\n".join(hits)
