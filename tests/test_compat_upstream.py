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
import torch

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
    """Worked around by ``patch_remote_reward_not_ready``: a not-ready head of queue
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


def test_colocated_step_reads_the_drained_policy_stream_with_the_command_block():
    """Worked around by ``patch_command_poll``: waiting for the rollout's weight-sync command, the
    colocated controller first reads the policy's command stream, a Redis read that blocks for
    ``CMD_READING_TIMEOUT_MS`` (10 s upstream) when the stream is empty, once every step."""
    import re

    constant = inspect.getsource(importlib.import_module("cosmos_rl.utils.constant"))
    assert re.search(r"CMD_READING_TIMEOUT_MS = 10 \* 1000\b", constant)
    from cosmos_rl.colocated.controller import ColocatedController
    from cosmos_rl.utils.redis_stream import RedisStreamHandler

    wait = inspect.getsource(ColocatedController.wait_for_remote_command)
    assert "if replica is self.rollout:" in wait and "self.policy.subscribe_remote_commands()" in wait
    assert "block=RedisStreamConstant.CMD_READING_TIMEOUT_MS" in inspect.getsource(RedisStreamHandler.subscribe_command)


def test_only_the_fatal_exit_code_stops_a_launch_when_a_worker_fails():
    """Why a failing worker exits with ``worker_failure_exit_code``: for any other status the
    launcher leaves the controller up for other replicas (a hang with one replica)."""
    from cosmos_rl.launcher import launch_all, torchrun

    monitor = inspect.getsource(launch_all._monitor_processes)
    assert "rc != FATAL_TRANSPORT_EXIT_CODE" in monitor and "pending.remove(process)" in monitor
    assert "raise SystemExit(FATAL_TRANSPORT_EXIT_CODE)" in inspect.getsource(torchrun.main)
    assert compat.worker_failure_exit_code() == 86


def test_policy_workers_check_the_bare_trainer_type_but_sft_builds_the_prefixed_one():
    """Why ``register_trainers`` adds the bare alias of ``diffusers_*`` trainers, and why
    ``check_policy_worker_config`` can run the check on a namespace of two attributes."""
    import re

    from cosmos_rl.policy.worker.base import PolicyWorkerBase
    from cosmos_rl.policy.worker.sft_worker import SFTPolicyWorker

    check = inspect.getsource(PolicyWorkerBase.check_config)
    assert "TrainerRegistry.get_trainer_cls(trainer_type)" in check
    assert set(re.findall(r"self\.(\w+)", check)) == {"config", "parallel_dims"}
    assert '"diffusers_" + trainer_type' in inspect.getsource(SFTPolicyWorker)
    assert "self.check_config()" in inspect.getsource(PolicyWorkerBase.__init__)


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


def test_controller_main_takes_the_resume_adapter_the_worker_entry_drops():
    """Why the Controller role calls ``run_controller``: ``worker_entry.main`` swallows
    ``resume_adapter`` in ``**kwargs``. If it forwards it one day, the plain worker entry will do."""
    from cosmos_rl.dispatcher.data.packer.base import worker_entry_parser
    from cosmos_rl.dispatcher.run_web_panel import main as controller_main
    from cosmos_rl.launcher.worker_entry import main as worker_main

    assert set(compat.CONTROLLER_KWARGS) <= set(inspect.signature(controller_main).parameters)
    assert "resume_adapter" not in inspect.getsource(worker_main)
    assert vars(worker_entry_parser().parse_args(["--config", "x.toml"]))["config"] == "x.toml"


def test_controller_resume_adapter_contract():
    """What ``SanaControllerResume`` fills and when cosmos-rl's fetcher calls it: the sampler is
    built before ``load_metadata`` (which reads the train-set size from it), restored after."""
    from cosmos_rl.dispatcher.data.data_fetcher import ControllerDataFetcher
    from cosmos_rl.dispatcher.data.resume import ControllerResumeMetadata

    assert {"sampler", "resume_adapter"} <= set(inspect.signature(ControllerDataFetcher.__init__).parameters)
    assert set(ControllerResumeMetadata.model_fields) == {
        "schema_version", "checkpoint_path", "checkpoint_id", "completed_training_steps",
        "completed_optimizer_updates", "remaining_completions", "epoch", "sampling_owner", "sampler_state",
    }
    source = inspect.getsource(ControllerDataFetcher.load_dataset)
    assert source.index("self.sampler(") < source.index(".load_metadata(") < source.index(".restore_sampler(")


def test_colocated_controller_builds_its_fetcher_without_a_resume_adapter():
    """Why ``patch_colocated_resume`` exists (it needs ``config=`` passed by keyword); if upstream
    passes an adapter here one day, the patch can go."""
    import cosmos_rl.colocated.controller as colocated

    source = inspect.getsource(colocated.ColocatedController.setup)
    assert "ControllerDataFetcher(" in source and "config=config" in source
    assert "resume_adapter" not in source


def test_rollout_worker_rewards_only_the_reporting_rank():
    """``reports_rewards`` mirrors the rollout worker's ``should_report``; samples of other ranks are
    never rewarded, so the ``sana`` rollout does not submit them for scoring."""
    from cosmos_rl.rollout.worker.rollout_control import DisaggregatedRolloutControlWorker

    source = inspect.getsource(DisaggregatedRolloutControlWorker)
    assert "self.should_report = self.parallel_dims.tp_coord[0] == 0 and (" in source
    assert "self.parallel_dims.pp_coord[0] == self.parallel_dims.pp_coord[1] - 1" in source


def test_rollout_payloads_are_the_ones_rewarded():
    """``tag_payload_prompt`` relies on this: the payload objects given to ``rollout_generation`` are
    the ones (or shallow copies of the ones) cosmos-rl scores, in training and in validation."""
    import re

    from cosmos_rl.rollout.worker.rollout_control import DisaggregatedRolloutControlWorker as Worker

    generation = inspect.getsource(Worker.one_step_generation)
    assert "payloads=payloads_list" in generation
    assert re.search(r"_filter_valid_rollout_results_and_report\(\s*rollout_results, payloads_list\s*\)", generation)
    validation = inspect.getsource(Worker.do_validation)
    assert "payloads=payloads_list" in validation and "validation_payloads.extend(payloads_list)" in validation


@pytest.mark.parametrize("grouped", [False, True], ids=["per-sample", "group"])
def test_reward_fns_get_the_tagged_prompt_and_the_completions_own_rows(grouped):
    """What the async reward path matches on: after cosmos-rl's payload plumbing, a reward function
    gets ``prompt=`` the tagged prompt and all of the rollout's completions in generation order,
    the group in one call or one completion per call."""
    import torch
    from cosmos_rl.dispatcher.algo.reward import Reward
    from cosmos_rl.dispatcher.data.schema import RLPayload
    from cosmos_rl.reward.admission import apply_rollout_result_to_payload
    from cosmos_rl.reward.reservations import select_training_slots
    from cosmos_rl.rollout.schema import RolloutResult

    completions = torch.rand(2, 3, 4, 4)
    payload = RLPayload(prompt={"prompt": "p", "metadata": {}}, prompt_idx=0)
    result = RolloutResult(prompt=payload.prompt, completions=completions, completion_trainable=[True, True])
    compat.tag_payload_prompt(payload, ["a", "b"])
    payload = select_training_slots(payload, [0, 1])
    apply_rollout_result_to_payload(payload, result, include_completed_conversations=False)
    config = compat.cosmos_config_class().from_dict(
        {"train": {"output_dir": "unused", "non_text": True,
                   "train_policy": {"type": "grpo", "group_reward_calculation": grouped}}}
    )
    seen: list = []

    def reward_fn(completion, reference, prompt=None, **kwargs):
        seen.append((completion, prompt))
        return [0.0] * len(completion) if grouped else 0.0

    Reward(config, None, explicit_reward_fn=[reward_fn]).compute_reward(payload.completions, "", prompt=payload.prompt)
    assert all(prompt["cosmos_sana_sample_ids"] == ["a", "b"] for _, prompt in seen)
    assert len(seen) == (1 if grouped else len(completions))
    given = list(seen[0][0]) if grouped else [completion for completion, _ in seen]
    assert len(given) == len(completions) and all(torch.equal(c, row) for c, row in zip(given, completions))


@pytest.mark.parametrize("package", autoload.DEFERRED_PACKAGES)
def test_deferred_package_bodies_only_import_and_define(package):
    """Why ``defer_cosmos_rl_package_bodies`` changes nothing but when imports happen: these package
    bodies import modules and define names, and register nothing themselves."""
    import ast

    body = ast.parse(Path(importlib.util.find_spec(package).origin).read_text()).body
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.If)
    assert all(isinstance(node, allowed) for node in body), [ast.dump(n)[:80] for n in body if not isinstance(n, allowed)]
    for node in body:
        if isinstance(node, ast.Assign):
            assert [target.id for target in node.targets] == ["__all__"]
        if isinstance(node, ast.If):
            assert ast.unparse(node.test) == "__name__ == '__main__'"


def test_launch_only_processes_start_what_autoload_recognises():
    """The torchrun wrapper needs one constant module at import; the replica script starts it with
    ``python -m`` (the form :func:`autoload.activate` recognises); the launcher's imports are plain
    module imports, whose package bodies the deferral leaves for later."""
    import ast

    wrapper = Path(importlib.util.find_spec(autoload.TORCHRUN_WRAPPER_MODULE).origin).read_text()
    top = [node for node in ast.parse(wrapper).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in top] == [
        "from cosmos_rl.utils.transport_failure import FATAL_TRANSPORT_EXIT_CODE"
    ]
    replica = (Path(importlib.util.find_spec("cosmos_rl.launcher").origin).parent / "launch_replica.sh").read_text()
    assert f"LAUNCH_CMD=(python -m {autoload.TORCHRUN_WRAPPER_MODULE})" in replica


def test_policy_shutdown_ends_with_a_blind_15_s_sleep():
    """Why ``patch_shutdown_sleep`` exists: ``RLPolicyWorker.handle_shutdown`` joins the worker's
    threads, then sleeps a fixed 15 s (through its module's ``time``) as its last statement."""
    import ast
    import textwrap
    import time

    import cosmos_rl.policy.worker.rl_worker as rl_worker

    assert rl_worker.time is time
    upstream = getattr(rl_worker.RLPolicyWorker.handle_shutdown, "__wrapped__", rl_worker.RLPolicyWorker.handle_shutdown)
    source = textwrap.dedent(inspect.getsource(upstream))
    assert source.count("time.sleep(") == 1
    guarded = ast.parse(source).body[0].body[-1]  # `if not hasattr(self, "_handle_shutdown_called"):`
    assert ast.unparse(guarded.body[-1]) == f"time.sleep({compat.UPSTREAM_SHUTDOWN_SLEEP_S})"
    assert source.index("stop_worker_threads(self)") < source.index("time.sleep(")
    import threading

    assert threading.Thread(target=print)._target is print  # what ``upstream_threads_alive`` reads


def test_launcher_waits_for_the_controller_before_any_replica_and_replicas_retry():
    """Why ``patch_launcher_controller_wait`` is safe: the launcher's only wait for its own controller
    comes before it starts the replicas; its process monitor stops everything when the controller
    fails; each replica's first request to the controller is retried."""
    from cosmos_rl.dispatcher.api.client import APIClient
    from cosmos_rl.launcher import launch_all
    from cosmos_rl.policy import policy_entry

    main = inspect.getsource(launch_all.main)
    assert main.count("wait_for_url_ready(") == 1
    wait = main.index("wait_for_url_ready(")
    assert "controller_process[0] if controller_cmd is not None else None" in main[wait:wait + 200]
    assert wait < main.index("processes.extend(launch_processes(command_collections))")
    assert "sys.exit(process.returncode)" in inspect.getsource(launch_all.wait_for_url_ready)
    monitor = inspect.getsource(launch_all._monitor_processes)
    assert "and process is not controller" in monitor and "victim.kill()" in monitor
    entry = inspect.getsource(policy_entry.policy_entry)
    assert entry.index("get_controller_metadata()") < entry.index("init_distributed()")
    assert "make_request_with_retry(" in inspect.getsource(APIClient.get_controller_metadata)


class _TwoBlocks(torch.nn.Module):
    """What upstream's diffusers ``apply_fsdp`` reads of a transformer: blocks named in ``_no_split_modules``."""

    _no_split_modules = ["Linear"]
    _skip_layerwise_casting_patterns: list[str] = []

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        self.scale = torch.nn.Parameter(torch.ones(4))  # a root weight, as SANA's scale_shift_table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x) * self.scale


def _resharded(module: torch.nn.Module) -> bool:
    """FSDP2 registers the sharded DTensors while a module is resharded, plain tensors while it is gathered."""
    from torch.distributed.tensor import DTensor

    return all(isinstance(p, DTensor) for p in module.parameters(recurse=False))


@pytest.mark.parametrize("policy", ["never", "always", "default"])
def test_diffusers_apply_fsdp_reshards_after_every_forward_whatever_the_setting(policy):
    """Why ``parallelize_diffusers`` sets ``reshard_after_forward`` itself: cosmos-rl's diffusers
    ``apply_fsdp`` takes ``train.fsdp_reshard_after_forward`` and ignores it, so after every forward
    each sharded module (blocks and root) is resharded and the next forward gathers it again. Once
    this fails for ``"never"``, upstream honours the setting and the loop in
    ``parallelize_diffusers`` can go; the last check shows what that loop changes."""
    import torch.distributed as dist
    from cosmos_rl.policy.model.diffusers.parallelize import apply_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = _TwoBlocks()
        apply_fsdp(model, init_device_mesh("cpu", (1,)), torch.float32, torch.float32, pp_enabled=False,
                   reshard_after_forward_policy=policy)
        modules = [model, *model.blocks]
        with torch.no_grad():
            model(torch.ones(2, 4))
        assert all(_resharded(m) for m in modules), f"{policy!r}: upstream no longer reshards after every forward"
        for module in modules:
            module.set_reshard_after_forward(compat.reshard_after_forward(policy), recurse=False)
        with torch.no_grad():
            model(torch.ones(2, 4))
        assert [_resharded(m) for m in modules] == [compat.reshard_after_forward(policy)] * 3
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("policy", "expected"), [("always", True), ("default", True), ("never", False)])
def test_reshard_policy_values(policy, expected):
    assert compat.reshard_after_forward(policy) is expected


