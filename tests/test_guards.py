"""Reward-hacking guards: image statistics against hand-derived values, ``[custom.guards]`` validation,
patience, and a tiny CPU RL run that logs the statistics and is stopped cleanly by a threshold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from fixtures_trainers import recipe

from cosmos_sana.checkpoint import checkpoint_dir
from cosmos_sana.settings import SettingsError, parse_custom
from cosmos_sana_plugins.trainers.guards import GuardTripped, RolloutGuards
from cosmos_sana_plugins.trainers.image_stats import image_statistics

N = 64
X = torch.arange(N)


def grey(y: torch.Tensor) -> torch.Tensor:
    """A luminance map as a 3-channel grey image."""
    return y.float()[None].expand(3, -1, -1)


def stats_of(*images: torch.Tensor, near_constant_std: float = 0.02) -> dict[str, list[float]]:
    return {k: v.tolist() for k, v in image_statistics(torch.stack(images), near_constant_std).items()}


CHECKERBOARD = grey((X[:, None] + X[None, :]) % 2)
STRIPES_8 = grey(((X[None, :] // 4) % 2).expand(N, N))  # a square wave of period 8 along x
GRID_8 = grey(((X[:, None] % 8) == 0) | ((X[None, :] % 8) == 0))  # one-pixel lines every 8 pixels
RAMP = grey((X[None, :] / N).expand(N, N))
EDGE = grey((X[None, :] >= 20).expand(N, N))
CONSTANT = grey(torch.full((N, N), 0.5))
NOISE = grey(torch.rand(256, 256, generator=torch.Generator().manual_seed(0)))


def test_saturation_is_hsv_saturation():
    red = torch.zeros(3, 4, 4)
    red[0] = 1
    pixel = torch.tensor([0.8, 0.4, 0.2])[:, None, None].expand(3, 4, 4)  # (0.8 − 0.2) / 0.8
    half = red.clone()
    half[:, :, 2:] = 0.5  # half red, half grey
    black = torch.zeros(3, 4, 4)  # max = 0: saturation 0, not nan
    assert stats_of(red, CONSTANT[:, :4, :4], pixel, half, black)["saturation"] == pytest.approx([1, 0, 0.75, 0.5, 0])


def test_high_freq_is_the_energy_share_above_half_nyquist():
    got = stats_of(CHECKERBOARD, STRIPES_8, RAMP, CONSTANT)["high_freq"]
    # square wave of period 8: odd harmonics 1/8 and 3/8 cycles/px with |X_k| ∝ 1/sin(πk/8) per half-period
    # sum, i.e. energies 1/sin²(π/8) : 1/sin²(3π/8) → share of 3/8 = (2 − √2)/4
    # ramp x/N: circularly a sawtooth, |X_k|² ∝ 1/sin²(πk/N); the share of bins with |k/N| > 1/4
    energy = [1 / math.sin(math.pi * k / N) ** 2 for k in range(1, N)]
    ramp = sum(e for k, e in enumerate(energy, 1) if min(k, N - k) / N > 0.25) / sum(energy)
    assert got == pytest.approx([1.0, (2 - math.sqrt(2)) / 4, ramp, 0.0], abs=1e-5)
    # white noise: energy spread evenly, the share outside the disc of radius 1/4 is 1 − π/16
    assert stats_of(NOISE)["high_freq"][0] == pytest.approx(1 - math.pi / 16, abs=0.01)


def test_periodicity_flags_grids_not_noise_gradients_or_edges():
    got = stats_of(CHECKERBOARD, STRIPES_8, GRID_8, STRIPES_8.transpose(1, 2), RAMP, EDGE, CONSTANT)["periodicity"]
    assert got == pytest.approx([1, 1, 1, 1, 0, 0, 0], abs=1e-5)
    assert stats_of(NOISE)["periodicity"][0] < 0.05


def test_spectral_statistics_read_the_central_window():
    image = torch.full((3, 512, 600), 0.5)
    image[:, 128:384, 172:428] = grey((torch.arange(256)[:, None] + torch.arange(256)[None, :]) % 2)
    image[:, :8, :8] = 0  # a feature outside the 256² window, which the spectral statistics do not see
    got = stats_of(image)
    assert got["high_freq"] == pytest.approx([1.0]) and got["periodicity"] == pytest.approx([1.0])


def test_near_constant_is_a_luminance_std_below_the_setting():
    two_levels = grey(0.5 + 0.01 * (2 * (X[None, :] % 2) - 1).expand(N, N))  # std 0.01
    wider = grey(0.5 + 0.03 * (2 * (X[None, :] % 2) - 1).expand(N, N))  # std 0.03
    red = torch.zeros(3, N, N)
    red[0] = 1  # vivid but of one luminance
    assert stats_of(CONSTANT, two_levels, wider, red, NOISE[:, :N, :N])["near_constant"] == [1, 1, 0, 1, 0]
    assert stats_of(two_levels, near_constant_std=0.005)["near_constant"] == [0]


def test_a_video_scores_the_mean_of_its_frames():
    red = torch.zeros(3, N, N)
    red[0] = 1
    video = torch.stack([red, CONSTANT, CHECKERBOARD, CHECKERBOARD])
    got = {k: v.tolist() for k, v in image_statistics(video[None], 0.02).items()}
    assert got["saturation"] == pytest.approx([0.25]) and got["periodicity"] == pytest.approx([0.5])
    assert got["near_constant"] == [0]  # the std runs over all frames


def test_bad_media_shape_is_named():
    with pytest.raises(ValueError, match=r"1 or 3 channels, got shape \(2, 4, 8, 8\)"):
        image_statistics(torch.zeros(2, 4, 8, 8), 0.02)


def guard_settings(**guards) -> dict:
    return {"package": "cosmos-sana", "guards": guards}


def test_guard_options_are_validated_strictly():
    assert parse_custom(guard_settings()).guards.thresholds() == {}
    assert parse_custom(guard_settings(max_periodicity=0.5, patience=3)).guards.thresholds() == {"periodicity": 0.5}
    for bad, key in (
        ({"max_periodicty": 0.5}, "custom.guards.max_periodicty"),
        ({"max_saturation": 1.5}, "custom.guards.max_saturation"),
        ({"patience": 0}, "custom.guards.patience"),
        ({"near_constant_std": 0}, "custom.guards.near_constant_std"),
    ):
        with pytest.raises(SettingsError, match=key):
            parse_custom(guard_settings(**bad))


def test_patience_counts_consecutive_steps_over_the_threshold():
    options = parse_custom(guard_settings(max_periodicity=0.5, max_saturation=0.9, patience=2)).guards
    guards = RolloutGuards(options, torch.device("cpu"))
    high, low = {"guard/periodicity": 0.75, "guard/saturation": 0.1}, {"guard/periodicity": 0.25, "guard/saturation": 0.1}
    assert [guards.check(m, step) for step, m in enumerate([high, low, high], 1)] == [None] * 3
    tripped = guards.check(high, 4)
    assert str(tripped) == (
        "guard: periodicity = 0.75 > 0.5 at step 4, above it for 2 consecutive steps "
        "(set [custom.guards] max_periodicity or patience to change)"
    )
    assert (tripped.statistic, tripped.value, tripped.threshold, tripped.step) == ("periodicity", 0.75, 0.5, 4)


def test_thresholds_without_media_are_an_error():
    guards = RolloutGuards(parse_custom(guard_settings(max_high_freq=0.9)).guards, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"\['max_high_freq'\] but the step's rollouts carry no media"):
        guards.measure(None)
    assert RolloutGuards(parse_custom(guard_settings()).guards, torch.device("cpu")).measure(None) == {}


def read_metrics(config) -> list[dict]:
    path = Path(config.train.output_dir) / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def recording(rollout) -> list[torch.Tensor]:
    """Record the media of every rollout call (the trainer must measure exactly these)."""
    seen, generate = [], rollout.rollout_generation

    def wrapped(*args, **kwargs):
        results = generate(*args, **kwargs)
        seen.append(torch.cat([torch.as_tensor(r.completions) for r in results]))
        return results

    rollout.rollout_generation = wrapped
    return seen


def test_tiny_run_logs_guard_statistics_and_a_threshold_stops_it(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    from cosmos_sana_plugins.trainers.local_loop import build_components, run_local

    overrides = {"train.train_batch_per_replica": 4}
    free = {**overrides, "train.ckpt.enable_checkpoint": False}
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path / "free", free)
    trainer, rollout = build_components(config)
    media = recording(rollout)
    reports = run_local(config, 2, (trainer, rollout))
    for report, logged, step_media in zip(reports, read_metrics(config), media, strict=True):
        expected = {k: v.mean().item() for k, v in image_statistics(step_media, 0.02).items()}
        assert report["guard/saturation"] == pytest.approx(expected["saturation"], rel=1e-6)
        assert report["guard/high_freq"] == pytest.approx(expected["high_freq"], rel=1e-6)
        assert report["guard/periodicity"] == pytest.approx(expected["periodicity"], rel=1e-6, abs=1e-9)
        assert report["guard/near_constant_frac"] == expected["near_constant"]
        assert {k: logged[k] for k in report if k.startswith("guard/")} == {
            k: v for k, v in report.items() if k.startswith("guard/")
        }
    step1 = reports[0]["guard/saturation"]
    print("tiny GRPO guard statistics, step 1:", {k: round(v, 4) for k, v in reports[0].items() if k.startswith("guard/")})

    # the same run with a saturation ceiling under what the rollouts show, for 2 steps in a row:
    # step 1 trains and saves, step 2 stops before training, so no step-2 checkpoint exists
    guarded = {**overrides, "custom.guards": {"max_saturation": step1 / 2, "patience": 2}}
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path / "guarded", guarded)
    trainer, rollout = build_components(config)
    step_training = trainer.step_training  # save every step, as cosmos-rl's worker does with save_freq = 1

    def save_every_step(rollouts, step, total, **kwargs):
        return step_training(rollouts, step, total, **{**kwargs, "do_save_checkpoint": True})

    trainer.step_training = save_every_step
    with pytest.raises(GuardTripped, match=r"^guard: saturation = \S+ > \S+ at step 2, above it for 2 consecutive") as info:
        run_local(config, 3, (trainer, rollout))
    assert info.value.step == 2 and info.value.value > step1 / 2
    logged = read_metrics(config)
    assert [m["step"] for m in logged] == [1, 2]
    assert logged[1]["guard/saturation"] == info.value.value and "train/loss" not in logged[1]
    assert [p.name for p in checkpoint_dir(config.train.output_dir, 1).parent.iterdir()] == [checkpoint_dir(".", 1).name]


# ---------------------------------------------------------------- held-out validation scorer

def test_validation_reward_fn_scores_with_the_holdout_rewards(tiny_image_pipeline_dir, tmp_path, cosmos_registries):
    """cosmos-rl's validation path: the rollout renders validation prompts, the validation reward
    function scores them with ``holdout_rewards`` (inline), training keeps ``[[custom.rewards]]``."""
    from cosmos_rl.dispatcher.data.schema import RLPayload

    from cosmos_sana.bridge import worker_entry_kwargs
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.rewards import ledger
    from cosmos_sana_plugins.rewards.jpeg import jpeg_kilobytes
    from cosmos_sana_plugins.trainers.local_loop import build_components, score_payload

    holdout = {"custom.guards": {"holdout_rewards": [{"name": "jpeg_incompressibility"}]}, "validation.n_generation": 2}
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path, holdout)
    _, rollout = build_components(config)
    payloads = [RLPayload(prompt={"prompt": "a red fox", "metadata": {}}, prompt_idx=0)]
    result = rollout.rollout_generation(payloads, None, None, None, is_validation=True)[0]
    assert ledger.sample_ids_of(payloads[0].prompt) is None  # not submitted to the training scorers
    payloads[0].completions = result.completions

    kwargs = worker_entry_kwargs(installed_plugins())
    [validation_fn], [training_fn] = kwargs["val_reward_fns"], kwargs["reward_fns"]
    totals, parts = score_payload(validation_fn, payloads[0], config)
    kilobytes = jpeg_kilobytes(result.completions)
    assert totals == pytest.approx(kilobytes) and [p["jpeg_incompressibility"] for p in parts] == pytest.approx(kilobytes)
    training, _ = score_payload(training_fn, payloads[0], config)
    assert training == pytest.approx([-kb / 500 for kb in kilobytes])

    # without holdout_rewards validation is scored like training (through the rollout's async submission)
    config = recipe("sana-image-grpo", tiny_image_pipeline_dir, tmp_path / "plain", {"validation.n_generation": 2})
    _, rollout = build_components(config)
    payloads = [RLPayload(prompt={"prompt": "a red fox", "metadata": {}}, prompt_idx=0)]
    payloads[0].completions = rollout.rollout_generation(payloads, None, None, None, is_validation=True)[0].completions
    assert ledger.sample_ids_of(payloads[0].prompt) is not None
    totals, _ = score_payload(validation_fn, payloads[0], config)
    assert totals == pytest.approx([-kb / 500 for kb in jpeg_kilobytes(payloads[0].completions)])


def test_holdout_reward_names_are_validated(tmp_path):
    from cosmos_sana.plugin_manager import load_plugins
    from cosmos_sana.validation import ConfigInvalid, validate_file

    path = tmp_path / "recipe.toml"
    path.write_text(
        f'mode = "colocated"\n[train]\noutput_dir = "{tmp_path}"\n[train.train_policy]\ntype = "sft"\n'
        '[policy]\nmodel_name_or_path = "/models/sana"\n[policy.parallelism]\ntp_size = 1\n'
        '[custom]\npackage = "cosmos-sana"\n[[custom.guards.holdout_rewards]]\nname = "pickscor"\n'
    )
    with pytest.raises(ConfigInvalid) as info:
        validate_file(path, registry=load_plugins())
    assert [issue.path for issue in info.value.issues] == ["custom.guards.holdout_rewards[0].name"]


TWO_RANKS = """
import json, sys
import torch
import torch.distributed as dist
from cosmos_sana.config.guards import GuardOptions
from cosmos_sana_plugins.trainers.guards import RolloutGuards

