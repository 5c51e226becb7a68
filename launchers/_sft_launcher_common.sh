# shellcheck shell=bash
# Shared body of launchers/launch_sft_<recipe>.sh (and launch_rl_<recipe>.sh); sourced, never run.
#
# The recipe launcher sets RECIPE (toml/<RECIPE>.toml), MODALITY (image|video), LAUNCH_KIND (sft|rl,
# default sft) and its defaults with ': "${VAR:=default}"' (so exported values win), then sources
# this file with "$@".
#
# Usage of every launcher:
#   launchers/launch_{sft,rl}_<recipe>.sh [--dry-run | --dryrun] [-- key.path=value ...]
#
# Environment (exported values override the defaults):
#   DATASET_PATH            training data (folder, .jsonl, .zip; RL prompts may be builtin:NAME) -> DATASET_KEY
#   REAL_DATA_PATH          recipes with [custom.real_data] (DDRL) only: real images -> custom.real_data.args.path
#   VAL_DATASET_PATH        optional: validation data (used when the recipe's [validation] enable = true)
#                                                                                -> custom.val_data.args.path
#   BASE_CHECKPOINT_PATH    diffusers pipeline folder (model_index.json)         -> policy.model_name_or_path
#   INIT_DCP_PATH           optional: `cosmos-sana convert-to-dcp` output        -> custom.checkpoint.init_from
#   NATIVE_CHECKPOINT_PATH  optional: native SANA transformer (.pth, hf://...)   -> custom.model.native_checkpoint
#   WAN_VAE_PATH            required with a native SANA-Video checkpoint: the Wan2.1 VAE folder
#   OUTPUT_ROOT             run outputs (default ./outputs/train, relative to the current directory)
#   NPROC_PER_NODE (8), NNODES (1), NODE_RANK (0), MASTER_ADDR, MASTER_PORT (8000, cosmos-rl controller),
#   RDZV_PORT (29345), NODE_IP_LIST ("ip0;ip1;..." for NNODES > 1)
#   TOML_FILE, DATASET_KEY  the recipe (default toml/<RECIPE>.toml) and the key DATASET_PATH goes to
#   DRY_RUN=1               validate and write the resolved config only (same as --dry-run; --dryrun is
#                           cosmos-framework's spelling of it)
#   COSMOS_SANA_FAST_STARTUP  unset or 1: cosmos-sana's start-up patches (the default, README "Fast start-up");
#                           the policy-worker start-up check then runs in the controller instead of before
#                           the launch. 0: cosmos-rl's own start-up and shutdown. Any other value is refused.
#   COSMOS_SANA, COSMOS_RL  commands to run (default: cosmos-sana, cosmos-rl on PATH)

set -euo pipefail

LAUNCHER_NAME=$(basename -- "$0")
REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

die() {
  echo "$LAUNCHER_NAME: error: $*" >&2
  exit 2
}

