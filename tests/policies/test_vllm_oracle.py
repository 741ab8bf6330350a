"""vLLM's own code as the oracle of the range table and the speculative-config export.

Runs where vLLM 0.33 is installed (`pip install --no-deps vllm==0.33.0` and the `vllm` extra;
CI installs both) and is skipped elsewhere. vLLM's dynamic-SD utilities validate and expand a
`num_speculative_tokens_per_batch_size` table; its `SpeculativeConfig` takes what
`dsd export vllm` prints. Our table must accept exactly the integer tables vLLM accepts and give
the same K at every batch size (K clamped to num_speculative_tokens, gaps and the tail carried
forward, bounds of any size). Deliberate difference: vLLM int()-coerces entries ("3", 2.0,
True); we accept JSON integers only (docs/formats.md).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
vllm_utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
vllm_config = pytest.importorskip("vllm.config")

from dsd.common.errors import InputError  # noqa: E402
from dsd.policies.goodput import GoodputPolicy  # noqa: E402
from dsd.policies.profile import LatencyPoint, Profile  # noqa: E402
from dsd.policies.range_table import (  # noqa: E402
    RangeTablePolicy,
    compile_range_table,
    expand_ranges,
    synthetic_view,
    validate_ranges,
)
from dsd.policies.speculative_config import (  # noqa: E402
    spec_from_speculative_config,
    speculative_config,
)

# Bounds and K from the edges that matter: 0 and negatives (refused), small values (overlaps,
# gaps), and integers beyond 64 bits (accepted, clamped).
BOUNDS = st.one_of(st.integers(-2, 40), st.sampled_from([2**31, 2**63 - 1, 2**63, 2**70]))
KS = st.one_of(st.integers(-1, 9), st.sampled_from([2**63, 2**70]))
ENTRIES = st.lists(st.tuples(BOUNDS, BOUNDS, KS), min_size=1, max_size=6)


def _vllm_accepts(table: list[tuple[int, int, int]]) -> bool:
    try:
        vllm_utils.validate_and_normalize_dynamic_sd_schedule([list(e) for e in table])
    except ValueError:
        return False
    return True


@settings(max_examples=400)
@given(table=ENTRIES)
def test_we_accept_exactly_the_integer_tables_vllm_accepts(table: list[tuple[int, int, int]]):
    try:
        validate_ranges([list(e) for e in table])
        ours = True
    except InputError:
        ours = False
    assert ours == _vllm_accepts(table), table


@st.composite
def valid_tables(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """Ranges from B = 1 with gaps between them, the last end possibly huge, in any order."""
    starts = sorted({1, *draw(st.lists(st.integers(2, 400), max_size=5))})
    table = []
    for index, start in enumerate(starts):
        limit = starts[index + 1] - 1 if index + 1 < len(starts) else 2**70
        end = draw(st.one_of(st.integers(start, min(limit, start + 300)), st.just(limit)))
        table.append((start, end, draw(KS.filter(lambda k: k >= 0))))
    return draw(st.permutations(table))


@settings(max_examples=400)
@given(
    table=valid_tables(),
    k_max=st.integers(1, 8),
    max_num_seqs=st.integers(1, 300),
)
def test_k_at_every_batch_size_is_vllms(
    table: list[tuple[int, int, int]], k_max: int, max_num_seqs: int
) -> None:
    entries = [list(e) for e in table]
    lookup = vllm_utils.build_dynamic_sd_schedule_lookup(entries, max_num_seqs, k_max)
    assert expand_ranges(entries, k_max, max_num_seqs).tolist() == lookup[1:]
    policy = RangeTablePolicy(entries, k_max, max_num_seqs)
    for batch_size in range(1, max_num_seqs + 1):
        assert policy.choose_k(synthetic_view(batch_size, k_max)) == lookup[batch_size]


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    """A profile with K = 0..k_max at B = 1 and a few larger B, falling acceptance."""
    k_max = draw(st.integers(1, 5))
    batch_sizes = sorted({1, *draw(st.lists(st.integers(2, 256), max_size=3))})
    points = [
        LatencyPoint(b, k, draw(st.floats(1.0, 100.0)))
        for b in batch_sizes
        for k in range(k_max + 1)
    ]
    rates = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=k_max, max_size=k_max)))[::-1]
    return Profile(k_max=k_max, latency=tuple(points), acceptance_rates=tuple(rates))


@settings(max_examples=60, deadline=None)
@given(profile=profiles(), max_num_seqs=st.integers(1, 256))
def test_exported_speculative_config_is_read_by_vllm_as_our_policy(
    profile: Profile, max_num_seqs: int
) -> None:
    policy = GoodputPolicy(profile, max_num_seqs)
    table = compile_range_table(policy, profile.k_max, max_num_seqs)
    exported = speculative_config(table, profile.k_max, method="ngram")
    config = vllm_config.SpeculativeConfig(**exported)
    assert config.num_speculative_tokens == profile.k_max
    assert [list(e) for e in config.num_speculative_tokens_per_batch_size] == table
    lookup = vllm_utils.build_dynamic_sd_schedule_lookup(
        config.num_speculative_tokens_per_batch_size, max_num_seqs, config.num_speculative_tokens
    )
    for batch_size in range(1, max_num_seqs + 1):
        assert lookup[batch_size] == policy.choose_k(synthetic_view(batch_size, profile.k_max))
    # ... and the file reads back as the same table.
    spec, k_max = spec_from_speculative_config(json.dumps(exported))
    assert k_max == profile.k_max and json.loads(spec.removeprefix("table:")) == table
