"""Fuzz every `dsd` command's flags through `dsd.cli.main`.

Each case starts from a small valid command line and overrides 1-4 of the command's flags
(found by introspecting the typer app, so new flags are fuzzed without editing this file) with
values from pools by flag type: valid small values, boundaries, malformed text, NaN/inf and
huge numbers, missing or corrupt files. Property: exit 0, or exit 2 with exactly one
`error: ...` line on stderr; never a traceback, never exit 1; after an error nothing is left
in the output folder (no partial output, no temp files). A case that runs past CASE_LIMIT_S
fails (a flag value that makes a command hang is a bug too).
"""

from __future__ import annotations

import atexit
import json
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer.main
from fuzz_helpers import (
    H100_PROFILE,
    assert_cli_contract,
    count_case,
    leftover_files,
    run_cli,
    scaled_settings,
)
from hypothesis import given
from hypothesis import strategies as st

from dsd.cli import app

# A hang guard, not a speed test: cases take 0.1-3 s, but on the 2-core runner beside the
# suite's heavy tests a rare one passed 20 s (twice in 2026-11-25's runs, neither reproducible).
CASE_LIMIT_S = 60

_COMMANDS = typer.main.get_command(app)

# Value pools by flag type. "{bad_json}" etc. are replaced by files made per case.
_INT_VALUES = ("0", "1", "2", "3", "-1", "", "abc", "1.5", "nan", "1e3", "99999999999999999999")
_FLOAT_VALUES = ("0", "1", "0.5", "2", "-1", "", "abc", "nan", "inf", "-inf", "1e400", "1e-300")
_STR_VALUES = (
    "", "x", "-1", "nan", "static:1", "goodput", "table:[[1,2,1]]", "{missing}", "{bad_json}",
    "{bad_bytes}", "{folder}", "mt-bench", "random", "azure-conv", "cpu", "cuda", "sync",
    "async", "lognormal", "pareto", "float32", "table", "fitted", "tiny",
)  # fmt: skip
_PATH_VALUES = ("{out}", "{out_csv}", "{out_jsonl}", "{folder}", "{missing_dir}/x.json")

