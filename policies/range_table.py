"""vLLM's per-batch-size K table (`num_speculative_tokens_per_batch_size`) and compiling to it.

A range table is a list of `[start_bs, end_bs, K]` entries, bounds inclusive, read as vLLM's
speculative config reads it (the rules: docs/policies.md, "table"). `RangeTablePolicy` looks K
up in one; `compile_range_table` turns any batch-level policy into one for a given
max_num_seqs by asking it for B = 1..max_num_seqs and merging runs of equal K.

This module does not read vLLM's whole `--speculative-config` (see
`policies.speculative_config`), only the table inside it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from dsd.common.arrays import IntArray
from dsd.common.errors import InputError, require_int
from dsd.common.user_files import read_json_argument
from dsd.policies.goodput import (
    GoodputTable,
    ItlTable,
    acceptance_lengths,
    expected_itl_ms,
    lookup_batch_k,
    partial_draft_rates,
)
from dsd.policies.profile import Profile
from dsd.policies.types import MAX_NUM_SEQS, KPolicy, StepFeedback, StepView, batch_size_only

RangeTable = list[list[int]]  # [[start_bs, end_bs, K], ...], bounds inclusive
TABLE_FIELD = "num_speculative_tokens_per_batch_size"


def integer_entries(entries: Any, source: str, fields: tuple[str, ...]) -> list[list[int]]:
    """A non-empty list of entries of len(fields) integers each (JSON integers: no bool), as
    Python ints; InputError naming the entry otherwise."""
    names = ", ".join(fields)
    if not isinstance(entries, list | tuple):
        raise InputError(f"{source}: expected a list of [{names}], got {entries!r}")
    if len(entries) == 0:
        raise InputError(f"{source}: must not be empty")
    rows = []
    for index, entry in enumerate(entries):
        if (
            not isinstance(entry, list | tuple)
            or len(entry) != len(fields)
            or any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in entry)
        ):
            raise InputError(f"{source}[{index}]: expected [{names}] integers, got {entry!r}")
        rows.append([int(v) for v in entry])
    return rows


def check_interval(where: str, what: str, bounds: tuple[int, int], names: tuple[str, str]) -> None:
    """An inclusive [start, end] of batch sizes (>= 1) or context tokens (>= 0), start <= end."""
    start, end = bounds
    lowest = 1 if what == "batch size" else 0
    if start < lowest or end < lowest:
        bound = "> 0" if lowest == 1 else ">= 0"
        raise InputError(f"{where}: {what} bounds must be {bound}, got [{start}, {end}]")
    if start > end:
        raise InputError(f"{where}: {names[0]} {start} > {names[1]} {end}")


def check_k(where: str, k: int) -> None:
    if k < 0:
        raise InputError(f"{where}: K must be >= 0, got {k}")


def check_batch_ranges(source: str, ranges: list[tuple[int, int]]) -> None:
    """Batch-size ranges sorted by start: the first starts at 1, none overlap (vLLM's rules)."""
    if ranges[0][0] != 1:
        raise InputError(
            f"{source}: the first range must start at batch size 1, got {ranges[0][0]}"
        )
    for previous, current in itertools.pairwise(ranges):
        if current[0] <= previous[1]:
            raise InputError(
                f"{source}: ranges {list(previous)} and {list(current)} overlap "
                f"(batch size {current[0]})"
            )


def validate_ranges(ranges: Any, source: str = TABLE_FIELD) -> RangeTable:
    """The entries sorted by start, checked against vLLM's rules (K not yet clamped)."""
    checked = integer_entries(ranges, source, ("start_bs", "end_bs", "K"))
    for index, (start, end, k) in enumerate(checked):
        where = f"{source}[{index}]"
        check_interval(where, "batch size", (start, end), ("start_bs", "end_bs"))
        check_k(where, k)
    checked.sort(key=lambda entry: entry[0])
    check_batch_ranges(source, [(entry[0], entry[1]) for entry in checked])
    return checked


def ranges_from_json(data: Any, source: str) -> RangeTable:
    """A table from decoded JSON: the list, or an object holding it (a speculative config)."""
    if isinstance(data, dict):
        if TABLE_FIELD not in data:
            raise InputError(f"{source}: object has no {TABLE_FIELD!r}")
        return validate_ranges(data[TABLE_FIELD], f"{source}: {TABLE_FIELD}")
    return validate_ranges(data, source)


def read_ranges(text_or_path: str) -> RangeTable:
    """Inline JSON (starting with '[' or '{') or the path of a JSON file."""
    data, source = read_json_argument(text_or_path, "table")
    return ranges_from_json(data, source)


def expand_ranges(ranges: RangeTable, k_max: int, max_num_seqs: int) -> IntArray:
    """[max_num_seqs] K for B = 1..max_num_seqs (gaps and the tail carry the previous K)."""
    checked = validate_ranges(ranges)
    k_by_batch = np.empty(max_num_seqs, dtype=np.int64)  # [max_num_seqs]
    # Clamped in Python first, like vLLM's lookup: a bound or K of any size (beyond int64) is a
    # valid table; a start past max_num_seqs owns no B, a K past k_max is k_max.
    starts = np.array([min(e[0], max_num_seqs + 1) for e in checked], dtype=np.int64)  # [R]
    ks = np.array([min(e[2], k_max) for e in checked], dtype=np.int64)  # [R]
    batch_sizes = np.arange(1, max_num_seqs + 1)  # [max_num_seqs]
    # The range a B falls in, or the last one starting before it (gap / tail carry-forward).
    owner = np.searchsorted(starts, batch_sizes, side="right") - 1  # [max_num_seqs], >= 0
    k_by_batch[:] = ks[owner]
    return k_by_batch


class RangeTablePolicy:
    """K from a vLLM range table, looked up by B."""

    BATCH_SIZE_ONLY: ClassVar[bool] = True  # K = f(B, k_max); observe learns nothing

    def __init__(self, ranges: Sequence[Sequence[int]], k_max: int, max_num_seqs: int) -> None:
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
            raise InputError(f"num_speculative_tokens must be an integer >= 0, got {k_max!r}")
        require_int(max_num_seqs, "max_num_seqs", 1, MAX_NUM_SEQS)
        self.ranges = validate_ranges(ranges)
        self.k_max = k_max
        self.max_num_seqs = max_num_seqs
        self.k_by_batch = expand_ranges(self.ranges, k_max, max_num_seqs)  # [max_num_seqs]

    def k_for_batch_size(self, batch_size: int) -> int:
        if batch_size > self.max_num_seqs:
            raise InputError(
                f"range table: batch size {batch_size} exceeds max_num_seqs {self.max_num_seqs}"
            )
        return int(self.k_by_batch[max(batch_size, 1) - 1])

    def choose_k(self, view: StepView) -> int:
        return lookup_batch_k(self.k_by_batch, view, "range table")

    def observe(self, feedback: StepFeedback) -> None:
        """A fixed table: nothing to learn."""


def synthetic_view(batch_size: int, k_max: int, context_len: int = 0) -> StepView:
    """A pure-decode StepView at batch size B, for asking a policy what it would do."""
    return StepView(
        step_index=0,
        time_s=0.0,
        batch_size=batch_size,
        num_decode_reqs=batch_size,
        req_ids=np.arange(batch_size, dtype=np.int64),
        context_lens=np.full(batch_size, context_len, dtype=np.int64),
        k_max=k_max,
        num_tokens=batch_size,
    )


def compile_range_table(
    policy: KPolicy, k_max: int, max_num_seqs: int, context_len: int = 0
) -> RangeTable:
    """The policy's current decision for B = 1..max_num_seqs as merged [start, end, K] ranges.

    The policy must be batch-level: a per-request answer is accepted only when all requests get
    the same K. Asking does not advance any state (choose_k is not followed by observe).
    """
    if max_num_seqs < 1:
        raise InputError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    ranges: RangeTable = []
    for batch_size in range(1, max_num_seqs + 1):
        choice = policy.choose_k(synthetic_view(batch_size, k_max, context_len))
        values = np.unique(np.asarray(choice, dtype=np.int64))
        if values.size != 1:
            raise InputError(
                f"policy chose different K per request at B={batch_size} ({values.tolist()}); "
                "only batch-level policies compile to a range table"
            )
        k = int(values[0])
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = batch_size
        else:
            ranges.append([batch_size, batch_size, k])
    return ranges


def compile_batch_size_table(
    policy: KPolicy, k_max: int, max_num_seqs: int, name: str = "policy"
) -> RangeTable:
    """The range table of a policy that declares K depends on the batch size alone
    (`BATCH_SIZE_ONLY = True`, `types.batch_size_only`), asked at every B = 1..max_num_seqs.

    Any other policy may learn or read more than B, so no table is its behaviour: one-line
    InputError naming it. `name` is how the error names the policy (its SPEC)."""
    if not batch_size_only(policy):
        raise InputError(
            f"policy {name}: only a policy that declares K depends on the batch size alone "
            "(class attribute BATCH_SIZE_ONLY = True, and an observe that learns nothing) "
            "compiles to a range table"
        )
    return compile_range_table(policy, k_max, max_num_seqs)


def evaluate_policy(policy: KPolicy, profile: Profile, max_num_seqs: int) -> GoodputTable:
    """What `policy` chooses for B = 1..max_num_seqs, scored with the profile's AL and ITL.

    For the goodput policy this equals its own `goodput_table`; for any other batch-level policy
    it shows what its choices cost under the profile (what `dsd policy explain` prints).
    """
    ranges = compile_range_table(policy, profile.k_max, max_num_seqs)
    k_by_batch = expand_ranges(ranges, profile.k_max, max_num_seqs)  # [N]
    itl = ItlTable.from_profile(profile)
    al_by_k = acceptance_lengths(profile.acceptance_rates, profile.k_max)  # [k_max + 1]
    batch_sizes = np.arange(1, max_num_seqs + 1, dtype=np.int64)  # [N]
    k_values = np.arange(profile.k_max + 1, dtype=np.int64)  # [k_max + 1]
    draft_rates = partial_draft_rates(profile.draft_rates, profile.k_max)
    itl_by_k = itl.itl_ms_at(batch_sizes[:, None], k_values[None, :])  # [N, k_max + 1]
    objective = al_by_k[None, :] / expected_itl_ms(itl_by_k, draft_rates, batch_sizes)
    if draft_rates is None:
        itl_chosen = itl.itl_ms_at(batch_sizes, k_by_batch)  # [N]
    else:  # the chosen K's expected ITL (rows draft fewer than K)
        expected = expected_itl_ms(itl_by_k, draft_rates, batch_sizes)  # [N, k_max + 1]
        itl_chosen = expected[np.arange(max_num_seqs), k_by_batch]  # [N]
    return GoodputTable(
        batch_sizes=batch_sizes,
        k_star=k_by_batch,
        acceptance_length=al_by_k[k_by_batch],
        itl_ms=itl_chosen,
        goodput=al_by_k[k_by_batch] / itl_chosen,
        goodput_by_k=objective,
    )
