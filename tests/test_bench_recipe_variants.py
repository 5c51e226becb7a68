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
    assert nft.RECIPE_CHECKPOINTING is recipe["policy"]["model_gradient_checkpointing"]


def test_recipe_settings_reads_another_recipe(tmp_path):
    benchlib = _bench("benchlib")
    path = tmp_path / "r.toml"
    path.write_text('[policy]\nmodel_gradient_checkpointing = false\n[custom.rollout.speed]\ncompile_blocks = true\n')
    assert benchlib.recipe_settings(path) == ({"compile_blocks": True}, False)
    path.write_text("[policy]\n")
    assert benchlib.recipe_settings(path) == ({}, False)


def test_nft_bench_trains_with_the_shipped_optimizer_and_counts_no_recompute(tmp_path):
    """The NFT bench's trainer takes toml/sana-image-nft.toml's optimizer (the tiny recipe's 1e-2 drove the
    repeated 1600M step to non-finite gradients), and its FLOPs count is the same with gradient
    checkpointing on or off (the recomputed forward is not useful work), leaving the setting as it was."""
    import argparse

    import torch

    nft = _bench("bench_nft_step")
    recipe = tomllib.loads((ROOT / "toml" / "sana-image-nft.toml").read_text())
    args = argparse.Namespace(dtype="float32", size=32, batch=4, lora_rank=4, timesteps=1, max_prompt_length=16,
                              device="cpu")
    folder = nft.ensure_pipeline(None, "tiny", torch.device("cpu"), torch.float32, tmp_path)
    trainer = nft.build_trainer(folder, tmp_path / "out", args)
    assert trainer.config.train.optm_lr == recipe["train"]["optm_lr"] == 3e-4
    assert trainer.config.policy.parallelism.dp_shard_size == 1
    upstream = nft.UpstreamNFT(trainer, nft.make_rollouts(trainer, 4, 32), 1)
    transformer = trainer.model.transformer
    counts = {}
    for checkpointing in (True, False):
        if checkpointing:
            transformer.enable_gradient_checkpointing()
        else:
            transformer.disable_gradient_checkpointing()
        counts[checkpointing] = upstream.iteration_flops()
        assert transformer.is_gradient_checkpointing is checkpointing
    assert counts[True] == counts[False] > 0
