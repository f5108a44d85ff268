#!/usr/bin/env bash
# Reduced-budget n = 5 comparison on real MNIST, one CPU core, sequential (docs/sorting_benchmark.md).
# Budget: batch 20 sets, 800 steps per operator (1 600 for odd-even Cauchy), validation every 200 steps on
# 500 fixed sets, test on 2 000 fixed sets; model selection at the best validation EM5.
# Usage: bash scripts/sorting_n5_reduced.sh [DATA_DIR]   (from the repository root; DATA_DIR holds MNIST/raw,
# default $DIFFRANK_DATA, else $DATA: no built-in path, the script stops when none is given)
set -u
DATA=${1:-${DIFFRANK_DATA:-${DATA:-}}}
if [ -z "$DATA" ]; then
  echo "usage: $0 DATA_DIR (the folder holding MNIST/raw), or set DIFFRANK_DATA (or DATA)" >&2
  exit 2
fi
if [ ! -d "$DATA/MNIST/raw" ]; then
  echo "$DATA/MNIST/raw does not exist: DATA_DIR must hold the MNIST idx files under MNIST/raw" >&2
  exit 2
fi
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1
COMMON="paths.data_dir=$DATA data.batch_size=20 data.val_sets=500 data.test_sets=2000 trainer.val_check_interval=200 trainer.log_every_n_steps=50 trainer.enable_progress_bar=false"
$PY -m diffrank.experiments.tools.throughput sorting --data-dir "$DATA" --batch 20 --steps 20 \
  sorting/thesis_t3_7/odd_even_cauchy_n5 sorting/thesis_t3_7/odd_even_art_n5 sorting/thesis_t3_3/bitonic_art_n4 sorting/thesis_t3_7/neuralsort_n5 \
  sorting/thesis_t7_3/softsort_n5 sorting/thesis_t3_7/sinkhorn_n5 sorting/lapsum_t4/lapsum_n5
$PY -m diffrank.experiments.tools.throughput sorting --data-dir "$DATA" --batch 100 --steps 5 sorting/thesis_t3_7/odd_even_cauchy_n5
$PY train.py experiment=sorting/thesis_t3_7/odd_even_cauchy_n5 $COMMON trainer.max_steps=1600
for e in sorting/thesis_t3_7/odd_even_art_n5 sorting/thesis_t3_3/bitonic_art_n4 sorting/thesis_t3_7/neuralsort_n5 sorting/thesis_t7_3/softsort_n5 \
         sorting/thesis_t3_7/sinkhorn_n5 sorting/lapsum_t4/lapsum_n5; do
  $PY train.py experiment=$e $COMMON trainer.max_steps=800
done
