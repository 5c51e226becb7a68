#!/usr/bin/env bash
# Device: cosmos-rl 0.4.7's own SANA Diffusion-NFT launch as the baseline for ours, one after the other
# on one GPU, same model folder and settings; one JSON ($OUT/upstream_baseline.json) with seconds per
# step (median over the steps after the first), samples/s and time to first step of each, and the
# ratios ours/upstream (bench/upstream_baseline_report.py reads both controller logs).
#   export PYTHONUNBUFFERED=1; bash scripts/device/setup.sh >$OUT/setup.log 2>&1 || exit 1; . /tmp/site/env.sh;
#   bash scripts/device/upstream_baseline.sh
#   DRY_RUN=1 bash scripts/device/upstream_baseline.sh    (CPU: writes and checks both configs, launches nothing)
#
# upstream: `python3 -m cosmos_rl.launcher.launch_all --config upstream.toml cosmos_rl.tools.dataset.diffusion_nft`
#   (its dataset script, its `diffusion_nft` trainer, its `diffusion_nft_rollout`, its remote reward client),
#   with upstream's configs/sana/sana-image-nft.toml re-written below: its values except those marked.
# ours: launchers/launch_rl_sana-image-nft.sh (toml/sana-image-nft.toml) with the same settings as overrides.
#
# Set the same on both sides: model folder (make-tiny PRESET, bf16, random weights), requested size
# SIZE², PROMPTS_PER_STEP × IMAGES_PER_PROMPT samples a step (rollout chunks of IMAGES_PER_PROMPT,
# training micro-batches of MINI_BATCH), SAMPLE_STEPS sampling steps, int(SAMPLE_STEPS × FRACTION)
# trained timesteps a sample, LoRA r LORA_RANK / alpha LORA_ALPHA (upstream's recipe: 4 / 4) on both
# recipes' attention projections, DTYPE, EMA on, KL β 1e-4, STEPS training steps, the JPEG
# compressibility reward (same scorer code), the same prompt file (our builtin demo prompts),
# checkpoints off (step time without checkpoint writes).
# Settings of upstream's recipe changed to match (not workarounds): dtype float32 → DTYPE; 1024² →
# SIZE; 10 → SAMPLE_STEPS sampling steps; 24 images a prompt, 6 prompts a GPU, mini-batch 9 → the
# batch above; `timestep_fraction = 0.99` (a misspelt key cosmos-rl drops, so upstream trains all
# steps) → `timesteps_fraction = FRACTION`; save_freq 20 → checkpoints off; max_num_steps added;
# logger console only, as ours (wandb is not installed here).
# Each side keeps its own sampler (upstream: euler, noise_level 1, deterministic; ours: ODE).
# Workarounds for what stops upstream's launch from running at all here (nothing of upstream's code is changed):
#   1. prompts: its dataset script downloads pickscore/{train,test}.txt with `wget` when missing (no
#      internet here); the same demo prompts are placed there first ($COSMOS_CACHE_DIR/diffusion_nft/pickscore/).
#   2. reward: its NFT path only has remote rewards; cosmos-sana's reward server scores jpeg_compressibility
#      on loopback (scripts/device/hold_pull_reward_server.py). Its pulls wait until the batch is scored:
#      cosmos-rl's client raises IndexError on the protocol's "not ready" answer (HTTP 400) to its first
#      pull, which would end the launch at step 1.
#   3. `remote_reward.reward_fns = [{name = "jpeg_compressibility"}]`: the recipe's `reward_fn = {pickscore = 1.0}`
#      and `score_key` are not fields of 0.4.7's config (dropped silently, leaving its default reward
#      "dance_grpo", which no server here serves).
#   4. one GPU: dp_shard_size 8 → 1 (policy and rollout).
# Kept as upstream has them (part of what is measured): its resolution binning (on a sample_size-32 model a
# 512² request is sampled and trained at 1024², resized for the reward; the JSON's settings say which size),
# the 10 s Redis command block of its colocated loop, its start-up and shutdown, gradient checkpointing
# (each side as its recipe sets it: upstream's on; ours off since 2026-12-01, on in earlier runs of
# this script), EMA, its masks and group slicing.
# Env: STEPS (8), TIMEOUT per launch (240), BUDGET (510: seconds this script may run in all, i.e. a 600 s
#      device call less ~65 s of setup and a margin; a launch gets at most what is left less 40 s for its
#      shutdown and the report), PRESET (sana-1600m),
#      SIZE (512), PROMPTS_PER_STEP (2), IMAGES_PER_PROMPT (8), MINI_BATCH (8), SAMPLE_STEPS (20),
#      FRACTION (0.6), LORA_RANK (4), LORA_ALPHA (4), DTYPE (bfloat16), UPSTREAM_DTYPE (DTYPE; float32 = its
#      recipe as shipped), SIDES ("upstream ours": one call may run one side, a later call on the
#      same still-warm machine the other; the JSON then covers both),
#      WORK (/tmp/upstream-baseline), MODEL (default: built into WORK/model), DRY_RUN (0),
#      MODEL_SAMPLE_SIZE (unset: the model's own; 16 = a 512 px-class SANA such as Sana_1600M_512px: the same
#      weights with transformer sample_size 16, which without a positional embedding changes nothing but
#      upstream's binning, so that it samples and trains a 512² request at 512², the same work as ours).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/upstream-baseline}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
steps=${STEPS:-8}; timeout_s=${TIMEOUT:-240}; size=${SIZE:-512}; prompts_per_step=${PROMPTS_PER_STEP:-2}
images=${IMAGES_PER_PROMPT:-8}; mini=${MINI_BATCH:-8}; sample_steps=${SAMPLE_STEPS:-20}; fraction=${FRACTION:-0.6}
rank=${LORA_RANK:-4}; alpha=${LORA_ALPHA:-4}; dtype=${DTYPE:-bfloat16}; up_dtype=${UPSTREAM_DTYPE:-$dtype}
dry=${DRY_RUN:-0}
samples=$((prompts_per_step * images))
t0=$(date +%s); deadline=$((t0 + ${BUDGET:-510}))
model=${MODEL:-$work/model}; preset=${PRESET:-sana-1600m}
[[ -n ${MODEL:-} ]] && preset="(MODEL given)"
[[ $dry == 1 && -z ${MODEL:-} ]] && model=$work/model-dry-tiny  # never mistaken for the real run's model