# command path -> (base argv after the command words, flags never touched, cost share)
# The base runs in well under a second; `share` scales the loaded profile's max_examples.
_BASES: dict[tuple[str, ...], tuple[list[str], set[str], float]] = {
    ("export", "vllm"): (["--profile", str(H100_PROFILE), "--max-num-seqs", "8"], set(), 0.1),
    ("export", "trtllm"): (["--profile", str(H100_PROFILE), "--max-num-seqs", "8"], set(), 0.05),
    ("export", "sglang"): (["--profile", str(H100_PROFILE), "--max-num-seqs", "8"], set(), 0.05),
    ("policy", "explain"): (["--profile", str(H100_PROFILE), "--max-num-seqs", "8"], set(), 0.1),
    ("traces", "show"): (["mt-bench", "--num-prompts", "3"], {"--out"}, 0.1),
    ("traces", "convert"): (["mt-bench", "--out", "{out_csv}", "--num-prompts", "3"], set(), 0.1),
    ("traces", "export"): (["mt-bench", "--out", "{out_jsonl}", "--num-prompts", "3"], set(), 0.1),
    ("simulate",): (
        ["--profile", str(H100_PROFILE), "--policy", "static:1", "--num-prompts", "4",
         "--max-concurrency", "2", "--dataset-name", "random", "--random-input-len", "16",
         "--random-output-len", "8"],
        set(),
        0.1,
    ),
    ("sweep",): (
        ["--profile", str(H100_PROFILE), "--out", "{folder_out}", "--policies", "static:1",
         "--max-concurrency", "1", "--num-prompts", "2", "--dataset-name", "random",
         "--random-input-len", "8", "--random-output-len", "4", "--workers", "1"],
        {"--workers"},
        0.02,
    ),
    ("run",): (
        ["--target", "tiny", "--draft", "none", "--num-prompts", "2", "--output-len", "3",
         "--max-model-len", "128", "--dataset-name", "mt-bench"],
        {"--device"},
        0.02,
    ),
    # --max-minutes (never fuzzed) bounds a case whose fuzzed --steps is huge: the command
    # trains until then and still writes its pair (a hang guard timeout otherwise).
    ("zoo", "train"): (
        ["--out", "{folder_out}", "--steps", "1", "--batch-size", "2", "--seq-len", "16",
         "--max-minutes", "0.05",
         "--max-corpus-chars", "20000", "--eval-windows", "2", "--eval-k", "2",
         "--target-config", "hidden=32,layers=1,heads=2,ffn=64",
         "--draft-config", "hidden=16,layers=1,heads=2,ffn=32"],
        {"--device", "--max-minutes"},
        0.02,
    ),
    # A tiny random pair (early exit after layer 1), one B, K in {0, 1}, one prompt, one step.
    ("profile",): (
        ["--target", "tiny", "--draft", "early-exit:1", "--out", "{out}", "--batch-sizes", "1",
         "--k", "0,1", "--context-lens", "16", "--prefill-tokens", "8", "--num-prompts", "1",
         "--output-len", "4", "--warmup", "0", "--iters", "1"],
        {"--device"},
        0.05,
    ),
    # Real backend cells on the tiny pair against the shipped profile: one policy, C = 1, one
    # prompt of 4 tokens. (--measured FILE is fuzzed with mutated files in
    # test_fuzz_vllm_result.py; here its pool values are bad paths.)
    ("validate",): (
        ["--profile", str(H100_PROFILE), "--target", "tiny", "--draft", "early-exit:1",
         "--policies", "static:1", "--max-concurrency", "1", "--num-prompts-per-concurrency",
         "1", "--output-len", "4", "--out", "{folder_out}"],
        {"--device"},
        0.05,
    ),
    # A finished two-cell sweep folder, copied per case (and possibly damaged: see
    # _POSITIONAL_POOLS).
    ("report",): (["{sweep}"], set(), 0.05),
}  # fmt: skip
# Flags whose values are bounded by the work they ask for rather than by validation: a huge
# count is a valid request for a long run, not a malformed input, so these draw from pools
# without the huge values. (Their parsing of "", "abc", "-1", "1.5" is still fuzzed.)
_SMALL_INT_VALUES = ("0", "1", "2", "-1", "", "abc", "1.5", "nan")
# Choice flags of the backend commands: the valid choices as often as the broken ones, so that
# cases reach the run as well as the checks.
_BACKEND_CHOICES: dict[str, tuple[str, ...]] = {
    "--draft": ("early-exit:1", "none", "tiny-draft", "early-exit:0", "early-exit:9", "x", ""),
    "--dataset-name": ("mt-bench", "gsm8k", "random", "nope", "", "{missing}", "{bad_json}"),
    "--dtype": ("auto", "float32", "bfloat16", "float16", "int8", ""),
    "--fast-path": ("off", "eager", "cuda-graphs", "", "fast"),
    "--scheduling": ("sync", "async", "", "x"),
    "--latency-model": ("auto", "table", "parametric", "", "x"),
    "--acceptance-model": ("heterogeneous", "per-position", "replay", "", "x"),
    "--policies": ("static:0", "static:1,goodput", "static:0,static:1", "nope", "", "static:99",
                   "online:warmup_steps=5,decay=0.9", ","),
}  # fmt: skip
_POOL_OVERRIDES: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {
    ("profile",): {
        **_BACKEND_CHOICES,
        "--iters": _SMALL_INT_VALUES,
        "--warmup": _SMALL_INT_VALUES,
        "--num-prompts": _SMALL_INT_VALUES,
        "--output-len": _SMALL_INT_VALUES,
        "--batch-sizes": ("1", "1,2", "2", "0", "1,1", "", "x", "-1", "1,a", "1e3", "²"),
        "--k": ("0,1", "0,1,2", "1", "0", "0,0,1", "", "x", "-1,0,1", "0,1,²"),
        "--context-lens": ("16", "8,16", "0", "", "x", "-4", "1.5"),
        "--prefill-tokens": ("8", "4,8", "0", "", "x", "-4", "1,1"),
    },
    ("validate",): {
        **_BACKEND_CHOICES,
        "--num-prompts-per-concurrency": _SMALL_INT_VALUES,
        "--output-len": _SMALL_INT_VALUES,
        "--max-concurrency": ("1", "1,2", "0", "", "x", "-1", "1,a", "²"),
        "--max-num-seqs": _SMALL_INT_VALUES,
    },
}
# Positional arguments replaced now and then: command path -> (index in the base, values).
_POSITIONAL_POOLS: dict[tuple[str, ...], tuple[int, tuple[str, ...]]] = {
    ("report",): (
        0,
        ("{sweep}", "{sweep_bad_grid_json}", "{sweep_no_cells}", "{sweep_bad_cell}",
         "{sweep_bad_ktrace}", "{sweep_cells_not_list}", "{folder}", "{missing}", "{bad_json}"),
    ),
}  # fmt: skip
# Not fuzzed here: generate, distill-draft and train-eagle need real model files, which tests do
# not ship (train-eagle's flags: tests/cli/test_zoo_commands.py);
# hardware-report profiles and validates a real pair (minutes per case; its few flags are
# checked in tests/cli/test_hardware_report.py). check-policy runs hypothesis itself, which
# does not nest inside this fuzzer's hypothesis run (its flags: tests/cli/test_check_policy.py).
_NOT_FUZZED = {
    ("check-policy",),
    ("generate",),
    ("zoo", "distill-draft"),
    ("zoo", "train-eagle"),
    ("hardware-report",),
}

