"""Measure a (target, draft, device) setup into a `policies.profile.Profile`.

Measurements, all on the real SD engine (`backend.engine` or its fast path):
- **decode ITL(B, K, context)**: B slots hold synthetic prompts of `context_len` tokens; each
  timed step is one `engine.step` at K for every row, after warm-up steps, with
  `torch.cuda.synchronize()` before reading the clock on CUDA. After every step the slots are
  truncated back to `context_len` tokens, so every timed step sees the same context (and the
  draft's catch-up is the steady-state one token at most). Every round times each (B, K) of a
  context once; each sample is divided by its round's speed, the drift all of the round's
  points share (`divide_round_drift`). Median, p10, p90, mean and n per point.
- **prefill cost**: one request's prompt of N tokens in one chunk (target and draft), for a few N.
- **prefill in decode steps** (reference step only: the engine runs a chunk in the decode
  rows' forward): per N, what a chunk adds to a K = 0 decode step of the smallest and largest
  B, from paired rounds of the mixed step and the decode step alone (`time_mixed_steps`).
- **acceptance**: the prompt set run through the engine at K = k_max (greedy or sampled at the
  profile's temperature) until each request has its output tokens or an EOS; over the rows that
  asked for k_max, per position i the count of steps that drafted d >= i tokens (an n-gram
  lookup may draft fewer) and that accepted a >= i, and per request its (d, a) histogram and
  its own unconditional rates.

- **host overhead of the engine loop**: `backend.host_overhead` (what a loop step costs beyond
  its forwards, and each learning policy's own host time).

The decode ITL covers the engine step only (draft, verify, accept, the one host sync); the loop's
host work is the separate host-overhead model, which the simulator adds per step.
This module does not parse flags, build models or write files (`dsd profile` does); it tokenizes
only the acceptance prompt set (`dataset_prompts`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from dsd.backend.engine import AnyDraft, NgramDraft, SpecDecodeConfig, SpecDecodeEngine, StepResult
from dsd.backend.environment import environment_metadata, forward_tokens
from dsd.backend.executor import engine_prefill_forward
from dsd.backend.fast_path import FAST_PATH_KINDS, build_spec_decode_engine
from dsd.backend.model import Transformer
from dsd.backend.pair import ModelPair
from dsd.backend.replay import replay_recording
from dsd.common.arrays import IntArray
from dsd.common.errors import InputError
from dsd.common.machine import load_average
from dsd.common.progress import Advance
from dsd.policies.host_time import TIMED_POLICIES, fit_policy_host_lines
from dsd.policies.profile import (
    LatencyPoint,
    PrefillInDecodePoint,
    PrefillPoint,
    Profile,
    lower_triangular_rows,
)
from dsd.policies.profile_quality import (
    QualityLimits,
    check_latency,
    check_prefill,
    problems_line,
)
from dsd.sim.models.latency_choice import leave_one_knot_out
from dsd.traces.registry import build_workload

Point = TypeVar("Point", bound=Hashable)  # what one timed measurement is of: (B, K), a size


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure. Validated on construction (InputError naming the field)."""

    batch_sizes: tuple[int, ...]  # B values; must include 1
    spec_tokens: tuple[int, ...]  # K values; must include 0, 1 and their max (k_max >= 1)
    context_lens: tuple[int, ...] = (128,)  # tokens per row at which ITL is measured, >= 1 each
    prefill_token_counts: tuple[int, ...] = (32, 128, 512)  # prompt sizes of the prefill points
    num_warmup: int = 3  # untimed steps per point (first-run allocation, graph capture)
    num_iters: int = 10  # timed steps per point, >= 1
    acceptance_output_len: int | None = None  # output tokens per request; None: the request's
    temperature: float = 0.0  # 0: greedy acceptance; > 0: rejection sampling
    seed: int = 0  # synthetic prompt ids and the engine's sampling stream
    fast_path: str = "off"  # "off", "eager", "cuda-graphs" (backend.fast_path)
    eos_token_ids: tuple[int, ...] = ()  # acceptance runs stop a request at these ids
    # Output tokens per request of the host-overhead loop runs (2 x B requests at C = B per
    # profiled B, K = 0 and K = K_max); 0: do not measure the host overhead.
    host_overhead_output_len: int = 32
    # Time each learning policy's own choose_k + observe against static:K_max's after the steps
    # of the host-overhead runs (policies.host_time), kept in host_overhead.policies. Only with
    # the host overhead measured.
    time_policy_host: bool = True
    # Timing checks (policies.profile_quality): points that fail are measured again up to
    # max_remeasure times; a profile that still fails is refused unless allow_noisy (then its
    # problems are recorded in metadata["quality"]).
    quality_limits: QualityLimits = field(default_factory=QualityLimits)
    max_remeasure: int = 2
    allow_noisy: bool = False
    # Adaptive batch sizes: after the listed B, add B where the ITL table interpolates worst
    # (`refine_batch_sizes`) until every interior B is predicted from its neighbours within
    # this many percent, or `adaptive_budget_s` of timing is spent. None: the listed B only.
    adaptive_target_pct: float | None = None
    adaptive_budget_s: float = 600.0

    def __post_init__(self) -> None:
        def ints(name: str, values: tuple[int, ...], minimum: int) -> None:
            if not values:
                raise InputError(f"{name}: give at least one value")
            if any(not isinstance(v, int) or v < minimum for v in values):
                raise InputError(
                    f"{name}: every value must be an integer >= {minimum}, got {values}"
                )
            if len(set(values)) != len(values):
                raise InputError(f"{name}: duplicate values in {values}")

        ints("batch_sizes", self.batch_sizes, 1)
        ints("spec_tokens", self.spec_tokens, 0)
        ints("context_lens", self.context_lens, 1)
        ints("prefill_token_counts", self.prefill_token_counts, 1)
        if 1 not in self.batch_sizes:
            raise InputError(
                f"batch_sizes: must include 1 (the profile format needs it), got {self.batch_sizes}"
            )
        k_max = max(self.spec_tokens)
        if k_max < 1 or not {0, 1} <= set(self.spec_tokens):
            raise InputError(
                f"spec_tokens: must include 0 and 1 (and K_max >= 1), got {self.spec_tokens}"
            )
        if self.num_warmup < 0:
            raise InputError(f"num_warmup: must be >= 0, got {self.num_warmup}")
        if self.num_iters < 1:
            raise InputError(f"num_iters: must be >= 1, got {self.num_iters}")
        if self.max_remeasure < 0:
            raise InputError(f"max_remeasure: must be >= 0, got {self.max_remeasure}")
        if self.acceptance_output_len is not None and self.acceptance_output_len < 2:
            raise InputError(
                f"acceptance_output_len: must be >= 2, got {self.acceptance_output_len}"
            )
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise InputError(f"temperature: must be finite and >= 0, got {self.temperature}")
        if self.fast_path not in FAST_PATH_KINDS:
            raise InputError(
                f"fast_path: choose from {', '.join(FAST_PATH_KINDS)}, got {self.fast_path!r}"
            )
        if (
            isinstance(self.host_overhead_output_len, bool)
            or not isinstance(self.host_overhead_output_len, int)
            or self.host_overhead_output_len < 0
            or self.host_overhead_output_len == 1
        ):
            raise InputError(
                "host_overhead_output_len: must be 0 (off) or an integer >= 2, got "
                f"{self.host_overhead_output_len!r}"
            )
        if not isinstance(self.time_policy_host, bool):
            raise InputError(
                f"time_policy_host: must be true or false, got {self.time_policy_host!r}"
            )
        if self.adaptive_target_pct is not None and not (
            np.isfinite(self.adaptive_target_pct) and self.adaptive_target_pct > 0
        ):
            raise InputError(
                f"adaptive_target_pct: must be a number > 0, got {self.adaptive_target_pct!r}"
            )
        if not (np.isfinite(self.adaptive_budget_s) and self.adaptive_budget_s > 0):
            raise InputError(f"adaptive_budget_s: must be > 0, got {self.adaptive_budget_s!r}")
        if self.adaptive_target_pct is not None and len(self.batch_sizes) < 3:
            raise InputError(
                "batch_sizes: adaptive profiling needs >= 3 to start from (it refines between "
                f"them), got {self.batch_sizes}"
            )
        if self.fast_path != "off" and self.temperature != 0:
            raise InputError(
                "fast_path: the fast path is greedy only; use temperature 0 or --fast-path off"
            )

    @property
    def k_max(self) -> int:
        return max(self.spec_tokens)

    def num_units(self, num_prompts: int) -> int:
        """Progress units of `profile_pair` over `num_prompts` acceptance prompts: one per
        round of decode timing per context length, one for the prefill points, one per round
        of mixed steps (where prefill shares decode's forward), one per prompt and
        host-overhead loop run. Re-measure passes and adaptive refinement add theirs to the
        total when they start."""
        rounds = self.num_warmup + self.num_iters
        fused = engine_prefill_forward(self.fast_path) == "fused"
        return (
            rounds * len(self.context_lens)
            + 1
            + (rounds if fused else 0)
            + num_prompts
            + (2 * len(self.batch_sizes) if self.host_overhead_output_len > 0 else 0)
        )