if [[ ! -f $model/model_index.json ]]; then
  if [[ $dry == 1 ]]; then  # the configs only need the folder's shape, not SANA-1600M's weights
    cosmos-sana make-tiny --out "$model" --preset tiny --device cpu >"$out/make_tiny.log" 2>&1 || exit 1
  else
    cosmos-sana make-tiny --out "$model" --preset "${PRESET:-sana-1600m}" --device cuda --dtype bfloat16 \
      >"$out/make_tiny.log" 2>&1 || { echo "make-tiny failed: $out/make_tiny.log" >&2; exit 1; }
  fi
fi
if [[ -n ${MODEL_SAMPLE_SIZE:-} ]]; then  # the same weights as another size class (files linked, config edited)
  variant=$work/model-sample-size-$MODEL_SAMPLE_SIZE
  rm -rf "$variant" && cp -rs "$(cd -- "$model" && pwd)" "$variant" && rm "$variant/transformer/config.json" &&
    python - "$model/transformer/config.json" "$variant/transformer/config.json" "$MODEL_SAMPLE_SIZE" <<'PY' || exit 1
import json, sys
config = json.load(open(sys.argv[1]))
assert config.get("interpolation_scale") is None, "a positional embedding would depend on sample_size"
json.dump({**config, "sample_size": int(sys.argv[3])}, open(sys.argv[2], "w"), indent=2)
PY
  model=$variant
fi
echo "model ready at $(($(date +%s) - t0)) s: $model"

# the prompts: upstream's dataset script reads $COSMOS_CACHE_DIR/diffusion_nft/pickscore/{train,test}.txt
cache=$work/cache
mkdir -p "$cache/diffusion_nft/pickscore"
for split in train test; do
  cp plugins/cosmos_sana_plugins/datasets/prompts/demo.txt "$cache/diffusion_nft/pickscore/$split.txt"
done
prompts=$cache/diffusion_nft/pickscore/train.txt

