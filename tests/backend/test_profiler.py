"""backend.profiler: ITL points per (B, K, context), prefill, acceptance counts, config checks."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mock_models import perturbed_copy, random_prompt, tiny_target

from dsd.backend.engine import Draft, SpecDecodeConfig, SpecDecodeEngine
from dsd.backend.environment import forward_tokens
from dsd.backend.fast_path import FastSpecDecodeEngine, build_spec_decode_engine
from dsd.backend.profiler import (
    MIN_POINTS_FOR_ROUND_SPEED,
    ProfileConfig,
    divide_round_drift,
    measure_acceptance,
    profile_pair,
)
from dsd.common.errors import InputError
from dsd.policies.host_time import TIMED_POLICIES
from dsd.policies.profile import LatencyPoint, Profile
from dsd.policies.profile_io import load_profile, save_profile
from dsd.validation.retime import TimingRounds


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


def small_config(**overrides) -> ProfileConfig:
    values = dict(
        batch_sizes=(1, 3),
        spec_tokens=(0, 1, 3),
        context_lens=(8, 20),
        prefill_token_counts=(4, 16),
        num_warmup=1,
        num_iters=4,
        allow_noisy=True,  # millisecond steps of tiny models on a shared CPU are noisy
    )
    values.update(overrides)
    return ProfileConfig(**values)  # type: ignore[arg-type]


def prompts(count: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [random_prompt(rng, n) for n in rng.integers(3, 12, size=count)]


@pytest.mark.parametrize("fast_path", ["off", "eager"])
def test_profile_has_every_point_and_round_trips(target, tmp_path, fast_path: str) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    config = small_config(fast_path=fast_path)
    profile = profile_pair(target, draft, config, prompts(), [10] * 5, {"command": "test"})
    keys = {(p.batch_size, p.num_spec_tokens, p.context_len) for p in profile.latency}
    # context_len records the tokens each row holds: the context plus the first sampled token
    assert keys == {(b, k, c + 1) for b in (1, 3) for k in (0, 1, 3) for c in (8, 20)}
    for point in profile.latency:
        assert point.n == 4
        assert point.p10_ms <= point.median_ms <= point.p90_ms
    assert [p.num_tokens for p in profile.prefill] == [4, 16]
    # a chunk beside the smallest and largest B in one forward: only the reference step has it
    in_decode = {(p.decode_rows, p.num_tokens) for p in profile.prefill_in_decode}
    assert in_decode == ({(b, n) for b in (1, 3) for n in (4, 16)} if fast_path == "off" else set())
    assert all(p.n == 4 and p.added_ms >= 0 for p in profile.prefill_in_decode)
    assert ("prefill_in_decode" in profile.metadata) == (fast_path == "off")
    assert profile.k_max == 3
    assert profile.metadata["command"] == "test"
    assert profile.metadata["fast_path"] == fast_path
    for key in ("device", "dtype", "versions", "date"):
        assert key in profile.metadata
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded.prefill_in_decode == profile.prefill_in_decode
    assert loaded.acceptance_rates == pytest.approx(profile.acceptance_rates)
    assert len(loaded.latency) == len(profile.latency)


def test_acceptance_counts_are_unconditional_and_consistent(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    engine = build_spec_decode_engine(
        target, draft, SpecDecodeConfig(num_slots=2, max_model_len=64, k_max=3)
    )
    counts = measure_acceptance(engine, prompts(4), [12, 9, 15, 6], k_max=3)
    drafted = np.array(counts.drafted_at_pos)
    accepted = np.array(counts.accepted_at_pos)
    assert (drafted == drafted[0]).all()  # every counted step drafted k_max
    assert (np.diff(accepted) <= 0).all()  # accepting i+1 drafts means accepting i
    assert ((accepted >= 0) & (accepted <= drafted)).all()
    assert 0 < accepted[0] < drafted[0]  # this draft both agrees and disagrees
    assert len(counts.per_request_rates) == 4
    for rates in counts.per_request_rates:
        assert all(b <= a for a, b in itertools.pairwise(rates))


def test_identical_draft_accepts_every_position(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.0, seed=1))
    profile = profile_pair(target, draft, small_config(), prompts(3), [10] * 3)
    assert profile.acceptance_rates == (1.0, 1.0, 1.0)


def test_profile_is_seed_reproducible_except_timing(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    first = profile_pair(target, draft, small_config(seed=3), prompts(), [10] * 5)
    second = profile_pair(target, draft, small_config(seed=3), prompts(), [10] * 5)
    assert first.drafted_at_pos == second.drafted_at_pos
    assert first.accepted_at_pos == second.accepted_at_pos
    assert first.per_request_rates == second.per_request_rates


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_sizes": (2, 4)}, "batch_sizes: must include 1"),  # the format needs B = 1
        ({"spec_tokens": (0, 3)}, "spec_tokens: must include 0 and 1"),  # goodput needs K = 1
        ({"spec_tokens": (0,)}, "spec_tokens"),  # K_max >= 1
        ({"batch_sizes": (1, 1)}, "duplicate"),
        ({"context_lens": (0,)}, "context_lens"),
        ({"num_iters": 0}, "num_iters"),
        ({"fast_path": "turbo"}, "fast_path"),
        ({"fast_path": "eager", "temperature": 0.5}, "greedy only"),  # fast path is greedy
    ],
)
def test_profile_config_rejects_bad_values(overrides, message: str) -> None:
    with pytest.raises(InputError, match=message):
        small_config(**overrides)


def test_profile_needs_a_draft(target) -> None:
    with pytest.raises(InputError, match="draft"):
        profile_pair(target, None, small_config(), prompts(), [10] * 5)


# ---------------------------------------------------------------- host overhead of the loop


class FakeClock:
    """A clock that moves only when told to: makes loop timings exact."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def advance_ms(self, ms: float) -> None:
        self.now_s += ms / 1000.0


