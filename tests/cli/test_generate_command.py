"""`dsd generate` end to end: text and acceptance printed, bad flags as one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from mock_models import byte_checkpoint

from dsd.cli import main


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),  # nothing to generate
        (["--temperature", "-1"], "--temperature must be finite and >= 0"),  # negative temperature
        (["--draft", "early-exit:7"], "N must be an integer in [1, 1]"),  # 2-layer target
        (["--draft", "exit:1"], "exit:1: no such file"),  # the one spelling is early-exit:N
        (["--device", "tpu"], "--device: choose cpu or cuda"),  # unknown device
    ],
)
def test_cli_generate_bad_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    target = byte_checkpoint(tmp_path, "target", "nano-target", seed=1)
    with pytest.raises(SystemExit) as info:
        main(["generate", "--target", target, "--prompt", "hi", "--raw", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_cli_generate_prints_text_and_acceptance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = byte_checkpoint(tmp_path, "target", "nano-target", seed=1)
    main(
        [
            "generate",
            "--target",
            target,
            "--prompt",
            "hi",
            "--raw",
            "--max-tokens",
            "8",
            "--draft",
            "early-exit:1",
            "--k",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert "output tokens in" in out and "acceptance length" in out
    assert "threads: 1 (the CPU default" in out