reward_port=8090
up_dir=$work/upstream; ours_root=$work/ours
mkdir -p "$up_dir"
cat >"$up_dir/upstream.toml" <<EOF
# upstream's configs/sana/sana-image-nft.toml (cosmos-rl), values changed by scripts/device/upstream_baseline.sh marked "was"
redis = "12811"  # was 12800 (a port of its own)
mode = "colocated"

[policy]
model_name_or_path = "$model"  # was Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers
is_diffusers = true
model_gradient_checkpointing = true

[policy.lora]
lora_names = ["default", "old"]
r = $rank
lora_alpha = $alpha
init_lora_weights = "gaussian"
target_modules = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"]

[policy.diffusers]
dtype = "$up_dtype"  # was float32
is_video = false
offload = false
max_prompt_length = 300
inference_size = [$size, $size]  # was [1024, 1024]
timesteps_fraction = $fraction  # was timestep_fraction = 0.99 (misspelt: dropped, so 1.0)
nft_beta = 1.0
weight_copy_decay_type = 1

[policy.diffusers.sample]
num_steps = $sample_steps  # was 10
eval_num_steps = 40
guidance_scale = 1.0
noise_level = 1
solver = "euler"
deterministic_sampling = true

[rollout]
backend = "diffusion_nft_rollout"
n_generation = $images  # was 24
n_generation_mini_batch = $images  # was unset (all at once)
batch_size = $prompts_per_step  # was unset (1)

[rollout.parallelism]
n_init_replicas = 1
tp_size = 1
dp_shard_size = 1  # was 8
pp_size = 1

[policy.parallelism]
n_init_replicas = 1
tp_size = 1
cp_size = 1
dp_shard_size = 1  # was 8
pp_size = 1
dp_replicate_size = 1

[logging]
logger = ["console"]  # was ["console", "wandb"]
project_name = "cosmos_rl"
experiment_name = "None"
multi_modal_log_interval = 1

[train]
non_text = true
resume = false
epoch = 100000
seed = 42
train_batch_per_replica = $samples  # was 1152 (6 prompts x 24 images x 8 GPUs)
max_num_steps = $steps  # was unset
output_dir = "$up_dir/out"  # was ./outputs/sana-image-nft
epsilon = 1e-8
optm_name = "AdamW"
optm_lr = 3e-4
optm_impl = "foreach"
optm_weight_decay = 1e-4
optm_betas = [0.9, 0.999]
optm_grad_norm_clip = 1.0
optm_warmup_steps = 0
ema_enable = true
ema_decay = 0.9
ema_update_step_interval = 1
async_tp_enabled = false
compile = false

[train.train_policy]
type = "grpo"
trainer_type = "diffusion_nft"
uncentralized_training = true
use_remote_reward = true
dataset.name = "pickscore"
dataset.split = "train"
kl_beta = 0.0001
mini_batch = $mini  # was 9
advantage_high = 5.0
advantage_low = -5.0

[train.train_policy.remote_reward]
scale = 1.0
reward_fns = [{ name = "jpeg_compressibility", weight = 1.0 }]  # was reward_fn = {pickscore = 1.0}, score_key = "pickscore"

[train.ckpt]
enable_checkpoint = false  # was true, save_freq 20
save_mode = "async"

[validation]
enable = false
dataset.name = "pickscore"
dataset.split = "test"
EOF

ours_sets=(
  'redis="12812"' "policy.diffusers.dtype=\"$dtype\"" "policy.diffusers.inference_size=[$size, $size]"
  "policy.diffusers.sample.num_steps=$sample_steps" "policy.diffusers.timesteps_fraction=$fraction"
  "policy.lora.r=$rank" "policy.lora.lora_alpha=$alpha"
  "rollout.n_generation=$images" "rollout.n_generation_mini_batch=$images" "rollout.batch_size=$prompts_per_step"
  "train.train_batch_per_replica=$samples" "train.train_policy.mini_batch=$mini" "train.max_num_steps=$steps"
  "train.ckpt.enable_checkpoint=false" "train.ckpt.export_safetensors=false" 'logging.logger=["console"]'
  'custom.rewards=[{name="jpeg_compressibility"}]'
)
ours_env=(NPROC_PER_NODE=1 MASTER_PORT=8020 RDZV_PORT=29420 DATASET_PATH="$prompts" BASE_CHECKPOINT_PATH="$model"
  OUTPUT_ROOT="$ours_root")

