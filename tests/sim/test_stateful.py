"""Stateful property tests: the scheduler machine (sim.testing.machine) drives the real scheduler.

Three machines: sync and async scheduling with drawn K and drawn outcomes (tiny pools and
budgets: preemption, chunked prefill, trimmed drafts), and one where a real policy chooses K
(the online acceptance policy on the shipped H100 profile, learning from the feedback) and the
fake random-acceptance executor produces the outcomes.

Examples per machine scale with the loaded hypothesis profile (tests/conftest.py): `ci` runs
800 + 800 + 400 = 2,000 machine examples of 40 rules, `thorough` 25 times more examples of 100
rules (docs/testing.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import settings

from dsd.policies.profile_io import load_profile
from dsd.policies.spec import parse_policy
from dsd.policies.types import KPolicy
from dsd.sim.scheduler import SchedulerConfig
from dsd.sim.testing.fakes import RandomAcceptanceExecutor
from dsd.sim.testing.machine import make_scheduler_machine, scheduler_configs
from dsd.sim.types import Executor

H100_PROFILE = (
    Path(__file__).resolve().parents[2] / "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
)


def _machine_settings(examples_per_profile_example: int) -> settings:
    """The loaded profile's settings (stateful_step_count included), max_examples scaled."""
    return settings(
        settings.default,
        max_examples=examples_per_profile_example * settings.default.max_examples,
    )


def _online_policy(config: SchedulerConfig) -> KPolicy:
    profile = load_profile(H100_PROFILE)
    return parse_policy(
        "online:warmup_steps=2",
        profile=profile,
        k_max=config.k_max,
        max_num_seqs=config.max_num_seqs,
    )


def _random_executor(config: SchedulerConfig, rng: np.random.Generator) -> Executor:
    return RandomAcceptanceExecutor(0.01, [0.8, 0.6, 0.45, 0.3, 0.2][: config.k_max], rng)


SyncMachine = make_scheduler_machine(scheduler_configs(scheduling="sync"), name="SyncMachine")
AsyncMachine = make_scheduler_machine(scheduler_configs(scheduling="async"), name="AsyncMachine")
PolicyExecutorMachine = make_scheduler_machine(
    scheduler_configs(k_max=(1, 5)),
    policy_factory=_online_policy,
    executor_factory=_random_executor,
    name="PolicyExecutorMachine",
)

TestSyncScheduler = SyncMachine.TestCase
TestSyncScheduler.settings = _machine_settings(4)
TestAsyncScheduler = AsyncMachine.TestCase
TestAsyncScheduler.settings = _machine_settings(4)
TestOnlinePolicyWithRandomExecutor = PolicyExecutorMachine.TestCase
TestOnlinePolicyWithRandomExecutor.settings = _machine_settings(2)
