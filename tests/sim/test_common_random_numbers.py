"""Common random numbers: a request's draws depend on its own (seed, id, position, K) only.

The counter streams are pure functions of their keys; every acceptance model's outcome for a
row is the same alone, in any batch and in any order, and at K <= K' it is the K' outcome cut
at K; whole runs give each request the same outcomes at any concurrency, scheduling mode and
arrival process under a static K, and under two policies wherever the K sequences agree; a
workload's first n requests do not depend on how many follow.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dsd.common.streams import CounterStream
from dsd.policies.profile_io import load_profile
from dsd.policies.types import KPolicy, StepFeedback, StepView
from dsd.sim.build import build_fitted_executor
from dsd.sim.engine import Engine, LoopConfig
from dsd.sim.models.acceptance import (
    CategoryAcceptance,
    EmpiricalAcceptance,
    HeterogeneousAcceptance,
    PerPositionAcceptance,
)
from dsd.sim.models.replay import ReplayAcceptance, load_replay_recording
from dsd.sim.scheduler import Scheduler, SchedulerConfig
from dsd.sim.testing.fakes import StaticK
from dsd.sim.types import AcceptanceModel
from dsd.traces.arrivals import with_arrivals
from dsd.traces.registry import build_workload
from dsd.traces.workload import RequestSpec, Workload

PROFILE_PATH = (
    Path(__file__).resolve().parents[2] / "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
)
RATES = [0.8, 0.6, 0.45, 0.33]
DRAFT_RATES = [0.9, 0.8, 0.6, 0.5]


def seed(n: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(n)


# ------------------------------------------------------------------------------ the streams


@given(batches=st.lists(st.lists(st.integers(0, 5000), min_size=1, max_size=20), max_size=6))
def test_request_keys_are_the_hash_whatever_the_key_cache_holds(batches):
    """Keys come from a cache grown in blocks as ids appear: equal to the hash at any id, in
    any order of first appearance, and past the cached range."""
    stream = CounterStream(seed(3), 0)
    for ids in [*batches, [2**24 + 5, 7], [3 * 2**30]]:
        req_ids = np.array(ids, dtype=np.int64)
        np.testing.assert_array_equal(stream.request_keys(req_ids), stream._hashed_keys(req_ids))
    assert stream.request_keys(3).shape == (1,)


@given(
    key=st.integers(0, 2**32),
    rows=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=30),
)
def test_a_draw_is_a_function_of_its_request_and_counter_only(key, rows):
    stream = CounterStream(seed(key), 0)
    req_ids = np.array([r for r, _ in rows])
    counters = np.array([c for _, c in rows])
    together = stream.uniforms(req_ids, counters)
    alone = [stream.uniform(r, c) for r, c in rows]
    reversed_order = stream.uniforms(req_ids[::-1], counters[::-1])[::-1]
    assert together.tolist() == alone == reversed_order.tolist()
    assert ((together >= 0) & (together < 1)).all()


@given(starts=st.lists(st.integers(0, 10**5), min_size=1, max_size=20), width=st.integers(1, 9))
def test_leading_columns_are_the_draws_at_consecutive_counters(starts, width):
    stream = CounterStream(seed(1), 2)
    req_ids = np.arange(len(starts))
    columns = stream.leading_columns(req_ids, np.array(starts), width)
    for i in range(width):
        np.testing.assert_array_equal(columns[:, i], stream.uniforms(req_ids, np.array(starts) + i))


def test_draws_are_uniform_and_uncorrelated_across_requests_counters_and_purposes():
    req_ids, counters = np.divmod(np.arange(200_000), 1000)  # 200 requests x 1000 counters
    draws = CounterStream(seed(5), 0).uniforms(req_ids, counters)
    assert stats.kstest(draws, "uniform").pvalue > 1e-3
    grid = draws.reshape(200, 1000)
    assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 0.01  # counters
    assert abs(np.corrcoef(grid[:-1].ravel(), grid[1:].ravel())[0, 1]) < 0.01  # requests
    other_purpose = CounterStream(seed(5), 1).uniforms(req_ids, counters)
    other_seed = CounterStream(seed(6), 0).uniforms(req_ids, counters)
    for other in (other_purpose, other_seed):
        assert abs(np.corrcoef(draws, other)[0, 1]) < 0.01


# ------------------------------------------------------------------------------ the models


def _joints(num: int, k_max: int) -> np.ndarray:
    """`num` random (d, a) histograms at k_max with a <= d."""
    rng = np.random.default_rng(num)
    joints = rng.random((num, k_max + 1, k_max + 1)) * np.tril(np.ones((k_max + 1, k_max + 1)))
    joints[:, 0, 0] += 0.1
    return joints


MODELS: dict[str, Callable[[], AcceptanceModel]] = {
    "per-position": lambda: PerPositionAcceptance(RATES, seed(1)),
    "per-position, drafts fewer": lambda: PerPositionAcceptance(
        RATES, seed(2), draft_rates=DRAFT_RATES
    ),
    "heterogeneous": lambda: HeterogeneousAcceptance(RATES, seed(3)),
    "heterogeneous, drafts fewer": lambda: HeterogeneousAcceptance(
        RATES, seed(4), draft_rates=DRAFT_RATES
    ),
    "empirical": lambda: EmpiricalAcceptance(_joints(7, 4), seed(5)),
    "category": lambda: CategoryAcceptance(
        {"even": HeterogeneousAcceptance(RATES, seed(6))},
        EmpiricalAcceptance(_joints(3, 4), seed(7)),
    ),
    "replay, random assignment": lambda: ReplayAcceptance(
        load_replay_recording(), seed(8), assignment="random"
    ),
}

rows_strategy = st.lists(
    st.tuples(st.integers(0, 500), st.integers(0, 300), st.integers(0, 7)),
    min_size=1,
    max_size=24,
    unique_by=lambda row: row[0],  # one row per request, as in a step
)


def _added(name: str, req_ids: list[int]) -> AcceptanceModel:
    model = MODELS[name]()
    for req_id in req_ids:
        tag = "even" if req_id % 2 == 0 else None
        model.add_request(req_id, RequestSpec(prompt_len=8, output_len=64, tag=tag))
    return model


def _sample(model: AcceptanceModel, rows: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    columns = zip(*rows, strict=True)
    req_ids, positions, ks = (np.array(column, dtype=np.int64) for column in columns)
    drafted, accepted = model.sample_outcomes(req_ids, positions, ks)
    return list(zip(drafted.tolist(), accepted.tolist(), strict=True))


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=40, deadline=None)
@given(rows=rows_strategy, order=st.randoms(use_true_random=False))
def test_a_rows_outcome_is_the_same_alone_in_any_batch_and_any_order(name, rows, order):
    req_ids = [r for r, _, _ in rows]
    shuffled = list(req_ids)
    order.shuffle(shuffled)
    # requests added in two different orders: add order must not matter either
    first, second = _added(name, req_ids), _added(name, shuffled)
    together = _sample(first, rows)
    alone = [_sample(second, [row])[0] for row in rows]
    permutation = list(range(len(rows)))
    order.shuffle(permutation)
    permuted = _sample(first, [rows[i] for i in permutation])
    assert together == alone
    assert [permuted[permutation.index(i)] for i in range(len(rows))] == together


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=40, deadline=None)
@given(rows=rows_strategy, cut=st.integers(0, 7))
def test_fewer_drafts_at_a_position_give_the_same_outcome_cut_at_k(name, rows, cut):
    """Two policies that draft K <= K' at a request's position see the K' outcome cut at K."""
    model = _added(name, [r for r, _, _ in rows])
    wide = _sample(model, rows)
    narrow = _sample(model, [(r, p, min(k, cut)) for r, p, k in rows])
    assert narrow == [(min(d, cut), min(a, cut)) for d, a in wide]


