"""The fixed shapes a static-shape engine runs decode steps at: batch buckets and attention-span
buckets.

dsd's fast path (`backend.fast_path`) pads a step's rows up to a batch bucket and its attention
span up to a kv bucket, so that one CUDA graph per shape can be captured and replayed (vLLM pads
batch sizes to its CUDA-graph capture sizes the same way). These pure functions are the one
definition of those shapes: the fast path runs them, and the simulator prices a step at the
shape the engine runs (`sim.models.latency.FixedShapeSteps`). Not the fast path itself.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MIN_KV_LEN = 256  # smallest attention span bucket; smaller spans round up to it


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Padded batch sizes: powers of two below max_num_seqs, then max_num_seqs itself."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    buckets = []
    size = 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    buckets.append(max_num_seqs)
    return tuple(buckets)


def bucket_for(num_rows: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds num_rows rows."""
    for size in buckets:
        if size >= num_rows:
            return size
    raise ValueError(f"{num_rows} rows exceed the largest batch bucket {buckets[-1]}")


def kv_len_buckets(cache_len: int, min_kv_len: int = DEFAULT_MIN_KV_LEN) -> tuple[int, ...]:
    """Every attention span `kv_len_bucket` can return for this cache length, ascending."""
    spans = []
    span = max(1, min_kv_len)
    while span < cache_len:
        spans.append(span)
        span *= 2
    return (*spans, cache_len)


def kv_len_bucket(needed: int, cache_len: int, min_kv_len: int = DEFAULT_MIN_KV_LEN) -> int:
    """Attention span for a step whose largest real position is needed - 1.

    min_kv_len * 2^j, the smallest that is >= needed, capped at cache_len (all of it).
    """
    if not 1 <= needed <= cache_len:
        raise ValueError(f"kv span {needed} outside [1, {cache_len}]")
    span = max(1, min_kv_len)
    while span < needed:
        span *= 2
    return min(span, cache_len)


def engine_cache_len(max_model_len: int, k_max: int) -> int:
    """Positions per slot of dsd's engine: max_model_len, one step's drafts, the trash one."""
    return max_model_len + k_max + 2


@dataclass(frozen=True, slots=True)
class StepShapes:
    """The shapes one engine's decode steps run at: its batch buckets and attention spans."""

    batch_buckets: tuple[int, ...]  # ascending; the last is the engine's slot count
    cache_len: int  # positions per slot: the largest span
    min_kv_len: int = DEFAULT_MIN_KV_LEN

    @staticmethod
    def of_engine(
        max_num_seqs: int, max_model_len: int, k_max: int, min_kv_len: int = DEFAULT_MIN_KV_LEN
    ) -> StepShapes:
        """The shapes of a fast-path engine with these limits (`backend.engine.SpecDecodeConfig`
        with num_slots = max_num_seqs)."""
        return StepShapes(
            batch_buckets(max_num_seqs), engine_cache_len(max_model_len, k_max), min_kv_len
        )

    def rows(self, num_rows: int) -> int:
        """The padded row count of a step over num_rows decode rows."""
        return bucket_for(num_rows, self.batch_buckets)

    def span(self, longest_cached: int, num_spec_tokens: int) -> int:
        """The attention span of a step whose longest row holds `longest_cached` tokens in its
        KV cache and that verifies `num_spec_tokens` drafts: it reads positions up to L + K."""
        needed = min(longest_cached + num_spec_tokens + 1, self.cache_len)
        return kv_len_bucket(needed, self.cache_len, self.min_kv_len)
