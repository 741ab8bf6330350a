"""`dsd profile` as one call: the profiler's config from options, the acceptance prompt set,
`backend.profiler.profile_pair`, and the profile file (native or PR #32374's format). Every
default of the command is this function's signature."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dsd.backend.fast_path import check_fast_path
from dsd.backend.pair import ModelPair
from dsd.backend.profiler import ProfileConfig, dataset_prompts, profile_pair
from dsd.common import invocation
from dsd.common.errors import InputError
from dsd.common.progress import ProgressFactory, no_progress
from dsd.common.user_paths import check_output_file
from dsd.policies.profile import Profile
from dsd.policies.profile_io import save_pr32374, save_profile


def profile_to_file(
    pair: ModelPair,
    *,
    out: str | Path,
    batch_sizes: Sequence[int] = (1, 4, 16),
    k: Sequence[int] = (0, 1, 3, 5),
    context_lens: Sequence[int] = (128,),
    prefill_tokens: Sequence[int] = (32, 128, 512),
    dataset: str = "mt-bench",
    num_prompts: int | None = None,
    output_len: int | None = None,
    warmup: int = 3,
    iters: int = 10,
    max_remeasure: int = 2,
    allow_noisy: bool = False,
    adaptive_target_pct: float | None = None,
    adaptive_budget_s: float = 600.0,
    host_overhead_output_len: int = 32,
    temperature: float = 0.0,
    ignore_eos: bool = False,
    seed: int = 0,
    fast_path: str = "off",
    file_format: str = "dsd-profile",
    progress: ProgressFactory = no_progress,
) -> Profile:
    """Measure ITL(B, K, context), prefill, acceptance and the loop's host overhead of a pair
    into a profile written to `out` (`file_format` dsd-profile, or dsd-json for PR #32374's
    file); returns it. Points that fail the timing checks (`policies.profile_quality`) are
    measured again up to `max_remeasure` times; a profile that still fails is refused (an
    InputError naming the points) unless `allow_noisy`. `adaptive_target_pct`: add batch sizes
    where the ITL table interpolates worst until each interior B is predicted from its
    neighbours within that many percent, or `adaptive_budget_s` runs out. `ignore_eos`: the
    acceptance prompts run to their output length past an EOS (as `dsd validate` runs them)."""
    if file_format not in ("dsd-profile", "dsd-json"):
        raise InputError(f"file_format: choose dsd-profile or dsd-json, got {file_format!r}")
    check_output_file(out, "out")  # before minutes of measuring, not after
    check_fast_path(fast_path, str(pair.device))
    if pair.draft is None:
        raise InputError("draft: profiling needs a draft (a model spec or early-exit:N)")
    eos = (
        () if pair.tokenizer_name is None or ignore_eos else tuple(pair.target.config.eos_token_ids)
    )
    config = ProfileConfig(
        batch_sizes=tuple(batch_sizes),
        spec_tokens=tuple(k),
        context_lens=tuple(context_lens),
        prefill_token_counts=tuple(prefill_tokens),
        num_warmup=warmup,
        num_iters=iters,
        max_remeasure=max_remeasure,
        allow_noisy=allow_noisy,
        adaptive_target_pct=adaptive_target_pct,
        adaptive_budget_s=adaptive_budget_s,
        host_overhead_output_len=host_overhead_output_len,
        acceptance_output_len=output_len,
        temperature=temperature,
        seed=seed,
        fast_path=fast_path,
        eos_token_ids=eos,
    )
    prompts, output_lens, prompt_keys = dataset_prompts(
        pair, dataset, num_prompts=num_prompts, output_len=output_len, seed=seed
    )
    metadata = {
        "target": pair.target_spec,
        "draft": pair.draft_spec,
        "dataset": dataset,
        "num_prompts": len(prompts),
        "command": invocation.command_line(),
        "temperature": temperature,
        "ignore_eos": ignore_eos,
    }
    with progress(config.num_units(len(prompts)), "profiling") as advance:
        measured = profile_pair(
            pair.target, pair.draft, config, prompts, output_lens, metadata, advance, prompt_keys
        )
    if file_format == "dsd-json":
        save_pr32374(measured, out)
    else:
        save_profile(measured, out)
    return measured
