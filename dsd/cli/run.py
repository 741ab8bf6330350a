"""`dsd run`: a workload through the real SD engine (TorchExecutor) in the simulator's loop.

Wiring only: models from `backend.model`/`backend.weights`, the executor from
`backend.executor`, the workload from `traces.registry`, the policy from `policies.spec`, the
loop and metrics from `sim.engine` with the wall clock. Prints the same `vllm bench serve`-keyed
JSON as `dsd simulate` (plus the run's settings).

Model specs (`--target`, `--draft`):
- a named shape from `backend.model.MODEL_CONFIGS` (`tiny`, `llama-3.1-8b`, ...) with random
  weights; `random:NAME` forces random weights for any named shape (`random:smollm2-135m`);
- anything `backend.weights.load_model` reads: `smollm2-135m` (the real weights), a .gguf file,
  an HF or dsd checkpoint folder;
- `--draft early-exit:K`: the target's first K layers + final norm + head; `--draft none`: no
  draft (plain decoding; the policy's K is forced to 0).
Prompts: with a loaded model that names its tokenizer, prompt text is chat-templated and
tokenized and prompt lengths are re-measured with it; otherwise (random weights) requests keep
the dataset's prompt lengths and get synthetic token ids.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from dsd.cli.flags import (
    Burstiness,
    EndS,
    Fraction,
    MaxConcurrency,
    MaxOutputLen,
    MaxPromptLen,
    NumPrompts,
    NumRows,
    OutputLen,
    RandomInputLen,
    RandomOutputLen,
    RandomRangeRatio,
    RawPrompt,
    RequestRate,
    RolloutAlpha,
    RolloutDist,
    RolloutMax,
    RolloutMedian,
    RolloutMin,
    RolloutPromptLen,
    RolloutPromptSet,
    RolloutSigma,
    Shuffle,
    StartS,
    TimeScale,
    WorkloadFlags,
)
from dsd.common.errors import InputError
from dsd.reports.run_outputs import json_default


def _dtype(name: str, device: str) -> Any:
    import torch

    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in choices:
        raise InputError(f"--dtype: choose from auto, {', '.join(choices)}; got {name!r}")
    return choices[name]


def _build_model(spec: str, device: str, dtype: Any, seed: int) -> tuple[Any, str | None]:
    """(Transformer, tokenizer name or None) for a model spec (see module docstring)."""
    from dsd.backend.model import MODEL_CONFIGS, Transformer, init_random_
    from dsd.backend.weights import SMOLLM2_SPEC, load_model

    name = spec.removeprefix("random:")
    if spec.startswith("random:") or (spec in MODEL_CONFIGS and spec != SMOLLM2_SPEC):
        if name not in MODEL_CONFIGS:
            raise InputError(
                f"model {spec!r}: unknown shape; known: {', '.join(sorted(MODEL_CONFIGS))}"
            )
        model = Transformer(MODEL_CONFIGS[name], device=device, dtype=dtype)
        return init_random_(model, seed).eval(), None
    loaded = load_model(spec, device=device, dtype=dtype)
    return loaded.model.eval(), loaded.tokenizer_name


def run_backend(
    *,
    target: str,
    draft: str,
    policy: str,
    num_spec_tokens: int,
    workload_flags: WorkloadFlags,
    dataset_name: str,
    device: str,
    dtype_name: str,
    temperature: float,
    seed: int,
    max_model_len: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int,
    scheduling: str,
    profile_path: str | None,
    ignore_eos: bool,
    fast_path: str = "off",
    learned_profile_path: str | None = None,
) -> dict[str, Any]:
    """Run and return the metrics dict (vLLM bench keys + ours + the run's settings).

    `learned_profile_path`: write the profile the policy learnt there (the structured bandit);
    the metrics then say `learned_profile` = the path, or None when it saw no timed decode
    step."""
    import torch

    from dsd.backend.engine import Draft
    from dsd.backend.executor import TorchExecutor
    from dsd.backend.tokenizer import chat_prompt, load_tokenizer
    from dsd.backend.weights import check_pair
    from dsd.policies.profile_io import load_profile, save_profile
    from dsd.policies.spec import parse_policy
    from dsd.sim.engine import Engine, EngineConfig
    from dsd.sim.runner import learned_profile
    from dsd.sim.scheduler import Scheduler, SchedulerConfig
    from dsd.traces.registry import build_workload

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: CUDA is not available on this machine")
    if num_spec_tokens < 0:
        raise InputError(f"--num-spec-tokens must be >= 0, got {num_spec_tokens}")
    dtype = _dtype(dtype_name, device)
    target_model, tokenizer_name = _build_model(target, device, dtype, seed)

    draft_obj: Draft | None = None
    if draft.lower() == "none":
        num_spec_tokens = 0
    elif draft.startswith("early-exit:"):
        depth_text = draft.removeprefix("early-exit:")
        if not depth_text.isdigit() or not 1 <= int(depth_text) < target_model.config.num_layers:
            raise InputError(
                f"--draft {draft}: K must be an integer in [1, "
                f"{target_model.config.num_layers - 1}] (layers of the target)"
            )
        draft_obj = Draft.early_exit(target_model, int(depth_text))
    else:
        draft_model, draft_tokenizer = _build_model(draft, device, dtype, seed + 1)
        check_pair(target_model.config, draft_model.config, tokenizer_name, draft_tokenizer)
        draft_obj = Draft(draft_model)
    if draft_obj is None:
        num_spec_tokens = 0

    # workload_flags.seed is the run's --seed (one seed for weights, workload and sampling).
    workload = build_workload(dataset_name, **workload_flags.arguments())
    tokenize = None
    if tokenizer_name is not None:
        tokenizer = load_tokenizer(tokenizer_name)

        def tokenize(text: str) -> list[int]:
            return list(tokenizer.encode(chat_prompt(text)))

        requests = tuple(
            replace(r, prompt_len=len(tokenize(r.prompt))) if r.prompt is not None else r
            for r in workload.requests
        )
    else:
        # Random weights: the text means nothing to the model; keep lengths, synthesize ids.
        requests = tuple(replace(r, prompt=None) for r in workload.requests)
    workload = replace(workload, requests=requests)
    longest = max(r.prompt_len + r.output_len for r in workload.requests)
    if any(r.prompt_len >= max_model_len for r in workload.requests):
        raise InputError(
            f"--max-model-len {max_model_len}: a prompt has {max(r.prompt_len for r in requests)}"
            " tokens; raise it"
        )

    max_concurrency = workload_flags.max_concurrency
    num_seqs = max_num_seqs or min(256, max_concurrency or len(workload.requests))
    block_size = 16
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=max_model_len,
            # The executor holds a full max_model_len slot per sequence: the pool mirrors that.
            num_kv_blocks=num_seqs * math.ceil(max_model_len / block_size),
            block_size=block_size,
            k_max=num_spec_tokens,
            max_num_seqs=num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            scheduling=scheduling,  # type: ignore[arg-type]
        )
    )
    profile = load_profile(profile_path) if profile_path else None
    k_policy = parse_policy(policy, profile=profile, k_max=num_spec_tokens, max_num_seqs=num_seqs)
    if learned_profile_path is not None and not hasattr(k_policy, "learned_profile"):
        raise InputError(
            f"--learned-profile: policy {policy!r} learns no profile (use --policy bandit)"
        )
    executor = TorchExecutor(
        target_model,
        draft_obj,
        max_num_seqs=num_seqs,
        max_model_len=max_model_len,
        k_max=num_spec_tokens,
        temperature=temperature,
        seed=seed,
        tokenize=tokenize,
        ignore_eos=ignore_eos,
        fast_path=fast_path,
    )
    result = Engine(scheduler, executor, k_policy, workload, EngineConfig(clock="wall")).run()
    metrics = dict(result.metrics)
    if learned_profile_path is not None:
        learnt = learned_profile(k_policy)
        if learnt is not None:
            save_profile(learnt, learned_profile_path)
        metrics["learned_profile"] = learned_profile_path if learnt is not None else None
    metrics.update(
        {
            "backend": "dsd-torch",
            "model_id": target,
            "draft": draft,
            "policy": policy,
            "num_spec_tokens": num_spec_tokens,
            "dataset_name": dataset_name,
            "max_concurrency": max_concurrency,
            "num_prompts": len(workload.requests),
            "device": str(executor.engine.device),
            "dtype": str(dtype).removeprefix("torch."),
            "temperature": temperature,
            "seed": seed,
            "scheduling": scheduling,
            "max_model_len": max_model_len,
            "longest_request_tokens": longest,
            "num_preemptions": result.num_preemptions,
            "fast_path": fast_path,
        }
    )
    return metrics


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("run")
    def run_command(
        target: Annotated[str, typer.Option(help="Target model spec (named shape, checkpoint).")],
        draft: Annotated[
            str, typer.Option(help="Draft: model spec, early-exit:K, or none.")
        ] = "none",
        policy: Annotated[str, typer.Option(help="K policy SPEC (e.g. static:3).")] = "static:3",
        num_spec_tokens: Annotated[int, typer.Option(help="k_max (num_speculative_tokens).")] = 4,
        max_concurrency: MaxConcurrency = None,
        num_prompts: NumPrompts = None,
        dataset_name: Annotated[str, typer.Option(help="Workload name or file.")] = "mt-bench",
        output_len: OutputLen = None,
        request_rate: RequestRate = math.inf,
        burstiness: Burstiness = 1.0,
        raw_prompt: RawPrompt = False,
        shuffle: Shuffle = False,
        random_input_len: RandomInputLen = 1024,
        random_output_len: RandomOutputLen = 128,
        random_range_ratio: RandomRangeRatio = 0.0,
        time_scale: TimeScale = 1.0,
        start_s: StartS = 0.0,
        end_s: EndS = math.inf,
        fraction: Fraction = None,
        num_rows: NumRows = None,
        max_prompt_len: MaxPromptLen = None,
        max_output_len: MaxOutputLen = None,
        rollout_dist: RolloutDist = "lognormal",
        rollout_median: RolloutMedian = 1024.0,
        rollout_sigma: RolloutSigma = 1.0,
        rollout_alpha: RolloutAlpha = 1.5,
        rollout_min: RolloutMin = 256.0,
        rollout_max: RolloutMax = 16384,
        rollout_prompt_len: RolloutPromptLen = 512,
        rollout_prompt_set: RolloutPromptSet = None,
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
        temperature: Annotated[float, typer.Option(help="0: greedy; > 0: sampling.")] = 0.0,
        seed: Annotated[int, typer.Option(help="Run seed (weights, prompts, sampling).")] = 0,
        max_model_len: Annotated[int, typer.Option(help="Longest sequence, tokens.")] = 2048,
        max_num_seqs: Annotated[int | None, typer.Option(help="Default: concurrency.")] = None,
        max_num_batched_tokens: Annotated[int, typer.Option(help="Token budget/step.")] = 8192,
        scheduling: Annotated[str, typer.Option(help="sync or async.")] = "sync",
        profile: Annotated[str | None, typer.Option(help="Profile JSON for goodput.")] = None,
        ignore_eos: Annotated[bool, typer.Option(help="Never stop at EOS.")] = False,
        fast_path: Annotated[
            str, typer.Option(help="Decode path: off (reference), eager, cuda-graphs.")
        ] = "off",
        json_output: Annotated[bool, typer.Option("--json", help="Print the JSON.")] = False,
        output: Annotated[str | None, typer.Option(help="Also write the JSON here.")] = None,
        learned_profile: Annotated[
            str | None,
            typer.Option(
                help="Write the profile the bandit learnt here (--policy bandit; a prior for "
                "the next run: bandit:prior=PATH)."
            ),
        ] = None,
    ) -> None:
        """Run a workload on the real SD engine and report vLLM bench metrics."""
        from dsd.common.atomic import atomic_write_text

        workload_flags = WorkloadFlags.from_values(locals())
        workload_flags.arguments()  # bad workload flags fail here, before any model is built
        if learned_profile is not None:  # written after the run: a bad path must fail now
            folder = Path(learned_profile).resolve().parent
            if Path(learned_profile).is_dir():
                raise InputError(f"--learned-profile {learned_profile}: is a folder, not a file")
            if not folder.is_dir():
                raise InputError(f"--learned-profile {learned_profile}: no folder {folder}")
        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise InputError(f"--device: choose cpu or cuda, got {device!r}")
        if scheduling not in ("sync", "async"):
            raise InputError(f"--scheduling: choose sync or async, got {scheduling!r}")
        if fast_path not in ("off", "eager", "cuda-graphs"):
            raise InputError(f"--fast-path: choose off, eager or cuda-graphs, got {fast_path!r}")
        metrics = run_backend(
            target=target,
            draft=draft,
            policy=policy,
            num_spec_tokens=num_spec_tokens,
            workload_flags=workload_flags,
            dataset_name=dataset_name,
            device=device,
            dtype_name=dtype,
            temperature=temperature,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            scheduling=scheduling,
            profile_path=profile,
            ignore_eos=ignore_eos,
            fast_path=fast_path,
            learned_profile_path=learned_profile,
        )
        text = json.dumps(metrics, indent=2, default=json_default, allow_nan=True)
        if output:
            atomic_write_text(output, text + "\n")
        if json_output:
            typer.echo(text)
        else:
            keys = (
                "completed",
                "total_output_tokens",
                "mean_tpot_ms",
                "mean_ttft_ms",
                "output_throughput",
                "spec_decode_acceptance_length",
            )
            for key in keys:
                typer.echo(f"{key}: {metrics.get(key)}")