usage() {
  sed -n '/^# Usage of every launcher:/,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# Exception lines that follow a stop rather than cause one: asyncio tasks cancelled at shutdown,
# Ctrl-C, torch elastic relaying SIGINT/SIGTERM to its workers ("death signal", SignalException),
# and replicas that lose the controller while unregistering (connection reset/refused/aborted).
SHUTDOWN_NOISE='CancelledError|KeyboardInterrupt|death signal|SignalException|got signal|SIGINT|SIGTERM|SIGKILL|unregister|Connection(Reset|Refused|Aborted)Error|BrokenPipeError'

# The first exception line of FILE from line FROM on that is not shutdown noise, as "N: LINE"
# (N counted from FROM); with NOISE=1, the first shutdown-noise exception line instead.
first_exception() {
  local file=$1 from=$2 noise=${3:-0}
  local pattern='^[0-9]+:(\[[^]]*\]:?[[:space:]]*)*([A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(Error|Exception|Interrupt)(:.*)?$'
  local keep=(-v)
  ((noise)) && keep=()
  tail -n "+$from" "$file" | grep -n '' | grep -E "$pattern" | grep "${keep[@]}" -m1 -E "$SHUTDOWN_NOISE" || true
}

# For each "FILE:FROM" given, the first real exception line from line FROM on, on stderr; with
# NOISE=1 only the first shutdown-noise line of all of them. Fails when none was found.
report_errors() {
  local noise=$1 entry file from hit found=1
  shift
  for entry in "$@"; do
    file=${entry%:*} from=${entry##*:}
    hit=$(first_exception "$file" "$from" "$noise")
    [[ -n $hit ]] || continue
    file=$(readlink -f -- "$file") from=$((from - 1 + ${hit%%:*})) hit=${hit#*:}
    if ((noise)); then
      echo "$LAUNCHER_NAME: only shutdown messages found, the first in $file:$from: $hit (the process that stopped the others may have been killed without a traceback, e.g. out of memory: see dmesg)" >&2
      return 0
    fi
    echo "$LAUNCHER_NAME: first error in $file:$from: $hit" >&2
    found=0
  done
  return "$found"
}

# Why the launch failed, on stderr. A launch stopped by a signal (a timeout, Ctrl-C, a scheduler's
# kill) says so first, since the errors its processes log while shutting down are symptoms of it.
# Then the first real exception line of each controller/worker log this launch wrote (cosmos-rl's
# --log-dir keeps them in $LOG_DIR/logs_latest/{controller,policy_N,rollout_N}.log): a failed run's
# cause is there, while cosmos-rl itself only reports an exit status. When those logs hold none
# (cosmos-rl stopped before starting them), the lines this launch added to $LOG_FILE are searched.
print_root_cause() {
  local status=$1 dir=$LOG_DIR/logs_latest log logs=()
  local stopped=${STOPPED_BY:-}
  if [[ -z $stopped ]]; then
    case $status in
      124) stopped="a timeout (exit status 124)" ;;
      129 | 130 | 137 | 143) stopped="SIG$(kill -l "$((status - 128))") (exit status $status)" ;;
    esac
  fi
  local sender=""
  case $stopped in
    SIGINT*) sender=" (Ctrl-C)" ;;
    SIGKILL*) sender=" (the kernel's out-of-memory killer, see dmesg, or a scheduler)" ;;
    SIGHUP*) sender=" (a closed terminal)" ;;
    SIG*) sender=" (a timeout or a scheduler)" ;;
  esac
  [[ -n $stopped ]] &&
    echo "$LAUNCHER_NAME: the launch was stopped by $stopped$sender; the shutdown messages it caused are not shown" >&2
  logs=("$dir/controller.log")
  for log in "$dir"/*.log; do
    [[ $log == "$dir/controller.log" ]] || logs+=("$log")
  done
  local workers=() launcher_log="$LOG_FILE:$((LOG_LINES_BEFORE + 1))"
  for log in "${logs[@]}"; do
    if [[ -f $log && $log -nt $RESOLVED_TOML ]]; then # written by this launch
      workers+=("$log:1")
    fi
  done
  if report_errors 0 "${workers[@]}" || report_errors 0 "$launcher_log"; then
    return 0
  fi
  if [[ -z $stopped ]] && { report_errors 1 "${workers[@]}" || report_errors 1 "$launcher_log"; }; then
    return 0
  fi
  if [[ -n $stopped ]]; then
    echo "$LAUNCHER_NAME: no error before the stop in this launch's logs ($dir, $LOG_FILE)" >&2
  else
    echo "$LAUNCHER_NAME: no exception found in this launch's logs ($dir, $LOG_FILE)" >&2
  fi
}

abspath() {
  case $1 in
    /* | hf://* | builtin:*) printf '%s\n' "$1" ;;
    *) printf '%s\n' "$PWD/${1#./}" ;;
  esac
}

# A TOML basic string (quotes and backslashes escaped) for `--set key=VALUE`.
toml_str() {
  local s=${1//\\/\\\\}
  printf '"%s"' "${s//\"/\\\"}"
}

require_int() {
  [[ $2 =~ ^[0-9]+$ ]] || die "$1=$2 is not a non-negative integer"
}

# ---------------------------------------------------------------- arguments
: "${DRY_RUN:=0}"
USER_OVERRIDES=()
while (($# > 0)); do
  case $1 in
    --dry-run | --dryrun) DRY_RUN=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    --)
      shift
      USER_OVERRIDES=("$@")
      break
      ;;
    *) die "unknown argument '$1' (config overrides go after --, e.g. -- train.epoch=2)" ;;
  esac
  shift
done
for override in "${USER_OVERRIDES[@]+"${USER_OVERRIDES[@]}"}"; do
  [[ $override == *=* && ${override%%=*} =~ ^[A-Za-z0-9_.-]+$ ]] ||
    die "override '$override' must look like key.path=value"
done

# ---------------------------------------------------------------- defaults
: "${RECIPE:?the recipe launcher must set RECIPE}"
: "${MODALITY:?the recipe launcher must set MODALITY (image or video)}"
: "${TOML_FILE:=$REPO_ROOT/toml/$RECIPE.toml}"
: "${DATASET_KEY:=custom.data.args.path}"
: "${OUTPUT_ROOT:=./outputs/train}"
: "${NPROC_PER_NODE:=8}"
: "${NNODES:=1}"
: "${NODE_RANK:=0}"
: "${MASTER_PORT:=8000}"
: "${RDZV_PORT:=29345}"
: "${COSMOS_SANA:=cosmos-sana}"
: "${COSMOS_RL:=cosmos-rl}"

for var in NPROC_PER_NODE NNODES NODE_RANK MASTER_PORT RDZV_PORT; do
  require_int "$var" "${!var}"
done
((NPROC_PER_NODE >= 1 && NNODES >= 1)) || die "NPROC_PER_NODE and NNODES must be at least 1"
((NODE_RANK < NNODES)) || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
# the same values cosmos_sana.compat.autoload.fast_startup accepts (empty counts as unset)
case ${COSMOS_SANA_FAST_STARTUP:-} in
  "" | 0 | 1) ;;
  *) die "COSMOS_SANA_FAST_STARTUP=$COSMOS_SANA_FAST_STARTUP: use 0 (cosmos-rl's own start-up and shutdown) or 1 (cosmos-sana's start-up patches, also what unset means)" ;;
esac

TOML_FILE=$(abspath "$TOML_FILE")
DATASET_PATH=$(abspath "${DATASET_PATH:?the recipe launcher must default DATASET_PATH}")
BASE_CHECKPOINT_PATH=$(abspath "${BASE_CHECKPOINT_PATH:?the recipe launcher must default BASE_CHECKPOINT_PATH}")
OUTPUT_ROOT=$(abspath "$OUTPUT_ROOT")
STEM=$(basename -- "$TOML_FILE" .toml)
RUN_DIR=$OUTPUT_ROOT/$STEM
LOG_DIR=$RUN_DIR/logs
LOG_FILE=$LOG_DIR/${STEM}_${LAUNCH_KIND:-sft}.log
RESOLVED_TOML=$RUN_DIR/$STEM.resolved.toml

# ---------------------------------------------------------------- checks
[[ -f $TOML_FILE ]] || die "recipe $TOML_FILE not found (recipes ship in the repository's toml/ folder; set TOML_FILE to use another)"
command -v "$COSMOS_SANA" >/dev/null ||
  die "'$COSMOS_SANA' not on PATH: install the package (pip install -e . in $REPO_ROOT) or activate its environment"
[[ $DATASET_PATH == builtin:* || -e $DATASET_PATH ]] ||
  die "DATASET_PATH=$DATASET_PATH does not exist: export DATASET_PATH=<your data> (layouts: README 'Data'; check it with: $COSMOS_SANA data check $DATASET_PATH)"
[[ -f $BASE_CHECKPOINT_PATH/model_index.json ]] ||
  die "BASE_CHECKPOINT_PATH=$BASE_CHECKPOINT_PATH is not a diffusers pipeline folder (no model_index.json): download the pipeline (huggingface-cli download <repo> --local-dir DIR) or build a tiny one with '$COSMOS_SANA make-tiny --out DIR', then export BASE_CHECKPOINT_PATH=DIR"

CONFIG_SETS=(
  "train.output_dir=$(toml_str "$RUN_DIR")"
  "policy.model_name_or_path=$(toml_str "$BASE_CHECKPOINT_PATH")"
  "$DATASET_KEY=$(toml_str "$DATASET_PATH")"
  "policy.parallelism.dp_shard_size=$((NPROC_PER_NODE * NNODES))"
)
if [[ ${LAUNCH_KIND:-sft} == rl ]]; then  # colocated RL: the rollout shares the policy's GPUs
  CONFIG_SETS+=("rollout.parallelism.dp_shard_size=$((NPROC_PER_NODE * NNODES))")
fi

if [[ -n ${VAL_DATASET_PATH:-} ]]; then
  VAL_DATASET_PATH=$(abspath "$VAL_DATASET_PATH")
  [[ -e $VAL_DATASET_PATH ]] ||
    die "VAL_DATASET_PATH=$VAL_DATASET_PATH does not exist: export VAL_DATASET_PATH=<your validation data> (check it with: $COSMOS_SANA data check $VAL_DATASET_PATH), or pass -- validation.enable=false"
  CONFIG_SETS+=("custom.val_data.args.path=$(toml_str "$VAL_DATASET_PATH")")
fi

if [[ -n ${REAL_DATA_PATH:-} ]] && grep -q '^\[custom\.real_data\]' "$TOML_FILE"; then  # DDRL's data term
  REAL_DATA_PATH=$(abspath "$REAL_DATA_PATH")
  [[ -e $REAL_DATA_PATH ]] ||
    die "REAL_DATA_PATH=$REAL_DATA_PATH does not exist: export REAL_DATA_PATH=<image/caption pairs for DDRL's data term> (layouts: README 'Data'; check it with: $COSMOS_SANA data check $REAL_DATA_PATH)"
  CONFIG_SETS+=("custom.real_data.args.path=$(toml_str "$REAL_DATA_PATH")")
fi

if [[ -n ${INIT_DCP_PATH:-} ]]; then
  INIT_DCP_PATH=$(abspath "$INIT_DCP_PATH")
  [[ -f $INIT_DCP_PATH/model/.metadata ]] ||
    die "INIT_DCP_PATH=$INIT_DCP_PATH has no DCP model/: create it with '$COSMOS_SANA convert-to-dcp $BASE_CHECKPOINT_PATH --out $INIT_DCP_PATH'"
  CONFIG_SETS+=("custom.checkpoint.init_from=$(toml_str "$INIT_DCP_PATH")")
fi

if [[ -n ${NATIVE_CHECKPOINT_PATH:-} ]]; then
  NATIVE_CHECKPOINT_PATH=$(abspath "$NATIVE_CHECKPOINT_PATH")
  [[ $NATIVE_CHECKPOINT_PATH == hf://* || -e $NATIVE_CHECKPOINT_PATH ]] ||
    die "NATIVE_CHECKPOINT_PATH=$NATIVE_CHECKPOINT_PATH does not exist (a local .pth/.safetensors/.index.json, or hf://ORG/REPO/FILE)"
  if [[ $MODALITY == video ]]; then
    [[ -n ${WAN_VAE_PATH:-} ]] ||
      die "a native SANA-Video checkpoint needs the Wan2.1 VAE: export WAN_VAE_PATH=<folder with the AutoencoderKLWan config.json and weights>"
    WAN_VAE_PATH=$(abspath "$WAN_VAE_PATH")
    grep -q '"_class_name": *"AutoencoderKLWan"' "$WAN_VAE_PATH/config.json" 2>/dev/null ||
      die "WAN_VAE_PATH=$WAN_VAE_PATH is not a Wan VAE folder (its config.json must say \"_class_name\": \"AutoencoderKLWan\")"
    grep -q '"AutoencoderKLWan"' "$BASE_CHECKPOINT_PATH/model_index.json" ||
      die "BASE_CHECKPOINT_PATH=$BASE_CHECKPOINT_PATH does not use the Wan VAE; use a SanaVideoPipeline folder whose vae/ is $WAN_VAE_PATH"
  fi
  CONFIG_SETS+=("custom.model.native_checkpoint=$(toml_str "$NATIVE_CHECKPOINT_PATH")")
fi

if ((NNODES > 1)); then
  [[ -n ${MASTER_ADDR:-} ]] || die "NNODES=$NNODES needs MASTER_ADDR (the address of the node running the controller)"
  [[ -n ${NODE_IP_LIST:-} ]] || die "NNODES=$NNODES needs NODE_IP_LIST=\"ip0;ip1;...\" (one address per node, rank order)"
fi

# ---------------------------------------------------------------- resolve and validate
mkdir -p "$LOG_DIR"
SET_ARGS=()
for kv in "${CONFIG_SETS[@]}" "${USER_OVERRIDES[@]+"${USER_OVERRIDES[@]}"}"; do
  SET_ARGS+=(--set "$kv")
done

# With the fast start-up (the default; COSMOS_SANA_FAST_STARTUP=0 switches it off), cosmos-rl's
# policy-worker start-up check (seconds of torch and cosmos-rl imports) runs in the controller, which
# imports them anyway (cosmos_sana/bridge.py); a dry run, which starts no controller, keeps it here.
VALIDATE_ARGS=()
if [[ ${COSMOS_SANA_FAST_STARTUP:-} != 0 && ! $DRY_RUN =~ ^(1|true|yes)$ ]]; then
  VALIDATE_ARGS=(--no-startup-check)
fi

echo "=== $(date '+%Y-%m-%d %H:%M:%S') $LAUNCHER_NAME: recipe $TOML_FILE -> $RESOLVED_TOML" | tee -a "$LOG_FILE"
if ! "$COSMOS_SANA" validate "$TOML_FILE" "${SET_ARGS[@]}" "${VALIDATE_ARGS[@]+"${VALIDATE_ARGS[@]}"}" --dump "$RESOLVED_TOML" 2>&1 | tee -a "$LOG_FILE"; then
  die "the recipe with these settings does not validate (details above and in $LOG_FILE)"
fi

if [[ $DRY_RUN =~ ^(1|true|yes)$ ]]; then
  echo "$LAUNCHER_NAME: dry run: configuration valid, resolved config at $RESOLVED_TOML; not launching" | tee -a "$LOG_FILE"
  exit 0
fi

# ---------------------------------------------------------------- launch
LAUNCH=("$COSMOS_RL" --config "$RESOLVED_TOML" --port "$MASTER_PORT" --rdzv-port "$RDZV_PORT" --log-dir "$LOG_DIR")
if ((NNODES > 1)); then
  LAUNCH+=(--num-workers "$NNODES" --worker-idx "$NODE_RANK" --url "$MASTER_ADDR:$MASTER_PORT" --node-ip-list "$NODE_IP_LIST")
fi
LAUNCH+=(cosmos_sana.bridge) # every role loads the plugins (does not rely on the autoload .pth)
echo "$LAUNCHER_NAME: ${LAUNCH[*]}" | tee -a "$LOG_FILE"
LOG_LINES_BEFORE=$(wc -l <"$LOG_FILE")
# A signal to the launcher (timeout, Ctrl-C) also reaches cosmos-rl in its process group; trapping
# it lets the launcher outlive the trainer's shutdown and report the stop as the cause.
STOPPED_BY=
trap 'STOPPED_BY=SIGINT' INT
trap 'STOPPED_BY=SIGTERM' TERM
set +e
"${LAUNCH[@]}" 2>&1 | tee -a "$LOG_FILE"
STATUS=${PIPESTATUS[0]}
set -e
trap - INT TERM
((STATUS == 0)) || print_root_cause "$STATUS"
echo "$LAUNCHER_NAME: trainer exited with status $STATUS (log: $LOG_FILE)" >&2
exit "$STATUS"
