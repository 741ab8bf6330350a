"""`dsd zoo train | distill-draft` end to end: checkpoints written, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsd.cli import main


def test_cli_zoo_train_writes_both_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "zoo",
            "train",
            "--out",
            str(tmp_path / "z"),
            "--target-config",
            "nano-target",
            "--draft-config",
            "nano-draft",
            "--corpus",
            "prompts",
            "--steps",
            "5",
            "--batch-size",
            "4",
            "--seq-len",
            "32",
            "--max-corpus-chars",
            "200000",
            "--eval-windows",
            "4",
            "--eval-k",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert "held-out greedy acceptance" in out
    for role in ("target", "draft"):
        assert {p.name for p in (tmp_path / "z" / role).iterdir()} == {
            "config.json",
            "model.safetensors",
            "train.json",
        }


def test_cli_bad_corpus_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["zoo", "train", "--out", str(tmp_path), "--corpus", "wiki"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --corpus: unknown corpus") and err.count("\n") == 1


# Found by the CLI fuzz test: shapes and batches no machine holds ended in tracebacks.
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target-config", "hidden=32,layers=1,heads=2,ffn=9999999999999"], "GiB to train"),
        (["--batch-size", "99999999999999"], "tokens per step"),
    ],
)
def test_cli_untrainable_sizes_exit_2_with_one_line_and_write_nothing(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "z"
    with pytest.raises(SystemExit) as info:
        main(["zoo", "train", "--out", str(out), "--steps", "1", "--seq-len", "16", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not out.exists()


def test_cli_run_with_a_random_eagle_head_at_a_named_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    main(["run", "--target", "tiny", "--draft", "eagle", "--policy", "static:3",
          "--num-spec-tokens", "3", "--num-prompts", "2", "--output-len", "8",
          "--max-model-len", "256", "--json"])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["completed"] == 2 and "spec_decode_acceptance_length" in result


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--draft", "eagle:missing.safetensors"], "error: eagle head missing.safetensors: no"),
        (["--draft", "Eagle"], "error: --draft Eagle: write eagle"),
    ],
)
def test_cli_bad_eagle_draft_exits_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--target", "tiny", "--num-prompts", "1", "--output-len", "4", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_train_eagle_refuses_a_target_without_a_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["zoo", "train-eagle", "--out", str(tmp_path / "h.safetensors"), "--target", "tiny"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --target: tiny needs real weights") and err.count("\n") == 1
    assert not (tmp_path / "h.safetensors").exists()
