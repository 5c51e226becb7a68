"""Advantages on two data-parallel ranks (gloo on CPU, cosmos-rl's own device mesh) equal the
single-process computation on the whole batch: per-prompt groups split across the ranks stay
whole and the global std covers both ranks' rewards, as flow_grpo and DiffusionNFT gather
rewards from every GPU before normalising."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reference_formulas import ref_per_prompt_advantages
from test_trainer_fsdp import run_two_ranks

from cosmos_sana_plugins.trainers import losses

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_single_thread")]

# prompt 1's samples sit on both ranks; rank 0 holds 7 samples, rank 1 holds 5
REWARDS = [0.1, 0.9, 0.4, 0.7, 2.0, 3.5, 2.5, 3.0, -1.0, -1.0, 6.0, 5.0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3]
SPLIT = 7

WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist

    sys.path.insert(0, sys.argv[3])
    from cosmos_rl.utils.parallelism import ParallelDims
    from fixtures_trainers import recipe
    from test_advantages_two_ranks import GROUPS, REWARDS, SPLIT
    from test_reference_formulas import StandInModel, advantage_batch, stand_in_trainer
    from cosmos_sana_plugins.trainers.grpo import SanaFlowGRPOTrainer

    out = sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rows = slice(0, SPLIT) if rank == 0 else slice(SPLIT, None)
    result = {}
    for global_std in (False, True):
        config = recipe("sana-image-grpo", out, out, {
            "policy.parallelism.dp_shard_size": 2, "policy.diffusers.sample.global_std": global_std,
            "train.train_policy.advantage_low": -100.0, "train.train_policy.advantage_high": 100.0,
        })
        dims = ParallelDims.from_config(config.policy.parallelism)
        dims.build_mesh(device_type="cpu")  # cosmos-rl's workers build it on CUDA
        trainer = stand_in_trainer(SanaFlowGRPOTrainer, config, StandInModel())
        trainer.parallel_dims = dims
        result[global_std] = trainer.step_advantages(advantage_batch(REWARDS[rows], GROUPS[rows]))
    torch.save(result, f"{out}/rank{rank}.pt")
    dist.barrier()  # tear down together: a rank leaving early aborts the other in gloo
    dist.destroy_process_group()
    """
)


def test_two_ranks_normalise_over_the_whole_batch(tmp_path: Path) -> None:
    run_two_ranks(WORKER, tmp_path, tmp_path)

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    rewards, groups = torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS)
    for global_std in (False, True):
        gathered = torch.cat([ranks[0][global_std], ranks[1][global_std]]).double()
        assert gathered.shape == (len(REWARDS),)
        single = losses.group_advantages(rewards, groups, global_std=global_std).double()
        torch.testing.assert_close(gathered, single, rtol=0, atol=1e-6)
        reference = ref_per_prompt_advantages([str(g) for g in GROUPS], REWARDS, global_std)
        torch.testing.assert_close(gathered, torch.from_numpy(reference), rtol=0, atol=1e-6)
        # each rank normalising alone would give other numbers (prompt 1 split, a rank's own std)
        alone = torch.cat([
            losses.group_advantages(rewards[:SPLIT], groups[:SPLIT], global_std=global_std),
            losses.group_advantages(rewards[SPLIT:], groups[SPLIT:], global_std=global_std),
        ]).double()
        assert not np.allclose(alone.numpy(), single.numpy(), atol=1e-3)
