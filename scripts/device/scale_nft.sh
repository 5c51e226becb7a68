#!/usr/bin/env bash
# Device: toml/sana-image-nft.toml on 1, 2, 4, 8 GPUs with the same per-GPU batch (issue "scale-out"),
# SANA-1600M shapes at 512 px, JPEG reward, through launchers/launch_rl_sana-image-nft.sh; then
# bench/scale_report.py turns the run logs into the scaling table ($OUT/scale.json).
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && GPUS="1 2" bash scripts/device/scale_nft.sh
# Env: GPUS (counts to run, default: 1 and every power of two up to the GPUs present), STEPS (8), SAVE_FREQ (1000),
#      PER_GPU (16 samples a GPU a step), TIMEOUT per run (300), WORK (/tmp/scale).
# NCCL_NVLS_ENABLE=0 keeps NVLink multicast off (the device notes say why). Controller, rendezvous and
# Redis ports depend on the GPU count, so a run can share the host with another launch.
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/scale}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
steps=${STEPS:-8}; per_gpu=${PER_GPU:-16}
present=$(nvidia-smi -L | grep -c '^GPU')
gpus=${GPUS:-$(for n in 1 2 4 8; do ((n <= present)) && echo "$n"; done)}
export NCCL_NVLS_ENABLE=0
[[ -f $work/model/model_index.json ]] ||
  cosmos-sana make-tiny --out "$work/model" --preset sana-1600m --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1
metrics=()
for n in $gpus; do
  t=$(date +%s); status=0
  rm -rf "$work/n$n"  # a reused WORK must not leave an older run's metrics
  NPROC_PER_NODE=$n MASTER_PORT=$((8100 + n)) RDZV_PORT=$((29400 + n)) DATASET_PATH=builtin:demo BASE_CHECKPOINT_PATH=$work/model OUTPUT_ROOT=$work/n$n \
    timeout -k 60 -s INT "${TIMEOUT:-300}" bash launchers/launch_rl_sana-image-nft.sh -- \
    "redis=\"$((12900 + n))\"" "policy.diffusers.inference_size=[512, 512]" "rollout.n_generation=8" "rollout.n_generation_mini_batch=8" \
    "rollout.batch_size=$((per_gpu / 8))" "train.train_batch_per_replica=$((per_gpu * n))" \
    "train.train_policy.mini_batch=8" "train.max_num_steps=$steps" "train.ckpt.save_freq=${SAVE_FREQ:-1000}" \
    "train.ckpt.export_safetensors=false" 'logging.logger=["console"]' \
    'custom.rewards=[{name="jpeg_compressibility"}]' >"$out/n$n.log" 2>&1 || status=$?
  echo "$n GPU(s): exit $status after $(( $(date +%s) - t )) s"
  file=$(find "$work/n$n" -name metrics.jsonl | head -n 1)
  if [[ -n $file ]]; then cp "$file" "$out/metrics-n$n.jsonl"; metrics+=("$out/metrics-n$n.jsonl"); fi
  mkdir -p "$out/logs-n$n"
  find "$work/n$n" -name "*.log" -exec cp {} "$out/logs-n$n/" \; 2>/dev/null
done
((${#metrics[@]})) && python bench/scale_report.py "${metrics[@]}" --per-gpu-batch "$per_gpu" --json-out "$out/scale.json"