@dataclass(frozen=True)
class AcceptanceCounts:
    """Per-position counts of one acceptance run, over the steps where a row asked for k_max
    drafts (unconditional: position i = first i drafts; vLLM's per-position semantics)."""

    drafted_at_pos: tuple[int, ...]  # [k_max] steps that drafted d >= i tokens, i = 1..k_max
    accepted_at_pos: tuple[int, ...]  # [k_max] steps that accepted a >= i tokens
    # each request's r_i = P(a >= i) over its steps at k_max (those drafting nothing included)
    per_request_rates: tuple[tuple[float, ...], ...]
    num_steps: int  # SD steps run
    num_output_tokens: int  # output tokens emitted by those steps
    # rows that asked for k_max drafts, those that drafted fewer or none included: the
    # denominator of r_i = accepted_at_pos / it and s_i = drafted_at_pos / it
    num_steps_at_k_max: int = 0
    # per request with such steps (the ones per_request_rates has, in order): its (d, a) counts
    # as lower-triangular rows, `policies.profile.Profile.draft_outcomes`
    draft_outcomes: tuple[tuple[tuple[int, ...], ...], ...] = ()
    outcome_requests: tuple[int, ...] = ()  # per draft_outcomes row, its index in the prompts
    output_ids: tuple[IntArray, ...] = ()  # per prompt, the output tokens it generated
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_ids(
    rng: np.random.Generator, length: int, vocab: int, avoid: Sequence[int]
) -> IntArray:
    """length random ids in [0, vocab) that are none of `avoid` (special ids)."""
    allowed = np.setdiff1d(
        np.arange(vocab, dtype=np.int64), np.asarray(list(avoid), dtype=np.int64)
    )
    return rng.choice(allowed, size=length)


