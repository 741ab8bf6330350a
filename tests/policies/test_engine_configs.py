"""TensorRT-LLM's and SGLang's exports held to each engine's own rules, re-implemented here.

Neither engine imports without CUDA (tensorrt_llm and sglang are GPU builds), so their config
validation and batch-size lookup are written out below from their source, as oracles:

- TensorRT-LLM (PR #10860): `DecodingBaseConfig.validate_draft_len_schedule_and_sort` and
  `validate_max_concurrency_and_draft_len_schedule_mutually_exclusive` in
  tensorrt_llm/llmapi/llm_args.py (pydantic, lax: JSON's string keys read as ints), the file
  read with yaml.safe_load as `trtllm-serve --config` does, and `get_draft_len_for_batch_size`
  in tensorrt_llm/_torch/speculative/utils.py (the first key >= B, 0 past the last key).
- SGLang (PRs #21599, #24055): `_load_adaptive_config` and `AdaptiveSpeculativeParams._route`
  (`_pad_to_cuda_graph_bs`, `_find_closest_bs`) and `AdaptiveStepSlot.__init__`'s starting
  step in python/sglang/srt/speculative/adaptive_spec_params.py.

Golden files (tests/data/engine_exports) are the engines' documented examples: TensorRT-LLM's
`draft_len_schedule` field description ({4: 4, 8: 2, 32: 1}) and its auto_deploy
super_v3_mtp.yaml schedule ({8: 6, 32: 5, 64: 3, 128: 2}); SGLang's DEFAULT_ADAPTIVE_CONFIG
slot keys (1, 8, 32, 64) with one of each slot's candidates, and its server-args test config
({"1": [1, 3, 5], "8": [1]}) with the step it resolves to (3).
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsd.common.errors import InputError
from dsd.policies.engine_configs import (
    compiled_table,
    export_sglang,
    export_trtllm,
    sglang_adaptive_config,
    sglang_launch_note,
    trtllm_config,
)
from dsd.policies.range_table import expand_ranges

pydantic = pytest.importorskip("pydantic")
yaml = pytest.importorskip("yaml")

PROFILES = Path(__file__).resolve().parents[2] / "policies" / "profiles"
H100 = PROFILES / "pr32374_llama31_8b_eagle_h100.json"
FIXTURE = PROFILES / "pr32374_branch_test_fixture.json"  # k_max 7
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "engine_exports"


# --- TensorRT-LLM, from tensorrt_llm/llmapi/llm_args.py and _torch/speculative/utils.py ------


class _TrtllmSpeculativeConfig(pydantic.BaseModel):
    """The DecodingBaseConfig fields the export writes (and max_concurrency, to check its
    exclusion), with its validators; extra fields are refused (StrictBaseModel)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    decoding_type: str | None = None
    speculative_model: str | None = None
    max_draft_len: pydantic.NonNegativeInt | None = None
    max_concurrency: pydantic.PositiveInt | None = None
    draft_len_schedule: dict[int, int] | None = None

    @pydantic.field_validator("draft_len_schedule")
    @classmethod
    def _schedule(cls, v: dict[int, int] | None, info: Any) -> dict[int, int] | None:
        if v is None:
            return v
        for batch_size, draft_len in v.items():
            if batch_size < 1:
                raise ValueError(f"batch size threshold must be >= 1, got {batch_size}")
            if draft_len < 0:
                raise ValueError(f"draft length must be >= 0, got {draft_len}")
        smallest = min(v)
        max_draft_len = info.data.get("max_draft_len")
        if max_draft_len is not None and v[smallest] != max_draft_len:
            raise ValueError(f"draft_len_schedule[{smallest}] must equal max_draft_len")
        if max_draft_len is not None and any(d > max_draft_len for d in v.values()):
            raise ValueError("all draft lengths must be <= max_draft_len")
        return dict(sorted(v.items()))

    @pydantic.model_validator(mode="after")
    def _exclusive(self) -> _TrtllmSpeculativeConfig:
        if self.max_concurrency is not None and self.draft_len_schedule is not None:
            raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")
        return self


class _TrtllmArgs(pydantic.BaseModel):
    max_batch_size: pydantic.PositiveInt
    speculative_config: _TrtllmSpeculativeConfig


