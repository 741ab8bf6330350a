"""Loading, validating and writing profile files (native JSON and vLLM PR #32374's file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from policy_factories import FIXTURE_PROFILE, H100_PROFILE

from dsd.common.errors import InputError
from dsd.policies.profile import PrefillInDecodePoint
from dsd.policies.profile_io import (
    load_profile,
    profile_to_native,
    profile_to_pr32374,
    save_pr32374,
    save_profile,
)


def _pr32374(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "is_online": False,
        "batch_stats": {
            "1": {"0": 6.0, "1": 7.0, "2": 8.0},
            "4": {"0": 6.5, "1": 7.5, "2": 9.0},
        },
        "max_num_speculative_tokens": 2,
        "acceptance_rate_per_pos": [0.7, 0.4],
    }
    data.update(overrides)
    return data


def _native(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": "dsd-profile",
        "version": 1,
        "metadata": {"target": "tiny"},
        "k_max": 2,
        "temperature": 0.0,
        "latency": [
            {"batch_size": 1, "num_spec_tokens": k, "median_ms": 5.0 + k, "context_len": 128}
            for k in (0, 1, 2)
        ],
        "prefill": [{"num_tokens": 512, "batch_size": 1, "median_ms": 20.0, "n": 5}],
        "acceptance": {"drafted_at_pos": [100, 100], "accepted_at_pos": [70, 40]},
        "per_request_rates": [[0.9, 0.8], [0.5]],
    }
    data.update(overrides)
    return data


def _write(tmp_path: Path, data: Any, name: str = "profile.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_both_published_profiles_load() -> None:
    h100 = load_profile(H100_PROFILE)
    assert h100.k_max == 5
    assert h100.batch_sizes() == [1, 4, 16, 64, 256]
    assert h100.spec_token_values() == [0, 1, 3, 5]
    assert h100.acceptance_rates[0] == pytest.approx(0.6811801775995416)
    assert h100.metadata["source_format"] == "pr32374"
    fixture = load_profile(FIXTURE_PROFILE)
    assert fixture.k_max == 7
    assert fixture.batch_sizes() == [1, 16, 32, 64]


def test_native_counts_become_rates(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, _native()))
    assert profile.acceptance_rates == (0.7, 0.4)
    assert profile.drafted_at_pos == (100, 100)
    assert profile.prefill[0].num_tokens == 512
    assert profile.per_request_rates == ((0.9, 0.8), (0.5,))
    assert profile.latency[0].context_len == 128


def test_native_round_trip_is_identity(tmp_path: Path) -> None:
    first = load_profile(_write(tmp_path, _native()))
    out = tmp_path / "again.json"
    save_profile(first, out)
    second = load_profile(out)
    assert second == first
    assert profile_to_native(second) == profile_to_native(first)


def test_mean_ms_round_trips_and_is_what_points_charge(tmp_path: Path) -> None:
    data = _native()
    data["latency"][1]["mean_ms"] = 6.5
    data["prefill"][0]["mean_ms"] = 21.0
    first = load_profile(_write(tmp_path, data))
    assert [p.mean_ms for p in first.latency] == [None, 6.5, None]
    assert [p.expected_ms for p in first.latency] == [5.0, 6.5, 7.0]
    assert first.prefill[0].expected_ms == 21.0
    out = tmp_path / "again.json"
    save_profile(first, out)
    written = json.loads(out.read_text())
    assert written["latency"][1]["mean_ms"] == 6.5 and "mean_ms" not in written["latency"][0]
    assert written["prefill"][0]["mean_ms"] == 21.0
    assert load_profile(out) == first
    data["latency"][0]["mean_ms"] = -1.0
    with pytest.raises(InputError, match=r"latency\[0\]\.mean_ms"):
        load_profile(_write(tmp_path, data, "bad.json"))


def test_prefill_in_decode_round_trips_and_is_written_only_when_measured(tmp_path: Path) -> None:
    data = _native()
    plain = load_profile(_write(tmp_path, data))
    assert plain.prefill_in_decode == ()
    assert "prefill_in_decode" not in profile_to_native(plain)  # older profiles stay as they were
    data["prefill_in_decode"] = [
        {"num_tokens": 32, "decode_rows": 1, "added_ms": 6.5, "n": 10},
        {"num_tokens": 32, "decode_rows": 8, "added_ms": 0.0},
    ]
    first = load_profile(_write(tmp_path, data, "in_decode.json"))
    assert first.prefill_in_decode == (
        PrefillInDecodePoint(num_tokens=32, decode_rows=1, added_ms=6.5, n=10),
        PrefillInDecodePoint(num_tokens=32, decode_rows=8, added_ms=0.0),
    )
    out = tmp_path / "again.json"
    save_profile(first, out)
    assert load_profile(out) == first
    assert json.loads(out.read_text())["prefill_in_decode"] == data["prefill_in_decode"]


def test_draft_sequences_round_trip_and_bad_ones_are_refused(tmp_path: Path) -> None:
    data = _native(
        draft_outcomes=[[[1], [0, 1], [0, 0, 2]]],
        acceptance={"drafted_at_pos": [3, 2], "accepted_at_pos": [3, 2], "num_steps": 4},
        draft_sequences=[{"available": [2, 0, 2, 1], "matched": [2, 0, 1, 1]}],
    )
    first = load_profile(_write(tmp_path, data))
    assert first.draft_sequences == (((2, 0, 2, 1), (2, 0, 1, 1)),)
    out = tmp_path / "again.json"
    save_profile(first, out)
    assert load_profile(out) == first
    for sequences, fragment in [
        ([{"available": [3], "matched": [1]}], r"draft_sequences\[0\]\[0\].*k_max=2"),
        ([{"available": [1], "matched": [2]}], r"matched <= available"),
        ([{"available": [1, 1], "matched": [1]}], "equal non-empty"),
        ([{"available": [1]}], "matched"),
        ([], None),
        ([{"available": [1], "matched": [1]}] * 2, "2 sequences for 1 draft_outcomes"),
    ]:
        data["draft_sequences"] = sequences
        if fragment is None:
            assert load_profile(_write(tmp_path, data, "ok.json")).draft_sequences == ()
            continue
        with pytest.raises(InputError, match=fragment):
            load_profile(_write(tmp_path, data, "bad.json"))


def test_pr32374_round_trip_through_native_and_back(tmp_path: Path) -> None:
    original = json.loads(H100_PROFILE.read_text())
    profile = load_profile(H100_PROFILE)
    native_path = tmp_path / "native.json"
    save_profile(profile, native_path)
    back = profile_to_pr32374(load_profile(native_path))
    assert back == original
    pr_path = tmp_path / "dynamic_speculative_config.json"
    save_pr32374(profile, pr_path)
    assert json.loads(pr_path.read_text()) == original


def test_save_leaves_no_temp_files(tmp_path: Path) -> None:
    save_profile(load_profile(H100_PROFILE), tmp_path / "p.json")
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


PR_CASES = [
    # (overrides, expected fragment of the message)
    # negative ITL
    (
        {"batch_stats": {"1": {"0": 6.0, "1": -1, "2": 8.0}}},
        "batch_stats['1']['1']: ITL must be finite and > 0, got -1",
    ),
    # zero ITL
    ({"batch_stats": {"1": {"0": 0, "1": 7.0, "2": 8.0}}}, "batch_stats['1']['0']: ITL must be"),
    # ITL not a number
    (
        {"batch_stats": {"1": {"0": "fast", "1": 7.0, "2": 8.0}}},
        "batch_stats['1']['0']: must be a number",
    ),
    # negative K key
    (
        {"batch_stats": {"1": {"0": 6.0, "1": 7.0, "2": 8.0, "-1": 5.0}}},
        "batch_stats['1']['-1']: key must be an integer >= 0",
    ),
    # non-integer K key
    (
        {"batch_stats": {"1": {"0": 6.0, "1.5": 7.0, "2": 8.0}}},
        "batch_stats['1']['1.5']: key must be an integer",
    ),
    # B = 0
    (
        {"batch_stats": {"0": {"0": 6.0, "1": 7.0, "2": 8.0}}},
        "batch_stats['0']: key must be an integer >= 1, got '0'",
    ),
    # B = 1 missing
    (
        {"batch_stats": {"4": {"0": 6.0, "1": 7.0, "2": 8.0}}},
        "batch_stats: batch size 1 must be profiled",
    ),
    # K = 0 missing at B = 4
    (
        {"batch_stats": {"1": {"0": 6.0, "1": 7.0, "2": 8.0}, "4": {"1": 7.0, "2": 8.0}}},
        "B=4 is missing K=[0]",
    ),
    # K_max missing at B = 1
    ({"batch_stats": {"1": {"0": 6.0, "1": 7.0}}}, "B=1 is missing K=[2]"),
    # K above max_num_speculative_tokens
    ({"batch_stats": {"1": {"0": 6.0, "1": 7.0, "2": 8.0, "3": 9.0}}}, "K=3 > k_max 2"),
    # rate above 1
    (
        {"acceptance_rate_per_pos": [1.2, 0.4]},
        "acceptance_rate_per_pos[0]: acceptance rate must be in [0, 1], got 1.2",
    ),
    # rates rising: they are unconditional
    (
        {"acceptance_rate_per_pos": [0.4, 0.7]},
        "acceptance_rate_per_pos[1]: rates are unconditional and must be non-increasing",
    ),
    # wrong number of rates
    (
        {"acceptance_rate_per_pos": [0.7]},
        "acceptance_rate_per_pos: needs max_num_speculative_tokens=2 rates, got 1",
    ),
    # k_max not an integer
    ({"max_num_speculative_tokens": 2.5}, "max_num_speculative_tokens: must be an integer >= 1"),
    # is_online wrong type
    ({"is_online": "yes"}, "is_online: must be true or false"),
    # batch_stats not an object
    ({"batch_stats": [1, 2]}, "batch_stats: expected an object, got a list"),
]


@pytest.mark.parametrize(("overrides", "fragment"), PR_CASES)
def test_pr32374_errors_are_one_line_naming_the_field(
    tmp_path: Path, overrides: dict[str, Any], fragment: str
) -> None:
    path = _write(tmp_path, _pr32374(**overrides))
    with pytest.raises(InputError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert fragment in message


NATIVE_CASES = [
    # accepted > drafted
    (
        {"acceptance": {"drafted_at_pos": [10, 10], "accepted_at_pos": [11, 4]}},
        "acceptance.accepted_at_pos[0]: accepted 11 > drafted 10",
    ),
    # counts whose rates rise
    (
        {"acceptance": {"drafted_at_pos": [10, 5], "accepted_at_pos": [4, 4]}},
        "must be non-increasing",
    ),
    # only one count list
    ({"acceptance": {"drafted_at_pos": [10, 10]}}, "acceptance: missing field 'accepted_at_pos'"),
    # neither rates nor counts
    ({"acceptance": {}}, "acceptance: needs 'rates' or both"),
    # rates length != k_max
    ({"acceptance": {"rates": [0.5]}}, "acceptance: needs k_max=2 positions, got 1"),
    # latency point with NaN median
    (
        {"latency": [{"batch_size": 1, "num_spec_tokens": 0, "median_ms": float("nan")}]},
        "latency[0].median_ms: ITL must be finite and > 0",
    ),
    # latency point without batch_size
    (
        {"latency": [{"num_spec_tokens": 0, "median_ms": 3.0}]},
        "latency[0]: missing field 'batch_size'",
    ),
    # bool is not an integer
    (
        {"latency": [{"batch_size": True, "num_spec_tokens": 0, "median_ms": 3.0}]},
        "latency[0].batch_size: must be an integer >= 1",
    ),
    # negative K
    (
        {"latency": [{"batch_size": 1, "num_spec_tokens": -1, "median_ms": 3.0}]},
        "latency[0].num_spec_tokens: must be an integer >= 0, got -1",
    ),
    # per-request sample longer than k_max
    (
        {"per_request_rates": [[0.5, 0.4, 0.3]]},
        "per_request_rates[0]: has 3 positions, more than k_max=2",
    ),
    # per-request sample rising
    ({"per_request_rates": [[0.1, 0.4]]}, "per_request_rates[0][1]: rates are unconditional"),
    # bad prefill
    (
        {"prefill": [{"num_tokens": 0, "median_ms": 1.0}]},
        "prefill[0].num_tokens: must be an integer >= 1, got 0",
    ),
    # bad prefill in decode steps
    (
        {"prefill_in_decode": [{"num_tokens": 8, "decode_rows": 1, "added_ms": -1.0}]},
        "prefill_in_decode[0].added_ms: must be finite and >= 0 ms",
    ),
    (
        {"prefill_in_decode": [{"num_tokens": 8, "added_ms": 1.0}]},
        "prefill_in_decode[0]: missing field 'decode_rows'",
    ),
    # unsupported version
    ({"version": 2}, "version: unsupported version 2, expected 1"),
    # negative temperature
    ({"temperature": -0.5}, "temperature: must be finite and >= 0"),
    # unknown format string
    ({"format": "something-else"}, "format: unknown profile format 'something-else'"),
    # what the forward of n tokens computes is at least n, and a list
    (
        {"metadata": {"forward_tokens": [1, 1, 4]}},
        "metadata.forward_tokens[1]: must be an integer >= 2",
    ),
    ({"metadata": {"forward_tokens": "1,4,4"}}, "metadata.forward_tokens: expected a list"),
]


@pytest.mark.parametrize(("overrides", "fragment"), NATIVE_CASES)
def test_native_errors_are_one_line_naming_the_field(
    tmp_path: Path, overrides: dict[str, Any], fragment: str
) -> None:
    path = _write(tmp_path, _native(**overrides))
    with pytest.raises(InputError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message
    assert fragment in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            '{"batch_stats": {\n  "1": {"0": 6.0,,}}}',
            "line 2 column",
        ),  # syntax error names the line
        ("[1, 2]", "expected a JSON object at the top level"),  # not an object
        ('{"hello": 1}', "unknown profile format"),  # neither format
    ],
)
def test_malformed_files_are_one_line_errors(tmp_path: Path, text: str, fragment: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InputError, match=None) as info:
        load_profile(path)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_a_profile_takes_another_profiles_acceptance_and_keeps_its_own_timing() -> None:
    # drawn acceptance: our engine's timing (random weights) with a trained pair's acceptance
    from dataclasses import replace

    from dsd.policies.profile_io import load_profile

    pr = load_profile(H100_PROFILE)  # k_max 5, per-position rates only
    ours = load_profile(
        Path(__file__).parents[1] / "data" / "profiles" / "cpu_smollm2_ngram_2026-11-27f.json"
    )
    three = replace(ours, k_max=3, latency=tuple(p for p in ours.latency if p.num_spec_tokens <= 3))
    combined = three.with_acceptance_of(pr, "pr.json")
    assert combined.acceptance_rates == pr.acceptance_rates[:3]
    assert combined.latency == three.latency and combined.prefill == three.prefill
    assert combined.host_overhead == three.host_overhead
    # the n-gram profile's draft rates and outcomes are gone: the PR's head drafts its K, and
    # its counts are for another k_max
    assert ours.draft_rates is not None and combined.draft_rates is None
    assert combined.draft_outcomes == () and combined.draft_sequences == ()
    assert combined.accepted_at_pos is None
    assert combined.metadata["acceptance_from"] == "pr.json"
    with pytest.raises(ValueError, match="has 3 positions, the profile's k_max is 5"):
        pr.with_acceptance_of(combined, "short.json")