def true_host_ms(batch_size: int, has_spec: bool) -> float:
    """The known overhead the fit must recover: plain 0.3 + 0.05 B, drafting 0.5 + 0.125 B."""
    return 0.5 + 0.125 * batch_size if has_spec else 0.3 + 0.05 * batch_size


class ClockedExecutor:
    """Accepts nothing; its 'forward' costs 1 + 0.5 B + 0.25 K ms on the fake clock, and it
    spends the known host time of the step outside the forward (`true_host_ms`)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.forward_ms = 0.0

    def add_request(self, req_id, spec) -> None:
        pass

    def execute(self, batch):
        from dsd.sim.types import StepOutcome

        num_decode = batch.num_decode_reqs
        self.clock.advance_ms(true_host_ms(batch.batch_size, batch.has_drafts))
        cost_ms = 1.0 + 0.5 * batch.batch_size + 0.25 * int(batch.num_spec_tokens.max(initial=0))
        self.clock.advance_ms(cost_ms)
        self.forward_ms += cost_ms
        return StepOutcome(duration_s=cost_ms / 1000.0, num_accepted=np.zeros(num_decode, np.int64))

    def take_forward_ms(self) -> float:
        value, self.forward_ms = self.forward_ms, 0.0
        return value


@pytest.mark.parametrize("after_step_ms", [None, 1.5])
def test_loop_fit_recovers_a_known_host_overhead_exactly(monkeypatch, after_step_ms) -> None:
    """Also with work after each step (the policy timing of measure_host_overhead): its time
    is left out of the iterations."""
    import types

    import dsd.backend.host_overhead
    import dsd.sim.engine
    from dsd.backend.host_overhead import fit_host_overhead, loop_host_samples
    from dsd.sim.config import RunConfig
    from dsd.sim.resolve import resolve
    from dsd.traces.workload import RequestSpec, Workload

    clock = FakeClock()
    # The loop's wall clock reads the fake clock: iteration time = host + forward, exactly.
    monkeypatch.setattr(dsd.sim.engine, "time", types.SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(
        dsd.backend.host_overhead, "time", types.SimpleNamespace(perf_counter=clock)
    )
    after_step = None if after_step_ms is None else (lambda: clock.advance_ms(after_step_ms))
    samples = []
    for batch_size in (1, 3, 6):
        for k in (0, 2):
            executor = ClockedExecutor(clock)
            workload = Workload(
                name="w",
                requests=tuple(
                    RequestSpec(prompt_len=8, output_len=6) for _ in range(2 * batch_size)
                ),
                max_concurrency=batch_size,
            )
            config = RunConfig(
                policy=f"static:{k}",
                max_model_len=32,
                num_kv_blocks=batch_size * 2,
                k_max=2,
                max_num_seqs=batch_size,
            )
            resolved = resolve(config, workload=workload)
            samples += loop_host_samples(resolved, executor, executor.take_forward_ms, after_step)
    for sample in samples:
        assert sample.overhead_ms == pytest.approx(true_host_ms(sample.batch_size, sample.has_spec))
    model = fit_host_overhead(samples)
    assert model.plain.intercept_ms == pytest.approx(0.3)
    assert model.plain.per_row_ms == pytest.approx(0.05)
    assert model.spec.intercept_ms == pytest.approx(0.5)
    assert model.spec.per_row_ms == pytest.approx(0.125)
    assert model.residual_ms == pytest.approx(0.0, abs=1e-9)
    assert model.num_steps == len(samples)
    assert model.max_batch_size == 6


def test_loop_fit_splits_off_the_planning_part(monkeypatch) -> None:
    """Planning (admissions, plan_step, the policy, commit_step) is timed on its own: with a
    plan_step that costs 0.2 + 0.01 B ms on the fake clock, the planning lines recover it and
    the total lines carry it on top of the executor's host time."""
    import types

    import dsd.sim.engine
    from dsd.backend.host_overhead import fit_host_overhead, loop_host_samples
    from dsd.sim.config import RunConfig
    from dsd.sim.resolve import resolve
    from dsd.sim.scheduler import Scheduler
    from dsd.traces.workload import RequestSpec, Workload

    clock = FakeClock()
    monkeypatch.setattr(dsd.sim.engine, "time", types.SimpleNamespace(perf_counter=clock))
    plan_step = Scheduler.plan_step

    def slow_plan_step(self):
        plan = plan_step(self)
        if plan is not None:
            clock.advance_ms(0.2 + 0.01 * plan.batch_size)
        return plan

    monkeypatch.setattr(Scheduler, "plan_step", slow_plan_step)
    samples = []
    for batch_size in (1, 4):
        for k in (0, 2):
            executor = ClockedExecutor(clock)
            workload = Workload(
                name="w",
                requests=tuple(RequestSpec(prompt_len=8, output_len=6) for _ in range(batch_size)),
                max_concurrency=batch_size,
            )
            config = RunConfig(policy=f"static:{k}", max_model_len=32, k_max=2)
            resolved = resolve(config, workload=workload)
            samples += loop_host_samples(resolved, executor, executor.take_forward_ms)
    model = fit_host_overhead(samples)
    for line in (model.planning_plain, model.planning_spec):
        assert line is not None
        assert (line.intercept_ms, line.per_row_ms) == pytest.approx((0.2, 0.01))
    assert (model.plain.intercept_ms, model.plain.per_row_ms) == pytest.approx((0.5, 0.06))
    assert model.planning_ms(4, True) == pytest.approx(0.24)


