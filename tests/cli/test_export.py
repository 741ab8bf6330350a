"""`dsd export vllm` and `dsd policy explain` end to end through dsd.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsd.cli import main
from dsd.common.errors import InputError
from dsd.policies.goodput import GoodputPolicy
from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.profile_io import load_profile, save_profile
from dsd.policies.range_table import synthetic_view
from dsd.policies.spec import parse_policy
from dsd.policies.speculative_config import spec_from_speculative_config, speculative_config

PROFILES = Path(__file__).resolve().parents[2] / "policies" / "profiles"
H100 = PROFILES / "pr32374_llama31_8b_eagle_h100.json"
FIXTURE = PROFILES / "pr32374_branch_test_fixture.json"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_export_h100_prints_the_goodput_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "256"], capsys
    )
    assert (code, err) == (0, "")
    config = json.loads(out)  # exactly one JSON object
    # K* = 3 at B=1 and 0 at B=256 (checked by hand in tests/policies/test_goodput.py)
    assert config == {
        "num_speculative_tokens": 5,
        "num_speculative_tokens_per_batch_size": [
            [1, 17, 3],
            [18, 110, 2],
            [111, 169, 1],
            [170, 256, 0],
        ],
    }


@pytest.mark.parametrize(
    ("policy", "table"),
    [("static:7", [[1, 4, 7]]), ("table:[[1,2,8],[3,4,1]]", [[1, 2, 8], [3, 4, 1]])],
)
def test_export_raises_k_max_to_a_fixed_k_as_simulate_does(
    policy: str, table: list[list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A K past the profile's K_max (5) is num_speculative_tokens, the k_max `dsd simulate`
    runs the same SPEC at (one rule: policies.spec.run_k_max)."""
    from dsd.sim.config import RunConfig
    from dsd.sim.resolve import resolve

    argv = ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "4", "--policy", policy]
    code, out, err = _run(argv, capsys)
    assert (code, err) == (0, "")
    config = json.loads(out)
    assert config["num_speculative_tokens_per_batch_size"] == table
    run = RunConfig(profile=str(H100), policy=policy, num_prompts=2, max_concurrency=2)
    assert config["num_speculative_tokens"] == resolve(run).k_max == max(k for *_, k in table)


def test_export_with_method_model_and_out_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "spec.json"
    argv = ["export", "vllm", "--profile", str(FIXTURE), "--max-num-seqs", "64"]
    argv += ["--policy", "static:2", "--method", "eagle", "--draft-model", "yuhuili/EAGLE"]
    code, out, _ = _run([*argv, "--out", str(out_file)], capsys)
    assert (code, out) == (0, "")
    assert json.loads(out_file.read_text()) == {
        "method": "eagle",
        "model": "yuhuili/EAGLE",
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": [[1, 64, 2]],
    }


def test_export_dsd_json_reproduces_the_pr32374_file(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "8"]
    code, out, _ = _run([*argv, "--format", "dsd-json"], capsys)
    assert code == 0
    assert json.loads(out) == json.loads(H100.read_text())


def test_explain_shows_profiled_and_changing_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        ["policy", "explain", "--profile", str(H100), "--max-num-seqs", "256"], capsys
    )
    assert code == 0
    first_cells = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert first_cells == ["1", "4", "16", "18", "64", "111", "170", "256"]
    assert "range table: [[1, 17, 3], [18, 110, 2], [111, 169, 1], [170, 256, 0]]" in out


def test_explain_all_has_one_row_per_batch_size(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["policy", "explain", "--profile", str(FIXTURE), "--max-num-seqs", "40", "--all"]
    code, out, _ = _run(argv, capsys)
    assert code == 0
    assert sum(1 for line in out.splitlines() if line.startswith("│")) == 40


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        # missing profile file
        (
            ["export", "vllm", "--profile", "nope.json", "--max-num-seqs", "4"],
            "nope.json: no such file",
        ),
        # bad policy
        (
            ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "4", "--policy", "x"],
            "unknown policy 'x'",
        ),
        # static K past what any run may draft (a K past the profile's raises k_max)
        (
            [
                "export",
                "vllm",
                "--profile",
                str(H100),
                "--max-num-seqs",
                "4",
                "--policy",
                "static:99",
            ],
            "K=99 exceeds k_max 64",
        ),
        # bad range table
        (
            [
                "export",
                "vllm",
                "--profile",
                str(H100),
                "--max-num-seqs",
                "4",
                "--policy",
                "table:[[2,4,1]]",
            ],
            "must start at batch size 1",
        ),
        # max_num_seqs 0
        (
            ["policy", "explain", "--profile", str(H100), "--max-num-seqs", "0"],
            "--max-num-seqs: must be an integer in [1, 1048576]",
        ),
        # max_num_seqs far past any engine: used to allocate a dense table and crash
        (
            ["export", "vllm", "--profile", str(H100), "--max-num-seqs", str(10**20)],
            "--max-num-seqs: must be an integer in [1, 1048576]",
        ),
        # missing required option
        pytest.param(["export", "vllm", "--profile", str(H100)], "--max-num-seqs"),
        # bad --format value
        pytest.param(
            ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "4", "--format", "yaml"],
            "yaml",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert fragment in lines[0]


