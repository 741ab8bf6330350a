"""Replay of what a drafter proposed and the target accepted, output position by position.

A `ReplayRecording` holds per request and output position p `available[p]` (drafts proposed with
K unlimited) and `matched[p]` (how many of them, from the first, equal the target's outputs); at
temperature 0 a step at (p, K) then drafts d = min(K, available[p]) and accepts
a = min(d, matched[p]), exactly what the real engine did. `ReplayAcceptance` is that rule,
vectorised over rows. Why it is exact, the bundled early-exit recording and the other sources are
in docs/models.md §2.3; the JSON format ("dsd-replay") in docs/formats.md.

It does not run a model (no torch here) or replay temperature > 0 acceptance (the recording's
`alpha` is not read).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dsd.common import strict_json
from dsd.common.arrays import BoolArray, IntArray
from dsd.common.atomic import atomic_write_text
from dsd.common.errors import InputError
from dsd.common.streams import CounterStream
from dsd.common.user_files import parse_user_json, read_user_text
from dsd.sim.models.acceptance import DenseRows
from dsd.traces.workload import RequestSpec

DEFAULT_RECORDING_PATH = (
    Path(__file__).resolve().parent / "data" / "earlyexit_acceptance_mtbench.json"
)
DEFAULT_EXIT_LAYER = 27
# Drafts a replay knows per position: K above it drafts `cap` at most (no engine runs K = 64).
DEFAULT_REPLAY_CAP = 64
REPLAY_FORMAT = "dsd-replay"
REPLAY_VERSION = 1

Assignment = Literal["round-robin", "random", "by-id"]
# propose(context ids [n], k) -> draft ids [<= k]: what a drafter proposes after `context`.
Proposer = Callable[[IntArray, int], IntArray]


def leading_ones(bits: BoolArray, cap: int, cyclic: bool) -> IntArray:
    """[n] the number of leading True of bits[p:] for every p, capped at `cap`.

    `cyclic`: bits[p:] continues with bits[0:] (a replay that wraps around); a sequence of all
    True then reads `cap` everywhere.
    """
    length = bits.shape[0]
    if cyclic:
        if bool(bits.all()):
            return np.full(length, cap, dtype=np.int64)
        extended = np.concatenate((bits, bits))  # [2n]: every run ends within one lap
    else:
        extended = np.concatenate((bits, [False]))  # [n+1]: a run stops at the end
    zeros = np.flatnonzero(~extended)  # sorted positions of False
    next_zero = zeros[np.searchsorted(zeros, np.arange(length))]  # [n] first False at >= p
    counts: IntArray = np.minimum(next_zero - np.arange(length), cap).astype(np.int64)
    return counts


@dataclass(frozen=True)
class ReplayRecording:
    """Per recorded request, drafts available and matched at every output position."""

    available: tuple[IntArray, ...]  # per request [n]: drafts proposed at p, K unlimited; <= cap
    matched: tuple[IntArray, ...]  # per request [n]: leading drafts equal to outputs; <= available
    categories: tuple[str | None, ...]  # per request category (MT-Bench), or None
    source: str  # file name or "inline", for messages
    cap: int = DEFAULT_REPLAY_CAP  # most drafts known per position, >= 1
    layer: int | None = None  # exit layer of an early-exit match recording
    # True: recorded request i IS request i of the run it was recorded from (a real run's
    # recording), so a replay of that workload maps req_id i to it.
    in_request_order: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)  # drafter, models, command...

    def __post_init__(self) -> None:
        if not self.available:
            raise ValueError(f"{self.source}: no recorded requests")
        if len(self.matched) != len(self.available) or len(self.categories) != len(self.available):
            raise ValueError(f"{self.source}: one matched array and category per request")
        if self.cap < 1:
            raise ValueError(f"{self.source}: cap must be >= 1, got {self.cap}")
        for index, (available, matched) in enumerate(
            zip(self.available, self.matched, strict=True)
        ):
            if available.ndim != 1 or available.shape != matched.shape or available.size == 0:
                raise ValueError(f"{self.source}: request {index}: need equal non-empty 1-D arrays")
            if (matched < 0).any() or (matched > available).any() or (available > self.cap).any():
                raise ValueError(
                    f"{self.source}: request {index}: need 0 <= matched <= available <= cap"
                )

    @property
    def num_requests(self) -> int:
        return len(self.available)

    @property
    def lengths(self) -> IntArray:
        """[R] output positions recorded per request."""
        return np.array([a.shape[0] for a in self.available], dtype=np.int64)

    @property
    def always_available(self) -> bool:
        """Every position offers `cap` drafts (a model draft): d = K whenever K <= cap."""
        return all(bool((a == self.cap).all()) for a in self.available)

    def subset(self, indices: Sequence[int]) -> ReplayRecording:
        """The recording of the requests `indices` (in that order); no longer in request order."""
        if not indices:
            raise ValueError(f"{self.source}: an empty subset has nothing to replay")
        return ReplayRecording(
            available=tuple(self.available[i] for i in indices),
            matched=tuple(self.matched[i] for i in indices),
            categories=tuple(self.categories[i] for i in indices),
            source=self.source,
            cap=self.cap,
            layer=self.layer,
            in_request_order=False,
            metadata=dict(self.metadata),
        )

    @staticmethod
    def from_sequences(
        sequences: Sequence[Sequence[int] | Sequence[bool]],
        categories: Sequence[str | None] | None = None,
        layer: int = DEFAULT_EXIT_LAYER,
        cap: int = DEFAULT_REPLAY_CAP,
        source: str = "inline",
    ) -> ReplayRecording:
        """From match bits (match[t]: the draft's argmax equals target token t) of a chain draft:
        matched[p] = leading ones of match[p:], read cyclically; available = cap."""
        bits = [np.asarray(s, dtype=np.bool_) for s in sequences]
        if any(b.ndim != 1 or b.size == 0 for b in bits):
            raise ValueError(f"{source}: every match sequence must be a non-empty list")
        cats = tuple(categories) if categories is not None else (None,) * len(bits)
        return ReplayRecording(
            available=tuple(np.full(b.shape[0], cap, dtype=np.int64) for b in bits),
            matched=tuple(leading_ones(b, cap, cyclic=True) for b in bits),
            categories=cats,
            source=source,
            cap=cap,
            layer=layer,
        )


def recording_from_matches(
    matches: Sequence[BoolArray],
    cap: int = DEFAULT_REPLAY_CAP,
    categories: Sequence[str | None] | None = None,
    source: str = "inline",
    metadata: dict[str, Any] | None = None,
) -> ReplayRecording:
    """A real run's recording of a chain draft from its teacher-forced match bits.

    matches[j][t] = the draft's argmax after request j's prompt + outputs[:t] equals output t.
    matched[p] = leading ones of match[p:] (not cyclic: past the outputs nothing is known to
    match), available = cap. `backend.replay` computes the bits with one draft forward.
    """
    bits = [np.asarray(m, dtype=np.bool_) for m in matches]
    return ReplayRecording(
        available=tuple(np.full(b.shape[0], cap, dtype=np.int64) for b in bits),
        matched=tuple(leading_ones(b, cap, cyclic=False) for b in bits),
        categories=tuple(categories) if categories is not None else (None,) * len(bits),
        source=source,
        cap=cap,
        in_request_order=True,
        metadata=dict(metadata or {}),
    )


def recording_from_proposals(
    prompt_ids: Sequence[IntArray],
    output_ids: Sequence[IntArray],
    propose: Proposer,
    cap: int = DEFAULT_REPLAY_CAP,
    categories: Sequence[str | None] | None = None,
    source: str = "inline",
    metadata: dict[str, Any] | None = None,
) -> ReplayRecording:
    """A real run's recording of a drafter that only reads the context (n-gram lookup).

    For request j and output position p: the drafts `propose(prompt + outputs[:p], cap)`;
    available[p] = their number, matched[p] = how many from the first equal outputs p, p+1, ...
    (positions past the recorded outputs count as not matched). Exact for greedy decoding: the
    engine's drafts at (p, K) are the first K of these. One proposer call per output token.
    """
    if len(prompt_ids) != len(output_ids) or not prompt_ids:
        raise ValueError("need one output list per prompt and at least one prompt")
    available: list[IntArray] = []
    matched: list[IntArray] = []
    for prompt, output in zip(prompt_ids, output_ids, strict=True):
        prompt_arr = np.asarray(prompt, dtype=np.int64)  # [P]
        output_arr = np.asarray(output, dtype=np.int64)  # [n]
        tokens = np.concatenate((prompt_arr, output_arr))  # [P + n]
        num_outputs = output_arr.shape[0]
        request_available = np.zeros(num_outputs, dtype=np.int64)  # [n]
        request_matched = np.zeros(num_outputs, dtype=np.int64)  # [n]
        for position in range(num_outputs):
            drafts = np.asarray(
                propose(tokens[: prompt_arr.shape[0] + position], cap), dtype=np.int64
            )[:cap]  # [d]
            request_available[position] = drafts.shape[0]
            target = output_arr[position : position + drafts.shape[0]]  # [<= d]
            agree = drafts[: target.shape[0]] == target
            request_matched[position] = (
                int(np.argmin(agree)) if not agree.all() else int(agree.shape[0])
            )
        available.append(request_available)
        matched.append(request_matched)
    return ReplayRecording(
        available=tuple(available),
        matched=tuple(matched),
        categories=tuple(categories) if categories is not None else (None,) * len(available),
        source=source,
        cap=cap,
        in_request_order=True,
        metadata=dict(metadata or {}),
    )


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def replay_recording_to_json(recording: ReplayRecording) -> dict[str, Any]:
    """The "dsd-replay" JSON object of a recording (a constant `available` is one number)."""
    requests = []
    for available, matched, category in zip(
        recording.available, recording.matched, recording.categories, strict=True
    ):
        entry: dict[str, Any] = {
            "available": (
                int(available[0]) if bool((available == available[0]).all()) else available.tolist()
            ),
            "matched": matched.tolist(),
        }
        if category is not None:
            entry["category"] = category
        requests.append(entry)
    return {
        "format": REPLAY_FORMAT,
        "version": REPLAY_VERSION,
        "cap": recording.cap,
        "in_request_order": recording.in_request_order,
        "metadata": dict(recording.metadata),
        "requests": requests,
    }


def save_replay_recording(recording: ReplayRecording, path: str | os.PathLike[str]) -> None:
    """Write the recording as "dsd-replay" JSON, atomically."""
    atomic_write_text(path, strict_json.dumps(replay_recording_to_json(recording)) + "\n")


def load_replay_recording(
    path: str | os.PathLike[str] = DEFAULT_RECORDING_PATH, layer: int = DEFAULT_EXIT_LAYER
) -> ReplayRecording:
    """Read a "dsd-replay" file, or an early-exit match recording at exit `layer` (the bundled
    file's format); one-line InputError naming the file on any problem."""
    name = os.fspath(path)  # as given: errors name it so
    data = parse_user_json(read_user_text(path), name)
    if isinstance(data, dict) and data.get("format") == REPLAY_FORMAT:
        return _parse_native(data, name)
    if not isinstance(data, dict) or not isinstance(data.get("prompts"), list):
        raise InputError(
            f"{name}: expected a '{REPLAY_FORMAT}' recording or an object with a 'prompts' list"
        )
    return _parse_match_recording(data, name, layer)


def _parse_match_recording(data: dict[str, Any], name: str, layer: int) -> ReplayRecording:
    layers = data.get("layers")
    if isinstance(layers, list) and layer not in layers:
        raise InputError(f"{name}: exit layer {layer} not recorded (layers: {layers})")
    sequences: list[list[int]] = []
    categories: list[str | None] = []
    for index, prompt in enumerate(data["prompts"]):
        where = f"{name}: prompts[{index}]"
        match = prompt.get("match") if isinstance(prompt, dict) else None
        if not isinstance(match, dict) or str(layer) not in match:
            raise InputError(f"{where}: no match sequence for layer {layer}")
        seq = match[str(layer)]
        if not isinstance(seq, list) or any(v not in (0, 1) for v in seq):
            raise InputError(f"{where}: match['{layer}'] must be a list of 0/1")
        if not seq:
            continue  # a prompt that generated nothing has nothing to replay
        sequences.append(seq)
        category = prompt.get("category")
        categories.append(str(category) if category is not None else None)
    if not sequences:
        raise InputError(f"{name}: no non-empty match sequences at layer {layer}")
    return ReplayRecording.from_sequences(sequences, categories, layer=layer, source=name)


def _int_list(value: Any, where: str, length: int | None) -> IntArray:
    if isinstance(value, bool) or not isinstance(value, list) or not value:
        raise InputError(f"{where}: must be a non-empty list of integers")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise InputError(f"{where}: every entry must be an integer >= 0")
    if length is not None and len(value) != length:
        raise InputError(f"{where}: has {len(value)} positions, 'matched' has {length}")
    return np.asarray(value, dtype=np.int64)


def _parse_native(data: dict[str, Any], name: str) -> ReplayRecording:
    if data.get("version") != REPLAY_VERSION:
        raise InputError(
            f"{name}: version: unsupported {data.get('version')!r}, expected {REPLAY_VERSION}"
        )
    cap = data.get("cap", DEFAULT_REPLAY_CAP)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise InputError(f"{name}: cap: must be an integer >= 1, got {cap!r}")
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        raise InputError(f"{name}: requests: must be a non-empty list")
    in_order = data.get("in_request_order", True)
    if not isinstance(in_order, bool):
        raise InputError(f"{name}: in_request_order: must be true or false")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InputError(f"{name}: metadata: must be an object")
    available: list[IntArray] = []
    matched: list[IntArray] = []
    categories: list[str | None] = []
    for index, entry in enumerate(requests):
        where = f"{name}: requests[{index}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: must be an object")
        request_matched = _int_list(entry.get("matched"), f"{where}.matched", None)
        raw_available = entry.get("available")
        if isinstance(raw_available, int) and not isinstance(raw_available, bool):
            if not 0 <= raw_available <= cap:
                raise InputError(f"{where}.available: must be in [0, cap={cap}]")
            request_available = np.full(request_matched.shape[0], raw_available, dtype=np.int64)
        else:
            request_available = _int_list(
                raw_available, f"{where}.available", request_matched.shape[0]
            )
        if (request_available > cap).any():
            raise InputError(f"{where}.available: entries must be <= cap={cap}")
        bad = np.flatnonzero(request_matched > request_available)
        if bad.size:
            raise InputError(
                f"{where}.matched[{int(bad[0])}]: {int(request_matched[bad[0]])} matched of "
                f"{int(request_available[bad[0]])} drafts available"
            )
        category = entry.get("category")
        if category is not None and not isinstance(category, str):
            raise InputError(f"{where}.category: must be a string")
        available.append(request_available)
        matched.append(request_matched)
        categories.append(category)
    return ReplayRecording(
        available=tuple(available),
        matched=tuple(matched),
        categories=tuple(categories),
        source=name,
        cap=cap,
        in_request_order=in_order,
        metadata=dict(metadata),
    )


# --------------------------------------------------------------------------------------------
# Counting what a fixed-K replay would log
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRates:
    """Per-position acceptance counts of a chain-SD replay of a recording at fixed K."""

    rates: tuple[float, ...]  # r_i = accepted_at_pos[i] / drafted_at_pos[i], i = 1..k_max
    drafted_at_pos: tuple[int, ...]  # steps that drafted at least i tokens
    accepted_at_pos: tuple[int, ...]  # steps whose first i drafts were all accepted
    num_steps: int  # decode steps replayed
    acceptance_length: float  # output tokens per decode step, bonus included


def per_position_rates_from_recording(recording: ReplayRecording, k_max: int) -> RecordedRates:
    """Replay greedy chain SD with K = k_max along every request and count per position.

    Output position 0 comes from prefill, so decode steps start at position 1. A step at
    position p drafts min(k_max, available[p], len - p) tokens (nothing is drafted past the
    recorded end), accepts min(that, matched[p]) and emits accepted + 1 tokens. This is what a
    profiler would log with K fixed, so the rates can fill a Profile's `acceptance_rates`.
    """
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    drafted = np.zeros(k_max, dtype=np.int64)
    accepted = np.zeros(k_max, dtype=np.int64)
    num_steps = 0
    num_emitted = 0
    for available, matched in zip(recording.available, recording.matched, strict=True):
        length = available.shape[0]
        position = 1
        while position < length:
            num_drafts = min(k_max, int(available[position]), length - position)
            num_accepted = min(num_drafts, int(matched[position]))
            drafted[:num_drafts] += 1
            accepted[:num_accepted] += 1
            num_steps += 1
            num_emitted += min(num_accepted + 1, length - position)
            position += num_accepted + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = np.where(drafted > 0, accepted / np.maximum(drafted, 1), 0.0)
    return RecordedRates(
        rates=tuple(float(v) for v in rates),
        drafted_at_pos=tuple(int(v) for v in drafted),
        accepted_at_pos=tuple(int(v) for v in accepted),
        num_steps=num_steps,
        acceptance_length=num_emitted / max(num_steps, 1),
    )


# --------------------------------------------------------------------------------------------
# The acceptance model
# --------------------------------------------------------------------------------------------


class ReplayAcceptance:
    """d = min(K, available[p]), a = min(d, matched[p]) of the request's recorded position p.

    Requests map to recorded requests at add_request: `by-id` maps req_id i to recorded request
    i (mod the number recorded): a run's own workload replayed on its recording; the default
    for a recording `in_request_order`. Otherwise among the recorded requests whose category
    equals the request's tag when there are any (`by_tag`), else among all; round-robin in
    arrival order (the default) or random, by the request's own draw (seed and req_id). A
    request longer than its recording wraps around (position p reads p mod len): it keeps the
    recorded statistics at the cost of one artificial join per wrap.
    """

    def __init__(
        self,
        recording: ReplayRecording,
        seed: np.random.SeedSequence,
        assignment: Assignment | None = None,
        by_tag: bool = True,
    ) -> None:
        """`assignment` None: by-id for a recording in request order, else round-robin."""
        if assignment is None:
            assignment = "by-id" if recording.in_request_order else "round-robin"
        if assignment not in ("round-robin", "random", "by-id"):
            raise ValueError(f"assignment must be round-robin, random or by-id, got {assignment!r}")
        self.recording = recording
        self.assignment = assignment
        self.by_tag = by_tag
        self._pick = CounterStream(seed, 0)  # a request's recorded request under "random"
        lengths = recording.lengths  # [R]
        self._lengths = lengths
        self._starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)  # [R]
        self._available = np.concatenate(recording.available)  # [sum(len)]
        self._matched = np.concatenate(recording.matched)  # [sum(len)]
        self._always_available = recording.always_available
        self._all_prompts = np.arange(len(lengths), dtype=np.int64)
        self._by_category: dict[str, IntArray] = {}
        for category in {c for c in recording.categories if c is not None}:
            members = [i for i, c in enumerate(recording.categories) if c == category]
            self._by_category[category] = np.array(members, dtype=np.int64)
        self._next_in_group: dict[str | None, int] = {}  # round-robin cursor per group
        self._prompt_of = DenseRows(1, -1, np.int64)  # [req, 1] recorded request index

    def _candidates(self, tag: str | None) -> tuple[str | None, IntArray]:
        if self.by_tag and tag is not None and tag in self._by_category:
            return tag, self._by_category[tag]
        return None, self._all_prompts

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        if self.assignment == "by-id":
            self._prompt_of.set(req_id, [req_id % len(self._lengths)])
            return
        group, candidates = self._candidates(spec.tag)
        if self.assignment == "random":
            pick = int(self._pick.uniform(req_id) * len(candidates))
        else:
            pick = self._next_in_group.get(group, 0) % len(candidates)
            self._next_in_group[group] = pick + 1
        self._prompt_of.set(req_id, [int(candidates[pick])])

    def prompt_of(self, req_id: int) -> int:
        """Index of the recorded request a request replays."""
        return int(self._prompt_of.gather(np.array([req_id], dtype=np.int64))[0, 0])

    def remove_request(self, req_id: int) -> None:
        self._prompt_of.remove(req_id)

    def sample_outcomes(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> tuple[IntArray, IntArray]:
        prompts = self._prompt_of.gather(req_ids)[:, 0]  # [n]
        index = self._starts[prompts] + num_output_tokens % self._lengths[prompts]  # [n]
        matched = self._matched[index]  # [n]
        if self._always_available and (
            num_spec_tokens.shape[0] == 0
            or int(np.maximum.reduce(num_spec_tokens)) <= self.recording.cap
        ):
            return num_spec_tokens, np.minimum(matched, num_spec_tokens)
        drafted = np.minimum(self._available[index], num_spec_tokens)  # [n]
        return drafted, np.minimum(matched, drafted)
