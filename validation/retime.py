"""Re-timing a profile around a validation's real runs (`TimingRounds`).

A profile timed before an hour of real runs prices them at another speed than the machine ran
them at; this module times the profile's points again between the runs, the profiler's way, so
the simulated side of every cell is priced by the same stretch of the machine's time
(docs/validation.md says why and how much it matters). It is not the profiler: it re-times
points a profile already has.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dsd.backend.engine import AnyDraft, SpecDecodeConfig
from dsd.backend.executor import engine_prefill_forward
from dsd.backend.fast_path import build_spec_decode_engine
from dsd.backend.model import Transformer
from dsd.backend.profiler import (
    DecodeSlots,
    ProfileConfig,
    in_decode_point,
    latency_point,
    prefill_point,
    special_ids,
    time_prefill,
    warm_up,
)
from dsd.common.errors import InputError
from dsd.policies.profile import (
    Profile,
)


class TimingRounds:
    """A profile's decode, prefill and prefill-in-decode points timed again between the real
    runs of a validation.

    A shared machine drifts (docs/validation.md, "Re-timing"), so a profile timed before an
    hour of real runs prices them at another speed than they ran at. So `dsd validate` calls
    `round()` before the first real run and after every one: each round times a random `share`
    of the profile's decode points (B, K, context) and prefill sizes, the profiler's way (same
    slots, same truncation), in a fresh random order. `profile()` is the profile with those
    samples in place of its own timing: measured over the same stretch of the machine's time as
    the runs, it is what the simulator's latency model for them is fitted from (policies keep
    the profile they ran with). The drift is faster than a run, though, so while a closed-loop
    run steps, `probe()` also times one decode point between its steps into a round of its own
    (`open_window()`). `speed(rounds)` says how fast the machine ran in some rounds against the
    whole: the median over their samples of sample / that point's median over all rounds
    (> 1: slower). The points are timed on the runs' decode path (`fast_path`), each step shape
    run once before any round (a CUDA graph's capture is no sample).
    """

    def __init__(
        self,
        target: Transformer,
        draft: AnyDraft | None,
        profile: Profile,
        *,
        share: float = 0.25,
        seed: int = 0,
        fast_path: str = "off",
    ) -> None:
        contexts = sorted({p.context_len for p in profile.latency if p.context_len})
        if not contexts or any(p.context_len is None for p in profile.latency):
            raise InputError("timing rounds: the profile records no context for its points")
        if not 0 < share <= 1:
            raise InputError(f"timing rounds: share must be in (0, 1], got {share}")
        self.base = profile
        self.share = share
        self.decode_keys = sorted(
            {(p.context_len or 0, p.batch_size, p.num_spec_tokens) for p in profile.latency}
        )
        self.prefill_sizes = sorted({p.num_tokens for p in profile.prefill})
        # (decode rows, chunk tokens) of the prefill-in-decode points, timed as the profiler
        # does: a fused step beside rows of the shortest context, minus the decode step alone
        # (on a path that runs no fused steps the runs pay no such cost: nothing to time)
        self.in_decode_keys = (
            sorted({(p.decode_rows, p.num_tokens) for p in profile.prefill_in_decode})
            if engine_prefill_forward(fast_path) == "fused"
            else []
        )
        k_max = max(k for _c, _b, k in self.decode_keys)
        batch_sizes = sorted({b for _c, b, _k in self.decode_keys})
        # The profiler records known tokens (context + the first sampled token) per row
        contexts_in_cache = [context - 1 for context in contexts]
        config = ProfileConfig(
            batch_sizes=tuple(batch_sizes) if 1 in batch_sizes else (1, *batch_sizes),
            spec_tokens=tuple(sorted({0, 1, k_max})),
            context_lens=tuple(contexts_in_cache),
        )
        engine = build_spec_decode_engine(
            target,
            draft if k_max > 0 else None,
            SpecDecodeConfig(
                # max(B) decode slots per context, and one for a prefill
                num_slots=max(batch_sizes) * len(contexts) + 1,
                max_model_len=max(
                    max(contexts) + k_max + 2,
                    max(self.prefill_sizes, default=1) + 2,
                    max((n for _d, n in self.in_decode_keys), default=1) + 2,
                ),
                k_max=max(k_max, 1),
                seed=seed,
            ),
            fast_path,
        )
        self._engine = engine
        self._rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
        avoid = special_ids(target)
        self._avoid = avoid
        self._slots = {
            context: DecodeSlots(engine, config, self._rng, avoid, context - 1)
            for context in contexts
        }
        for slots in self._slots.values():
            warm_up(functools.partial(slots.time_step, (max(batch_sizes), k_max)), 3)
        if fast_path != "off":  # every fixed shape once: captures happen here, not in a round
            for context, b, k in self.decode_keys:
                self._slots[context].time_step((b, k))
        self._decode: dict[tuple[int, int, int], list[tuple[int, float]]] = {
            key: [] for key in self.decode_keys
        }
        self._prefill: dict[int, list[tuple[int, float]]] = {n: [] for n in self.prefill_sizes}
        self._in_decode: dict[tuple[int, int], list[tuple[int, float]]] = {
            key: [] for key in self.in_decode_keys
        }
        self._probe_cycles: dict[int, list[tuple[int, int, int]]] = {}
        self.num_rounds = 0  # round indices handed out, windows included
        self.num_windows = 0

    def round(self) -> int:
        """Time a random share of the points once each (shuffled); returns the round's index."""
        index = self.num_rounds
        todo: list[tuple[str, Any]] = [("decode", key) for key in self.decode_keys]
        todo += [("prefill", size) for size in self.prefill_sizes]
        todo += [("in_decode", key) for key in self.in_decode_keys]
        count = max(1, math.ceil(self.share * len(todo)))
        for choice in self._rng.permutation(len(todo))[:count]:
            kind, key = todo[int(choice)]
            if kind == "decode":
                context, b, k = key
                self._decode[key].append((index, self._slots[context].time_step((b, k))))
            elif kind == "in_decode":
                rows, num_tokens = key
                slots = self._slots[min(self._slots)]
                decode_ms = slots.time_step((rows, 0))
                fused = ("fused", rows, 0, num_tokens)
                added_ms = slots.time_mixed(fused, self._rng, self._avoid) - decode_ms
                self._in_decode[key].append((index, added_ms))
            else:
                elapsed_ms = time_prefill(self._engine, self._rng, self._avoid, key)
                self._prefill[key].append((index, elapsed_ms))
        self.num_rounds += 1
        return index

    def open_window(self) -> int:
        """A new round that times nothing itself: `probe()` fills it while a real run steps
        (`validation.cells`); returns its index."""
        self.num_rounds += 1
        self.num_windows += 1
        return self.num_rounds - 1

    def probe(self, window: int, max_batch: int) -> float:
        """Time the next of the decode points with B <= max_batch (each once, in a shuffled
        cycle per max_batch) into round `window`; returns the wall ms it took, timing
        included. A run's steps interleaved with these probes see the machine at the same
        moments, so `speed([window])` is the machine's speed during that run."""
        cycle = self._probe_cycles.get(max_batch)
        if not cycle:
            keys = [key for key in self.decode_keys if key[1] <= max(max_batch, 1)]
            cycle = [keys[int(i)] for i in self._rng.permutation(len(keys))]
            self._probe_cycles[max_batch] = cycle
        key = cycle.pop()
        context, b, k = key
        start_s = time.perf_counter()
        self._decode[key].append((window, self._slots[context].time_step((b, k))))
        return (time.perf_counter() - start_s) * 1000.0

    def profile(self) -> Profile:
        """The base profile with every point's timing from the rounds (points no round timed
        keep the base's)."""
        latency = []
        for point in self.base.latency:
            context = point.context_len or 0
            key = (context, point.batch_size, point.num_spec_tokens)
            samples = [ms for _round, ms in self._decode[key]]
            latency.append(
                latency_point(point.batch_size, point.num_spec_tokens, context, samples)
                if samples
                else point
            )
        prefill = []
        for base_prefill in self.base.prefill:
            size = base_prefill.num_tokens
            samples = [ms for _round, ms in self._prefill[size]]
            prefill.append(prefill_point(size, samples) if samples else base_prefill)
        in_decode = []
        for base_in_decode in self.base.prefill_in_decode:
            rows_tokens = (base_in_decode.decode_rows, base_in_decode.num_tokens)
            samples = [ms for _round, ms in self._in_decode.get(rows_tokens, [])]
            in_decode.append(in_decode_point(*rows_tokens, samples) if samples else base_in_decode)
        metadata = dict(self.base.metadata)
        # The prefill samples in round order, kept because the mean prices TTFT and one slow
        # sample moves it: on the H200 (results/gpu/2026-11-27-h200) the rounds' prefill means
        # sat 3-5 ms above their medians, where the runs' prefills showed no such tail.
        metadata["timing_rounds"] = {
            **self.counts(),
            "prefill_samples_ms": {
                str(size): [round(ms, 4) for _round, ms in samples]
                for size, samples in self._prefill.items()
            },
        }
        return dataclasses.replace(
            self.base,
            latency=tuple(latency),
            prefill=tuple(prefill),
            prefill_in_decode=tuple(in_decode),
            metadata=metadata,
        )

    def counts(self) -> dict[str, Any]:
        """What was timed so far: timing rounds (windows not counted), their share of the
        points, and the probed runs (one window each; runs interleaved share one)."""
        return {
            "rounds": self.num_rounds - self.num_windows,
            "share": self.share,
            "probed_runs": self.num_windows,
        }

    def speed(self, rounds: Sequence[int]) -> float:
        """Median of sample / its point's median over all rounds, over the samples taken in
        `rounds` (> 1: the machine ran slower then than over the whole); NaN without any."""
        wanted = set(rounds)
        ratios = []
        for samples in [*self._decode.values(), *self._prefill.values()]:
            if not samples:
                continue
            median = float(np.median([ms for _round, ms in samples]))
            ratios += [ms / median for round_index, ms in samples if round_index in wanted]
        return float(np.median(ratios)) if ratios else float("nan")

    def free(self) -> None:
        for slots in self._slots.values():
            slots.free()
