"""TorchExecutor: the real draft + target models behind the simulator's `Executor` plug point.

The engine loop (`sim.engine`) and scheduler (`sim.scheduler`) are the same as in simulation; this
executor runs each `ScheduledBatch` on `backend.engine.SpecDecodeEngine` and reports the measured
wall time, the real accepted counts and where an EOS token fell.

Per `execute(batch)`:
1. free the engine slots of `finished_req_ids` (state dropped) and `preempted_req_ids` (KV
   dropped, known tokens kept: a preempted request is recomputed from scratch later);
2. allocate a slot for each of `new_req_ids` holding all its known tokens (the prompt, plus the
   output tokens so far after a preemption, exactly what the scheduler recomputes);
3. one SD step for the decode rows with the batch's per-row K and the prefill rows' chunks:
   by default ("fused", vLLM's mixed batch) in ONE target forward, the verify block and the
   chunks as two groups (`Transformer.forward_groups`: weights read once, no decode row padded
   to a chunk's length; the chunks are one block padded to the longest); "separate" runs the
   chunks in a forward of their own after the step (what the fixed-shape fast path must do);
4. duration = perf_counter around all of it, after `torch.cuda.synchronize()` on CUDA (kept
   per step in `execute_s`).

Truth about positions: the executor uses the engine's OWN per-slot lengths for where tokens go,
never `batch.num_computed_tokens`. In async scheduling, step t+1 is scheduled before step t's
outcome is known, with optimistic `num_computed_tokens` (all drafts assumed accepted); the engine
has already applied step t's real outcome when it runs step t+1, so its lengths are exact.
Prefill chunk sizes are exact in both modes; a chunk is clipped to the tokens left, and the
executor checks its own "prompt complete" against `batch.completes_prompt`.

Drawn acceptance (`acceptance` given: timing at production shapes on random weights,
docs/validation.md): each decode row's (drafted, accepted) counts are drawn before the step
from the simulator's acceptance model for the same run and seed, exactly as
`sim.executor.FittedExecutor` draws them (same model, same common-random-number streams, same
calls), and the engine runs the step with them (`SpecDecodeConfig.drawn_acceptance`): a real run
and its simulated twin then see the same accepted counts per request and step wherever they
schedule the same K; the tokens mean nothing and EOS is ignored.

This module does not schedule, choose K, keep metrics or tokenize (a tokenizer callable may be
passed in); prompts without text get synthetic token ids from a seeded generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dsd.backend.engine import AnyDraft, SpecDecodeConfig, SpecDecodeEngine, StepResult
from dsd.backend.fast_path import EnginePool, build_spec_decode_engine
from dsd.backend.model import Transformer
from dsd.common.arrays import IntArray
from dsd.common.errors import InputError
from dsd.sim.models.latency import PREFILL_FORWARDS, PrefillForward
from dsd.sim.types import AcceptanceModel, ScheduledBatch, StepOutcome
from dsd.traces.workload import RequestSpec


def engine_prefill_forward(fast_path: str) -> PrefillForward:
    """How the real engine runs a step's prefill chunks: in the verify forward ("fused") on the
    reference step, in a forward of their own on the fixed-shape fast path."""
    return "fused" if fast_path == "off" else "separate"


@dataclass
class _RequestState:
    """What the executor keeps per request between steps."""

    token_ids: IntArray  # [n] known tokens while not in a slot (prompt, or prompt + outputs)
    slot: int | None = None  # engine slot while the request holds KV
    num_prompt_tokens: int = 0  # prompt length, for reports
    num_preemptions: int = field(default=0)  # times its KV was dropped


class TorchExecutor:
    """Real SD on torch for `sim.engine`: implements `sim.types.Executor`."""

    def __init__(
        self,
        target: Transformer,
        draft: AnyDraft | None,
        *,
        max_num_seqs: int,
        max_model_len: int,
        k_max: int,
        temperature: float = 0.0,
        seed: int = 0,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        eos_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        fast_path: str = "off",
        prefill_forward: PrefillForward | None = None,
        engines: EnginePool | None = None,
        acceptance: AcceptanceModel | None = None,
    ) -> None:
        """`tokenize`: prompt text -> ids (requests with text need it); `eos_token_ids`: ids
        that stop a request (default: the target config's); `ignore_eos`: never stop early
        (like `vllm bench serve --ignore-eos`), so output lengths follow the workload;
        `fast_path`: "off" (reference step), "eager" or "cuda-graphs" (`backend.fast_path`);
        `prefill_forward`: a step's prefill chunks in the decode rows' verify forward ("fused",
        reference step only) or in a forward of their own ("separate"); None: the fast path's
        way (`engine_prefill_forward`); `engines`: where to take the engine from (a pool kept
        across the runs of a measurement, `backend.fast_path.EnginePool`; None: a new one);
        `acceptance`: drawn acceptance (module docstring), the simulator's model for the run
        (`sim.build.run_acceptance_model`), EOS then ignored; None: the engine's own matches."""
        if prefill_forward is None:
            prefill_forward = engine_prefill_forward(fast_path)
        if prefill_forward not in PREFILL_FORWARDS:
            raise ValueError(
                f"prefill_forward must be one of {PREFILL_FORWARDS}, got {prefill_forward!r}"
            )
        if prefill_forward == "fused" and fast_path != "off":
            raise ValueError(
                f"prefill_forward 'fused' needs fast_path 'off' (the {fast_path} step has a "
                "fixed shape, with no room for prefill chunks)"
            )
        self.prefill_forward = prefill_forward
        engine_config = SpecDecodeConfig(
            num_slots=max_num_seqs,
            max_model_len=max_model_len,
            k_max=k_max,
            temperature=temperature,
            seed=seed,
            drawn_acceptance=acceptance is not None,
        )
        self.engine: SpecDecodeEngine = (
            build_spec_decode_engine(target, draft, engine_config, fast_path=fast_path)
            if engines is None
            else engines.engine(target, draft, engine_config, fast_path, release=self.release)
        )
        self.tokenize = tokenize
        self.acceptance = acceptance
        ignore_eos = ignore_eos or acceptance is not None  # drawn tokens mean nothing
        eos = target.config.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)
        self.eos_token_ids: IntArray = np.array(
            [] if ignore_eos else sorted(set(eos)), dtype=np.int64
        )
        self._seed_sequence = np.random.SeedSequence(seed)
        self._requests: dict[int, _RequestState] = {}
        # Output ids of finished requests, as generated (the scheduler may count fewer: it trims
        # tokens past max_tokens or an EOS), and every request's prompt ids (tokenized or
        # synthetic). For reports, replay recordings and tests; small next to the KV cache.
        self.finished_output_ids: dict[int, IntArray] = {}
        self.prompt_ids: dict[int, IntArray] = {}
        vocab = target.config.vocab_size
        specials = set(eos) | ({target.config.bos_token_id} - {None})
        # Synthetic prompts avoid special ids (an EOS inside a prompt would read as a stop).
        self._synthetic_vocab: IntArray = np.array(
            [token for token in range(vocab) if token not in specials], dtype=np.int64
        )
        # Each execute's own wall seconds, in call order: the engine loop's wall step is this
        # plus the host work around it (planning, policy, metrics), which this separates
        self.execute_s: list[float] = []
        self._is_cuda = self.engine.device.type == "cuda"
        # Async scheduling runs the step on a worker thread (sim.engine) only where that pays:
        # CUDA kernels run while the host plans; a CPU step holds the GIL the planning needs.
        self.overlaps_host = self._is_cuda

    # ------------------------------------------------------------------------ Executor
    def add_request(self, req_id: int, spec: RequestSpec) -> None:
        if req_id in self._requests:
            raise ValueError(f"request {req_id} was added twice")
        if spec.prompt is not None:
            if self.tokenize is None:
                raise InputError(f"request {req_id}: has prompt text but no tokenizer was given")
            token_ids = np.asarray(list(self.tokenize(spec.prompt)), dtype=np.int64)
            if token_ids.size != spec.prompt_len:
                raise InputError(
                    f"request {req_id}: prompt tokenizes to {token_ids.size} tokens but "
                    f"prompt_len is {spec.prompt_len}"
                )
        else:
            # One stream per request id, so ids do not depend on arrival order.
            child = np.random.SeedSequence(
                self._seed_sequence.entropy, spawn_key=(*self._seed_sequence.spawn_key, req_id)
            )
            rng = np.random.default_rng(child)
            token_ids = rng.choice(self._synthetic_vocab, size=spec.prompt_len)
        if token_ids.size > self.engine.config.max_model_len:
            raise InputError(
                f"request {req_id}: prompt of {token_ids.size} tokens exceeds max_model_len "
                f"{self.engine.config.max_model_len}"
            )
        self._requests[req_id] = _RequestState(
            token_ids=token_ids, num_prompt_tokens=int(token_ids.size)
        )
        self.prompt_ids[req_id] = token_ids
        if self.acceptance is not None:
            self.acceptance.add_request(req_id, spec)

    def execute(self, batch: ScheduledBatch) -> StepOutcome:
        start_s = time.perf_counter()
        engine = self.engine
        for req_id in batch.finished_req_ids:
            if self.acceptance is not None:
                self.acceptance.remove_request(req_id)
            state = self._requests.pop(req_id, None)
            if state is None:
                continue
            tokens = state.token_ids if state.slot is None else engine.free_slot(state.slot)
            self.finished_output_ids[req_id] = tokens[state.num_prompt_tokens :]
        for req_id in batch.preempted_req_ids:
            state = self._requests[req_id]
            if state.slot is not None:
                state.token_ids = engine.free_slot(state.slot)
                state.slot = None
                state.num_preemptions += 1
        for req_id in batch.new_req_ids:
            state = self._requests[req_id]
            if state.slot is None:
                state.slot = engine.alloc_slot(state.token_ids)

        num_rows = batch.batch_size
        num_decode = batch.num_decode_reqs
        slots = np.array([self._slot(int(r)) for r in batch.req_ids], dtype=np.int64)  # [B]
        stop_index = np.full(num_rows, -1, dtype=np.int64)  # [B]
        num_accepted = np.zeros(num_decode, dtype=np.int64)  # [D]
        num_drafted = np.zeros(num_decode, dtype=np.int64)  # [D]

        decode_slots, spec = slots[:num_decode], batch.num_spec_tokens[:num_decode]
        prefill_slots, chunks = slots[num_decode:], batch.num_scheduled_tokens[num_decode:]
        drawn = None
        if self.acceptance is not None and num_decode:
            # Drawn as the simulator draws them (sim.executor.FittedExecutor): a row that drafts
            # fewer than its K verifies only its drafts, as the simulator prices it.
            spec, drawn = self.acceptance.sample_outcomes(
                batch.req_ids[:num_decode], batch.num_output_tokens[:num_decode], spec
            )
        result: StepResult | None = None
        first_tokens: IntArray | None = None
        if num_decode and prefill_slots.size and self.prefill_forward == "fused":
            result, first_tokens = engine.step_with_prefill(
                decode_slots, spec, prefill_slots, chunks, drawn
            )
        else:
            if num_decode:
                result = engine.step(decode_slots, spec, drawn)
            if prefill_slots.size:
                first_tokens = engine.prefill(prefill_slots, chunks)
        if result is not None:
            num_accepted = result.num_accepted
            num_drafted = result.num_drafted
            stop_index[:num_decode] = self._first_stop(result.output_token_ids, num_accepted)
        if first_tokens is not None:
            completed = first_tokens >= 0  # [P]
            if not np.array_equal(completed, batch.completes_prompt[num_decode:]):
                raise RuntimeError(
                    f"step {batch.step_index}: prompt completion disagrees with the scheduler "
                    f"(executor {completed.tolist()}, "
                    f"scheduler {batch.completes_prompt[num_decode:].tolist()})"
                )
            is_eos = np.isin(first_tokens, self.eos_token_ids) & completed  # [P]
            stop_index[num_decode:] = np.where(is_eos, 0, -1)

        if self._is_cuda:
            torch.cuda.synchronize(engine.device)
        duration_s = max(time.perf_counter() - start_s, 1e-9)
        self.execute_s.append(duration_s)
        return StepOutcome(
            duration_s=duration_s,
            num_accepted=num_accepted,
            stop_index=stop_index,
            num_drafted=num_drafted,
        )

    # ------------------------------------------------------------------------ helpers
    def output_token_ids(self, req_id: int) -> IntArray:
        """The output tokens a live request has so far (after its prompt)."""
        state = self._requests[req_id]
        tokens = state.token_ids if state.slot is None else self.engine.sequence(state.slot)
        return tokens[state.num_prompt_tokens :].copy()

    def all_output_ids(self) -> dict[int, IntArray]:
        """Output ids of every request seen: finished ones and those still holding state (the
        run's last finished requests are only freed by a batch that never comes)."""
        outputs = dict(self.finished_output_ids)
        for req_id in self._requests:
            outputs[req_id] = self.output_token_ids(req_id)
        return outputs

    def release(self) -> None:
        """Free every slot still held (the run's last finished requests, or those of a run that
        stopped), keeping their output ids: the engine may then serve another executor."""
        for req_id, state in list(self._requests.items()):
            if state.slot is not None:
                self.finished_output_ids[req_id] = self.output_token_ids(req_id)
                self.engine.free_slot(state.slot)
                del self._requests[req_id]

    def _slot(self, req_id: int) -> int:
        state = self._requests.get(req_id)
        if state is None or state.slot is None:
            raise RuntimeError(f"request {req_id} is scheduled but holds no slot")
        return state.slot

    def _first_stop(self, output_ids: IntArray, num_accepted: IntArray) -> IntArray:
        """[D] index among each row's a + 1 emitted tokens of the first EOS, -1 if none."""
        if self.eos_token_ids.size == 0:
            return np.full(output_ids.shape[0], -1, dtype=np.int64)
        emitted = np.arange(output_ids.shape[1])[None, :] <= num_accepted[:, None]  # [D, K+1]
        is_eos = np.isin(output_ids, self.eos_token_ids) & emitted  # [D, K+1]
        return np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), -1).astype(np.int64)
