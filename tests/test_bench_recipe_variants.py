"""The benches' ``recipe`` variants run exactly what toml/sana-image-nft.toml ships, so a change to the
recipe's speed table or its gradient checkpointing changes what they measure."""

import importlib
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_recipe_variants_follow_the_shipped_recipe():
    recipe = tomllib.loads((ROOT / "toml" / "sana-image-nft.toml").read_text())
    speed = recipe["custom"]["rollout"]["speed"]
    assert _bench("bench_rollout").VARIANTS["recipe"] == speed
    nft = _bench("bench_nft_step")
    assert nft.VARIANTS["recipe"] == speed
    assert nft.RECIPE_CHECKPOINTING is recipe["policy"]["model_gradient_checkpointing"] is True


def test_recipe_settings_reads_another_recipe(tmp_path):
    benchlib = _bench("benchlib")
    path = tmp_path / "r.toml"
    path.write_text('[policy]\nmodel_gradient_checkpointing = false\n[custom.rollout.speed]\ncompile_blocks = true\n')
    assert benchlib.recipe_settings(path) == ({"compile_blocks": True}, False)
    path.write_text("[policy]\n")
    assert benchlib.recipe_settings(path) == ({}, False)
