"""What a validation measures: the hardware report's plan (`HardwarePlan`, full and quick) and
the run config of one validation cell. Plain data and configs: nothing here runs a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsd.sim.config import RunConfig
from dsd.sim.run_fields import run_config

# The profile re-timed around a validation's real runs, in its report folder (docs/validation.md)
RETIMED_PROFILE_NAME = "profile_retimed.json"


@dataclass(frozen=True)
class HardwarePlan:
    """What `hardware_report` measures (the full plan, or `QUICK_HARDWARE_PLAN`)."""

    k_values: tuple[int, ...]  # static K of the crossover; the profile's K (0, 1, k_max in it)
    batch_sizes: tuple[int, ...]  # profiled B
    concurrency: tuple[int, ...]  # validated C
    dynamic_policies: tuple[str, ...]  # policies beside static K in every cell
    context_lens: tuple[int, ...]  # profiled context lengths
    prefill_tokens: tuple[int, ...]
    acceptance_prompts: int  # prompts of the profile's acceptance run
    profile_iters: int
    profile_warmup: int
    speedup_prompts: int  # prompts of the B = 1 speedup arms
    speedup_repeats: int
    speedup_k: tuple[int, ...]  # static K of the speedup arms (plus goodput)
    # more B = 1 arms, 'DRAFT POLICY [K_MAX]' (`Arm.parse`): drafts other than the report's
    speedup_extra_arms: tuple[str, ...]
    prompts_per_concurrency: int  # validation requests per cell = this x C
    trials: int  # real runs per validation cell
    retime_share: float  # share of the profile's points each timing round re-times
    output_len: int | None  # max_tokens of every request; None: the dataset's
    allow_noisy_profile: bool


# The full plan: 65-90 minutes on the 2-core CPU with SmolLM2-135M at one thread. Why each figure
# (two contexts, five trials, 20 profile rounds, noisy points kept) is docs/validation.md's "The
# plan"; what each choice measured is in the results' notes.
FULL_HARDWARE_PLAN = HardwarePlan(
    k_values=(0, 2, 4, 6),
    batch_sizes=(1, 2, 4, 8, 16),
    concurrency=(1, 2, 4, 8),
    dynamic_policies=("goodput", "online", "per-request"),
    context_lens=(64, 320),
    prefill_tokens=(32, 64, 128, 256, 512),
    acceptance_prompts=40,
    profile_iters=20,
    profile_warmup=3,
    speedup_prompts=8,
    speedup_repeats=3,
    speedup_k=(4, 6),
    # none by default: ngram:3-10 static:10 measured 1.75x and 1.42x against ngram:2-6
    # static:4's 1.55x and 1.62x in two runs of one hour (results/engine/2026-11-28-cpu-b1-drafts)
    speedup_extra_arms=(),
    prompts_per_concurrency=2,
    trials=5,
    retime_share=1.0,
    output_len=96,
    allow_noisy_profile=True,
)
# Seconds a time-budgeted report keeps for what follows the last trial round: the simulated
# side of every cell (simulator runs, no model), the plots and the files.
REPORT_WRITE_RESERVE_S = 30.0

QUICK_HARDWARE_PLAN = HardwarePlan(
    k_values=(0, 1, 2),
    batch_sizes=(1, 2),
    concurrency=(1, 2),
    dynamic_policies=("goodput",),
    context_lens=(32, 64),
    prefill_tokens=(16, 64),
    acceptance_prompts=2,
    profile_iters=2,
    profile_warmup=1,
    speedup_prompts=2,
    speedup_repeats=1,
    speedup_k=(2,),
    speedup_extra_arms=(),
    prompts_per_concurrency=1,
    trials=1,
    retime_share=1.0,
    output_len=12,
    allow_noisy_profile=True,
)


def validation_cell_config(
    profile: str,
    policy: str,
    concurrency: int,
    prompts_per_concurrency: int,
    *,
    max_num_seqs: int | None = None,
    **fields: Any,
) -> RunConfig:
    """One validation cell: `prompts_per_concurrency` x C requests at concurrency C, with
    max_num_seqs = C unless given; `fields`: other run fields (dataset, output_len, ...)."""
    return run_config(
        profile=profile,
        policy=policy,
        num_prompts=prompts_per_concurrency * concurrency,
        max_concurrency=concurrency,
        max_num_seqs=concurrency if max_num_seqs is None else max_num_seqs,
        **fields,
    )


def hardware_cell_config(
    profile: str,
    policy: str,
    concurrency: int,
    *,
    plan: HardwarePlan = FULL_HARDWARE_PLAN,
    prompts_per_concurrency: int | None = None,
    dataset: str = "instructcoder",
    k_max: int = 6,
    seed: int = 0,
    **fields: Any,
) -> RunConfig:
    """One validation cell of a hardware report (`validation_cell_config`), as
    `hardware_report` runs it: `plan`'s
    prompts per concurrency (or `prompts_per_concurrency`) x C prompts of `dataset`, its output
    length, max_num_seqs = C, and the empirical acceptance model (the cell's prompts are among
    the profiled ones, so each replays its recorded drafts). `fields`: other run fields
    (k_timing, ...). For benchmarks that measure on the report's workload."""
    return validation_cell_config(
        profile,
        policy,
        concurrency,
        prompts_per_concurrency or plan.prompts_per_concurrency,
        dataset=dataset,
        output_len=plan.output_len,
        k_max=k_max,
        seed=seed,
        acceptance_model="empirical",
        **fields,
    )