def _trtllm_load(text: str) -> _TrtllmArgs:
    """What trtllm-serve --config FILE makes of the export's text (YAML, then pydantic)."""
    return _TrtllmArgs.model_validate(yaml.safe_load(text))


def _trtllm_draft_len(schedule: dict[int, int], batch_size: int) -> int:
    keys = list(schedule)  # sorted by the validator
    index = bisect.bisect_left(keys, batch_size)
    return schedule[keys[index]] if index < len(keys) else 0


# --- SGLang, from python/sglang/srt/speculative/adaptive_spec_params.py -----------------------


def _sglang_slots(cfg: dict[str, Any]) -> dict[int, list[int]]:
    """_load_adaptive_config's checks: integer-string keys are slots, each with a non-empty
    list of non-negative int candidate_steps; at least one slot."""
    slots = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if not (
            isinstance(steps, list)
            and steps
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        ):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints")
        slots[int(key)] = sorted(set(steps))
    if not slots:
        raise ValueError("speculative_adaptive_config must contain at least one BS key")
    return slots


def _sglang_steps(
    slots: dict[int, list[int]],
    batch_size: int,
    cuda_graph_bs: list[int] | None = None,
    initial_steps: int = 0,
) -> int:
    """The step of the slot a batch routes to, before any EMA update: the batch padded up to the
    next captured CUDA-graph size, then the largest slot key <= it (the first slot below all);
    the slot starts at initial_steps when it is a candidate, else the middle candidate."""
    if cuda_graph_bs is not None:
        graphs = sorted(cuda_graph_bs)
        index = bisect.bisect_left(graphs, batch_size)
        batch_size = graphs[index] if index < len(graphs) else batch_size
    keys = sorted(slots)
    candidates = slots[keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]]
    return initial_steps if initial_steps in candidates else candidates[len(candidates) // 2]


def _sglang_load(text: str) -> dict[int, list[int]]:
    cfg = json.loads(text)  # json.load of the --speculative-adaptive-config file
    assert isinstance(cfg, dict)
    return _sglang_slots(cfg)


# --- tables ------------------------------------------------------------------------------------


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[list[int]], int, int]:
    """(a valid range table, k_max, max_num_seqs): ranges from B = 1 in any order, gaps between
    them, K up to k_max + 2 (clamped when read), the last range possibly ending past
    max_num_seqs."""
    k_max = draw(st.integers(1, 8))
    max_num_seqs = draw(st.integers(1, 300))
    starts = sorted({1, *draw(st.lists(st.integers(2, 320), max_size=6))})
    table = []
    for index, start in enumerate(starts):
        limit = starts[index + 1] - 1 if index + 1 < len(starts) else 400
        end = draw(st.integers(start, limit))
        table.append([start, end, draw(st.integers(0, k_max + 2))])
    return draw(st.permutations(table)), k_max, max_num_seqs


def _expressible_in_trtllm(k_by_batch: list[int]) -> bool:
    return k_by_batch[0] > 0 and max(k_by_batch) == k_by_batch[0]


@settings(max_examples=300)
@given(drawn=tables())
def test_trtllm_schedule_gives_the_table_k_at_every_b_or_is_refused(
    drawn: tuple[list[list[int]], int, int],
) -> None:
    table, k_max, max_num_seqs = drawn
    expected = expand_ranges(table, k_max, max_num_seqs).tolist()
    try:
        config = trtllm_config(table, k_max, max_num_seqs)
    except InputError:
        assert not _expressible_in_trtllm(expected)
        return
    assert _expressible_in_trtllm(expected)
    loaded = _trtllm_load(json.dumps(config))
    assert loaded.max_batch_size == max_num_seqs
    schedule = loaded.speculative_config.draft_len_schedule
    assert schedule is not None and max(schedule) == max_num_seqs
    assert loaded.speculative_config.max_draft_len == expected[0] <= k_max
    got = [_trtllm_draft_len(schedule, b) for b in range(1, max_num_seqs + 1)]
    assert got == expected