# what upstream's rollout samples at: SanaModel.pipeline_with_logprob bins the requested size by the
# transformer's sample_size (128/64/32/16 → the 4096/2048/1024/512 aspect-ratio tables) and resizes
# the decoded images back to the requested size
sampled_size() {
  python - "$model/transformer/config.json" "$size" <<'PY'
import json, sys
from diffusers.image_processor import PixArtImageProcessor
from diffusers.pipelines.sana import pipeline_sana as sana
sample_size, size = json.load(open(sys.argv[1]))["sample_size"], int(sys.argv[2])
tables = {128: sana.ASPECT_RATIO_4096_BIN, 64: sana.ASPECT_RATIO_2048_BIN, 32: sana.ASPECT_RATIO_1024_BIN,
          16: sana.ASPECT_RATIO_512_BIN}
height, width = PixArtImageProcessor.classify_height_width_bin(size, size, ratios=tables[sample_size])
print(f"{height}x{width}")
PY
}

if [[ $dry == 1 ]]; then
  status=0
  python - "$up_dir/upstream.toml" <<'PY' || status=1
import sys, toml
from cosmos_rl.policy.config import Config
config = Config.from_dict(toml.load(sys.argv[1]))
d, t = config.policy.diffusers, config.train
fns = [(f.name, f.weight, f.score_key) for f in t.train_policy.remote_reward.reward_fns]
print(f"upstream config OK: {d.inference_size} {d.dtype} sample {d.sample.num_steps} steps, "
      f"trains {int(d.sample.num_steps * d.timesteps_fraction)} timesteps/sample, lora r{config.policy.lora.r}, "
      f"rollout {config.rollout.batch_size}x{config.rollout.n_generation}, batch {t.train_batch_per_replica}, "
      f"mini {t.train_policy.mini_batch}, steps {t.max_num_steps}, reward_fns {fns}, ckpt {t.ckpt.enable_checkpoint}")
PY
  env "${ours_env[@]}" bash launchers/launch_rl_sana-image-nft.sh --dryrun -- "${ours_sets[@]}" || status=1
  echo "upstream samples at: $(sampled_size) (requested ${size}x$size)" || status=1
  exit "$status"
fi

# ---------------------------------------------------------------- launches
# Each launch leaves WORK/<side>.launch ("START STATUS"): the report covers every side launched with this
# WORK, so on a machine still warm SIDES=upstream and then SIDES=ours in two calls (same settings) give one JSON too.
launch() {  # $1 = side; rest = command. Runs it under min(TIMEOUT, what BUDGET leaves) with GPU memory sampled.
  local side=$1; shift
  local left=$((deadline - $(date +%s) - 40)) limit=$timeout_s start status=0
  ((left < limit)) && limit=$left
  if ((limit < 60)); then
    echo "$side: skipped, $left s of BUDGET left"; echo "$(date +%s) -1" >"$work/$side.launch"; return
  fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -l 1 >"$work/gpu-memory-$side.csv" 2>/dev/null &
  local sampler=$!
  start=$(date +%s.%N)
  timeout -k 30 -s INT "$limit" "$@" >"$out/$side.log" 2>&1 || status=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  echo "$start $status" >"$work/$side.launch"
  echo "$side: exit $status after $(($(date +%s) - ${start%.*})) s (limit $limit s)"
  local used
  for _ in $(seq 30); do  # the next launch starts on an empty GPU (a container may not list the processes)
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null || echo 0)
    [[ -z $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null) ]] && ((${used%%.*} < 2048)) && break
    sleep 1
  done
}

