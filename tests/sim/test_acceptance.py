"""Tests of sim.models.acceptance: per-position, heterogeneous, replay and per-category models."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.policies.profile import LatencyPoint, Profile
from dsd.sim.models.acceptance import (
    CategoryAcceptance,
    EmpiricalAcceptance,
    HeterogeneousAcceptance,
    PerPositionAcceptance,
    conditional_rates,
)
from dsd.sim.models.replay import (
    DEFAULT_RECORDING_PATH,
    ReplayAcceptance,
    ReplayRecording,
    load_replay_recording,
    per_position_rates_from_recording,
)
from dsd.traces.workload import RequestSpec, prompt_key

H100_RATES = (0.6811801775995416, 0.3914351188771126, 0.20352334574620454, 0.1014036092810083)
H100_RATES = (*H100_RATES, 0.051417931824692065)
SPEC = RequestSpec(prompt_len=16, output_len=64)


def seed(value: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(value)


def ids(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def full(n: int, value: int) -> np.ndarray:
    return np.full(n, value, dtype=np.int64)


# ----------------------------------------------------------------------------- per position

CONDITIONAL_CASES = [
    # (unconditional, conditional, why)
    ([0.8, 0.4, 0.1], [0.8, 0.5, 0.25], "c_i = r_i / r_{i-1}"),
    ([0.5, 0.0, 0.0], [0.5, 0.0, 0.0], "a zero rate stays zero after it (no 0/0)"),
    ([0.5, 0.6], [0.5, 1.0], "a rise by noise is clipped to a conditional rate of 1"),
    ([1.0, 1.0], [1.0, 1.0], "always accepted"),
]


@pytest.mark.parametrize(("uncond", "cond", "why"), CONDITIONAL_CASES)
def test_conditional_rates(uncond: list[float], cond: list[float], why: str) -> None:
    got = conditional_rates(np.array(uncond))
    np.testing.assert_allclose(got, cond, err_msg=why)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_per_position_mean_accepted_matches_sum_of_rates(k: int) -> None:
    model = PerPositionAcceptance(H100_RATES, seed(k))
    num_rows = 200_000
    accepted = model.sample_outcomes(ids(num_rows), full(num_rows, 10), full(num_rows, k))[1]
    expected = sum(H100_RATES[:k])
    std_err = accepted.std() / np.sqrt(num_rows)
    assert abs(accepted.mean() - expected) < 5 * std_err + 1e-9
    assert accepted.min() >= 0 and accepted.max() <= k
    # P(a >= i) = r_i: the unconditional per-position rates come back.
    for i in range(1, k + 1):
        assert abs((accepted >= i).mean() - H100_RATES[i - 1]) < 0.006


def test_per_position_never_exceeds_k_with_mixed_k() -> None:
    model = PerPositionAcceptance([1.0, 1.0, 1.0], seed(0))
    ks = np.array([0, 1, 2, 3, 5, 7, 0], dtype=np.int64)
    accepted = model.sample_outcomes(ids(7), full(7, 3), ks)[1]
    # Rates of 1 accept everything drafted, beyond k_max too (last conditional rate reused).
    np.testing.assert_array_equal(accepted, ks)


def test_per_position_same_seed_same_draws() -> None:
    ks = np.array([0, 3, 5, 2, 4] * 20, dtype=np.int64)
    first = PerPositionAcceptance(H100_RATES, seed(7))
    second = PerPositionAcceptance(H100_RATES, seed(7))
    for _ in range(5):
        np.testing.assert_array_equal(
            first.sample_outcomes(ids(100), full(100, 1), ks)[1],
            second.sample_outcomes(ids(100), full(100, 1), ks)[1],
        )


def test_per_position_empty_batch() -> None:
    model = PerPositionAcceptance(H100_RATES, seed(0))
    assert model.sample_outcomes(ids(0), full(0, 0), full(0, 0))[1].shape == (0,)


def test_per_position_rejects_bad_rates() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        PerPositionAcceptance([0.5, 1.5], seed(0))
    with pytest.raises(ValueError, match="non-empty"):
        PerPositionAcceptance([], seed(0))


def test_sampling_256_rows_is_fast() -> None:
    """The per-step hot path: report the figure, fail only on a gross regression."""
    num_rows = 256
    ks = full(num_rows, 5)
    positions = full(num_rows, 20)
    het = HeterogeneousAcceptance(H100_RATES, seed(1))
    replay = ReplayAcceptance(load_replay_recording(), seed(2))
    for req_id in range(num_rows):
        het.add_request(req_id, SPEC)
        replay.add_request(req_id, SPEC)
    models = {
        "per-position": PerPositionAcceptance(H100_RATES, seed(0)),
        "heterogeneous": het,
        "replay": replay,
    }
    for name, model in models.items():
        repeats = 2000
        start = time.perf_counter()
        for _ in range(repeats):
            model.sample_outcomes(ids(num_rows), positions, ks)[1]
        per_call_us = (time.perf_counter() - start) / repeats * 1e6
        print(f"sample_outcomes {name}, 256 rows, K=5: {per_call_us:.1f} us/call")
        assert per_call_us < 1000.0


# ----------------------------------------------------------------------------- heterogeneous


def test_heterogeneous_population_mean_reproduces_profile_rates() -> None:
    model = HeterogeneousAcceptance(H100_RATES, seed(3), spread=0.1)
    drawn = model.draw_rates(ids(200_000))  # [n, k]
    np.testing.assert_allclose(drawn.mean(axis=0), H100_RATES, atol=0.003)
    # Per-request rates are valid unconditional rates: in [0, 1] and non-increasing.
    assert np.all((drawn >= 0) & (drawn <= 1))
    assert np.all(np.diff(drawn, axis=1) <= 1e-12)
    # The spread asked for is the std of per-request r_1.
    assert drawn[:, 0].std() == pytest.approx(0.1, abs=0.003)


def test_heterogeneous_sampled_acceptance_reproduces_profile_rates() -> None:
    model = HeterogeneousAcceptance(H100_RATES, seed(4))
    num_requests = 4000
    for req_id in range(num_requests):
        model.add_request(req_id, SPEC)
    accepted = np.concatenate(
        [
            model.sample_outcomes(
                ids(num_requests), full(num_requests, 1 + 5 * step), full(num_requests, 5)
            )[1]
            for step in range(20)  # 20 steps at distinct positions: independent draws
        ]
    )
    for i in range(1, 6):
        assert abs((accepted >= i).mean() - H100_RATES[i - 1]) < 0.01


def test_heterogeneous_requests_differ_and_tpot_is_not_itl_over_mean_al() -> None:
    model = HeterogeneousAcceptance(H100_RATES, seed(5), spread=0.12)
    num_requests = 2000
    for req_id in range(num_requests):
        model.add_request(req_id, SPEC)
    k = 3
    per_request_al = np.array(
        [1.0 + model.request_rates(r)[:k].sum() for r in range(num_requests)]
    )  # [n]
    assert per_request_al.std() > 0.1  # requests differ
    mean_al = float(per_request_al.mean())
    assert mean_al == pytest.approx(1.0 + sum(H100_RATES[:k]), abs=0.02)
    # With a fixed ITL, per-request TPOT ~ ITL / AL_j: its mean is ITL * mean(1/AL_j), which
    # exceeds ITL / mean(AL) (Jensen) by a visible margin.
    assert np.mean(1.0 / per_request_al) > 1.01 / mean_al
    # Each request's sampled acceptance follows its own rates.
    weakest, strongest = int(np.argmin(per_request_al)), int(np.argmax(per_request_al))
    rows = np.array([weakest] * 20000 + [strongest] * 20000, dtype=np.int64)
    # one step per row at positions k apart: every draw is a different token's
    positions = k * np.arange(len(rows), dtype=np.int64)
    accepted = model.sample_outcomes(rows, positions, full(len(rows), k))[1]
    assert accepted[:20000].mean() + 1 == pytest.approx(per_request_al[weakest], abs=0.03)
    assert accepted[20000:].mean() + 1 == pytest.approx(per_request_al[strongest], abs=0.03)


def test_heterogeneous_spread_from_profile_samples() -> None:
    rng = np.random.default_rng(0)
    samples = tuple((float(v), float(v) * 0.5) for v in rng.beta(0.68 * 9, 0.32 * 9, 400))
    profile = Profile(
        k_max=2,
        latency=(LatencyPoint(1, 0, 5.0),),
        acceptance_rates=(0.68, 0.34),
        per_request_rates=samples,
    )
    model = HeterogeneousAcceptance.from_profile(profile, seed(0))
    assert model.concentration == pytest.approx(9.0, rel=0.25)  # Beta(mean, kappa=9) drew them


def test_heterogeneous_removed_request_cannot_be_sampled() -> None:
    model = HeterogeneousAcceptance(H100_RATES, seed(0))
    model.add_request(3, SPEC)
    model.remove_request(3)
    with pytest.raises(KeyError, match="never added"):
        model.sample_outcomes(np.array([3]), full(1, 1), full(1, 2))[1]


def test_heterogeneous_rejects_impossible_spread() -> None:
    with pytest.raises(ValueError, match="spread"):
        HeterogeneousAcceptance(H100_RATES, seed(0), spread=0.6)


# ----------------------------------------------------------------------------- replay

SEQUENCE = [1, 1, 0, 1, 1, 1, 0]
REPLAY_CASES = [
    # (output position p, K, expected accepted, why)
    (0, 3, 2, "leading 1s of [1,1,0]"),
    (3, 2, 2, "all of [1,1] accepted"),
    (3, 5, 3, "[1,1,1,0,1]: stops at the first 0"),
    (2, 4, 0, "first draft rejected"),
    (4, 3, 2, "[1,1,0]"),
    (5, 4, 1, "wraps: positions 5,6,0,1 read [1,0,1,1]"),
    (9, 2, 0, "wraps: 9 mod 7 = 2 reads [0,1]"),
    (0, 0, 0, "K=0 accepts nothing"),
]


@pytest.mark.parametrize(("position", "k", "expected", "why"), REPLAY_CASES)
def test_replay_accepted_is_leading_ones_of_recorded_sequence(
    position: int, k: int, expected: int, why: str
) -> None:
    model = ReplayAcceptance(ReplayRecording.from_sequences([SEQUENCE]), seed(0))
    model.add_request(0, SPEC)
    got = model.sample_outcomes(np.array([0]), np.array([position]), np.array([k]))[1]
    assert got.tolist() == [expected], why


def naive_leading_ones(sequence: list[int], position: int, k: int) -> int:
    count = 0
    while count < k and sequence[(position + count) % len(sequence)]:
        count += 1
    return count


@given(
    sequences=st.lists(
        st.lists(st.integers(0, 1), min_size=1, max_size=30), min_size=1, max_size=4
    ),
    rows=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 9)), min_size=1, max_size=12),
)
def test_replay_matches_a_naive_reference(
    sequences: list[list[int]], rows: list[tuple[int, int]]
) -> None:
    model = ReplayAcceptance(ReplayRecording.from_sequences(sequences), seed(0))
    for req_id in range(len(rows)):
        model.add_request(req_id, SPEC)
    positions = np.array([p for p, _ in rows], dtype=np.int64)
    ks = np.array([k for _, k in rows], dtype=np.int64)
    got = model.sample_outcomes(ids(len(rows)), positions, ks)[1]
    # Round-robin: request r replays sequence r mod (number of sequences).
    expected = [
        naive_leading_ones(sequences[r % len(sequences)], p, k) for r, (p, k) in enumerate(rows)
    ]
    assert got.tolist() == expected


def test_replay_maps_tags_to_matching_categories_round_robin() -> None:
    recording = ReplayRecording.from_sequences(
        [[1], [0], [1, 1], [0, 0]], categories=["math", "coding", "math", "coding"]
    )
    model = ReplayAcceptance(recording, seed(0))
    tags = ["math", "math", "math", "coding", None, "unknown"]
    for req_id, tag in enumerate(tags):
        model.add_request(req_id, RequestSpec(prompt_len=4, output_len=4, tag=tag))
    # math -> prompts 0, 2, 0; coding -> 1; untagged and unknown tags share the all-prompts cursor.
    assert [model.prompt_of(r) for r in range(len(tags))] == [0, 2, 0, 1, 0, 1]


def test_replay_random_assignment_is_seeded() -> None:
    recording = load_replay_recording()
    picks = []
    for _ in range(2):
        model = ReplayAcceptance(recording, seed(11), assignment="random")
        for req_id in range(50):
            model.add_request(req_id, SPEC)
        picks.append([model.prompt_of(r) for r in range(50)])
    assert picks[0] == picks[1]
    assert len(set(picks[0])) > 10


def test_recorded_rates_at_layer_27_match_the_published_summary() -> None:
    recording = load_replay_recording(layer=27)
    assert recording.num_requests == 80
    assert int(recording.lengths.sum()) == 9561
    result = per_position_rates_from_recording(recording, k_max=4)
    print("layer 27 per-position rates (K=4):", [round(r, 3) for r in result.rates])
    # README summary: match rate 0.52, conditional acceptance at position 1 of 0.548 and 1.99
    # tokens per step with K=4 (its replay starts at position 0, ours at 1).
    assert result.rates[0] == pytest.approx(0.548, abs=0.02)
    assert result.rates[0] == pytest.approx(0.52, abs=0.05)
    assert result.acceptance_length == pytest.approx(1.99, abs=0.05)
    assert all(b <= a for a, b in zip(result.rates, result.rates[1:], strict=False))
    assert result.drafted_at_pos[0] == result.num_steps


def test_recorded_rates_of_a_weak_layer_are_low() -> None:
    result = per_position_rates_from_recording(load_replay_recording(layer=8), k_max=2)
    assert result.rates[0] < 0.12


def test_recorded_rates_count_hand_made_sequences() -> None:
    # Steps from position 1 of [x,1,1,0,1]: K=2 drafts [1,1] -> a=2, next at 4: drafts [1] -> a=1.
    result = per_position_rates_from_recording(
        ReplayRecording.from_sequences([[0, 1, 1, 0, 1]]), k_max=2
    )
    assert result.drafted_at_pos == (2, 1)
    assert result.accepted_at_pos == (2, 1)
    assert result.num_steps == 2


def test_load_replay_recording_errors_name_the_file(tmp_path: Path) -> None:
    bad_json = tmp_path / "broken.json"
    bad_json.write_text("{\n  nope")
    with pytest.raises(InputError, match=r"broken\.json: line 2"):
        load_replay_recording(bad_json)
    with pytest.raises(InputError, match=r"layer 5 not recorded"):
        load_replay_recording(DEFAULT_RECORDING_PATH, layer=5)
    bad_values = tmp_path / "values.json"
    bad_values.write_text(json.dumps({"layers": [27], "prompts": [{"match": {"27": [0, 2]}}]}))
    with pytest.raises(InputError, match=r"values\.json: prompts\[0\]: match\['27'\]"):
        load_replay_recording(bad_values)
    with pytest.raises(InputError, match=f"^{tmp_path}/missing.json: no such file"):  # as given
        load_replay_recording(tmp_path / "missing.json")


# ----------------------------------------------------------------------------- per category


def test_category_acceptance_routes_by_tag() -> None:
    always = PerPositionAcceptance([1.0] * 4, seed(1))
    never = PerPositionAcceptance([0.0] * 4, seed(2))
    model = CategoryAcceptance({"coding": always}, default=never)
    tags = ["coding", "writing", None, "coding"]
    for req_id, tag in enumerate(tags):
        model.add_request(req_id, RequestSpec(prompt_len=4, output_len=4, tag=tag))
    accepted = model.sample_outcomes(ids(4), full(4, 1), np.array([3, 3, 3, 2]))[1]
    assert accepted.tolist() == [3, 0, 0, 2]
    model.remove_request(0)
    with pytest.raises(KeyError):
        model.sample_outcomes(np.array([0]), full(1, 1), full(1, 1))[1]


def test_category_acceptance_forwards_requests_to_stateful_models() -> None:
    coding = ReplayAcceptance(ReplayRecording.from_sequences([[1, 1, 1, 1]]), seed(0))
    default = ReplayAcceptance(ReplayRecording.from_sequences([[0, 0, 0, 0]]), seed(0))
    model = CategoryAcceptance({"coding": coding}, default=default)
    model.add_request(5, RequestSpec(prompt_len=4, output_len=4, tag="coding"))
    model.add_request(9, RequestSpec(prompt_len=4, output_len=4))
    accepted = model.sample_outcomes(np.array([9, 5]), full(2, 1), full(2, 3))[1]
    assert accepted.tolist() == [0, 3]


@pytest.mark.parametrize(
    "rates",
    [
        [1.0, 1.0, 1.0],  # a draft identical to the target: no spread possible
        [0.0, 0.0],  # a draft that never agrees
        [1.0, 0.5, 0.2],  # degenerate first position, varying later ones
        [0.004, 0.001],  # a default spread larger than sqrt(m(1-m)) allows
    ],
)
def test_heterogeneous_accepts_degenerate_and_extreme_rates(rates: list[float]) -> None:
    model = HeterogeneousAcceptance(rates, np.random.SeedSequence(0))
    population = model.draw_rates(ids(20_000))  # [n, k]
    np.testing.assert_allclose(population.mean(axis=0), rates, atol=0.01)
    assert np.all(population[:, 1:] <= population[:, :-1] + 1e-12)


def test_empirical_gives_a_profiled_prompt_its_own_outcomes() -> None:
    # Three recorded requests: never drafts, always drafts 2 and accepts 2, drafts 2 accepts 0.
    joints = np.zeros((3, 3, 3))
    joints[0, 0, 0] = joints[1, 2, 2] = joints[2, 2, 0] = 1.0
    keys = ("", prompt_key("copy me"), prompt_key("reject me"))
    model = EmpiricalAcceptance(joints, np.random.SeedSequence(0), keys)
    model.add_request(0, RequestSpec(prompt_len=3, output_len=4, prompt="copy me"))
    model.add_request(1, RequestSpec(prompt_len=3, output_len=4, prompt="reject me"))
    model.add_request(2, RequestSpec(prompt_len=3, output_len=4, prompt="unseen"))
    assert (model.recorded_of(0), model.recorded_of(1)) == (1, 2)
    # an unseen prompt gets the seeded pick its req_id gets without keys
    unkeyed = EmpiricalAcceptance(joints, np.random.SeedSequence(0))
    unkeyed.add_request(2, RequestSpec(prompt_len=3, output_len=4, prompt="unseen"))
    assert model.recorded_of(2) == unkeyed.recorded_of(2)
    drafted, accepted = model.sample_outcomes(np.array([0, 1]), np.array([1, 1]), np.array([2, 2]))
    assert drafted.tolist() == [2, 2] and accepted.tolist() == [2, 0]
    with pytest.raises(ValueError, match="2 prompt keys for 3 recorded"):
        EmpiricalAcceptance(joints, np.random.SeedSequence(0), keys[:2])


def test_empirical_replays_a_profiled_prompts_draft_sequence_at_any_k() -> None:
    # Recorded request 1 drafts 2 and accepts 2 every step by its histogram, but its sequence
    # says: position 0 offers 3 drafts of which 1 matches, position 1 offers 0, position 2
    # offers 3 and all match; past position 2 the histogram is drawn again.
    joints = np.zeros((2, 4, 4))
    joints[0, 0, 0] = joints[1, 2, 2] = 1.0
    keys = ("", prompt_key("copy me"))
    sequences = [
        (np.array([1, 1, 1]), np.array([0, 0, 0])),
        (np.array([3, 0, 3]), np.array([1, 0, 3])),
    ]
    model = EmpiricalAcceptance(joints, np.random.SeedSequence(0), keys, sequences)
    model.add_request(0, RequestSpec(prompt_len=3, output_len=9, prompt="copy me"))
    model.add_request(1, RequestSpec(prompt_len=3, output_len=9, prompt="unseen"))
    replayed = [
        model.sample_outcomes(np.array([0]), np.array([p]), np.array([k]))
        for p, k in ((0, 3), (0, 1), (1, 2), (2, 2), (2, 3), (3, 3))
    ]
    assert [(int(d[0]), int(a[0])) for d, a in replayed] == [
        (3, 1), (1, 1), (0, 0), (2, 2), (3, 3), (2, 2)  # the last: past the sequence
    ]  # fmt: skip
    # an unseen prompt replays its drawn recorded request's sequence the same way, then samples
    # that request's histogram; several rows at once agree with one by one
    drawn = model.recorded_of(1)
    available, matched = sequences[drawn]
    for position in range(3):
        d, a = model.sample_outcomes(np.array([1]), np.array([position]), np.array([3]))
        assert (int(d[0]), int(a[0])) == (min(3, available[position]), matched[position])
    drafted, accepted = model.sample_outcomes(np.array([0, 1]), np.array([0, 5]), np.array([3, 3]))
    unseen = model.sample_outcomes(np.array([1]), np.array([5]), np.array([3]))
    assert (drafted[0], accepted[0]) == (3, 1)
    assert (drafted[1], accepted[1]) == (unseen[0][0], unseen[1][0])
    # every pick of the unseen prompt is one of the recorded requests, whole
    model.add_request(2, RequestSpec(prompt_len=3, output_len=9, prompt="also unseen"))
    other = model.recorded_of(2)
    d, a = model.sample_outcomes(np.array([2]), np.array([0]), np.array([3]))
    assert (int(d[0]), int(a[0])) == (min(3, sequences[other][0][0]), sequences[other][1][0])
    with pytest.raises(ValueError, match="1 draft sequences for 2 recorded"):
        EmpiricalAcceptance(joints, np.random.SeedSequence(0), keys, sequences[:1])


def test_heterogeneous_rates_drawn_when_first_needed_equal_a_block_drawn_at_once() -> None:
    """Rates are drawn when a request first drafts (in any order, across blocks of ids); they
    are each id's own draw, and a step that drafts nothing draws none."""
    from dsd.sim.models.acceptance import conditional_rates

    model = HeterogeneousAcceptance(H100_RATES, seed(9))
    ids = [3, 1500, 4, 2100, 1501]  # three blocks of 1,024 ids, visited out of order
    for req_id in ids:
        model.add_request(req_id, RequestSpec(prompt_len=8, output_len=8))
    none_drafted = np.zeros(len(ids), dtype=np.int64)
    model.sample_outcomes(np.array(ids), none_drafted, none_drafted)
    assert model._block_first == -1  # nothing drawn yet
    for req_id in (2100, 3, 1501, 4, 1500):
        model.sample_outcomes(np.array([req_id]), np.array([0]), np.array([2]))
    expected = conditional_rates(model.draw_rates(np.array(ids, dtype=np.int64)))  # [5, k]
    for row, req_id in enumerate(ids):
        np.testing.assert_array_equal(model._cond.values[req_id], expected[row])