@settings(max_examples=300)
@given(drawn=tables(), initial_steps=st.integers(0, 9), graph_bs=st.lists(st.integers(1, 320)))
def test_sglang_slots_give_the_table_k_at_every_b(
    drawn: tuple[list[list[int]], int, int], initial_steps: int, graph_bs: list[int]
) -> None:
    table, k_max, max_num_seqs = drawn
    expected = expand_ranges(table, k_max, max_num_seqs).tolist()
    if not any(expected):
        with pytest.raises(InputError, match="K is 0 at every batch size"):
            sglang_adaptive_config(table, k_max, max_num_seqs)
        return
    config = sglang_adaptive_config(table, k_max, max_num_seqs)
    slots = _sglang_load(json.dumps(config))
    batch_sizes = range(1, max_num_seqs + 1)
    # Without CUDA graphs, whatever --speculative-num-steps starts the slots at.
    assert [_sglang_steps(slots, b, None, initial_steps) for b in batch_sizes] == expected
    # With the sizes the note names among the captured ones: the table again.
    named = [int(key) - 1 for key in config if int(key) > 1]
    captured = sorted({*graph_bs, *named})
    assert [_sglang_steps(slots, b, captured, initial_steps) for b in batch_sizes] == expected
    # With any captured sizes: the table's K at the size a batch is padded to (the note's rule).
    padded = [next((g for g in sorted(graph_bs) if g >= b), b) for b in batch_sizes]
    shifted = [expected[min(p, max_num_seqs) - 1] for p in padded]
    assert [_sglang_steps(slots, b, graph_bs, initial_steps) for b in batch_sizes] == shifted
    note = sglang_launch_note(config, max_num_seqs)
    assert ("--cuda-graph-bs" in note) == bool(named)
    assert all(f" {b} " in f" {note.split('include ')[-1]}" for b in named)


@pytest.mark.parametrize("profile", [H100, FIXTURE], ids=["h100", "fixture"])
@pytest.mark.parametrize(
    "policy",
    ["goodput", "static:3", "hysteresis:goodput", "online", "bandit", "table:[[1,4,4],[9,64,1]]"],
)
@pytest.mark.parametrize("max_num_seqs", [1, 37, 256])
def test_exports_agree_with_the_vllm_table_at_every_b(
    profile: Path, policy: str, max_num_seqs: int
) -> None:
    """Every B = 1..max_num_seqs, several profiles and policies, through the exports' own entry
    points (what `dsd export trtllm|sglang` call) against the vLLM export's table."""
    table, k_max = compiled_table(profile, max_num_seqs, policy)
    expected = expand_ranges(table, k_max, max_num_seqs).tolist()
    batch_sizes = range(1, max_num_seqs + 1)
    slots = _sglang_load(
        json.dumps(export_sglang(profile, max_num_seqs=max_num_seqs, policy=policy))
    )
    assert [_sglang_steps(slots, b) for b in batch_sizes] == expected
    try:
        config = export_trtllm(profile, max_num_seqs=max_num_seqs, policy=policy)
    except InputError as error:
        assert not _expressible_in_trtllm(expected)
        assert f"policy {policy}: K=" in str(error)
        return
    schedule = _trtllm_load(json.dumps(config)).speculative_config.draft_len_schedule
    assert schedule is not None
    assert [_trtllm_draft_len(schedule, b) for b in batch_sizes] == expected