def _truncate(engine: SpecDecodeEngine, slots: IntArray, num_tokens: int) -> None:
    """Put slots back to `num_tokens` known tokens with [0, num_tokens - 1) in the caches."""
    engine.num_tokens[slots] = num_tokens
    engine.target_cache.lengths[slots] = num_tokens - 1
    if engine.draft_cache is not None:
        engine.draft_cache.lengths[slots] = np.minimum(
            engine.draft_cache.lengths[slots], num_tokens - 1
        )


def _prefill_all(engine: SpecDecodeEngine, slots: IntArray, chunk: int = 512) -> None:
    """Prefill every slot fully (chunks of `chunk` tokens per row)."""
    while True:
        pending = np.array([s for s in slots if not engine.is_decoding(int(s))], dtype=np.int64)
        if pending.size == 0:
            return
        engine.prefill(pending, np.full(pending.size, chunk, dtype=np.int64))


def _percentiles(samples_ms: list[float]) -> tuple[float, float, float]:
    values = np.asarray(samples_ms, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return float(median), float(p10), float(p90)


class ProfileQualityError(InputError):
    """The profile's timing stayed noisy or non-monotonic after re-measuring."""


def _timed_ms(device: torch.device, work: Callable[[], object]) -> float:
    device_sync(device)
    start_s = time.perf_counter()
    work()
    device_sync(device)
    return (time.perf_counter() - start_s) * 1000.0


def warm_up(
    time_one_ms: Callable[[], float], min_steps: int, window: int = 5, max_steps: int = 60
) -> int:
    """Run `time_one_ms` at least `min_steps` times, then until the median of the last `window`
    times is within 5% of the window's before (caches, allocator, clocks settled) or
    `max_steps` ran; returns the steps run."""
    times: list[float] = []
    while len(times) < max_steps:
        times.append(time_one_ms())
        if len(times) < max(min_steps, 2 * window):
            continue
        last = float(np.median(times[-window:]))
        before = float(np.median(times[-2 * window : -window]))
        if abs(last - before) <= 0.05 * before:
            break
    return len(times)


def decode_prompt(
    engine: SpecDecodeEngine,
    rng: np.random.Generator,
    context_len: int,
    k_max: int,
    avoid_ids: Sequence[int],
) -> IntArray:
    """Synthetic ids for a decode point's slot: a prompt of `context_len` tokens and the token
    that follows it (which replaces the sampled first token, see `DecodeSlots`). Random, or
    for an n-gram draft a random block repeated, so that the lookup always finds K drafts (the
    cost of verifying K is what a latency point means; acceptance does not matter here)."""
    vocab = engine.target.config.vocab_size
    if not isinstance(engine.draft, NgramDraft):
        return synthetic_ids(rng, context_len + 1, vocab, avoid_ids)
    period = max(engine.draft.config.prompt_lookup_max + 1, k_max + 1, 8)
    block = synthetic_ids(rng, period, vocab, avoid_ids)
    return np.resize(block, context_len + 1).astype(np.int64)  # [context_len + 1]


class DecodeSlots:
    """max(B) prefilled slots of one context length; B = b steps the first b of them, and every
    timed step is truncated back so each one sees the same context."""

    def __init__(
        self,
        engine: SpecDecodeEngine,
        config: ProfileConfig,
        rng: np.random.Generator,
        avoid_ids: Sequence[int],
        context_len: int,
    ) -> None:
        self.engine = engine
        self.context_len = context_len
        ids = [
            decode_prompt(engine, rng, context_len, config.k_max, avoid_ids)
            for _ in range(max(config.batch_sizes))
        ]  # [max B] of [context_len + 1]
        self.slots = np.array(
            [engine.alloc_slot(row[:context_len]) for row in ids], dtype=np.int64
        )  # [max B]
        _prefill_all(engine, self.slots)
        # After prefill a slot knows context_len + 1 tokens: the prompt and the sampled first
        # token, which is not in the cache yet. Replace the latter by the synthetic next token
        # so that an n-gram lookup continues the pattern.
        self.known = context_len + 1
        engine.token_ids[self.slots, context_len] = np.array([row[context_len] for row in ids])

    def time_step(self, point: tuple[int, int]) -> float:
        """Wall ms of one engine step at (B, K); refuses a draft that proposed fewer than K."""
        b, k = point
        rows = self.slots[:b]
        results: list[StepResult] = []
        elapsed_ms = _timed_ms(
            self.engine.device,
            lambda: results.append(self.engine.step(rows, np.full(b, k, dtype=np.int64))),
        )
        _truncate(self.engine, rows, self.known)
        drafted = int(results[0].num_drafted.min(initial=k))
        if drafted < k:
            raise InputError(
                f"profile: the draft proposed {drafted} of K={k} tokens at context "
                f"{self.context_len}; use longer --context-lens"
            )
        return elapsed_ms

    def time_mixed(
        self, item: MixedItem, rng: np.random.Generator, avoid_ids: Sequence[int]
    ) -> float:
        """Wall ms of one `MixedItem`: a decode step of B rows at K, a prefill of N tokens
        alone (a fresh slot, in one chunk), or both in one step ("separate": `step` then
        `prefill`; "fused": `step_with_prefill`). State is put back after each."""
        kind, b, k, num_tokens = item
        if kind == "decode":
            return self.time_step((b, k))
        engine = self.engine
        if kind == "prefill":
            return time_prefill(engine, rng, avoid_ids, num_tokens)
        vocab = engine.target.config.vocab_size
        slot = np.array(
            [engine.alloc_slot(synthetic_ids(rng, num_tokens, vocab, avoid_ids))], dtype=np.int64
        )
        rows, spec, chunk = self.slots[:b], np.full(b, k, dtype=np.int64), np.array([num_tokens])
        if kind == "fused":
            elapsed_ms = _timed_ms(
                engine.device, lambda: engine.step_with_prefill(rows, spec, slot, chunk)
            )
        elif kind == "separate":
            elapsed_ms = _timed_ms(
                engine.device, lambda: (engine.step(rows, spec), engine.prefill(slot, chunk))
            )
        else:
            raise ValueError(f"unknown mixed-step item kind {kind!r}")
        _truncate(engine, rows, self.known)
        engine.free_slot(int(slot[0]))
        return elapsed_ms

    def free(self) -> None:
        for slot in self.slots:
            self.engine.free_slot(int(slot))


# One timed unit of `time_mixed_steps`: (kind, B, K, N). kind "decode": a step of B rows at K
# (N = 0); "prefill": N prompt tokens alone (B = K = 0); "separate" / "fused": both in a step.
MixedItem = tuple[str, int, int, int]


def time_mixed_steps(
    engine: SpecDecodeEngine,
    config: ProfileConfig,
    items: Sequence[MixedItem],
    context_len: int,
    on_progress: Advance | None = None,
    rng: np.random.Generator | None = None,
) -> dict[MixedItem, list[float]]:
    """Timed samples of every item, `config.num_warmup` untimed then `config.num_iters` timed
    rounds, each item once per round in a fresh random order (so samples of one round are
    paired: a mixed step minus its decode step is that round's added cost of the chunk).
    Decode rows hold `context_len` tokens; the engine needs max(config B) + 1 slots. `rng`:
    synthetic ids and orders (default: seeded by `config.seed`)."""
    rng = np.random.default_rng(config.seed) if rng is None else rng
    avoid = special_ids(engine.target)
    decode = DecodeSlots(engine, config, rng, avoid, context_len)
    try:
        return _timed_rounds(
            lambda item: decode.time_mixed(item, rng, avoid),
            list(items),
            config,
            rng,
            on_round=None
            if on_progress is None
            else functools.partial(_round_done, on_progress, "mixed steps", 0),
        )
    finally:
        decode.free()


def _timed_rounds(
    time_one_ms: Callable[[Point], float],
    todo: Sequence[Point],
    config: ProfileConfig,
    rng: np.random.Generator,
    on_round: Callable[[int], None] | None = None,
) -> dict[Point, list[float]]:
    """`num_warmup` untimed then `num_iters` timed rounds; each round times every point once,
    in a fresh random order. Returns the timed samples per point."""
    samples: dict[Point, list[float]] = {point: [] for point in todo}
    for round_index in range(config.num_warmup + config.num_iters):
        for index in rng.permutation(len(todo)):
            point = todo[int(index)]
            elapsed_ms = time_one_ms(point)
            if round_index >= config.num_warmup:
                samples[point].append(elapsed_ms)
        if on_round is not None:
            on_round(round_index)
    return samples


# Fewest points per round whose median can stand for the round's speed (`divide_round_drift`)
MIN_POINTS_FOR_ROUND_SPEED = 4


def divide_round_drift(
    samples: dict[Point, list[float]],
) -> tuple[dict[Point, list[float]], list[float]]:
    """(the samples of `_timed_rounds` each divided by its round's speed, the round speeds).

    A round's speed is the median over its points of sample / that point's median over all
    rounds (> 1: slower). A shared machine drifts by more within a context's rounds than one
    point's steps scatter (10-second means of a fixed step moved by 10% within two minutes:
    benchmarks/machine_drift.py); every point of a round shares that drift, so dividing it out
    leaves each point's own noise, which is what the spread check is for, and steadier medians.
    With fewer than MIN_POINTS_FOR_ROUND_SPEED points the samples stay as they are (speeds 1)."""
    keys = list(samples)
    table = np.array([samples[key] for key in keys], dtype=np.float64)  # [points, rounds]
    if len(keys) < MIN_POINTS_FOR_ROUND_SPEED:
        return samples, [1.0] * table.shape[1]
    speeds = np.median(table / np.median(table, axis=1, keepdims=True), axis=0)  # [rounds]
    steady = table / speeds[None, :]  # [points, rounds]
    return {key: steady[i].tolist() for i, key in enumerate(keys)}, speeds.tolist()


def _round_done(on_progress: Advance | None, label: str, uncounted: int, round_index: int) -> None:
    """Progress of one timing round; the first round of a pass that `num_units` did not count
    adds that pass's `uncounted` rounds to the total."""
    if on_progress is not None:
        on_progress(f"{label} round {round_index + 1}", uncounted if round_index == 0 else 0)


def measure_decode(
    engine: SpecDecodeEngine,
    config: ProfileConfig,
    rng: np.random.Generator,
    avoid_ids: Sequence[int],
    on_progress: Advance | None = None,
    quality: dict[str, Any] | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> list[LatencyPoint]:
    """ITL points for every (context, B, K) of the config (see the module docstring); at
    `batch_sizes` instead of the config's when given (adaptive refinement, whose rounds
    `ProfileConfig.num_units` does not count, nor those of re-measure passes).

    Per context length: after warm-up at the most expensive point, every round times each
    (B, K) once in a fresh random order, so drift on a shared machine spreads over all points
    instead of biasing one K, and each sample is divided by its round's speed
    (`divide_round_drift`): a point's figures are at the pass's median speed. When
    `check_latency` flags any point, every point of that context is timed again in fresh rounds
    (a pass), up to `config.max_remeasure` times, and the pass with the fewest problems is kept
    (the later on ties): re-timing only the flagged points would time them in another stretch
    of the machine's drift than the points they are compared with. `quality` (a dict) receives
    what was done: warm-up steps, the points that failed a pass that was then timed again, and
    the range of the kept passes' round speeds.
    """
    record = quality if quality is not None else {}
    warmup_steps: list[int] = record.setdefault("warmup_steps", [])
    remeasured: list[str] = record.setdefault("remeasured", [])
    round_speeds: list[str] = record.setdefault("round_speeds", [])
    measured_bs = sorted(config.batch_sizes if batch_sizes is None else batch_sizes)
    keys = [(b, k) for b in measured_bs for k in sorted(config.spec_tokens)]
    points: list[LatencyPoint] = []
    for context_len in sorted(config.context_lens):
        slots = DecodeSlots(engine, config, rng, avoid_ids, context_len)
        heaviest = (max(measured_bs), config.k_max)
        warmup_steps.append(
            warm_up(functools.partial(slots.time_step, heaviest), config.num_warmup)
        )
        label = f"ITL ctx={context_len}"
        kept: list[LatencyPoint] = []  # the pass with the fewest problems so far
        kept_problems = math.inf
        kept_speeds: list[float] = []
        for attempt in range(config.max_remeasure + 1):
            pass_label = label if attempt == 0 else f"{label} re-measure {attempt}"
            counted = attempt == 0 and batch_sizes is None
            uncounted = 0 if counted else config.num_warmup + config.num_iters
            progress = functools.partial(_round_done, on_progress, pass_label, uncounted)
            samples = _timed_rounds(slots.time_step, keys, config, rng, progress)
            steady, speeds = divide_round_drift(samples)
            found = [latency_point(b, k, slots.known, steady[(b, k)]) for b, k in keys]
            problems = check_latency(found, config.quality_limits)
            if len(problems) <= kept_problems:
                kept, kept_problems, kept_speeds = found, len(problems), speeds
            if not problems or attempt == config.max_remeasure:
                break
            remeasured += dict.fromkeys(problem.point for problem in problems)
        points += kept
        round_speeds.append(
            f"ctx={slots.known} B={','.join(map(str, measured_bs))}: "
            f"{min(kept_speeds):.2f}-{max(kept_speeds):.2f}"
        )
        slots.free()
    return points


# Most refinement rounds of adaptive profiling (each adds at most two batch sizes)
MAX_REFINE_ROUNDS = 8


def next_batch_sizes(
    latency: Sequence[LatencyPoint], k_max: int, target_pct: float
) -> tuple[tuple[int, ...], float]:
    """(batch sizes to measure next, worst held-out |error| % now) for adaptive profiling.

    Every interior profiled B is left out and predicted from the others by the ITL table
    (`sim.models.latency.leave_one_knot_out`); if the worst |error| exceeds `target_pct`, the curve
    bends there: the geometric midpoints between that B and its two neighbours are proposed
    (those not yet measured; none once neighbours are adjacent integers). ((), error) when done.
    """
    profile = Profile(k_max=k_max, latency=tuple(latency), acceptance_rates=(0.0,) * k_max)
    knots = leave_one_knot_out(profile, "table")
    if not knots:
        return (), 0.0
    worst = max(knots, key=lambda knot: abs(knot.worst[1]))
    error = abs(worst.worst[1])
    if error <= target_pct:
        return (), error
    measured = profile.batch_sizes()
    index = measured.index(worst.batch_size)
    low, mid, high = measured[index - 1], measured[index], measured[index + 1]
    candidates = {round(math.sqrt(low * mid)), round(math.sqrt(mid * high))}
    return tuple(sorted(b for b in candidates if low < b < high and b not in measured)), error


def refine_batch_sizes(
    engine: SpecDecodeEngine,
    config: ProfileConfig,
    latency: list[LatencyPoint],
    rng: np.random.Generator,
    avoid_ids: Sequence[int],
    on_progress: Advance | None,
    quality: dict[str, Any],
) -> list[LatencyPoint]:
    """`latency` plus the points adaptive profiling adds (`next_batch_sizes` each round) until
    the target holds, the budget is spent, no B is left to add, or MAX_REFINE_ROUNDS; what it
    did goes to `quality["adaptive"]`."""
    target = config.adaptive_target_pct
    if target is None:
        return latency
    started = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    record = {"target_pct": target, "budget_s": config.adaptive_budget_s, "rounds": rounds}
    quality["adaptive"] = record
    while len(rounds) < MAX_REFINE_ROUNDS:
        added, worst = next_batch_sizes(latency, config.k_max, target)
        spent = time.perf_counter() - started
        rounds.append({"worst_held_out_pct": worst, "added": list(added), "elapsed_s": spent})
        if not added or spent >= config.adaptive_budget_s:
            break
        latency = latency + measure_decode(
            engine, config, rng, avoid_ids, on_progress, quality, batch_sizes=added
        )
    record["met"] = rounds[-1]["worst_held_out_pct"] <= target
    return latency


def special_ids(target: Transformer) -> list[int]:
    """The target's EOS and BOS ids, sorted: synthetic prompts avoid them (an EOS inside a
    prompt would read as a stop)."""
    config = target.config
    specials = set(config.eos_token_ids) | ({config.bos_token_id} - {None})
    return sorted(int(token) for token in specials if token is not None)


def latency_point(b: int, k: int, context_len: int, samples_ms: list[float]) -> LatencyPoint:
    median, p10, p90 = _percentiles(samples_ms)
    return LatencyPoint(
        batch_size=b,
        num_spec_tokens=k,
        median_ms=max(median, 1e-6),
        context_len=context_len,
        p10_ms=max(p10, 1e-6),
        p90_ms=max(p90, 1e-6),
        n=len(samples_ms),
        mean_ms=max(float(np.mean(samples_ms)), 1e-6),
    )


def time_prefill(
    engine: SpecDecodeEngine, rng: np.random.Generator, avoid_ids: Sequence[int], num_tokens: int
) -> float:
    """Wall ms of one prefill of a synthetic prompt of `num_tokens` tokens in one chunk."""
    vocab = engine.target.config.vocab_size
    slot = engine.alloc_slot(synthetic_ids(rng, num_tokens, vocab, avoid_ids))
    elapsed_ms = _timed_ms(
        engine.device,
        lambda: engine.prefill(
            np.array([slot], dtype=np.int64), np.array([num_tokens], dtype=np.int64)
        ),
    )
    engine.free_slot(slot)
    return elapsed_ms


def prefill_point(num_tokens: int, samples_ms: list[float]) -> PrefillPoint:
    return PrefillPoint(
        num_tokens=num_tokens,
        median_ms=max(_percentiles(samples_ms)[0], 1e-6),
        n=len(samples_ms),
        mean_ms=max(float(np.mean(samples_ms)), 1e-6),
    )


def measure_prefill_in_decode(
    engine: SpecDecodeEngine,
    config: ProfileConfig,
    rng: np.random.Generator,
    on_progress: Advance | None = None,
) -> list[PrefillInDecodePoint]:
    """What a prefill chunk of each `config.prefill_token_counts` size adds to a decode step
    (K = 0) of the smallest and the largest profiled B, when both run in one forward
    (`step_with_prefill`): per round the mixed step minus the decode step, paired, then the
    median. Decode rows hold min(context_lens) tokens. Needs the reference step (a fixed-shape
    fast path step has no room for chunks) and max(B) + 1 slots."""
    rows = sorted({min(config.batch_sizes), max(config.batch_sizes)})
    sizes = sorted(config.prefill_token_counts)
    items: list[MixedItem] = [("decode", d, 0, 0) for d in rows]
    items += [("fused", d, 0, n) for d in rows for n in sizes]
    samples = time_mixed_steps(engine, config, items, min(config.context_lens), on_progress, rng)
    points = []
    for d in rows:
        decode = np.asarray(samples[("decode", d, 0, 0)])
        for n in sizes:
            added = np.asarray(samples[("fused", d, 0, n)]) - decode  # [rounds], paired
            points.append(in_decode_point(d, n, added.tolist()))
    return points


def in_decode_point(
    decode_rows: int, num_tokens: int, added_ms: list[float]
) -> PrefillInDecodePoint:
    """A prefill-in-decode point from per-round added times (the median, >= 0)."""
    return PrefillInDecodePoint(
        num_tokens=num_tokens,
        decode_rows=decode_rows,
        added_ms=max(float(np.median(added_ms)), 0.0),
        n=len(added_ms),
    )


def measure_prefill(
    engine: SpecDecodeEngine,
    config: ProfileConfig,
    rng: np.random.Generator,
    avoid_ids: Sequence[int],
    on_progress: Advance | None = None,
) -> list[PrefillPoint]:
    """One prefill point per prompt size: a whole prompt in one chunk, batch size 1. Sizes are
    timed in a fresh random order each round; a prefill that falls as the prompt grows is
    measured again (all sizes) up to `config.max_remeasure` times."""
    sizes = sorted(config.prefill_token_counts)
    time_size = functools.partial(time_prefill, engine, rng, avoid_ids)
    points: list[PrefillPoint] = []
    for attempt in range(config.max_remeasure + 1):
        samples = _timed_rounds(time_size, sizes, config, rng)
        points = [prefill_point(size, samples[size]) for size in sizes]
        if on_progress is not None:
            on_progress(f"prefill, pass {attempt + 1}", 0 if attempt == 0 else 1)
        if not check_prefill(points, config.quality_limits):
            break
    return points


def measure_acceptance(
    engine: SpecDecodeEngine,
    prompts: Sequence[IntArray],
    output_lens: Sequence[int],
    k_max: int,
    eos_token_ids: Sequence[int] = (),
    on_progress: Advance | None = None,
) -> AcceptanceCounts:
    """Run every prompt at K = k_max (continuous batching over the engine's slots).

    Each row that asks for k_max drafts counts one (d, a): d = the drafts it got
    (`StepResult.num_drafted`; below k_max when an n-gram lookup finds fewer), a = accepted.
    """
    if len(prompts) != len(output_lens) or not prompts:
        raise InputError("acceptance: need one output length per prompt and at least one prompt")
    num_requests = len(prompts)
    # [R, k_max + 1, k_max + 1] per request: steps at k_max that drafted d and accepted a
    joint = np.zeros((num_requests, k_max + 1, k_max + 1), dtype=np.int64)
    eos = np.asarray(list(eos_token_ids), dtype=np.int64)
    waiting = list(range(num_requests))
    running: dict[int, int] = {}  # request -> slot
    outputs: list[IntArray] = [np.zeros(0, dtype=np.int64)] * num_requests
    num_steps = 0
    num_output_tokens = 0
    limit = engine.config.max_model_len
    while waiting or running:
        while waiting and engine.num_free_slots:
            req = waiting.pop(0)
            running[req] = engine.alloc_slot(prompts[req])
        reqs = list(running)
        slots = np.array([running[r] for r in reqs], dtype=np.int64)
        _prefill_all(engine, slots)
        # Each row drafts k_max, fewer near max_model_len so the step stays inside the cache.
        room = limit - engine.num_tokens[slots]  # [B]
        spec = np.clip(room - 1, 0, k_max).astype(np.int64)  # [B]
        result = engine.step(slots, spec)
        num_steps += 1
        num_output_tokens += int((result.num_accepted + 1).sum())
        rows = np.arange(len(reqs))
        # Count only rows that asked for the full k_max: then every position is asked for
        # equally often and the unconditional rates cannot rise with position. A row that got
        # fewer drafts (d < k_max) still counts: r_i and s_i are over all steps that asked.
        full = spec == k_max  # [B]
        req_index = np.array(reqs, dtype=np.int64)[full]  # [F]
        np.add.at(joint, (req_index, result.num_drafted[full], result.num_accepted[full]), 1)
        for row in rows:
            req, slot = reqs[row], int(slots[row])
            emitted = result.emitted(int(row))
            num_out = int(engine.num_tokens[slot]) - len(prompts[req])
            stopped = eos.size > 0 and bool(np.isin(emitted, eos).any())
            if num_out >= output_lens[req] or stopped or engine.num_tokens[slot] >= limit - 1:
                known = int(engine.num_tokens[slot])
                outputs[req] = np.array(engine.token_ids[slot, len(prompts[req]) : known])
                engine.free_slot(slot)
                del running[req]
                if on_progress is not None:
                    on_progress(f"acceptance request {req}")
    positions = range(1, k_max + 1)
    # [R, k_max] steps per request with d >= i and with a >= i (suffix sums of the joint)
    drafted = np.stack([joint[:, i:, :].sum(axis=(1, 2)) for i in positions], axis=1)
    accepted = np.stack([joint[:, :, i:].sum(axis=(1, 2)) for i in positions], axis=1)
    steps = joint.sum(axis=(1, 2))  # [R] steps at k_max per request
    per_request: list[tuple[float, ...]] = []
    outcomes: list[tuple[tuple[int, ...], ...]] = []
    sampled: list[int] = []
    for req in range(num_requests):
        # A request that never asked for k_max drafts (too short) gives no sample.
        if steps[req] == 0:
            continue
        per_request.append(tuple(float(a) / float(steps[req]) for a in accepted[req]))
        outcomes.append(lower_triangular_rows(joint[req]))
        sampled.append(req)
    return AcceptanceCounts(
        drafted_at_pos=tuple(int(v) for v in drafted.sum(axis=0)),
        accepted_at_pos=tuple(int(v) for v in accepted.sum(axis=0)),
        per_request_rates=tuple(per_request),
        num_steps=num_steps,
        num_output_tokens=num_output_tokens,
        num_steps_at_k_max=int(steps.sum()),
        draft_outcomes=tuple(outcomes),
        outcome_requests=tuple(sampled),
        output_ids=tuple(outputs),
    )


def profile_pair(
    target: Transformer,
    draft: AnyDraft | None,
    config: ProfileConfig,
    prompts: Sequence[IntArray],
    output_lens: Sequence[int],
    metadata: dict[str, Any] | None = None,
    on_progress: Advance | None = None,
    prompt_keys: Sequence[str] | None = None,
) -> Profile:
    """Measure decode ITL, prefill and acceptance of one pair -> a Profile.

    `prompts` / `output_lens`: the acceptance prompt set as token ids (the CLI tokenizes).
    `prompt_keys`: per prompt, `traces.workload.prompt_key` of its text ("" for none), kept
    beside each request's draft outcomes. `metadata` is merged over the environment's
    (device, dtype, versions, date).
    """
    if prompt_keys is not None and len(prompt_keys) != len(prompts):
        raise ValueError(f"{len(prompt_keys)} prompt keys for {len(prompts)} prompts")
    if draft is None:
        raise InputError("profile: a draft is needed (K > 0 is profiled)")
    k_max = config.k_max
    longest_request = max(len(p) + int(n) for p, n in zip(prompts, output_lens, strict=True))
    max_model_len = max(
        max(config.context_lens) + k_max + 2,
        max(config.prefill_token_counts) + 2,
        longest_request + 1,
    )
    engine = build_spec_decode_engine(
        target,
        draft,
        SpecDecodeConfig(
            # one more than max(B): a prefill chunk beside max(B) decode rows
            num_slots=max(config.batch_sizes) + 1,
            max_model_len=max_model_len,
            k_max=k_max,
            temperature=config.temperature,
            seed=config.seed,
        ),
        fast_path=config.fast_path,
    )
    rng = np.random.default_rng(np.random.SeedSequence(config.seed))
    avoid = special_ids(target)
    quality: dict[str, Any] = {"load_before": load_average()}
    latency = measure_decode(engine, config, rng, avoid, on_progress, quality)
    latency = refine_batch_sizes(engine, config, latency, rng, avoid, on_progress, quality)
    prefill = measure_prefill(engine, config, rng, avoid, on_progress)
    in_decode: list[PrefillInDecodePoint] = []
    if engine_prefill_forward(config.fast_path) == "fused":
        in_decode = measure_prefill_in_decode(engine, config, rng, on_progress)
    problems = check_latency(latency, config.quality_limits) + check_prefill(
        prefill, config.quality_limits
    )
    quality.update(
        load_after_timing=load_average(),
        limits=dataclasses.asdict(config.quality_limits),
        problems=[str(problem) for problem in problems],
    )
    if problems and not config.allow_noisy:
        raise ProfileQualityError(
            f"profile: timing still noisy or non-monotonic after {config.max_remeasure} "
            f"re-measurements: {problems_line(problems)} (quiet the machine, or "
            "--allow-noisy-profile to keep it)"
        )
    counts = measure_acceptance(
        engine, prompts, output_lens, k_max, config.eos_token_ids, on_progress
    )
    if counts.num_steps_at_k_max == 0:
        raise InputError(
            "acceptance: no step asked for K_max drafts (prompts too close to max_model_len?)"
        )
    sequences: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    if config.temperature == 0:
        # Greedy: what the draft proposes and the target accepts at each output position is a
        # function of the prompt and the outputs alone, for any K (`sim.models.replay`)
        sampled = counts.outcome_requests
        recording = replay_recording(
            draft,
            [np.asarray(prompts[req]) for req in sampled],
            [counts.output_ids[req] for req in sampled],
            max_model_len,
            cap=k_max,
        )
        sequences = tuple(
            (tuple(int(v) for v in available), tuple(int(v) for v in matched))
            for available, matched in zip(recording.available, recording.matched, strict=True)
        )
    # Over every step that asked for k_max: r_i = P(a >= i), s_i = P(d >= i).
    rates = tuple(a / counts.num_steps_at_k_max for a in counts.accepted_at_pos)
    draft_rates = tuple(d / counts.num_steps_at_k_max for d in counts.drafted_at_pos)
    info = environment_metadata(engine.device, engine.dtype)
    info["forward_tokens"] = forward_tokens(target)
    info["quality"] = quality
    del engine  # free its KV cache before the loop runs build their own
    info.update(
        {
            "fast_path": config.fast_path,
            "batch_sizes": list(config.batch_sizes),
            "spec_tokens": list(config.spec_tokens),
            "context_lens": list(config.context_lens),
            "num_warmup": config.num_warmup,
            "num_iters": config.num_iters,
            "seed": config.seed,
            # how the prefill_in_decode points were measured (absent: not measured, the fast
            # path runs prefill as a forward of its own)
            **(
                {
                    "prefill_in_decode": {
                        "context_len": min(config.context_lens),
                        "decode_rows": sorted({p.decode_rows for p in in_decode}),
                        "k": 0,
                    }
                }
                if in_decode
                else {}
            ),
            "acceptance": {
                "num_requests": len(prompts),
                "num_steps": counts.num_steps,
                "num_output_tokens": counts.num_output_tokens,
                "k": k_max,
            },
        }
    )
    info.update(metadata or {})
    profile = Profile(
        k_max=k_max,
        latency=tuple(latency),
        acceptance_rates=rates,
        drafted_at_pos=counts.drafted_at_pos,
        accepted_at_pos=counts.accepted_at_pos,
        prefill=tuple(prefill),
        prefill_in_decode=tuple(in_decode),
        per_request_rates=counts.per_request_rates,
        temperature=config.temperature,
        host_overhead=None,
        draft_rates=draft_rates,
        num_acceptance_steps=counts.num_steps_at_k_max,
        draft_outcomes=counts.draft_outcomes,
        draft_outcome_keys=(
            ()
            if prompt_keys is None
            else tuple(str(prompt_keys[req]) for req in counts.outcome_requests)
        ),
        draft_sequences=sequences,
        metadata=info,
    )
    if config.host_overhead_output_len == 0:
        return profile
    # The learning policies are timed built on this very profile (their tables read it)
    from dsd.backend.host_overhead import measure_host_overhead  # imports this module

    host_overhead, _samples, policy_samples_us = measure_host_overhead(
        target, draft, config, on_progress, profile if config.time_policy_host else None
    )
    info["host_overhead"] = {
        "prompt_len": min(config.context_lens),
        "output_len": config.host_overhead_output_len,
        "requests_per_run": "2 x B",
        "policies": ["static:0", f"static:{k_max}"],
    }
    if policy_samples_us:
        baseline = f"static:{k_max}"
        host_overhead = dataclasses.replace(
            host_overhead, policies=fit_policy_host_lines(policy_samples_us, baseline)
        )
        info["host_overhead"]["policy_steps"] = {
            "timed": "one policy in turn after each step of the runs above, D = B",
            "baseline": baseline,
            "samples": {
                spec: sum(len(v) for (name, _d), v in policy_samples_us.items() if name == spec)
                for spec in (baseline, *TIMED_POLICIES)
            },
        }
    return dataclasses.replace(profile, host_overhead=host_overhead)


def dataset_prompts(
    pair: ModelPair,
    dataset: str,
    *,
    num_prompts: int | None,
    output_len: int | None,
    seed: int,
) -> tuple[list[IntArray], list[int], list[str]]:
    """The acceptance prompt set as token ids, output lengths and prompt keys: the dataset's
    prompts chat-templated and tokenized when the target names a tokenizer, else synthetic ids
    of the dataset's lengths (special ids avoided; key "")."""
    workload = build_workload(dataset, num_prompts=num_prompts, seed=seed, output_len=output_len)
    config = pair.target.config
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
    avoid = special_ids(pair.target)
    tokenize = pair.tokenize
    prompts, keys = [], []
    for request in workload.requests:
        if tokenize is not None and request.prompt:
            prompts.append(np.asarray(tokenize(request.prompt), dtype=np.int64))
            keys.append(request.prompt_key or "")
        else:
            prompts.append(synthetic_ids(rng, request.prompt_len, config.vocab_size, avoid))
            keys.append("")
    return prompts, [max(2, r.output_len) for r in workload.requests], keys
