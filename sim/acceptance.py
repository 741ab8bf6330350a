"""Acceptance models: how many drafts the target accepts, per decode row and step (DESIGN §4).

Every model implements `sim.types.AcceptanceModel` and is vectorised over rows: one call of
`sample_accepted` per step, numpy over up to hundreds of rows, no Python loop over rows.

- `PerPositionAcceptance`: every request alike. From unconditional per-position rates r_i the
  conditional rates are c_i = r_i / r_{i-1} (r_0 = 1); a row with K drafts accepts the number
  of leading successes of independent Bernoulli(c_1..c_K). Hence P(a >= i) = r_i and
  E[a | K] = sum_{i<=K} r_i, so AL(K) of the profile is reproduced.
- `HeterogeneousAcceptance`: requests differ. Each request draws a strength u ~ U(0, 1) once and
  gets its own rates r_{j,i} = BetaQuantile(u; mean r_i, concentration kappa), then samples like
  the per-position model with its own rates. The population mean of r_{j,i} is r_i, but the
  mean of per-request TPOT is not ITL / mean AL (Jensen).
- `ReplayAcceptance`: replays recorded draft/target match sequences (greedy chain SD): a row at
  output position p with K drafts accepts the leading 1s of match[p : p+K].
- `CategoryAcceptance`: routes requests to one model per `RequestSpec.tag`.

Positions past the rates a model knows (K larger than the profiled K_max) reuse the last
conditional rate: an extrapolation, stated here and in docs/models.md.

Requests are keyed by `req_id`, a per-run counter (small non-negative ints), so per-request
state lives in dense arrays indexed by req_id and the hot path is a numpy gather.

What this module does not do: temperature > 0 acceptance from probabilities (the recording's
`alpha` is not replayed), acceptance that depends on context length or on the batch, or any
timing (that is `sim.latency`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy.special import betaincinv

from dsd.common.arrays import BoolArray, FloatArray, IntArray
from dsd.common.errors import InputError
from dsd.policies.profile import Profile
from dsd.sim.types import AcceptanceModel
from dsd.traces.workload import RequestSpec

DEFAULT_RECORDING_PATH = (
    Path(__file__).resolve().parent / "data" / "earlyexit_acceptance_mtbench.json"
)
DEFAULT_EXIT_LAYER = 27
# Spread (standard deviation over requests) of the per-request r_1 when a profile has no
# per-request samples: 0.08, what the bundled recording shows at exit layer 27 (per-prompt match
# rate std 0.092 over ~120 tokens per prompt, less ~0.046 of binomial noise in quadrature).
DEFAULT_SPREAD = 0.08

Assignment = Literal["round-robin", "random"]


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _validated_rates(rates: Sequence[float] | FloatArray, what: str) -> FloatArray:
    values = np.asarray(rates, dtype=np.float64)  # [k_max]
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{what}: need a non-empty list of per-position rates")
    if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1):
        raise ValueError(f"{what}: rates must be in [0, 1], got {values.tolist()}")
    return values


def conditional_rates(unconditional: FloatArray) -> FloatArray:
    """c_i = r_i / r_{i-1} along the last axis (r_0 = 1; c_i = 0 where r_{i-1} = 0).

    Clipped to [0, 1]: rates measured with varying K can rise with i by noise, and a
    conditional probability above 1 cannot be sampled.
    """
    previous = np.concatenate(
        [np.ones_like(unconditional[..., :1]), unconditional[..., :-1]], axis=-1
    )  # [..., k_max]
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = np.where(previous > 0, unconditional / np.where(previous > 0, previous, 1.0), 0.0)
    clipped: FloatArray = np.clip(cond, 0.0, 1.0)
    return clipped


def _widen(cond: FloatArray, width: int) -> FloatArray:
    """Conditional rates [..., k] cut or padded to `width` columns by repeating the last one."""
    have = cond.shape[-1]
    if width <= have:
        return cond[..., :width]
    pad = np.repeat(cond[..., -1:], width - have, axis=-1)
    widened: FloatArray = np.concatenate([cond, pad], axis=-1)
    return widened


def count_leading(ok: BoolArray, num_spec_tokens: IntArray) -> IntArray:
    """Leading True count per row of `ok` [n, w], capped at K [n] (columns >= K ignored)."""
    width = ok.shape[1]
    inside = np.arange(width)[None, :] < num_spec_tokens[:, None]  # [n, w]
    run = np.logical_and.accumulate(ok & inside, axis=1)  # [n, w]
    counts: IntArray = run.sum(axis=1, dtype=np.int64)
    return counts


def _sample_leading_successes(
    rng: np.random.Generator, cond: FloatArray, num_spec_tokens: IntArray
) -> IntArray:
    """Accepted counts for rows with conditional rates `cond` ([k] shared or [n, k] per row)."""
    num_rows = int(num_spec_tokens.shape[0])
    width = int(np.maximum.reduce(num_spec_tokens)) if num_rows else 0
    if width <= 0:
        return np.zeros(num_rows, dtype=np.int64)
    uniforms = rng.random((num_rows, width))  # [n, w]
    # ok[:, :w] = draft i accepted given the earlier ones; a False column w stops every row, so
    # argmin (first False) is the number of leading successes, then capped at the row's K.
    ok = np.zeros((num_rows, width + 1), dtype=np.bool_)  # [n, w+1]
    np.less(uniforms, _widen(cond, width), out=ok[:, :width])  # a shared [w] row broadcasts
    leading = np.argmin(ok, axis=1)  # [n]
    counts: IntArray = np.minimum(leading, num_spec_tokens)
    return counts


class _DenseRows:
    """Per-request rows of a fixed width in a growable array indexed by req_id."""

    def __init__(self, width: int, fill: float, dtype: type[np.generic]) -> None:
        self.fill = fill
        self.values = np.full((64, width), fill, dtype=dtype)  # [capacity, width]
        self.present = np.zeros(64, dtype=np.bool_)  # [capacity]

    def set(self, req_id: int, row: npt.ArrayLike) -> None:
        if req_id < 0:
            raise ValueError(f"req_id must be >= 0, got {req_id}")
        if req_id >= self.values.shape[0]:
            capacity = max(2 * self.values.shape[0], req_id + 1)
            values = np.full((capacity, self.values.shape[1]), self.fill, dtype=self.values.dtype)
            values[: self.values.shape[0]] = self.values
            present = np.zeros(capacity, dtype=np.bool_)
            present[: self.present.shape[0]] = self.present
            self.values, self.present = values, present
        self.values[req_id] = row
        self.present[req_id] = True

    def remove(self, req_id: int) -> None:
        if 0 <= req_id < self.present.shape[0]:
            self.present[req_id] = False
            self.values[req_id] = self.fill

    def gather(self, req_ids: IntArray) -> npt.NDArray[Any]:
        """Rows of `req_ids` [n] -> [n, width]; every id must have been added."""
        if req_ids.size and (
            int(req_ids.max()) >= self.present.shape[0] or not bool(self.present[req_ids].all())
        ):
            missing = [int(r) for r in req_ids if r >= self.present.shape[0] or not self.present[r]]
            raise KeyError(f"requests never added (or already removed): {missing[:5]}")
        return self.values[req_ids]


# --------------------------------------------------------------------------------------------
# Homogeneous per-position rates
# --------------------------------------------------------------------------------------------


class PerPositionAcceptance:
    """All requests share the unconditional per-position rates r_1..r_kmax."""

    def __init__(self, rates: Sequence[float] | FloatArray, seed: np.random.SeedSequence) -> None:
        self.rates = _validated_rates(rates, "PerPositionAcceptance")  # [k_max]
        self.cond = conditional_rates(self.rates)  # [k_max]
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def from_profile(profile: Profile, seed: np.random.SeedSequence) -> PerPositionAcceptance:
        return PerPositionAcceptance(profile.acceptance_rates, seed)

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        """Requests are alike: nothing to draw."""

    def remove_request(self, req_id: int) -> None:
        """No per-request state."""

    def sample_accepted(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> IntArray:
        return _sample_leading_successes(self.rng, self.cond, num_spec_tokens)


# --------------------------------------------------------------------------------------------
# Heterogeneous requests
# --------------------------------------------------------------------------------------------


def concentration_from_spread(mean_rate: float, spread: float) -> float:
    """Beta concentration kappa with std `spread` at mean `mean_rate` (var = m(1-m)/(kappa+1))."""
    if not (0.0 < mean_rate < 1.0):
        raise ValueError(f"mean rate must be in (0, 1) to have a spread, got {mean_rate}")
    if not (0.0 < spread < math.sqrt(mean_rate * (1.0 - mean_rate))):
        raise ValueError(
            f"spread must be in (0, sqrt(m(1-m)) = {math.sqrt(mean_rate * (1 - mean_rate)):.3f}) "
            f"at mean r_1 = {mean_rate:.3f}, got {spread}"
        )
    return mean_rate * (1.0 - mean_rate) / spread**2 - 1.0


def _concentration_for_rates(rates: FloatArray, spread: float | None) -> float:
    """Concentration for `spread` at the first position whose rate can vary (0 < r < 1).

    Rates of exactly 0 or 1 (e.g. a draft identical to the target) leave no room for a spread and
    are passed through unchanged by `per_request_rates`; when every rate is degenerate the
    concentration is unused. `spread=None` means DEFAULT_SPREAD capped at half of
    sqrt(m(1-m)), so near-0 or near-1 rates still get a valid Beta; an explicit spread that the
    mean cannot have is an error.
    """
    inner = rates[(rates > 0.0) & (rates < 1.0)]
    if inner.size == 0:
        return 1.0
    mean_rate = float(inner[0])
    if spread is None:
        spread = min(DEFAULT_SPREAD, 0.5 * math.sqrt(mean_rate * (1.0 - mean_rate)))
    return concentration_from_spread(mean_rate, spread)


def per_request_rates(rates: FloatArray, concentration: float, strength: FloatArray) -> FloatArray:
    """Per-request unconditional rates [n, k]: the `strength` [n] quantile of Beta(mean r_i, kappa).

    One common strength per request across positions (a comonotone draw): Beta(m kappa,
    (1-m) kappa) grows stochastically with m, so rates stay non-increasing in i for every
    request, and E over strength of the quantile is exactly r_i.
    """
    mean = np.clip(rates, 0.0, 1.0)[None, :]  # [1, k]
    inner = (mean > 0) & (mean < 1)  # [1, k]
    a = np.where(inner, mean * concentration, 1.0)  # [1, k]
    b = np.where(inner, (1.0 - mean) * concentration, 1.0)  # [1, k]
    quantile = betaincinv(a, b, strength[:, None])  # [n, k]
    out: FloatArray = np.where(inner, quantile, mean)
    return out


class HeterogeneousAcceptance:
    """Each request has its own per-position rates, drawn at add_request (see module doc).

    The concentration kappa comes from, in order: `concentration` if given; else the variance of
    the profile's per-request r_1 samples (method of moments; it includes each sample's own
    counting noise, so it reads high when samples are short); else `spread` (std of per-request
    r_1 over the population; None: DEFAULT_SPREAD, capped where the mean cannot have it).
    """

    def __init__(
        self,
        rates: Sequence[float] | FloatArray,
        seed: np.random.SeedSequence,
        spread: float | None = None,
        concentration: float | None = None,
    ) -> None:
        validated = _validated_rates(rates, "HeterogeneousAcceptance")
        # The non-increasing envelope: a comonotone draw needs non-increasing means.
        self.rates = np.minimum.accumulate(validated)  # [k_max]
        if concentration is None:
            concentration = _concentration_for_rates(self.rates, spread)
        if not (math.isfinite(concentration) and concentration > 0):
            raise ValueError(f"concentration must be finite and > 0, got {concentration}")
        self.concentration = float(concentration)
        self.rng = np.random.default_rng(seed)
        self._cond = _DenseRows(len(self.rates), 0.0, np.float64)  # [req, k_max] conditional

    @staticmethod
    def from_profile(
        profile: Profile, seed: np.random.SeedSequence, spread: float | None = None
    ) -> HeterogeneousAcceptance:
        """Spread from the profile's per-request samples when it has >= 2, else `spread`."""
        first = [s[0] for s in profile.per_request_rates if len(s) >= 1]
        concentration: float | None = None
        if len(first) >= 2:
            mean = float(profile.acceptance_rates[0])
            variance = float(np.var(first, ddof=1))
            if variance > 0 and 0 < mean < 1:
                concentration = max(mean * (1.0 - mean) / variance - 1.0, 1e-3)
        return HeterogeneousAcceptance(
            profile.acceptance_rates, seed, spread=spread, concentration=concentration
        )

    def request_rates(self, req_id: int) -> FloatArray:
        """The unconditional rates drawn for one request [k_max] (for tests and reports)."""
        cond = self._cond.gather(np.array([req_id], dtype=np.int64))[0]  # [k_max]
        rates: FloatArray = np.cumprod(cond)
        return rates

    def draw_rates(self, num_requests: int) -> FloatArray:
        """[n, k_max] per-request rates drawn from this model's generator (population checks)."""
        strength = self.rng.random(num_requests)  # [n]
        return per_request_rates(self.rates, self.concentration, strength)

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        rates = self.draw_rates(1)  # [1, k_max]
        self._cond.set(req_id, conditional_rates(rates)[0])

    def remove_request(self, req_id: int) -> None:
        self._cond.remove(req_id)

    def sample_accepted(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> IntArray:
        cond = self._cond.gather(req_ids)  # [n, k_max]
        return _sample_leading_successes(self.rng, cond, num_spec_tokens)


# --------------------------------------------------------------------------------------------
# Replay of recorded match sequences
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayRecording:
    """Recorded greedy match sequences of one draft (exit layer), one per prompt."""

    layer: int  # draft exit layer the sequences belong to
    sequences: tuple[npt.NDArray[np.bool_], ...]  # per prompt [gen_len]: draft argmax == target
    categories: tuple[str | None, ...]  # per prompt category (MT-Bench), or None
    source: str  # file name or "inline", for messages

    def __post_init__(self) -> None:
        if not self.sequences:
            raise ValueError(f"{self.source}: no sequences")
        if len(self.categories) != len(self.sequences):
            raise ValueError(f"{self.source}: one category per sequence expected")
        if any(len(s) == 0 for s in self.sequences):
            raise ValueError(f"{self.source}: empty sequence")

    @staticmethod
    def from_sequences(
        sequences: Sequence[Sequence[int] | Sequence[bool]],
        categories: Sequence[str | None] | None = None,
        layer: int = DEFAULT_EXIT_LAYER,
    ) -> ReplayRecording:
        arrays = tuple(np.asarray(s, dtype=np.bool_) for s in sequences)
        cats = tuple(categories) if categories is not None else (None,) * len(arrays)
        return ReplayRecording(layer=layer, sequences=arrays, categories=cats, source="inline")


def load_replay_recording(
    path: str | Path = DEFAULT_RECORDING_PATH, layer: int = DEFAULT_EXIT_LAYER
) -> ReplayRecording:
    """Read an early-exit recording (`sim/data/earlyexit_acceptance_mtbench.json` format)."""
    name = Path(path).name
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: line {exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("prompts"), list):
        raise InputError(f"{name}: expected an object with a 'prompts' list")
    layers = data.get("layers")
    if isinstance(layers, list) and layer not in layers:
        raise InputError(f"{name}: exit layer {layer} not recorded (layers: {layers})")
    sequences: list[npt.NDArray[np.bool_]] = []
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
        sequences.append(np.asarray(seq, dtype=np.bool_))
        category = prompt.get("category")
        categories.append(str(category) if category is not None else None)
    if not sequences:
        raise InputError(f"{name}: no non-empty match sequences at layer {layer}")
    return ReplayRecording(
        layer=layer, sequences=tuple(sequences), categories=tuple(categories), source=name
    )


@dataclass(frozen=True)
class RecordedRates:
    """Per-position acceptance counts of a chain-SD replay of a recording at fixed K."""

    rates: tuple[float, ...]  # r_i = accepted_at_pos[i] / drafted_at_pos[i], i = 1..k_max
    drafted_at_pos: tuple[int, ...]  # steps that drafted at least i tokens
    accepted_at_pos: tuple[int, ...]  # steps whose first i drafts were all accepted
    num_steps: int  # decode steps replayed
    acceptance_length: float  # output tokens per decode step, bonus included


def per_position_rates_from_recording(recording: ReplayRecording, k_max: int) -> RecordedRates:
    """Replay greedy chain SD with K = k_max along every sequence and count per position.

    Output position 0 comes from prefill, so decode steps start at position 1. A step at
    position p drafts min(k_max, len - p) tokens (nothing is drafted past the recorded end),
    accepts the leading matches and emits accepted + 1 tokens. This is what a profiler would
    log with K fixed, so the rates can fill a Profile's `acceptance_rates`.
    """
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    drafted = np.zeros(k_max, dtype=np.int64)
    accepted = np.zeros(k_max, dtype=np.int64)
    num_steps = 0
    num_emitted = 0
    for seq in recording.sequences:
        length = len(seq)
        position = 1
        while position < length:
            num_drafts = min(k_max, length - position)
            window = seq[position : position + num_drafts]
            misses = np.flatnonzero(~window)
            num_accepted = int(misses[0]) if misses.size else num_drafts
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


class ReplayAcceptance:
    """Accepted count = leading 1s of the request's recorded match[p : p+K] (greedy chain SD).

    Valid when the draft's proposal at a position along the target trajectory does not depend
    on earlier rejections: exact for early exit, approximate for a separate draft model.
    Requests map to recorded prompts at add_request: among the prompts whose category equals
    the request's tag when there are any (`by_tag`), else among all; round-robin in arrival
    order or seeded random. A request longer than its recorded sequence wraps around (position
    p reads match[p mod len]): it keeps the prompt's own statistics at the cost of one
    artificial join per wrap.
    """

    def __init__(
        self,
        recording: ReplayRecording,
        seed: np.random.SeedSequence,
        assignment: Assignment = "round-robin",
        by_tag: bool = True,
    ) -> None:
        if assignment not in ("round-robin", "random"):
            raise ValueError(f"assignment must be round-robin or random, got {assignment!r}")
        self.recording = recording
        self.assignment = assignment
        self.by_tag = by_tag
        self.rng = np.random.default_rng(seed)
        lengths = np.array([len(s) for s in recording.sequences], dtype=np.int64)  # [P]
        self._lengths = lengths
        self._starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)  # [P]
        self._flat = np.concatenate(recording.sequences)  # [sum(len)]
        self._all_prompts = np.arange(len(lengths), dtype=np.int64)
        self._by_category: dict[str, IntArray] = {}
        for category in {c for c in recording.categories if c is not None}:
            members = [i for i, c in enumerate(recording.categories) if c == category]
            self._by_category[category] = np.array(members, dtype=np.int64)
        self._next_in_group: dict[str | None, int] = {}  # round-robin cursor per group
        self._prompt_of = _DenseRows(1, -1, np.int64)  # [req, 1] prompt index

    def _candidates(self, tag: str | None) -> tuple[str | None, IntArray]:
        if self.by_tag and tag is not None and tag in self._by_category:
            return tag, self._by_category[tag]
        return None, self._all_prompts

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        group, candidates = self._candidates(spec.tag)
        if self.assignment == "random":
            pick = int(self.rng.integers(len(candidates)))
        else:
            pick = self._next_in_group.get(group, 0) % len(candidates)
            self._next_in_group[group] = pick + 1
        self._prompt_of.set(req_id, [int(candidates[pick])])

    def prompt_of(self, req_id: int) -> int:
        """Index of the recorded prompt a request replays."""
        return int(self._prompt_of.gather(np.array([req_id], dtype=np.int64))[0, 0])

    def remove_request(self, req_id: int) -> None:
        self._prompt_of.remove(req_id)

    def sample_accepted(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> IntArray:
        num_rows = int(num_spec_tokens.shape[0])
        width = int(num_spec_tokens.max()) if num_rows else 0
        if width <= 0:
            return np.zeros(num_rows, dtype=np.int64)
        prompts = self._prompt_of.gather(req_ids)[:, 0]  # [n]
        lengths = self._lengths[prompts]  # [n]
        offsets = num_output_tokens[:, None] + np.arange(width)[None, :]  # [n, w]
        index = self._starts[prompts][:, None] + offsets % lengths[:, None]  # [n, w]
        return count_leading(self._flat[index], num_spec_tokens)


# --------------------------------------------------------------------------------------------
# Per-category routing
# --------------------------------------------------------------------------------------------


class CategoryAcceptance:
    """Routes each request by `RequestSpec.tag` to its category's model (`default` otherwise)."""

    def __init__(self, by_tag: Mapping[str, AcceptanceModel], default: AcceptanceModel) -> None:
        self.models: list[AcceptanceModel] = [default, *by_tag.values()]  # index 0 is the default
        self._index_of_tag = {tag: i + 1 for i, tag in enumerate(by_tag)}
        self._route = _DenseRows(1, -1, np.int64)  # [req, 1] model index

    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        index = self._index_of_tag.get(spec.tag, 0) if spec.tag is not None else 0
        self._route.set(req_id, [index])
        self.models[index].add_request(req_id, spec)

    def remove_request(self, req_id: int) -> None:
        if 0 <= req_id < self._route.present.shape[0] and self._route.present[req_id]:
            index = int(self._route.values[req_id, 0])
            self.models[index].remove_request(req_id)
        self._route.remove(req_id)

    def sample_accepted(
        self, req_ids: IntArray, num_output_tokens: IntArray, num_spec_tokens: IntArray
    ) -> IntArray:
        routes = self._route.gather(req_ids)[:, 0]  # [n]
        accepted = np.zeros(req_ids.shape[0], dtype=np.int64)  # [n]
        for index in np.unique(routes).tolist():  # a loop over models, not rows
            rows = np.flatnonzero(routes == index)
            accepted[rows] = self.models[index].sample_accepted(
                req_ids[rows], num_output_tokens[rows], num_spec_tokens[rows]
            )
        return accepted