# ------------------------------------------------------------------------------ whole runs


class KByParity:
    """K = `even_k` for even req_ids, `odd_k` for odd ones (per row)."""

    def __init__(self, even_k: int, odd_k: int) -> None:
        self.even_k, self.odd_k = even_k, odd_k

    def choose_k(self, view: StepView) -> np.ndarray:
        return np.where(view.req_ids % 2 == 0, self.even_k, self.odd_k).astype(np.int64)

    def observe(self, feedback: StepFeedback) -> None:
        """Learns nothing."""


def _emissions(
    policy: KPolicy,
    *,
    max_concurrency: int | None = None,
    scheduling: str = "sync",
    k_timing: str = "next-step",
    request_rate: float = np.inf,
    acceptance: str = "heterogeneous",
) -> dict[int, list[int]]:
    """Per request, the output tokens of each chunk it received, in order."""
    lengths = np.random.default_rng(0)
    requests = tuple(
        RequestSpec(prompt_len=int(p), output_len=int(o))
        for p, o in zip(lengths.integers(20, 400, 24), lengths.integers(8, 120, 24), strict=True)
    )
    workload = Workload("crn", requests, max_concurrency=max_concurrency)
    if np.isfinite(request_rate):
        workload = with_arrivals(workload, request_rate, 1.0, rng=np.random.default_rng(1))
    config = SchedulerConfig(
        max_model_len=4096,
        num_kv_blocks=8192,
        k_max=4,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        block_size=16,
        scheduling=scheduling,
        k_timing=k_timing,
    )
    executor = build_fitted_executor(
        load_profile(PROFILE_PATH), seed(3), latency_kind="table", acceptance_kind=acceptance
    )
    engine = Engine(Scheduler(config), executor, policy, workload, LoopConfig(record_events=True))
    chunks: dict[int, list[int]] = defaultdict(list)
    for event in engine.run().events:
        if event.kind == "emit":
            chunks[event.req_id].append(event.value)
    return dict(chunks)


