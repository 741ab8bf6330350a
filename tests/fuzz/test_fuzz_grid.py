"""Fuzz TOML sweep grids: `reports.grid.load_grid` and `dsd sweep --grid FILE`.

Grids start from valid documents (closed loop on `random`, open loop on mt-bench with a
relative profile path, an rl-rollout workload, a workload file beside the grid) and are broken
by the shared structured mutations (keys dropped, renamed, retyped; NaN/inf/negative/huge
numbers; lists wrapped) plus grid-specific ones: unknown keys at every level, empty and
duplicated axes, axes long enough to expand to absurd cell counts, bad policy SPECs, bad
dataset names and files; the text is then written as TOML and possibly truncated, given
non-UTF-8 bytes or a BOM, or made invalid TOML. Property of the loader: a grid whose cells all
validate (at least one, at most the cap), or one-line InputError starting with the grid path.
Property of the command: exit 0, or exit 2 with one `error: ...` line and nothing written.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fuzz_helpers import (
    H100_PROFILE,
    assert_cli_contract,
    corrupted_bytes,
    count_case,
    leftover_files,
    mutated_documents,
    run_cli,
    scaled_settings,
    toml_text,
)
from hypothesis import assume, example, given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.reports.grid import MAX_GRID_CELLS, expand_grid, load_grid
from dsd.sim.config import RunConfig

# A small workload file written beside every grid (our CSV schema).
WORKLOAD_CSV = "prompt_len,output_len,arrival_s\n8,4,0\n12,6,0.5\n"

# Valid grids; every one runs in well under a second per cell.
CLOSED_LOOP_GRID: dict[str, Any] = {
    "profile": str(H100_PROFILE),
    "policies": ["static:0", "goodput"],
    "max_concurrency": [1, 2],
    "num_prompts_per_concurrency": 2,
    "workloads": [
        {"name": "rand", "dataset": "random", "random_lengths": {"input_len": 16, "output_len": 8}}
    ],
    "config": {"host_overhead_ms": 0.5, "latency_model": ["table", "parametric"]},
}
OPEN_LOOP_GRID: dict[str, Any] = {
    "profile": "profile.json",  # relative to the grid's folder
    "policies": ["static:1"],
    "seeds": [0, 1],
    "scheduling": ["sync", "async"],
    "workloads": [
        {
            "name": "mt",
            "dataset": "mt-bench",
            "request_rate": [2.0, 8.0],
            "num_prompts": 3,
            "output_len": 8,
            "shuffle": True,
        }
    ],
}
ROLLOUT_GRID: dict[str, Any] = {
    "profile": [str(H100_PROFILE), "profile.json"],
    "policies": ["static:2"],
    "max_concurrency": 2,
    "workloads": [
        {
            "dataset": "rl-rollout",
            "num_prompts": 2,
            "rollout": {"num_requests": 2, "output_median": 8.0, "max_output_len": 16},
        }
    ],
}
FILE_GRID: dict[str, Any] = {
    "profile": str(H100_PROFILE),
    "policies": ["static:1", "static:2"],
    "request_rate": [4.0],
    "workloads": [
        {
            "name": "file",
            "dataset": "trace.csv",
            "num_prompts": 2,
            "trace_options": {"time_scale": 2.0, "max_output_len": 4},
        }
    ],
    "config": {"mixed_k": "padded", "max_num_seqs": [4]},
}
GRIDS = [CLOSED_LOOP_GRID, OPEN_LOOP_GRID, ROLLOUT_GRID, FILE_GRID]

_BAD_POLICIES = ("", " ", "static:-1", "static:x", "nope", "table:[[", "goodput:x", "online:a=b")
_BAD_DATASETS = ("", "no-such-set", "missing.csv", "missing.parquet", "trace.txt", ".", "/")
_UNKNOWN_KEYS = ("", "polices", "max-concurrency", "Seed", "workload", "x.y", "\u00e9")
_INVALID_TOML_TAILS = (
    '\nprofile = "again"\n',  # a key defined twice
    "\n[config]\n[config]\n",  # a table defined twice
    "\nx = [1, 2\n",  # an array left open
    '\ny = "unterminated\n',  # a string left open
    "\n= 3\n",  # a key missing
    "\nz = 1979-05-27T07:32:00Z\n",  # a datetime (valid TOML, wrong type anywhere)
    "\nw = 0x7fffffffffffffffff\n",  # an integer past 64 bits
)


def _tables(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's tables (root, workloads, config, nested option tables)."""
    found = [document]
    for value in document.values():
        if isinstance(value, dict):
            found.extend(_tables(value))
        elif isinstance(value, list):
            found.extend(t for item in value if isinstance(item, dict) for t in _tables(item))
    return found


