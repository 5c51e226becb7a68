"""The FP8 preview copy must not change inductor settings for the rest of the process."""

from __future__ import annotations

import torch

from cosmos_sana_plugins.rollout import best_of_n


def test_fp8_preview_asks_torchao_to_leave_inductor_config_alone(monkeypatch):
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

    # torchao's default turns on coordinate-descent tuning process-wide (the reason for the option)
    assert Float8DynamicActivationFloat8WeightConfig().set_inductor_config is True
    seen = {}

    def record(module, config, filter_fn):  # FP8 kernels need a GPU of compute capability >= 8.9
        seen["config"] = config
        seen["quantized"] = [name for name, sub in module.named_modules() if filter_fn(sub, name)]

    monkeypatch.setattr("torchao.quantization.quantize_", record)
    module = torch.nn.Module()
    module.transformer_blocks = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(30, 32))
    module.proj_out = torch.nn.Linear(32, 32)
    best_of_n._quantize(module, "fp8")
    assert isinstance(seen["config"], Float8DynamicActivationFloat8WeightConfig)
    assert seen["config"].set_inductor_config is False
    assert seen["quantized"] == ["transformer_blocks.0"]  # only block linears with sizes divisible by 16
