"""A static, slot-indexed KV cache and its per-slot lengths.

Storage is one preallocated tensor pair `k`, `v` of shape [num_layers, num_slots, max_len,
num_kv_heads, head_dim]: a request owns one slot for its lifetime; the model writes a token's K/V
at (slot, position). `lengths[slot]` (host numpy) is how many leading positions hold valid K/V of
the slot's sequence. Rolling back rejected draft positions is only `lengths[slot] = n`: the stale
entries past n are overwritten before any token reads them, because a token at position p is
always written (by the same forward or an earlier one) before a token at a position > p reads it.

This module does not decide what goes into the cache (the engine does), does not page or share
blocks between requests (no prefix caching), and never syncs with the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dsd.backend.model import ModelConfig


class KVCache:
    """K/V storage for `num_layers` layers of one model and the valid length of every slot."""

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_len: int,
        num_layers: int | None = None,
        device: Any = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        layers = config.num_layers if num_layers is None else num_layers
        if num_slots < 1 or max_len < 1 or not 1 <= layers <= config.num_layers:
            raise ValueError(
                f"bad KV cache shape: slots={num_slots} max_len={max_len} layers={layers}"
            )
        shape = (layers, num_slots, max_len, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, S, max_len, Hkv, D]
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # [L, S, max_len, Hkv, D]
        # Valid positions per slot, on the host so the engine never reads the device for them.
        self.lengths: npt.NDArray[np.int64] = np.zeros(num_slots, dtype=np.int64)  # [S]

    @property
    def num_layers(self) -> int:
        return int(self.k.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.k.shape[1])

    @property
    def max_len(self) -> int:
        return int(self.k.shape[2])

    def rollback(self, slot: int, length: int) -> None:
        """Forget positions >= length of a slot (rejected drafts). Never grows the slot."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"rollback to {length} outside [0, {self.lengths[slot]}]")
        self.lengths[slot] = length

    def reset(self, slot: int) -> None:
        """Free a slot's contents (the request finished or was preempted)."""
        self.lengths[slot] = 0
