#!/usr/bin/env bash
# full-parameter SFT of SANA-1.5 1.6B on image/caption pairs (recipe toml/sana-image-sft.toml).
#
#   launchers/launch_sft_sana-image-sft.sh [--dry-run] [-- key.path=value ...]
#
# Exported variables override the defaults below; see launchers/_sft_launcher_common.sh for all of them.
RECIPE=sana-image-sft
MODALITY=image
: "${DATASET_PATH:=./data/sft/images}"
: "${BASE_CHECKPOINT_PATH:=./checkpoints/SANA1.5_1.6B_1024px_diffusers}"
: "${NPROC_PER_NODE:=8}"

# shellcheck source-path=SCRIPTDIR source=_sft_launcher_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_sft_launcher_common.sh" "$@"
