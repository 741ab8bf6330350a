"""Reads a `vllm bench serve --save-result` file: its per-request lengths, concurrency cap and
arrivals become a workload, its recorded metrics the measured side of a comparison
(`validation.cells.validate_against_vllm`). Torch-free; every malformed field is an InputError
naming the file and key."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsd.common.errors import InputError
from dsd.common.user_files import parse_user_json, read_user_text
from dsd.sim.metrics import TPOT_TTFT_KEYS
from dsd.traces.arrivals import validate_rate, with_arrivals
from dsd.traces.workload import RequestSpec, Workload

# Metrics compared per cell: vLLM bench keys (ms).
COMPARED_METRICS: tuple[str, ...] = (*TPOT_TTFT_KEYS, "mean_itl_ms", "mean_e2el_ms")
# Largest per-request token count read: far above any model's context (2**24 = 16.8 M tokens),
# far below what would overflow the simulator's int64 token arithmetic.
MAX_REQUEST_TOKENS = 2**24
# Keys a vLLM result file must have for a comparison (the rest are optional).
VLLM_REQUIRED_KEYS: tuple[str, ...] = ("input_lens", "output_lens", "max_concurrency")
VLLM_METRIC_KEYS: tuple[str, ...] = (
    *COMPARED_METRICS,
    "output_throughput",
    "request_throughput",
)


@dataclass(frozen=True)
class VllmBenchResult:
    """What a `vllm bench serve --save-result` file says about its run."""

    source: str  # file name, for messages
    workload: Workload  # requests from input_lens/output_lens, cap and arrivals
    request_rate: float  # requests/s; inf: all at once
    burstiness: float  # gamma shape of the gaps (1: Poisson)
    metrics: dict[str, Any]  # the file's metric keys that we compare (VLLM_METRIC_KEYS present)
    info: dict[str, Any]  # date, backend, model_id, num_prompts, completed, duration


def _short(value: Any) -> str:
    """repr of a value cut to one short line (a huge number or list stays readable)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_lens(source: str, data: dict[str, Any], key: str, minimum: int) -> list[int]:
    values = data[key]
    if not isinstance(values, list) or not values:
        raise InputError(f"{source}: {key}: must be a non-empty list of integers")
    for index, value in enumerate(values):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not minimum <= value <= MAX_REQUEST_TOKENS
        ):
            raise InputError(
                f"{source}: {key}[{index}]: must be an integer >= {minimum} (at most 2**24), "
                f"got {_short(value)}"
            )
    return values


def _check_metric(source: str, key: str, value: Any) -> float:
    """A recorded metric (ms, tokens/s, requests/s): a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{source}: {key}: must be a number, got {_short(value)}")
    number = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.inf
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{source}: {key}: must be a finite number >= 0, got {_short(value)}")
    return number


def parse_vllm_result(data: Any, source: str, seed: int = 0) -> VllmBenchResult:
    """Validate a vLLM bench result object (InputError naming file and key) -> its workload.

    Failed requests (output length 0 or a non-empty `errors[i]`) are left out, as vLLM leaves
    them out of its metrics. A finite `request_rate` re-times the requests with the seed
    (the file records the rate, not the send times).
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: top level must be a JSON object, got {type(data).__name__}")
    for key in VLLM_REQUIRED_KEYS:
        if key not in data:
            raise InputError(
                f"{source}: missing key {key!r} (a `vllm bench serve --save-result` file?)"
            )
    input_lens = _check_lens(source, data, "input_lens", 1)
    output_lens = _check_lens(source, data, "output_lens", 0)
    if len(input_lens) != len(output_lens):
        raise InputError(
            f"{source}: input_lens has {len(input_lens)} entries, output_lens {len(output_lens)}"
        )
    errors = data.get("errors")
    if errors is not None:
        if not isinstance(errors, list) or len(errors) != len(input_lens):
            raise InputError(f"{source}: errors: must be a list with one entry per request")
        for index, error in enumerate(errors):
            if error is not None and not isinstance(error, str):
                raise InputError(
                    f"{source}: errors[{index}]: must be a string (empty: no error), "
                    f"got {_short(error)}"
                )
    cap = data["max_concurrency"]
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_REQUEST_TOKENS
    ):
        raise InputError(
            f"{source}: max_concurrency: must be null or an integer >= 1 (at most 2**24), "
            f"got {_short(cap)}"
        )
    raw_rate = data.get("request_rate", "inf")
    if raw_rate in ("inf", "Infinity", None):
        request_rate = math.inf
    elif (
        isinstance(raw_rate, int | float)
        and not isinstance(raw_rate, bool)
        and _finite_or_inf(raw_rate)
        and raw_rate > 0
    ):
        request_rate = float(raw_rate)
    else:
        raise InputError(f'{source}: request_rate: must be > 0 or "inf", got {_short(raw_rate)}')
    raw_burst = data.get("burstiness", 1.0)
    if (
        isinstance(raw_burst, bool)
        or not isinstance(raw_burst, int | float)
        or not _finite_or_inf(raw_burst)
        or not raw_burst > 0
    ):
        raise InputError(f"{source}: burstiness: must be a number > 0, got {_short(raw_burst)}")
    burstiness = float(raw_burst)
    try:
        validate_rate(request_rate, burstiness)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    metrics: dict[str, Any] = {}
    for key in VLLM_METRIC_KEYS:
        if key in data:
            metrics[key] = _check_metric(source, key, data[key])
    if "mean_tpot_ms" not in metrics:
        raise InputError(f"{source}: missing key 'mean_tpot_ms'")
    requests = []
    for index, (prompt_len, output_len) in enumerate(zip(input_lens, output_lens, strict=True)):
        failed = output_len == 0 or bool(errors and errors[index])
        if not failed:
            requests.append(RequestSpec(prompt_len=prompt_len, output_len=output_len))
    if not requests:
        raise InputError(f"{source}: no successful request (every output_lens entry is 0)")
    workload = Workload(name=Path(source).stem, requests=tuple(requests), max_concurrency=cap)
    if math.isfinite(request_rate):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,)))
        workload = with_arrivals(workload, request_rate, burstiness, rng=rng)
    info = {
        key: data.get(key)
        for key in ("date", "backend", "model_id", "num_prompts", "completed", "duration")
        if key in data
    }
    return VllmBenchResult(
        source=source,
        workload=workload,
        request_rate=request_rate,
        burstiness=burstiness,
        metrics=metrics,
        info=info,
    )


def _finite_or_inf(value: int | float) -> bool:
    """False for NaN and for an integer too large to be a float (it is no rate)."""
    if isinstance(value, int):
        return abs(value) < 2**1023
    return not math.isnan(value)


def load_vllm_result(path: str | Path, seed: int = 0) -> VllmBenchResult:
    """Read and validate a `vllm bench serve --save-result` JSON file.

    Errors name the path as given. The text is UTF-8 (a BOM allowed); NaN/Infinity literals
    parse (Python's json, which vLLM writes with, emits them) and are then refused where a
    number must be finite.
    """
    source = str(path)
    try:
        text = read_user_text(path, source)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None
    data = parse_user_json(text, source, allow_nonfinite=True)
    return parse_vllm_result(data, source, seed=seed)
