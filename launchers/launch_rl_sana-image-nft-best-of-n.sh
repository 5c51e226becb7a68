#!/usr/bin/env bash
# Diffusion-NFT of SANA-1.5 1.6B with Sol-RL best-of-n rollouts (FP8 preview drafts), colocated rollout (recipe toml/sana-image-nft-best-of-n.toml).
#
#   launchers/launch_rl_sana-image-nft-best-of-n.sh [--dry-run | --dryrun] [-- key.path=value ...]
#
# Exported variables override the defaults below; see launchers/_sft_launcher_common.sh for all of them.
RECIPE=sana-image-nft-best-of-n
MODALITY=image
LAUNCH_KIND=rl
: "${DATASET_PATH:=./data/prompts/pickscore/train.txt}"
: "${BASE_CHECKPOINT_PATH:=./checkpoints/SANA1.5_1.6B_1024px_diffusers}"
: "${NPROC_PER_NODE:=8}"

# shellcheck source-path=SCRIPTDIR source=_sft_launcher_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_sft_launcher_common.sh" "$@"
