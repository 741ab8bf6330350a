"""A run's outputs (simulated or real): the result dict, its JSON, the files of `--out DIR`.

`bench_result` gives the `vllm bench serve` result keys plus the run's settings under vLLM's and
our names; `format_summary` the readable block; `result_json_text` one sorted, strict JSON object,
byte-identical for a seed in any process; `write_run_outputs` the files of docs/cli.md (`--out
DIR`), serialised in memory first (steps.parquet may stream through `step_parquet_sink`) and
written all or nothing.

It does not run anything, print, or decide what a result means.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsd.common import strict_json
from dsd.common.atomic import atomic_write_bytes
from dsd.common.errors import InputError
from dsd.common.user_paths import check_output_folder
from dsd.policies.profile import Profile
from dsd.policies.profile_io import profile_json_text
from dsd.policies.spec import policy_source
from dsd.sim.engine import RunResult
from dsd.sim.interval import interval_metrics, interval_text
from dsd.sim.metrics import Columns
from dsd.sim.resolve import ResolvedRun

if TYPE_CHECKING:  # pandas and pyarrow load only when files are written (~0.5 s)
    import pandas as pd
    import pyarrow.parquet as pq

RESULT_FILE = "result.json"
REQUESTS_FILE = "requests.csv"
STEPS_FILE = "steps.parquet"
CONFIG_FILE = "config.json"
RUN_FILES: tuple[str, ...] = (RESULT_FILE, REQUESTS_FILE, STEPS_FILE, CONFIG_FILE)
LEARNED_PROFILE_FILE = "learned_profile.json"  # only for policies that learn one (bandit)
OUTPUTS_FILE = "outputs.jsonl"  # only for real runs: what each request generated


def bench_result(
    run: RunResult,
    resolved: ResolvedRun,
    executor_settings: Mapping[str, Any],
    *,
    simulated: bool = False,
) -> dict[str, Any]:
    """The result dict of one run: vLLM bench metrics + the run's settings + what its executor
    was (`simulator_settings`, or the real pair's); `simulated`: with the prediction interval
    its config's `interval_runs` ask for (`sim.interval.interval_metrics`)."""
    config = resolved.config
    result = dict(run.metrics)
    if simulated:
        result.update(interval_metrics(resolved, run.metrics))
    source = policy_source(config.policy)
    if source is not None:  # a user's policy: the code that made this result
        result["policy_source"] = source
    result.update(
        {
            "profile": config.profile,
            "policy": config.policy,
            "dataset_name": config.dataset,
            "num_prompts": len(resolved.workload.requests),
            "max_concurrency": config.max_concurrency,
            "request_rate": "inf" if math.isinf(config.request_rate) else config.request_rate,
            "burstiness": config.burstiness,
            "scheduling": config.scheduling,
            "k_max": resolved.k_max,
            "max_num_seqs": resolved.max_num_seqs,
            "num_preemptions": run.num_preemptions,
            "seed": config.seed,
            **executor_settings,
        }
    )
    return result


def simulator_settings(resolved: ResolvedRun) -> dict[str, Any]:
    """What the simulator's executor was: its latency and acceptance models, its host overhead."""
    config = resolved.config
    assert resolved.latency is not None  # the simulator runs only with a profile
    return {
        "backend": "dsd-sim",
        "latency_model": resolved.latency_kind,
        "prefill_source": resolved.latency.prefill_source,
        "acceptance_model": config.acceptance_model,
        "host_overhead_ms": config.host_overhead_ms,
        # "measured" (the profile's model), "flag" (the constant above) or "none"
        "host_overhead_source": resolved.host_overhead_source,
    }


def json_default(value: Any) -> Any:
    """`json.dumps(default=...)` for numpy scalars and arrays in run results."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def result_json_text(result: Mapping[str, Any]) -> str:
    """One JSON object, sorted keys, two-space indent, no trailing newline."""
    return strict_json.dumps(result, indent=2, sort_keys=True, default=json_default)


def request_frame(run: RunResult, resolved: ResolvedRun) -> pd.DataFrame:
    """Per-request table: the engine's columns plus what was asked (max_tokens, tag)."""
    frame = run.requests.copy()
    requests = resolved.workload.requests
    frame.insert(2, "max_tokens", np.array([r.output_len for r in requests], dtype=np.int64))
    frame.insert(3, "tag", [r.tag or "" for r in requests])
    frame.insert(4, "arrival_s", np.array([r.arrival_s for r in requests], dtype=np.float64))
    return frame


def step_frame(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-step table: B, decode rows, tokens, K (sum/mean/min/max), accepted, output, time."""
    frame = steps.copy()
    frame["duration_ms"] = frame["duration_s"] * 1000.0
    return frame


class StepParquetSink:
    """An `LoopConfig.step_sink` that appends each block of step rows to a parquet file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: pq.ParquetWriter | None = None

    def __call__(self, steps: Columns) -> None:
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(step_frame(pd.DataFrame(steps)), preserve_index=False)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table)

    def finish(self, empty_steps: Columns) -> Path:
        """Close the file (with `empty_steps`' columns if no step came) and return its path."""
        if self._writer is None:
            self(empty_steps)
        assert self._writer is not None
        self._writer.close()
        return self.path

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def step_parquet_sink(out_dir: str | os.PathLike[str]) -> Iterator[StepParquetSink]:
    """A step sink writing a hidden temp file beside `out_dir`, removed unless it was moved in.

    Creates `out_dir`'s parent folders if needed (and removes them again if the run fails)."""
    target = Path(out_dir)
    parent = target.parent
    first_missing = None  # the outermost folder this call creates, removed on failure
    for folder in (parent, *parent.parents):
        if folder.exists():
            break
        first_missing = folder
    sink = StepParquetSink(
        parent / f".{target.name[:128]}.{os.getpid()}.{os.urandom(4).hex()}.steps"
    )
    try:
        parent.mkdir(parents=True, exist_ok=True)
        sink.path.touch()  # fail now, naming the folder, rather than after the run
    except OSError as exc:
        if first_missing is not None:
            shutil.rmtree(first_missing, ignore_errors=True)
        raise InputError(
            f"--out {out_dir}: cannot write in {parent} ({exc.strerror or exc})"
        ) from None
    try:
        yield sink
    except BaseException:
        sink.discard()
        if first_missing is not None:
            shutil.rmtree(first_missing, ignore_errors=True)
        raise
    sink.discard()  # a no-op once write_files moved it in


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def serialise_run(
    result: Mapping[str, Any],
    requests: pd.DataFrame,
    steps: pd.DataFrame | Path,
    config: Mapping[str, Any],
) -> dict[str, bytes | Path]:
    """File name -> bytes for every run file (or the path of the streamed steps file)."""
    return {
        RESULT_FILE: (result_json_text(result) + "\n").encode("utf-8"),
        REQUESTS_FILE: requests.to_csv(index=False).encode("utf-8"),
        STEPS_FILE: steps if isinstance(steps, Path) else _parquet_bytes(step_frame(steps)),
        CONFIG_FILE: (result_json_text(config) + "\n").encode("utf-8"),
    }


def write_files(out_dir: str | os.PathLike[str], files: Mapping[str, bytes | Path]) -> Path:
    """Write `files` into `out_dir`: all or nothing for a new folder, file by file otherwise.

    A `Path` value is a finished file on the same file system, moved in by rename."""
    target = check_output_folder(out_dir)
    if target.is_dir():
        for name, data in files.items():
            if isinstance(data, Path):
                os.replace(data, target / name)
            else:
                atomic_write_bytes(target / name, data)
        return target
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    # mkdir (not mkdtemp, which makes 0700) so the folder gets the user's usual permissions.
    staging = parent / f".{target.name[:128]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    staging.mkdir()
    try:
        for name, data in files.items():
            if isinstance(data, Path):
                os.replace(data, staging / name)
            else:
                (staging / name).write_bytes(data)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def write_run_outputs(
    out_dir: str | os.PathLike[str],
    run: RunResult,
    resolved: ResolvedRun,
    result: Mapping[str, Any],
    config: Mapping[str, Any],
    streamed_steps: StepParquetSink | None = None,
    learned: Profile | None = None,
    outputs: bytes | None = None,
) -> Path:
    """result.json, requests.csv, steps.parquet, config.json in `out_dir` (see module doc).

    `streamed_steps`: the sink the run wrote its steps to (then `run.steps` is empty).
    `learned`: the profile a learning policy built (`sim.build.learned_profile`), written as
    learned_profile.json (native profile format). `outputs`: `outputs_jsonl` of a real run."""
    steps = run.steps if streamed_steps is None else streamed_steps.finish(run.step_columns)
    files = serialise_run(result, request_frame(run, resolved), steps, config)
    if learned is not None:
        files[LEARNED_PROFILE_FILE] = profile_json_text(learned).encode()
    if outputs is not None:
        files[OUTPUTS_FILE] = outputs
    return write_files(out_dir, files)


def outputs_jsonl(
    output_ids: Mapping[int, list[int]], detokenize: Callable[[list[int]], str] | None
) -> bytes:
    """outputs.jsonl: one object per request in req_id order, `text` only with a detokenizer."""
    lines = []
    for req_id in sorted(output_ids):
        row: dict[str, Any] = {"req_id": req_id, "token_ids": output_ids[req_id]}
        if detokenize is not None:
            row["text"] = detokenize(output_ids[req_id])
        lines.append(strict_json.dumps(row, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")


def _line(label: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{label:<40} {strict_json.missing_text(value, '{:.2f}'):<10}"
    return f"{label:<40} {value!s:<10}"


def prediction_line(result: Mapping[str, Any]) -> str:
    """'prediction over 9 draws of the workload: mean TPOT 62.4 ms (90%: 58.1-67.0), ...'
    from a result's interval keys (`sim.interval.interval_metrics`)."""
    parts = [
        f"{label} {float(result[key]):.{digits}f}{unit} {interval_text(result, key, digits)}"
        for key, label, unit, digits in (
            ("mean_tpot_ms", "mean TPOT", " ms", 1),
            ("mean_ttft_ms", "mean TTFT", " ms", 1),
            ("output_throughput", "output", " tok/s", 1),
            ("acceptance_length", "acceptance length", "", 2),
        )
        if interval_text(result, key)
    ]
    return f"prediction over {result['interval_runs']} draws of the workload: " + ", ".join(parts)


def format_summary(result: dict[str, Any], latency_info: dict[str, Any]) -> str:
    """The `vllm bench serve` result block, a speculative-decoding block and the K histogram;
    a line on the latency model when `latency_info` (`sim.resolve.latency_description`) has
    one (`-v`)."""
    lines = ["{:=^50}".format(" Serving Benchmark Result ")]
    lines.append(_line("Successful requests:", result["completed"]))
    if result.get("max_concurrency") is not None:
        lines.append(_line("Maximum request concurrency:", result["max_concurrency"]))
    lines += [
        _line("Benchmark duration (s):", float(result["duration"])),
        _line("Total input tokens:", result["total_input_tokens"]),
        _line("Total generated tokens:", result["total_output_tokens"]),
        _line("Request throughput (req/s):", float(result["request_throughput"])),
        _line("Output token throughput (tok/s):", float(result["output_throughput"])),
        _line("Total Token throughput (tok/s):", float(result["total_token_throughput"])),
    ]
    sections = (
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    )
    for key, title, short in sections:
        lines.append(f"{title:-^50}")
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            lines.append(_line(f"{label} {short} (ms):", float(result[f"{stat}_{key}_ms"])))
        if key == "tpot" and "mean_tpot_in_prefill_steps_ms" in result:
            # ours: the part of mean TPOT spent in steps that also ran other requests' prompts
            stalls = float(result["mean_tpot_in_prefill_steps_ms"])
            lines.append(_line("Mean TPOT in prefill steps (ms):", stalls))
    lines.append("{:-^50}".format("Speculative Decoding"))
    lines.append(_line("Acceptance rate (%):", float(result["spec_decode_acceptance_rate"])))
    lines.append(_line("Acceptance length:", float(result["acceptance_length"])))
    lines.append(_line("Drafts:", result["spec_decode_num_drafts"]))
    lines.append(_line("Draft tokens:", result["spec_decode_draft_tokens"]))
    lines.append(_line("Accepted tokens:", result["spec_decode_accepted_tokens"]))
    per_position = result["spec_decode_per_position_acceptance_rates"]
    shown = ", ".join(strict_json.missing_text(100 * r, "{:.1f}") for r in per_position)
    lines.append(_line("Per-position acceptance (%):", shown or "-"))
    lines.append("{:-^50}".format("K histogram (decode rows)"))
    histogram = result["k_histogram"]
    total_rows = sum(histogram.values())
    for k in sorted(histogram):
        share = 100.0 * histogram[k] / total_rows if total_rows else 0.0
        lines.append(f"{f'K={k}:':<40} {histogram[k]:<10} ({share:.1f}%)")
    lines.append(_line("Steps:", result["num_steps"]))
    lines.append(_line("Preemptions:", result["num_preemptions"]))
    lines.append("=" * 50)
    if interval_text(result, "mean_tpot_ms"):
        lines.append(prediction_line(result))
    if latency_info.get("kind") is not None:
        asked = latency_info["requested"]
        choice = latency_info.get("choice")
        if asked == "auto" and choice is not None:
            asked += f": {choice['reason']}"
        latency_line = (
            f"latency model: {latency_info['kind']} (asked {asked}); "
            f"prefill cost: {latency_info['prefill_source']}"
        )
        if latency_info.get("prefill_forward") == "fused" and "prefill_in_decode" in latency_info:
            latency_line += f" (in decode steps: {latency_info['prefill_in_decode']})"
        if "fit_summary" in latency_info:
            latency_line += f"; {latency_info['fit_summary']}"
        lines.append(latency_line)
    executor = (
        f"acceptance model: {result['acceptance_model']}"
        if "acceptance_model" in result
        else f"model: {result.get('model_id')}, draft: {result.get('draft')}"
    )
    lines.append(
        f"policy: {result['policy']}; k_max {result['k_max']}; {executor}; "
        f"scheduling: {result['scheduling']}; seed {result['seed']}"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class RunOutcome:
    """What `simulate` and `run` return. `requests` and `steps` are DataFrames built when first
    read (so a run printed as JSON never loads pandas)."""

    metrics: dict[str, Any]  # result.json: vLLM bench keys, ours, the run's settings
    run: RunResult  # what the engine measured (its tables as numpy columns)
    resolved: ResolvedRun  # the config with every default chosen
    learned_profile: Profile | None  # the profile a learning policy (bandit) built, else None
    out: Path | None  # the folder written (result.json, requests.csv, steps.parquet, ...)
    output_ids: dict[int, list[int]] | None = None  # real runs: req_id -> generated token ids

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (requests.csv: asked and measured)."""
        return request_frame(self.run, self.resolved)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per step; empty when `keep_steps` is off or steps streamed."""
        return self.run.steps