_SWEEP_GRID = f"""
profile = "{H100_PROFILE}"
policies = ["static:1", "goodput"]
max_concurrency = [1]
num_prompts_per_concurrency = 2
[[workloads]]
dataset = "random"
random_lengths = {{ input_len = 16, output_len = 8 }}
"""
_PRISTINE_SWEEP: list[Path] = []  # the finished sweep folder, built once per process


def _pristine_sweep() -> Path:
    """A finished two-cell sweep folder (built on first use, removed at exit)."""
    if not _PRISTINE_SWEEP:
        root = Path(tempfile.mkdtemp(prefix="dsd_fuzz_sweep_"))
        atexit.register(shutil.rmtree, root, True)
        (root / "grid.toml").write_text(_SWEEP_GRID, encoding="utf-8")
        argv = ["sweep", "--grid", str(root / "grid.toml"), "--out", str(root / "sweep"),
                "--workers", "1"]  # fmt: skip
        result = run_cli(argv)
        assert result.exit_code == 0, result.stderr
        _PRISTINE_SWEEP.append(root / "sweep")
    return _PRISTINE_SWEEP[0]


def _sweep_copy(work: Path, damage: str) -> Path:
    """A copy of the pristine sweep under work/, damaged as named."""
    folder = work / f"sweep_{damage}"
    shutil.copytree(_pristine_sweep(), folder)
    cells = sorted(p for p in (folder / "cells").glob("*.parquet") if ".ktrace." not in p.name)
    if damage == "bad_grid_json":
        (folder / "grid.resolved.json").write_text('{"cells": [', encoding="utf-8")
    elif damage == "no_cells":
        shutil.rmtree(folder / "cells")
    elif damage == "bad_cell":
        cells[0].write_bytes(b"PAR1 not really")
    elif damage == "bad_ktrace":
        for trace in (folder / "cells").glob("*.ktrace.parquet"):
            trace.write_bytes(b"\x00" * 16)
    elif damage == "cells_not_list":
        grid = json.loads((folder / "grid.resolved.json").read_text(encoding="utf-8"))
        grid["cells"] = [1, "x", None, {"cell_id": 7}]
        (folder / "grid.resolved.json").write_text(json.dumps(grid), encoding="utf-8")
    return folder


