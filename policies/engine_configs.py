"""Every engine's per-batch-size draft-length config from one range table: vLLM's
--speculative-config (`export_vllm`), TensorRT-LLM's (`trtllm_config`) and SGLang's
(`sglang_adaptive_config`, with the launch flags in `sglang_launch_note`).

All start from the vLLM range table that `dsd export vllm` prints (`compiled_table`: the policy
on the profile, compiled by `policies.range_table`) and are JSON, written only: dsd does not
read them back as policies. Neither engine is imported: tests/policies/test_engine_configs.py
re-implements their validation and lookup from their source, as oracles. Each format, and what
it cannot express: docs/formats.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsd.common.errors import InputError
from dsd.policies.plugin import export_table, policy_spec
from dsd.policies.profile_io import load_profile
from dsd.policies.range_table import RangeTable, expand_ranges
from dsd.policies.spec import parse_policy, run_k_max
from dsd.policies.speculative_config import speculative_config

# vLLM's method names (what `--method` takes for every export) -> each engine's name for it.
TRTLLM_DECODING_TYPES = {
    "eagle": "Eagle",
    "eagle3": "Eagle3",
    "mtp": "MTP",
    "ngram": "NGram",
    "draft_model": "DraftTarget",
}
# SGLang's adaptive mode runs on the EAGLE worker only (adaptive_unsupported_reason in
# python/sglang/srt/speculative/adaptive_spec_params.py): EAGLE, EAGLE3 and NEXTN (its MTP).
SGLANG_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN"}


def k_runs(table: RangeTable, k_max: int, max_num_seqs: int) -> list[tuple[int, int, int]]:
    """(first B, last B, K) runs of equal K covering B = 1..max_num_seqs, as vLLM reads the
    table (gaps and the tail carry the K before them, K clamped to k_max)."""
    k_by_batch = expand_ranges(table, k_max, max_num_seqs).tolist()  # [max_num_seqs]
    runs: list[tuple[int, int, int]] = []
    for batch_size, k in enumerate(k_by_batch, start=1):
        if runs and runs[-1][2] == k:
            runs[-1] = (runs[-1][0], batch_size, k)
        else:
            runs.append((batch_size, batch_size, k))
    return runs


def _engine_name(method: str | None, names: dict[str, str], engine: str) -> str | None:
    if method is None:
        return None
    if method not in names:
        known = ", ".join(names)
        raise InputError(f"--method {method!r}: {engine} takes {known}")
    return names[method]


def _check_speculates(runs: list[tuple[int, int, int]], source: str) -> None:
    if all(k == 0 for _, _, k in runs):
        raise InputError(f"{source}: K is 0 at every batch size; run without speculative decoding")


def trtllm_config(
    table: RangeTable,
    k_max: int,
    max_num_seqs: int,
    *,
    method: str | None = None,
    draft_model: str | None = None,
    source: str = "range table",
) -> dict[str, Any]:
    """TensorRT-LLM's `extra_llm_api_options` object giving the table's K at every B.

    `draft_len_schedule` maps the last B of each run of equal K to that K (TensorRT-LLM looks a
    batch up at the first key >= its size), up to max_num_seqs, which is also `max_batch_size`,
    so no batch reaches the implicit K past the last key. TensorRT-LLM requires the smallest
    key's draft length to equal `max_draft_len` and no draft length above it: `max_draft_len` is
    the K at B = 1 (at most the profile's K_max), and a table with a larger K at some B, or with
    K = 0 at B = 1, is an InputError. `max_concurrency` is left out: TensorRT-LLM refuses it
    beside a schedule (the schedule's K = 0 entries do its work).
    """
    runs = k_runs(table, k_max, max_num_seqs)
    _check_speculates(runs, source)
    first_k = runs[0][2]
    for start, end, k in runs:
        if k > first_k:
            raise InputError(
                f"{source}: K={k} at B={start}..{end} is above K={first_k} at B=1; TensorRT-LLM's "
                "draft_len_schedule needs the draft length at B=1 (max_draft_len) to be the largest"
            )
    speculative: dict[str, Any] = {}
    decoding_type = _engine_name(method, TRTLLM_DECODING_TYPES, "TensorRT-LLM")
    if decoding_type is not None:
        speculative["decoding_type"] = decoding_type
    if draft_model is not None:
        speculative["speculative_model"] = draft_model
    speculative["max_draft_len"] = first_k
    # JSON keys are strings; TensorRT-LLM's pydantic field (dict[int, int]) reads them as ints.
    speculative["draft_len_schedule"] = {str(end): k for _, end, k in runs}
    return {"max_batch_size": max_num_seqs, "speculative_config": speculative}


def sglang_adaptive_config(
    table: RangeTable,
    k_max: int,
    max_num_seqs: int,
    *,
    method: str | None = None,
    source: str = "range table",
) -> dict[str, Any]:
    """SGLang's `--speculative-adaptive-config` object: {first B of a run: {"candidate_steps":
    [K]}}. One candidate per slot, so the EMA and its hysteresis have nothing to choose between
    and the slot's step is K from the first batch on (no warm-up). K = 0 (no drafting) is a
    valid candidate in SGLang's per-batch-size slots. The file names no method: `method` is
    only checked to be one SGLang's adaptive mode runs (see `sglang_launch_note`)."""
    _engine_name(method, SGLANG_ALGORITHMS, "SGLang's --speculative-adaptive")
    runs = k_runs(table, k_max, max_num_seqs)
    _check_speculates(runs, source)
    return {str(start): {"candidate_steps": [k]} for start, _, k in runs}


