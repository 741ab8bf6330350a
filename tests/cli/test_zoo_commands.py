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
