"""Pins every cosmos-rl internal that ``cosmos_sana.compat`` relies on.

If cosmos-rl changes any of these, a test here fails with the reason, before a
user's run silently misbehaves.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

from cosmos_sana.compat import autoload
from cosmos_sana.compat import cosmos_rl as compat


def test_pinned_upstream_version():
    assert compat.upstream_version() == compat.UPSTREAM_VERSION


def test_worker_entry_accepts_what_the_bridge_passes():
    from cosmos_rl.launcher.worker_entry import main

    params = inspect.signature(main).parameters
    for name in compat.WORKER_ENTRY_KWARGS:
        assert name in params, f"cosmos-rl worker_entry.main lost {name!r}"


def test_model_registry_override_contract():
    from cosmos_rl.policy.model.base import ModelRegistry
    from cosmos_rl.policy.model.diffusers import DiffuserModel
    from cosmos_rl.policy.model.diffusers.weight_mapper import DiffuserModelWeightMapper  # noqa: F401

    assert "allow_override" in inspect.signature(ModelRegistry.register).parameters
    # the names our SANA adapter takes over are upstream's today
    for pipeline in ("SanaPipeline", "SanaVideoPipeline"):
        assert issubclass(ModelRegistry._MODEL_REGISTRY[pipeline], DiffuserModel)


def test_trainer_and_rollout_registries():
    from cosmos_rl.policy.trainer.base import TrainerRegistry
    from cosmos_rl.rollout.rollout_base import RolloutRegistry

    assert "trainer_type" in inspect.signature(TrainerRegistry.register).parameters
    assert "rollout_type" in inspect.signature(RolloutRegistry.register).parameters


def test_tokenizer_loader_hook_exists():
    from cosmos_rl.utils.util import register_tokenizer_loader

    assert list(inspect.signature(register_tokenizer_loader).parameters) == ["predicate", "loader"]


def test_config_forwards_custom_table_only():
    from cosmos_rl.policy.config import Config

    assert "custom" in Config.model_fields
    assert Config.model_config.get("extra") in (None, "ignore"), "upstream now rejects unknown keys itself"


@pytest.mark.parametrize("module", sorted(autoload.STOCK_ENTRY_MODULES | {autoload.LAUNCHER_MODULE}))
def test_stock_entry_modules_exist(module):
    assert importlib.util.find_spec(module) is not None


def test_launch_scripts_run_the_stock_modules_with_python_dash_m():
    launcher = Path(importlib.util.find_spec("cosmos_rl.launcher").origin).parent
    controller = (launcher / "launch_controller.sh").read_text()
    replica = (launcher / "launch_replica.sh").read_text()
    assert 'SCRIPT="cosmos_rl.dispatcher.run_web_panel"' in controller
    assert 'CMD="python -m $SCRIPT"' in controller
    for module in ("cosmos_rl.policy.train", "cosmos_rl.rollout.rollout_entry", "cosmos_rl.reference.reference_entry"):
        assert f'DEFAULT_MODULE="{module}"' in replica
    assert '-m "$DEFAULT_MODULE"' in replica
    assert 'export COSMOS_ROLE="Controller"' in controller


def test_launcher_children_inherit_the_environment():
    source = inspect.getsource(importlib.import_module("cosmos_rl.launcher.utility"))
    assert "env = dict(os.environ)" in source


def test_remote_reward_not_ready_is_an_index_error_upstream(monkeypatch):
    """Defect 7, worked around by ``patch_remote_reward_not_ready``: a not-ready head of queue
    makes upstream's ``get_results`` raise ``IndexError`` and leave the queue as it was."""
    from queue import Queue

    import requests
    from cosmos_rl.reward.remote_calculator import RemoteRewardCalculator

    def not_ready(uuid, is_validation):
        raise requests.HTTPError("400 Client Error: not ready")

    calculator = RemoteRewardCalculator.__new__(RemoteRewardCalculator)
    calculator.uuid2stage = {"u1": "training"}
    monkeypatch.setattr(calculator, "fetch_reward", not_ready, raising=False)
    queue: Queue = Queue()
    queue.put("u1")
    upstream = getattr(RemoteRewardCalculator.get_results, "__wrapped__", RemoteRewardCalculator.get_results)
    with pytest.raises(IndexError):
        upstream(calculator, queue)
    assert list(queue.queue) == ["u1"]


def test_diffuser_model_init_order_the_sana_adapter_relies_on():
    """``SanaModel`` overrides ``load_models_from_hf`` and ``apply_lora`` and sets the attributes
    they read before calling ``DiffuserModel.__init__``, which must call them in this order."""
    from cosmos_rl.policy.model.diffusers import DiffuserModel

    source = inspect.getsource(DiffuserModel.__init__)
    order = [source.index(call) for call in ("self.load_models_from_hf(", "self.apply_lora(", "self.init_output_process(")]
    assert order == sorted(order)
    assert "self.offload = self.config.offload" in source


def test_no_default_packer_for_diffusers_upstream():
    """``register_data_packers`` fills this gap; if upstream ships one, revisit it."""
    from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker

    assert "allow_override" in inspect.signature(BaseDataPacker.register).parameters
    registered = BaseDataPacker._MODEL_TO_DEFAULT_DATA_PACKER_REGISTRY.get("diffusers")
    assert registered is None or registered.__module__.startswith("cosmos_sana_plugins")


def test_register_all_puts_our_components_into_upstream_registries():
    from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker
    from cosmos_rl.policy.model.base import ModelRegistry
    from cosmos_rl.policy.trainer.base import TrainerRegistry
    from cosmos_rl.rollout.rollout_base import RolloutRegistry

    from cosmos_sana.plugin_manager import installed_plugins

    registry = installed_plugins()
    compat.register_all(registry)
    assert ModelRegistry._MODEL_REGISTRY["SanaPipeline"].__module__ == "cosmos_sana_plugins.sana.model"
    assert ModelRegistry._MODEL_REGISTRY["SanaVideoPipeline"].__module__ == "cosmos_sana_plugins.sana.model"
    for entry in registry.entries("trainer"):
        assert TrainerRegistry.check_trainer_type_supported(entry.spec.trainer_type)
    for entry in registry.entries("rollout"):
        assert RolloutRegistry.check_rollout_type_supported(entry.spec.name)
    assert type(BaseDataPacker.get_default_data_packer("diffusers")).__name__ == "SanaDataPacker"


def test_controller_reads_these_train_report_keys():
    import re

    source = inspect.getsource(importlib.import_module("cosmos_rl.dispatcher.status"))
    required = set(re.findall(r'data\["(train/[a-z_]+)"\] for data in reports', source))
    required |= set(re.findall(r'reports\[0\]\["(train/[a-z_]+)"\]', source))
    assert required == compat.CONTROLLER_REPORT_KEYS