def _command(path: tuple[str, ...]) -> typer.main.click.Command:
    command = _COMMANDS
    for word in path:
        command = command.commands[word]  # type: ignore[attr-defined]
    return command


def _flag_pools(path: tuple[str, ...], untouched: set[str]) -> dict[str, tuple[str, ...]]:
    """flag -> values to try, from each option's declared type (or _POOL_OVERRIDES)."""
    declared = {param.opts[0] for param in _command(path).params if param.opts}
    overrides = _POOL_OVERRIDES.get(path, {})
    pools = {flag: values for flag, values in overrides.items() if flag in declared}
    for param in _command(path).params:
        if not param.opts or not param.opts[0].startswith("--") or param.name == "help":
            continue
        flag = param.opts[0]
        if flag in untouched or flag in pools:
            continue
        if param.is_flag:  # type: ignore[attr-defined]
            pools[flag] = ("<flag>",)
            continue
        kind = param.bare_type() if callable(getattr(param, "bare_type", None)) else "str"  # type: ignore[attr-defined]
        if kind == "int":
            pools[flag] = _INT_VALUES
        elif kind == "float":
            pools[flag] = _FLOAT_VALUES
        elif "out" in flag or flag.strip("-") == "output":
            pools[flag] = _PATH_VALUES
        else:
            pools[flag] = _STR_VALUES
    return pools


@contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"case ran past {seconds} s")

    previous: Callable[..., object] | int | None = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _materialize(argv: list[str], work: Path) -> list[str]:
    """Replace {placeholders} with per-case files and folders."""
    (work / "bad.json").write_text('{"batch_stats": {"1": {"0": -1}}', encoding="utf-8")
    (work / "bad_bytes.json").write_bytes(b"\xff\xfe[1, 2]")
    (work / "folder").mkdir(exist_ok=True)
    out = work / "out"
    out.mkdir(exist_ok=True)
    names = {
        "{missing}": str(work / "missing.json"),
        "{bad_json}": str(work / "bad.json"),
        "{bad_bytes}": str(work / "bad_bytes.json"),
        "{folder}": str(work / "folder"),
        "{missing_dir}": str(work / "no" / "such"),
        "{out}": str(out / "result.json"),
        "{out_csv}": str(out / "workload.csv"),
        "{out_jsonl}": str(out / "workload.jsonl"),
        "{folder_out}": str(out / "run"),
    }
    materialized = []
    for arg in argv:
        if arg.startswith("{sweep"):  # a (damaged) copy of the finished sweep folder
            damage = arg.strip("{}").removeprefix("sweep").lstrip("_") or "none"
            arg = str(_sweep_copy(work, damage))
        for key, value in names.items():
            arg = arg.replace(key, value)
        materialized.append(arg)
    return materialized


@st.composite
def _command_lines(draw: st.DrawFn, path: tuple[str, ...]) -> list[str]:
    base, untouched, _ = _BASES[path]
    pools = _flag_pools(path, untouched)
    argv = list(base)
    if path in _POSITIONAL_POOLS:
        index, values = _POSITIONAL_POOLS[path]
        argv[index] = draw(st.sampled_from(values))
    minimum = 0 if path in _POSITIONAL_POOLS else 1
    flags = st.lists(st.sampled_from(sorted(pools)), min_size=minimum, max_size=4, unique=True)
    for flag in draw(flags):
        value = draw(st.sampled_from(pools[flag]))
        if flag in argv:  # override the base value
            index = argv.index(flag)
            del argv[index : index + (1 if pools[flag] == ("<flag>",) else 2)]
        argv += [flag] if value == "<flag>" else [flag, value]
    return [*path, *argv]


