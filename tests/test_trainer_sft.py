"""SFT through cosmos-rl's registered ``diffusers_sana_sft`` trainer on the tiny SANA / SANA-Video."""

from __future__ import annotations

import pytest
import torch
from fixtures_trainers import build_trainer, recipe
from PIL import Image

from cosmos_sana_plugins.trainers import flow_matching, losses, sft


def image_folder(root, count=4):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (48, 40), (40 * i, 255 - 40 * i, 128)).save(root / f"s{i}.png")
        (root / f"s{i}.txt").write_text(f"a flat colour number {i}\n")
    return root


def video_folder(root, count=2, frames=9):
    import av
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with av.open(str(root / f"v{i}.mp4"), "w") as container:
            stream = container.add_stream("libx264", rate=16)
            stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
            for f in range(frames):
                frame = np.full((32, 32, 3), 20 * f + 40 * i, np.uint8)
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())
        (root / f"v{i}.txt").write_text(f"a fading clip {i}\n")
    return root


def sft_config(name, pipeline, tmp_path, data, **overrides):
    kind = "videos" if "video" in name else "images"
    ref = {"name": kind, "args": {"path": str(data)}}
    return recipe(name, pipeline, tmp_path / "out", {"custom.data": ref, "custom.val_data": ref, **overrides})


def global_batch(trainer, config):
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.runtime import dataset_factory

    dataset = dataset_factory(installed_plugins(), "data")(config)
    return [trainer.data_packer.sft_process_sample(dataset[i]) for i in range(len(dataset))]


def fixed_noise_flow_matching(model, latents, text):
    """The SFT loss at σ = 0.5 and noise 0.3 everywhere: independent of random draws and micro-batching."""
    sigma = torch.full((latents.shape[0],), 0.5)
    noise = torch.full_like(latents, 0.3)
    return losses.flow_matching_loss(model.velocity(losses.noised(latents, noise, sigma), sigma, text), latents, noise)


@torch.no_grad()
def fixed_loss(trainer, batch) -> float:
    torch.manual_seed(99)
    latents, text = flow_matching.encode_items(trainer.model, batch)
    return flow_matching.flow_matching_per_sample(trainer.model, latents, text).mean().item()