def _sample(batch_size: int, has_spec: bool, overhead_ms: float):
    from dsd.backend.host_overhead import HostOverheadSample

    return HostOverheadSample(batch_size, has_spec, iteration_ms=5.0 + overhead_ms, forward_ms=5.0)


def test_fit_ignores_a_slow_outlier_iteration_per_batch_size() -> None:
    from dsd.backend.host_overhead import fit_host_overhead

    samples = []
    for batch_size in (1, 2, 4, 8):
        samples += [_sample(batch_size, False, 0.2 + 0.1 * batch_size)] * 4
        samples.append(_sample(batch_size, False, 50.0))  # e.g. a garbage collection
        samples += [_sample(batch_size, True, 0.4 + 0.2 * batch_size)] * 4
    model = fit_host_overhead(samples)
    assert (model.plain.intercept_ms, model.plain.per_row_ms) == pytest.approx((0.2, 0.1))
    assert (model.spec.intercept_ms, model.spec.per_row_ms) == pytest.approx((0.4, 0.2))


@pytest.mark.parametrize(
    ("points", "expected_plain", "expected_spec"),
    [
        # one B only: no slope can be seen, intercept = the median
        ([(4, False, 0.7), (4, True, 0.9)], (0.7, 0.0), (0.9, 0.0)),
        # only plain steps: the drafting line copies the plain one
        ([(1, False, 0.3), (3, False, 0.5)], (0.2, 0.1), (0.2, 0.1)),
        # overhead falling with B: the least-squares slope would be < 0, clipped to 0
        ([(1, False, 0.5), (4, False, 0.2)], None, None),
    ],
)
def test_fit_edge_cases(points, expected_plain, expected_spec) -> None:
    from dsd.backend.host_overhead import fit_host_overhead

    model = fit_host_overhead([_sample(b, s, ms) for b, s, ms in points])
    if expected_plain is None:
        assert model.plain.per_row_ms == 0.0 and model.plain.intercept_ms > 0
        return
    assert (model.plain.intercept_ms, model.plain.per_row_ms) == pytest.approx(expected_plain)
    assert (model.spec.intercept_ms, model.spec.per_row_ms) == pytest.approx(expected_spec)


def test_fit_refuses_no_samples() -> None:
    from dsd.backend.host_overhead import fit_host_overhead

    with pytest.raises(ValueError, match="no loop iterations"):
        fit_host_overhead([])


def test_real_loop_samples_cover_both_classes_and_are_positive(target) -> None:
    from dsd.backend.host_overhead import measure_host_overhead

    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    config = small_config(host_overhead_output_len=6)
    model, samples, policy_samples = measure_host_overhead(target, draft, config)
    assert policy_samples == {}  # no profile to build the policies on: not timed
    # Forward intervals lie inside the iteration interval on the same clock (CPU: no sync).
    assert all(s.overhead_ms > 0 and s.forward_ms > 0 for s in samples)
    assert {s.has_spec for s in samples} == {False, True}
    assert {s.batch_size for s in samples} >= {1, 3}
    assert model.num_steps == len(samples) and model.max_batch_size == 3


def test_profile_carries_the_host_overhead_unless_off(target, tmp_path) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    measured = profile_pair(
        target, draft, small_config(host_overhead_output_len=4), prompts(2), [6, 6]
    )
    assert measured.host_overhead is not None
    assert measured.metadata["host_overhead"]["output_len"] == 4
    # the learning policies' own host time, timed on this profile (docs/models.md 1.5)
    assert [name for name, _line in measured.host_overhead.policies] == list(TIMED_POLICIES)
    assert all(line.at(3) >= 0 for _name, line in measured.host_overhead.policies)
    # timed after the host-overhead runs' steps, one policy (or the baseline) per step in turn
    counts = measured.metadata["host_overhead"]["policy_steps"]["samples"]
    assert list(counts) == ["static:3", *TIMED_POLICIES]
    assert max(counts.values()) - min(counts.values()) <= 2  # <= 1 apart at each of the 2 B
    assert min(counts.values()) > 0
    path = tmp_path / "p.json"
    save_profile(measured, path)
    assert load_profile(path).host_overhead == measured.host_overhead
    off = profile_pair(target, draft, small_config(host_overhead_output_len=0), prompts(2), [6, 6])
    assert off.host_overhead is None
    untimed = profile_pair(target, draft, small_config(time_policy_host=False), prompts(2), [6, 6])
    assert untimed.host_overhead is not None and untimed.host_overhead.policies == ()


@pytest.mark.parametrize("value", [-1, 1, 2.5, True])  # negative; one token; not an integer; bool
def test_bad_host_overhead_output_len_is_refused(value) -> None:
    with pytest.raises(InputError, match="host_overhead_output_len"):
        small_config(host_overhead_output_len=value)


# --- trustworthy timing: interleaving, re-measuring, refusing ---------------------------------


