"""A replay recording built from a real run's prompts and outputs predicts every step exactly.

The engine runs greedy SD with K drawn per row and step (0..4) and logs each decode row's
(request, output position p, K, drafted d, accepted a). Then `backend.replay.replay_recording`
sees only the prompts and the final outputs, and the replay must give min(K, available[p]) = d
and min(d, matched[p]) = a for every logged row, through `sim.models.replay.ReplayAcceptance` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from mock_models import make_engine, mock_pair, perturbed_copy, random_prompt, shallow_target

from dsd.backend.engine import AnyDraft, Draft, NgramDraft, SpecDecodeEngine
from dsd.backend.ngram import NgramConfig
from dsd.backend.replay import draft_matches, pair_replay_recording, replay_recording
from dsd.sim.models.replay import ReplayAcceptance, load_replay_recording, save_replay_recording
from dsd.traces.workload import RequestSpec


@dataclass(frozen=True)
class LoggedStep:
    req: int  # request index
    position: int  # output tokens the request had when the step ran
    k: int  # K asked
    drafted: int  # d the engine verified
    accepted: int  # a


def run_logged(
    engine: SpecDecodeEngine, prompts: list[np.ndarray], num_new_tokens: int, seed: int
) -> tuple[list[np.ndarray], list[LoggedStep]]:
    """Continuous batching over the engine's slots, K per row drawn from 0..k_max each step.

    Returns every request's generated tokens (all of them, past num_new_tokens too: the engine
    may accept drafts beyond) and the log of every decode row of every step.
    """
    k_rng = np.random.default_rng(seed)
    slot_of: dict[int, int] = {}
    waiting = list(range(len(prompts)))
    outputs: dict[int, np.ndarray] = {}
    log: list[LoggedStep] = []
    while len(outputs) < len(prompts):
        while waiting and engine.num_free_slots:
            req = waiting.pop(0)
            slot_of[req] = engine.alloc_slot(prompts[req])
        prefilling = [r for r, s in slot_of.items() if not engine.is_decoding(s)]
        decoding = [r for r, s in slot_of.items() if engine.is_decoding(s)]
        if decoding:
            slots = np.array([slot_of[r] for r in decoding], dtype=np.int64)
            positions = engine.num_tokens[slots] - np.array([len(prompts[r]) for r in decoding])
            ks = k_rng.integers(0, engine.config.k_max + 1, size=len(decoding))
            result = engine.step(slots, ks)
            for row, req in enumerate(decoding):
                log.append(
                    LoggedStep(
                        req,
                        int(positions[row]),
                        int(ks[row]),
                        int(result.num_drafted[row]),
                        int(result.num_accepted[row]),
                    )
                )
        if prefilling:
            engine.prefill(np.array([slot_of[r] for r in prefilling]), np.full(len(prefilling), 4))
        for req in list(slot_of):
            slot = slot_of[req]
            if engine.num_tokens[slot] - len(prompts[req]) >= num_new_tokens:
                outputs[req] = engine.free_slot(slot)[len(prompts[req]) :]
                del slot_of[req]
    return [outputs[r] for r in range(len(prompts))], log


def repeating_prompts(seed: int) -> list[np.ndarray]:
    """Prompts that repeat a block, so a lookup finds n-grams (and sometimes only short ones)."""
    rng = np.random.default_rng(seed)
    block = random_prompt(rng, 6)
    return [
        np.concatenate([block, block, block[:3]]),
        np.concatenate([random_prompt(rng, 5), block, block[:2]]),
        random_prompt(rng, 9),  # no repeat: the lookup mostly finds nothing
        np.concatenate([block[:4], random_prompt(rng, 3), block[:4], block[:1]]),
        np.concatenate([block, block]),
    ]


def assert_replay_is_exact(
    engine: SpecDecodeEngine, draft: AnyDraft, prompts: list[np.ndarray], seed: int
) -> list[LoggedStep]:
    outputs, log = run_logged(engine, prompts, num_new_tokens=28, seed=seed)
    recording = replay_recording(draft, prompts, outputs, max_model_len=engine.config.max_model_len)
    assert recording.in_request_order and recording.num_requests == len(prompts)
    for step in log:
        available = int(recording.available[step.req][step.position])
        matched = int(recording.matched[step.req][step.position])
        predicted_drafted = min(step.k, available)
        assert (predicted_drafted, min(predicted_drafted, matched)) == (
            step.drafted,
            step.accepted,
        ), step
    # The simulator's model gives the same, vectorised over all logged rows at once.
    model = ReplayAcceptance(recording, np.random.SeedSequence(0))
    assert model.assignment == "by-id"
    for req in range(len(prompts)):
        model.add_request(req, RequestSpec(prompt_len=len(prompts[req]), output_len=28))
    drafted, accepted = model.sample_outcomes(
        np.array([s.req for s in log], dtype=np.int64),
        np.array([s.position for s in log], dtype=np.int64),
        np.array([s.k for s in log], dtype=np.int64),
    )
    assert drafted.tolist() == [s.drafted for s in log]
    assert accepted.tolist() == [s.accepted for s in log]
    return log


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return shallow_target(seed=0)


@pytest.mark.parametrize("bounds", [(1, 2), (2, 4)])
def test_ngram_replay_predicts_every_step(target, bounds: tuple[int, int]) -> None:
    draft = NgramDraft(NgramConfig(*bounds))
    engine = make_engine(target, draft, num_slots=3, k_max=4)
    log = assert_replay_is_exact(engine, draft, repeating_prompts(3), seed=4)
    # The run exercised what the replay must get right: fewer drafts than asked, accepts and
    # rejects.
    assert any(s.drafted < s.k for s in log)
    assert any(0 < s.drafted == s.k for s in log)
    assert any(s.accepted > 0 for s in log)
    assert any(s.accepted < s.drafted for s in log)


@pytest.mark.parametrize("kind", ["early-exit", "separate"])
def test_model_draft_replay_predicts_every_step(target, kind: str) -> None:
    if kind == "early-exit":
        draft = Draft.early_exit(target, 1)
    else:
        draft = Draft(perturbed_copy(target, noise_std=0.01, seed=5))
    engine = make_engine(target, draft, num_slots=3, k_max=4)
    rng = np.random.default_rng(6)
    prompts = [random_prompt(rng, n) for n in (4, 11, 7, 2, 9)]
    log = assert_replay_is_exact(engine, draft, prompts, seed=7)
    assert all(s.drafted == s.k for s in log)  # a model draft drafts what it is asked
    assert any(s.accepted > 0 for s in log)
    assert any(s.accepted < s.drafted for s in log)


def test_draft_matches_of_the_target_itself_are_all_true(target) -> None:
    # The full target as its own draft proposes exactly its greedy outputs.
    rng = np.random.default_rng(1)
    prompt = random_prompt(rng, 5)
    engine = make_engine(target, None, num_slots=1, k_max=0)
    slot = engine.alloc_slot(prompt)
    while engine.num_tokens[slot] - len(prompt) < 12:
        if engine.is_decoding(slot):
            engine.step(np.array([slot]), np.array([0]))
        else:
            engine.prefill(np.array([slot]), np.array([16]))
    output = engine.sequence(slot)[len(prompt) :].copy()
    assert draft_matches(Draft(target), prompt, output).all()


def test_recording_file_round_trip(target, tmp_path: Path) -> None:
    draft = NgramDraft(NgramConfig(1, 3))
    engine = make_engine(target, draft, num_slots=2, k_max=3)
    prompts = repeating_prompts(8)[:3]
    outputs, _ = run_logged(engine, prompts, num_new_tokens=10, seed=9)
    recording = pair_replay_recording(
        mock_pair(target, draft), prompts, outputs, engine.config.max_model_len
    )
    path = tmp_path / "replay.json"
    save_replay_recording(recording, path)
    loaded = load_replay_recording(path)
    assert loaded.in_request_order and loaded.cap == recording.cap
    for ours, theirs in zip(recording.available, loaded.available, strict=True):
        assert ours.tolist() == theirs.tolist()
    for ours, theirs in zip(recording.matched, loaded.matched, strict=True):
        assert ours.tolist() == theirs.tolist()
    assert loaded.metadata["draft_spec"] == "mock-draft"
