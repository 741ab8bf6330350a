"""Counter-based uniforms: a draw is a pure function of (seed, purpose, request, counter).

Common random numbers for paired comparisons: what a request draws at a counter (its output
position, a draft's token position) does not depend on what other requests drew, on K, on
concurrency or on arrival order. Per (seed, purpose) it is a random-access SplitMix64 per request,
vectorised with numpy uint64 arithmetic (the construction: docs/models.md §2).

It is not a cryptographic generator and not a replacement for numpy's `Generator` where a
sequential stream is right (a workload's per-request lengths, a policy's own exploration).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dsd.common.arrays import FloatArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_SHIFT_30, _SHIFT_27, _SHIFT_31, _SHIFT_12 = (np.uint64(s) for s in (30, 27, 31, 12))
_ONE_BITS = np.uint64(0x3FF0000000000000)  # the float64 1.0: 52 random mantissa bits -> [1, 2)

UIntArray = npt.NDArray[np.uint64]

_KEY_BLOCK = 1024  # request keys are computed for at least this many ids at once
_MAX_CACHED_IDS = 1 << 24  # ids past this are hashed per call (the cache would be 128 MB)


def _mix(z: UIntArray) -> UIntArray:
    """SplitMix64's finaliser, in place (z must be a fresh array)."""
    shifted = z >> _SHIFT_30
    z ^= shifted
    z *= _MIX_1
    np.right_shift(z, _SHIFT_27, out=shifted)
    z ^= shifted
    z *= _MIX_2
    np.right_shift(z, _SHIFT_31, out=shifted)
    z ^= shifted
    return z


def _scaled(values: npt.ArrayLike) -> UIntArray:
    """v G for integers v >= 0 (uint64, wrapping; not checked: this is the hot path)."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype == np.int64:
        out: UIntArray = values.astype(np.uint64)  # the per-step case: one conversion
    else:
        out = np.atleast_1d(np.asarray(values, dtype=np.int64)).astype(np.uint64)
    out *= _GOLDEN
    return out


def _to_unit(z: UIntArray) -> FloatArray:
    """[0, 1) from the top 52 bits of each word, in place."""
    z >>= _SHIFT_12
    z |= _ONE_BITS
    unit: FloatArray = z.view(np.float64)
    unit -= 1.0
    return unit


class CounterStream:
    """Uniform [0, 1) draws keyed by (request, counter) under one seed and purpose."""

    def __init__(self, seed: np.random.SeedSequence, purpose: int) -> None:
        """`purpose`: a small fixed integer per use of the seed (accept, draft, pick, ...), so
        two uses never share draws; fixed in code so streams stay stable as code evolves."""
        if purpose < 0:
            raise ValueError(f"purpose must be >= 0, got {purpose}")
        child = np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, purpose))
        base = int(child.generate_state(1, dtype=np.uint64)[0])
        self._first = np.uint64((base + int(_GOLDEN)) % 2**64)  # base + G: request 0's offset
        # Keys of requests 0 .. len - 1, computed in blocks as ids first appear: a request's
        # key is needed at every step it drafts, and a gather is a fraction of the hash.
        self._keys: UIntArray = np.zeros(0, dtype=np.uint64)  # [ids so far]
        self._columns: dict[int, UIntArray] = {}  # width -> [width] (1 .. width) G

    def request_keys(self, req_ids: npt.ArrayLike) -> UIntArray:
        """Each request's key [n]: mix(base + (r + 1) G)."""
        ids = np.asarray(req_ids, dtype=np.int64)
        if ids.ndim == 0:
            ids = ids.reshape(1)  # one id: one key, as an array (as `_scaled` makes it)
        try:
            keys: UIntArray = self._keys[ids]
            return keys
        except IndexError:  # an id past the computed block (ids are >= 0, see _scaled)
            pass
        top = int(ids.max()) + 1
        if top > _MAX_CACHED_IDS:
            return self._hashed_keys(ids)
        size = max(top, 2 * self._keys.shape[0], _KEY_BLOCK)
        self._keys = self._hashed_keys(np.arange(size, dtype=np.int64))
        cached: UIntArray = self._keys[ids]
        return cached

    def _hashed_keys(self, req_ids: npt.ArrayLike) -> UIntArray:
        z = _scaled(req_ids)
        z += self._first
        return _mix(z)

    def uniforms(self, req_ids: npt.ArrayLike, counters: npt.ArrayLike) -> FloatArray:
        """Draws for rows `req_ids` [n] at `counters` [n] (one per row)."""
        z = _scaled(counters)  # [n]
        z += self.request_keys(req_ids)
        z += _GOLDEN
        return _to_unit(_mix(z))

    def uniform(self, req_id: int, counter: int = 0) -> float:
        """One draw (a per-request choice made once, e.g. at add_request)."""
        return float(self.uniforms(np.array([req_id]), np.array([counter]))[0])

    def leading_columns(
        self, req_ids: npt.ArrayLike, starts: npt.ArrayLike, width: int
    ) -> FloatArray:
        """Draws [n, width] for rows `req_ids` [n] at counters start, start + 1, ...,
        start + width - 1: one per token position that a step drafting `width` tokens from
        output position `start` covers (equal to `uniforms` at those counters)."""
        z = _scaled(starts)  # [n]
        z += self.request_keys(req_ids)
        columns = self._columns.get(width)
        if columns is None:
            columns = self._columns[width] = np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN
        return _to_unit(_mix(z[:, None] + columns))