report() {  # $OUT/upstream_baseline.json from the controller logs of every side launched with this WORK
  local runs=() metrics=() side root log start status ours_metrics settings
  for side in upstream ours; do
    [[ -f $work/$side.launch ]] || continue
    read -r start status <"$work/$side.launch"
    root=$up_dir/logs; [[ $side == ours ]] && root=$ours_root
    log=$(find "$root" -name controller.log 2>/dev/null | sort | tail -n 1)  # logs_<timestamp>/: the latest
    runs+=(--run "$side:$start:$status:${log:-$root/controller.log}:$work/gpu-memory-$side.csv")
    mkdir -p "$out/logs-$side"
    find "$root" \( -name "*.log" -o -name "*.toml" -o -name metrics.jsonl \) -exec cp {} "$out/logs-$side/" \; 2>/dev/null
    cp "$work/gpu-memory-$side.csv" "$out/" 2>/dev/null
  done
  ((${#runs[@]})) || return 0
  ours_metrics=$(find "$ours_root" -name metrics.jsonl 2>/dev/null | head -n 1)
  [[ -n $ours_metrics && -f $work/ours.launch ]] && metrics+=(--metrics "ours:$ours_metrics")
  settings=$(python - "$work/upstream-sampled-size.txt" <<PY
import json, pathlib, sys
sampled = pathlib.Path(sys.argv[1])
print(json.dumps({"preset": "$preset", "model": "$model", "size": $size,
    "upstream_sampled_size": sampled.read_text().strip() if sampled.is_file() else None,
    "prompts_per_step": $prompts_per_step, "images_per_prompt": $images, "mini_batch": $mini,
    "sample_steps": $sample_steps, "timesteps_fraction": $fraction, "trained_timesteps": max(1, int($sample_steps * $fraction)),
    "lora_rank": $rank, "lora_alpha": $alpha, "dtype": "$dtype", "upstream_dtype": "$up_dtype", "reward": "jpeg_compressibility",
    "model_sample_size": json.load(open("$model/transformer/config.json"))["sample_size"],
    "timeout_s": $timeout_s, "gpus": 1}))
PY
  )
  python bench/upstream_baseline_report.py --samples-per-step "$samples" --steps "$steps" "${runs[@]}" \
    "${metrics[@]}" --settings "$settings" --json-out "$out/upstream_baseline.json" >/dev/null
}

sides=" ${SIDES:-upstream ours} "
if [[ $sides == *" upstream "* ]]; then
  rm -rf "$up_dir/logs" "$up_dir/out" "$work/upstream.launch"
  REMOTE_REWARD_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')
  export REMOTE_REWARD_TOKEN  # read by the server and by upstream's client; never printed
  python scripts/device/hold_pull_reward_server.py --reward jpeg_compressibility --port "$reward_port" \
    >"$out/reward_server.log" 2>&1 &
  server=$!
  sampled_size >"$work/upstream-sampled-size.txt" 2>>"$out/reward_server.log"
  healthy=0
  for _ in $(seq 120); do
    python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$reward_port/health', timeout=1)" 2>/dev/null &&
      { healthy=1; break; }
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
  done
  echo "reward server healthy=$healthy at $(($(date +%s) - t0)) s;" \
    "upstream samples at $(cat "$work/upstream-sampled-size.txt") (requested ${size}x$size)"
  if ((!healthy)); then  # cosmos-rl's client would retry its enqueue for many minutes
    echo "upstream: skipped, the reward server did not answer (see $out/reward_server.log)"
    echo "$(date +%s) -2" >"$work/upstream.launch"
  else
    launch upstream env -u COSMOS_SANA_AUTOLOAD -u COSMOS_SANA_FAST_STARTUP COSMOS_SANA_NO_AUTOLOAD=1 \
      COSMOS_CACHE_DIR="$cache" REMOTE_REWARD_ENQUEUE_URL="http://127.0.0.1:$reward_port/api/reward/enqueue" \
      REMOTE_REWARD_FETCH_URL="http://127.0.0.1:$reward_port/api/reward/pull" \
      python3 -m cosmos_rl.launcher.launch_all --config "$up_dir/upstream.toml" --port 8010 --rdzv-port 29410 \
      --log-dir "$up_dir/logs" cosmos_rl.tools.dataset.diffusion_nft
  fi
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
  unset REMOTE_REWARD_TOKEN
  report  # now too, so a device call stopped during the next launch still returns this one's numbers
fi
if [[ $sides == *" ours "* ]]; then
  rm -rf "$ours_root" "$work/ours.launch"  # a reused WORK must not leave an older run's logs
  launch ours env "${ours_env[@]}" bash launchers/launch_rl_sana-image-nft.sh -- "${ours_sets[@]}"
fi
report
cat "$out/upstream_baseline.json" 2>/dev/null
echo "total $(($(date +%s) - t0)) s; JSON: $out/upstream_baseline.json"
