"""The batched SD engine: greedy SD == target greedy, per-row K, rollback, draft catch-up.

(Named test_sd_engine.py, not test_engine.py: tests/sim/test_engine.py exists and pytest's
default import mode needs unique test-module basenames.)
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from mock_models import (
    MockModel,
    draft_rule_wrong_at,
    make_engine,
    perturbed_copy,
    random_prompt,
    shallow_target,
    target_rule,
    tiny_target,
)

from dsd.backend.engine import Draft, NgramDraft, SpecDecodeEngine, target_greedy_decode
from dsd.backend.environment import forward_tokens
from dsd.backend.model import new_kv_cache
from dsd.backend.native import rows_matmul
from dsd.backend.native import status as native_status
from dsd.backend.ngram import NgramConfig
from dsd.sim.models.latency import padding_tokens


def run_to_completion(
    engine: SpecDecodeEngine,
    prompts: list[np.ndarray],
    num_new_tokens: int,
    k_for_step,
    arrival_steps: list[int] | None = None,
    chunk: int = 5,
    fused: bool = False,
) -> tuple[list[list[int]], list[int]]:
    """A small continuous-batching loop: arrivals, chunked prefill, SD steps, frees.

    k_for_step(step_index, num_rows) -> K per decode row. Returns each request's output tokens
    (first num_new_tokens) and every step's accepted counts. `fused`: a step with decode and
    prefill rows runs `step_with_prefill` (one target forward) instead of `step`, `prefill`.
    """
    arrivals = arrival_steps or [0] * len(prompts)
    slot_of: dict[int, int] = {}
    outputs: dict[int, list[int]] = {}
    accepted_log: list[int] = []
    step_index = 0
    while len(outputs) < len(prompts):
        for req, prompt in enumerate(prompts):
            if arrivals[req] == step_index:
                slot_of[req] = engine.alloc_slot(prompt)
        prefilling = [r for r, s in slot_of.items() if not engine.is_decoding(s)]
        decoding = [r for r, s in slot_of.items() if engine.is_decoding(s)]
        prefill_slots = np.array([slot_of[r] for r in prefilling], dtype=np.int64)
        chunks = np.full(len(prefilling), chunk)
        if decoding:
            ks = np.asarray(k_for_step(step_index, len(decoding)), dtype=np.int64)
            decode_slots = np.array([slot_of[r] for r in decoding])
            if fused and prefilling:
                result, _ = engine.step_with_prefill(decode_slots, ks, prefill_slots, chunks)
                prefilling = []  # done in the same forward
            else:
                result = engine.step(decode_slots, ks)
            accepted_log.extend(result.num_accepted.tolist())
            assert ((result.num_accepted >= 0) & (result.num_accepted <= ks)).all()
        if prefilling:
            engine.prefill(prefill_slots, chunks)
        for req in list(slot_of):
            slot = slot_of[req]
            generated = engine.sequence(slot)[len(prompts[req]) :]
            if generated.size >= num_new_tokens:
                outputs[req] = generated[:num_new_tokens].tolist()
                engine.free_slot(slot)
                del slot_of[req]
        step_index += 1
    return [outputs[r] for r in range(len(prompts))], accepted_log


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def close_draft(target) -> torch.nn.Module:
    # Small noise: agrees with the target about half the time on these shapes.
    return perturbed_copy(target, noise_std=0.006, seed=1)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5])
def test_greedy_output_equals_target_greedy(target, close_draft, k: int) -> None:
    rng = np.random.default_rng(k)
    prompts = [random_prompt(rng, n) for n in (7, 12, 3)]
    engine = make_engine(target, Draft(close_draft), k_max=5)
    outputs, accepted = run_to_completion(engine, prompts, 24, lambda step, rows: [k] * rows)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, 24)
    if k > 0:  # both accept and reject paths were exercised
        assert 0 < sum(accepted) < k * len(accepted)


def test_greedy_output_equals_target_greedy_with_k_changing_per_step_and_row(
    target, close_draft
) -> None:
    rng = np.random.default_rng(7)
    prompts = [random_prompt(rng, n) for n in (2, 15, 9, 21, 5)]
    k_rng = np.random.default_rng(8)
    engine = make_engine(target, Draft(close_draft), k_max=5, num_slots=4)
    outputs, _ = run_to_completion(
        engine,
        prompts,
        20,
        lambda step, rows: k_rng.integers(0, 6, size=rows),  # K per row, new every step
        arrival_steps=[0, 0, 2, 12, 40],  # continuous arrivals; slots are reused after frees
        chunk=4,
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, 20)


@pytest.mark.parametrize("exit_layer", [1, 2])
def test_greedy_output_equals_target_greedy_with_early_exit_draft(exit_layer: int) -> None:
    target = shallow_target(seed=2, num_layers=3)
    rng = np.random.default_rng(3)
    prompts = [random_prompt(rng, n) for n in (6, 11)]
    k_rng = np.random.default_rng(4)
    engine = make_engine(target, Draft.early_exit(target, exit_layer), k_max=4)
    outputs, accepted = run_to_completion(
        engine, prompts, 30, lambda step, rows: k_rng.integers(0, 5, size=rows)
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, 30)
    assert sum(accepted) > 0


def test_target_greedy_decode_matches_full_recompute(target) -> None:
    prompt = random_prompt(np.random.default_rng(0), 5)
    output = target_greedy_decode(target, prompt, 8)
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(8):
            ids = torch.tensor([sequence])
            logits = target(ids, torch.arange(len(sequence))[None])
            sequence.append(int(logits[0, -1].argmax()))
    assert output == sequence[5:]


def test_kv_rollback_equals_fresh_recompute(target) -> None:
    draft = perturbed_copy(target, noise_std=0.01, seed=5)
    engine = make_engine(target, Draft(draft), k_max=5)
    rng = np.random.default_rng(11)
    slots = [engine.alloc_slot(random_prompt(rng, n)) for n in (8, 4)]
    engine.prefill(np.array(slots), np.array([8, 4]))
    rejected_any = False
    for _ in range(6):
        result = engine.step(np.array(slots), np.array([5, 3]))
        rejected_any |= bool((result.num_accepted < np.array([5, 3])).any())
    assert rejected_any
    for slot in slots:
        sequence = engine.sequence(slot)
        num_cached = int(engine.target_cache.lengths[slot])
        assert num_cached == sequence.size - 1
        for model, cache in ((target, engine.target_cache), (draft, engine.draft_cache)):
            valid = int(cache.lengths[slot])
            fresh = new_kv_cache(model.config, 1, valid + 1)
            with torch.no_grad():
                model(
                    torch.from_numpy(sequence[:valid])[None],
                    torch.arange(valid)[None],
                    fresh,
                    torch.tensor([0]),
                )
            torch.testing.assert_close(
                cache.k[:, slot, :valid], fresh.k[:, 0, :valid], atol=1e-5, rtol=1e-5
            )
            torch.testing.assert_close(
                cache.v[:, slot, :valid], fresh.v[:, 0, :valid], atol=1e-5, rtol=1e-5
            )


# (positions where the draft is wrong, K, expected accepted counts of consecutive steps)
MOCK_CASES = [
    # draft always right: every step accepts all K and emits K + 1 tokens
    (set(), 3, [3, 3, 3]),
    # prompt of 4 tokens + first token at position 4; step 1 drafts positions 5, 6, 7:
    # wrong at 6 -> accepts 1; step 2 starts at position 7 (5 + 1 accepted + recovered)
    ({6}, 3, [1, 3, 3]),
    # wrong at the first drafted position of every step's first draft
    ({5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 2, [0, 0, 0]),
]


@pytest.mark.parametrize(("wrong", "k", "expected"), MOCK_CASES)
def test_accepted_counts_follow_draft_agreement(
    wrong: set[int], k: int, expected: list[int]
) -> None:
    target = MockModel(target_rule)
    draft = MockModel(draft_rule_wrong_at(wrong))
    engine = make_engine(target, Draft(draft), k_max=5)
    prompt = np.array([10, 11, 12, 13])
    slot = engine.alloc_slot(prompt)
    engine.prefill(np.array([slot]), np.array([4]))
    got = [int(engine.step(np.array([slot]), np.array([k])).num_accepted[0]) for _ in expected]
    assert got == expected
    # Whatever was accepted, the emitted sequence follows the target's rule token by token.
    sequence = engine.sequence(slot)
    for position in range(3, sequence.size - 1):
        assert sequence[position + 1] == target_rule(int(sequence[position]), position)


def test_draft_does_no_work_at_k0_and_catches_up_later() -> None:
    target = MockModel(target_rule)
    draft = MockModel(target_rule)
    engine = make_engine(target, Draft(draft), k_max=3)
    slot = engine.alloc_slot(np.array([5, 6, 7]))
    engine.prefill(np.array([slot]), np.array([3]))
    draft.calls.clear()
    for _ in range(4):
        engine.step(np.array([slot]), np.array([0]))
    assert draft.calls == []  # K = 0: the draft ran no forward
    assert engine.draft_cache.lengths[slot] == 3  # and lags 4 tokens behind
    result = engine.step(np.array([slot]), np.array([2]))
    # First draft forward: 4 catch-up tokens + the last token; then one more for draft 2.
    assert draft.calls == [(1, 5), (1, 1)]
    assert int(result.num_accepted[0]) == 2


@pytest.mark.parametrize(
    ("ks", "width"),
    [([0], 1), ([1], 4), ([2], 4), ([3], 4), ([0, 0], 2), ([1, 0], 2), ([0] * 3, 2), ([1] * 3, 2)],
)
def test_verify_forward_is_widened_with_trash_to_what_the_kernels_pad_to(
    ks: list[int], width: int
) -> None:
    """A target whose kernels pad 2 or 3 tokens to 4 gets the verify block padded once instead
    (trash tokens): same accepted tokens, the same real (token, position) pairs fed."""
    wrong = {9, 14}
    results = []
    for pads_to in (1, 4):
        model_target = MockModel(target_rule, pads_to=pads_to)
        engine = make_engine(model_target, Draft(MockModel(draft_rule_wrong_at(wrong))), k_max=3)
        rng = np.random.default_rng(5)
        slots = np.array([engine.alloc_slot(random_prompt(rng, 6)) for _ in ks])
        engine.prefill(slots, np.full(len(ks), 6))
        model_target.calls.clear()
        step = engine.step(slots, np.array(ks))
        results.append((step.num_accepted.tolist(), [engine.sequence(s).tolist() for s in slots]))
        expected_width = width if pads_to == 4 else max(ks) + 1
        assert model_target.calls == [(len(ks), expected_width)]
        # what the profile records and the simulator prices (sim.models.latency.padding_tokens)
        padding = padding_tokens(forward_tokens(model_target), len(ks), max(ks))
        assert padding == len(ks) * (expected_width - max(ks) - 1)
    assert results[0] == results[1]


@pytest.mark.parametrize(("native", "width_of_two"), [(False, 4), (True, 2)])
def test_prepared_target_steps_equal_target_greedy_at_every_small_width(  # type: ignore[no-untyped-def]
    target, close_draft, native: bool, width_of_two: int, torch_threads
) -> None:
    """A real target on `CpuKernels`, output token for token the plain target's greedy decode
    at B = 1, 2, 3 and K = 0..3: on oneDNN (verify blocks of 2 and 3 tokens widened to 4 with
    trash), and on the native product where it runs here (nothing widened)."""
    if native and rows_matmul() is None:
        pytest.skip(f"native product: {native_status()}")
    torch_threads(1)
    prepared = tiny_target(seed=0)
    assert prepared.prepare_cpu_kernels(native=native)
    assert prepared.native_kernels is native
    assert prepared.tokens_worth_computing(2) == width_of_two
    rng = np.random.default_rng(11)
    prompts = [random_prompt(rng, n) for n in (5, 9, 4)]
    for rows in (1, 2, 3):
        engine = make_engine(prepared, Draft(close_draft), k_max=3, num_slots=rows)
        outputs, _ = run_to_completion(engine, prompts[:rows], 16, lambda step, n: [step % 4] * n)
        for prompt, output in zip(prompts, outputs, strict=False):
            assert output == target_greedy_decode(target, prompt, 16)


def test_step_rejects_bad_input(target, close_draft) -> None:
    engine = make_engine(target, Draft(close_draft), k_max=2)
    slot = engine.alloc_slot(np.array([3, 4, 5]))
    with pytest.raises(ValueError, match="prefill"):
        engine.step(np.array([slot]), np.array([1]))  # prompt not in the cache yet
    engine.prefill(np.array([slot]), np.array([3]))
    with pytest.raises(ValueError, match="K must be"):
        engine.step(np.array([slot]), np.array([3]))  # K above k_max
    with pytest.raises(ValueError, match="not allocated"):
        engine.step(np.array([slot + 1]), np.array([1]))


def test_sampling_engine_is_seed_reproducible(target, close_draft) -> None:
    def run(seed: int) -> list[list[int]]:
        engine = make_engine(target, Draft(close_draft), k_max=3, temperature=0.8, seed=seed)
        prompts = [random_prompt(np.random.default_rng(1), n) for n in (4, 9)]
        outputs, _ = run_to_completion(engine, prompts, 16, lambda step, rows: [3] * rows)
        return outputs

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_sampling_with_identical_draft_accepts_every_draft(target) -> None:
    twin = perturbed_copy(target, noise_std=0.0, seed=0)
    engine = make_engine(target, Draft(twin), k_max=4, temperature=1.0, seed=3)
    prompts = [random_prompt(np.random.default_rng(2), n) for n in (5, 8)]
    _, accepted = run_to_completion(engine, prompts, 20, lambda step, rows: [4] * rows)
    # p == q: min(1, p/q) = 1 up to float rounding, so every draft is accepted
    assert np.mean(np.array(accepted) == 4) > 0.95


@pytest.mark.parametrize("bounds", [(1, 2), (2, 4)])
def test_greedy_output_equals_target_greedy_with_ngram_drafts(target, bounds) -> None:  # type: ignore[no-untyped-def]
    # Prompts that repeat a block, so the lookup finds n-grams; K per row changes every step.
    rng = np.random.default_rng(11)
    block = random_prompt(rng, 6)
    prompts = [np.concatenate([block, block, block[:n]]) for n in (1, 3, 5)]
    k_rng = np.random.default_rng(12)
    engine = make_engine(target, NgramDraft(NgramConfig(*bounds)), k_max=4)
    drafted: list[int] = []
    requested: list[int] = []
    real_step = engine.step

    def recording_step(slots, ks):  # type: ignore[no-untyped-def]
        result = real_step(slots, ks)
        assert ((result.num_drafted <= ks) & (result.num_accepted <= result.num_drafted)).all()
        drafted.extend(result.num_drafted.tolist())
        requested.extend(np.asarray(ks).tolist())
        return result

    engine.step = recording_step  # type: ignore[method-assign]
    outputs, accepted = run_to_completion(
        engine, prompts, 24, lambda step, rows: k_rng.integers(0, 5, size=rows)
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == target_greedy_decode(target, prompt, 24)
    assert sum(accepted) > 0  # the lookup's drafts were accepted somewhere
    assert sum(drafted) < sum(requested)  # and it drafted fewer than asked somewhere


@pytest.mark.parametrize("draft_kind", ["none", "model", "early-exit", "ngram"])
def test_fused_prefill_steps_equal_separate_ones_and_target_greedy(target, draft_kind) -> None:  # type: ignore[no-untyped-def]
    """Arrivals while others decode, so many steps mix decode rows and prefill chunks: running
    those in one forward (`step_with_prefill`) changes no accepted count and no token."""
    rng = np.random.default_rng(21)
    block = random_prompt(rng, 5)
    prompts = [np.concatenate([block, random_prompt(rng, n), block]) for n in (3, 9, 1, 14, 6)]
    drafts = {
        "none": None,
        "model": Draft(perturbed_copy(target, noise_std=0.006, seed=1)),
        "early-exit": Draft.early_exit(target, 1),
        "ngram": NgramDraft(NgramConfig(1, 3)),
    }
    runs = []
    for fused in (False, True):
        k_rng = np.random.default_rng(22)
        engine = make_engine(
            target, drafts[draft_kind], k_max=0 if draft_kind == "none" else 4, num_slots=5
        )
        mixed_steps: list[int] = []

        def counting(*args, real=engine.step_with_prefill, log=mixed_steps):  # type: ignore[no-untyped-def]
            log.append(1)
            return real(*args)

        engine.step_with_prefill = counting  # type: ignore[method-assign]
        k_hi = 1 if draft_kind == "none" else 5
        runs.append(
            run_to_completion(
                engine,
                prompts,
                16,
                lambda step, rows: k_rng.integers(0, k_hi, size=rows),  # noqa: B023
                arrival_steps=[0, 1, 3, 6, 10],
                chunk=4,
                fused=fused,
            )
        )
        assert (len(mixed_steps) > 3) == fused
    assert runs[0] == runs[1]
    for prompt, output in zip(prompts, runs[1][0], strict=True):
        assert output == target_greedy_decode(target, prompt, 16)


def test_fused_step_checks_its_rows(target) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(target, NgramDraft(NgramConfig(1, 3)), k_max=3)
    rng = np.random.default_rng(0)
    decoding = engine.alloc_slot(random_prompt(rng, 4))
    engine.prefill(np.array([decoding]), np.array([4]))
    fresh = engine.alloc_slot(random_prompt(rng, 6))
    with pytest.raises(ValueError, match="both decodes and prefills"):
        engine.step_with_prefill(np.array([decoding]), np.array([1]), np.array([decoding]), [1])
    with pytest.raises(ValueError, match="prefill chunks must be >= 1"):
        engine.step_with_prefill(np.array([decoding]), np.array([1]), np.array([fresh]), [0])
    assert engine.sequence(decoding).size == 5  # nothing ran
    # No decode rows: a plain prefill; no prefill rows: a plain step.
    result, first = engine.step_with_prefill(np.zeros(0, np.int64), [], np.array([fresh]), [6])
    assert result.num_accepted.size == 0 and first.size == 1 and first[0] >= 0
    result, first = engine.step_with_prefill(np.array([decoding]), [0], np.zeros(0, np.int64), [])
    assert result.num_accepted.tolist() == [0] and first.size == 0


def test_ngram_drafts_need_no_draft_model_or_cache(target) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(target, NgramDraft(NgramConfig(1, 3)), k_max=3)
    assert engine.model_draft is None and engine.draft_cache is None


def test_padded_prefill_benchmark_prices_p_rows_and_refuses_bad_input(
    load_benchmark, capsys
) -> None:
    """benchmarks/padded_prefill.py on the tiny model: one row per P, and one-line errors."""
    module = load_benchmark("padded_prefill")
    assert module.main(["--model", "tiny", "--width", "8", "--rows", "2,3", "--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["2", "3"]
    # measured forwards take time; the priced column is a difference of medians, so with one
    # repeat on a tiny model it may come out at or below 0 (it did once in CI)
    assert all(float(row[1]) > 0 and float(row[3]) > 0 for row in rows)
    assert all(math.isfinite(float(row[2])) for row in rows)
    assert module.main(["--rows", "0"]) == 2
    assert module.main(["--model", "no-such-model"]) == 2
    assert "error:" in capsys.readouterr().err


def test_fused_prefill_benchmark_times_every_cell_and_refuses_bad_input(
    load_benchmark, capsys, tmp_path
) -> None:
    """benchmarks/fused_prefill.py on the tiny model: a row per (D, K, N), its JSON, and
    one-line errors."""
    module = load_benchmark("fused_prefill")
    out = tmp_path / "fused.json"
    argv = ["--target", "tiny", "--draft", "ngram", "--rows", "1,2", "--k", "0,2"]
    argv += ["--tokens", "4,8", "--context", "16", "--repeats", "1", "--warmup", "0"]
    assert module.main([*argv, "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[3:]]
    assert [tuple(int(v) for v in row[:3]) for row in rows] == [
        (d, k, n) for d in (1, 2) for k in (0, 2) for n in (4, 8)
    ]
    table = json.loads(out.read_text())["rows"]
    assert len(table) == 8
    # Times are positive; the added costs are differences of two timings (one round here), so
    # noise may put them at or below 0: only finite.
    timed = ("decode_ms", "prefill_ms", "separate_ms", "fused_ms")
    assert all(row[key] > 0 for row in table for key in timed)
    added = ("added_fused_ms", "added_separate_ms", "priced_fused_ms", "priced_separate_ms")
    assert all(math.isfinite(row[key]) for row in table for key in added)
    assert module.main(["--rows", "0"]) == 2
    assert module.main(["--tokens", "x"]) == 2
    assert module.main(["--target", "tiny", "--draft", "none", "--k", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 3 and "Traceback" not in err