@pytest.mark.parametrize("acceptance", ["heterogeneous", "per-position", "replay"])
def test_under_static_k_requests_see_the_same_outcomes_at_any_concurrency_mode_and_arrivals(
    acceptance,
):
    """vLLM's next-step K timing in both modes: a request verifies the same K at the same
    positions whether sync or async, closed or open loop, alone or in a crowd."""
    static = StaticK(3)
    runs = [
        _emissions(static, acceptance=acceptance, scheduling=scheduling, **settings_)
        for scheduling in ("sync", "async")
        for settings_ in (
            {"max_concurrency": 1},
            {"max_concurrency": 8},
            {"request_rate": 4.0},
            {},  # every request at once
        )
    ]
    assert len(runs[0]) == 24
    assert all(run == runs[0] for run in runs[1:])


def test_requests_whose_k_sequences_agree_are_identical_under_two_policies():
    """Same-step K timing, where every decode step verifies the K the policy gave its row.
    (Under next-step timing a request's first decode verifies the largest K of the decode rows
    at its prefill step: a per-row policy does not choose it, and it differs between these
    two policies.)"""
    both_three = _emissions(KByParity(3, 3), max_concurrency=6, k_timing="same-step")
    odd_one = _emissions(KByParity(3, 1), max_concurrency=6, k_timing="same-step")
    evens = [r for r in both_three if r % 2 == 0]
    assert [both_three[r] for r in evens] == [odd_one[r] for r in evens]
    odds = [r for r in both_three if r % 2 == 1]
    assert [both_three[r] for r in odds] != [odd_one[r] for r in odds]  # they did change


# ------------------------------------------------------------------------------ workloads


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("random", {}),
        ("mt-bench", {"request_rate": 3.0}),
        ("mt-bench", {"request_rate": 3.0, "burstiness": 0.5, "shuffle": True}),
        ("rl-rollout", {}),
    ],
)
def test_a_workloads_first_requests_do_not_depend_on_how_many_follow(name, fields):
    """Lengths, prompts and tags of request i are its own draws; arrival times too, up to the
    one scale vLLM bench applies to all of them (the last request is sent at N / rate)."""
    few = build_workload(name, num_prompts=10, seed=4, **fields).requests
    many = build_workload(name, num_prompts=40, seed=4, **fields).requests[:10]
    assert [replace(r, arrival_s=0.0) for r in many] == [replace(r, arrival_s=0.0) for r in few]
    scale = many[-1].arrival_s / few[-1].arrival_s if few[-1].arrival_s else 1.0
    np.testing.assert_allclose([r.arrival_s for r in many], [scale * r.arrival_s for r in few])


# ---------------------------------------------------------------------- benchmarks/crn_bound.py


def test_crn_bound_benchmark_splits_the_seed_and_refuses_bad_input(
    load_benchmark, capsys, tmp_path
):
    """benchmarks/crn_bound.py on a 4-request rollout: the grid's diagonal is an ordinary run
    (workload and simulator from one seed), its first column and row the split designs; bad
    input is a one-line error with exit 2."""
    import json

    from dsd.sim.build import run_simulation
    from dsd.sim.config import RunConfig
    from dsd.traces.rollout import RolloutConfig

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    module = load_benchmark("crn_bound")  # it imports crn_variance's point
    out = tmp_path / "bound.json"
    assert module.main(["--seeds", "2", "--requests", "4", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    assert [row["policy"] for row in run["rows"]] == ["goodput", "online", "per-request", "bandit"]
    for row in run["rows"]:
        grid = np.array(row["grid_gaps_pct"])  # [w, a]
        np.testing.assert_allclose(row["total_gaps_pct"], np.diag(grid), atol=1e-5)
        np.testing.assert_allclose(row["workload_gaps_pct"], grid[:, 0], atol=1e-5)
        np.testing.assert_allclose(row["acceptance_gaps_pct"], grid[0, :], atol=1e-5)
        assert row["floor_ci95_upper95_pct"] >= row["floor_ci95_pct"] >= 0
    bandit = run["rows"][-1]
    point = {
        "dataset": "rl-rollout",
        "acceptance_model": "heterogeneous",
        "rollout": RolloutConfig(num_requests=4, output_median=256.0, max_output_len=2048),
        "profile": str(benchmarks.parent / module.PROFILE),
        "seed": 1,
    }
    tpot = {
        spec: run_simulation(RunConfig(policy=spec, **point)).metrics["mean_tpot_ms"]
        for spec in ("bandit", bandit["envelope"])
    }
    gap = 100 * (tpot["bandit"] / tpot[bandit["envelope"]] - 1)
    assert bandit["grid_gaps_pct"][1][1] == pytest.approx(gap, abs=1e-5)
    capsys.readouterr()
    for argv in (["--seeds", "1"], ["--requests", "0"]):
        assert module.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