def _fake_timing(monkeypatch, cost_ms) -> list[tuple[int, int]]:
    """Replace each decode step's measured time by `cost_ms(point, call_index)` (the step still
    runs, so the engine state is real); returns the (B, K) call order."""
    from dsd.backend import profiler

    calls: list[tuple[int, int]] = []
    real = profiler.DecodeSlots.time_step

    def fake(self, point):  # type: ignore[no-untyped-def]
        real(self, point)
        calls.append(point)
        return float(cost_ms(point, len(calls) - 1))

    monkeypatch.setattr(profiler.DecodeSlots, "time_step", fake)
    return calls


def _profile(target, on_progress=None, **overrides):  # type: ignore[no-untyped-def]
    draft = Draft(perturbed_copy(target, noise_std=0.01, seed=1))
    # One prefill size: its real (unfaked) timing cannot fall with the prompt size.
    config = small_config(
        **{"context_lens": (8,), "prefill_token_counts": (4,), "allow_noisy": False, **overrides}
    )
    rng = np.random.default_rng(0)
    prompt_set = [random_prompt(rng, 6) for _ in range(2)]
    return profile_pair(target, draft, config, prompt_set, [6, 6], on_progress=on_progress)


class CountingProgress:
    """An `Advance` that counts units done and the total as the work grows it."""

    def __init__(self, total: int) -> None:
        self.done, self.total, self.past_total = 0, total, False

    def __call__(self, label: str, more: int = 0) -> None:
        self.done += 1
        self.total += more
        self.past_total |= self.done > self.total


def _physical(point: tuple[int, int]) -> float:
    b, k = point
    return 10.0 + 2.0 * b + 1.0 * k


def test_points_are_timed_in_a_fresh_random_order_each_round(target, monkeypatch) -> None:
    calls = _fake_timing(monkeypatch, lambda point, index: _physical(point))
    profile = _profile(target, num_warmup=0, num_iters=4)
    assert profile.metadata["quality"]["remeasured"] == []
    points = 2 * 3  # batch sizes x K values of small_config
    warmup = profile.metadata["quality"]["warmup_steps"][0]
    rounds = [tuple(calls[warmup + r * points : warmup + (r + 1) * points]) for r in range(4)]
    assert all(sorted(r) == sorted(rounds[0]) for r in rounds)  # every point once per round
    assert len(set(rounds)) > 1  # and not always in the same order


def test_the_profile_records_what_the_cpu_kernels_pad(target, monkeypatch) -> None:
    """`forward_tokens`: plain linears compute what they are given; the CPU kernels on oneDNN
    pad 2-3 rows to 4, and one row too on several threads; the native product pads nothing on
    one thread. The profile records it."""
    assert forward_tokens(target) == []
    kernels = tiny_target(seed=0)
    if not kernels.prepare_cpu_kernels(native=False):
        pytest.skip("this torch has no oneDNN linear ops")
    native = tiny_target(seed=0)
    native.prepare_cpu_kernels()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert forward_tokens(kernels) == [1, 4, 4]
        assert forward_tokens(native) == ([] if native.native_kernels else [1, 4, 4])
        torch.set_num_threads(2)
        assert forward_tokens(kernels) == [4, 4, 4]
        assert forward_tokens(native) == [4, 4, 4]
    finally:
        torch.set_num_threads(threads)
    _fake_timing(monkeypatch, lambda point, index: _physical(point))
    assert _profile(target, num_warmup=0, num_iters=1).metadata["forward_tokens"] == []
    assert _profile(kernels, num_warmup=0, num_iters=1).metadata["forward_tokens"] == (
        forward_tokens(kernels)
    )


def test_a_disturbed_point_is_measured_again_and_then_kept(target, monkeypatch) -> None:
    # The first pass's 4 samples of B=1 K=0 are disturbed (+50 ms: K=1, K=3 and B=3 look
    # cheaper than it); the re-measure is clean, so the profile is accepted with the clean median.
    seen = {"B=1 K=0": 0}

    def cost(point, index):  # type: ignore[no-untyped-def]
        if point == (1, 0):
            seen["B=1 K=0"] += 1
            return _physical(point) + (50.0 if seen["B=1 K=0"] <= 4 else 0.0)
        return _physical(point)

    _fake_timing(monkeypatch, cost)
    profile = _profile(target, num_warmup=0, num_iters=4)
    remeasured = profile.metadata["quality"]["remeasured"]
    assert remeasured == ["B=1 K=1 ctx=9", "B=1 K=3 ctx=9", "B=3 K=0 ctx=9"]
    assert profile.metadata["quality"]["problems"] == []
    by_point = {(p.batch_size, p.num_spec_tokens): p.median_ms for p in profile.latency}
    assert by_point[(1, 0)] == pytest.approx(_physical((1, 0)))


# Steps the warm-up runs at the heaviest point when its time is constant (2 windows of 5)
STEADY_WARMUP = 10
FIRST_PASS = 4 * 6  # timed rounds x points of small_config in `_profile`'s one context