def test_bad_profile_content_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(H100.read_text())
    data["batch_stats"]["4"]["1"] = -1
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    code, _, err = _run(["export", "vllm", "--profile", str(path), "--max-num-seqs", "4"], capsys)
    assert code == 2
    assert err == f"error: {path}: batch_stats['4']['1']: ITL must be finite and > 0, got -1\n"


def test_out_file_is_not_written_on_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "spec.json"
    argv = ["export", "vllm", "--profile", str(H100), "--max-num-seqs", "4", "--policy", "bad"]
    code, _, _ = _run([*argv, "--out", str(out_file)], capsys)
    assert code == 2
    assert list(tmp_path.iterdir()) == []


@st.composite
def random_profiles(draw: st.DrawFn) -> Profile:
    """Valid profiles: B=1 plus random B; K=0, 1, k_max at every B plus random K."""
    k_max = draw(st.integers(1, 6))
    batch_sizes = sorted({1, *draw(st.lists(st.integers(2, 200), max_size=3))})
    points = []
    for b in batch_sizes:
        for k in sorted({0, 1, k_max, *draw(st.lists(st.integers(0, k_max), max_size=2))}):
            points.append(LatencyPoint(b, k, draw(st.floats(1.0, 100.0))))
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=k_max, max_size=k_max))
    rates = tuple(float(r) for r in np.minimum.accumulate(np.array(raw)))
    return Profile(k_max=k_max, latency=tuple(points), acceptance_rates=rates)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(profile=random_profiles(), max_num_seqs=st.integers(1, 200))
def test_export_reload_round_trip_equals_the_policy_for_every_b(
    profile: Profile, max_num_seqs: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile_path = tmp_path / "profile.json"
    save_profile(profile, profile_path)
    argv = ["export", "vllm", "--profile", str(profile_path), "--max-num-seqs", str(max_num_seqs)]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    spec, k_max = spec_from_speculative_config(out)
    reloaded = parse_policy(spec, profile=None, k_max=k_max, max_num_seqs=max_num_seqs)
    direct = GoodputPolicy(load_profile(profile_path), max_num_seqs)
    for batch_size in range(1, max_num_seqs + 1):
        view = synthetic_view(batch_size, profile.k_max)
        assert reloaded.choose_k(view) == direct.choose_k(view), batch_size


def test_speculative_config_rejects_k_above_k_max() -> None:
    with pytest.raises(InputError, match="K=4 exceeds num_speculative_tokens 3"):
        speculative_config([[1, 8, 4]], 3)


def test_speculative_config_without_table_reads_as_static() -> None:
    spec, k_max = spec_from_speculative_config('{"method": "eagle", "num_speculative_tokens": 3}')
    assert (spec, k_max) == ("static:3", 3)
    policy = parse_policy(spec, profile=None, k_max=k_max, max_num_seqs=8)
    assert policy.choose_k(synthetic_view(8, 5)) == 3


# --- dsd export trtllm / sglang: the same table, other engines' formats ----------------------


def test_export_trtllm_h100_is_the_vllm_table_as_draft_len_schedule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(
        ["export", "trtllm", "--profile", str(H100), "--max-num-seqs", "256"], capsys
    )
    assert (code, err) == (0, "")
    # vLLM: [[1, 17, 3], [18, 110, 2], [111, 169, 1], [170, 256, 0]] (the test above)
    assert json.loads(out) == {
        "max_batch_size": 256,
        "speculative_config": {
            "max_draft_len": 3,
            "draft_len_schedule": {"17": 3, "110": 2, "169": 1, "256": 0},
        },
    }


def test_export_sglang_h100_slots_and_the_launch_note(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "sglang", "--profile", str(H100), "--max-num-seqs", "256"]
    code, out, err = _run([*argv, "--method", "eagle", "--draft-model", "yuhuili/EAGLE"], capsys)
    assert code == 0
    assert json.loads(out) == {
        "1": {"candidate_steps": [3]},
        "18": {"candidate_steps": [2]},
        "111": {"candidate_steps": [1]},
        "170": {"candidate_steps": [0]},
    }
    assert err == (
        "note: launch SGLang with --speculative-algorithm EAGLE --speculative-draft-model-path "
        "yuhuili/EAGLE --speculative-eagle-topk 1 --speculative-adaptive "
        "--speculative-adaptive-config FILE --max-running-requests 256; SGLang pads a batch to "
        "its next captured CUDA-graph size before choosing a slot, so include 17 110 169 in "
        "--cuda-graph-bs (or pass --disable-cuda-graph), otherwise a B between two captured "
        "sizes takes the K of the larger\n"
    )


@pytest.mark.parametrize("engine", ["trtllm", "sglang"])
def test_export_engine_with_out_file(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / f"{engine}.json"
    argv = ["export", engine, "--profile", str(FIXTURE), "--max-num-seqs", "64"]
    code, out, err = _run([*argv, "--policy", "static:2", "--out", str(out_file)], capsys)
    assert (code, out) == (0, "")
    written = json.loads(out_file.read_text())
    if engine == "trtllm":
        assert written["speculative_config"]["draft_len_schedule"] == {"64": 2}
    else:
        assert written == {"1": {"candidate_steps": [2]}}
        assert f"--speculative-adaptive-config {out_file} " in err
        assert "--cuda-graph-bs" not in err  # one slot: nothing for padding to shift


@pytest.mark.parametrize("engine", ["trtllm", "sglang"])
@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--policy", "x"], "unknown policy 'x'"),
        (["--policy", "static:99"], "K=99 exceeds k_max 64"),
        (["--policy", "table:[[2,4,1]]"], "must start at batch size 1"),
        (["--policy", "static:0"], "policy static:0: K is 0 at every batch size"),
        (["--method", "medusa"], "--method 'medusa'"),
    ],
)
def test_export_engine_bad_input_is_one_error_line(
    engine: str, extra: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "config.json"
    argv = ["export", engine, "--profile", str(H100), "--max-num-seqs", "4", *extra]
    code, out, err = _run([*argv, "--out", str(out_file)], capsys)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("engine", ["trtllm", "sglang"])
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--profile", "nope.json", "--max-num-seqs", "4"], "nope.json: no such file"),
        (["--profile", str(H100), "--max-num-seqs", "0"], "--max-num-seqs: must be an integer"),
        (["--profile", str(H100)], "--max-num-seqs"),
    ],
)
def test_export_engine_bad_profile_or_size(
    engine: str, argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["export", engine, *argv], capsys)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]


