"""``lora.activate`` (cached LoRA layers) leaves a real tiny SANA transformer exactly as PEFT's own calls do.

The reference is diffusers / PEFT switching on the whole transformer: ``disable_adapters()`` for the base
model, else ``enable_adapters()`` + ``set_adapter(active)``, then PEFT's ``set_requires_grad`` so that only
the trainable adapter needs grad. After every switch both transformers must agree on every LoRA layer's
flags, on every parameter's ``requires_grad`` and, bit for bit, on the forward output.
"""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest
import torch

from cosmos_sana_plugins.sana import lora as lora_utils

pytestmark = pytest.mark.usefixtures("torch_single_thread")

STATES = ("default", "old", None)  # None: the base model (adapters disabled)


def _lora(names: list[str], **overrides) -> SimpleNamespace:
    values = {"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.0, "target_modules": None, "init_lora_weights": "gaussian",
              "use_rslora": False, "r_pattern": None, "alpha_pattern": None, "lora_names": names}
    return SimpleNamespace(**{**values, **overrides})


def _randomise(transformer: torch.nn.Module, name: str, seed: int) -> None:
    """Non-zero ``lora_B`` too (PEFT starts it at 0), so that every adapter changes the output differently."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in lora_utils.adapter_parameters(transformer, name).values():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def _transformer() -> torch.nn.Module:
    from cosmos_sana.tools.tiny import build_transformer
    from cosmos_sana.tools.tiny_presets import PRESETS

    torch.manual_seed(0)
    transformer = build_transformer(PRESETS["tiny"]).eval()
    lora_utils.add_adapters(transformer, _lora(["default", "old"]))
    _randomise(transformer, "default", 1)
    _randomise(transformer, "old", 2)
    return transformer


def reference_switch(transformer: torch.nn.Module, active: str | None, trainable: str | None) -> None:
    from peft.tuners.tuners_utils import set_requires_grad

    if active is None:
        transformer.disable_adapters()
    else:
        transformer.enable_adapters()
        transformer.set_adapter(active)
    set_requires_grad(transformer, [name for name in transformer.peft_config if name != trainable], False)
    if trainable is not None:
        set_requires_grad(transformer, trainable, True)


INPUTS = {"hidden_states": torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(3)),
          "encoder_hidden_states": torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(4)),
          "timestep": torch.tensor([100.0, 900.0])}


@torch.no_grad()
def _output(transformer: torch.nn.Module) -> torch.Tensor:
    return transformer(**INPUTS).sample


def _layer_flags(transformer: torch.nn.Module) -> list[tuple[str, bool, list[str]]]:
    layers = lora_utils._tuner_layers(transformer)
    return [(path, layer.disable_adapters, list(layer.active_adapters)) for path, layer in layers]


def _grad_flags(transformer: torch.nn.Module) -> dict[str, bool]:
    return {name: param.requires_grad for name, param in transformer.named_parameters()}


def _assert_same(ours: torch.nn.Module, reference: torch.nn.Module, trainable: str | None, where: str) -> torch.Tensor:
    assert _layer_flags(ours) == _layer_flags(reference), where
    assert ours.active_adapters() == reference.active_adapters(), where
    assert _grad_flags(ours) == _grad_flags(reference), where
    needing_grad = {id(p) for p in ours.parameters() if p.requires_grad}
    expected = set() if trainable is None else {id(p) for p in lora_utils.adapter_parameters(ours, trainable).values()}
    assert needing_grad == expected, where
    output = _output(ours)
    assert torch.equal(output, _output(reference)), where
    return output


@pytest.mark.parametrize("trainable", ["default", "old", None])
def test_every_switch_sequence_matches_peft(trainable):
    ours, reference = _transformer(), _transformer()
    outputs: dict[str | None, torch.Tensor] = {}
    # every window of three switches occurs in this walk (all 27 sequences back to back)
    walk = [state for sequence in itertools.product(STATES, repeat=3) for state in sequence]
    for step, active in enumerate(walk):
        lora_utils.activate(ours, active, trainable)
        reference_switch(reference, active, trainable)
        output = _assert_same(ours, reference, trainable, f"step {step}: {walk[max(0, step - 2):step + 1]}")
        if active in outputs:
            assert torch.equal(output, outputs[active]), f"step {step}: {active!r} forwards differently than before"
        outputs[active] = output
    # the three states are three different models, so any switch that went wrong would show
    assert not torch.equal(outputs["default"], outputs["old"]) and not torch.equal(outputs["default"], outputs[None])
    assert not torch.equal(outputs["old"], outputs[None])


def test_switching_corrects_requires_grad_changed_elsewhere():
    """PEFT's ``set_adapter`` makes the adapter it activates trainable; the next switch puts that right."""
    ours, reference = _transformer(), _transformer()
    for transformer in (ours, reference):
        transformer.set_adapter("old")
    lora_utils.activate(ours, "old", "default")
    reference_switch(reference, "old", "default")
    _assert_same(ours, reference, "default", "after diffusers set_adapter('old')")


def test_unknown_adapter_is_refused_by_name_and_changes_nothing():
    transformer = _transformer()
    lora_utils.activate(transformer, "old", "default")
    layers, grads = _layer_flags(transformer), _grad_flags(transformer)
    with pytest.raises(ValueError, match=r"^unknown adapter 'nope'; adapters are \['default', 'old'\]$"):
        lora_utils.activate(transformer, "nope", "default")
    assert (_layer_flags(transformer), _grad_flags(transformer)) == (layers, grads)


@pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute", "ignore:Adapter extra was active")
def test_adapters_added_or_deleted_after_a_switch_are_seen():
    """An adapter on other modules (``proj_out``) adds LoRA layers after the layers were first found."""
    ours, reference = _transformer(), _transformer()
    lora_utils.activate(ours, "default", "default")
    reference_switch(reference, "default", "default")
    extra = lora_utils.peft_config(_lora(["extra"], target_modules=["proj_out"]))
    for transformer in (ours, reference):
        transformer.add_adapter(extra, adapter_name="extra")
        _randomise(transformer, "extra", 5)
    for active in ("extra", "default", None, "extra"):
        lora_utils.activate(ours, active, "default")
        reference_switch(reference, active, "default")
        _assert_same(ours, reference, "default", f"after adding 'extra', {active!r}")
    assert ("proj_out", False, ["extra"]) in _layer_flags(ours)
    with_extra = _output(ours)

    for transformer in (ours, reference):
        transformer.delete_adapters("extra")
    with pytest.raises(ValueError, match=r"unknown adapter 'extra'; adapters are \['default', 'old'\]"):
        lora_utils.activate(ours, "extra", "default")
    for transformer in (ours, reference):
        transformer.add_adapter(extra, adapter_name="extra")  # the same config object again, new tensors
        _randomise(transformer, "extra", 6)
    lora_utils.activate(ours, "extra", "default")
    reference_switch(reference, "extra", "default")
    assert not torch.equal(_assert_same(ours, reference, "default", "'extra' added again"), with_extra)


def test_layers_rebuilt_under_the_same_configs_are_found_again():
    """``unload_lora`` then ``add_adapter`` with the very config objects of before leaves ``peft_config``'s
    pairs as they were but puts new LoRA layers in: switching must act on the new ones."""
    ours, reference = _transformer(), _transformer()
    lora_utils.activate(ours, "default", "default")
    for transformer in (ours, reference):
        configs = dict(transformer.peft_config)
        transformer.unload_lora()
        for name, config in configs.items():
            transformer.add_adapter(config, adapter_name=name)
        _randomise(transformer, "default", 7)
        _randomise(transformer, "old", 8)
        assert all(a is b for a, b in zip(transformer.peft_config.values(), configs.values()))
    for active in ("old", None, "default"):
        lora_utils.activate(ours, active, "default")
        reference_switch(reference, active, "default")
        _assert_same(ours, reference, "default", f"after rebuilding the layers, {active!r}")


def test_switching_inside_compiled_blocks_reuses_their_graphs():
    """Blocks compiled in place (``fast_denoise.compile_blocks``) guard on the LoRA layers' flags: after
    one NFT iteration has compiled each (adapter state, grad mode), further switching compiles nothing."""
    from torch._dynamo.utils import counters

    from cosmos_sana_plugins.sana.fast_denoise import compile_blocks, uncompile_blocks

    torch._dynamo.reset()
    ours, reference = _transformer(), _transformer()
    compile_blocks(ours, backend="eager")
    graphs = []
    try:
        for _ in range(3):
            for active, grad in (("old", False), ("default", True), (None, False), ("default", True)):
                lora_utils.activate(ours, active, "default")
                reference_switch(reference, active, "default")
                with torch.set_grad_enabled(grad):
                    output = ours(**INPUTS).sample
                assert torch.equal(output, _output(reference)), active
                if grad:
                    output.square().mean().backward()
            graphs.append(counters["stats"]["unique_graphs"])
    finally:
        uncompile_blocks(ours)
        torch._dynamo.reset()
    assert graphs[0] > 0 and graphs[1:] == [graphs[0]] * 2, graphs


def test_switching_after_fully_shard_sets_the_sharded_parameters():
    """FSDP2 keeps the LoRA layers (changing their class) but registers new DTensor parameters: switches
    after ``fully_shard`` must flip those, with the layers found before sharding."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    ours, reference = _transformer(), _transformer()
    lora_utils.activate(ours, "default", "default")  # finds the layers before sharding
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for block in ours.transformer_blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(ours, mesh=mesh)
        assert all(isinstance(p, DTensor) for p in ours.parameters())
        switches = (("old", "old"), (None, "old"), ("default", "default"), ("old", None), (None, "default"))
        for active, trainable in switches:
            lora_utils.activate(ours, active, trainable)
            reference_switch(reference, active, trainable)
            where = f"sharded, {active!r} trainable {trainable!r}"
            assert _layer_flags(ours) == _layer_flags(reference), where
            assert _grad_flags(ours) == _grad_flags(reference), where
            assert torch.equal(_output(ours), _output(reference)), where
    finally:
        dist.destroy_process_group()


def test_activate_leaves_what_the_per_layer_peft_calls_it_replaced_left(monkeypatch):
    """The bench's ``peft_per_layer`` is ``activate`` as it was before caching (PEFT's ``enable_adapters`` and
    ``set_adapter`` on every layer): same flags, lists and grads, and, as there, no two layers share one
    ``_active_adapter`` list (compiled blocks guard on that sharing)."""
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    monkeypatch.syspath_prepend(str(bench))
    spec = importlib.util.spec_from_file_location("bench_adapter_switching", bench / "bench_adapter_switching.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    ours, before = _transformer(), _transformer()
    for active in module.SEQUENCE + ("old", None, None, "old"):
        lora_utils.activate(ours, active, "default")
        module.peft_per_layer(before, active, "default")
        assert _layer_flags(ours) == _layer_flags(before) and _grad_flags(ours) == _grad_flags(before), active
        assert torch.equal(_output(ours), _output(before)), active
        lists = [layer._active_adapter for _, layer in lora_utils._tuner_layers(ours)]
        assert len({id(names) for names in lists}) == len(lists), active
    timed = module.rows(ours)
    assert set(timed) == {"activate", "peft_per_layer", "upstream"}
    for iteration in timed.values():
        iteration()
