"""The static K policy: the same K for every step, like vLLM's `num_speculative_tokens`.

It does not look at the batch and does not learn; a K above the engine's k_max is clamped to it
(the engine cannot draft more than it was built for).
"""

from __future__ import annotations

from typing import ClassVar

from dsd.common.errors import InputError
from dsd.policies.types import StepFeedback, StepView


class StaticPolicy:
    """K = k for every step (K = 0 is plain decoding)."""

    BATCH_SIZE_ONLY: ClassVar[bool] = True  # K = f(B, k_max); observe learns nothing

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InputError(f"static policy: K must be an integer >= 0, got {k!r}")
        self.k = k

    def choose_k(self, view: StepView) -> int:
        return min(self.k, max(view.k_max, 0))

    def observe(self, feedback: StepFeedback) -> None:
        """Static: nothing to learn."""
