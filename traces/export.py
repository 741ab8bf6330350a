"""Workloads out: our table schema, vLLM bench `custom` JSONL, summaries and plots.

The table (CSV or parquet, read back by `traces.loaders.load_workload_file`) and the `custom`
JSONL (`vllm bench serve --dataset-name custom`), where requests without text get a synthetic
prompt of exactly prompt_len SmolLM2 tokens whose first words spell the request index, so prefix
caching cannot make them cheaper than real prompts (docs/workloads.md). Every file is written
atomically.

It does not build workloads and does not tokenize.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsd.common import strict_json
from dsd.common.atomic import atomic_write, atomic_write_bytes
from dsd.common.errors import InputError
from dsd.common.png import figure_png_bytes
from dsd.traces.workload import Workload

# 16 words that are one SmolLM2 token each, in any sequence (a test checks this with
# `tokenizers`); the first is the filler.
SYNTHETIC_WORDS = (
    " the", " a", " of", " and", " to", " in", " is", " for",
    " on", " with", " as", " at", " by", " it", " from", " or",
)  # fmt: skip
# Leading words that spell the request index (base 16): 16**4 distinct prefixes.
SYNTHETIC_ID_WORDS = 4

TABLE_COLUMNS = ("prompt_len", "output_len", "arrival_s", "tag", "prompt")


def synthetic_prompt(num_tokens: int, index: int = 0) -> str:
    """A prompt of exactly num_tokens SmolLM2 tokens, distinct per index (mod 16**4)."""
    if num_tokens < 1:
        raise InputError(f"prompt_len: must be >= 1, got {num_tokens}")
    num_id_words = min(num_tokens, SYNTHETIC_ID_WORDS)
    digits = [(index >> (4 * position)) & 0xF for position in range(num_id_words)]
    id_words = "".join(SYNTHETIC_WORDS[digit] for digit in digits)
    return id_words + SYNTHETIC_WORDS[0] * (num_tokens - num_id_words)


def workload_frame(workload: Workload) -> pd.DataFrame:
    """One row per request, columns TABLE_COLUMNS, in send order."""
    return pd.DataFrame(
        {
            "prompt_len": np.array([r.prompt_len for r in workload.requests], dtype=np.int64),
            "output_len": np.array([r.output_len for r in workload.requests], dtype=np.int64),
            "arrival_s": np.array([r.arrival_s for r in workload.requests], dtype=np.float64),
            "tag": pd.array([r.tag for r in workload.requests], dtype="string"),
            "prompt": pd.array([r.prompt for r in workload.requests], dtype="string"),
        },
        columns=list(TABLE_COLUMNS),
    )


def write_workload_table(workload: Workload, path: Path) -> None:
    """Our schema as .csv or .parquet (by suffix), atomically."""
    suffix = path.suffix.lower()
    frame = workload_frame(workload)
    if suffix == ".csv":
        atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False, float_format="%.9g"))
    elif suffix == ".parquet":
        atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
    else:
        raise InputError(f"{path.name}: output must end in .csv or .parquet, got {suffix!r}")


def write_vllm_custom_jsonl(workload: Workload, path: Path) -> None:
    """The `vllm bench serve --dataset-name custom` file of this workload, atomically."""
    if path.suffix.lower() != ".jsonl":
        raise InputError(f"{path.name}: output must end in .jsonl (vLLM's custom dataset format)")

    def write_lines(tmp_path: Path) -> None:
        # streamed line by line: a long trace's synthetic prompts run to hundreds of MB
        with tmp_path.open("w", encoding="utf-8") as out:
            for index, request in enumerate(workload.requests):
                prompt = request.prompt or synthetic_prompt(request.prompt_len, index)
                row = {
                    "prompt": prompt,
                    "output_tokens": request.output_len,
                    "prompt_len": request.prompt_len,
                }
                out.write(strict_json.dumps(row, ensure_ascii=False))
                out.write("\n")

    atomic_write(path, write_lines)


@dataclass(frozen=True)
class LengthStats:
    """Percentiles of a token-length column."""

    mean: float  # tokens
    p50: float  # tokens (numpy 'linear' percentiles)
    p90: float  # tokens
    p99: float  # tokens
    max: int  # tokens


@dataclass(frozen=True)
class WorkloadSummary:
    """What `dsd traces show` prints."""

    name: str  # workload name
    num_requests: int  # requests, >= 0
    duration_s: float  # last arrival - first arrival, seconds (0 for a closed loop)
    request_rate: float  # num_requests / duration_s, requests/s; inf when duration_s == 0
    total_prompt_tokens: int  # sum of prompt_len
    total_output_tokens: int  # sum of output_len
    prompt: LengthStats  # prompt_len percentiles
    output: LengthStats  # output_len percentiles
    tags: dict[str, int]  # requests per tag, most common first ('-' for untagged)
    max_concurrency: int | None  # the workload's cap on requests in flight


def _length_stats(lengths: np.ndarray) -> LengthStats:
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return LengthStats(
        mean=float(lengths.mean()),
        p50=float(p50),
        p90=float(p90),
        p99=float(p99),
        max=int(lengths.max()),
    )


def summarize(workload: Workload) -> WorkloadSummary:
    """Counts, duration, rate and length percentiles of a non-empty workload."""
    if not workload.requests:
        raise InputError(f"{workload.name}: no requests")
    frame = workload_frame(workload)
    arrivals_s = frame["arrival_s"].to_numpy()  # [N]
    duration_s = float(arrivals_s[-1] - arrivals_s[0])
    tags = Counter(r.tag if r.tag is not None else "-" for r in workload.requests)
    return WorkloadSummary(
        name=workload.name,
        num_requests=len(workload.requests),
        duration_s=duration_s,
        request_rate=len(workload.requests) / duration_s if duration_s > 0 else float("inf"),
        total_prompt_tokens=int(frame["prompt_len"].sum()),
        total_output_tokens=int(frame["output_len"].sum()),
        prompt=_length_stats(frame["prompt_len"].to_numpy()),
        output=_length_stats(frame["output_len"].to_numpy()),
        tags=dict(tags.most_common()),
        max_concurrency=workload.max_concurrency,
    )


def plot_workload(workload: Workload, out_dir: Path) -> list[Path]:
    """Write lengths.png (prompt/output histograms) and arrivals.png (rate over time)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    frame = workload_frame(workload)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for axis, column in zip(axes, ("prompt_len", "output_len"), strict=True):
        lengths = frame[column].to_numpy()  # [N]
        low, high = max(1, int(lengths.min())), int(lengths.max())
        if high > 10 * low:  # long tails read better on log bins
            bins = np.geomspace(low, high + 1, 50)
            axis.set_xscale("log")
        else:
            bins = np.linspace(low, high + 1, 50)
        axis.hist(lengths, bins=bins, color="tab:blue" if column == "prompt_len" else "tab:orange")
        axis.set_xlabel(f"{column} (tokens)")
        axis.set_ylabel("requests")
        axis.set_title(f"{workload.name}: {column}, p50 {np.median(lengths):.0f}")
    lengths_path = out_dir / "lengths.png"
    atomic_write_bytes(lengths_path, figure_png_bytes(fig, dpi=110))
    written.append(lengths_path)

    arrivals_s = frame["arrival_s"].to_numpy()  # [N]
    fig, axis = plt.subplots(figsize=(10, 3.5))
    duration_s = float(arrivals_s[-1] - arrivals_s[0])
    if duration_s > 0:
        num_bins = int(min(120, max(10, len(arrivals_s) // 20)))
        counts, edges = np.histogram(arrivals_s, bins=num_bins)
        width_s = edges[1] - edges[0]
        axis.step(edges[:-1], counts / width_s, where="post")
        axis.set_ylabel(f"requests/s ({width_s:.3g} s bins)")
    else:
        axis.text(0.5, 0.5, "all requests arrive at t=0", ha="center", transform=axis.transAxes)
    axis.set_xlabel("arrival time (s)")
    axis.set_title(f"{workload.name}: arrival rate, {len(arrivals_s)} requests")
    arrivals_path = out_dir / "arrivals.png"
    atomic_write_bytes(arrivals_path, figure_png_bytes(fig, dpi=110))
    written.append(arrivals_path)
    return written


def summary_rows(summary: WorkloadSummary) -> list[tuple[str, str]]:
    """(label, value) rows of a workload summary, formatted for a two-column table."""
    rate = "inf" if math.isinf(summary.request_rate) else f"{summary.request_rate:.3f}"
    rows = [
        ("requests", f"{summary.num_requests:,}"),
        ("duration (s)", f"{summary.duration_s:.2f}"),
        ("request rate (req/s)", rate),
        ("max concurrency", str(summary.max_concurrency or "-")),
        ("total prompt tokens", f"{summary.total_prompt_tokens:,}"),
        ("total output tokens", f"{summary.total_output_tokens:,}"),
    ]
    for label, stats in (("prompt_len", summary.prompt), ("output_len", summary.output)):
        rows.append(
            (
                f"{label} mean / p50 / p90 / p99 / max",
                f"{stats.mean:.1f} / {stats.p50:.0f} / {stats.p90:.0f} / "
                f"{stats.p99:.0f} / {stats.max}",
            )
        )
    top_tags = list(summary.tags.items())[:8]
    more = len(summary.tags) - len(top_tags)
    tags_text = ", ".join(f"{tag} {count}" for tag, count in top_tags)
    rows.append(("tags", tags_text + (f", +{more} more" if more > 0 else "")))
    return rows


def replay_note(workload: Workload, out: str | Path) -> str:
    """What to tell a user who exported a workload to vLLM's custom JSONL: the file, the
    `vllm bench serve` command that replays it, and what the format loses."""
    lines = [
        f"wrote {out} ({len(workload.requests):,} requests)",
        "replay: vllm bench serve --dataset-name custom "
        f"--dataset-path {out} --num-prompts {len(workload.requests)} --custom-output-len -1 "
        "--skip-chat-template --disable-shuffle --ignore-eos "
        "[--request-rate R --burstiness X | --max-concurrency C]",
    ]
    if any(request.arrival_s > 0 for request in workload.requests):
        lines.append(
            "note: the JSONL has no arrival times; the trace's timestamps are not replayed"
        )
    return "\n".join(lines)
