"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in its own process, in a fresh folder that links the repository's data folders
(so `policies/profiles/...` resolves and outputs land in the temporary folder). Signatures and
other non-runnable listings use ```text.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
LINKED = ("policies", "traces", "examples", "backend", "sim", "reports")


def _blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for index, match in enumerate(BLOCK.finditer(path.read_text(encoding="utf-8"))):
            found.append((f"{path.relative_to(REPO)}#{index + 1}", match.group(1)))
    return found


BLOCKS = _blocks()


def test_the_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs(where: str, code: str, tmp_path: Path) -> None:
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    completed = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert completed.returncode == 0, f"{where}:\n{completed.stderr[-3000:]}"
