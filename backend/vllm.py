"""vLLM file formats in and out: `--speculative-config` JSON and the PR #32374 profile file.

Out: `speculative_config(table, k_max, ...)` builds the object vLLM takes as
`--speculative-config` (`num_speculative_tokens` = K_max and the per-batch-size range table);
`save_pr32374` writes the PR #32374 `dynamic_speculative_config.json` of a profile.
In: `policy_from_speculative_config` reads such a JSON object back into a K policy (a
`RangeTablePolicy`, or a `StaticPolicy` when it has no table).

This module imports neither vllm nor torch: it only writes and reads JSON, so it works on any
machine. Range-table semantics live in `policies.range_table`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dsd.common.errors import InputError
from dsd.policies.profile_io import profile_to_pr32374, save_pr32374
from dsd.policies.range_table import TABLE_FIELD, RangeTable, RangeTablePolicy, validate_ranges
from dsd.policies.static import StaticPolicy
from dsd.policies.types import KPolicy

__all__ = [
    "policy_from_speculative_config",
    "profile_to_pr32374",
    "read_speculative_config",
    "save_pr32374",
    "speculative_config",
]


def speculative_config(
    table: RangeTable,
    k_max: int,
    method: str | None = None,
    draft_model: str | None = None,
) -> dict[str, Any]:
    """vLLM's --speculative-config object for a range table.

    `num_speculative_tokens` is `k_max` (the profile's K_max: the engine is built for it); every
    K in the table must be <= k_max. `method` / `draft_model` become "method" / "model".
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise InputError(f"num_speculative_tokens must be an integer >= 0, got {k_max!r}")
    checked = validate_ranges(table)
    largest = max(entry[2] for entry in checked)
    if largest > k_max:
        raise InputError(f"{TABLE_FIELD}: K={largest} exceeds num_speculative_tokens {k_max}")
    config: dict[str, Any] = {}
    if method is not None:
        config["method"] = method
    if draft_model is not None:
        config["model"] = draft_model
    config["num_speculative_tokens"] = k_max
    config[TABLE_FIELD] = [list(entry) for entry in checked]
    return config


def read_speculative_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A --speculative-config JSON file as a dict (one-line InputError on bad JSON)."""
    source = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object (a --speculative-config)")
    return data


def policy_from_speculative_config(
    config: dict[str, Any], max_num_seqs: int, source: str = "speculative-config"
) -> KPolicy:
    """The K policy a --speculative-config describes: its range table, else static K."""
    k_max = config.get("num_speculative_tokens")
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise InputError(f"{source}: num_speculative_tokens must be an integer >= 0, got {k_max!r}")
    if TABLE_FIELD in config and config[TABLE_FIELD] is not None:
        ranges = validate_ranges(config[TABLE_FIELD], f"{source}: {TABLE_FIELD}")
        return RangeTablePolicy(ranges, k_max, max_num_seqs)
    return StaticPolicy(k_max)
