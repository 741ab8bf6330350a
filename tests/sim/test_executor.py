"""Tests of sim.executor.FittedExecutor: contract, determinism, noise, request bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from dsd.policies.profile import Profile
from dsd.policies.profile_io import load_profile
from dsd.sim.build import build_fitted_executor
from dsd.sim.executor import FittedExecutor, LatencyJitter
from dsd.sim.models.acceptance import HeterogeneousAcceptance
from dsd.sim.models.latency import TableLatencyModel
from dsd.sim.types import ScheduledBatch
from dsd.traces.workload import RequestSpec

PROFILE_PATH = (
    Path(__file__).resolve().parents[2]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)
SPEC = RequestSpec(prompt_len=32, output_len=128)


def h100_profile() -> Profile:
    return load_profile(PROFILE_PATH)


def make_batch(
    step_index: int,
    decode_ids: Sequence[int],
    decode_ks: Sequence[int],
    prefill_ids: Sequence[int] = (),
    prefill_chunk: int = 64,
    finished: tuple[int, ...] = (),
) -> ScheduledBatch:
    num_decode = len(decode_ids)
    num_rows = num_decode + len(prefill_ids)
    ks = np.array(list(decode_ks) + [0] * len(prefill_ids), dtype=np.int64)
    scheduled = np.array([k + 1 for k in decode_ks] + [prefill_chunk] * len(prefill_ids))
    return ScheduledBatch(
        step_index=step_index,
        req_ids=np.array(list(decode_ids) + list(prefill_ids), dtype=np.int64),
        num_decode_reqs=num_decode,
        num_scheduled_tokens=scheduled.astype(np.int64),
        num_spec_tokens=ks,
        num_computed_tokens=np.full(num_rows, 100, dtype=np.int64),
        num_output_tokens=np.array([step_index + 1] * num_decode + [0] * len(prefill_ids)),
        completes_prompt=np.array([False] * num_decode + [True] * len(prefill_ids)),
        total_num_scheduled_tokens=int(scheduled.sum()),
        finished_req_ids=finished,
    )


class RecordingAcceptance:
    """A fake acceptance model that logs calls and accepts min(K, 1)."""

    def __init__(self) -> None:
        self.added: list[int] = []
        self.removed: list[int] = []
        self.sampled: list[tuple[list[int], list[int], list[int]]] = []

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        self.added.append(req_id)

    def remove_request(self, req_id: int) -> None:
        self.removed.append(req_id)

    def sample_outcomes(
        self, req_ids: np.ndarray, num_output_tokens: np.ndarray, num_spec_tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        self.sampled.append(
            (req_ids.tolist(), num_output_tokens.tolist(), num_spec_tokens.tolist())
        )
        return num_spec_tokens, np.minimum(num_spec_tokens, 1).astype(np.int64)


class OverAcceptance(RecordingAcceptance):
    def sample_outcomes(
        self, req_ids: np.ndarray, num_output_tokens: np.ndarray, num_spec_tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        return num_spec_tokens, num_spec_tokens + 1


def run_steps(executor: FittedExecutor, num_steps: int) -> list[tuple[float, list[int]]]:
    """A fixed little schedule: 24 requests decoding with varied K, one prefill each step."""
    for req_id in range(32):
        executor.add_request(req_id, SPEC)
    outcomes = []
    for step in range(num_steps):
        decode_ids = list(range(24))
        ks = [(req_id + step) % 6 for req_id in decode_ids]
        outcome = executor.execute(make_batch(step, decode_ids, ks, prefill_ids=[24 + step % 8]))
        outcomes.append((outcome.duration_s, outcome.num_accepted.tolist()))
    return outcomes


def test_execute_forwards_decode_rows_and_duration_is_latency_model() -> None:
    latency = TableLatencyModel(h100_profile())
    acceptance = RecordingAcceptance()
    executor = FittedExecutor(latency, acceptance)
    executor.add_request(7, SPEC)
    executor.add_request(8, SPEC)
    executor.add_request(9, SPEC)
    batch = make_batch(4, decode_ids=[7, 8], decode_ks=[3, 0], prefill_ids=[9])
    outcome = executor.execute(batch)
    assert acceptance.added == [7, 8, 9]
    # Only decode rows are sampled, at their output positions and K.
    assert acceptance.sampled == [([7, 8], [5, 5], [3, 0])]
    assert outcome.num_accepted.tolist() == [1, 0]
    assert outcome.duration_s == pytest.approx(latency.step_ms(batch) / 1000.0)
    assert outcome.stop_index is None


def test_finished_requests_are_removed_from_the_acceptance_model() -> None:
    acceptance = RecordingAcceptance()
    executor = FittedExecutor(TableLatencyModel(h100_profile()), acceptance)
    executor.execute(make_batch(0, [1, 2], [1, 1], finished=(3, 4)))
    assert acceptance.removed == [3, 4]


def test_host_overhead_is_added_to_every_step() -> None:
    latency = TableLatencyModel(h100_profile())
    plain = FittedExecutor(latency, RecordingAcceptance())
    slower = FittedExecutor(latency, RecordingAcceptance(), host_overhead_ms=1.5)
    batch = make_batch(0, [0, 1, 2], [2, 2, 2])
    delta_s = slower.execute(batch).duration_s - plain.execute(batch).duration_s
    assert delta_s == pytest.approx(1.5e-3)


def test_accepted_never_exceeds_k_with_real_models() -> None:
    profile = h100_profile()
    for acceptance_kind in ("per-position", "heterogeneous", "replay"):
        executor = build_fitted_executor(
            profile, np.random.SeedSequence(1), acceptance_kind=acceptance_kind
        )
        for req_id in range(32):
            executor.add_request(req_id, SPEC)
        for step in range(50):
            ks = np.arange(32) % 6
            outcome = executor.execute(make_batch(step, list(range(32)), ks.tolist()))
            assert np.all(outcome.num_accepted >= 0)
            assert np.all(outcome.num_accepted <= ks)
            assert outcome.duration_s > 0


def test_executor_rejects_acceptance_outside_zero_to_k() -> None:
    executor = FittedExecutor(TableLatencyModel(h100_profile()), OverAcceptance())
    with pytest.raises(RuntimeError, match=r"outside \[0, K\]"):
        executor.execute(make_batch(0, [0], [2]))


def make_executor(seed_value: int, jitter_sigma: float) -> FittedExecutor:
    acceptance_seed, jitter_seed = np.random.SeedSequence(seed_value).spawn(2)
    profile = h100_profile()
    jitter = LatencyJitter(jitter_sigma, jitter_seed) if jitter_sigma > 0 else None
    return FittedExecutor(
        TableLatencyModel(profile),
        HeterogeneousAcceptance.from_profile(profile, acceptance_seed),
        jitter=jitter,
    )


def test_same_seed_gives_identical_outcomes() -> None:
    first = run_steps(make_executor(42, jitter_sigma=0.05), 40)
    second = run_steps(make_executor(42, jitter_sigma=0.05), 40)
    assert first == second
    other = run_steps(make_executor(43, jitter_sigma=0.05), 40)
    assert other != first


def test_jitter_is_lognormal_with_median_one_and_does_not_touch_acceptance() -> None:
    noisy = run_steps(make_executor(5, jitter_sigma=0.1), 400)
    quiet = run_steps(make_executor(5, jitter_sigma=0.0), 400)
    # Acceptance draws come from their own stream: identical with or without noise.
    assert [a for _, a in noisy] == [a for _, a in quiet]
    log_ratio = np.log([n / q for (n, _), (q, _) in zip(noisy, quiet, strict=True)])
    assert abs(float(np.median(log_ratio))) < 0.02
    assert float(np.std(log_ratio)) == pytest.approx(0.1, rel=0.15)


def test_invalid_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="host_overhead_ms"):
        FittedExecutor(TableLatencyModel(h100_profile()), RecordingAcceptance(), -1.0)
    with pytest.raises(ValueError, match="sigma"):
        LatencyJitter(float("nan"), np.random.SeedSequence(0))
