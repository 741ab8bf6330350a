"""Bad inputs a new user tried (issue 55): each is one line `error: ...` naming the file or
field, exit code 2, no traceback, and nothing written, in the current folder or elsewhere.

The checks at the root (`dsd.common.user_paths`, `user_files`, `atomic`) are what these hold:
every command that reads a user's file or writes a user's output goes through them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_simulate import run_cli

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
SIM = ["--policy", "goodput", "--max-concurrency", "4", "--num-prompts", "8"]
SIM += ["--dataset-name", "mt-bench"]
EXPORT = ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "256"]
LONG_NAME = "p" * 300 + ".json"  # past every common file system's 255-byte name limit


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """Run `argv`, assert the error contract, return the one error line."""
    code, out, err = run_cli(argv, capsys)
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and ".tmp" not in err  # never the internal temp file's name
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current folder; each test asserts it stays empty."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def symlink_loop(tmp_path: Path) -> Path:
    first, second = tmp_path / "loop1.json", tmp_path / "loop2.json"
    first.symlink_to(second)
    second.symlink_to(first)
    return first


# --- outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("out", [".", "adir"])
def test_export_out_a_directory_is_refused_naming_it(
    out: str, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / "adir").mkdir()
    _refused([*EXPORT, "--out", out], capsys, f"--out {out}: is a directory")
    assert sorted(path.name for path in cwd.iterdir()) == ["adir"]
    assert list((cwd / "adir").iterdir()) == []


def test_export_out_with_a_trailing_slash_means_a_folder_and_is_refused(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused([*EXPORT, "--out", "newdir/"], capsys, "--out newdir/: ends with '/'")
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [
        EXPORT,
        ["simulate", "--profile", str(H100), *SIM],
        ["sweep", "--profile", str(H100), "--policies", "static:0", "--max-concurrency", "1"],
        ["traces", "show", "mt-bench"],
    ],
)
def test_an_empty_out_is_refused_not_the_current_folder(
    command: list[str], cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli([*command, "--out", ""], capsys)  # `traces show` prints its table first
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: --out: an empty path") and "Traceback" not in err
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("command", [EXPORT, ["simulate", "--profile", str(H100), *SIM]])
def test_a_300_character_out_name_is_one_line(
    command: list[str], cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused([*command, "--out", str(cwd / LONG_NAME)], capsys, "file name too long")
    assert list(cwd.iterdir()) == []


def test_export_out_a_device_is_refused(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused([*EXPORT, "--out", "/dev/null"], capsys, "/dev/null: not a regular file")


# --- inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["simulate", *SIM, "--profile"], ["export", "vllm", "--max-num-seqs", "8", "--profile"]],
)
def test_a_profile_symlink_loop_is_one_line(
    command: list[str], symlink_loop: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused([*command, str(symlink_loop)], capsys, f"{symlink_loop}: ", "symbolic links")
    assert list(cwd.iterdir()) == []


def test_a_300_character_profile_name_is_one_line(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["simulate", *SIM, "--profile", str(cwd / LONG_NAME)], capsys, "file name too long")


def test_a_duplicated_key_in_batch_stats_is_refused_naming_file_and_key(
    tmp_path: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = H100.read_text()
    first = '"1": {"0": 99.0, "1": 99.0, "3": 99.0, "5": 99.0}, '
    duplicated = tmp_path / "dupkey.json"
    duplicated.write_text(text.replace('"batch_stats": {', '"batch_stats": {' + first, 1))
    _refused(
        ["simulate", *SIM, "--profile", str(duplicated)],
        capsys,
        f"{duplicated}: key '1' appears twice",
    )
    assert list(cwd.iterdir()) == []


def test_a_duplicated_key_in_a_speculative_config_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = '{"num_speculative_tokens": 2, "num_speculative_tokens": 3}'
    _refused(
        ["simulate", "--profile", str(H100), "--speculative-config", config],
        capsys,
        "key 'num_speculative_tokens' appears twice",
    )


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("adir", "is a directory"),
        ("/dev/zero", "not a regular file (a character device)"),
        ("fifo", "not a regular file (a FIFO)"),
        ("-", "standard input is not read here"),
        ("missing.json", "no such file"),
    ],
)
@pytest.mark.parametrize("flag", ["--profile", "--policy table:", "--speculative-config"])
def test_a_table_or_profile_path_that_is_not_a_file_says_what_it_is(
    given: str, words: str, flag: str, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / "adir").mkdir()
    os.mkfifo(cwd / "fifo")  # read, it would block forever
    if flag == "--profile":
        argv = ["simulate", *SIM, "--profile", given]
    elif flag == "--policy table:":
        argv = ["simulate", "--profile", str(H100), "--policy", f"table:{given}"]
    else:
        argv = ["simulate", "--profile", str(H100), "--speculative-config", given]
    _refused(argv, capsys, f"error: {given}: {words}")


def test_a_trace_error_names_the_path_as_given(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cwd / "sub").mkdir()
    (cwd / "sub" / "trace.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,abc,-5\n"
    )
    _refused(
        [
            "simulate",
            "--profile",
            str(H100),
            "--policy",
            "goodput",
            "--dataset-path",
            "sub/trace.csv",
        ],
        capsys,
        "error: sub/trace.csv: line 2",
    )


# --- flags ------------------------------------------------------------------------------------


def test_a_token_budget_below_max_num_seqs_is_refused_as_vllm_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _refused(
        ["simulate", "--profile", str(H100), *SIM, "--max-num-batched-tokens", "1"],
        capsys,
        "--max-num-batched-tokens (1) must be greater than or equal to max_num_seqs (256)",
    )
    # vLLM's rule, not a stricter one: the budget equal to max_num_seqs runs
    argv = ["simulate", "--profile", str(H100), *SIM, "--max-num-seqs", "16"]
    code, out, err = run_cli([*argv, "--max-num-batched-tokens", "16", "--json"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out)["completed"] == 8


def test_the_rule_matches_vllms_scheduler_config() -> None:
    config_module = pytest.importorskip("vllm.config.scheduler")
    with pytest.raises(ValueError, match="must be greater than or equal to max_num_seqs"):
        config_module.SchedulerConfig(
            max_num_batched_tokens=1, max_num_seqs=256, max_model_len=1, is_encoder_decoder=False
        )


@pytest.mark.parametrize("dataset", ["mt-bench", "random"])
def test_a_request_count_that_cannot_fit_in_memory_is_refused_at_once(
    dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--profile", str(H100), "--policy", "goodput"]
    argv += ["--num-prompts", "1000000000000", "--dataset-name", dataset]
    _refused(argv, capsys, "--num-prompts: 1000000000000 requests need about", "GiB")


def test_an_unknown_target_lists_every_named_shape(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from dsd.backend.model import MODEL_CONFIGS

    line = _refused(["run", "--target", "nosuch", "--draft", "ngram:2-6"], capsys, "nosuch: ")
    for name in MODEL_CONFIGS:
        assert name in line


def test_a_grid_file_that_is_a_fifo_is_refused_not_read(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(cwd / "grid.toml")  # read, it would block forever
    _refused(
        ["sweep", "--grid", "grid.toml", "--out", "x"], capsys, "grid.toml: not a regular file"
    )
    assert sorted(path.name for path in cwd.iterdir()) == ["grid.toml"]
