"""A user's policy file through every command (dsd.cli.main, from a folder outside the package),
and `dsd check-policy`: a good policy passes, planted accounting bugs are found and reported with
a reproducer; bad SPECs are one line, exit 2."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_simulate import H100, run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "k_policy.py"

PLANTED = '''
class Overshoot:
    """k_max + 1 on every 7th step, K = 0 otherwise."""

    def __init__(self):
        self.n = 0

    def choose_k(self, view):
        self.n += 1
        return view.k_max + 1 if self.n % 7 == 0 else 0

    def observe(self, feedback):
        pass


class Negative:
    """A negative K for the third decode row of any step that has one."""

    def choose_k(self, view):
        return [-1 if i == 2 else 0 for i in range(view.num_decode_reqs)]

    def observe(self, feedback):
        pass


class NotAPolicy:
    def choose(self, view):
        return 0
'''


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder outside the package holding a copy of the example and planted bugs."""
    shutil.copy(EXAMPLE, tmp_path / "k_policy.py")
    (tmp_path / "planted.py").write_text(PLANTED, encoding="utf-8")
    (tmp_path / "broken.py").write_text("class Half:\n    def choose_k(self view):\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


QUICK = ["--examples", "30", "--cases", "10"]


def test_check_policy_passes_the_example(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("hypothesis")
    for name in ("BatchCutoff:cutoff=3", "EpsilonGreedy"):
        code, out, err = run_cli(["check-policy", f"k_policy.py:{name}", *QUICK], capsys)
        assert code == 0, out + err
        assert "stateful scheduler machine: passed: 30 examples" in out
        assert "no accounting violation found" in out
        if _has_vllm():
            assert "differential against vLLM's scheduler: passed: 10 random workloads" in out


def _has_vllm() -> bool:
    from importlib import metadata

    try:
        return metadata.version("vllm") == "0.33.0"
    except metadata.PackageNotFoundError:
        return False


def test_check_policy_finds_a_planted_overshoot_and_its_shrunk_reproducer(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("hypothesis")
    code, out, err = run_cli(["check-policy", "planted.py:Overshoot", *QUICK], capsys)
    assert code == 1, out + err
    assert (
        f"stateful scheduler machine: failed: InputError: policy {folder}/planted.py:Overshoot: "
        "choose_k returned K=" in out
    )
    assert "    state = PolicyMachine()" in out  # the shrunk reproducer, one call a line
    assert "    state.add_request(" in out and "    state.teardown()" in out
    assert "VIOLATION FOUND" in out
    assert "Traceback" not in out + err


def test_check_policy_finds_a_planted_negative_k(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three decode rows at once are rare in 30 small machine examples: the differential
    workloads find it (the machine does with the default 100 examples)."""
    pytest.importorskip("hypothesis")
    if not _has_vllm():
        pytest.skip("the differential check needs vLLM 0.33")
    code, out, err = run_cli(["check-policy", "planted.py:Negative", *QUICK], capsys)
    assert code == 1, out + err
    assert "stateful scheduler machine: passed" in out
    assert "differential against vLLM's scheduler: failed: case " in out
    assert "choose_k returned K=-1" in out
    assert (
        "    config: SchedulerConfig(" in out and "    requests (prompt, output tokens): [" in out
    )
    assert "VIOLATION FOUND" in out and "Traceback" not in out + err


@pytest.mark.parametrize("command", ["simulate", "check-policy", "export"])
@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nosuch.py:Half", "nosuch.py: no such file"),
        ("k_policy.py:Nope", "defines no 'Nope'"),
        ("planted.py:NotAPolicy", "NotAPolicy is not a K policy (no choose_k method)"),
        ("broken.py:Half", "broken.py line 2: invalid syntax"),
    ],
)
def test_bad_specs_are_one_line_exit_2(
    folder: Path, capsys: pytest.CaptureFixture[str], command: str, spec: str, fragment: str
) -> None:
    argv = {
        "simulate": ["simulate", "--profile", str(H100), "--policy", spec, "--num-prompts", "2"],
        "check-policy": ["check-policy", spec],
        "export": [
            "export",
            "vllm",
            "--profile",
            str(H100),
            "--max-num-seqs",
            "4",
            "--policy",
            spec,
        ],
    }[command]
    code, _out, err = run_cli(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert "Traceback" not in err


def test_check_policy_checks_at_the_k_max_a_policy_builds_at(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("hypothesis")
    code, out, err = run_cli(["check-policy", "static:2", *QUICK], capsys)
    assert code == 0, out + err
    assert "k_max: skipped: checked at k_max [2, 3, 4, 5] only (policy static:2: K=2 exceeds" in out


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--examples", "0"], "--examples and --steps must be >= 1"),
        (["--steps", "0"], "--examples and --steps must be >= 1"),
        (["--cases", "-1"], "--cases >= 0"),
        (["--examples", "x"], "'x' is not a valid int"),
        (["--profile", "nope.json"], "nope.json"),
    ],
)
def test_bad_check_policy_flags_are_one_line_exit_2(
    folder: Path, capsys: pytest.CaptureFixture[str], flags: list[str], fragment: str
) -> None:
    code, _out, err = run_cli(["check-policy", "static:1", *flags], capsys)
    assert code == 2 and err.count("\n") == 1 and fragment in err, err


def test_the_example_runs_in_simulate_sweep_export_and_explain(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = "k_policy.py:BatchCutoff:cutoff=4,k_above=1"
    code, out, err = run_cli(
        ["simulate", "--profile", str(H100), "--policy", spec, "--max-concurrency", "8",
         "--num-prompts", "16", "--output-len", "16", "--out", "sim"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    result = json.loads((folder / "sim" / "result.json").read_text())
    config = json.loads((folder / "sim" / "config.json").read_text())
    source = {
        "spec": f"{folder}/k_policy.py:BatchCutoff:cutoff=4,k_above=1",
        "kind": "file",
        "path": str((folder / "k_policy.py").resolve()),
        "class": "BatchCutoff",
        "sha256": hashlib.sha256((folder / "k_policy.py").read_bytes()).hexdigest(),
    }
    assert result["policy_source"] == source and config["resolved"]["policy_source"] == source
    assert set(result["k_histogram"]) <= {"1", "5"}

    code, out, err = run_cli(
        ["sweep", "--profile", str(H100),
         "--policies", f"{spec},k_policy.py:EpsilonGreedy,static:2", "--max-concurrency", "1,4",
         "--num-prompts-per-concurrency", "2", "--output-len", "16", "--workers", "2",
         "--out", "sw"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    table = pd.read_csv(folder / "sw" / "sweep.csv")
    assert len(table) == 6 and (table["completed"] == table["num_prompts"]).all()

    code, out, err = run_cli(
        ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "8", "--policy", spec], capsys
    )
    assert code == 0, err
    assert json.loads(out)["num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 8, 1]]
    code, out, err = run_cli(
        ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "8",
         "--policy", "k_policy.py:EpsilonGreedy"],
        capsys,
    )  # fmt: skip
    assert code == 2 and "only a policy that declares K depends on the batch size alone" in err
    code, out, err = run_cli(
        ["policy", "explain", "--profile", str(H100), "--max-num-seqs", "8", "--policy", spec],
        capsys,
    )
    assert code == 0, err
    assert "range table: [[1, 3, 5], [4, 8, 1]]" in out


def test_the_example_runs_on_the_real_engine(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    code, _out, err = run_cli(
        ["run", "--target", "tiny", "--draft", "tiny-draft",
         "--policy", "k_policy.py:EpsilonGreedy", "--max-concurrency", "2",
         "--num-prompts", "4", "--output-len", "8", "--out", "real"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    result = json.loads((folder / "real" / "result.json").read_text())
    assert result["completed"] == 4 and result["policy_source"]["class"] == "EpsilonGreedy"
    assert result["backend"] == "dsd-torch"


def test_the_sweep_cell_id_depends_on_the_file_content_not_its_folder(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "--profile", str(H100), "--max-concurrency", "1",
            "--num-prompts-per-concurrency", "2", "--output-len", "8",
            "--workers", "1"]  # fmt: skip
    other = folder / "elsewhere"
    other.mkdir()
    shutil.copy(folder / "k_policy.py", other / "k_policy.py")
    ids = []
    for policy, out in (
        ("k_policy.py:BatchCutoff", "a"),
        ("elsewhere/k_policy.py:BatchCutoff", "b"),
    ):
        code, _out, err = run_cli([*argv, "--policies", policy, "--out", out], capsys)
        assert code == 0, err
        ids.append(pd.read_csv(folder / out / "sweep.csv")["cell_id"].tolist())
    assert ids[0] == ids[1]
    (other / "k_policy.py").write_text((folder / "k_policy.py").read_text() + "\n# changed\n")
    # an edited file is another grid: refused in b (its cells were the old file's), run in c
    code, _out, err = run_cli(
        [*argv, "--policies", "elsewhere/k_policy.py:BatchCutoff", "--out", "b"], capsys
    )
    assert code == 2 and "holds another sweep" in err
    code, _out, err = run_cli(
        [*argv, "--policies", "elsewhere/k_policy.py:BatchCutoff", "--out", "c"], capsys
    )
    assert code == 0, err
    assert pd.read_csv(folder / "c" / "sweep.csv")["cell_id"].tolist() != ids[0]


@pytest.mark.slow
def test_a_file_policy_on_ray_gives_the_local_pools_results(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    argv = ["sweep", "--profile", str(H100), "--policies", "k_policy.py:EpsilonGreedy,static:2",
            "--max-concurrency", "1,4", "--num-prompts-per-concurrency", "2", "--output-len", "16",
            "--workers", "2"]  # fmt: skip
    code, _out, err = run_cli([*argv, "--out", "local"], capsys)
    assert code == 0, err
    code, _out, err = run_cli([*argv, "--out", "ray", "--ray"], capsys)
    assert code == 0, err
    for name in ("sweep.csv", "sweep.md"):
        assert (folder / "local" / name).read_bytes() == (folder / "ray" / name).read_bytes()


@pytest.mark.slow
def test_a_policy_object_cannot_go_to_ray_and_says_so_before_any_cell(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import dsd
    from dsd.common.errors import InputError

    class Half:
        def choose_k(self, view):  # type: ignore[no-untyped-def]
            return view.k_max // 2

        def observe(self, feedback):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(
        InputError, match=r"on a Ray worker: policy object:Half#\d+: no such policy"
    ):
        dsd.sweep(
            tmp_path / "out",
            profile=str(H100),
            policies=[Half()],
            max_concurrency=[1],
            num_prompts_per_concurrency=2,
            ray=True,
            workers=1,
        )
    assert not list((tmp_path / "out" / "cells").glob("*.parquet"))
