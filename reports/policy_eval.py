"""Policy evaluation: every K policy against the static-K envelope on MT-Bench closed loop.

For each acceptance scenario (homogeneous per-position acceptance; heterogeneous per-request
acceptance) and each concurrency C it runs static K = 0..k_max (the envelope is the best of
them per C), then every dynamic policy, on the published PR #32374 H100 profile, and writes
`report.md`, `results.json` and one PNG per scenario under --out. Small prompt counts
(max(2C, 32) per cell) keep the whole run to about a minute on 2 cores; one seed per cell.

It does not run real models and does not tune any policy's knobs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from sim.runner import SimulationConfig, run_simulation

PROFILE = "policies/profiles/pr32374_llama31_8b_eagle_h100.json"
CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
K_MAX = 5
SCENARIOS = ("per-position", "heterogeneous")  # acceptance models of sim.runner
DYNAMIC = (
    "goodput",
    "online",
    "per-request",
    "hysteresis:goodput",
    "bandit",
    "envelope:{sweep}",
)
SEED = 0


def _tpot(policy: str, concurrency: int, acceptance: str) -> float:
    config = SimulationConfig(
        profile=PROFILE,
        policy=policy,
        num_prompts=max(2 * concurrency, 32),
        max_concurrency=concurrency,
        acceptance_model=acceptance,  # type: ignore[arg-type]
        seed=SEED,
    )
    return float(run_simulation(config).metrics["mean_tpot_ms"])


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def evaluate(out: Path) -> dict[str, dict[str, dict[int, float]]]:
    results: dict[str, dict[str, dict[int, float]]] = {}
    for acceptance in SCENARIOS:
        table: dict[str, dict[int, float]] = {}
        records = []
        for k in range(K_MAX + 1):
            table[f"static:{k}"] = {c: _tpot(f"static:{k}", c, acceptance) for c in CONCURRENCIES}
            records += [
                {"concurrency": c, "k": k, "mean_tpot_ms": table[f"static:{k}"][c]}
                for c in CONCURRENCIES
            ]
        sweep_path = out / f"static_sweep_{acceptance}.json"
        _atomic_write(sweep_path, json.dumps(records, indent=1))
        table["envelope (best static)"] = {
            c: min(table[f"static:{k}"][c] for k in range(K_MAX + 1)) for c in CONCURRENCIES
        }
        for spec in DYNAMIC:
            name = spec.format(sweep=sweep_path)
            label = "envelope policy" if spec.startswith("envelope") else spec
            table[label] = {c: _tpot(name, c, acceptance) for c in CONCURRENCIES}
        results[acceptance] = table
    return results


def _markdown(results: dict[str, dict[str, dict[int, float]]], seconds: float) -> str:
    lines = [
        "# K policies vs the static-K envelope (simulated, PR #32374 H100 profile)",
        "",
        "Command: `python -m reports.policy_eval --out reports/policies` "
        f"(seed {SEED}, num_prompts = max(2C, 32) per cell, MT-Bench closed loop, sync "
        f"scheduling, latency model auto; took {seconds:.0f} s).",
        "Cells: mean TPOT ms; in brackets the gap to the envelope (best static K per C), "
        "negative = better than the envelope.",
        "",
    ]
    for acceptance, table in results.items():
        envelope = table["envelope (best static)"]
        lines += [f"## acceptance: {acceptance}", "", f"![plot](tpot_{acceptance}.png)", ""]
        lines.append("| policy | " + " | ".join(f"C={c}" for c in CONCURRENCIES) + " |")
        lines.append("|---" * (len(CONCURRENCIES) + 1) + "|")
        for name, row in table.items():
            cells = [
                f"{row[c]:.2f} ({100 * (row[c] / envelope[c] - 1):+.1f}%)" for c in CONCURRENCIES
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Goals (within 1% of the envelope at every C / strictly better somewhere):")
        for name, row in table.items():
            if name.startswith("static") or name.startswith("envelope (best"):
                continue
            gaps = np.array([row[c] / envelope[c] - 1 for c in CONCURRENCIES])
            lines.append(
                f"- {name}: worst gap {100 * gaps.max():+.1f}%, best gap {100 * gaps.min():+.1f}%;"
                f" within 1% everywhere: {'yes' if gaps.max() <= 0.01 else 'no'};"
                f" strictly better somewhere: {'yes' if gaps.min() < 0 else 'no'}"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _plot(results: dict[str, dict[str, dict[int, float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for acceptance, table in results.items():
        envelope = table["envelope (best static)"]
        fig, axis = plt.subplots(figsize=(8, 4.5))
        for name, row in table.items():
            if name.startswith("static"):
                continue
            axis.plot(
                CONCURRENCIES,
                [100 * (row[c] / envelope[c] - 1) for c in CONCURRENCIES],
                marker="o",
                label=name,
            )
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrency C")
        axis.set_ylabel("mean TPOT vs envelope, %")
        axis.set_title(f"acceptance: {acceptance}")
        axis.axhline(1.0, color="grey", linestyle=":")
        axis.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"tpot_{acceptance}.png", dpi=100)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/policies"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = evaluate(args.out)
    seconds = time.perf_counter() - start
    _atomic_write(args.out / "results.json", json.dumps(results, indent=1))
    _plot(results, args.out)
    _atomic_write(args.out / "report.md", _markdown(results, seconds))


if __name__ == "__main__":
    main()
