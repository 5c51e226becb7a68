"""DDRL's real-data order resumes on every rank: each rank shuffles with its own seed
(``train.seed`` + rank), and a checkpoint written by two gloo ranks (real DCP) continues both
orders exactly. DCP keeps one copy of a plain value that several ranks save under one key, so a
stored seed would come back as rank 0's on rank 1."""

from __future__ import annotations

import json

WORKER = """
import json, sys
import torch.distributed as dist
from cosmos_sana.checkpoint import load_checkpoint, save_checkpoint
from cosmos_sana_plugins.trainers.ddrl import RealBatches

dist.init_process_group("gloo")
rank = dist.get_rank()
dataset = [f"item{i}" for i in range(5)]
straight = RealBatches(dataset, 2, seed=4 + rank)
expected = [next(straight) for _ in range(7)]
interrupted = RealBatches(dataset, 2, seed=4 + rank)
[next(interrupted) for _ in range(4)]
path = save_checkpoint(sys.argv[1], 4, {"real_data": interrupted})
resumed = RealBatches(dataset, 2, seed=4 + rank)
load_checkpoint(path, {"real_data": resumed})
got = [next(resumed) for _ in range(3)]
json.dump({"expected": expected[4:], "got": got, "first": expected[:3]}, open(f"{sys.argv[1]}/rank{rank}.json", "w"))
dist.barrier()  # tear down together: a rank leaving early aborts the other in gloo
dist.destroy_process_group()
"""


def test_two_ranks_resume_their_own_real_data_orders(tmp_path):
    from fixtures_ranks import run_two_ranks

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run_two_ranks(script, tmp_path, timeout=300)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["first"] != ranks[1]["first"]  # the ranks' orders differ
    for got in ranks:
        assert got["got"] == got["expected"]
