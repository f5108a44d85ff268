#!/usr/bin/env bash
# The GPU checks on any CUDA machine, run from the repository root (docs/gpu.md, "On a GPU machine").
#
#   bash scripts/gpu_check.sh tests   # pytest -m "gpu or triton"                         -> $OUT/gpu_tests.log
#   bash scripts/gpu_check.sh bench   # the headline cell (n = 1000, k = 5, B = 1024), then the whole grid and
#                                     # the thesis Table 3.9 sizes                       -> $OUT/bench_*.{csv,png,log}
#   bash scripts/gpu_check.sh train   # thesis Table 3.7 (odd-even Cauchy, n = 5) with trainer=gpu; run it again
#                                     # to resume from the run's last.ckpt               -> $OUT/train/
#   bash scripts/gpu_check.sh all     # the three in turn
#
# Needs diffrank with the experiments and dev extras (hydra, difftopk, diffsort: the peers of the benchmark) and a
# CUDA device. On an offline machine, install from a wheelhouse first (docs/gpu.md, "Offline machines"); when
# hydra or diffrank is missing and $WHEELHOUSE/setup.sh exists (default .whl/), it is sourced. `train` reads MNIST
# from $DIFFRANK_DATA (the folder holding MNIST/raw). Environment: OUT (default outputs/gpu), EXPERIMENT,
# BENCH_SECONDS (time budget per benchmark cell; cells predicted slower are skipped).
set -uo pipefail

STAGE="${1:-all}"
OUT="${OUT:-outputs/gpu}"
EXPERIMENT="${EXPERIMENT:-sorting/thesis_t3_7/odd_even_cauchy_n5}"
BENCH_SECONDS="${BENCH_SECONDS:-20}"
WHEELHOUSE="${WHEELHOUSE:-.whl}"
mkdir -p "$OUT"

setup() {
  if ! python3 -c "import hydra, diffrank" 2>/dev/null; then
    [ -f "$WHEELHOUSE/setup.sh" ] || { echo "hydra or diffrank missing: pip install -e '.[experiments,dev]' (docs/gpu.md)"; exit 2; }
    # shellcheck disable=SC1091
    source "$WHEELHOUSE/setup.sh" || { echo "$WHEELHOUSE/setup.sh failed"; exit 2; }
  fi
  python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('device', torch.cuda.get_device_name())" \
    || exit 3
}

stage_tests() {
  echo "== tests: pytest -m 'gpu or triton'"
  python3 -m pytest -m "gpu or triton" -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 30
}

stage_bench() {
  echo "== bench: headline cell n = 1000, k = 5, B = 1024 (every operator x backend and its peer)"
  # rows are appended to the CSV as they are measured: an interrupted run keeps what was done
  python3 -m diffrank.benchmark --suite grid --device cuda --n 1000 --ks 5 --batches 1024 \
    --max-seconds "$BENCH_SECONDS" --csv "$OUT/bench_headline.csv" 2>&1 | tee "$OUT/bench_headline.log" | tail -n 60
  echo "== bench: the whole grid and the Table 3.9 sizes"
  python3 -m diffrank.benchmark --suite grid --device cuda --table39 --max-seconds "$BENCH_SECONDS" \
    --csv "$OUT/bench_grid.csv" --png "$OUT/bench_grid.png" 2>&1 | tee "$OUT/bench_grid.log" | tail -n 60
}

stage_train() {
  local data="${DIFFRANK_DATA:-}" run="$OUT/train" resume=()
  [ -n "$data" ] || { echo "train needs DIFFRANK_DATA: the folder holding MNIST/raw"; return 2; }
  if [ -f "$run/checkpoints/last.ckpt" ]; then
    resume=("ckpt_path=$run/checkpoints/last.ckpt")
    echo "resuming from $run/checkpoints/last.ckpt"
  fi
  echo "== train: $EXPERIMENT trainer=gpu -> $run"
  # callbacks=gpu: the default callbacks without Lightning's ThroughputMonitor, which synchronises after every
  # batch; no progress bar (it reads the loss at every refresh)
  python3 train.py "experiment=$EXPERIMENT" trainer=gpu callbacks=gpu "hydra.run.dir=$run" "paths.data_dir=$data" \
    trainer.enable_progress_bar=false extras.print_config=false "${resume[@]}" 2>&1 | tee -a "$OUT/train.log" | tail -n 30
}

case "$STAGE" in
  tests) setup; stage_tests ;;
  bench) setup; stage_bench ;;
  train) setup; stage_train ;;
  all) setup; stage_tests; stage_bench; stage_train ;;
  *) echo "usage: $0 tests|bench|train|all"; exit 1 ;;
esac
