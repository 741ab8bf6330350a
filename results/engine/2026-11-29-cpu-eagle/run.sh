#!/usr/bin/env bash
# Measurements of the shipped EAGLE head (writes into $OUT, default the current folder)
set -u
W=${W:-$(git rev-parse --show-toplevel)}
D="env PYTHONPATH=$W OMP_NUM_THREADS=1 $W/.venv/bin/dsd"
cd "${OUT:-.}"
uptime > load_start.txt
for K in 3 5; do
  $D run --target smollm2-135m --draft eagle --policy static:$K --num-spec-tokens $K \
     --dataset-name mt-bench --num-prompts 10 --max-concurrency 1 --output-len 96 --threads 1 --json \
     > al_mtbench_k$K.json 2> al_mtbench_k$K.err
done
uptime > load_mid.txt
env PYTHONPATH=$W OMP_NUM_THREADS=1 $W/.venv/bin/python $W/benchmarks/sd_speedup.py --dataset-name mt-bench \
   --num-prompts 6 --output-len 96 --repeats 2 --threads 1 \
   --arm none --arm "ngram:2-6 static:4" --arm "eagle static:3" --arm "eagle+ngram:2-6 static:3" \
   --out speedup_mtbench.json > speedup_mtbench.txt 2> speedup_mtbench.err
uptime > load_end.txt
echo done > DONE
