"""``cosmos-sana validate`` (each launcher runs it before every launch): a recipe's key and value
errors are reported before the imports of cosmos-rl's policy-worker start-up check (torch,
transformers, diffusers, every upstream trainer), and that check still runs for every recipe that
passes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cosmos_sana.compat import autoload
from cosmos_sana.compat.cosmos_rl import package_bodies_deferred

RECIPE = Path(__file__).resolve().parents[1] / "toml" / "sana-image-nft.toml"

#: runs the command in a fresh interpreter, then reports which heavy modules it had imported
PROBE = """
import json, sys
from cosmos_sana.cli import main
status = main(sys.argv[1:])
heavy = ("torch", "cosmos_rl.policy.trainer", "cosmos_rl.policy.worker.base")
print(json.dumps({"status": status, "imported": [m for m in heavy if m in sys.modules]}))
"""


def validate(*args: str) -> tuple[dict, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_")}
    out = subprocess.run([sys.executable, "-c", PROBE, "validate", *args], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    *printed, report = out.stdout.splitlines()
    return json.loads(report), "\n".join(printed), out.stderr


def test_a_wrong_key_is_reported_before_the_start_up_checks_imports() -> None:
    report, stdout, stderr = validate(str(RECIPE), "--no-path-check", "--set", "train.epcoh=2")
    assert report == {"status": 1, "imported": []}
    assert "train.epcoh: unknown key; cosmos-rl would silently ignore it (did you mean 'epoch'?)" in stderr
    assert stdout == ""


def test_a_recipe_past_the_key_checks_still_gets_the_workers_start_up_check() -> None:
    """-v shows other packages' messages, but the model auto-discovery's prints (now made during the
    start-up check instead of at cosmos-rl's first import) stay off stdout, where the results go."""
    report, stdout, stderr = validate("-v", str(RECIPE), "--no-path-check", "--set", "train.train_policy.mini_batch=7")
    assert report == {"status": 1, "imported": ["torch", "cosmos_rl.policy.trainer", "cosmos_rl.policy.worker.base"]}
    assert "cosmos-rl's policy worker would refuse this config" in stderr
    assert "divisible by data-parallel size(8) * mini_batch(7)" in stderr
    assert stdout == ""


def test_the_deferral_leaves_the_import_system_as_it_found_it() -> None:
    before = list(sys.meta_path)
    with package_bodies_deferred():
        assert isinstance(sys.meta_path[0], autoload.DeferredPackageFinder)
    assert sys.meta_path == before
    already = autoload.DeferredPackageFinder()  # a launch-only process that defers them for good
    sys.meta_path.insert(0, already)
    try:
        with package_bodies_deferred():
            assert [f for f in sys.meta_path if isinstance(f, autoload.DeferredPackageFinder)] == [already]
        assert sys.meta_path[0] is already
    finally:
        sys.meta_path.remove(already)