def _check_one(path: tuple[str, ...], argv_template: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        argv = _materialize(argv_template, work)
        before = leftover_files(work)
        with _time_limit(CASE_LIMIT_S):
            result = run_cli(argv)
        outcome = assert_cli_contract(result, argv)
        if outcome == "error":  # nothing new anywhere (an input folder such as a sweep too)
            assert leftover_files(work) == before, (argv, set(leftover_files(work)) - set(before))
        else:  # no temp files beside successful outputs either
            assert not [p for p in leftover_files(work) if p.name.endswith(".tmp")], argv
    count_case("cli: dsd " + " ".join(path), outcome)


def _make_test(path: tuple[str, ...]) -> Callable[..., None]:
    share = _BASES[path][2]

    @scaled_settings(share, minimum=4)
    @given(argv=_command_lines(path))
    def test(argv: list[str]) -> None:
        _check_one(path, argv)

    test.__name__ = f"test_cli_{'_'.join(path).replace('-', '_')}_exits_0_or_one_error_line"
    return test


for _path in _BASES:
    _test = _make_test(_path)
    globals()[_test.__name__] = _test


def test_every_command_is_fuzzed_or_listed_as_not_fuzzed() -> None:
    # A new command must get a base command line here (or a reason in _NOT_FUZZED).
    def leaves(command: object, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        children = getattr(command, "commands", None)
        if not children:
            return [prefix]
        return [leaf for name, sub in children.items() for leaf in leaves(sub, (*prefix, name))]

    missing = set(leaves(_COMMANDS, ())) - set(_BASES) - _NOT_FUZZED
    assert not missing, f"commands without a fuzz base: {sorted(missing)}"


# Command lines the fuzzer found that broke the contract, kept as regressions.
_FOUND = [
    # --fast-path "" reached the executor: ValueError traceback, exit 1 (now checked up front)
    ["validate", "--profile", str(H100_PROFILE), "--target", "tiny", "--draft", "early-exit:1",
     "--policies", "static:1", "--max-concurrency", "1", "--num-prompts-per-concurrency", "1",
     "--output-len", "4", "--out", "{folder_out}", "--fast-path", ""],
    # --draft none (the default) with a K > 0 policy reached the engine: "k_max > 0 needs a
    # draft" traceback (now: no draft means k_max 0, and the policy check refuses static:1)
    ["validate", "--profile", str(H100_PROFILE), "--target", "tiny", "--policies", "static:1",
     "--max-concurrency", "1", "--num-prompts-per-concurrency", "1", "--output-len", "4",
     "--out", "{folder_out}", "--draft", "none"],
    # --fast-path cuda-graphs on the CPU: "CUDA graphs need a CUDA device" ValueError traceback
    ["validate", "--profile", str(H100_PROFILE), "--target", "tiny", "--draft", "early-exit:1",
     "--policies", "static:1", "--max-concurrency", "1", "--num-prompts-per-concurrency", "1",
     "--output-len", "4", "--out", "{folder_out}", "--fast-path", "cuda-graphs"],
    ["profile", "--target", "tiny", "--draft", "early-exit:1", "--out", "{out}",
     "--batch-sizes", "1", "--k", "0,1", "--num-prompts", "1", "--output-len", "4",
     "--warmup", "0", "--iters", "1", "--fast-path", "cuda-graphs"],
]  # fmt: skip


def test_command_lines_found_by_the_fuzzer_exit_2_with_one_line() -> None:
    for argv_template in _FOUND:
        with tempfile.TemporaryDirectory() as folder:
            argv = _materialize(argv_template, Path(folder))
            result = run_cli(argv)
            assert assert_cli_contract(result, argv) == "error", argv
            assert leftover_files(Path(folder) / "out") == [], argv
