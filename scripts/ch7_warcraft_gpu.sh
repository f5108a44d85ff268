#!/usr/bin/env bash
# Thesis chapter 7 Warcraft rows at a reduced budget on the generated 12 x 12 set (docs/warcraft.md, "Chapter 7
# rows"), side by side on one GPU machine of the device tool: one line of stdin per run, "<row> [overrides...]".
# Each run (give seed=<s> on its line): 10 of the 50 epochs (milestones scaled to epochs 6, 8), the final epoch
# tested, float32, one intra-op thread (the CNN runs on the GPU, Dijkstra on one CPU core). Results: $OUT/runs.tgz (no checkpoints).
#   source .whl/setup.sh && printf '%s\n' "warcraft/thesis_t7_4/for_l2sq" ... | bash scripts/ch7_warcraft_gpu.sh
set -u
python3 -m diffrank.experiments.data.warcraft_like --out /tmp/wc --seed 0 > /tmp/gen.log 2>&1 || { tail /tmp/gen.log; exit 1; }
mkdir -p /tmp/runs
i=0
while read -r row rest; do
  [ -z "$row" ] && continue
  i=$((i + 1))
  echo "r$i: $row $rest" | tee -a /tmp/runs/index.txt
  # shellcheck disable=SC2086  # $rest holds several overrides
  OMP_NUM_THREADS=1 python3 train.py experiment="$row" $rest paths.data_dir=/tmp/wc \
    data.root_name=warcraft_like_synthetic trainer=gpu trainer.precision=32-true callbacks=gpu logger=csv \
    trainer.max_epochs=10 'model.scheduler.milestones=[6,8]' trainer.enable_progress_bar=false \
    hydra.run.dir=/tmp/runs/r$i > /tmp/runs/r$i.log 2>&1 &
done
wait
cd /tmp && tar czf "$OUT/runs.tgz" --exclude='*.ckpt' runs gen.log
for f in runs/r*/results.json; do
  python3 -c "import json; d = json.load(open('$f')); m = d['metrics']
print('$f', d['task_name'], d['overrides'], d['status'], 'test EM %.1f %%' % (100 * m['test/em_path']),
      'cost ratio %.4f' % m['test/cost_ratio'], 'val EM %.1f %%' % (100 * m['val/em_path']), 'wall %.0f s' % d['wall_time_s'])"
done
