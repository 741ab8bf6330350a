"""Speculative decoding vs plain decoding on the real engine: TPOT per arm, paired speedups, and
whether every arm generated exactly the tokens of the first (lossless greedy verification).

An **arm** is a draft spec and a K policy (`none`: plain decoding, K = 0). `measure_arms` loads
nothing: it takes a `ModelPair` and swaps drafts on the shared target (`ModelPair.with_draft`).
Per repeat the arms run one after another in a rotated order (A B C, B C A, C A B, ...) over the
same workload through the engine build of `dsd run` (`backend.real`), after one untimed warm-up
run per arm, so drift on a shared machine cannot favour one arm. The speedup of an arm is the
median over repeats of TPOT(first arm) / TPOT(arm) within a repeat.

Used by `benchmarks/sd_speedup.py` and `dsd hardware-report`; it prints nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsd.common.errors import InputError
from dsd.common.machine import load_average
from dsd.common.strict_json import missing_text
from dsd.sim.config import RunConfig
from dsd.sim.metrics import discard_steps

if TYPE_CHECKING:
    from dsd.backend.fast_path import EnginePool
    from dsd.backend.pair import ModelPair


@dataclass(frozen=True)
class Arm:
    """A draft spec and a K policy SPEC with its k_max (K = 0 without a draft)."""

    draft: str
    policy: str
    k_max: int

    @property
    def label(self) -> str:
        return self.draft if self.draft == "none" else f"{self.draft} {self.policy}"

    @classmethod
    def parse(cls, text: str) -> Arm:
        """`none`, or `DRAFT POLICY [K_MAX]`: `ngram:2-6 static:6`, `ngram:2-6 goodput 6`."""
        parts = text.split()
        if parts == ["none"]:
            return cls("none", "static:0", 0)
        if len(parts) not in (2, 3):
            raise InputError(f"arm {text!r}: write 'none' or 'DRAFT POLICY [K_MAX]'")
        draft, policy = parts[0], parts[1]
        if len(parts) == 3:
            k_text = parts[2]
        elif policy.startswith("static:"):
            k_text = policy.removeprefix("static:")
        else:
            raise InputError(f"arm {text!r}: give K_MAX after a policy other than static:K")
        if not (k_text.isascii() and k_text.isdigit()) or int(k_text) < 1:
            raise InputError(f"arm {text!r}: K must be an integer >= 1")
        return cls(draft, policy, int(k_text))


@dataclass(frozen=True)
class ArmSummary:
    """One arm over all repeats."""

    arm: str  # Arm.label
    tpot_ms: tuple[float, ...]  # mean TPOT of each repeat
    speedups: tuple[float, ...]  # TPOT(first arm) / TPOT(this arm), per repeat
    acceptance_length: float  # spec-decode acceptance length (NaN without drafts)
    acceptance_rate: float  # accepted / drafted tokens, percent (NaN without drafts)
    output_tokens: int  # total generated tokens (equal across repeats)
    identical_to_first_arm: bool  # every repeat generated the first arm's tokens exactly

    @property
    def tpot_ms_median(self) -> float:
        return statistics.median(self.tpot_ms)

    @property
    def speedup_median(self) -> float:
        return statistics.median(self.speedups)

    def row(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "tpot_ms_median": self.tpot_ms_median,
            "tpot_ms_min": min(self.tpot_ms),
            "tpot_ms_max": max(self.tpot_ms),
            "speedup_median": self.speedup_median,
            "speedup_min": min(self.speedups),
            "speedup_max": max(self.speedups),
            "acceptance_length": self.acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "output_tokens": self.output_tokens,
            "identical_to_first_arm": self.identical_to_first_arm,
        }


@dataclass(frozen=True)
class SpeedupResult:
    """Every run of every arm, and the per-arm summaries."""

    arms: tuple[ArmSummary, ...]
    runs: dict[str, list[dict[str, Any]]]  # arm label -> per-repeat run records (no outputs)


def _run(
    pair: ModelPair, arm: Arm, config: RunConfig, fast_path: str, engines: EnginePool
) -> tuple[dict[str, Any], dict[int, list[int]]]:
    """(metrics, output ids) of one real run of `config` with the arm's draft and policy."""
    from dsd.backend.real import real_engine, resolve_real, run_output_ids

    arm_pair = pair.with_draft(arm.draft, seed=config.seed)
    arm_config = dataclasses.replace(config, policy=arm.policy, k_max=arm.k_max)
    engine = real_engine(
        resolve_real(arm_config, arm_pair, fast_path),
        arm_pair,
        step_sink=discard_steps,
        fast_path=fast_path,
        engines=engines,
    )
    result = engine.run()
    return dict(result.metrics), run_output_ids(engine, result)


