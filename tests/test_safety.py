"""Safe loading and crash-safe outputs.

- The source tree never calls what could run code from a user's file: pickle/marshal loads,
  torch.load without weights_only=True, eval/exec, shell=True, yaml.load.
- Every file write in the packages goes through dsd.common.atomic (no bare open(..., "w")).
- A writer killed with SIGKILL at random moments leaves the target either the old or the new
  complete content, never a prefix.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsd.common.atomic import atomic_write_bytes, atomic_write_text, stale_temp_files

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "sim", "backend", "traces", "reports", "dsd", "benchmarks")

# (pattern, why it is forbidden) — one row per forbidden call.
FORBIDDEN = [
    (r"\bpickle\.loads?\(", "unpickling runs code from the file"),
    (r"\bmarshal\.loads?\(", "unmarshalling user data"),
    (r"\bdill\.loads?\(|\bcloudpickle\.loads?\(", "unpickling runs code from the file"),
    (r"(?<![\w.])eval\(", "eval of text"),
    (r"(?<![\w.])exec\(", "exec of text"),
    (r"shell\s*=\s*True", "a shell parses user strings"),
    (r"\byaml\.load\(", "yaml.load builds arbitrary objects; use yaml.safe_load"),
    (r"\bos\.system\(", "a shell parses user strings"),
]


def _source_files() -> list[Path]:
    files = [
        path
        for package in PACKAGES
        if (REPO_ROOT / package).is_dir()
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
    ]
    assert len(files) > 20  # the scan must see the tree
    return files


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, code) with comments and docstring-ish lines dropped."""
    lines = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        code = line.split("#", 1)[0]
        if code.strip().startswith(('"', "'", "`")):
            continue
        lines.append((number, code))
    return lines


@pytest.mark.parametrize(("pattern", "why"), FORBIDDEN)
def test_source_tree_has_no_forbidden_call(pattern: str, why: str) -> None:
    hits = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {code.strip()}"
        for path in _source_files()
        for number, code in _code_lines(path)
        if re.search(pattern, code)
    ]
    assert not hits, f"{why}:\n" + "\n".join(hits)


def test_torch_load_always_passes_weights_only_true() -> None:
    hits = []
    for path in _source_files():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"torch\.load\(", text):
            call = text[match.start() : text.find(")", match.start()) + 1]
            if "weights_only=True" not in call:
                line = text.count("\n", 0, match.start()) + 1
                hits.append(f"{path.relative_to(REPO_ROOT)}:{line}: {call}")
    assert not hits, "torch.load unpickles arbitrary objects without weights_only=True:\n" + (
        "\n".join(hits)
    )


# (file, code snippet, why it is allowed or what is owed) — writes reviewed by hand.
KNOWN_WRITES = [
    # its own mkstemp + os.replace; a maintainer script, not part of the CLI
    ("traces/scripts/compute_prompt_lengths.py", 'os.fdopen(fd, "w"', "own temp + replace"),
    # files staged in a temp folder that is renamed into place as a whole
    ("reports/run_outputs.py", "(staging / name).write_bytes(", "staged folder + rename"),
]


def test_files_are_written_only_through_the_atomic_helper() -> None:
    # A bare write to a user path can leave half a file when the process dies. Writes to a
    # temp path inside an atomic_write callback name their argument tmp/temp.
    pattern = re.compile(
        r"open\([^)]*['\"][wa]b?['\"]|\.write_text\(|\.write_bytes\(|\.to_csv\(|\.to_parquet\("
        r"|\.savefig\(|torch\.save\(|save_file\("
    )
    allowed_file = {"dsd/common/atomic.py"}
    hits = []
    for path in _source_files():
        relative = str(path.relative_to(REPO_ROOT))
        if relative in allowed_file or relative.startswith("benchmarks/"):
            continue
        for number, code in _code_lines(path):
            if not pattern.search(code):
                continue
            # temp paths inside atomic_write callbacks, in-memory buffers, bytes for a writer
            if re.search(r"\b(tmp|temp|buffer)\w*|\.encode\(", code):
                continue
            if any(relative == file and snippet in code for file, snippet, _ in KNOWN_WRITES):
                continue
            hits.append(f"{relative}:{number}: {code.strip()}")
    assert not hits, "non-atomic writes (use dsd.common.atomic):\n" + "\n".join(hits)


_WRITER = """
import sys
from dsd.common.atomic import atomic_write_bytes
target, size = sys.argv[1], int(sys.argv[2])
generation = 0
print("ready", flush=True)
while True:
    generation += 1
    atomic_write_bytes(target, bytes([generation % 251]) * size, fsync=False)
"""


def _is_complete_generation(data: bytes, size: int) -> bool:
    return len(data) == size and data == data[:1] * size


def test_sigkill_mid_write_leaves_old_or_new_complete_file(tmp_path: Path) -> None:
    size = 4 * 1024 * 1024  # large enough that a kill lands inside a write
    target = tmp_path / "big.bin"
    atomic_write_bytes(target, b"\x00" * size)
    rng = np.random.default_rng(0)
    num_kills = 15
    for _ in range(num_kills):
        process = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(target), str(size)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
        time.sleep(float(rng.uniform(0.0, 0.05)))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        data = target.read_bytes()
        assert _is_complete_generation(data, size), (len(data), data[:1], data[-1:])
    # a killed writer may leave its hidden temp file; it is never the target itself
    for leftover in stale_temp_files(target):
        assert leftover.name.startswith(".big.bin.") and leftover.name.endswith(".tmp")


def test_failed_writer_leaves_target_and_folder_untouched(tmp_path: Path) -> None:
    target = tmp_path / "profile.json"
    atomic_write_text(target, "old\n")

    def explode(temp_path: Path) -> None:
        temp_path.write_text("half")
        raise RuntimeError("writer died")

    from dsd.common.atomic import atomic_write

    with pytest.raises(RuntimeError):
        atomic_write(target, explode)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json"]
    assert hashlib.sha256(target.read_bytes()).hexdigest()  # still a readable file
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
