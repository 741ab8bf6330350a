"""SPEC strings -> policies, and every policy's answer to any view."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_factories import h100_profile

from dsd.common.errors import InputError
from dsd.policies.bandit import BanditPolicy
from dsd.policies.envelope import EnvelopePolicy, StaticSweep
from dsd.policies.goodput import GoodputPolicy
from dsd.policies.online import OnlineAcceptancePolicy
from dsd.policies.range_table import RangeTablePolicy, synthetic_view
from dsd.policies.spec import POLICY_BUILDERS, parse_policy, spec_k_max, split_policy_list
from dsd.policies.static import StaticPolicy
from dsd.policies.types import MAX_NUM_SEQS, StepView


def _parse(spec: str, profile: bool = True):  # type: ignore[no-untyped-def]
    return parse_policy(spec, profile=h100_profile() if profile else None, k_max=5, max_num_seqs=64)


@pytest.mark.parametrize(
    ("spec", "kind", "k_at_b1"),
    [
        ("static:3", StaticPolicy, 3),  # fixed K
        ("static:0", StaticPolicy, 0),  # plain decoding
        ("table:[[1,8,4],[9,64,1]]", RangeTablePolicy, 4),  # inline range table
        ("goodput", GoodputPolicy, 3),  # PR #32374 rule on the H100 profile
        ("online", OnlineAcceptancePolicy, 3),  # defaults
        ("online:warmup_steps=5,decay=0.9,prior_strength=10", OnlineAcceptancePolicy, 3),
        (" GOODPUT ", GoodputPolicy, 3),  # case and spaces are forgiven
    ],
)
def test_valid_specs(spec: str, kind: type, k_at_b1: int) -> None:
    policy = _parse(spec)
    assert isinstance(policy, kind)
    assert policy.choose_k(synthetic_view(1, 5)) == k_at_b1


def test_online_keys_reach_the_config() -> None:
    policy = _parse("online:warmup_steps=5,decay=0.9,prior_strength=10,recompute_tolerance=0")
    assert isinstance(policy, OnlineAcceptancePolicy)
    assert (policy.config.warmup_steps, policy.config.decay) == (5, 0.9)
    assert (policy.config.prior_strength, policy.config.recompute_tolerance) == (10.0, 0.0)


def test_table_spec_reads_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "table.json"
    path.write_text("[[1, 2, 5], [3, 64, 2]]")
    policy = _parse(f"table:{path}")
    assert policy.choose_k(synthetic_view(3, 5)) == 2


@pytest.mark.parametrize(
    ("spec", "profile", "fragment"),
    [
        (
            "magic",
            True,
            "unknown policy 'magic'; known: bandit, context, envelope, goodput, hysteresis, "
            "online, per-request, static, table",
        ),
        ("static:", True, "needs an integer K >= 0"),  # K empty
        ("static:-1", True, "needs an integer K >= 0"),  # negative
        ("static:two", True, "needs an integer K >= 0"),  # not a number
        ("static:9", True, "K=9 exceeds k_max 5"),  # more than the engine drafts
        ("table:", True, "needs a JSON list or a file path"),
        ("table:[[2,8,1]]", True, "must start at batch size 1"),
        ("table:[[1,8,1],", True, "invalid JSON"),
        ("goodput", False, "needs a profile (--profile)"),
        ("goodput:3", True, "expected key=value with key in ['acceptance']"),
        ("goodput:acceptance=median", True, "acceptance must be sequences or rates"),
        ("online", False, "needs a profile"),
        ("online:speed=3", True, "expected key=value with key in"),
        ("online:decay", True, "expected key=value"),
        ("online:warmup_steps=1.5", True, "warmup_steps must be an integer"),
        ("online:decay=2", True, "decay must be in (0, 1]"),
    ],
)
def test_bad_specs_are_one_line_input_errors(spec: str, profile: bool, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        _parse(spec, profile)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_table_file_is_an_input_error_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=r"nope\.json: no such file"):
        _parse(f"table:{tmp_path / 'nope.json'}")


SPECS = ["static:2", "static:5", "table:[[1,3,5],[10,64,2]]", "goodput", "online:warmup_steps=0"]


@given(
    spec=st.sampled_from(SPECS),
    batch_size=st.integers(0, 64),
    num_decode=st.integers(0, 64),
    k_max=st.integers(0, 5),
)
def test_every_policy_returns_k_in_range_for_any_view(
    spec: str, batch_size: int, num_decode: int, k_max: int
) -> None:
    num_decode = min(num_decode, batch_size)  # prefill chunks make up the rest; may be 0
    view = StepView(
        step_index=3,
        time_s=1.5,
        batch_size=batch_size,
        num_decode_reqs=num_decode,
        req_ids=np.arange(num_decode, dtype=np.int64),
        context_lens=np.full(num_decode, 100, dtype=np.int64),
        k_max=k_max,
    )
    k = _parse(spec).choose_k(view)
    assert 0 <= int(k) <= k_max


def test_registry_is_a_plain_dict_of_builders() -> None:
    assert type(POLICY_BUILDERS) is dict
    assert set(POLICY_BUILDERS) == {
        "static",
        "table",
        "goodput",
        "online",
        "per-request",
        "context",
        "hysteresis",
        "bandit",
        "envelope",
    }


@pytest.mark.parametrize(
    "build",
    [
        lambda n: GoodputPolicy(h100_profile(), n),
        lambda n: BanditPolicy(5, n, seed=0),
        lambda n: EnvelopePolicy(
            StaticSweep.from_records([{"concurrency": 1, "k": 2, "mean_tpot_ms": 4.0}]), n
        ),
    ],
)
def test_constructors_refuse_an_absurd_running_set_cap(build) -> None:  # type: ignore[no-untyped-def]
    # The per-B tables would be a huge allocation: one-line InputError, as parse_policy gives.
    with pytest.raises(InputError, match=r"max_num_seqs: must be an integer in \[1, 1048576\]"):
        build(MAX_NUM_SEQS + 1)


def test_static_without_k_drafts_k_max() -> None:
    policy = parse_policy("static", profile=None, k_max=3, max_num_seqs=8)
    assert policy.choose_k(synthetic_view(4, 3)) == 3


# (comma-separated text, the SPECs it holds)
POLICY_LISTS = [
    ("static:0,static:3,goodput", ["static:0", "static:3", "goodput"]),  # plain list
    # key=value pieces without ':' continue the SPEC before them
    (
        "online:warmup_steps=10,decay=0.99,static:3",
        ["online:warmup_steps=10,decay=0.99", "static:3"],
    ),
    # commas inside an inline table do not split
    ("table:[[1,8,3],[9,256,1]],goodput", ["table:[[1,8,3],[9,256,1]]", "goodput"]),
    # a nested SPEC with options
    ("hysteresis:goodput:margin=0.1,min_dwell=3", ["hysteresis:goodput:margin=0.1,min_dwell=3"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "specs"), POLICY_LISTS)
def test_policy_lists_split_between_specs_only(text: str, specs: list[str]) -> None:
    assert split_policy_list(text) == specs


@pytest.mark.parametrize(
    ("text", "message"), [("static:0,,goodput", "empty SPEC"), ("goodput,goodput", "duplicate")]
)
def test_bad_policy_lists_are_input_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        split_policy_list(text)


@pytest.mark.parametrize(
    ("spec", "k_max"),
    [
        ("static:6", 6),
        (" Static:0 ", 0),
        ("static:999", 64),  # MAX_SPEC_TOKENS: the builder then refuses the K
        ("table:[[1,8,4],[9,64,1]]", 4),
        ("hysteresis:table:[[1,8,7],[9,64,2]]:margin=0.1", 7),
        ("context:table=[[1,8,0,4096,5],[9,64,0,4096,1]]", 5),
        ("static", None),  # K = k_max: fixes nothing
        ("goodput", None),
        ("bandit:seed=3", None),
        ("static:x", None),  # does not parse: the builder says so
        ("table:[[8,1,4]]", None),
    ],
)
def test_spec_k_max_is_the_k_a_spec_fixes(spec: str, k_max: int | None) -> None:
    assert spec_k_max(spec) == k_max