dist.init_process_group("gloo")
rank = dist.get_rank()
media = torch.zeros(2 + rank, 3, 8, 8)  # rank 0: 2 red images, rank 1: 3 grey ones
media[:, 0] = 1.0 if rank == 0 else 0.5
media[:, 1:] = 0.0 if rank == 0 else 0.5
guards = RolloutGuards(GuardOptions(max_saturation=0.3), torch.device("cpu"))
metrics = guards.measure(media)
tripped = guards.check(metrics, 1)
json.dump({"saturation": metrics["guard/saturation"], "tripped": str(tripped)}, open(f"{sys.argv[1]}/rank{rank}.json", "w"))
dist.destroy_process_group()
"""


def test_ranks_share_the_means_and_stop_together(tmp_path):
    """Two gloo ranks with different rollouts: both see the mean over all 5 samples (2 saturated of 5
    = 0.4) and both trip, although rank 1's own samples (saturation 0) would not."""
    from fixtures_ranks import run_two_ranks

    script = tmp_path / "worker.py"
    script.write_text(TWO_RANKS)
    run_two_ranks(script, tmp_path, timeout=300)
    message = "guard: saturation = 0.4 > 0.3 at step 1 (set [custom.guards] max_saturation to change)"
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"saturation": pytest.approx(0.4), "tripped": message}
