"""Switching-aware control: a wrapper that stops a batch-level policy's K from flapping.

A table policy switches K at fixed batch-size edges. In a live engine B wanders by a request or
two around an edge from step to step, and every crossing flips K (and, on a real engine, the
CUDA graph / draft shape), although the two K are nearly equally good there.
`HysteresisPolicy` (SPEC `hysteresis:BASE`) wraps any batch-level base policy whose `choose_k`
is a pure function of the view (not the bandit, which samples): K follows the base only when
its answer is clear over a band of B around the current one (`margin`), at most once per
`min_dwell` steps, and under next-step K timing the base is asked about the predicted next B
(`lookahead`). The rules: docs/policies.md, "hysteresis".

A K above `view.k_max` is always clamped at once (the engine cannot run it), dwell or not. The
wrapper does not change what the base learns: `observe` is passed through unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dsd.common.errors import InputError, require_int
from dsd.policies.types import MAX_NUM_SEQS, KPolicy, StepFeedback, StepView

Lookahead = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class HysteresisConfig:
    """Knobs of the wrapper (SPEC `hysteresis:BASE[:margin=...,min_dwell=...]`)."""

    # Half-width of the B band, as a fraction of B, inside which the current K may be kept.
    margin: float = 0.15
    # Steps a new K is held before it may change again (0: no dwell).
    min_dwell: int = 4
    # Ask the base about the predicted next B: "auto" under next-step K timing only.
    lookahead: Lookahead = "auto"
    # Weight of the newest step-to-step B change in the trend average, in (0, 1].
    trend_smoothing: float = 0.3

    def __post_init__(self) -> None:
        if not (np.isfinite(self.margin) and 0.0 <= self.margin < 1.0):
            raise InputError(f"hysteresis: margin must be in [0, 1), got {self.margin}")
        if isinstance(self.min_dwell, bool) or not isinstance(self.min_dwell, int):
            raise InputError(f"hysteresis: min_dwell must be an integer, got {self.min_dwell!r}")
        if self.min_dwell < 0:
            raise InputError(f"hysteresis: min_dwell must be >= 0, got {self.min_dwell}")
        if self.lookahead not in ("auto", "always", "never"):
            raise InputError(
                f"hysteresis: lookahead must be auto, always or never, got {self.lookahead!r}"
            )
        if not (0.0 < self.trend_smoothing <= 1.0):
            raise InputError(
                f"hysteresis: trend_smoothing must be in (0, 1], got {self.trend_smoothing}"
            )


def _single_k(choice: int | np.ndarray, what: str) -> int:
    values = np.unique(np.asarray(choice, dtype=np.int64))
    if values.size > 1:
        raise InputError(f"hysteresis: the base policy chose K per request at {what}")
    return int(values[0]) if values.size else 0


class HysteresisPolicy:
    """Wraps a batch-level policy: keeps K near table edges, dwells, looks one step ahead."""

    def __init__(
        self, base: KPolicy, max_num_seqs: int, config: HysteresisConfig | None = None
    ) -> None:
        require_int(max_num_seqs, "hysteresis: max_num_seqs", 1, MAX_NUM_SEQS)
        self.base = base
        self.max_num_seqs = max_num_seqs
        self.config = config or HysteresisConfig()
        self.current_k: int | None = None  # None until the first step
        self.steps_since_switch = 0  # steps the current K has been in force
        self.num_switches = 0  # K changes made (clamps included)
        self.previous_batch_size: int | None = None
        self.batch_trend = 0.0  # smoothed step-to-step change of B

    def predicted_batch_size(self, view: StepView) -> int:
        """The B the chosen K will be verified at (the next step's, predicted, with lookahead)."""
        lookahead = self.config.lookahead
        use_trend = lookahead == "always" or (lookahead == "auto" and view.k_timing == "next-step")
        predicted = view.batch_size + (self.batch_trend if use_trend else 0.0)
        return int(np.clip(round(predicted), 1, self.max_num_seqs))

    def _base_k(self, view: StepView, batch_size: int) -> int:
        clipped = int(np.clip(batch_size, 1, self.max_num_seqs))
        probe = dataclasses.replace(view, batch_size=clipped)
        return _single_k(self.base.choose_k(probe), f"B={clipped}")

    def choose_k(self, view: StepView) -> int:
        self._update_trend(view.batch_size)
        k_cap = max(view.k_max, 0)
        batch_size = self.predicted_batch_size(view)
        wanted = min(self._base_k(view, batch_size), k_cap)
        current = self.current_k
        if view.num_decode_reqs == 0:
            # No row drafts, so K does nothing this step: it neither makes the first decision
            # (a run's first steps are pure prefill, at a B the decoding batch may never have)
            # nor counts toward a dwell.
            return wanted if current is None else min(current, k_cap)
        k = wanted
        if current is not None and wanted != current:
            if current > k_cap:
                k = k_cap  # the engine cannot run the old K: clamp now
            elif self.steps_since_switch < self.config.min_dwell:
                k = current
            else:
                margin = self.config.margin
                low = self._base_k(view, int(np.floor(batch_size * (1.0 - margin))))
                high = self._base_k(view, int(np.ceil(batch_size * (1.0 + margin))))
                band = (min(low, high, wanted), max(low, high, wanted))
                if band[0] <= current <= band[1]:
                    k = current
        if current is None:
            # The first decision is not a switch: no dwell holds it (a K chosen at a ramp-up
            # step would otherwise be kept into the full batch, where the base wants less).
            self.steps_since_switch = self.config.min_dwell
        elif k != current:
            self.num_switches += 1
            self.steps_since_switch = 0
        self.current_k = k
        self.steps_since_switch += 1
        return k

    def _update_trend(self, batch_size: int) -> None:
        if self.previous_batch_size is not None:
            delta = float(batch_size - self.previous_batch_size)
            weight = self.config.trend_smoothing
            self.batch_trend = (1.0 - weight) * self.batch_trend + weight * delta
        self.previous_batch_size = batch_size

    def observe(self, feedback: StepFeedback) -> None:
        self.base.observe(feedback)
