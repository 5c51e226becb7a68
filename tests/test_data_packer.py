"""Prompt-major grouping (pure) and the ``sana`` packer against cosmos-rl's own payload types."""

from __future__ import annotations

import pytest
import torch

from cosmos_sana_plugins.datasets.grouping import group_slices, repeat_per_prompt, split_groups, split_outputs
from cosmos_sana_plugins.datasets.params import PromptDataParams
from cosmos_sana_plugins.datasets.prompts import build_prompts


def _prompt_major(num_prompts: int, n: int) -> torch.Tensor:
    """Row r belongs to prompt r // n; its value is that prompt index."""
    return torch.arange(num_prompts).repeat_interleave(n)


@pytest.mark.parametrize(("num_prompts", "n"), [(1, 4), (3, 2), (4, 3)])
def test_groups_hold_one_prompt_each(num_prompts, n):
    groups = split_groups(_prompt_major(num_prompts, n), num_prompts, n)
    assert [group.tolist() for group in groups] == [[i] * n for i in range(num_prompts)]


def test_upstream_slicing_mixes_prompts_when_batch_size_exceeds_one():
    rows = _prompt_major(3, 2)
    assert rows[1:1 + 2].tolist() == [0, 1]  # upstream's [i:i+n] for prompt 1
    assert rows[group_slices(3, 2)[1]].tolist() == [1, 1]


def test_grouping_helpers():
    assert group_slices(2, 3) == [slice(0, 3), slice(3, 6)]
    assert repeat_per_prompt(["a", "b"], 2) == ["a", "a", "b", "b"]
    assert split_groups(None, 2, 3) == [None, None]
    with pytest.raises(ValueError, match=r"expected 2×3 = 6 rows, got 5"):
        split_groups(list(range(5)), 2, 3)
    groups = split_outputs({"latents": torch.zeros(4, 2), "mask": None, "names": list("wxyz")}, 2, 2)
    assert groups[1]["names"] == ["y", "z"] and groups[1]["mask"] is None and groups[1]["latents"].shape == (2, 2)
    with pytest.raises(ValueError, match="rollout output 'latents'"):
        split_outputs({"latents": torch.zeros(3, 2)}, 2, 2)


@pytest.fixture(scope="module")
def packer():
    from cosmos_sana_plugins.datasets.packer import SanaDataPacker

    return SanaDataPacker()


@pytest.fixture(scope="module")
def payloads():
    """The controller's view: cosmos-rl's RLDataset over the shipped GenEval set, collated."""
    from cosmos_rl.dispatcher.data import RLDataset
    from cosmos_rl.dispatcher.data.schema import RLPayload

    dataset = RLDataset(build_prompts(PromptDataParams(path="builtin:geneval")), config=None)
    return RLPayload.collate_fn([dataset[i] for i in range(len(dataset))])[1]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_rollout_input_and_groups_for_any_batch_size(packer, payloads, batch_size):
    batch, n = payloads[:batch_size], 2
    prompts, metadatas = packer.get_rollout_input(payloads=batch, n_generation=n)
    assert prompts == [p.prompt["prompt"] for p in batch for _ in range(n)]
    assert metadatas[2 * (batch_size - 1)]["tag"] == batch[-1].prompt["metadata"]["tag"]
    outputs = {"latents_clean": _prompt_major(batch_size, n).float()[:, None], "prompts": prompts}
    groups = packer.rollout_groups(outputs, batch_size, n)
    for index, group in enumerate(groups):
        assert group["latents_clean"].flatten().tolist() == [float(index)] * n
        assert group["prompts"] == [batch[index].prompt["prompt"]] * n


def test_policy_input_collates_rollouts(packer, payloads):
    from cosmos_rl.dispatcher.data.schema import Rollout

    rollouts = [
        Rollout(prompt=payloads[i].prompt, prompt_idx=i, completion=torch.full((3, 4, 4), float(i)),
                reward=0.5 * i, advantage=-1.0 + i,
                extra_info={"timesteps": torch.tensor([1000.0, 500.0]) * (i + 1), "pooled_prompt_embeds": None,
                            "modality": "image"})
        for i in range(2)
    ]
    batch = packer.get_policy_input(sample=rollouts, device="cpu")
    assert torch.equal(batch["timesteps"], torch.tensor([[1000.0, 500.0], [2000.0, 1000.0]]))
    assert batch["pooled_prompt_embeds"] is None and batch["modality"] == ["image", "image"]
    assert torch.equal(batch["advantages"], torch.tensor([[-1.0], [0.0]]))
    assert torch.equal(batch["rewards"], torch.tensor([0.0, 0.5]))
    assert batch["prompts"] == [payloads[0].prompt["prompt"], payloads[1].prompt["prompt"]]
    assert batch["metadata"][1]["include"] == payloads[1].prompt["metadata"]["include"]  # nested, not stacked
    assert batch["completions"].shape == (2, 3, 4, 4)


def test_bad_prompt_payload_is_named(packer):
    from cosmos_rl.dispatcher.data.schema import RLPayload

    with pytest.raises(TypeError, match="payload 7: expected a prompt string"):
        packer.get_rollout_input(payloads=[RLPayload(prompt={"text": 1}, prompt_idx=7)], n_generation=1)


def test_sft_collate_and_validation_requests(packer, image_folder):
    from types import SimpleNamespace

    from cosmos_sana_plugins.datasets.media import build_images
    from cosmos_sana_plugins.datasets.params import ImageDataParams

    data = build_images(ImageDataParams(path=str(image_folder), size=(8, 8)))
    items = [packer.sft_process_sample(data[i]) for i in range(2)]
    batch = packer.sft_collate_fn(items)
    assert batch["prompt"] == ["a red and blue card", "green"]
    assert [v.shape for v in batch["visual"]] == [(3, 8, 8)] * 2 and batch["samples"] == items
    with pytest.raises(TypeError, match="expected an images/videos dataset item"):
        packer.sft_process_sample({"prompt": "no pixels", "key": "k"})

    sample = SimpleNamespace(eval_num_steps=3, guidance_scale=4.5)
    packer.setup(SimpleNamespace(policy=SimpleNamespace(diffusers=SimpleNamespace(
        inference_size=[16, 24], sample=sample, inference_frames=9))))
    assert packer.sft_collate_fn(items[:1], is_validation=True) == [
        {"prompt": "a red and blue card", "height": 16, "width": 24, "inference_step": 3, "guidance_scale": 4.5,
         "frames": 9}
    ]
