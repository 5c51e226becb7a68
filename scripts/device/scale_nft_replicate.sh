#!/usr/bin/env bash
# Device: 2-GPU Diffusion-NFT scaling with the transformer sharded (FSDP2, cosmos-rl's way) against
# replicated ([custom.model] lora_data_parallel = "replicate": a whole model per GPU, LoRA gradients
# averaged, no weight all-gather), each against the same 1-GPU run. The launches are scale_nft.sh's:
# toml/sana-image-nft.toml through launchers/launch_rl_sana-image-nft.sh, SANA-1600M shapes at 512 px,
# 16 samples a GPU a step, JPEG reward; bench/scale_report.py tables each placement ($OUT/scale-<row>.json).
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && bash scripts/device/scale_nft_replicate.sh
#   DRY_RUN=1 bash scripts/device/scale_nft_replicate.sh    (CPU: validates every row's settings, launches nothing)
# Env: ROWS (2-GPU rows, default "fsdp replicate"; "fsdp-never" adds FSDP with
#      train.fsdp_reshard_after_forward = "never"; "fsdp-sync-every" adds FSDP reduce-scattering the LoRA
#      gradients in every backward, [custom.model] fsdp_gradient_sync = "every_backward", cosmos-rl's way,
#      where the default "fsdp" row reduce-scatters once per optimizer step), STEPS (8), SAVE_FREQ (1000), PER_GPU (16 samples a GPU
#      a step), TIMEOUT per run (300), WORK (/tmp/scale-replicate), DRY_RUN (0), ONE_GPU (1; 0 reuses the
#      1-GPU run an earlier call left in WORK on the same machine). Three launches take ~8-9 minutes: within
#      one 10-minute call run ROWS=fsdp, then ONE_GPU=0 ROWS=replicate.
# The launches run the recipe's defaults, its speed features included: each launch's first step compiles
# the transformer blocks (~40 s more; the scale report's steady state leaves the first step out), so
# budget that into TIMEOUT. The 2026-11-30 table ran without them, so its numbers compare only as
# "before the defaults changed". They have never run on 2 GPUs before: this is also that check.
# One GPU has nothing to shard or average (both placements run the same code there), so the 1-GPU row
# runs once. NCCL_NVLS_ENABLE=0 keeps NVLink multicast off (the device notes say why). Each launch gets
# its own controller, rendezvous and Redis ports.
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/scale-replicate}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
steps=${STEPS:-8}; per_gpu=${PER_GPU:-16}; dry=${DRY_RUN:-0}
rows=${ROWS:-fsdp replicate}
export NCCL_NVLS_ENABLE=0

placement_sets() {  # $1 = row name → the overrides that select its placement
  case $1 in
    fsdp) echo 'custom.model.lora_data_parallel="fsdp"' ;;
    fsdp-never) echo 'custom.model.lora_data_parallel="fsdp"'; echo 'train.fsdp_reshard_after_forward="never"' ;;
    fsdp-sync-every) echo 'custom.model.lora_data_parallel="fsdp"'; echo 'custom.model.fsdp_gradient_sync="every_backward"' ;;
    replicate) echo 'custom.model.lora_data_parallel="replicate"' ;;
    *) echo "unknown row '$1' (rows: fsdp, fsdp-never, fsdp-sync-every, replicate)" >&2; return 1 ;;
  esac
}

for r in $rows; do placement_sets "$r" >/dev/null || exit 2; done

model=$work/model
[[ $dry == 1 ]] && model=$work/model-dry-tiny  # the settings only need the folder's shape
if [[ ! -f $model/model_index.json ]]; then
  if [[ $dry == 1 ]]; then
    cosmos-sana make-tiny --out "$model" --preset tiny --device cpu >"$out/make_tiny.log" 2>&1 || exit 1
  else
    cosmos-sana make-tiny --out "$model" --preset sana-1600m --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1 ||
      { echo "make-tiny failed: $out/make_tiny.log" >&2; exit 1; }
  fi
fi

launch() {  # $1 = GPUs, $2 = row tag, $3 = port offset, rest = the row's overrides
  local n=$1 tag=$2 index=$3 size=512; shift 3
  [[ $dry == 1 ]] && size=64
  rm -rf "${work:?}/$tag"  # a reused WORK must not leave an older run's metrics
  NPROC_PER_NODE=$n MASTER_PORT=$((8200 + index)) RDZV_PORT=$((29500 + index)) DATASET_PATH=builtin:demo \
    BASE_CHECKPOINT_PATH=$model OUTPUT_ROOT=$work/$tag DRY_RUN=$dry \
    timeout -k 60 -s INT "${TIMEOUT:-300}" bash launchers/launch_rl_sana-image-nft.sh -- \
    "redis=\"$((13000 + index))\"" "policy.diffusers.inference_size=[$size, $size]" "rollout.n_generation=8" \
    "rollout.n_generation_mini_batch=8" "rollout.batch_size=$((per_gpu / 8))" "train.train_batch_per_replica=$((per_gpu * n))" \
    "train.train_policy.mini_batch=8" "train.max_num_steps=$steps" "train.ckpt.save_freq=${SAVE_FREQ:-1000}" \
    "train.ckpt.export_safetensors=false" 'logging.logger=["console"]' \
    'custom.rewards=[{name="jpeg_compressibility"}]' "$@" >"$out/$tag.log" 2>&1
}

status_all=0; index=0
for row in 1:fsdp $(for r in $rows; do echo "2:$r"; done); do
  n=${row%%:*}; name=${row#*:}; tag=$name-n$n; index=$((index + 1))
  mapfile -t sets < <(placement_sets "$name")
  if [[ $n == 1 && ${ONE_GPU:-1} == 0 && $dry != 1 ]]; then
    echo "$tag: reusing the run in $work/$tag"
  else
    t=$(date +%s); status=0
    launch "$n" "$tag" "$index" "${sets[@]}" || status=$?
    echo "$tag: exit $status after $(( $(date +%s) - t )) s"
    ((status)) && status_all=1
  fi
  if [[ $dry == 1 ]]; then
    grep -q 'dry run: configuration valid' "$out/$tag.log" || { tail -n 20 "$out/$tag.log" >&2; status_all=1; }
    continue
  fi
  file=$(find "$work/$tag" -name metrics.jsonl | head -n 1)
  [[ -n $file ]] && cp "$file" "$out/metrics-$tag.jsonl"
  mkdir -p "$out/logs-$tag"
  find "$work/$tag" -name "*.log" -exec cp {} "$out/logs-$tag/" \; 2>/dev/null
done
[[ $dry == 1 ]] && exit "$status_all"

for name in $rows; do
  files=("$out/metrics-fsdp-n1.jsonl" "$out/metrics-$name-n2.jsonl")
  present=(); for f in "${files[@]}"; do [[ -f $f ]] && present+=("$f"); done
  ((${#present[@]})) && python bench/scale_report.py "${present[@]}" --per-gpu-batch "$per_gpu" --json-out "$out/scale-$name.json"
done
exit "$status_all"
