"""Arrival processes for open-loop workloads, with `vllm bench serve` semantics.

Gamma gaps from `--request-rate R --burstiness X` (mean 1/R, coefficient of variation 1/sqrt(X)),
rescaled so the last request is sent at N / R as recent vLLM does (`normalize_total=True`); R = inf
sends everything at 0 (docs/workloads.md, "Arrivals"). A closed loop of C clients is not an
arrival process: arrivals all 0 plus `Workload.max_concurrency = C`.

It only makes arrival times (seconds, float64) from an explicit generator: it does not choose
lengths, read files, or enforce concurrency.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dsd.common.errors import InputError
from dsd.traces.workload import Workload


def validate_rate(request_rate: float, burstiness: float) -> None:
    """Raise InputError unless request_rate > 0 and burstiness > 0 (either may be inf)."""
    if math.isnan(request_rate) or request_rate <= 0:
        raise InputError(f"request_rate: must be > 0 requests/s (or inf), got {request_rate}")
    if math.isnan(burstiness) or burstiness <= 0:
        raise InputError(f"burstiness: must be > 0 (1.0 = Poisson), got {burstiness}")


def arrival_times_s(
    num_requests: int,
    request_rate: float,
    burstiness: float = 1.0,
    *,
    rng: np.random.Generator,
    normalize_total: bool = True,
) -> np.ndarray:
    """Send times of `num_requests` requests in seconds from the start, non-decreasing.

    request_rate: mean requests per second; inf sends all requests at 0.
    burstiness: gamma shape of the gaps; 1.0 is Poisson, inf is a fixed gap of 1/request_rate.
    normalize_total: rescale so the last request is sent at num_requests / request_rate, as
        recent `vllm bench serve` does (it removes the 1-2 % run-to-run spread of the total).
    rng: the only source of randomness (nothing is drawn when the rate or burstiness is inf).
    """
    if num_requests < 0:
        raise InputError(f"num_requests: must be >= 0, got {num_requests}")
    validate_rate(request_rate, burstiness)
    if num_requests == 0 or math.isinf(request_rate):
        return np.zeros(num_requests, dtype=np.float64)  # [N]
    if math.isinf(burstiness):
        gaps_s = np.full(num_requests, 1.0 / request_rate)  # [N]
    else:
        # mean = shape * scale = 1/rate; variance = shape * scale^2, so CV = 1/sqrt(burstiness)
        scale_s = 1.0 / (request_rate * burstiness)
        gaps_s = rng.gamma(shape=burstiness, scale=scale_s, size=num_requests)  # [N]
    arrivals_s = np.cumsum(gaps_s)  # [N]
    if normalize_total and arrivals_s[-1] > 0:
        arrivals_s *= (num_requests / request_rate) / arrivals_s[-1]
    return arrivals_s


def with_arrivals(
    workload: Workload,
    request_rate: float,
    burstiness: float = 1.0,
    *,
    rng: np.random.Generator,
    normalize_total: bool = True,
) -> Workload:
    """The same requests in the same order, re-timed by `arrival_times_s`."""
    arrivals_s = arrival_times_s(
        len(workload.requests),
        request_rate,
        burstiness,
        rng=rng,
        normalize_total=normalize_total,
    )
    requests = tuple(
        dataclasses.replace(request, arrival_s=float(arrival_s))
        for request, arrival_s in zip(workload.requests, arrivals_s, strict=True)
    )
    return Workload(name=workload.name, requests=requests, max_concurrency=workload.max_concurrency)


def closed_loop(workload: Workload, max_concurrency: int) -> Workload:
    """C clients in a closed loop: every arrival at 0, at most `max_concurrency` in flight."""
    if max_concurrency < 1:
        raise InputError(f"max_concurrency: must be >= 1, got {max_concurrency}")
    requests = tuple(dataclasses.replace(request, arrival_s=0.0) for request in workload.requests)
    return Workload(name=workload.name, requests=requests, max_concurrency=max_concurrency)
