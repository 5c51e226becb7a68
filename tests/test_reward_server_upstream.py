"""cosmos-rl's own ``RemoteRewardCalculator`` (with our defect-7 patch) against our reward server on loopback."""

from __future__ import annotations

import time
from queue import Queue

import pytest
import requests
import torch

from cosmos_sana.compat.cosmos_rl import patch_remote_reward_not_ready
from cosmos_sana.config import RewardRef
from cosmos_sana.rewards.scheduler import RewardScheduler
from cosmos_sana.rewards.scorers import ScorerSet
from cosmos_sana.rewards.server import ENQUEUE_PATH, PULL_PATH, create_app

TOKEN = "upstream-test-token"


@pytest.fixture
def upstream_calculator(serve_app, recording_scorers, monkeypatch, tmp_path):
    from cosmos_rl.policy.config import Config
    from cosmos_rl.reward.remote_calculator import RemoteRewardCalculator

    scorers, registry = recording_scorers
    sched = RewardScheduler(ScorerSet.build([RewardRef(name="mean"), RewardRef(name="gated")], registry))
    base = serve_app(create_app(sched, TOKEN))
    monkeypatch.setenv("REMOTE_REWARD_ENQUEUE_URL", base + ENQUEUE_PATH)
    monkeypatch.setenv("REMOTE_REWARD_FETCH_URL", base + PULL_PATH)
    monkeypatch.setenv("REMOTE_REWARD_TOKEN", TOKEN)
    config = Config.from_dict({
        "train": {"output_dir": str(tmp_path), "train_policy": {
            "type": "grpo", "use_remote_reward": True,
            "remote_reward": {"scale": 0.5, "reward_fns": [
                {"name": "mean", "weight": 2.0}, {"name": "gated", "weight": 0.25, "clip_max": 1.0}]},
        }},
        "policy": {"model_name_or_path": "unused"},
    })
    monkeypatch.setattr(RemoteRewardCalculator, "get_results", RemoteRewardCalculator.get_results)  # undo after
    patch_remote_reward_not_ready()
    calculator = RemoteRewardCalculator()  # a fresh instance, not upstream's singleton
    calculator.setup(config)
    return calculator, scorers


def test_upstream_client_gets_scores_and_sees_not_ready_as_http_400(upstream_calculator):
    from cosmos_rl.dispatcher.data.schema import RLPayload

    calculator, scorers = upstream_calculator
    levels = [[51, 102], [153, 204]]  # two prompts × two completions, constant images level/255
    payloads = [
        RLPayload(prompt={"prompt": f"prompt {i}"}, prompt_idx=i, extra_info={"modality": "image"},
                  completions=torch.stack([torch.full((3, 8, 8), v / 255) for v in group]))
        for i, group in enumerate(levels)
    ]
    uuid = calculator.compute_rewards(payloads, is_validation=False, step=3)

    with pytest.raises(requests.HTTPError, match="400"):
        calculator.fetch_reward(uuid, is_validation=False)
    queue: Queue = Queue()
    queue.put(uuid)
    # upstream's get_results raises IndexError on a not-ready head of queue; with our compat patch it means
    # "nothing ready yet"
    assert calculator.get_results(queue) == (None, False, -1) and list(queue.queue) == [uuid]

    scorers.gate.set()
    for _ in range(500):  # bounded wait for the server to finish scoring
        try:
            calculator.fetch_reward(uuid, is_validation=False)
            break
        except requests.HTTPError:
            time.sleep(0.01)
    results, is_validation, step = calculator.get_results(queue)
    assert (is_validation, step, queue.empty()) == (False, 3, True)
    # total = clamp(Σ clamp(score)·weight) · scale = (2·level/255 + 0.25·min(2, 1)) · 0.5
    for payload, group in zip(results, levels):
        assert payload.rewards == pytest.approx([(2 * v / 255 + 0.25) * 0.5 for v in group], abs=1e-6)
        assert payload.advantages[0] < 0 < payload.advantages[1]
