#!/usr/bin/env bash
# Device: a real launcher run that passes `validate` but fails in a worker (a corrupt image in the
# SFT data with on_bad_sample = "fail"); the launcher must print the worker's first error with the
# log's path, not only the exit status.
#   bash scripts/device/launch_failure_cause.sh      (after scripts/device/setup.sh and . /tmp/site/env.sh)
# Env: WORK (/tmp/cause), TIMEOUT (300); the launcher's stderr and the cosmos-rl logs go to $OUT.
# Put the working tree first (export PYTHONPATH=$PWD:$PWD/plugins) to run it rather than a wheel.
# Seen on an H200 (2026-12-01), working tree: the launch stopped after ~1 min with status 1 and the
# launcher printed "first error in .../logs_<time>/policy_0.log:60: [rank0]:PIL.UnidentifiedImageError:
# cannot identify image file ... zz_broken.png". With the older wheel (the validation dataset built
# although validation is off) it printed the controller's "DatasetError: outputs/tiny/real-images:
# no such file or directory" instead: the failure this recipe setting used to hit.
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/cause}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
[[ -f $work/model/model_index.json ]] ||
  cosmos-sana make-tiny --out "$work/model" --device cuda >"$out/make_tiny.log" 2>&1 || exit 2
python scripts/device/make_image_dataset.py "$work/data" --count 8 --size 64 --seed 0 >/dev/null || exit 2
printf 'not a png' >"$work/data/zz_broken.png"
echo "a broken image" >"$work/data/zz_broken.txt"
status=0
DATASET_PATH=$work/data BASE_CHECKPOINT_PATH=$work/model OUTPUT_ROOT=$work/runs NPROC_PER_NODE=1 \
  TOML_FILE=toml/tiny/sana-image-sft.toml \
  timeout -k 30 "${TIMEOUT:-300}" bash launchers/launch_sft_sana-image-sft.sh -- validation.enable=false \
  'redis="12890"' train.train_batch_per_replica=9 train.train_policy.mini_batch=9 \
  >"$out/launcher.stdout" 2>"$out/launcher.stderr" || status=$?
echo "launcher exit status: $status"
cat "$out/launcher.stderr"
logs=$work/runs/sana-image-sft/logs/logs_latest
for log in "$logs"/*.log; do [[ -f $log ]] && cp "$log" "$out/"; done
exit 0
