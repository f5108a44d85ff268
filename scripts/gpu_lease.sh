#!/usr/bin/env bash
# The GPU session in one command, run on the (bare, offline) device machine from the repository root.
# docs/gpu.md says what each stage measures and how to call it through the device tool.
#
#   bash scripts/gpu_lease.sh all      # stage 1 + stage 2 (headline; full grid in the background) + stage 3
#   bash scripts/gpu_lease.sh tests    # stage 1: pytest -m 'gpu or triton'                -> $OUT/gpu_tests.log
#   bash scripts/gpu_lease.sh bench    # stage 2: n = 1000, k = 5, B = 1024 in the foreground -> $OUT/bench_headline.*
#                                      #          then the full grid + Table 3.9 in the background (bench_grid.*)
#   bash scripts/gpu_lease.sh train    # stage 3: start or resume the thesis odd-even Cauchy n = 5 run (background)
#   bash scripts/gpu_lease.sh poll     # copy logs, metrics, the latest checkpoint and results to $OUT
#   bash scripts/gpu_lease.sh stop     # end the background jobs this script started (by their recorded pid)
#
# Needs what the device image lacks (hydra-core, omegaconf, difftopk, diffsort; diffrank installed): either
# present already, or a carried .whl/ whose setup.sh installs its wheels offline and exports DIFFRANK_DATA
# (docs/gpu.md, "The commands"). Stage 3 trains on MNIST: the folder holding MNIST/raw is $DIFFRANK_DATA (or
# $DATA); there is no default, the stage stops with a message when neither is set. A checkpoint from an earlier
# session is picked up from gpu_state/last.ckpt (carry it: *.ckpt is git-ignored). Long jobs run under
# setsid nohup with their state in $STATE (default /tmp/diffrank_gpu), which survives between commands while
# the machine stays warm; $OUT is emptied before every command, so poll copies what matters into it.
# At most 8 files come back from $OUT: poll writes exactly the 8 below (those that exist).
set -uo pipefail

STAGE="${1:-all}"
OUT="${OUT:-/tmp/diffrank_gpu_out}"
STATE="${STATE:-/tmp/diffrank_gpu}"
EXPERIMENT="${EXPERIMENT:-sorting/thesis_t3_7/odd_even_cauchy_n5}"
BENCH_SECONDS="${BENCH_SECONDS:-20}"   # time budget per benchmark cell (predicted-slower cells are skipped)
mkdir -p "$OUT" "$STATE"

setup() {
  if ! python3 -c "import hydra, diffrank" 2>/dev/null; then
    [ -f .whl/setup.sh ] || { echo "hydra or diffrank missing and no .whl/setup.sh: build .whl (docs/gpu.md) and carry it"; exit 2; }
    # shellcheck disable=SC1091
    source .whl/setup.sh || { echo "setup.sh failed"; exit 2; }
  fi
  python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('device', torch.cuda.get_device_name())" \
    || exit 3
}

