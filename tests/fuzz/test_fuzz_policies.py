"""Fuzz policy SPEC strings and vLLM range tables (inline JSON and files).

Property: `parse_policy` returns a policy whose choose_k answers every B in 1..max_num_seqs
with K in [0, k_max] (and keeps doing so after observing feedback), or raises a one-line
InputError. Range tables that load obey vLLM's rules after expansion.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from fuzz_helpers import H100_PROFILE, corrupted_bytes, count_case
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.policies.profile_io import load_profile
from dsd.policies.range_table import expand_ranges, read_ranges, synthetic_view
from dsd.policies.spec import POLICY_BUILDERS, parse_policy
from dsd.policies.types import StepFeedback

PROFILE = load_profile(H100_PROFILE)

# Numbers as users type them into SPEC strings: valid, boundary, malformed, non-finite, huge.
_number_texts = st.sampled_from(
    ("0", "1", "2", "3", "5", "-1", "0.5", "1e9", "nan", "inf", "-inf", "", "x", "1e400",
     "99999999999999999999999", "²", " 2 ", "0x10", "1_000")
)  # fmt: skip
_range_entry = st.lists(
    st.one_of(
        st.integers(-3, 300),
        st.sampled_from([True, 1.5, "1", None, 2**70]),
    ),
    min_size=2,
    max_size=4,
)


@st.composite
def _valid_range_tables(draw: st.DrawFn) -> list[list[int]]:
    """Tables vLLM accepts: starts at 1, no overlap, gaps allowed, any order."""
    ranges, start = [], 1
    for _ in range(draw(st.integers(1, 5))):
        end = start + draw(st.integers(0, 80))
        ranges.append([start, end, draw(st.integers(0, 9))])
        start = end + 1 + draw(st.sampled_from((0, 0, 3)))  # sometimes a gap
    return draw(st.permutations(ranges))


_range_tables = st.one_of(
    _valid_range_tables(),
    # well-formed shapes with random bounds (mostly invalid)
    st.lists(
        st.tuples(st.integers(-1, 300), st.integers(-1, 300), st.integers(-1, 9)).map(list),
        min_size=0,
        max_size=6,
    ),
    st.lists(_range_entry, max_size=4),
)


def _table_text(draw: st.DrawFn) -> str:
    table = draw(_range_tables)
    if draw(st.booleans()):
        return json.dumps(table)
    return json.dumps({"num_speculative_tokens_per_batch_size": table, "method": "eagle"})


@st.composite
def policy_specs(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(sorted(POLICY_BUILDERS)) | st.sampled_from(("", "Static", "x")))
    shape = draw(st.sampled_from(("bare", "number", "keys", "table", "text", "nested")))
    if shape == "bare":
        return name
    if shape == "number":
        return f"{name}:{draw(_number_texts)}"
    if shape == "table":
        return f"{draw(st.sampled_from(('table', 'table', name)))}:{_table_text(draw)}"
    if shape == "nested":
        return f"{name}:{draw(st.sampled_from(sorted(POLICY_BUILDERS)))}:{draw(_number_texts)}"
    if shape == "keys":
        keys = draw(
            st.lists(
                st.sampled_from(
                    (
                        "warmup_steps",
                        "prior_strength",
                        "decay",
                        "recompute_tolerance",
                        "seed",
                        "table",
                        "margin",
                        "min_dwell_steps",
                        "bogus",
                        "",
                    )
                ),
                max_size=3,
            )
        )
        items = [f"{key}={draw(_number_texts)}" for key in keys]
        return f"{name}:{','.join(items)}"
    return f"{name}:{draw(st.text(max_size=20))}"


def _feedback(
    step_index: int, batch_size: int, k: np.ndarray, rng: np.random.Generator
) -> StepFeedback:
    accepted = rng.integers(0, k + 1)  # [B] 0 <= a <= K
    return StepFeedback(
        step_index=step_index,
        time_s=0.01 * step_index,
        batch_size=batch_size,
        req_ids=np.arange(batch_size, dtype=np.int64),
        num_spec_tokens=k.astype(np.int64),
        num_accepted=accepted.astype(np.int64),
        duration_s=0.01,
        num_output_tokens=int(accepted.sum() + batch_size),
    )


@given(
    spec=policy_specs(),
    with_profile=st.booleans(),
    k_max=st.integers(0, 7),
    max_num_seqs=st.sampled_from((1, 3, 64, 300)),
)
def test_policy_spec_builds_a_sane_policy_or_names_the_problem(
    spec: str, with_profile: bool, k_max: int, max_num_seqs: int
) -> None:
    profile = PROFILE if with_profile else None
    if profile is not None:
        k_max = profile.k_max
    try:
        policy = parse_policy(spec, profile=profile, k_max=k_max, max_num_seqs=max_num_seqs, seed=0)
    except InputError as exc:
        # the message may quote the user's SPEC, newlines and all; dsd.cli.fail joins lines
        assert str(exc).strip(), spec
        count_case("policy SPEC", "error")
        return
    rng = np.random.default_rng(0)
    for step_index, batch_size in enumerate((1, max_num_seqs, max(1, max_num_seqs // 2), 1)):
        choice = np.asarray(policy.choose_k(synthetic_view(batch_size, k_max, 512)))
        assert choice.ndim == 0 or choice.shape == (batch_size,), (spec, choice.shape)
        k = np.broadcast_to(choice, (batch_size,)).astype(np.int64)  # [B]
        assert ((k >= 0) & (k <= k_max)).all(), (spec, batch_size, k)
        policy.observe(_feedback(step_index, batch_size, k, rng))
    count_case("policy SPEC", "ok")


@given(table=st.builds(lambda t: t, _range_tables), as_object=st.booleans())
def test_range_table_json_expands_by_vllm_rules_or_names_the_problem(
    table: list[list[object]], as_object: bool
) -> None:
    text = json.dumps({"num_speculative_tokens_per_batch_size": table} if as_object else table)
    try:
        ranges = read_ranges(text)
    except InputError as exc:
        assert "\n" not in str(exc)
        count_case("range table (inline JSON)", "error")
        return
    starts = [entry[0] for entry in ranges]
    assert starts[0] == 1 and starts == sorted(starts)
    k_by_batch = expand_ranges(ranges, 4, 256)  # [256]
    assert ((k_by_batch >= 0) & (k_by_batch <= 4)).all()
    count_case("range table (inline JSON)", "ok")


@given(data=st.builds(lambda t: json.dumps(t), _range_tables).flatmap(corrupted_bytes))
def test_range_table_file_loads_or_names_the_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "table.json"
        path.write_bytes(data)
        try:
            read_ranges(str(path))
        except InputError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
            count_case("range table (file)", "error")
            return
    count_case("range table (file)", "ok")
