"""Arrival processes: vLLM bench semantics, statistics and determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsd.common.errors import InputError
from dsd.traces.arrivals import arrival_times_s, closed_loop, with_arrivals
from dsd.traces.datasets import prompt_set_workload


def test_infinite_rate_sends_everything_at_zero() -> None:
    arrivals_s = arrival_times_s(50, math.inf, 1.0, rng=np.random.default_rng(0))
    assert arrivals_s.shape == (50,)
    assert np.all(arrivals_s == 0.0)


@pytest.mark.parametrize(
    ("burstiness", "rate"),
    [
        (1.0, 4.0),  # Poisson: CV of gaps 1
        (0.25, 10.0),  # bursty: CV 2
        (4.0, 2.0),  # regular: CV 0.5
    ],
)
def test_gamma_gaps_have_the_requested_mean_rate_and_cv(burstiness: float, rate: float) -> None:
    num_requests = 40_000
    arrivals_s = arrival_times_s(
        num_requests, rate, burstiness, rng=np.random.default_rng(7), normalize_total=False
    )
    gaps_s = np.diff(np.concatenate([[0.0], arrivals_s]))
    assert np.all(gaps_s >= 0)
    # mean gap 1/rate: standard error is CV/sqrt(N) relative, < 1.1 % here; allow 3 %
    assert gaps_s.mean() == pytest.approx(1.0 / rate, rel=0.03)
    cv = gaps_s.std() / gaps_s.mean()
    assert cv == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.05)


def test_normalized_total_ends_at_num_requests_over_rate() -> None:
    arrivals_s = arrival_times_s(100, 5.0, 1.0, rng=np.random.default_rng(1))
    assert arrivals_s[-1] == pytest.approx(100 / 5.0)
    assert np.all(np.diff(arrivals_s) >= 0)
    assert arrivals_s[0] > 0  # like vLLM, the first request waits for its own gap


def test_infinite_burstiness_gives_fixed_gaps() -> None:
    arrivals_s = arrival_times_s(10, 2.0, math.inf, rng=np.random.default_rng(0))
    np.testing.assert_allclose(arrivals_s, (np.arange(10) + 1) / 2.0)


def test_same_seed_same_arrivals_other_seed_differs() -> None:
    first = arrival_times_s(100, 3.0, 0.5, rng=np.random.default_rng(42))
    again = arrival_times_s(100, 3.0, 0.5, rng=np.random.default_rng(42))
    other = arrival_times_s(100, 3.0, 0.5, rng=np.random.default_rng(43))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize(
    ("rate", "burstiness", "field"),
    [
        (0.0, 1.0, "request_rate"),  # zero rate never sends
        (-1.0, 1.0, "request_rate"),  # negative rate
        (math.nan, 1.0, "request_rate"),  # NaN rate
        (1.0, 0.0, "burstiness"),  # gamma shape must be > 0
    ],
)
def test_bad_rates_raise_input_error_naming_the_field(
    rate: float, burstiness: float, field: str
) -> None:
    with pytest.raises(InputError, match=field):
        arrival_times_s(10, rate, burstiness, rng=np.random.default_rng(0))


def test_with_arrivals_keeps_requests_and_closed_loop_zeroes_them() -> None:
    workload = prompt_set_workload("mt-bench", num_prompts=20)
    timed = with_arrivals(workload, 2.0, 1.0, rng=np.random.default_rng(0))
    assert [r.prompt for r in timed.requests] == [r.prompt for r in workload.requests]
    assert timed.requests[-1].arrival_s == pytest.approx(10.0)
    loop = closed_loop(timed, 4)
    assert loop.max_concurrency == 4
    assert all(r.arrival_s == 0.0 for r in loop.requests)
