"""Fuzz the `vllm bench serve --save-result` reader (`validation.cells.load_vllm_result`) and
`dsd validate --measured FILE`, which reads it.

Files start from valid result documents (the small fixture with `request_rate` "inf", and a
variant with a finite rate, a burstiness and a failed request) and are broken by the shared
structured mutations (keys dropped, renamed, retyped; NaN/inf/negative/huge numbers; lists
wrapped; truncated text; non-UTF-8 bytes; BOM). Property of the reader: it returns a result
whose workload and metrics the simulator can use, or raises one-line InputError starting with
the file's path. Property of the command: exit 0, or exit 2 with one `error: <file>: ...` line,
no traceback, and nothing written to the report folder. File-system cases (missing file,
directory, unreadable file) are a table.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from fuzz_helpers import (
    H100_PROFILE,
    REPO_ROOT,
    assert_cli_contract,
    count_case,
    leftover_files,
    mutated_json_files,
    run_cli,
    scaled_settings,
)
from hypothesis import assume, example, given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.validation.vllm_result import VllmBenchResult, load_vllm_result

VLLM_RESULT = REPO_ROOT / "tests" / "data" / "vllm_bench_result_small.json"
SMALL_DOCUMENT = json.loads(VLLM_RESULT.read_text(encoding="utf-8"))
# A finite-rate run with one failed request (vLLM: output 0 and an error text).
OPEN_LOOP_DOCUMENT = {
    **SMALL_DOCUMENT,
    "request_rate": 4.0,
    "burstiness": 0.5,
    "max_concurrency": None,
    "output_lens": [24, 0, 24, 24],
    "errors": ["", "timeout", "", ""],
}
DOCUMENTS = [SMALL_DOCUMENT, OPEN_LOOP_DOCUMENT]
# The command replays the file's workload on the simulator; accepted files bigger than this
# (mutations can make a valid but long run) are not worth the time of a CLI case.
CLI_TOKEN_BUDGET = 5_000


def _check_result_is_usable(result: VllmBenchResult) -> None:
    """An accepted file must give a runnable workload and finite metrics to compare."""
    requests = result.workload.requests
    assert requests
    assert all(1 <= r.prompt_len <= 2**24 and 1 <= r.output_len <= 2**24 for r in requests)
    arrivals = [r.arrival_s for r in requests]
    assert all(math.isfinite(a) and a >= 0 for a in arrivals) and arrivals == sorted(arrivals)
    assert result.request_rate > 0 and result.burstiness > 0
    assert "mean_tpot_ms" in result.metrics
    assert all(math.isfinite(v) and v >= 0 for v in result.metrics.values())
    cap = result.workload.max_concurrency
    assert cap is None or 1 <= cap <= 2**24


def _read(path: Path) -> tuple[str, VllmBenchResult | None]:
    """("ok", result) or ("error", None), checking the error's form."""
    try:
        result = load_vllm_result(path)
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message, message
        assert message.startswith(f"{path}: "), message
        return "error", None
    _check_result_is_usable(result)
    return "ok", result


def _doc_bytes(document: object) -> bytes:
    return json.dumps(document).encode("utf-8")


@example(data=_doc_bytes({**SMALL_DOCUMENT, "mean_tpot_ms": math.nan}))  # NaN metric (was kept)
@example(data=_doc_bytes({**SMALL_DOCUMENT, "p99_ttft_ms": -1.0}))  # negative metric (was kept)
@example(data=_doc_bytes({**SMALL_DOCUMENT, "mean_itl_ms": 10**400}))  # int past float: crashed
@example(data=_doc_bytes({**SMALL_DOCUMENT, "request_rate": 10**400}))  # crashed in float()
@example(data=_doc_bytes({**SMALL_DOCUMENT, "input_lens": [2**62, 1, 1, 1]}))  # absurd length
@example(data=_doc_bytes({**SMALL_DOCUMENT, "max_concurrency": 2**70}))  # absurd cap
@example(data=_doc_bytes({**SMALL_DOCUMENT, "errors": [{}, "", "", ""]}))  # error not a string
@example(data=b"\xef\xbb\xbf" + _doc_bytes(SMALL_DOCUMENT))  # BOM: refused before, now read
@example(data=_doc_bytes(SMALL_DOCUMENT)[:-1] + b"\xff}")  # not UTF-8: was a traceback
@given(data=st.sampled_from(DOCUMENTS).flatmap(mutated_json_files))
def test_mutated_vllm_result_reads_or_names_file_and_field(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench_result.json"
        path.write_bytes(data)
        outcome, _ = _read(path)
    count_case("vllm bench result json", outcome)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    extra=st.dictionaries(
        st.sampled_from(sorted(SMALL_DOCUMENT)) | st.text(max_size=12), _json_values, max_size=4
    )
)
def test_arbitrary_values_in_a_vllm_result_never_crash_the_reader(extra: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench_result.json"
        path.write_text(json.dumps({**SMALL_DOCUMENT, **extra}), encoding="utf-8")
        outcome, _ = _read(path)
    count_case("vllm bench result json (arbitrary values)", outcome)


def _validate_argv(path: Path, out: Path) -> list[str]:
    return ["validate", "--measured", str(path), "--profile", str(H100_PROFILE),
            "--policy", "static:1", "--out", str(out)]  # fmt: skip


@example(data=b"[1, 2]")  # not an object
@example(data=b"")  # empty file
@scaled_settings(0.25)
@given(data=st.sampled_from(DOCUMENTS).flatmap(mutated_json_files))
def test_dsd_validate_measured_exits_0_or_one_error_line_naming_the_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench_result.json"
        path.write_bytes(data)
        outcome, result = _read(path)
        if result is not None:
            tokens = sum(r.prompt_len + r.output_len for r in result.workload.requests)
            assume(tokens <= CLI_TOKEN_BUDGET)
        out = Path(folder) / "out" / "report"
        argv = _validate_argv(path, out)
        cli = run_cli(argv)
        assert assert_cli_contract(cli, argv) == outcome, (argv, cli.stderr)
        if outcome == "error":
            assert cli.stderr.startswith(f"error: {path}: "), cli.stderr
            assert leftover_files(Path(folder) / "out") == []
        else:
            assert (out / "report.md").is_file()
    count_case("cli: dsd validate --measured", outcome)


def _missing(folder: Path) -> Path:
    return folder / "no_such.json"


def _directory(folder: Path) -> Path:
    path = folder / "a_folder.json"
    path.mkdir()
    return path


def _unreadable(folder: Path) -> Path:
    path = folder / "locked.json"
    path.write_text(json.dumps(SMALL_DOCUMENT), encoding="utf-8")
    path.chmod(0)
    return path


def _in_missing_folder(folder: Path) -> Path:
    return folder / "nowhere" / "result.json"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_missing, "no such file"),  # a typo in the path
        (_directory, "is a directory"),  # a folder where the file should be
        (_in_missing_folder, "no such file"),  # the folder itself is missing
        pytest.param(
            _unreadable,
            "permission denied",
            marks=pytest.mark.skipif(
                hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads mode-0 files"
            ),
        ),  # no read permission
    ],
)
def test_unreadable_measured_path_is_one_error_line_and_no_output(
    tmp_path: Path, make: object, message: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    out = tmp_path / "out"
    argv = _validate_argv(path, out)
    result = run_cli(argv)
    assert assert_cli_contract(result, argv) == "error"
    assert result.stderr.startswith(f"error: {path}: {message}"), result.stderr
    assert not out.exists()
