"""Simulated vs measured mean TPOT per SPEC (median over repeats) from the envelope_gap JSONs
in a folder, with each SPEC's repeat spread.

    python results/engine/2026-11-26b-cpu/sim_vs_measured.py results/engine/2026-11-26b-cpu
"""

import glob
import json
import statistics
import sys

errors = []
for path in sorted(glob.glob(sys.argv[1] + "/interleaved_c*.json")):
    with open(path, encoding="utf-8") as file:
        rows = json.load(file)["rows"]
    for row in rows:
        for spec, runs in row["measured"].items():
            tpot = [run["tpot_ms"] for run in runs]
            measured = statistics.median(tpot)
            simulated = row["simulated"][spec]["tpot_ms"]
            error = 100 * (simulated - measured) / measured
            spread = 100 * (max(tpot) - min(tpot)) / measured
            errors.append(abs(error))
            print(
                f"C={row['concurrency']} {spec:10s} measured {measured:6.1f} "
                f"sim {simulated:6.1f} err {error:+5.1f}% spread {spread:4.1f}%"
            )
print(f"cells {len(errors)}: median |err| {statistics.median(errors):.1f}%, max {max(errors):.1f}%")
