"""The decode fast path: the SD step at fixed shapes, so CUDA graphs can replay it.

`FastSpecDecodeEngine` is a `SpecDecodeEngine` whose `step` runs a step's device work at a shape
`GraphKey(num_rows, num_spec_tokens, kv_len)` from a small set (batch buckets, the step's largest
K, kv buckets), captured once per key and replayed; variable-width work (prompt lookup, a model
draft's or an EAGLE head's catch-up) runs eagerly before it. `EagerStepRunner` runs the
fixed-shape function directly (the testable half, token for token equal to the reference step);
`CudaGraphStepRunner` captures it. `StepOptions` holds the off-by-default efficiency switches.
docs/backend.md ("The fixed-shape fast path") has the padding rules, the step's static inputs,
the cuBLASLt experiment and what this does not do (temperature > 0, prefill graphs).
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dsd.backend.eagle import EagleDraft, EagleOrLookup, EagleState, draft_passes
from dsd.backend.engine import (
    AnyDraft,
    Draft,
    NgramDraft,
    PrefillSpan,
    SpecDecodeConfig,
    SpecDecodeEngine,
    StepResult,
)
from dsd.backend.kv_cache import KVCache
from dsd.backend.model import ForwardGroup, Transformer
from dsd.backend.sampling import drawn_accept, greedy_accept
from dsd.common.arrays import IntArray
from dsd.common.errors import InputError
from dsd.sim.models.shapes import (  # the shapes, defined once for the engine and the simulator
    DEFAULT_MIN_KV_LEN,
    batch_buckets,
    bucket_for,
    kv_len_bucket,
    kv_len_buckets,
)

FastPathKind = Literal["off", "eager", "cuda-graphs"]
FAST_PATH_KINDS: tuple[str, ...] = ("off", "eager", "cuda-graphs")
# slot, last token, L, K, drawn accepted count: the fixed-shape step's inputs (then n-gram drafts)
_NUM_INPUT_ROWS = 5
CUBLASLT_MAX_ROWS_ENV = "DSD_CUBLASLT_MAX_ROWS"
# Dynamo compiles the step once per key; its default limit (8) would silently run later keys
# eagerly, so a compiled engine raises it to at least this
_COMPILED_KEYS_LIMIT = 1024


@dataclass(frozen=True)
class StepOptions:
    """How the fixed-shape step runs: switches, all off by default (module docstring, "Step
    options"); `benchmarks/engine_gpu.py` measures what each buys."""

    # A step whose rows' slots all lie below its batch bucket attends over those cache slots in
    # place (`ForwardGroup.in_place_slots`) instead of gathering each row's span
    in_place_attention: bool = False
    # torch.compile the step with this backend ("inductor"; "eager"/"aot_eager" trace only);
    # None: run it as written
    compile_backend: str | None = None
    # torch.compile's mode (None: its default); never one that captures CUDA graphs itself
    # ("reduce-overhead"): the CUDA-graph runner captures the compiled step
    compile_mode: str | None = None

    def __post_init__(self) -> None:
        if self.compile_mode is not None and "overhead" in self.compile_mode:
            raise ValueError(
                f"compile_mode {self.compile_mode!r} captures CUDA graphs itself; the runner does"
            )
        if self.compile_mode is not None and self.compile_backend != "inductor":
            raise ValueError("compile_mode needs compile_backend 'inductor'")


def cublaslt_max_rows() -> int:
    """`DSD_CUBLASLT_MAX_ROWS` (module docstring): steps of at most this many target rows run
    on cuBLASLt; 0 or unset: the fast path leaves torch's choice alone."""
    text = os.environ.get(CUBLASLT_MAX_ROWS_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise InputError(f"{CUBLASLT_MAX_ROWS_ENV}: must be an integer >= 0, got {text!r}")
    return int(text)


def step_blas_library(key: GraphKey, max_rows: int) -> str | None:
    """The CUDA matrix library the step of `key` runs with: "cublaslt" when its target forward
    has at most `max_rows` rows, else "cublas"; None (torch's choice) when `max_rows` is 0."""
    if max_rows == 0:
        return None
    return "cublaslt" if key.num_rows * (key.num_spec_tokens + 1) <= max_rows else "cublas"


@contextmanager
def _blas_library(library: str | None) -> Iterator[None]:
    """torch's preferred CUDA matrix library set to `library` for the block (None: unchanged)."""
    if library is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def check_fast_path(kind: str, device: str) -> None:
    """`kind` is a known fast path that `device` can run (checked before any model runs)."""
    if kind not in FAST_PATH_KINDS:
        raise InputError(f"--fast-path: choose {', '.join(FAST_PATH_KINDS)}, got {kind!r}")
    if kind == "cuda-graphs" and not device.startswith("cuda"):
        raise InputError(f"--fast-path cuda-graphs: needs --device cuda, got {device!r}")


@dataclass(frozen=True, slots=True)
class GraphKey:
    """The shape of one fixed-shape step: what a captured CUDA graph is keyed by."""

    num_rows: int  # padded batch size (a batch bucket)
    num_spec_tokens: int  # K of the step (its largest per-row K), 0..k_max
    kv_len: int  # attention span read from each slot's cache (a kv bucket)
    in_place: bool = False  # every slot < num_rows: attention reads slots [0, num_rows) in place


@torch.inference_mode()
def fixed_shape_step(
    target: Transformer,
    draft: Draft | EagleDraft | None,
    target_cache: KVCache,
    draft_cache: KVCache | None,
    inputs: torch.Tensor,  # [5 + K_max, B] int64 rows: slot, last token, L, K, a, n-gram drafts
    key: GraphKey,
    trash_position: int,
    eagle: EagleState | None = None,  # with an EAGLE draft: the target's features, head cache
    lookup: bool = False,  # EAGLE or lookup: rows 5.. hold a row's full lookup, -1: the head's
    drawn: bool = False,  # drawn acceptance: row 4 holds each row's accepted count
) -> torch.Tensor:
    """Draft (width-1 forwards), verify, greedy accept (`drawn`: accept row 4's counts);
    returns [B, K+2]: a, then output ids.

    Every drafting row's draft cache must already hold [0, L). Rows with K = 0 (and padded rows,
    whose L is the trash position) write only at the trash position of the draft cache. Without
    a model draft (n-gram), the drafts come in: rows 5..5+K of `inputs`, found on the host. No
    host sync, no data-dependent shapes: capturable as a CUDA graph for this key. With
    `key.in_place` every slot id is below `key.num_rows` and the target's and a model draft's
    attention read their caches in place.
    """
    slots, last_tokens, lengths, spec = inputs[0], inputs[1], inputs[2], inputs[3]  # [B] each
    k_step = key.num_spec_tokens
    in_place_slots = key.num_rows if key.in_place else None
    # passed only when set: a model draft may be any callable of the reference's arguments
    in_place = {} if in_place_slots is None else {"in_place_slots": in_place_slots}
    trash = torch.full_like(lengths, trash_position)  # [B]
    drafted: list[torch.Tensor] = []
    if k_step > 0 and draft is None:  # n-gram drafts, looked up on the host
        drafted = list(inputs[_NUM_INPUT_ROWS : _NUM_INPUT_ROWS + k_step])  # K x [B]
    elif k_step > 0 and isinstance(draft, EagleDraft):
        assert eagle is not None
        eagle_ids, _ = draft_passes(
            draft, eagle, slots, last_tokens, lengths, spec > 0, k_step, key.kv_len, trash_position
        )  # [B, K]
        if lookup:  # per row: prompt lookup's drafts where it found all K
            found = inputs[_NUM_INPUT_ROWS : _NUM_INPUT_ROWS + k_step].T  # [B, K]
            eagle_ids = torch.where(found[:, :1] >= 0, found, eagle_ids)
        drafted = list(eagle_ids.unbind(1))
    elif k_step > 0:
        assert isinstance(draft, Draft) and draft_cache is not None
        drafting = spec > 0  # [B]
        token = last_tokens  # [B]
        for index in range(k_step):
            # Forward `index` feeds the last token (index 0) or draft `index` at L + index.
            positions = torch.where(drafting, lengths + index, trash)  # [B]
            logits = draft.model(
                token[:, None],
                positions[:, None],
                draft_cache,
                slots,
                num_layers=draft.num_layers,
                kv_len=key.kv_len,
                **in_place,
            )[:, 0]  # [B, V]
            token = logits.argmax(dim=-1)  # [B]
            drafted.append(token)
    num_rows = key.num_rows
    if drafted:
        draft_ids = torch.stack(drafted, dim=1)  # [B, K]
    else:
        draft_ids = torch.zeros((num_rows, 0), dtype=torch.int64, device=inputs.device)  # [B, 0]
    offsets = torch.arange(k_step + 1, device=inputs.device)[None, :]  # [1, K+1]
    # Verify the last token and the drafts at L..L+K; drafts past a row's K go to the trash.
    positions = torch.where(offsets <= spec[:, None], lengths[:, None] + offsets, trash[:, None])
    verify_ids = torch.cat((last_tokens[:, None], draft_ids), dim=1)  # [B, K+1]
    if eagle is None:
        target_logits = target(
            verify_ids, positions, target_cache, slots, kv_len=key.kv_len, **in_place
        )  # [B, K+1, V]
    else:  # the same forward, keeping the target's features for the head
        verify = ForwardGroup(
            verify_ids, positions, slots, kv_len=key.kv_len, in_place_slots=in_place_slots
        )
        features: list[torch.Tensor] = []
        target_logits = target.forward_groups([verify], target_cache, features_out=features)[0]
        eagle.store([verify], features)
    if drawn:
        num_accepted, output_ids = drawn_accept(draft_ids, target_logits, inputs[4])
    else:
        num_accepted, output_ids = greedy_accept(draft_ids, target_logits, spec)  # [B], [B, K+1]
    return torch.cat((num_accepted[:, None], output_ids), dim=1)  # [B, K+2]


def step_function(options: StepOptions) -> Callable[..., torch.Tensor]:
    """`fixed_shape_step` as `options` run it: as written, or torch.compile'd (one compile per
    key: its ints and the models' switches are guarded constants, no dynamic shapes)."""
    if options.compile_backend is None:
        return fixed_shape_step
    dynamo_config = torch._dynamo.config
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, _COMPILED_KEYS_LIMIT)
    dynamo_config.accumulated_recompile_limit = max(
        dynamo_config.accumulated_recompile_limit, _COMPILED_KEYS_LIMIT
    )
    # Under no_grad, not inference_mode: AOT autograd cannot trace inference tensors' updates
    step: Callable[..., torch.Tensor] = fixed_shape_step.__wrapped__  # type: ignore[attr-defined]
    compiled = torch.compile(
        step, backend=options.compile_backend, mode=options.compile_mode, dynamic=False
    )
    return torch.no_grad()(compiled)


class EagerStepRunner:
    """Runs `fixed_shape_step` directly; counts the distinct keys it has run."""

    def __init__(self, engine: SpecDecodeEngine, options: StepOptions = StepOptions()) -> None:
        self.engine = engine
        self.options = options
        self.step_function = step_function(options)
        self.keys_seen: set[GraphKey] = set()
        # CUDA only: the matrix library per step shape (module docstring)
        self.cublaslt_max_rows = cublaslt_max_rows() if engine.device.type == "cuda" else 0
        max_rows = engine.config.num_slots
        # Static inputs: graphs read them by address, so they are allocated once.
        self.input_buffer = torch.zeros(
            (_NUM_INPUT_ROWS + engine.config.k_max, max_rows),
            dtype=torch.int64,
            device=engine.device,
        )  # [5 + K_max, S]

    def run(self, key: GraphKey, host_inputs: IntArray) -> IntArray:
        """[5 + K_max, key.num_rows] host inputs -> [num_rows, K+2] host outputs (the one
        sync)."""
        self.keys_seen.add(key)
        staged = self.input_buffer[:, : key.num_rows]  # [5 + K_max, B] view of the buffer
        staged.copy_(torch.from_numpy(host_inputs), non_blocking=False)
        out = self._execute(key, staged)  # [B, K+2]
        return out.cpu().numpy().astype(np.int64)

    def _execute(self, key: GraphKey, staged: torch.Tensor) -> torch.Tensor:
        engine = self.engine
        # A graph keeps the kernels it was captured with, so the library holds at capture
        with _blas_library(step_blas_library(key, self.cublaslt_max_rows)):
            return self.step_function(
                engine.target,
                engine.eagle_draft or engine.model_draft,
                engine.target_cache,
                engine.draft_cache,
                staged,
                key,
                engine.trash_position,
                engine.eagle,
                lookup=isinstance(engine.draft, EagleOrLookup),
                drawn=engine.config.drawn_acceptance,
            )


@contextmanager
def _no_automatic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block.

    A dropped engine is a reference cycle (engine <-> runner) that holds its CUDA graphs. If the
    collector frees it during another graph's capture, those graphs are reset, which CUDA
    forbids while a stream captures: the capture fails. torch.cuda.graph no longer collects
    before a capture (unless torch.compiler.config.force_cudagraph_gc), so we pause it here.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CudaGraphStepRunner(EagerStepRunner):
    """Captures `fixed_shape_step` once per key as a CUDA graph, then replays it."""

    def __init__(
        self,
        engine: SpecDecodeEngine,
        options: StepOptions = StepOptions(),
        num_warmup_runs: int = 2,
    ) -> None:
        if engine.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the engine is on {engine.device}")
        super().__init__(engine, options)
        self.num_warmup_runs = num_warmup_runs
        self.num_captures = 0  # graphs captured so far; fixed once every key was seen
        self._graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # One pool for all graphs: they never run concurrently and each output is read right
        # after its replay, so a later graph may reuse an earlier one's memory.
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def captured_keys(self) -> tuple[GraphKey, ...]:
        return tuple(self._graphs)

    def _execute(self, key: GraphKey, staged: torch.Tensor) -> torch.Tensor:
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(key, staged)
            self._graphs[key] = entry
        graph, output = entry
        graph.replay()
        return output

    def _capture(
        self, key: GraphKey, staged: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm-up runs see the real inputs of this step: they write the same K/V the replay
        # writes (same tokens at the same positions), so running them is harmless.
        side = torch.cuda.Stream(device=self.engine.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(side):
            for _ in range(self.num_warmup_runs):
                super()._execute(key, staged)
        torch.cuda.current_stream(self.engine.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with _no_automatic_gc(), torch.cuda.graph(graph, pool=self._pool):
            output = super()._execute(key, staged)  # [B, K+2], lives in the graph's pool
        self.num_captures += 1
        return graph, output


class FastSpecDecodeEngine(SpecDecodeEngine):
    """`SpecDecodeEngine` whose SD step runs at bucketed fixed shapes (see module docstring).

    `runner`: "eager" (any device; the reference for the bucketing) or "cuda-graphs" (CUDA).
    `options`: how the step runs (`StepOptions`). Greedy only (temperature 0). Prefill, slots
    and bookkeeping are the parent's.
    """

    def __init__(
        self,
        target: Transformer,
        draft: AnyDraft | None,
        config: SpecDecodeConfig,
        runner: Literal["eager", "cuda-graphs"] = "eager",
        min_kv_len: int = DEFAULT_MIN_KV_LEN,
        options: StepOptions = StepOptions(),
    ) -> None:
        if config.temperature != 0.0:
            raise ValueError(
                "the fast path is greedy only (temperature 0); use the reference engine for "
                f"temperature {config.temperature}"
            )
        if min_kv_len < 1:
            raise ValueError(f"min_kv_len must be >= 1, got {min_kv_len}")
        super().__init__(target, draft, config)
        self.min_kv_len = min_kv_len
        self.options = options
        self.batch_buckets = batch_buckets(config.num_slots)
        self.runner: EagerStepRunner
        if runner == "eager":
            self.runner = EagerStepRunner(self, options)
        elif runner == "cuda-graphs":
            self.runner = CudaGraphStepRunner(self, options)
        else:
            raise ValueError(f"runner must be 'eager' or 'cuda-graphs', got {runner!r}")

    def all_graph_keys(self) -> list[GraphKey]:
        """Every fixed shape a step of this engine can take."""
        spans = kv_len_buckets(self.config.cache_len, self.min_kv_len)
        in_place = (False, True) if self.options.in_place_attention else (False,)
        return [
            GraphKey(rows, k, span, flag)
            for rows in self.batch_buckets
            for k in range(self.config.k_max + 1)
            for span in spans
            for flag in in_place
        ]

    def run_every_shape(self) -> int:
        """Run the fixed-shape step once at every key (so the CUDA-graph runner captures them
        all now, as vLLM captures at start-up, and no later step pays a capture); returns how
        many. Every row is a padded row: nothing outside the trash position is written."""
        if self.num_free_slots < self.config.num_slots:
            raise RuntimeError("run_every_shape: the engine holds requests")
        keys = self.all_graph_keys()
        for key in keys:
            self.runner.run(key, self._padded_inputs(key.num_rows))
        return len(keys)

    def _padded_inputs(self, num_rows: int) -> IntArray:
        """[5 + K_max, num_rows] step inputs of padded rows only: slot 0, token 0, K = 0 (and
        a = 0), at the trash position; a step fills in its real rows."""
        host_inputs = np.zeros((_NUM_INPUT_ROWS + self.config.k_max, num_rows), dtype=np.int64)
        host_inputs[2, :] = self.trash_position
        return host_inputs

    def graph_key(self, num_rows: int, k_step: int, max_length: int) -> GraphKey:
        """The key of a step over num_rows rows whose longest has its last token at max_length."""
        return GraphKey(
            num_rows=bucket_for(num_rows, self.batch_buckets),
            num_spec_tokens=k_step,
            # Positions read go up to L + K (verification of the last draft).
            kv_len=kv_len_bucket(max_length + k_step + 1, self.config.cache_len, self.min_kv_len),
        )

    def _run_step(
        self,
        slots: IntArray,
        spec: IntArray,
        lengths: IntArray,
        k_step: int,
        drawn: IntArray | None,
        prefill: PrefillSpan | None = None,
    ) -> tuple[StepResult, torch.Tensor | None]:
        """The step at a fixed shape on checked inputs (`step` checks them, as for the
        reference). A fixed-shape step has no room for prefill chunks."""
        if prefill is not None:
            raise ValueError(
                "the fast path runs prefill as its own forward; a fused step needs the "
                "reference engine (fast path off)"
            )
        num_rows = slots.size
        ngram_drafts = None
        if isinstance(self.draft, NgramDraft) and k_step > 0:
            # Prompt lookup on the host, as the reference does; rows verify what they found.
            spec, k_step, ngram_drafts = self._lookup_drafts(slots, spec, lengths)  # [B, K']
        drafting_rows = np.flatnonzero(spec > 0)  # host: rows that draft this step
        if k_step > 0 and self.model_draft is not None:
            self._catch_up_draft(slots[drafting_rows], lengths[drafting_rows])
        elif k_step > 0 and self.eagle is not None:
            self._catch_up_eagle(slots[drafting_rows], lengths[drafting_rows])

        key = self.graph_key(num_rows, k_step, int(lengths.max()))
        if self.options.in_place_attention and int(slots.max()) < key.num_rows:
            key = dataclasses.replace(key, in_place=True)
        host_inputs = self._padded_inputs(key.num_rows)  # [5 + K_max, Bpad]
        host_inputs[0, :num_rows] = slots
        host_inputs[1, :num_rows] = self.token_ids[slots, lengths]
        host_inputs[2, :num_rows] = lengths
        host_inputs[3, :num_rows] = spec
        if drawn is not None:
            host_inputs[4, :num_rows] = drawn
        if ngram_drafts is not None:
            host_inputs[_NUM_INPUT_ROWS : _NUM_INPUT_ROWS + k_step, :num_rows] = ngram_drafts.T
        if isinstance(self.draft, EagleOrLookup) and k_step > 0:
            found = self._full_lookups(slots, spec, lengths)  # [B, K], -1 where the head drafts
            host_inputs[_NUM_INPUT_ROWS : _NUM_INPUT_ROWS + k_step, :num_rows] = found.T
        out = self.runner.run(key, host_inputs)[:num_rows]  # [B, K+2]
        num_accepted = out[:, 0].copy()  # [B]
        output_ids = out[:, 1:].copy()  # [B, K+1]

        result = self._roll_back(
            slots, lengths, drafting_rows, k_step, num_accepted, output_ids, spec
        )
        return result, None

    def _catch_up_draft(self, slots: IntArray, lengths: IntArray) -> None:
        """Eager forward of the tokens the draft has not seen, so its cache holds [0, L)."""
        assert self.model_draft is not None and self.draft_cache is not None
        cache = self.draft_cache
        behind = cache.lengths[slots] < lengths  # [R]
        if not behind.any():
            return
        lagging = slots[behind]
        self._forward_span(
            self.model_draft.model,
            self.model_draft.num_layers,
            cache,
            lagging,
            cache.lengths[lagging],
            lengths[behind],
            need_logits=False,
        )
        cache.lengths[lagging] = lengths[behind]


@dataclass(slots=True)
class _Pooled:
    target: Transformer  # held, so that its id (in the pool's key) stays its own
    engine: SpecDecodeEngine
    release: Callable[[], None] | None  # how its current user gives back its slots


class EnginePool:
    """The engines of one measurement's real runs (speedup arms, validation cells), kept
    across runs per (target, draft, engine config, fast path).

    A fast-path engine keeps its fixed shapes, and under CUDA graphs each shape is captured
    (tens of ms) the first time it runs: a fresh engine per run would put captures inside
    every timed run. So a pooled fast-path engine is reused by every later run of the same
    config, and a CUDA-graph one runs every shape once when it is built. The reference path
    ("off") has no shapes to keep: it gets a fresh engine each time, as without a pool.

    Runs that step at the same time (interleaved, `sim.engine.run_interleaved`) each take
    their engines from a lane of their own (`lane(i)`): the same pool, but engines of lane i
    serve only lane i.
    """

    def __init__(self) -> None:
        self._engines: dict[tuple[Any, ...], _Pooled] = {}
        self._lane = 0

    def lane(self, index: int) -> EnginePool:
        """This pool as lane `index` sees it (lane 0 is the pool itself)."""
        view = EnginePool()
        view._engines = self._engines  # shared: one pool, engines keyed by lane too
        view._lane = index
        return view

    def engine(
        self,
        target: Transformer,
        draft: AnyDraft | None,
        config: SpecDecodeConfig,
        fast_path: str = "off",
        release: Callable[[], None] | None = None,
    ) -> SpecDecodeEngine:
        """An engine with every slot free: the pooled one for this config, or a new one.
        `release`: how its new user gives back the slots it still holds (a run's last
        finished requests are freed by no later step); called before the engine serves
        again."""
        if fast_path == "off":
            return build_spec_decode_engine(target, draft, config, fast_path)
        key = (id(target), draft, config, fast_path, self._lane)
        entry = self._engines.get(key)
        if entry is None:
            engine = build_spec_decode_engine(target, draft, config, fast_path)
            if fast_path == "cuda-graphs":
                assert isinstance(engine, FastSpecDecodeEngine)
                engine.run_every_shape()
            self._engines[key] = _Pooled(target, engine, release)
            return engine
        if entry.release is not None:
            entry.release()
        engine = entry.engine
        if engine.num_free_slots < config.num_slots:
            raise RuntimeError("EnginePool: the pooled engine still holds requests")
        engine.generator.manual_seed(config.seed)  # a reused engine draws as a new one would
        entry.release = release
        return engine

    def __len__(self) -> int:
        return len(self._engines)


def build_spec_decode_engine(
    target: Transformer,
    draft: AnyDraft | None,
    config: SpecDecodeConfig,
    fast_path: str = "off",
    options: StepOptions = StepOptions(),
) -> SpecDecodeEngine:
    """The reference engine ("off") or the fast path ("eager", "cuda-graphs") whose step runs
    as `options` say."""
    if fast_path == "off":
        if options != StepOptions():
            raise ValueError("step options need a fast path (eager or cuda-graphs)")
        return SpecDecodeEngine(target, draft, config)
    if fast_path in ("eager", "cuda-graphs"):
        return FastSpecDecodeEngine(target, draft, config, runner=fast_path, options=options)  # type: ignore[arg-type]
    raise ValueError(f"fast_path must be one of {', '.join(FAST_PATH_KINDS)}, got {fast_path!r}")
