"""A static, slot-indexed KV cache and its per-slot lengths.

Storage is one preallocated tensor pair `k`, `v` of shape [num_layers, num_slots, max_len,
num_kv_heads, head_dim]: a request owns one slot for its lifetime; the model writes a token's K/V
at (slot, position). `lengths[slot]` (host numpy) is how many leading positions hold valid K/V of
the slot's sequence. Rolling back rejected draft positions is only `lengths[slot] = n`: the stale
entries past n are overwritten before any token reads them, because a token at position p is
always written (by the same forward or an earlier one) before a token at a position > p reads it.

It takes plain shape ints (gpt-fast's `KVCache`), so the cache and the model do not import each
other; `backend.model.new_kv_cache` sizes one for a model config. This module does not decide
what goes into the cache (the engine does), does not page or share blocks between requests (no
prefix caching), and never syncs with the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch


class KVCache:
    """K/V storage for `num_layers` layers and the valid length of every slot."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        device: Any = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if min(num_layers, num_slots, max_len, num_kv_heads, head_dim) < 1:
            raise ValueError(
                f"bad KV cache shape: layers={num_layers} slots={num_slots} max_len={max_len} "
                f"kv_heads={num_kv_heads} head_dim={head_dim}"
            )
        shape = (num_layers, num_slots, max_len, num_kv_heads, head_dim)
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