def _noisy_at(points_by_pass):  # type: ignore[no-untyped-def]
    """A cost: `_physical`, times 1.4 at every other step of the points noisy in that pass
    (`points_by_pass[0]` in the first pass, `[1]` after it), times `points_by_pass[2]` after
    the first pass."""
    first, later, slower = points_by_pass
    steps: dict[tuple[int, int], int] = {}

    def cost(point, index):  # type: ignore[no-untyped-def]
        steps[point] = steps.get(point, 0) + 1
        first_pass = index < STEADY_WARMUP + FIRST_PASS
        noisy = point in (first if first_pass else later) and steps[point] % 2 == 0
        # 1.4: a spread past the limit, a median still within tolerance of its neighbours
        return _physical(point) * (1.4 if noisy else 1.0) * (1.0 if first_pass else slower)

    return cost


def test_a_re_measure_times_every_point_again_so_drift_cannot_skew_one(target, monkeypatch) -> None:
    # B=1 K=1 is noisy in the first pass, so the context is timed again, and the machine is
    # 1.5x slower from then on. Every point must come from the second pass: re-timing B=1 K=1
    # alone would price it 1.5x against the rest of its row.
    _fake_timing(monkeypatch, _noisy_at(({(1, 1)}, set(), 1.5)))
    # 4 decode rounds of one context, the prefill points, 4 rounds of mixed steps, 2 prompts,
    # 4 host-overhead runs; the re-measure pass adds its 4 rounds as it starts.
    progress = CountingProgress(4 + 1 + 4 + 2 + 4)
    profile = _profile(target, progress, num_warmup=0, num_iters=4, max_remeasure=1)
    assert (progress.done, progress.total, progress.past_total) == (19, 19, False)
    quality = profile.metadata["quality"]
    assert quality["warmup_steps"] == [STEADY_WARMUP]
    assert quality["remeasured"] == ["B=1 K=1 ctx=9"] and quality["problems"] == []
    for point in profile.latency:
        expected = 1.5 * _physical((point.batch_size, point.num_spec_tokens))
        assert point.median_ms == pytest.approx(expected)


def test_the_pass_with_fewer_problems_is_kept(target, monkeypatch) -> None:
    # One noisy point in the first pass, two in the second (the last): the first pass stands.
    _fake_timing(monkeypatch, _noisy_at(({(1, 1)}, {(1, 0), (3, 3)}, 1.0)))
    profile = _profile(target, num_warmup=0, num_iters=4, max_remeasure=1, allow_noisy=True)
    quality = profile.metadata["quality"]
    assert quality["warmup_steps"] == [STEADY_WARMUP]
    assert [problem.split(":")[0] for problem in quality["problems"]] == ["B=1 K=1 ctx=9"]


def test_timing_that_stays_non_monotonic_is_refused_naming_the_point(target, monkeypatch) -> None:
    from dsd.backend.profiler import ProfileQualityError

    def cost(point, index):  # type: ignore[no-untyped-def]
        return 5.0 if point == (3, 3) else _physical(point)  # B=3 K=3 always too fast

    _fake_timing(monkeypatch, cost)
    with pytest.raises(ProfileQualityError, match=r"B=3 K=3 ctx=9: median 5 ms is below"):
        _profile(target, num_warmup=0, num_iters=3, max_remeasure=1)
    kept = _profile(target, num_warmup=0, num_iters=3, max_remeasure=1, allow_noisy=True)
    problems = kept.metadata["quality"]["problems"]
    assert problems and all(p.startswith("B=3 K=3") for p in problems)


@settings(max_examples=60, deadline=None)
@given(
    base=st.lists(st.floats(1.0, 500.0), min_size=MIN_POINTS_FOR_ROUND_SPEED, max_size=12),
    factors=st.lists(st.floats(0.5, 2.0), min_size=1, max_size=9),
)
def test_dividing_round_drift_leaves_steady_points_steady(base, factors) -> None:  # type: ignore[no-untyped-def]
    """Every point of a round slowed by the same factor: divided, each point's samples are
    one value again, and the round speeds are the factors over their median."""
    samples = {index: [value * f for f in factors] for index, value in enumerate(base)}
    steady, speeds = divide_round_drift(samples)
    for index, value in enumerate(base):
        assert steady[index] == pytest.approx([value * np.median(factors)] * len(factors))
    assert speeds == pytest.approx(list(np.array(factors) / np.median(factors)))


def test_dividing_round_drift_keeps_one_points_own_noise() -> None:
    # Four steady points and one that alternates 1x / 2x: the rounds' speeds stay 1, so the
    # noisy point keeps its spread for the check to see.
    samples = {b: [10.0 * b] * 6 for b in range(1, 5)}
    samples[5] = [50.0, 100.0] * 3
    steady, speeds = divide_round_drift(samples)
    assert speeds == [1.0] * 6 and steady == samples
    # Too few points for a round's median to stand for the machine: nothing divided.
    few = {b: samples[b] for b in range(1, MIN_POINTS_FOR_ROUND_SPEED)}
    assert divide_round_drift(few) == (few, [1.0] * 6)