def sglang_launch_note(
    config: dict[str, Any],
    max_num_seqs: int,
    *,
    method: str | None = None,
    draft_model: str | None = None,
    config_path: str = "FILE",
) -> str:
    """How to launch SGLang with an adaptive config from `sglang_adaptive_config`, and where it
    can differ from the table: SGLang pads a batch to the next captured CUDA-graph batch size
    before picking its slot, so the table holds at every B only when the last B of every run
    but the last is a captured size (or CUDA graphs are off)."""
    algorithm = _engine_name(method, SGLANG_ALGORITHMS, "SGLang's --speculative-adaptive")
    flags = [f"--speculative-algorithm {algorithm or '{EAGLE|EAGLE3|NEXTN}'}"]
    if draft_model is not None:
        flags.append(f"--speculative-draft-model-path {draft_model}")
    flags += [
        "--speculative-eagle-topk 1",
        "--speculative-adaptive",
        f"--speculative-adaptive-config {config_path}",
        f"--max-running-requests {max_num_seqs}",
    ]
    note = "launch SGLang with " + " ".join(flags)
    starts = sorted(int(key) for key in config)
    ends = [start - 1 for start in starts[1:]]
    if ends:
        sizes = " ".join(str(b) for b in ends)
        note += (
            f"; SGLang pads a batch to its next captured CUDA-graph size before choosing a slot, "
            f"so include {sizes} in --cuda-graph-bs (or pass --disable-cuda-graph), otherwise a "
            "B between two captured sizes takes the K of the larger"
        )
    return note


def compiled_table(
    profile: str | Path, max_num_seqs: int, policy: str | object
) -> tuple[RangeTable, int]:
    """(the policy on the profile compiled to a range table for B = 1..max_num_seqs, its
    k_max): the table every export writes. k_max is the profile's, raised to the K a static
    policy or a range table fixes, as `dsd simulate` raises it (`policies.spec.run_k_max`). A
    user's policy compiles only when it declares K depends on the batch size alone
    (`policies.plugin.export_table`)."""
    loaded = load_profile(profile)
    spec = policy_spec(policy)
    k_max = run_k_max(spec, loaded.k_max)
    chosen = parse_policy(spec, profile=loaded, k_max=k_max, max_num_seqs=max_num_seqs)
    return export_table(chosen, k_max, max_num_seqs, spec), k_max


def export_vllm(
    profile: str | Path,
    *,
    max_num_seqs: int,
    policy: str | object = "goodput",
    method: str | None = None,
    draft_model: str | None = None,
) -> dict[str, Any]:
    """vLLM's --speculative-config for a policy compiled to a range table on a profile (a
    user's policy only when it declares K depends on the batch size alone)."""
    table, k_max = compiled_table(profile, max_num_seqs, policy)
    return speculative_config(table, k_max, method=method, draft_model=draft_model)


def export_trtllm(
    profile: str | Path,
    *,
    max_num_seqs: int,
    policy: str | object = "goodput",
    method: str | None = None,
    draft_model: str | None = None,
) -> dict[str, Any]:
    """TensorRT-LLM's extra_llm_api_options for a policy on a profile: the K `dsd export vllm`
    gives at every B, as `speculative_config.draft_len_schedule` (docs/formats.md)."""
    table, k_max = compiled_table(profile, max_num_seqs, policy)
    source = f"policy {policy}"
    return trtllm_config(
        table, k_max, max_num_seqs, method=method, draft_model=draft_model, source=source
    )


def export_sglang(
    profile: str | Path,
    *,
    max_num_seqs: int,
    policy: str | object = "goodput",
    method: str | None = None,
) -> dict[str, Any]:
    """SGLang's --speculative-adaptive-config for a policy on a profile: the K `dsd export vllm`
    gives at every B, one candidate step per batch-size slot (docs/formats.md says where SGLang's
    CUDA-graph padding can shift it; `sglang_launch_note` says it to the user)."""
    table, k_max = compiled_table(profile, max_num_seqs, policy)
    return sglang_adaptive_config(
        table, k_max, max_num_seqs, method=method, source=f"policy {policy}"
    )
