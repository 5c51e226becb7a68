#!/usr/bin/env bash
# Device: the other end-to-end launches of the "prove it on the H200" issue, run side by side on one
# GPU (each job has its own controller/redis/rendezvous ports), logs and summaries to $OUT.
#   bash scripts/device/e2e_suite.sh JOB...      (after scripts/device/setup.sh and . /tmp/site/env.sh)
# Jobs:
#   sft    launchers/launch_sft_sana-image-sft-lora.sh on a generated 512 px dataset (SANA-1600M shapes),
#          then `export --format lora --verify`
#   video  toml/sana-video-nft.toml on SANA-Video-2B shapes, 256², 9 frames (bare cosmos-rl --config)
#   grpo   toml/sana-image-grpo.toml, SANA-600M shapes, 256 px
#   ddrl   toml/sana-image-ddrl.toml, SANA-600M shapes, 256 px, real data = the generated dataset
#   fast   toml/sana-image-nft.toml, SANA-600M shapes, 256 px, with the speed features that recipe ships
#          (compiled blocks, bf16 linear attention, set again here, and the text K/V cache)
# Env: STEPS (6), TIMEOUT per job (420), DEADLINE (epoch seconds every job ends by), WORK (/tmp/suite);
#      models are built once under $WORK (a ready model-<preset> folder is reused).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/suite}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
steps=${STEPS:-6}; limit=${TIMEOUT:-420}

model() {  # $1 = preset; builds once, prints the folder
  local dir=$work/model-$1
  [[ -f $dir/model_index.json ]] ||
    cosmos-sana make-tiny --out "$dir" --preset "$1" --device cuda --dtype bfloat16 >"$out/make_tiny-$1.log" 2>&1
  echo "$dir"
}
dataset() {  # the generated image dataset (train + val), built once
  [[ -d $work/data/train ]] || {
    python scripts/device/make_image_dataset.py "$work/data/train" --count 64 --size 512 --seed 0
    python scripts/device/make_image_dataset.py "$work/data/val" --count 8 --size 512 --seed 1
  } >/dev/null
  echo "$work/data"
}
timed() {  # $1 = job name; runs the rest, logs to $out/$1.log; stops at TIMEOUT or DEADLINE
  local name=$1 t status=0 budget=$limit; shift
  t=$(date +%s)
  [[ -n ${DEADLINE:-} ]] && (( DEADLINE - t < budget )) && budget=$(( DEADLINE - t ))
  (( budget > 10 )) || { echo "$name: skipped (past DEADLINE)"; return; }
  timeout -k 60 -s INT "$budget" "$@" >"$out/$name.log" 2>&1 || status=$?
  echo "$name: exit $status after $(( $(date +%s) - t )) s"
}
bare() {  # $1 = job, $2 = recipe, $3 = model, $4 = port offset, rest = --set overrides
  local job=$1 recipe=$2 mdl=$3 port=$4; shift 4
  local sets=(--set "policy.model_name_or_path=\"$mdl\"" --set "train.output_dir=\"$work/out-$job\""
              --set "redis=\"$((12800 + port))\"" --set "train.max_num_steps=$steps"
              --set "policy.parallelism.dp_shard_size=1" --set "rollout.parallelism.dp_shard_size=1"
              --set 'logging.logger=["console"]')
  local kv
  for kv in "$@"; do sets+=(--set "$kv"); done
  cosmos-sana validate "$recipe" "${sets[@]}" --dump "$work/$job.toml" >"$out/$job.validate.log" 2>&1 ||
    { echo "$job: validate failed"; return; }
  timed "$job" cosmos-rl --config "$work/$job.toml" --port $((8000 + port)) --rdzv-port $((29345 + port)) \
    --log-dir "$work/out-$job/logs" cosmos_sana.bridge
}

