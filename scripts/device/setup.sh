#!/usr/bin/env bash
# Device step 1: install the carried .wheelhouse into /tmp/site and print versions; fails fast.
#   bash scripts/device/setup.sh && . /tmp/site/env.sh && <your command>
# Env: WHEELHOUSE (default .wheelhouse), SITE (default /tmp/site). Writes $OUT/ldconfig.txt
# (the node's libraries, for `cosmos-sana wheelhouse --system-libs`) when OUT is set.
set -euo pipefail
cd -- "$(dirname -- "$0")/../.."
SITE=${SITE:-/tmp/site}
CHECK_IMPORTS="diffusers cosmos_sana" bash launchers/install_offline.sh "${WHEELHOUSE:-.wheelhouse}" "$SITE"
# shellcheck source=/dev/null
. "$SITE/env.sh"
if [[ -n "${OUT:-}" ]]; then ldconfig -p >"$OUT/ldconfig.txt" || true; fi
python - "$SITE" <<'PY'
import importlib.metadata as md, platform, sys
import torch, transformers, diffusers, cosmos_rl  # noqa: F401  (fail fast)
assert transformers.__file__.startswith(sys.argv[1]), f"transformers from {transformers.__file__}, not SITE"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU"
print(f"python {platform.python_version()} | torch {torch.__version__} cuda {torch.version.cuda} ({gpu})")
print(" | ".join(f"{n} {md.version(n)}" for n in ("cosmos-rl", "diffusers", "transformers", "huggingface-hub", "cosmos-sana")))
PY
