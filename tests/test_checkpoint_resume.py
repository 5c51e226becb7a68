"""Save → "kill" → resume is bit-identical to an uninterrupted run (LoRA default+old and full-parameter)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cosmos_sana.checkpoint import (
    CheckpointError,
    ModelState,
    OptimizerState,
    ParameterEMA,
    RNGState,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    runs_root,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")

N_STEPS, M_STEPS, BATCH, N_SAMPLES = 3, 3, 2, 5


class Batches:
    """Batches drawn from the project's resumable ``EpochSampler``, epoch after epoch."""

    def __init__(self, n: int, seed: int):
        from cosmos_sana.sample_order import EpochSampler

        self.sampler = EpochSampler(n, seed=seed)
        self._indices: Iterator[int] | None = None

    def next_batch(self, size: int) -> list[int]:
        out: list[int] = []
        while len(out) < size:
            if self._indices is None:
                self._indices = iter(self.sampler)
            try:
                out.append(next(self._indices))
            except StopIteration:
                self.sampler.set_epoch(self.sampler.epoch + 1)
                self._indices = None
        return out


@dataclass
class Run:
    transformer: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    ema: ParameterEMA
    batches: Batches
    lora: bool
    order: list[int]
    counters: dict[str, Any]

    def parts(self) -> dict[str, Any]:
        return {
            "model": ModelState(self.transformer, lora_only=self.lora, base_pipeline="/base"),
            "optim": OptimizerState(self.transformer, self.optimizer),
            "scheduler": self.scheduler,
            "ema": self.ema,
            "rng": RNGState(),
            "dataloader": self.batches.sampler,
            "trainer": self.counters,
        }


def build_run(lora: bool, init_seed: int) -> Run:
    from peft import LoraConfig

    from cosmos_sana.tools.tiny import build_transformer
    from cosmos_sana.tools.tiny_presets import PRESETS

    torch.manual_seed(0 if lora else init_seed)  # LoRA: the base weights come from the base pipeline
    transformer = build_transformer(PRESETS["tiny"])
    torch.manual_seed(init_seed)
    if lora:
        config = LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian", target_modules=["to_q", "to_k", "to_v", "to_out.0"])
        transformer.requires_grad_(False)
        transformer.add_adapter(config, adapter_name="default")
        transformer.add_adapter(config, adapter_name="old")
        transformer.set_adapter("default")
        for name, p in transformer.named_parameters():
            p.requires_grad_(".default." in name)
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return Run(transformer, optimizer, scheduler, ParameterEMA(transformer, 0.9), Batches(N_SAMPLES, 11),
               lora, [], {"consumed": 0})


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(N_SAMPLES, 4, 8, 8, generator=g), torch.randn(N_SAMPLES, 6, 32, generator=g)


