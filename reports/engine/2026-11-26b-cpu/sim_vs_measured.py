"""Simulated vs measured mean TPOT per SPEC from envelope_gap JSONs (median over repeats), and
the spread of identical-work repeats."""
import json, statistics, sys, glob
errs = []
for path in sorted(glob.glob(sys.argv[1] + "/interleaved_c*.json")):
    r = json.load(open(path))
    for row in r["rows"]:
        c = row["concurrency"]
        for spec, runs in row["measured"].items():
            t = [x["tpot_ms"] for x in runs]
            med = statistics.median(t)
            sim = row["simulated"][spec]["tpot_ms"] if isinstance(row["simulated"][spec], dict) else row["simulated"][spec]
            err = 100 * (sim - med) / med
            spread = 100 * (max(t) - min(t)) / med
            errs.append(abs(err))
            print(f"C={c} {spec:10s} measured {med:6.1f} sim {sim:6.1f} err {err:+5.1f}% spread {spread:4.1f}%")
print(f"cells {len(errs)}: median |err| {statistics.median(errs):.1f}%, max {max(errs):.1f}%")