job_sft() {
  local mdl data; mdl=$(model sana-1600m); data=$(dataset)
  [[ -n ${DEADLINE:-} ]] && DEADLINE=$(( DEADLINE - 60 ))  # (this job's subshell) time left for the export
  NPROC_PER_NODE=1 MASTER_PORT=8010 RDZV_PORT=29355 DATASET_PATH=$data/train BASE_CHECKPOINT_PATH=$mdl \
    OUTPUT_ROOT=$work/out-sft timed sft bash launchers/launch_sft_sana-image-sft-lora.sh -- \
    "redis=\"12810\"" "policy.diffusers.inference_size=[512, 512]" "train.train_batch_per_replica=8" \
    "train.train_policy.mini_batch=2" "train.max_num_steps=$((steps * 3))" "train.ckpt.save_freq=$((steps * 3))" \
    "validation.freq=$((steps * 3))" "custom.val_data.args.path=\"$data/val\"" 'logging.logger=["console"]'
  local ckpt
  ckpt=$(find "$work/out-sft" -maxdepth 5 -type d -name "iter_*" | sort | tail -1)
  echo "sft checkpoint: ${ckpt:-none}"
  [[ -n ${DEADLINE:-} ]] && DEADLINE=$(( DEADLINE + 60 ))
  [[ -n $ckpt ]] && timed sft-export cosmos-sana export "$ckpt" --out "$work/export-sft-lora" --format lora \
    --verify --verify-size 512
}
job_video() {
  bare video toml/sana-video-nft.toml "$(model sana-video-2b)" 20 \
    "policy.diffusers.inference_size=[256, 256]" "policy.diffusers.train_frames=9" \
    "policy.diffusers.inference_frames=9" "rollout.n_generation=4" "rollout.n_generation_mini_batch=4" \
    "rollout.batch_size=2" "train.train_batch_per_replica=8" "train.train_policy.mini_batch=4" \
    "train.ckpt.save_freq=$steps" "custom.data.args.path=\"builtin:demo\"" \
    'custom.rewards=[{name="jpeg_compressibility"}]'
}
rl_image() {  # $1 = grpo|ddrl, $2 = port offset, rest = overrides
  local algo=$1 port=$2; shift 2
  bare "$algo" "toml/sana-image-$algo.toml" "$(model sana-600m)" "$port" \
    "policy.diffusers.inference_size=[256, 256]" "rollout.n_generation=8" "rollout.n_generation_mini_batch=8" \
    "rollout.batch_size=2" "train.train_batch_per_replica=16" "train.train_policy.mini_batch=4" \
    "train.train_policy.batch_size_per_optimize=16" "train.ckpt.save_freq=$steps" \
    "custom.data.args.path=\"builtin:demo\"" 'custom.rewards=[{name="jpeg_compressibility"}]' "$@"
}
job_grpo() { rl_image grpo 30; }
job_ddrl() { rl_image ddrl 40 "custom.real_data.args.path=\"$(dataset)/train\""; }
job_fast() {  # bare() names outputs after the job, so the NFT recipe runs here as job "fast"
  bare fast toml/sana-image-nft.toml "$(model sana-600m)" 50 \
    "policy.diffusers.inference_size=[256, 256]" "rollout.n_generation=8" "rollout.n_generation_mini_batch=8" \
    "rollout.batch_size=2" "train.train_batch_per_replica=16" "train.train_policy.mini_batch=4" \
    "train.ckpt.save_freq=$steps" "custom.data.args.path=\"builtin:demo\"" \
    'custom.rewards=[{name="jpeg_compressibility"}]' "custom.rollout.speed.compile_blocks=true" \
    'custom.rollout.speed.linear_attention="bf16"'
}

summarise() {  # reward/loss/step time of every metrics.jsonl under $work
  find "$work" -name metrics.jsonl -path "*out-*" | while read -r f; do
    python - "$f" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def col(key, nd=4):
    return [round(row[key], nd) for row in rows if key in row]
r, l, t = col("reward/mean", 5), col("train/loss"), col("time/step_s", 2)
print(sys.argv[1], "| steps", len(rows), "| reward", r[:2], "->", r[-2:], "| loss", l[:1], "->", l[-1:], "| step s", t[-3:])
PY
  done
}
collect_logs() {  # every worker/controller log and metrics file of each job, flat, under $out/logs-<job>
  local dir job
  for dir in "$work"/out-*; do
    [[ -d $dir ]] || continue
    job=${dir##*/out-}
    mkdir -p "$out/logs-$job"
    find "$dir" \( -name "*.log" -o -name metrics.jsonl -o -name "*.toml" \) -exec cp {} "$out/logs-$job/" \; 2>/dev/null
  done
}

# Models and data first (serially: make-tiny and the dataset are shared), then the jobs side by side.
for job in "$@"; do
  case $job in
    sft) model sana-1600m >/dev/null; dataset >/dev/null ;;
    video) model sana-video-2b >/dev/null ;;
    grpo|fast) model sana-600m >/dev/null ;;
    ddrl) model sana-600m >/dev/null; dataset >/dev/null ;;
    *) echo "unknown job $job" >&2; exit 2 ;;
  esac
done
echo "models and data ready"
for job in "$@"; do "job_$job" & done
wait
collect_logs
summarise | tee "$out/summary.txt"
find "$work" -maxdepth 6 -type d -name "iter_*" | sort >"$out/checkpoints.txt"