alive() {  # alive <pidfile>: the recorded process still runs
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

stage_tests() {
  echo "== stage 1: pytest -m 'gpu or triton'"
  timeout "${TESTS_SECONDS:-200}" python3 -m pytest -m "gpu or triton" -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -n 30
}

stage_bench() {
  echo "== stage 2a: headline cell n = 1000, k = 5, B = 1024 (every operator x backend and its peer)"
  # rows are appended to the CSV as they are measured: a timeout keeps what was done
  timeout "${HEADLINE_SECONDS:-240}" python3 -m diffrank.benchmark --suite grid --device cuda --n 1000 \
    --ks 5 --batches 1024 --max-seconds "$BENCH_SECONDS" --csv "$STATE/bench_headline.csv" 2>&1 \
    | tee "$STATE/bench_headline.log" | tail -n 60
  cp "$STATE/bench_headline.csv" "$OUT/bench_headline.csv" 2>/dev/null
  echo "== stage 2b: full grid + Table 3.9 in the background -> $STATE/bench_grid.{csv,png,log}"
  if alive "$STATE/bench.pid"; then echo "grid already running (pid $(cat "$STATE/bench.pid"))"; return; fi
  setsid nohup python3 -m diffrank.benchmark --suite grid --device cuda --table39 \
    --max-seconds "$BENCH_SECONDS" --csv "$STATE/bench_grid.csv" --png "$STATE/bench_grid.png" \
    > "$STATE/bench_grid.log" 2>&1 < /dev/null &
  echo $! > "$STATE/bench.pid"
  echo "started grid, pid $(cat "$STATE/bench.pid")"
}

stage_train() {
  echo "== stage 3: $EXPERIMENT trainer=gpu (background, checkpoints in $STATE/train/checkpoints)"
  if alive "$STATE/train.pid"; then echo "training already running (pid $(cat "$STATE/train.pid"))"; return; fi
  local data="${DIFFRANK_DATA:-${DATA:-}}"
  if [ -z "$data" ]; then
    echo "stage 3 needs the data folder (holding MNIST/raw): set DIFFRANK_DATA or DATA (.whl/setup.sh sets it)"
    return 2
  fi
  local run="$STATE/train" resume=()
  mkdir -p "$run/checkpoints"
  if [ ! -f "$run/checkpoints/last.ckpt" ] && [ -f gpu_state/last.ckpt ]; then
    cp gpu_state/last.ckpt "$run/checkpoints/last.ckpt"   # brought back by an earlier session
  fi
  if [ -f "$run/checkpoints/last.ckpt" ]; then
    resume=("ckpt_path=$run/checkpoints/last.ckpt")
    echo "resuming from $run/checkpoints/last.ckpt"
  fi
  # no progress bar (a log file, not a terminal; it also reads the loss every step) and, unless THROUGHPUT=1,
  # callbacks=gpu: no ThroughputMonitor (it calls torch.cuda.synchronize() after every batch); the CSV logger
  # writes metrics.csv under the run folder
  local extra=("~callbacks.rich_progress_bar")
  [ "${THROUGHPUT:-0}" = 1 ] || extra=("callbacks=gpu" "${extra[@]}")
  setsid nohup python3 train.py "experiment=$EXPERIMENT" trainer=gpu "hydra.run.dir=$run" "paths.data_dir=$data" \
    trainer.enable_progress_bar=false "${extra[@]}" extras.print_config=false "${resume[@]}" \
    >> "$STATE/train.log" 2>&1 < /dev/null &
  echo $! > "$STATE/train.pid"
  echo "started training, pid $(cat "$STATE/train.pid")"
}

stage_poll() {
  echo "== poll $(date -u +%FT%TZ)"
  for job in bench train; do
    if alive "$STATE/$job.pid"; then echo "$job: running (pid $(cat "$STATE/$job.pid"))"; else echo "$job: not running"; fi
  done
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total --format=csv,noheader 2>/dev/null
  [ -f "$STATE/train.log" ] && tail -n 400 "$STATE/train.log" > "$OUT/train.log"
  local metrics
  metrics=$(find "$STATE/train" -name metrics.csv 2>/dev/null | sort | tail -n 1)
  [ -n "$metrics" ] && cp "$metrics" "$OUT/metrics.csv" && echo "metrics: $(wc -l < "$metrics") rows"
  [ -f "$STATE/train/results.json" ] && cp "$STATE/train/results.json" "$OUT/results.json"
  local ckpt="$STATE/train/checkpoints/last.ckpt"
  if [ -f "$ckpt" ]; then
    if [ "$(stat -c %s "$ckpt")" -lt $((16 * 1024 * 1024)) ]; then cp "$ckpt" "$OUT/last.ckpt"
    else echo "last.ckpt is over 16 MiB: not copied"; fi
  fi
  [ -f "$STATE/bench_grid.log" ] && tail -n 300 "$STATE/bench_grid.log" > "$OUT/bench_grid.log"
  for f in bench_grid.csv bench_grid.png bench_headline.csv; do [ -f "$STATE/$f" ] && cp "$STATE/$f" "$OUT/$f"; done
  ls -la "$OUT"
  [ -f "$OUT/train.log" ] && tail -n 15 "$OUT/train.log"
}

stage_stop() {
  for job in bench train; do
    if alive "$STATE/$job.pid"; then kill -- "-$(cat "$STATE/$job.pid")" 2>/dev/null || kill "$(cat "$STATE/$job.pid")"
      echo "stopped $job"; fi
  done
}

case "$STAGE" in
  tests) setup; stage_tests ;;
  bench) setup; stage_bench ;;
  train) setup; stage_train ;;
  poll) stage_poll ;;
  stop) stage_stop ;;
  all) setup; stage_tests; stage_bench; stage_train; sleep 30; stage_poll ;;
  *) echo "usage: $0 all|tests|bench|train|poll|stop"; exit 1 ;;
esac
