"""Oracle envelope: best static K per concurrency, applied by B, compiled to a range table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.policies.envelope import EnvelopePolicy, StaticSweep
from dsd.policies.range_table import expand_ranges, synthetic_view
from dsd.policies.spec import parse_policy

RECORDS = [
    {"concurrency": 1, "k": 0, "mean_tpot_ms": 6.5},
    {"concurrency": 1, "k": 3, "mean_tpot_ms": 3.9},
    {"concurrency": 16, "k": 0, "mean_tpot_ms": 7.0},
    {"concurrency": 16, "k": 3, "mean_tpot_ms": 4.5},
    {"concurrency": 64, "k": 0, "mean_tpot_ms": 8.0},
    {"concurrency": 64, "k": 3, "mean_tpot_ms": 8.0},  # tie: the smaller K wins
    {"concurrency": 256, "k": 0, "mean_tpot_ms": 14.0},
]


def test_best_static_k_per_concurrency() -> None:
    sweep = StaticSweep.from_records(RECORDS)
    best_k, best_tpot = sweep.best_static_k()
    assert best_k.tolist() == [3, 3, 0, 0]
    np.testing.assert_allclose(best_tpot, [3.9, 4.5, 8.0, 14.0])


def test_tie_tolerance_prefers_smaller_k() -> None:
    sweep = StaticSweep.from_records(RECORDS)
    assert sweep.best_static_k(tie_tolerance=0.6)[0].tolist() == [3, 0, 0, 0]


@pytest.mark.parametrize(
    ("batch_size", "k"),
    [
        (1, 3),  # swept concurrency C=1
        (4, 3),  # on the C=1 | C=16 boundary sqrt(1 * 16) = 4: the smaller C owns it
        (16, 3),  # C=16
        (32, 3),  # on the C=16 | C=64 boundary sqrt(16 * 64) = 32: still C=16
        (33, 0),  # nearer C=64 than C=16 on a log scale
        (64, 0),  # C=64
        (256, 0),  # last
    ],
)
def test_policy_applies_envelope_by_batch_size(batch_size: int, k: int) -> None:
    policy = EnvelopePolicy(StaticSweep.from_records(RECORDS), 256)
    assert policy.choose_k(synthetic_view(batch_size, 5)) == k


# An MT-Bench-like sweep: K* falls from 1 at C=128 to 0 at C=256 (boundary sqrt(128 * 256) ~ 181).
HIGH_LOAD = [
    {"concurrency": 128, "k": 0, "mean_tpot_ms": 10.7},
    {"concurrency": 128, "k": 1, "mean_tpot_ms": 10.5},
    {"concurrency": 256, "k": 0, "mean_tpot_ms": 16.7},
    {"concurrency": 256, "k": 1, "mean_tpot_ms": 18.8},
]


@pytest.mark.parametrize(
    ("batch_size", "k"),
    [
        (128, 1),  # C=128's K
        (181, 1),  # 181^2 = 32761 <= 128 * 256 = 32768: nearer C=128
        (182, 0),  # 182^2 > 32768: nearer C=256
        (226, 0),  # a C=256 ramp-up step; carrying C=128's K forward ran K=1 here
        (255, 0),  # just below the largest swept C
    ],
)
def test_b_between_swept_concurrencies_takes_the_nearest_on_a_log_scale(
    batch_size: int, k: int
) -> None:
    policy = EnvelopePolicy(StaticSweep.from_records(HIGH_LOAD), 256)
    assert policy.choose_k(synthetic_view(batch_size, 5)) == k


def test_range_table_reproduces_the_policy() -> None:
    policy = EnvelopePolicy(StaticSweep.from_records(RECORDS), 256)
    table = policy.to_range_table(5)
    assert table == [[1, 32, 3], [33, 256, 0]]
    np.testing.assert_array_equal(expand_ranges(table, 5, 256), policy.k_by_batch)


def test_spec_reads_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(RECORDS))
    policy = parse_policy(f"envelope:{path}", profile=None, k_max=5, max_num_seqs=256)
    assert policy.choose_k(synthetic_view(2, 5)) == 3


@pytest.mark.parametrize(
    ("records", "fragment"),
    [
        ([], "non-empty"),  # nothing
        ([{"concurrency": 1, "k": 0}], "missing 'mean_tpot_ms'"),  # field missing
        ([{"concurrency": 0, "k": 0, "mean_tpot_ms": 1.0}], "concurrency: must be"),  # C = 0
        ([{"concurrency": 1, "k": -1, "mean_tpot_ms": 1.0}], "k: must be"),  # negative K
        ([{"concurrency": 1, "k": 0, "mean_tpot_ms": -1.0}], "finite and > 0"),  # bad TPOT
        (RECORDS[:1] * 2, "duplicate"),  # same cell twice
    ],
)
def test_bad_records_are_input_errors(records, fragment: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=fragment):
        StaticSweep.from_records(records)