@st.composite
def _grid_edit(draw: st.DrawFn, document: dict[str, Any]) -> dict[str, Any]:
    """One grid-specific edit (the document is copied first)."""
    document = json.loads(json.dumps(document))
    workloads = [w for w in document.get("workloads", []) if isinstance(w, dict)]
    kind = draw(
        st.sampled_from(("unknown", "empty", "duplicate", "huge", "policy", "dataset", "none"))
    )
    if kind == "unknown":
        table = draw(st.sampled_from(_tables(document)))
        table[draw(st.sampled_from(_UNKNOWN_KEYS))] = draw(st.sampled_from((1, "x", [1], {})))
    elif kind == "empty":
        key = draw(st.sampled_from(("policies", "seeds", "scheduling", "max_concurrency",
                                    "request_rate", "profile", "workloads")))  # fmt: skip
        document[key] = []
    elif kind == "duplicate":
        lists = [(t, k) for t in _tables(document) for k, v in t.items() if isinstance(v, list)]
        if lists:
            table, key = draw(st.sampled_from(lists))
            if table[key]:
                table[key] = [*table[key], table[key][0]]
    elif kind == "huge":
        # axes that multiply to far more cells than any sweep should hold
        size = draw(st.sampled_from((50, 400, 3000)))
        for key in draw(
            st.lists(st.sampled_from(("seeds", "max_concurrency", "policies")), min_size=1)
        ):
            if key == "policies":
                document[key] = [f"static:{k % 4}" + ":" * (k // 4) for k in range(size)]
            else:
                document[key] = list(range(1, size + 1))
        if workloads and draw(st.booleans()):
            workloads[0].pop("max_concurrency", None)
            workloads[0].pop("request_rate", None)
    elif kind == "policy":
        document["policies"] = [
            *document.get("policies", []),
            draw(st.sampled_from(_BAD_POLICIES)),
        ]
    elif kind == "dataset" and workloads:
        workloads[0]["dataset"] = draw(st.sampled_from(_BAD_DATASETS))
    return document


@st.composite
def _grid_files(draw: st.DrawFn) -> bytes:
    document = draw(st.sampled_from(GRIDS))
    for _ in range(draw(st.integers(0, 2))):
        document = draw(_grid_edit(document))
    document = draw(mutated_documents(document, max_mutations=2))
    text = toml_text(document)
    if draw(st.integers(0, 9)) == 0:
        text += draw(st.sampled_from(_INVALID_TOML_TAILS))
    return draw(corrupted_bytes(text))


def _write_case(folder: Path, data: bytes) -> Path:
    shutil.copyfile(H100_PROFILE, folder / "profile.json")
    (folder / "trace.csv").write_text(WORKLOAD_CSV, encoding="utf-8")
    path = folder / "grid.toml"
    path.write_bytes(data)
    return path


def _load(path: Path) -> tuple[str, list[Any]]:
    """("ok", cells) or ("error", []), checking the error's form and the cells."""
    try:
        grid = load_grid(path)
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message, message
        assert message.startswith(f"{path}: "), message
        return "error", []
    cells = expand_grid(grid)
    assert 1 <= len(cells) <= MAX_GRID_CELLS
    assert [cell.index for cell in cells] == list(range(len(cells)))
    assert all(isinstance(cell.config, RunConfig) for cell in cells)
    assert all(Path(cell.config.profile).is_file() for cell in cells)
    return "ok", cells


def _toml_bytes(document: dict[str, Any]) -> bytes:
    return toml_text(document).encode("utf-8")


@example(data=_toml_bytes({**CLOSED_LOOP_GRID, "seeds": list(range(3000)),
                           "max_concurrency": list(range(1, 3001))}))  # fmt: skip
@example(data=_toml_bytes({**CLOSED_LOOP_GRID, "max_concurrency": [2**62]}))  # N overflows
@example(data=_toml_bytes({**CLOSED_LOOP_GRID, "workloads": [{"dataset": "no-such-set"}]}))
@example(data=_toml_bytes({**FILE_GRID, "workloads": [{"dataset": "missing.csv"}]}))
@example(data=_toml_bytes({**CLOSED_LOOP_GRID, "policies": ["static:0", "nope"]}))
@example(
    data=_toml_bytes({**CLOSED_LOOP_GRID, "workloads": [{"random_lengths": {"input_len": "x"}}]})
)
@example(data=_toml_bytes({**CLOSED_LOOP_GRID, "config": {"host_overhead_ms": [math.nan, 1.0]}}))
@example(  # a huge nested token count: OverflowError in RandomLengths before
    data=_toml_bytes({**CLOSED_LOOP_GRID, "workloads": [{"random_lengths": {"input_len": 10**30}}]})
)
@example(data=_toml_bytes({**CLOSED_LOOP_GRID, "seeds": [2**64]}))  # past a SeedSequence word
@example(data=_toml_bytes(CLOSED_LOOP_GRID) + b"\nx = 1979-05-27T07:32:00Z\n")
@example(data=b"\xef\xbb\xbf" + _toml_bytes(CLOSED_LOOP_GRID))  # BOM
@given(data=_grid_files())
def test_mutated_grid_loads_or_names_the_file_and_key(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write_case(Path(folder), data)
        outcome, _ = _load(path)
    count_case("sweep grid toml", outcome)


@given(raw=st.binary(max_size=300))
def test_random_bytes_never_crash_the_grid_loader(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        outcome, _ = _load(_write_case(Path(folder), raw))
    count_case("sweep grid toml (random bytes)", outcome)


# Cells of an accepted grid worth running through the command (more cost nothing to the check).
CLI_MAX_CELLS = 8
CLI_MAX_PROMPTS = 16


@example(data=_toml_bytes(ROLLOUT_GRID))  # a grid that runs: cell files for every cell
@scaled_settings(0.1)
@given(data=st.one_of(_grid_files(), st.sampled_from(GRIDS).map(_toml_bytes)))
def test_dsd_sweep_grid_exits_0_or_one_error_line_and_writes_nothing_on_error(
    data: bytes,
) -> None:
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        path = _write_case(folder, data)
        _, cells = _load(path)
        assume(len(cells) <= CLI_MAX_CELLS)
        assume(all((c.config.num_prompts or 80) <= CLI_MAX_PROMPTS for c in cells))
        out = folder / "out" / "sweep"
        argv = ["sweep", "--grid", str(path), "--out", str(out), "--workers", "1"]
        result = run_cli(argv)
        outcome = assert_cli_contract(result, argv)
        if outcome == "error":
            assert leftover_files(folder / "out") == [], leftover_files(folder / "out")
        else:
            results = [p for p in (out / "cells").glob("*.parquet") if ".ktrace." not in p.name]
            assert len(results) == len(cells)
    count_case("cli: dsd sweep --grid", outcome)