def test_full_sft_step_with_ema_lowers_loss(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = sft_config("sana-image-sft", tiny_image_pipeline_dir, tmp_path, image_folder(tmp_path / "data"),
                        **{"train.optm_lr": 1e-5})
    trainer = build_trainer(config)
    assert type(trainer).__name__ == "SanaSFTTrainer" and not trainer.is_lora
    batch = global_batch(trainer, config)
    params0 = {n: p.detach().clone() for n, p in trainer.model.transformer.named_parameters()}
    before = fixed_loss(trainer, batch)
    report = trainer.step_training(batch, total_steps=10, train_step=0, save_freq=10)
    assert set(report) >= {"train/loss_avg", "train/loss_max", "optimizer/grad_norm", "train/learning_rate"}
    params1 = dict(trainer.model.transformer.named_parameters())
    assert sum(not torch.equal(params0[n], p) for n, p in params1.items()) > len(params0) // 2
    assert fixed_loss(trainer, batch) < before
    for name, shadow in trainer.ema.shadow.items():  # decay 0.9 after one update
        torch.testing.assert_close(shadow, 0.9 * params0[name] + 0.1 * params1[name].detach(), rtol=0, atol=1e-6)


def test_micro_batch_gradients_are_averaged_and_mean_loss_logged(tiny_image_pipeline_dir, tmp_path, cosmos_registries,
                                                                 monkeypatch):
    config = sft_config("sana-image-sft-lora", tiny_image_pipeline_dir, tmp_path, image_folder(tmp_path / "data"))
    trainer = build_trainer(config)
    batch = global_batch(trainer, config)

    grads = {}

    def capture(inter_policy_nccl=None, **_):
        grads[trainer.config.train.train_policy.mini_batch] = [p.grad.clone() for p in trainer.trainable_params]
        trainer.optimizers.zero_grad()
        return 0.0

    monkeypatch.setattr(sft, "flow_matching_per_sample", fixed_noise_flow_matching)
    monkeypatch.setattr(trainer, "optimizer_step", capture)
    reports = {}
    for mini in (4, 1):
        trainer.config.train.train_policy.mini_batch = mini
        reports[mini] = trainer.step_training(batch, total_steps=10, train_step=0, save_freq=10)
    for whole, single in zip(grads[4], grads[1]):
        torch.testing.assert_close(single, whole, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        latents, text = flow_matching.encode_items(trainer.model, batch)
        per_sample = fixed_noise_flow_matching(trainer.model, latents, text)
    assert reports[1]["train/loss_avg"] == pytest.approx(per_sample.mean().item(), rel=1e-5)
    assert reports[1]["train/loss_max"] == pytest.approx(per_sample.max().item(), rel=1e-5)


def test_lora_sft_trains_only_the_adapter_and_renders_validation(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = sft_config("sana-image-sft-lora", tiny_image_pipeline_dir, tmp_path, image_folder(tmp_path / "data"),
                        **{"train.optm_lr": 1e-4})
    trainer = build_trainer(config)
    batch = global_batch(trainer, config)
    params0 = {n: p.detach().clone() for n, p in trainer.model.transformer.named_parameters()}
    before = fixed_loss(trainer, batch)
    trainer.step_training(batch, total_steps=10, train_step=0, save_freq=10)
    changed = {n for n, p in trainer.model.transformer.named_parameters() if not torch.equal(p, params0[n])}
    assert changed and all(".default." in name and "lora_" in name for name in changed)
    assert fixed_loss(trainer, batch) < before
    trainer.step_validation(batch, train_step=1, total_steps=10)
    files = sorted((trainer.output_dir / "logs" / "media" / "validation").iterdir())
    assert [f.suffix for f in files] == [".png", ".png"]  # val_max_samples = 2
    assert Image.open(files[0]).size == (32, 32)


def test_video_lora_sft_step_and_mp4_validation(tiny_video_pipeline_dir, tmp_path, cosmos_registries):
    import av

    config = sft_config("sana-video-sft-lora", tiny_video_pipeline_dir, tmp_path, video_folder(tmp_path / "data"),
                        **{"train.optm_lr": 1e-4})
    trainer = build_trainer(config)
    batch = global_batch(trainer, config)
    before = fixed_loss(trainer, batch)
    trainer.step_training(batch, total_steps=10, train_step=0, save_freq=10)
    assert fixed_loss(trainer, batch) < before
    trainer.step_validation(batch[:1], train_step=1, total_steps=10)
    (clip,) = (trainer.output_dir / "logs" / "media" / "validation").iterdir()
    with av.open(str(clip)) as container:
        assert clip.suffix == ".mp4" and sum(1 for _ in container.decode(video=0)) == 9


def test_checkpoint_and_resume_round_trip(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    config = sft_config("sana-image-sft", tiny_image_pipeline_dir, tmp_path, image_folder(tmp_path / "data"))
    trainer = build_trainer(config)
    batch = global_batch(trainer, config)
    trainer.step_training(batch, total_steps=2, train_step=0, save_freq=1)
    trainer.checkpointing(total_steps=2, train_step=1, save_freq=1)
    assert (trainer.output_dir / "checkpoints" / "iter_000000001" / "COMPLETE").is_file()
    resumed_config = config.model_copy(deep=True)
    resumed_config.train.resume = True
    resumed = build_trainer(resumed_config)
    assert resumed.load_model()[1] == 1
    for (name, a), b in zip(trainer.model.transformer.named_parameters(), resumed.model.transformer.parameters()):
        assert torch.equal(a, b), name
    for name, shadow in trainer.ema.shadow.items():
        assert torch.equal(resumed.ema.shadow[name], shadow)
    # the final checkpoint also exports a stock diffusers pipeline (EMA weights swapped in)
    trainer.checkpointing(total_steps=2, train_step=2, save_freq=1, is_last_step=True)
    from diffusers import SanaPipeline

    exported = SanaPipeline.from_pretrained(trainer.output_dir / "safetensors" / "step_2")
    ema = trainer.ema.shadow
    name = next(iter(ema))
    torch.testing.assert_close(dict(exported.transformer.named_parameters())[name], ema[name])