def test_export_trtllm_refuses_a_table_it_cannot_express(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["export", "trtllm", "--profile", str(H100), "--max-num-seqs", "16"]
    code, out, err = _run([*argv, "--policy", "table:[[1,4,1],[5,16,2]]"], capsys)
    assert (code, out) == (2, "")
    assert err == (
        "error: --policy table:[[1,4,1],[5,16,2]]: K=2 at B=5..16 is above K=1 at B=1; "
        "TensorRT-LLM's draft_len_schedule needs the draft length at B=1 (max_draft_len) to be "
        "the largest\n"
    )


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(profile=random_profiles(), max_num_seqs=st.integers(1, 200))
def test_engine_exports_give_the_vllm_k_at_every_b(
    profile: Profile, max_num_seqs: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command line: TensorRT-LLM's lookup (first key >= B) and SGLang's slot
    routing (last key <= B, CUDA graphs off) of the printed configs against vLLM's table."""
    profile_path = tmp_path / "profile.json"
    save_profile(profile, profile_path)
    argv = ["--profile", str(profile_path), "--max-num-seqs", str(max_num_seqs)]
    code, out, err = _run(["export", "vllm", *argv], capsys)
    assert code == 0, err
    table = json.loads(out)["num_speculative_tokens_per_batch_size"]

    def vllm_k(b: int) -> int:
        return next(k for start, end, k in table if start <= b <= end)

    expected = [vllm_k(b) for b in range(1, max_num_seqs + 1)]
    code, out, err = _run(["export", "sglang", *argv], capsys)
    if not any(expected):
        assert code == 2 and "K is 0 at every batch size" in err
        return
    assert code == 0, err
    slots = sorted((int(key), entry["candidate_steps"]) for key, entry in json.loads(out).items())
    for b in range(1, max_num_seqs + 1):
        steps = [s for key, s in slots if key <= b][-1]
        assert steps == [expected[b - 1]], b
    code, out, err = _run(["export", "trtllm", *argv], capsys)
    if max(expected) > expected[0]:
        assert code == 2 and "is above K=" in err
        return
    assert code == 0, err
    schedule = sorted(
        (int(b), k) for b, k in json.loads(out)["speculative_config"]["draft_len_schedule"].items()
    )
    for b in range(1, max_num_seqs + 1):
        assert next(k for top, k in schedule if b <= top) == expected[b - 1], b
