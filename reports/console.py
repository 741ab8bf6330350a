"""What the commands print: a run's summary (or its JSON), a profile's, a generation's. Text
only: the files a run writes are `reports.run_outputs`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from dsd.policies.profile import Profile
from dsd.reports.run_outputs import (
    LEARNED_PROFILE_FILE,
    OUTPUTS_FILE,
    RunOutcome,
    format_summary,
    result_json_text,
)
from dsd.sim.models.latency_choice import held_out_summary


def run_text(outcome: RunOutcome, *, as_json: bool = False, verbose: bool = False) -> str:
    """What `dsd simulate` and `dsd run` print: the result as one JSON object, or the
    `vllm bench serve` summary (and the files written); `verbose`: with the latency model
    and why it was chosen (config.json's `latency_model` either way)."""
    from dsd.sim.resolve import latency_description

    if as_json:
        return result_json_text(outcome.metrics)
    text = format_summary(outcome.metrics, latency_description(outcome.resolved) if verbose else {})
    if outcome.out is not None:
        extra = f", {LEARNED_PROFILE_FILE}" if outcome.learned_profile is not None else ""
        extra += f", {OUTPUTS_FILE}" if outcome.output_ids is not None else ""
        text += (
            f"\nwrote {outcome.out}/ (result.json, requests.csv, steps.parquet, config.json{extra})"
        )
    return text


def profile_text(measured: Profile, out: str | Path, file_format: str = "dsd-profile") -> str:
    """What `dsd profile` prints: the points written, the fitted host overhead, and how well
    the latency models hold between the profiled batch sizes."""
    rates = ", ".join(f"{r:.3f}" for r in measured.acceptance_rates)
    text = (
        f"wrote {out}: {len(measured.latency)} latency points, {len(measured.prefill)} prefill "
        f"points, acceptance rates [{rates}]"
    )
    host = measured.host_overhead
    if host is not None:
        text += (
            f"\nhost overhead per step: {host.plain.intercept_ms:.3f} + "
            f"{host.plain.per_row_ms:.4f} x B ms (K = 0), {host.spec.intercept_ms:.3f} + "
            f"{host.spec.per_row_ms:.4f} x B ms (K > 0); residual {host.residual_ms:.3f} ms "
            f"over {host.num_steps} loop steps"
            + ("" if file_format == "dsd-profile" else " (not kept by --format dsd-json)")
        )
        if host.planning_plain is not None and host.planning_spec is not None:
            text += (
                "\nof which planning (overlapped by async scheduling): "
                f"{host.planning_plain.intercept_ms:.3f} + {host.planning_plain.per_row_ms:.4f} "
                f"x B ms (K = 0), {host.planning_spec.intercept_ms:.3f} + "
                f"{host.planning_spec.per_row_ms:.4f} x B ms (K > 0)"
            )
    adaptive = measured.metadata.get("quality", {}).get("adaptive")
    if adaptive:
        added = sorted(b for row in adaptive["rounds"] for b in row["added"])
        last = adaptive["rounds"][-1]["worst_held_out_pct"]
        verdict = "met" if adaptive["met"] else "not met"
        text += (
            f"\nadaptive batch sizes: added {added or 'none'}; worst held-out ITL error "
            f"{last:.1f}% (target {adaptive['target_pct']:g}%: {verdict})"
        )
    held_out = held_out_summary(measured)
    if held_out:
        text += f"\n{held_out}"
    return text


class Generation(Protocol):
    """What `generation_text` reads of `backend.generate.GenerationReport`."""

    @property
    def num_output_tokens(self) -> int: ...
    @property
    def elapsed_s(self) -> float: ...
    @property
    def drafted_at_pos(self) -> Sequence[int]: ...
    @property
    def per_position_rates(self) -> Sequence[float]: ...
    @property
    def acceptance_length(self) -> float: ...


def generation_text(report: Generation, k: int) -> str:
    """The line `dsd generate` ends with: tokens, time, speed and, with a draft, acceptance."""
    tokens_per_s = report.num_output_tokens / report.elapsed_s if report.elapsed_s > 0 else 0.0
    line = (
        f"{report.num_output_tokens} output tokens in {report.elapsed_s:.2f} s "
        f"({tokens_per_s:.1f} tok/s)"
    )
    if any(report.drafted_at_pos):
        rates = ", ".join(f"{rate:.2f}" for rate in report.per_position_rates)
        line += f"; K={k}, acceptance length {report.acceptance_length:.2f}, r_i = [{rates}]"
    return line