def test_reshard_policy_names_the_key():
    with pytest.raises(ValueError, match=r"train.fsdp_reshard_after_forward = 'sometimes'"):
        compat.reshard_after_forward("sometimes")


def test_reshard_policy_values_are_upstreams_choices():
    from cosmos_rl.policy.config import TrainingConfig

    field = TrainingConfig.model_fields["fsdp_reshard_after_forward"]
    assert set(field.json_schema_extra["choices"]) == set(compat.RESHARD_AFTER_FORWARD)
    assert field.default == "default"


def test_upstream_config_imports_only_pydantic_and_two_modules_when_package_bodies_wait():
    """Why ``package_bodies_deferred`` lets ``cosmos-sana validate`` check a recipe's keys without
    cosmos-rl's heavy imports: ``cosmos_rl.policy.config`` needs none of the package bodies, and
    besides pydantic imports just ``cosmos_rl.utils.logging`` and ``cosmos_rl.utils.modelscope``."""
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys\n"
        "from cosmos_sana.compat.cosmos_rl import package_bodies_deferred\n"
        "with package_bodies_deferred():\n"
        "    from cosmos_rl.policy.config import Config\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('cosmos_rl', 'torch'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [
        "cosmos_rl", "cosmos_rl.policy", "cosmos_rl.policy.config", "cosmos_rl.utils", "cosmos_rl.utils.logging",
        "cosmos_rl.utils.modelscope",
    ]
