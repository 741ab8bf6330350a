"""What a validation measures: the hardware report's plan (`HardwarePlan`, full and quick) and
the run config of one validation cell. Plain data and configs: nothing here runs a model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
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
    prompts_per_concurrency: int  # validation requests per cell = this x C ...
    # ... or this many in every cell (None: by C). Held-out cells predict acceptance, and the
    # prediction's spread falls with the prompts a cell averages (docs/validation.md, "The plan")
    prompts_per_cell: int | None
    trials: int  # real runs per validation cell
    retime_share: float  # share of the profile's points each timing round re-times
    output_len: int | None  # max_tokens of every request; None: the dataset's
    allow_noisy_profile: bool
    static_k: tuple[int, ...] | None = None  # static K of the cells; None: k_values
    dataset: str | None = None  # the prompt set; None: the command's (instructcoder)
    # Drawn acceptance (docs/validation.md): the profile's acceptance replaced by this profile's
    # rates, and every real run accepting counts drawn from them as the simulator draws them
    # (tokens meaningless: random weights). None: the engine's own matches, recorded.
    acceptance_profile: str | None = None
    acceptance_model: str = "empirical"  # of the cells (empirical: per recorded request)
    interleave: bool = True  # the cells of one C run a step at a time together (one engine each)
    adaptive_target_pct: float | None = None  # the profiler adds B until interpolation is this good
    adaptive_budget_s: float = 600.0


# The full plan: about an hour on the 2-core Zen 4 CPU with SmolLM2-135M at one thread (the
# profile and B = 1 arms 13-20 min, the held-out cells ~47 min; about twice that on the Zen 3
# host of 2026-11-28b: docs/validation.md). Why
# each figure (two contexts, 20 profile rounds, noisy points kept, 32 prompts a cell) is
# docs/validation.md's "The plan"; what each choice measured is in the results' notes.
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
    # Held-out cells: the simulator's 90% intervals of mean TPOT on the 2026-11-28b profile
    # (empirical acceptance, 96 tokens) are +-8-14% with 8 prompts, +-7-12% with 16 and
    # +-5-7% with 32 at every C: 32 keeps the worst of 28 cells near the 10% goal
    prompts_per_cell=32,
    # one trial: the re-timing rounds and probes price the simulator by the machine's speed
    # during it, and 32 prompts a cell take four times the old plan's real time per trial
    trials=1,
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
    prompts_per_cell=None,
    trials=1,
    retime_share=1.0,
    output_len=12,
    allow_noisy_profile=True,
)


# PR #32374's profile (Llama-3.1-8B-Instruct + EAGLE-1 on an H100, MT-Bench): the acceptance the
# production plan draws from.
PR32374_PROFILE = str(
    Path(__file__).resolve().parents[1]
    / "policies"
    / "profiles"
    / "pr32374_llama31_8b_eagle_h100.json"
)

# PR #32374's experiment on our engine (`--plan production`, issue 59): a Llama-3.1-8B-shaped
# target and an EAGLE-1-shaped head on random bf16 weights (`--target random:llama-3.1-8b
# --draft eagle`), acceptance drawn from the PR's per-position rates, MT-Bench with 256 output
# tokens, C = 1..256, vanilla, static:3 and the dynamic policies; profiled over the PR's B and K
# grid plus what adaptive profiling adds. Sized for two device calls of 570 s on one warm
# machine: `--stage profile`, then `--stage cells` (scripts/gpu_session.py's production phases).
# The estimate, from results/gpu/2026-11-26-h200 (8B shape, bf16, CUDA graphs: plain decode 7.76,
# 9.44, 13.12 and 28.72 ms a step at B = 1, 16, 64, 256; K = 3 about 2x the B = 1 step there, and
# from B = 64 on a verify of 4B tokens about 3x): a request is 256 tokens, 256 steps at K = 0 and
# about 113 at K = 3 (AL 2.27), so one wave of C requests takes 2-2.5 s at C <= 16, 3.5-4.5 s at
# 64, 5-7 s at 128 and 7-10 s at 256 per policy: about 125 s for the 30 cells, 160 s with the
# speed probes. Two prompts per C (two waves: 320 s), one trial, a quarter of the profile re-timed
# per round, and the CUDA graphs (about 400 shapes over the six engines, ~0.1 s each: 40 s) fit
# one call with ~100 s to spare; the PR ran 20 x C prompts, ten times as many.
PRODUCTION_HARDWARE_PLAN = HardwarePlan(
    k_values=(0, 1, 3, 5),
    batch_sizes=(1, 4, 16, 64, 256),
    concurrency=(1, 4, 16, 64, 128, 256),
    dynamic_policies=("goodput", "online", "per-request"),
    context_lens=(128, 384),
    prefill_tokens=(32, 128, 512),
    acceptance_prompts=1,  # random weights accept nothing: the PR's rates replace the run's
    profile_iters=10,
    profile_warmup=3,
    speedup_prompts=0,  # no B = 1 arms: the profile's B = 1, K = 0 point is the figure
    speedup_repeats=0,
    speedup_k=(),
    speedup_extra_arms=(),
    prompts_per_concurrency=2,
    prompts_per_cell=None,
    trials=1,
    retime_share=0.25,
    output_len=256,
    allow_noisy_profile=True,
    static_k=(0, 3),
    dataset="mt-bench",
    acceptance_profile=PR32374_PROFILE,
    acceptance_model="per-position",
    interleave=False,  # one engine (and its KV cache) per C, not one per policy and C
    adaptive_target_pct=5.0,
    adaptive_budget_s=60.0,
)

# The production plan at tiny settings (`--plan production --quick`): the CPU dry run of the
# pipeline with the tiny pair (`--target tiny --draft eagle`), not a measurement.
PRODUCTION_QUICK_HARDWARE_PLAN = dataclasses.replace(
    PRODUCTION_HARDWARE_PLAN,
    batch_sizes=(1, 2),
    concurrency=(1, 2),
    context_lens=(32,),
    prefill_tokens=(16, 64),
    profile_iters=2,
    profile_warmup=1,
    prompts_per_concurrency=1,
    output_len=8,
    adaptive_target_pct=None,
)

# --plan NAME: (the plan, its --quick dry run)
HARDWARE_PLANS: dict[str, tuple[HardwarePlan, HardwarePlan]] = {
    "full": (FULL_HARDWARE_PLAN, QUICK_HARDWARE_PLAN),
    "production": (PRODUCTION_HARDWARE_PLAN, PRODUCTION_QUICK_HARDWARE_PLAN),
}


def validation_cell_config(
    profile: str,
    policy: str,
    concurrency: int,
    prompts_per_concurrency: int,
    *,
    max_num_seqs: int | None = None,
    prompts_per_cell: int | None = None,
    **fields: Any,
) -> RunConfig:
    """One validation cell: `prompts_per_concurrency` x C requests (or `prompts_per_cell`) at
    concurrency C, with max_num_seqs = C unless given; `fields`: other run fields (dataset,
    output_len, ...)."""
    return run_config(
        profile=profile,
        policy=policy,
        num_prompts=(
            prompts_per_concurrency * concurrency if prompts_per_cell is None else prompts_per_cell
        ),
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
    `hardware_report` runs it: `plan`'s prompts per cell (or per concurrency, or
    `prompts_per_concurrency`, x C) of `dataset` that the profile never ran (shuffled with the
    seed), its output length, max_num_seqs = C, and the empirical acceptance model (each prompt
    given a recorded request's drafts). `fields`: other run fields (k_timing, ...). For
    benchmarks that measure on the report's workload."""
    config = validation_cell_config(
        profile,
        policy,
        concurrency,
        prompts_per_concurrency or plan.prompts_per_concurrency,
        dataset=dataset,
        output_len=plan.output_len,
        k_max=k_max,
        seed=seed,
        acceptance_model="empirical",
        held_out_prompts=True,
        shuffle=True,
        **fields,
    )
    if prompts_per_concurrency is None and plan.prompts_per_cell is not None:
        return dataclasses.replace(config, num_prompts=plan.prompts_per_cell)
    return config