def measure_arms(
    pair: ModelPair,
    arms: Sequence[Arm],
    config: RunConfig,
    *,
    repeats: int = 3,
    fast_path: str = "off",
    on_run: Callable[[int, Arm, dict[str, Any]], None] | None = None,
) -> SpeedupResult:
    """Time every arm `repeats` times (module docstring) on `config`'s workload (its policy
    and k_max are each arm's) on the decode path `fast_path`. `on_run(repeat, arm, record)` is
    called after each timed run."""
    if not arms:
        raise InputError("speedup: give at least one arm")
    if len({arm.label for arm in arms}) != len(arms):
        raise InputError("speedup: each arm once")
    if repeats < 1:
        raise InputError(f"speedup: repeats must be >= 1, got {repeats}")
    from dsd.backend.fast_path import EnginePool

    warm_up = dataclasses.replace(config, num_prompts=1, output_len=16, max_concurrency=1)
    engines = EnginePool()  # a fast path's engine (its CUDA graphs) serves every run of an arm
    for arm in arms:  # warm-up, and every spec checked before anything is timed
        _run(pair, arm, warm_up, fast_path, engines)
    runs: dict[str, list[dict[str, Any]]] = {arm.label: [] for arm in arms}
    outputs: dict[str, list[Any]] = {arm.label: [] for arm in arms}
    for repeat in range(repeats):
        shift = repeat % len(arms)
        for arm in [*arms[shift:], *arms[:shift]]:
            load_before = load_average()
            metrics, output_ids = _run(pair, arm, config, fast_path, engines)
            record = {
                "mean_tpot_ms": metrics["mean_tpot_ms"],
                "duration_s": metrics["duration"],
                "total_output_tokens": metrics["total_output_tokens"],
                "acceptance_length": metrics["acceptance_length"],
                "acceptance_rate": metrics["spec_decode_acceptance_rate"],
                "num_drafts": metrics["spec_decode_num_drafts"],
                "load_before": load_before,
                "load_after": load_average(),
            }
            runs[arm.label].append(record)
            outputs[arm.label].append(output_ids)
            if on_run is not None:
                on_run(repeat, arm, record)
    first = arms[0].label
    summaries = []
    for arm in arms:
        own = runs[arm.label]
        summaries.append(
            ArmSummary(
                arm=arm.label,
                tpot_ms=tuple(r["mean_tpot_ms"] for r in own),
                speedups=tuple(
                    b["mean_tpot_ms"] / r["mean_tpot_ms"]
                    for b, r in zip(runs[first], own, strict=True)
                ),
                acceptance_length=own[0]["acceptance_length"],
                acceptance_rate=own[0]["acceptance_rate"],
                output_tokens=own[0]["total_output_tokens"],
                identical_to_first_arm=all(
                    mine == theirs
                    for mine, theirs in zip(outputs[arm.label], outputs[first], strict=True)
                ),
            )
        )
    return SpeedupResult(arms=tuple(summaries), runs=runs)


def speedup_table(result: SpeedupResult) -> str:
    """A fixed-width text table of the summaries."""
    lines = [
        f"{'arm':<26} {'TPOT ms (min-max)':>22} {'speedup (min-max)':>20} {'AL':>5} "
        f"{'acc %':>5} {'tokens':>7}  same tokens"
    ]
    for summary in result.arms:
        row = summary.row()
        tpot = f"{row['tpot_ms_median']:.1f} ({row['tpot_ms_min']:.1f}-{row['tpot_ms_max']:.1f})"
        speedup = (
            f"{row['speedup_median']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
        )
        lines.append(
            f"{row['arm']:<26} {tpot:>22} {speedup:>20} "
            f"{missing_text(row['acceptance_length'], '{:.2f}'):>5} "
            f"{missing_text(row['acceptance_rate'], '{:.1f}'):>5} {row['output_tokens']:>7}  "
            f"{'yes' if row['identical_to_first_arm'] else 'NO'}"
        )
    return "\n".join(lines)
