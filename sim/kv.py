"""KV-cache block accounting for the scheduler: a fixed pool of blocks of `block_size` tokens.

A request (identified by the scheduler's slot index) holds `ceil(covered_tokens / block_size)`
blocks, where `covered_tokens` is what the scheduler says the request's KV cache must cover: the
tokens it has computed plus the ones scheduled in the step being built (drafts included). The
pool only counts blocks: the simulator needs no block ids, and the real backend keeps its own
static per-slot KV cache.

What this module deliberately does not do: decide who gets blocks or whom to preempt (that is
`sim.scheduler`), prefix caching, or any notion of time.
"""

from __future__ import annotations

import numpy as np

from dsd.common.arrays import IntArray


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-numerator // denominator)


class KVBlockPool:
    """Counts free blocks and the blocks each slot holds.

    Invariant (checked by `check_invariants`): free + held == total, held >= 0 per slot, and each
    slot holds exactly `ceil(covered / block_size)` blocks for the coverage the scheduler reports.
    """

    def __init__(self, num_blocks: int, block_size: int, capacity: int = 64) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        # Power-of-two block sizes (the usual 16) round up with an add and a shift, much
        # cheaper than integer division; -1 when block_size is not a power of two.
        self._shift = block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else -1
        self.num_total_blocks = num_blocks
        self.num_free_blocks = num_blocks
        self.num_held = np.zeros(max(capacity, 1), dtype=np.int64)  # [capacity] blocks per slot

    @property
    def capacity(self) -> int:
        return int(self.num_held.shape[0])

    def grow(self, capacity: int) -> None:
        """Make room for slot indices < capacity (slots are the scheduler's)."""
        if capacity > self.capacity:
            grown = np.zeros(capacity, dtype=np.int64)  # [capacity]
            grown[: self.capacity] = self.num_held
            self.num_held = grown

    def blocks_for(self, num_tokens: IntArray) -> IntArray:
        """Blocks needed to cover `num_tokens` tokens, elementwise (a new array)."""
        if self._shift >= 0:
            # ceil(n / 2^s) == (n + 2^s - 1) >> s for every integer n (the shift floors).
            blocks = num_tokens + (self.block_size - 1)  # [n]
            np.right_shift(blocks, self._shift, out=blocks)
            return blocks
        return -(-num_tokens // self.block_size)  # [n]

    def try_cover(self, slot: int, num_tokens: int) -> bool:
        """Grow `slot` to cover `num_tokens` tokens; False (and no change) if the pool is short."""
        needed = cdiv(num_tokens, self.block_size) - int(self.num_held[slot])
        if needed <= 0:
            return True
        if needed > self.num_free_blocks:
            return False
        self.num_free_blocks -= needed
        self.num_held[slot] += needed
        return True

    def try_cover_many(self, slots: IntArray, num_tokens: IntArray) -> bool:
        """All-or-nothing `try_cover` for distinct slots (the hot path of a step)."""
        held = self.num_held[slots]  # [n]
        target = self.blocks_for(num_tokens)  # [n]
        np.maximum(target, held, out=target)  # a slot never gives blocks back here
        total = int(np.add.reduce(target)) - int(np.add.reduce(held))
        if total > self.num_free_blocks:
            return False
        if total:
            self.num_free_blocks -= total
            self.num_held[slots] = target
        return True

    def shrink_to(self, slots: IntArray, num_tokens: IntArray) -> None:
        """Release the blocks of distinct `slots` beyond what `num_tokens` tokens need (the
        scheduler's same-step K reserve; blocks of rejected drafts are kept, as vLLM does).
        """
        held = self.num_held[slots]  # [n]
        target = self.blocks_for(num_tokens)  # [n]
        np.minimum(target, held, out=target)  # a slot never gains blocks here
        total = int(np.add.reduce(held)) - int(np.add.reduce(target))
        if total:
            self.num_held[slots] = target
            self.num_free_blocks += total

    def free(self, slots: int | IntArray) -> int:
        """Release every block of a slot, or of distinct `slots`; returns how many."""
        released = int(np.add.reduce(self.num_held[slots], axis=None))
        self.num_held[slots] = 0
        self.num_free_blocks += released
        return released

    def check_invariants(self, slots: IntArray, covered_tokens: IntArray) -> None:
        """`slots` are all slots that may hold blocks, with the tokens their KV must cover at
        least (a slot keeps the blocks of rejected drafts, so it may hold more)."""
        assert self.num_free_blocks >= 0, f"free blocks negative: {self.num_free_blocks}"
        assert (self.num_held >= 0).all(), "a slot holds a negative number of blocks"
        held_total = int(self.num_held.sum())
        assert self.num_free_blocks + held_total == self.num_total_blocks, (
            f"block leak: free {self.num_free_blocks} + held {held_total} "
            f"!= total {self.num_total_blocks}"
        )
        expected = self.blocks_for(covered_tokens)  # [n]
        held = self.num_held[slots]  # [n]
        bad = np.flatnonzero(held < expected)
        assert bad.size == 0, (
            f"slot {int(slots[bad[0]])} holds {int(held[bad[0]])} blocks, "
            f"covers {int(covered_tokens[bad[0]])} tokens -> needs {int(expected[bad[0]])}"
        )
        # Slots not listed hold nothing (no leaks through finished or waiting requests).
        others = np.ones(self.capacity, dtype=np.bool_)  # [capacity]
        others[slots] = False
        assert not self.num_held[others].any(), "a slot that is not running holds blocks"
