"""`dsd --help`, `dsd --version` and the help of single commands: whole descriptions, the
registered policies, only the flags a command takes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dsd import __version__
from dsd.policies.spec import POLICY_BUILDERS


def _dsd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsd", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "80"},
    )


def _listing(help_text: str) -> dict[str, str]:
    """Command -> its description in a group's help (wrapped lines joined)."""
    body = help_text.split("Commands:\n", 1)[1]
    listed: dict[str, str] = {}
    name = ""
    for line in body.splitlines():
        match = re.match(r"^  (\S+)\s+(.*)$", line)
        if match:
            name = match.group(1)
            listed[name] = match.group(2)
        elif line.strip() and name:
            listed[name] += " " + line.strip()
    return listed


@pytest.mark.parametrize("group", [[], ["traces"], ["export"], ["zoo"]])
def test_group_help_lists_each_command_with_its_whole_first_sentence(group: list[str]) -> None:
    completed = _dsd(*group, "--help")
    assert completed.returncode == 0, completed.stderr
    listed = _listing(completed.stdout)
    assert listed and not [text for text in listed.values() if text.endswith("...")], listed
    if not group:
        assert listed["simulate"] == (
            "Simulate one serving run (like `vllm bench serve`) from a profile and a K policy."
        )


def test_version() -> None:
    completed = _dsd("--version")
    assert (completed.returncode, completed.stdout, completed.stderr) == (
        0,
        f"dsd {__version__}\n",
        "",
    )


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["simulate"], "--policy"),
        (["run"], "--policy"),
        (["sweep"], "--policies"),
        (["validate"], "--policies"),
        (["export", "vllm"], "--policy"),
    ],
)
def test_policy_help_names_every_registered_policy(command: list[str], flag: str) -> None:
    completed = _dsd(*command, "--help")
    assert completed.returncode == 0, completed.stderr
    text = " ".join(completed.stdout.split()).replace("- ", "-")  # undo the wrapping
    start = text.index(f"{flag} <str>")
    names = re.search(r"NAME one of ([a-z, -]+) \(docs/policies\.md\)", text[start:])
    assert names is not None, text[start : start + 300]
    assert names.group(1).split(", ") == sorted(POLICY_BUILDERS)
    assert "{policy_names}" not in completed.stdout


def test_traces_show_takes_no_concurrency_cap() -> None:
    completed = _dsd("traces", "show", "--help")
    assert completed.returncode == 0, completed.stderr
    assert "--max-concurrency" not in completed.stdout
    assert "--request-rate" in completed.stdout and "--burstiness" in completed.stdout
    refused = _dsd("traces", "show", "mt-bench", "--max-concurrency", "4")
    assert refused.returncode == 2 and "--max-concurrency" in refused.stderr


def test_help_texts_have_no_escaped_percent_or_replaced_words() -> None:
    for command in (["profile"], ["sweep"]):
        text = _dsd(*command, "--help").stdout
        assert "%%" not in text and "flags.command" not in text
