"""The torch thread count a command runs with: 1 on CPU unless --threads, and the line saying so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dsd.backend.threads import DEFAULT_CPU_THREADS, default_threads, set_threads, threads_text


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("threads", "device", "chosen"),
    [
        (None, "cpu", DEFAULT_CPU_THREADS),  # cannot oversubscribe a shared CPU
        (3, "cpu", 3),  # the flag wins
        (None, "cuda", None),  # torch's default
        (None, "cuda:0", None),
        (2, "cuda", 2),
    ],
)
def test_default_threads(threads: int | None, device: str, chosen: int | None) -> None:
    assert default_threads(threads, device) == chosen


def test_set_threads_applies_the_default_on_cpu_and_says_so() -> None:
    torch.set_num_threads(2)
    set_threads(None, "cpu")
    assert torch.get_num_threads() == DEFAULT_CPU_THREADS == 1
    assert threads_text(None, "cpu").startswith("threads: 1 (the CPU default")
    set_threads(2, "cpu")
    assert torch.get_num_threads() == 2
    assert threads_text(2, "cpu") == "threads: 2 (--threads)"


def test_set_threads_leaves_torch_default_on_cuda() -> None:
    torch.set_num_threads(2)
    set_threads(None, "cuda")
    assert torch.get_num_threads() == 2
    assert threads_text(None, "cuda") == "threads: 2 (torch's default on cuda)"


@pytest.mark.parametrize(
    ("extra", "line", "recorded"),
    [
        ([], "threads: 1 (the CPU default", 1),
        (["--threads", "2"], "threads: 2 (--threads)", 2),
    ],
)
def test_dsd_run_says_which_threads_and_records_them(
    extra: list[str], line: str, recorded: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dsd.cli import main

    torch.set_num_threads(2)
    out = tmp_path / "run"
    main(
        [
            "run", "--target", "tiny", "--draft", "none", "--num-prompts", "1",
            "--max-concurrency", "1", "--output-len", "4", "--json", "--out", str(out), *extra,
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays one JSON object
    assert [text for text in captured.err.splitlines() if text.startswith("threads:")] == [
        next(text for text in captured.err.splitlines() if text.startswith(line))
    ]
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["pair"]["threads"]["torch_intra_op_threads"] == recorded