def test_the_oracles_refuse_what_the_engines_refuse() -> None:
    """The oracles are not vacuous: each engine's documented refusals."""
    bad_trtllm = [
        {"max_draft_len": 4, "draft_len_schedule": {"4": 2, "8": 4}},  # smallest key != max
        {"max_draft_len": 2, "draft_len_schedule": {"4": 2, "8": 3}},  # above max_draft_len
        {"max_draft_len": 2, "draft_len_schedule": {"0": 2}},  # key < 1
        {"max_draft_len": 2, "max_concurrency": 8, "draft_len_schedule": {"4": 2}},
        {"max_draft_len": 2, "draft_len_schedule": {"4": 2}, "max_concurency": 1},  # typo
    ]
    for speculative in bad_trtllm:
        with pytest.raises(pydantic.ValidationError):
            _TrtllmArgs.model_validate({"max_batch_size": 8, "speculative_config": speculative})
    schedule = {4: 4, 8: 2, 32: 1}  # the field's documented example and its reading
    lookups = [_trtllm_draft_len(schedule, b) for b in (1, 4, 5, 8, 9, 32, 33)]
    assert lookups == [4, 4, 2, 2, 1, 1, 0]
    for cfg in (
        {"ema_alpha": 0.2},
        {"1": {"candidate_steps": []}},
        {"1": {"candidate_steps": [-1]}},
    ):
        with pytest.raises(ValueError):
            _sglang_slots(cfg)
    default_slots = {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}  # DEFAULT_ADAPTIVE_CONFIG
    assert [_sglang_steps(default_slots, b, None, 3) for b in (1, 7, 8, 31, 32, 64, 999)] == [
        3, 3, 3, 3, 1, 0, 0
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("golden", "export", "kwargs", "documented"),
    [
        (
            "trtllm_llm_args_example.json",
            export_trtllm,
            {
                "max_num_seqs": 32,
                "policy": "table:[[1,4,4],[5,8,2],[9,32,1]]",
                "method": "eagle3",
                "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
            },
            {4: 4, 8: 2, 32: 1},
        ),
        (
            "trtllm_auto_deploy_mtp.json",
            export_trtllm,
            {
                "max_num_seqs": 128,
                "policy": "table:[[1,8,6],[9,32,5],[33,64,3],[65,128,2]]",
                "method": "mtp",
            },
            {8: 6, 32: 5, 64: 3, 128: 2},
        ),
        (
            "sglang_default_slots.json",
            export_sglang,
            {"max_num_seqs": 128, "policy": "table:[[1,7,5],[8,31,3],[32,63,1],[64,128,0]]"},
            {1: [5], 8: [3], 32: [1], 64: [0]},
        ),
        (
            "sglang_server_args_example.json",
            export_sglang,
            {"max_num_seqs": 16, "policy": "table:[[1,7,3],[8,16,1]]", "method": "eagle"},
            {1: [3], 8: [1]},
        ),
    ],
)
def test_golden_files_of_the_documented_examples(
    golden: str, export: Any, kwargs: dict[str, Any], documented: dict[int, Any]
) -> None:
    text = json.dumps(export(FIXTURE, **kwargs)) + "\n"  # what the command prints
    assert text == (GOLDEN / golden).read_text()
    if export is export_trtllm:
        loaded = _trtllm_load(text).speculative_config
        assert loaded.draft_len_schedule == documented
        assert loaded.max_draft_len == documented[min(documented)]
    else:
        assert _sglang_load(text) == documented


def test_method_names_map_to_each_engine() -> None:
    table = [[1, 8, 2]]
    decoding = {m: trtllm_config(table, 3, 8, method=m)["speculative_config"]["decoding_type"]
                for m in ("eagle", "eagle3", "mtp", "ngram", "draft_model")}  # fmt: skip
    assert decoding == {
        "eagle": "Eagle",
        "eagle3": "Eagle3",
        "mtp": "MTP",
        "ngram": "NGram",
        "draft_model": "DraftTarget",
    }
    with pytest.raises(InputError, match="--method 'medusa': TensorRT-LLM takes eagle, eagle3"):
        trtllm_config(table, 3, 8, method="medusa")
    config = sglang_adaptive_config(table, 3, 8, method="mtp")
    assert "--speculative-algorithm NEXTN" in sglang_launch_note(config, 8, method="mtp")
    with pytest.raises(InputError, match="--method 'ngram': SGLang's --speculative-adaptive"):
        sglang_adaptive_config(table, 3, 8, method="ngram")


def test_trtllm_refusals_name_the_policy_and_the_batch_sizes() -> None:
    with pytest.raises(InputError) as raised:
        export_trtllm(FIXTURE, max_num_seqs=16, policy="table:[[1,4,1],[5,16,2]]")
    assert str(raised.value).startswith("policy table:[[1,4,1],[5,16,2]]: K=2 at B=5..16 is above")
    with pytest.raises(InputError, match="policy static:0: K is 0 at every batch size"):
        export_trtllm(FIXTURE, max_num_seqs=16, policy="static:0")