def train(run: Run, steps: int, data: tuple[torch.Tensor, torch.Tensor]) -> None:
    latents, captions = data
    for _ in range(steps):
        idx = run.batches.next_batch(BATCH)
        run.order += idx
        x0, text = latents[idx], captions[idx].clone()
        if random.random() < 0.5:  # python RNG: caption dropout
            text[0] = 0
        noise = torch.randn_like(x0)  # torch RNG
        t = torch.from_numpy(np.random.uniform(0.05, 0.95, size=len(idx))).float()  # numpy RNG
        xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
        pred = run.transformer(xt, encoder_hidden_states=text, timestep=t * 1000, return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(pred, noise - x0)
        loss.backward()
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.ema.update()
        if run.lora:
            with torch.no_grad():
                for name, p in run.transformer.named_parameters():
                    if ".old." in name:
                        new = dict(run.transformer.named_parameters())[name.replace(".old.", ".default.")]
                        p.lerp_(new, 0.5)
        run.counters["consumed"] += len(idx)


def snapshot(run: Run) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {
        "model": {k: v.clone() for k, v in get_model_state_dict(run.transformer).items()},
        "optim": get_optimizer_state_dict(run.transformer, run.optimizer),
        "ema": {k: v.clone() for k, v in run.ema.state_dict().items()},
        "lr": run.scheduler.get_last_lr(),
        "order": list(run.order),
        "sampler": run.batches.sampler.state_dict(),
        "counters": dict(run.counters),
    }


def assert_identical(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys differ"
        for key in a:
            assert_identical(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def scramble_rngs() -> None:
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)


@pytest.mark.parametrize("lora", [True, False], ids=["lora-default+old", "full"])
def test_resume_is_bit_identical(tmp_path: Path, lora: bool) -> None:
    data = dataset()

    scramble_rngs()
    reference = build_run(lora, init_seed=0)
    train(reference, N_STEPS + M_STEPS, data)
    expected = snapshot(reference)

    scramble_rngs()
    first = build_run(lora, init_seed=0)
    train(first, N_STEPS, data)
    saved = save_checkpoint(tmp_path, N_STEPS, first.parts(), config={"train": {"epoch": 1}}, keep_last=2)
    order_before = list(first.order)
    del first  # "kill"

    scramble_rngs()
    second = build_run(lora, init_seed=99)  # different init: everything must come from the checkpoint
    second.order = order_before
    path = resolve_resume(True, tmp_path)
    assert path == saved
    assert load_checkpoint(path, second.parts()) == N_STEPS
    train(second, M_STEPS, data)

    assert_identical(expected, snapshot(second))
    stored = {p.name for p in saved.iterdir()}
    assert {"model", "optim", "scheduler", "ema", "rng", "dataloader", "trainer", "meta.json", "COMPLETE"} <= stored
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["step"] == N_STEPS and meta["world_size"] == 1
    if lora:
        assert meta["parts"]["model"]["lora_only"] is True
        assert set(meta["parts"]["model"]["adapters"]) == {"default", "old"}
        assert meta["parts"]["model"]["trainable_adapters"] == ["default"]


def test_lora_checkpoint_holds_both_adapters_and_no_base_weights(tmp_path: Path) -> None:
    from cosmos_sana.checkpoint.dcp_io import stored_keys

    run = build_run(lora=True, init_seed=0)
    path = save_checkpoint(tmp_path, 1, {"model": ModelState(run.transformer, lora_only=True)})
    keys = stored_keys(path / "model")
    assert keys and all(".lora_" in k for k in keys)
    assert any(".default." in k for k in keys) and any(".old." in k for k in keys)


def test_partial_checkpoints_are_never_picked(tmp_path: Path) -> None:
    state = {"w": torch.arange(4.0)}
    good = save_checkpoint(tmp_path, 5, {"trainer": state})
    half = tmp_path / "checkpoints" / "iter_000000009"
    half.mkdir()
    (half / "meta.json").write_text("{}")
    (tmp_path / "checkpoints" / ".staging-iter_000000010").mkdir()
    assert find_latest(tmp_path) == good
    with pytest.raises(CheckpointError, match="iter_000000009.*COMPLETE"):
        resolve_resume(str(half), tmp_path)
    with pytest.raises(CheckpointError, match="COMPLETE"):
        load_checkpoint(half, {"trainer": state})
    save_checkpoint(tmp_path, 6, {"trainer": state})  # clears the stale staging folder
    assert not (tmp_path / "checkpoints" / ".staging-iter_000000010").exists()


def test_keep_last_and_timestamped_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260101-000000"
    for step in (1, 2, 3):
        save_checkpoint(run_dir, step, {"trainer": {"step": torch.tensor(step)}}, keep_last=2)
    assert [p.name for p in list_checkpoints(run_dir)] == ["iter_000000002", "iter_000000003"]
    assert find_latest(tmp_path) == run_dir / "checkpoints" / "iter_000000003"  # cosmos-rl's output_dir/<timestamp>
    new_run = tmp_path / "20260102-000000"  # the next run's output_dir: resume looks across runs
    assert runs_root(new_run, "20260102-000000") == tmp_path
    assert resolve_resume(True, runs_root(new_run, "20260102-000000")) == run_dir / "checkpoints" / "iter_000000003"
    assert runs_root(tmp_path / "plain", None) == tmp_path / "plain"
    assert resolve_resume(False, tmp_path) is None
    assert resolve_resume(True, tmp_path / "empty") is None


def test_config_is_redacted_and_load_checks_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3cr3t-value")
    config = {"custom": {"reward_runtime": {"api_key": "abc", "url": "http://x/?t=s3cr3t-value"}}}
    path = save_checkpoint(tmp_path, 2, {"trainer": {"x": torch.zeros(2)}}, config=config)
    text = (path / "run_config.json").read_text()
    assert "abc" not in text and "s3cr3t-value" not in text
    with pytest.raises(CheckpointError, match="no part 'optim'"):
        load_checkpoint(path, {"optim": {}})
    with pytest.raises(CheckpointError, match="cannot load"):
        load_checkpoint(path, {"trainer": {"y": torch.zeros(2)}})


def test_ema_update_matches_the_formula():
    """shadow ← decay·shadow + (1 − decay)·param, exactly, for every trainable parameter only."""
    layer = torch.nn.Linear(3, 2)
    layer.bias.requires_grad_(False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    ema = ParameterEMA(layer, decay=0.75)
    with torch.no_grad():
        layer.weight.fill_(3.0)
    ema.update()
    assert set(ema.shadow) == {"weight"}
    torch.testing.assert_close(ema.shadow["weight"], torch.full((2, 3), 1.5), rtol=0, atol=0)  # .75·1 + .25·3
    ema.update()
    torch.testing.assert_close(ema.shadow["weight"], torch.full((2, 3), 1.875), rtol=0, atol=0)  # .75·1.5 + .25·3
