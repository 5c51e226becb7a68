#!/usr/bin/env bash
# Device: is `cosmos-sana run RECIPE --local` resume exact on a GPU? Run a: STEPS steps; run b: the same,
# SIGKILLed once checkpoint KILL_AFTER is COMPLETE, then resumed (train.resume=true). Compares the last
# checkpoints with scripts/compare_checkpoints.py and the metrics of the steps after KILL_AFTER.
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && RECIPE=... bash scripts/device/run_local_resume_exact.sh [--set k=v ...]
# Env: RECIPE (toml/tiny/sana-image-nft.toml), MODEL (a pipeline folder; built with PRESET, default sana-600m),
#      STEPS (6), KILL_AFTER (3), WORK (/tmp/local-resume).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
recipe=${RECIPE:-toml/tiny/sana-image-nft.toml}; steps=${STEPS:-6}; kill_after=${KILL_AFTER:-3}
work=${WORK:-/tmp/local-resume}/$(basename "$recipe" .toml); out=${OUT:-$work}; mkdir -p "$work" "$out"
model=${MODEL:-$work/model}
[[ -f $model/model_index.json ]] ||
  cosmos-sana make-tiny --out "$model" --preset "${PRESET:-sana-600m}" --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1
sets=(--set "policy.model_name_or_path=\"$model\"" --set "train.max_num_steps=$steps" --set "train.ckpt.save_freq=$kill_after"
      --set "train.ckpt.max_keep=-1" --set "custom.logging.progress_bar=false" "$@")
run() { exec cosmos-sana run "$recipe" --local "${sets[@]}" --set "train.output_dir=\"$work/$1\"" "${@:2}"; }
rm -rf "$work/a" "$work/b"
(run a >"$out/a.log" 2>&1); echo "a: exit $?"
run b >"$out/b1.log" 2>&1 & pid=$!  # exec: $! is the training process itself
marker=$(printf 'checkpoints/iter_%09d/COMPLETE' "$kill_after")
while kill -0 "$pid" 2>/dev/null && ! compgen -G "$work/b/*/$marker" >/dev/null; do sleep 0.05; done
kill -KILL "$pid" 2>/dev/null; wait "$pid"; echo "b: killed, checkpoints: $(ls "$work"/b/*/checkpoints/ | tr '\n' ' ')"
sleep 1.1
(run b --set train.resume=true >"$out/b2.log" 2>&1); echo "b resumed: exit $?"
grep -q "resumed at step $kill_after of" "$out/b2.log" || { echo "b did not resume from checkpoint $kill_after" >&2; exit 1; }
python scripts/compare_checkpoints.py "$work/a" "$work/b" >"$out/compare.json"; echo "compare: exit $?"
python - "$work" "$kill_after" "$out/compare.json" <<'PY'
import glob, json, sys
work, kill_after, compare = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3]))
def rows(run):
    found = {}
    for path in sorted(glob.glob(f"{work}/{run}/*/logs/metrics.jsonl")):
        for line in open(path):
            r = json.loads(line)
            found[r["step"]] = {k: v for k, v in r.items() if k != "wall_time" and not k.startswith("time/") and k != "train/iteration_time" and not k.startswith("memory/")}
    return found
a, b = rows("a"), rows("b")
later = [s for s in sorted(a) if s > kill_after]
print(json.dumps({"bit_identical": compare["bit_identical"],
                  "groups": {k: (v["differing"], v["max_abs_diff"]) for k, v in compare["groups"].items()},
                  "metrics_equal_after_kill": {s: a[s] == b.get(s) for s in later},
                  "metric_diffs": {s: {k: (a[s][k], b[s].get(k)) for k in a[s] if a[s][k] != b[s].get(k)} for s in later}}, indent=1))
PY
