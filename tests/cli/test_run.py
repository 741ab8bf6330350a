"""`dsd run` end to end on tiny random-weight models: vLLM bench JSON, run outputs, the
simulator's workload flags, one-line errors."""

from __future__ import annotations

import json

import pytest

# (arguments, fragment of the one-line error)
CLI_ERRORS = [
    (["--target", "tiny", "--draft", "ngram:4-1"], "ngram:MIN-MAX"),  # MIN above MAX
    (["--target", "tiny", "--draft", "NGRAM"], "write ngram"),  # one spelling
    (["--target", "tiny", "--draft", "early-exit:5"], "early-exit:5"),  # deeper than the target
    (["--target", "no-such-model"], "no-such-model"),  # neither a shape nor a file
    (["--target", "tiny", "--device", "tpu"], "--device"),  # unknown device
    # found by the CLI fuzz test: torch overflowed on it
    (["--target", "tiny", "--threads", "99999999999999999999"], "--threads: must be an integer"),
]


def test_dsd_run_prints_vllm_bench_json(capsys) -> None:
    import json

    from dsd.cli import main

    main(
        [
            "run",
            "--target", "tiny",
            "--draft", "tiny-draft",
            "--policy", "static:2",
            "--max-concurrency", "2",
            "--num-prompts", "3",
            "--dataset-name", "mt-bench",
            "--output-len", "6",
            "--ignore-eos",
            "--json",
        ]
    )  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed"] == 3
    assert metrics["total_output_tokens"] == 18  # --ignore-eos: every request gets all 6
    assert metrics["mean_tpot_ms"] > 0 and metrics["k_histogram"] == {
        "2": metrics["spec_decode_num_drafts"]
    }


@pytest.mark.parametrize(("args", "fragment"), CLI_ERRORS)
def test_dsd_run_bad_input_exits_2_with_one_line(args, fragment, capsys) -> None:
    from dsd.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--num-prompts", "1", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1


def test_dsd_run_writes_the_run_outputs_and_the_profile_the_bandit_learned(
    tmp_path, capsys
) -> None:
    from dsd.cli import main
    from dsd.policies.profile_io import load_profile

    out = tmp_path / "run"
    args = ["run", "--target", "tiny", "--draft", "early-exit:1", "--num-spec-tokens", "2",
            "--num-prompts", "3", "--output-len", "8", "--max-model-len", "256", "--json",
            "--out", str(out)]  # fmt: skip
    main([*args, "--policy", "bandit"])
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["backend"] == "dsd-torch" and metrics["completed"] == 3
    assert json.loads((out / "result.json").read_text()) == metrics
    assert {p.name for p in out.iterdir()} >= {"requests.csv", "steps.parquet", "config.json"}
    learned = load_profile(out / "learned_profile.json")
    assert learned.k_max == 2 and learned.metadata["observed_steps"] > 0
    # A policy that learns nothing writes no learned profile.
    main([*args[:-1], str(tmp_path / "static"), "--policy", "static:2"])
    assert not (tmp_path / "static" / "learned_profile.json").exists()
    capsys.readouterr()
    # An --out that is a file is refused before the run, with one line.
    with pytest.raises(SystemExit) as exit_info:
        main([*args[:-1], str(out / "result.json"), "--policy", "bandit"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and err.count("\n") == 1


def test_dsd_run_takes_the_simulators_workload_flags(capsys) -> None:
    from dsd.cli import main

    # A draining rollout of 3 requests, outputs capped at 6 tokens, prompts of 20 tokens.
    main(["run", "--target", "tiny", "--draft", "early-exit:1", "--num-spec-tokens", "2",
          "--policy", "static:2", "--dataset-name", "rl-rollout", "--num-prompts", "3",
          "--rollout-median", "4", "--rollout-max", "6", "--rollout-prompt-len", "20",
          "--max-model-len", "256", "--ignore-eos", "--json"])  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed"] == 3
    assert metrics["total_input_tokens"] == 3 * 20
    assert 3 <= metrics["total_output_tokens"] <= 3 * 6


def test_dsd_run_drafts_by_prompt_lookup(capsys) -> None:  # type: ignore[no-untyped-def]
    from dsd.cli import main

    main(["run", "--target", "tiny", "--draft", "ngram:1-3", "--num-spec-tokens", "3",
          "--num-prompts", "3", "--output-len", "12", "--ignore-eos", "--json"])  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["completed"] == 3 and metrics["draft"] == "ngram:1-3"
    # drafts counted are the ones found: at most K per decode step
    assert metrics["spec_decode_draft_tokens"] <= 3 * metrics["spec_decode_num_drafts"]


def test_dsd_run_outputs_are_the_same_tokens_whatever_the_draft(tmp_path, capsys) -> None:
    """outputs.jsonl holds what each request generated (text too with a tokenizer); greedy
    verification is lossless, so no draft, an early exit and n-gram lookup agree token for
    token."""
    from mock_models import byte_checkpoint

    from dsd.cli import main

    target = byte_checkpoint(tmp_path, "target", "nano-target", seed=3)
    outputs = {}
    for draft in ("none", "early-exit:1", "ngram:1-2"):
        out = tmp_path / draft.replace(":", "-")
        main(["run", "--target", target, "--draft", draft, "--num-spec-tokens", "3",
              "--dataset-name", "mt-bench", "--num-prompts", "3", "--output-len", "10",
              "--max-concurrency", "2", "--json", "--out", str(out)])  # fmt: skip
        capsys.readouterr()
        lines = (out / "outputs.jsonl").read_text(encoding="utf-8").splitlines()
        outputs[draft] = [json.loads(line) for line in lines]
    rows = outputs["none"]
    assert [row["req_id"] for row in rows] == [0, 1, 2]
    assert all(1 <= len(row["token_ids"]) <= 10 and isinstance(row["text"], str) for row in rows)
    assert outputs["early-exit:1"] == rows and outputs["ngram:1-2"] == rows
