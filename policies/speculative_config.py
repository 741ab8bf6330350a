"""vLLM's `--speculative-config` object, in and out (pure JSON: no vLLM import).

Out: `speculative_config(table, k_max, ...)` builds the object vLLM takes as
`--speculative-config`: `num_speculative_tokens` = K_max and the per-batch-size range table.
In: `spec_from_speculative_config(text)` reads such an object (inline JSON or a file) back into
the policy SPEC it describes, `table:[...]` or `static:K`, and its k_max.

Range-table semantics live in `policies.range_table`; the profile file formats in
`policies.profile_io`.
"""

from __future__ import annotations

from typing import Any

from dsd.common import strict_json
from dsd.common.errors import InputError, require_int
from dsd.common.user_files import read_json_argument
from dsd.policies.range_table import TABLE_FIELD, RangeTable, validate_ranges

K_MAX_FIELD = "num_speculative_tokens"


def speculative_config(
    table: RangeTable,
    k_max: int,
    method: str | None = None,
    draft_model: str | None = None,
) -> dict[str, Any]:
    """vLLM's --speculative-config object for a range table.

    `num_speculative_tokens` is `k_max` (the engine is built for it); every K in the table must
    be <= k_max. `method` / `draft_model` become "method" / "model".
    """
    require_int(k_max, K_MAX_FIELD, 0)
    checked = validate_ranges(table)
    largest = max(entry[2] for entry in checked)
    if largest > k_max:
        raise InputError(f"{TABLE_FIELD}: K={largest} exceeds {K_MAX_FIELD} {k_max}")
    config: dict[str, Any] = {}
    if method is not None:
        config["method"] = method
    if draft_model is not None:
        config["model"] = draft_model
    config[K_MAX_FIELD] = k_max
    config[TABLE_FIELD] = [list(entry) for entry in checked]
    return config


def read_speculative_config(text_or_path: str) -> tuple[dict[str, Any], str]:
    """(the object, its source name) of inline JSON (starting with '{') or a JSON file."""
    config, source = read_json_argument(text_or_path, "--speculative-config", opening="{")
    if not isinstance(config, dict):
        raise InputError(f"{source}: expected a JSON object (a --speculative-config)")
    return config, source


def spec_from_speculative_config(text_or_path: str) -> tuple[str, int]:
    """(policy SPEC, k_max) of a --speculative-config: `table:[...]`, or `static:K` without
    a table. The table is checked here; its K are clamped to k_max when the SPEC is parsed."""
    config, source = read_speculative_config(text_or_path)
    k_max = config.get(K_MAX_FIELD)
    require_int(k_max, f"{source}: {K_MAX_FIELD}", 0)
    assert isinstance(k_max, int)
    table = config.get(TABLE_FIELD)
    if table is None:
        return f"static:{k_max}", k_max
    checked = validate_ranges(table, f"{source}: {TABLE_FIELD}")
    return "table:" + strict_json.dumps(checked, separators=(",", ":")), k_max


# vLLM's (method, parallel_drafting) -> the simulator's speculative_method
# (sim.scheduler.SPECULATIVE_METHODS: what the scheduler reserves per row).
_METHODS: dict[tuple[str, bool], str] = {
    ("ngram", False): "ngram",
    ("ngram_gpu", False): "ngram",
    ("eagle", False): "eagle",
    ("eagle3", False): "eagle3",
    ("mtp", False): "mtp",
    ("draft_model", False): "draft_model",
    ("draft_model", True): "pard",
    ("eagle3", True): "p-eagle",
}


def method_from_speculative_config(text_or_path: str) -> str | None:
    """The simulator's speculative_method of a --speculative-config's "method" (and
    "parallel_drafting"); None when it names no method."""
    config, source = read_speculative_config(text_or_path)
    method = config.get("method")
    if method is None:
        return None
    parallel = config.get("parallel_drafting", False)
    if not isinstance(method, str) or not isinstance(parallel, bool):
        raise InputError(f"{source}: method must be a string and parallel_drafting a boolean")
    ours = _METHODS.get((method, parallel))
    if ours is None:
        known = ", ".join(m + (" (parallel)" if p else "") for m, p in _METHODS)
        raise InputError(f"{source}: method {method!r} is not simulated; known: {known}")
    return ours
