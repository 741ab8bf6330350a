"""Every command of README.md's Quickstart bash block runs as written (exit 0), in order.

The commands run in one fresh folder that links the repository's data folders (later commands
read what earlier ones wrote: `dsd report out/sweep`, the bandit's learned profile), with this
interpreter's `dsd` on PATH and this checkout importable. The hardware report's dry run is left
out (about a minute of real measurement; tests/cli/test_hardware_report.py covers it). The
```python blocks run in tests/test_docs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINKED = ("policies", "traces", "examples", "backend", "sim", "reports")
SKIPPED = ("hardware-report",)


def quickstart_commands(readme: str) -> list[str]:
    """The Quickstart bash block's commands: comments dropped, `\\` continuations joined."""
    match = re.search(r"^## Quickstart\n.*?^```bash\n(.*?)^```", readme, re.DOTALL | re.MULTILINE)
    assert match, "README.md has no ```bash block under '## Quickstart'"
    commands, current = [], ""
    for raw in match.group(1).splitlines():
        line = "" if raw.lstrip().startswith("#") else raw.split("  #")[0].rstrip()
        if not line.strip():
            continue
        piece = line.removesuffix("\\").strip()
        current = f"{current} {piece}" if current else piece
        if not line.endswith("\\"):
            commands.append(current)
            current = ""
    return commands


COMMANDS = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_quickstart_is_parsed() -> None:
    assert any(command.startswith("dsd run ") for command in COMMANDS)
    assert all(command.startswith(("dsd ", "P=")) for command in COMMANDS), COMMANDS


@pytest.mark.slow
def test_every_quickstart_command_runs(tmp_path: Path) -> None:
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MPLBACKEND": "Agg",
    }
    setup = [command for command in COMMANDS if re.match(r"^[A-Z_]+=", command)]
    ran = 0
    for command in COMMANDS:
        if command in setup or any(word in command for word in SKIPPED):
            continue
        completed = subprocess.run(
            ["bash", "-c", "; ".join([*setup, command])],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
        assert completed.returncode == 0, f"{command}:\n{completed.stderr[-3000:]}"
        ran += 1
    assert ran >= 10
