"""Fuzz the profile loader (native JSON and PR #32374's file) with structured mutations.

Property: for any bytes derived from a valid profile (fields dropped, renamed, retyped,
NaN/inf/negative/huge numbers, wrong nesting, truncated text, non-UTF-8 bytes),
`load_profile` either returns a Profile that the goodput policy and the writers can use, or
raises InputError with one line naming the file. Nothing else escapes.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
from fuzz_helpers import FIXTURE_PROFILE, H100_PROFILE, count_case, mutated_json_files
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.policies.goodput import GoodputPolicy
from dsd.policies.profile import Profile
from dsd.policies.profile_io import (
    load_profile,
    parse_profile,
    profile_to_native,
    profile_to_pr32374,
    save_profile,
)
from dsd.policies.range_table import synthetic_view

PR_DOCUMENTS = [json.loads(path.read_text()) for path in (H100_PROFILE, FIXTURE_PROFILE)]
NATIVE_DOCUMENT = profile_to_native(load_profile(H100_PROFILE))
# A native profile with counts, context lengths, percentiles, prefill and per-request samples,
# so that every optional field is there to be mutated.
RICH_NATIVE_DOCUMENT = {
    "format": "dsd-profile",
    "version": 1,
    "k_max": 2,
    "temperature": 0.0,
    "metadata": {"device": "cpu"},
    "latency": [
        {
            "batch_size": b,
            "num_spec_tokens": k,
            "median_ms": 5.0 + b + k,
            "context_len": c,
            "p10_ms": 4.0 + b + k,
            "p90_ms": 6.0 + b + k,
            "n": 5,
        }
        for b in (1, 4)
        for k in (0, 1, 2)
        for c in (128, 1024)
    ],
    "prefill": [{"num_tokens": 512, "median_ms": 20.0, "batch_size": 1, "n": 3}],
    "acceptance": {"drafted_at_pos": [100, 80], "accepted_at_pos": [70, 40]},
    "per_request_rates": [[0.9, 0.5], [0.5]],
}


def _check_loaded_profile_is_usable(profile: Profile, folder: Path) -> None:
    """A profile the loader accepted must drive the goodput policy and survive a round trip."""
    assert profile.k_max >= 1
    assert all(0.0 <= r <= 1.0 for r in profile.acceptance_rates)
    policy = GoodputPolicy(profile, max_num_seqs=64)
    for batch_size in (1, 2, 7, 64):
        k = policy.choose_k(synthetic_view(batch_size, profile.k_max))
        assert 0 <= int(np.asarray(k).max()) <= profile.k_max
    target = folder / "round_trip.json"
    save_profile(profile, target)
    again = load_profile(target)
    assert again.k_max == profile.k_max
    assert again.acceptance_rates == profile.acceptance_rates
    pr = profile_to_pr32374(profile)
    assert all(math.isfinite(v) for row in pr["batch_stats"].values() for v in row.values())


def _load_and_classify(data: bytes, name: str) -> str:
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        path = folder / name
        path.write_bytes(data)
        try:
            profile = load_profile(path)
        except InputError as exc:
            message = str(exc)
            assert "\n" not in message, message
            assert message.startswith(str(path)), message
            return "error"
        _check_loaded_profile_is_usable(profile, folder)
        return "ok"


@given(data=st.sampled_from(PR_DOCUMENTS).flatmap(mutated_json_files))
def test_mutated_pr32374_profile_loads_or_names_the_problem(data: bytes) -> None:
    count_case("profile json (PR #32374)", _load_and_classify(data, "dynamic_config.json"))


@given(data=st.sampled_from([NATIVE_DOCUMENT, RICH_NATIVE_DOCUMENT]).flatmap(mutated_json_files))
def test_mutated_native_profile_loads_or_names_the_problem(data: bytes) -> None:
    count_case("profile json (native)", _load_and_classify(data, "profile.json"))


# Arbitrary JSON values (not derived from a valid file): the parser must never crash on them.
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(value=_json_values, native=st.booleans())
def test_arbitrary_json_values_never_crash_the_parser(value: object, native: bool) -> None:
    document: object = value
    if native and isinstance(value, dict):
        document = {"format": "dsd-profile", "version": 1, **value}
    try:
        parse_profile(document, "fuzz.json")
        outcome = "ok"
    except InputError as exc:
        assert "\n" not in str(exc)
        outcome = "error"
    count_case("profile json (arbitrary values)", outcome)


def test_deeply_nested_json_is_an_input_error(tmp_path: Path) -> None:
    # Python's json recurses per nesting level; a hostile file must not end in RecursionError.
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    try:
        load_profile(path)
    except InputError as exc:
        assert str(exc).startswith(str(path))
    else:  # pragma: no cover - a list is never a profile
        raise AssertionError("a nested list loaded as a profile")