def test_drift_shared_by_a_rounds_points_is_no_noise(target, monkeypatch) -> None:
    # The machine runs each round at its own speed (1.0, 1.6, 0.8, 1.3x): every point's raw
    # p10-p90 spans ~55% of its median, yet the ratios between points never move. Divided by
    # the rounds' speeds the points are steady at the median round's speed (1.15x): no re-measure.
    factors = (1.0, 1.6, 0.8, 1.3)

    def cost(point, index):  # type: ignore[no-untyped-def]
        if index < STEADY_WARMUP:
            return _physical(point)
        return _physical(point) * factors[(index - STEADY_WARMUP) // 6 % 4]

    _fake_timing(monkeypatch, cost)
    profile = _profile(target, num_warmup=0, num_iters=4, max_remeasure=1)
    quality = profile.metadata["quality"]
    assert quality["remeasured"] == [] and quality["problems"] == []
    assert quality["round_speeds"] == ["ctx=9 B=1,3: 0.70-1.39"]
    for point in profile.latency:
        expected = 1.15 * _physical((point.batch_size, point.num_spec_tokens))
        assert (point.p10_ms, point.median_ms, point.p90_ms) == pytest.approx((expected,) * 3)


def test_noisy_point_is_refused(target, monkeypatch) -> None:
    from dsd.backend.profiler import ProfileQualityError

    def cost(point, index):  # type: ignore[no-untyped-def]
        return _physical(point) * (3.0 if point == (1, 1) and index % 2 else 1.0)

    _fake_timing(monkeypatch, cost)
    with pytest.raises(ProfileQualityError, match=r"B=1 K=1 ctx=9: p10-p90"):
        _profile(target, num_warmup=0, num_iters=6, max_remeasure=0)


def test_warm_up_runs_until_two_windows_agree() -> None:
    from dsd.backend.profiler import warm_up

    settling = iter([50.0, 40.0, 30.0, 20.0, 15.0] + [10.0] * 100)
    # windows [.., 15, 10, 10, 10, 10] vs [20, 15, 10, 10, 10] agree first after 13 steps
    assert warm_up(lambda: next(settling), min_steps=0, window=5) == 13
    assert warm_up(lambda: 10.0, min_steps=12, window=5) == 12
    drifting = itertools.count(1.0)  # never settles: stops at max_steps
    assert warm_up(lambda: next(drifting), min_steps=0, window=5, max_steps=40) == 40


@pytest.mark.parametrize("draft_kind", ["ngram", "model"])
def test_greedy_profile_records_draft_sequences_that_replay_its_histograms(
    target, draft_kind
) -> None:
    """Stepping through each request's recorded sequence at K = k_max (p += a + 1) gives back
    exactly the (d, a) counts the acceptance run measured."""
    from dsd.backend.engine import NgramDraft
    from dsd.backend.ngram import NgramConfig
    from dsd.policies.profile import outcome_matrices

    rng = np.random.default_rng(3)
    block = random_prompt(rng, 3)
    prompt_set = [np.tile(block, 4), random_prompt(rng, 10), np.tile(random_prompt(rng, 2), 5)]
    draft = (
        NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
        if draft_kind == "ngram"
        else Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    )
    config = small_config(context_lens=(24,), host_overhead_output_len=0)
    profile = profile_pair(target, draft, config, prompt_set, [12, 12, 12])
    assert len(profile.draft_sequences) == len(profile.draft_outcomes) == 3
    k_max = profile.k_max
    for (available, matched), joint in zip(
        profile.draft_sequences, outcome_matrices(profile.draft_outcomes, k_max), strict=True
    ):
        replayed = np.zeros_like(joint)
        position = 1  # the prompt's prefill emitted output 0; the first step drafts from 1
        while position < 12:  # a request steps until it has its 12 output tokens
            d = min(k_max, available[position])
            a = min(d, matched[position])
            replayed[d, a] += 1
            position += a + 1
        np.testing.assert_array_equal(replayed, joint)


def test_ngram_draft_is_profiled_with_periodic_contexts(target) -> None:
    """Every timed step drafts its full K (the lookup always matches), and a context too short
    for that is refused before any point is kept."""
    from dsd.backend.engine import NgramDraft
    from dsd.backend.ngram import NgramConfig

    rng = np.random.default_rng(0)
    prompts = [random_prompt(rng, 8) for _ in range(2)]
    draft = NgramDraft(NgramConfig(prompt_lookup_min=1, prompt_lookup_max=3))
    config = small_config(context_lens=(24,), host_overhead_output_len=0)
    profile = profile_pair(target, draft, config, prompts, [6, 6])
    assert {(p.batch_size, p.num_spec_tokens) for p in profile.latency} == {
        (b, k) for b in (1, 3) for k in (0, 1, 3)
    }
    with pytest.raises(InputError, match=r"proposed .* of K=3 tokens at context 4"):
        profile_pair(target, draft, small_config(context_lens=(4,)), prompts, [6, 6])


def test_timing_rounds_retime_every_point_between_runs(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    profile = profile_pair(target, draft, small_config(context_lens=(6, 4)), prompts(3), [6] * 3)
    timing = TimingRounds(target, draft, profile, share=1.0)
    assert [timing.round() for _ in range(3)] == [0, 1, 2]
    retimed = timing.profile()
    assert len(retimed.latency) == len(profile.latency)
    assert {(p.context_len, p.batch_size, p.num_spec_tokens) for p in retimed.latency} == {
        (p.context_len, p.batch_size, p.num_spec_tokens) for p in profile.latency
    }
    assert all(p.n == 3 and p.mean_ms is not None for p in retimed.latency)
    assert all(p.n == 3 and p.mean_ms is not None for p in retimed.prefill)
    assert [(p.decode_rows, p.num_tokens) for p in retimed.prefill_in_decode] == [
        (p.decode_rows, p.num_tokens) for p in profile.prefill_in_decode
    ]
    assert profile.prefill_in_decode and all(p.n == 3 for p in retimed.prefill_in_decode)
    # policy inputs (acceptance, host overhead) are the profile's own
    assert retimed.acceptance_rates == profile.acceptance_rates
    assert retimed.host_overhead == profile.host_overhead
    rounds = dict(retimed.metadata["timing_rounds"])
    prefill_samples = rounds.pop("prefill_samples_ms")
    assert rounds == {"rounds": 3, "share": 1.0, "probed_runs": 0}
    # each prefill point's samples, whose mean it is
    for point in retimed.prefill:
        samples = prefill_samples[str(point.num_tokens)]
        assert len(samples) == 3 and point.mean_ms == pytest.approx(np.mean(samples), abs=1e-3)
    # speed: samples over their point's median; every point once per round
    speed = timing.speed([0, 1, 2])
    assert speed == pytest.approx(1.0)
    assert timing.speed([0]) > 0 and np.isnan(timing.speed([]))
    # every timed step saw its point's context
    for context, slots in timing._slots.items():
        assert (slots.engine.num_tokens[slots.slots] == context).all()
    timing.free()


def test_timing_rounds_time_a_share_of_the_points(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    profile = profile_pair(target, draft, small_config(context_lens=(6,)), prompts(3), [6] * 3)
    timing = TimingRounds(target, draft, profile, share=0.25)
    timing.round()
    timed = sum(
        len(v)
        for v in [*timing._decode.values(), *timing._prefill.values(), *timing._in_decode.values()]
    )
    total = len(profile.latency) + len(profile.prefill) + len(profile.prefill_in_decode)
    assert timed == -(-total // 4)
    retimed = timing.profile()  # points no round timed keep the profile's own timing
    points = [*retimed.latency, *retimed.prefill, *retimed.prefill_in_decode]
    assert sum(p.n == 1 for p in points) == timed


def test_timing_rounds_time_the_runs_decode_path_with_every_shape_run_before_a_round(
    target,
) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    profile = profile_pair(target, draft, small_config(context_lens=(6, 4)), prompts(3), [6] * 3)
    timing = TimingRounds(target, draft, profile, share=1.0, fast_path="eager")
    engine = timing._engine
    assert isinstance(engine, FastSpecDecodeEngine)
    shapes = set(engine.runner.keys_seen)  # a CUDA graph would be captured once for each
    assert {key.num_spec_tokens for key in shapes} == {p.num_spec_tokens for p in profile.latency}
    timing.round()
    timing.round()
    assert engine.runner.keys_seen == shapes  # no round ran a shape for the first time
    assert all(p.n == 2 for p in timing.profile().latency)
    timing.free()
    assert type(TimingRounds(target, draft, profile)._engine) is SpecDecodeEngine  # "off"


def test_timing_rounds_need_recorded_contexts(target) -> None:
    point = LatencyPoint(batch_size=1, num_spec_tokens=0, median_ms=1.0)
    profile = Profile(k_max=1, latency=(point,), acceptance_rates=(0.5,))
    with pytest.raises(InputError, match="records no context"):
        TimingRounds(target, None, profile)


def _points(itl: dict[int, float]) -> list:
    from dsd.policies.profile import LatencyPoint

    return [
        LatencyPoint(batch_size=b, num_spec_tokens=k, median_ms=ms + k)
        for b, ms in itl.items()
        for k in (0, 1)
    ]


@pytest.mark.parametrize(
    ("itl", "target_pct", "expected_added"),
    [
        # flat to 16, then steep: B = 16 is predicted from 1 and 64 far too high, so the
        # geometric midpoints around it are proposed: sqrt(1 x 16) = 4, sqrt(16 x 64) = 32
        ({1: 10.0, 16: 10.5, 64: 30.0}, 5.0, (4, 32)),
        ({1: 10.0, 16: 10.5, 64: 30.0}, 1000.0, ()),  # within the target: done
        ({1: 10.0, 2: 20.0, 3: 10.0}, 1.0, ()),  # neighbours adjacent: nothing left to add
        ({1: 10.0, 64: 30.0}, 1.0, ()),  # no interior B to leave out
    ],
)
def test_next_batch_sizes_refines_around_the_worst_interpolated_b(
    itl, target_pct, expected_added
) -> None:
    from dsd.backend.profiler import next_batch_sizes

    added, worst = next_batch_sizes(_points(itl), k_max=1, target_pct=target_pct)
    assert added == expected_added
    if 16 in itl:  # B=16 read off the 1..64 line at K=0: (10 + 15/63 x 20) / 10.5 - 1
        assert worst == pytest.approx(100 * ((10 + 15 / 63 * 20) / 10.5 - 1))


def test_adaptive_profile_adds_batch_sizes_and_records_the_rounds(target) -> None:
    """A target no real timing meets: rounds add B between the listed ones until none is
    left to add (or the round limit), each recorded in metadata.quality.adaptive."""
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    config = small_config(
        batch_sizes=(1, 4, 16),
        context_lens=(8,),
        adaptive_target_pct=1e-6,
        adaptive_budget_s=120.0,
        host_overhead_output_len=0,
    )
    progress = CountingProgress(config.num_units(2))
    profile = profile_pair(target, draft, config, prompts(2), [6] * 2, on_progress=progress)
    assert progress.done == progress.total > config.num_units(2) and not progress.past_total
    measured = set(profile.batch_sizes())
    assert {1, 4, 16} < measured and measured <= set(range(1, 17))
    adaptive = profile.metadata["quality"]["adaptive"]
    added = {b for row in adaptive["rounds"] for b in row["added"]}
    assert added == measured - {1, 4, 16}
    assert adaptive["met"] is False and adaptive["target_pct"] == 1e-6


def test_adaptive_profiling_needs_three_batch_sizes_and_a_positive_target() -> None:
    with pytest.raises(InputError, match="adaptive profiling needs >= 3"):
        small_config(adaptive_target_pct=5.0)
    with pytest.raises(InputError, match="adaptive_target_pct: must be a number > 0"):
        small_config(batch_sizes=(1, 2, 4), adaptive_target_pct=0.0)


def test_timing_probes_cycle_through_the_points_up_to_max_batch(target) -> None:
    draft = Draft(perturbed_copy(target, noise_std=0.006, seed=1))
    config = small_config(context_lens=(6,))
    profile = profile_pair(target, draft, config, prompts(3), [6] * 3)
    timing = TimingRounds(target, draft, profile, share=0.25)
    window = timing.open_window()
    assert window == 0 and timing.num_rounds == timing.num_windows == 1
    small = [key for key in timing.decode_keys if key[1] <= 2]
    assert 0 < len(small) < len(timing.decode_keys)
    for _ in range(2 * len(small)):
        assert timing.probe(window, 2) > 0
    # each point with B <= 2 timed once per cycle, into the window; no other point
    assert {key: len(samples) for key, samples in timing._decode.items()} == {
        key: 2 if key in small else 0 for key in timing.decode_keys
    }
    assert {r for samples in timing._decode.values() for r, _ms in samples} == {window}
    assert math.isfinite(timing.speed([window]))
    timing.free()


# --- benchmarks/profile_precision.py ----------------------------------------------------------


def test_block_errors_separate_a_drifting_level_from_steady_ratios(load_benchmark) -> None:
    # Every round scales all points by one machine speed: the points' means move from block to
    # block, their ratios to K = 0 do not.
    module = load_benchmark("profile_precision")
    keys = [(b, k) for b in (1, 2) for k in (0, 1, 3)]
    cost = np.array([10.0 + 2 * b + k for b, k in keys])  # [points]
    speed = np.repeat([1.0, 1.2, 0.9, 1.1], 5)  # [rounds]: four 5-round blocks
    errors = module.block_errors(speed[:, None] * cost[None, :], keys, 5)
    assert errors["ratio_median_pct"] == pytest.approx(0.0, abs=1e-9)
    assert errors["ratio_p90_pct"] == pytest.approx(0.0, abs=1e-9)
    # block means 1.0, 1.2, 0.9, 1.1: |a/b - 1| over the 6 pairs, / sqrt 2, as percentages
    pairs = [abs(a / b - 1) for a, b in itertools.combinations((1.0, 1.2, 0.9, 1.1), 2)]
    assert errors["point_median_pct"] == pytest.approx(100 * np.median(pairs) / math.sqrt(2))
    noisy = speed[:, None] * cost[None, :]
    noisy[::2, 1] *= 1.3  # B=1 K=1 disturbed in every other round: its ratio moves too
    assert module.block_errors(noisy, keys, 5)["ratio_p90_pct"] > 0.0


def test_profile_precision_benchmark_live_and_on_a_report(load_benchmark, capsys, tmp_path):  # type: ignore[no-untyped-def]
    module = load_benchmark("profile_precision")
    out = tmp_path / "precision.json"
    argv = ["--target", "tiny", "--draft", "ngram", "--rounds", "10", "--context", "24"]
    assert module.main([*argv, "--warmup", "0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "n= 5:" in printed and "n=10" not in printed  # 10 rounds: two 5-round blocks only
    assert set(json.loads(out.read_text())["blocks"]) == {"5"}
    report = Path(__file__).resolve().parents[2] / "results/validation/2026-11-27-cpu-smollm2"
    assert module.main(["--reports", str(report)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # one per context
    assert "ctx 321" in lines[1] and "re-measured 20 points, median 1.015" in lines[1]
    assert "the rest  5 points, median 0.875" in lines[1]
    assert module.main(["--rounds", "3"]) == 2
    assert module.main(["--reports", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "Traceback" not in err


def test_environment_metadata_names_the_cpu_product_in_float32_only() -> None:
    """float32 step times on CUDA depend on cuBLAS vs cuBLASLt and TF32
    (results/gpu/2026-11-28-h100), and on CPU on whether the native product runs, so a
    profile and a report record them."""
    from dsd.backend.environment import environment_metadata
    from dsd.backend.native import status

    cpu = environment_metadata(torch.device("cpu"), torch.float32)
    assert cpu["matmul"] == {"native_product": status()}
    assert "matmul" not in environment_metadata(torch.device("cpu"), torch.bfloat16)


@pytest.mark.gpu
def test_environment_metadata_reads_the_preferred_matrix_library(monkeypatch) -> None:
    from dsd.backend.environment import environment_metadata

    monkeypatch.delenv("DSD_CUBLASLT_MAX_ROWS", raising=False)
    before = torch.backends.cuda.preferred_blas_library()
    try:
        for library, name in (("cublaslt", "Cublaslt"), ("cublas", "Cublas")):
            torch.backends.cuda.preferred_blas_library(library)
            matmul = environment_metadata(torch.device("cuda"), torch.float32)["matmul"]
            assert matmul == {
                "blas": name,
                "tf32": torch.backends.cuda.matmul.allow_tf32,
                "cublaslt_max_rows": 0,
            }
    finally:
        torch.backends.cuda.preferred_blas_library(before)
