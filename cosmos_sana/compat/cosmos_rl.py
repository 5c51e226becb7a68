"""Glue into cosmos-rl 0.4.7 internals. Every upstream internal we touch is named here.

Pinned by ``tests/test_compat_upstream.py``: if cosmos-rl renames or reshapes any
of these, that test fails before a user's run does.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import types
from typing import Any

from cosmos_sana.log import get_logger
from cosmos_sana.plugin_manager import PluginRegistry

logger = get_logger(__name__)

UPSTREAM_VERSION = "0.4.7"
#: Worker-entry keyword arguments cosmos-sana fills (cosmos_rl.launcher.worker_entry.main).
WORKER_ENTRY_KWARGS = (
    "dataset",
    "val_dataset",
    "data_packer",
    "val_data_packer",
    "reward_fns",
    "val_reward_fns",
    "args",
)
#: what the Controller role passes to cosmos-rl's controller main (cosmos_rl.dispatcher.run_web_panel.main);
#: worker_entry.main does not forward ``resume_adapter``
CONTROLLER_KWARGS = (*WORKER_ENTRY_KWARGS, "sampler", "resume_adapter")

#: keys cosmos-rl's controller reads from every colocated train report (a missing one is a
#: KeyError in ``status.train_ack`` and the step's metrics are lost)
CONTROLLER_REPORT_KEYS = frozenset(
    {"train/loss_avg", "train/loss_max", "train/learning_rate", "train/iteration_time"}
)

_registered_into: set[int] = set()


def upstream_version() -> str:
    from importlib.metadata import version

    return version("cosmos-rl")


def cosmos_config_class() -> type:
    """cosmos-rl's ``Config``; its import prints model auto-discovery lines on stdout,
    which would corrupt our commands' output, so they are swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        from cosmos_rl.policy.config import Config
    return Config


@contextlib.contextmanager
def package_bodies_deferred() -> Any:
    """Within the block, cosmos-rl's package bodies run only when a name they define is asked for
    (:func:`cosmos_sana.compat.autoload.defer_cosmos_rl_package_bodies`), so ``cosmos_rl.policy.config``
    imports pydantic and two small modules instead of all of cosmos-rl (torch, transformers,
    diffusers, every trainer and model): ``cosmos-sana validate`` reports a recipe's key and value
    errors before paying for those imports, which only its policy-worker start-up check needs. The
    deferral changes when imports happen, not what they do (``tests/test_compat_upstream.py``); a
    package imported inside the block keeps its deferred body afterwards."""
    from cosmos_sana.compat.autoload import DeferredPackageFinder

    if any(isinstance(finder, DeferredPackageFinder) for finder in sys.meta_path):
        yield  # the process already defers them (the fast start-up's launch-only processes)
        return
    finder = DeferredPackageFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def register_models(registry: PluginRegistry) -> None:
    """Our model adapters take over their pipeline names in ``ModelRegistry``.

    Upstream keys diffusers models by ``model_index.json`` ``_class_name``; an
    override must reuse ``DiffuserModelWeightMapper`` (a new mapper class raises
    half-way through upstream's registration).
    """
    from cosmos_rl.policy.model.base import ModelRegistry
    from cosmos_rl.policy.model.diffusers.weight_mapper import DiffuserModelWeightMapper

    for entry in registry.entries("model"):
        model_cls = entry.spec.load()
        declared = set(entry.spec.pipeline_classes)
        served = model_cls.supported_model_types()
        served = {served} if isinstance(served, str) else set(served)
        if declared and declared != served:
            raise RuntimeError(
                f"model {entry.spec.name!r} ({entry.distribution}) declares pipelines {sorted(declared)} "
                f"but its class serves {sorted(served)}"
            )
        ModelRegistry.register(DiffuserModelWeightMapper, allow_override=True)(model_cls)


#: cosmos-rl's SFT worker builds trainer ``diffusers_<trainer_type>`` for diffusers models
DIFFUSERS_SFT_PREFIX = "diffusers_"


def register_trainers(registry: PluginRegistry) -> None:
    """Trainers keep their own registry keys; clashing with upstream is an error.

    A ``diffusers_<type>`` trainer is also registered as ``<type>``: every policy worker first
    runs ``PolicyWorkerBase.check_config``, which looks the bare ``trainer_type`` up, before the
    SFT worker adds the prefix. Without the alias an SFT launch dies before it registers with
    the controller, and the launch hangs."""
    from cosmos_rl.policy.trainer.base import TrainerRegistry

    for entry in registry.entries("trainer"):
        key = entry.spec.trainer_type or entry.spec.name
        cls = entry.spec.load()
        TrainerRegistry.register(trainer_type=key)(cls)
        if key.startswith(DIFFUSERS_SFT_PREFIX):
            TrainerRegistry.register(trainer_type=key.removeprefix(DIFFUSERS_SFT_PREFIX))(cls)


def check_policy_worker_config(config: Any) -> None:
    """cosmos-rl's own start-up check of every policy worker (batch divisibility, trainer lookup),
    run before launch; raises ``ValueError`` with upstream's message."""
    from cosmos_rl.policy.worker.base import PolicyWorkerBase
    from cosmos_rl.utils.parallelism import ParallelDims

    par = config.policy.parallelism
    world = par.dp_replicate_size * max(par.dp_shard_size, 1) * par.cp_size * par.tp_size * par.pp_size
    try:
        # check_config reads only these two attributes (pinned in tests/test_compat_upstream.py)
        dims = ParallelDims.from_config_for_analysis(par, world)
        PolicyWorkerBase.check_config(types.SimpleNamespace(config=config, parallel_dims=dims))
    except (AssertionError, TypeError) as exc:
        raise ValueError(str(exc) or type(exc).__name__) from exc


def register_rollouts(registry: PluginRegistry) -> None:
    from cosmos_rl.rollout.rollout_base import RolloutRegistry

    for entry in registry.entries("rollout"):
        RolloutRegistry.register(rollout_type=entry.spec.name)(entry.spec.load())


def register_data_packers(registry: PluginRegistry) -> None:
    """Packers declaring ``model_types`` become cosmos-rl's default for them. Without
    this, diffusers models fall back to an LLM packer (none is registered for
    ``"diffusers"`` upstream)."""
    from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker

    for entry in registry.entries("data_packer"):
        if entry.spec.model_types:
            BaseDataPacker.register(list(entry.spec.model_types), entry.spec.load(), allow_override=True)


def register_tokenizer_loader() -> None:
    """cosmos-rl calls ``AutoTokenizer`` on ``model_name_or_path``, which fails on a
    diffusers pipeline folder; serve the pipeline's own ``tokenizer/`` instead."""
    from cosmos_rl.utils.util import register_tokenizer_loader as upstream_register

    def is_pipeline(path: str) -> bool:
        return os.path.isfile(os.path.join(path, "model_index.json"))

    def load(path: str) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.join(path, "tokenizer"))

    upstream_register(predicate=is_pipeline, loader=load)


#: wait before the next poll when the remote reward server says "not ready"
REMOTE_REWARD_POLL_S = 0.2


def patch_remote_reward_not_ready() -> None:
    """cosmos-rl 0.4.7's ``RemoteRewardCalculator.get_results`` raises ``IndexError`` when the oldest
    queued score is not ready (HTTP 400), which crashes ``report_rollouts``. Answer "nothing
    ready yet" instead — ``(None, False, -1)``, what ``dequeue_rewards_cal`` expects — after a
    short wait. Any other failure is re-raised."""
    import functools
    import time

    from cosmos_rl.reward.remote_calculator import RemoteRewardCalculator

    upstream = RemoteRewardCalculator.get_results
    if getattr(upstream, "_cosmos_sana_patch", False):
        return

    @functools.wraps(upstream)
    def get_results(self: Any, uuids: Any) -> Any:
        head = uuids.queue[0] if not uuids.empty() else None
        try:
            return upstream(self, uuids)
        except IndexError:
            if head is None or uuids.empty() or uuids.queue[0] != head:
                raise
            time.sleep(REMOTE_REWARD_POLL_S)
            return None, False, -1

    get_results._cosmos_sana_patch = True  # type: ignore[attr-defined]
    RemoteRewardCalculator.get_results = get_results


#: longest blocking wait of one ``dequeue_rewards_cal`` call inside ``report_rollouts(block=True)``
REWARD_DEQUEUE_WAIT_S = 0.1
_blocking_report = threading.local()


def patch_blocking_reward_wait() -> None:
    """cosmos-rl 0.4.7's ``report_rollouts(block=True)``, which the colocated loop calls after every
    rollout, polls ``RewardDispatcher.dequeue_rewards_cal`` in a loop without pausing (about a million
    polls a second) until the local reward task ends. That thread then holds the GIL nearly all the
    time, so every thread scoring the rewards (JPEG encoding, the OCR pool's pipe threads, the
    scheduler) waits up to the interpreter's switch interval each time it wants the GIL back: on the
    bench a chunk of 8 images took 0.9 s to score beside the loop instead of 0.38 s
    (bench/README.md, "Where the rest of the reward wait goes"). Inside a blocking report the poll
    now waits for the oldest local reward task itself (a lock wait, up to
    :data:`REWARD_DEQUEUE_WAIT_S`, returning the moment the task ends), so results come as soon as
    before; calls outside a blocking report, and remote rewards, poll as upstream does."""
    import functools
    from concurrent.futures import Future, wait

    from cosmos_rl.reward.dispatcher import RewardDispatcher
    from cosmos_rl.rollout.worker.rollout_control import DisaggregatedRolloutControlWorker

    upstream_dequeue = RewardDispatcher.dequeue_rewards_cal
    if getattr(upstream_dequeue, "_cosmos_sana_patch", False):
        return
    upstream_report = DisaggregatedRolloutControlWorker.report_rollouts

    @functools.wraps(upstream_dequeue)
    def dequeue_rewards_cal(self: Any) -> Any:
        if getattr(_blocking_report, "active", False) and not getattr(self, "is_remote", False):
            head = self.task_queue.queue[0] if not self.task_queue.empty() else None
            if isinstance(head, Future):
                wait([head], timeout=REWARD_DEQUEUE_WAIT_S)
        return upstream_dequeue(self)

    @functools.wraps(upstream_report)
    def report_rollouts(self: Any, block: bool = False) -> Any:
        outer = getattr(_blocking_report, "active", False)
        _blocking_report.active = block
        try:
            return upstream_report(self, block=block)
        finally:
            _blocking_report.active = outer

    dequeue_rewards_cal._cosmos_sana_patch = True  # type: ignore[attr-defined]
    RewardDispatcher.dequeue_rewards_cal = dequeue_rewards_cal
    DisaggregatedRolloutControlWorker.report_rollouts = report_rollouts


#: environment variable: how long (ms) a Redis command read may block; see :func:`patch_command_poll`
COMMAND_POLL_ENV = "COSMOS_SANA_COMMAND_POLL_MS"
DEFAULT_COMMAND_POLL_MS = 20


def command_poll_ms() -> int:
    """The command-read block from :data:`COMMAND_POLL_ENV` (default 20 ms; 0 would block forever)."""
    raw = os.environ.get(COMMAND_POLL_ENV, str(DEFAULT_COMMAND_POLL_MS))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{COMMAND_POLL_ENV}={raw!r}: must be a whole number of milliseconds >= 1")
    return value


def patch_command_poll() -> None:
    """Every colocated RL step waited 10 s for nothing: after the train acknowledgement the loop
    reads the policy's Redis command stream once more (``ColocatedController.wait_for_remote_command``,
    until the rollout's weight-sync command arrives) and that read blocks for
    ``RedisStreamConstant.CMD_READING_TIMEOUT_MS`` = 10 000 ms though the stream is drained. A short
    block keeps the loop responsive; reads are retried by their callers, so nothing is lost."""
    from cosmos_rl.utils.constant import RedisStreamConstant

    RedisStreamConstant.CMD_READING_TIMEOUT_MS = command_poll_ms()


#: environment variable: ``wait`` keeps cosmos-rl's behaviour when a worker fails (the controller stays up)
WORKER_ERROR_ENV = "COSMOS_SANA_ON_WORKER_ERROR"


def worker_failure_exit_code() -> int:
    """The exit status cosmos-rl's launcher treats as fatal for the whole job (its torchrun wrapper
    passes it through); any other failing worker leaves the controller waiting for replicas forever."""
    from cosmos_rl.utils.transport_failure import FATAL_TRANSPORT_EXIT_CODE

    return FATAL_TRANSPORT_EXIT_CODE


def patch_colocated_resume() -> None:
    """cosmos-rl's colocated policy process builds a second ``ControllerDataFetcher`` (its local
    controller) and passes it no resume adapter. On a resume the controller has set
    ``train.resume`` to our checkpoint's path, so that fetcher looks for a cosmos-rl checkpoint
    there and raises ``NoCheckpointFound``, killing the policy. Give it our adapter and sampler
    as well (:func:`~cosmos_sana.checkpoint.controller_resume.controller_resume_kwargs`)."""
    import cosmos_rl.colocated.controller as colocated

    fetcher_cls = colocated.ControllerDataFetcher
    if getattr(fetcher_cls, "_cosmos_sana_patch", False):
        return

    def build(*, config: Any, **kwargs: Any) -> Any:
        from cosmos_sana.checkpoint.controller_resume import controller_resume_kwargs

        for key, value in controller_resume_kwargs(config).items():
            if kwargs.get(key) is None:
                kwargs[key] = value
        return fetcher_cls(config=config, **kwargs)

    build._cosmos_sana_patch = True  # type: ignore[attr-defined]
    colocated.ControllerDataFetcher = build


#: the blind wait at the end of cosmos-rl's ``RLPolicyWorker.handle_shutdown``
UPSTREAM_SHUTDOWN_SLEEP_S = 15
#: how often :func:`wait_for_upstream_threads` looks at the threads
SHUTDOWN_POLL_S = 0.05


def _thread_code_module(thread: Any) -> str:
    """The module of the code a thread runs: its target's, or its class's when it overrides ``run``."""
    target = getattr(thread, "_target", None)
    return getattr(target, "__module__", None) or type(thread).__module__ or ""


def upstream_threads_alive(exclude: Any = None) -> list[Any]:
    """Live threads running cosmos-rl code (besides ``exclude``, the caller)."""
    import threading

    return [
        thread
        for thread in threading.enumerate()
        if thread is not exclude and thread.is_alive() and _thread_code_module(thread).startswith("cosmos_rl")
    ]


def wait_for_upstream_threads(limit_s: float) -> float:
    """Wait until no thread runs cosmos-rl code any more, at most ``limit_s``; returns the seconds waited."""
    import threading
    import time

    started = time.monotonic()
    current = threading.current_thread()
    while upstream_threads_alive(exclude=current) and time.monotonic() - started < limit_s:
        time.sleep(SHUTDOWN_POLL_S)
    return time.monotonic() - started


def patch_shutdown_sleep() -> None:
    """cosmos-rl's ``RLPolicyWorker.handle_shutdown`` joins the worker's threads (``stop_worker_threads``
    and each named thread) and then sleeps 15 s so that its daemon threads can see the shutdown
    signal before the interpreter exits; every launch ended with that wait though the threads had
    already stopped. While ``handle_shutdown`` runs, its one 15 s sleep becomes a poll that ends as
    soon as no thread runs cosmos-rl code, still at most 15 s; any other sleep is unchanged."""
    import functools
    import threading
    import time

    import cosmos_rl.policy.worker.rl_worker as rl_worker

    upstream = rl_worker.RLPolicyWorker.handle_shutdown
    if getattr(upstream, "_cosmos_sana_patch", False):
        return

    class _ShutdownClock:
        """``rl_worker``'s ``time`` while one thread shuts down; other threads sleep as before."""

        def __init__(self, caller: Any) -> None:
            self.caller = caller

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            if threading.current_thread() is self.caller and seconds == UPSTREAM_SHUTDOWN_SLEEP_S:
                waited = wait_for_upstream_threads(seconds)
                alive = [thread.name for thread in upstream_threads_alive(exclude=self.caller)]
                if alive:
                    logger.info("shutdown: cosmos-rl threads %s still running after %.2f s", alive, waited)
                else:
                    logger.info("shutdown: cosmos-rl's threads stopped after %.2f s (upstream waits %d s)", waited, seconds)
                return
            time.sleep(seconds)

    @functools.wraps(upstream)
    def handle_shutdown(self: Any) -> Any:
        rl_worker.time = _ShutdownClock(threading.current_thread())
        try:
            return upstream(self)
        finally:
            rl_worker.time = time

    handle_shutdown._cosmos_sana_patch = True  # type: ignore[attr-defined]
    rl_worker.RLPolicyWorker.handle_shutdown = handle_shutdown


def patch_launcher_controller_wait(launch_all: types.ModuleType) -> None:
    """cosmos-rl's launcher starts the controller, then waits until it answers HTTP
    (``wait_for_url_ready``, polling every second) before it starts any replica, so each replica's
    imports (torch, diffusers, all of cosmos-rl) only begin once the controller's have ended. A
    replica needs the controller only for its first request, which it retries until the controller
    answers (``get_controller_metadata``: every 1–2 s at first). With the controller started here,
    the wait moves to a background thread, and the replicas start at once; the launcher's process
    monitor still stops the whole launch if the controller fails. A controller on another node is
    waited for as before. Called by :mod:`cosmos_sana.compat.autoload` right after the launcher
    module is imported (the ``cosmos-rl`` command)."""
    import threading
    import time

    upstream = launch_all.wait_for_url_ready
    if getattr(upstream, "_cosmos_sana_patch", False):
        return

    def wait_for_url_ready(url: str, process: Any = None) -> None:
        if process is None:
            return upstream(url, process)
        started = time.monotonic()

        def watch() -> None:
            try:
                upstream(url, process)
            except SystemExit:
                return  # upstream logged why; the launcher's process monitor stops the launch
            logger.info("controller at %s answered %.1f s after its start", url, time.monotonic() - started)

        threading.Thread(target=watch, name="cosmos-sana-controller-wait", daemon=True).start()
        logger.info("starting the replicas while the controller at %s starts (they retry until it answers)", url)

    wait_for_url_ready._cosmos_sana_patch = True  # type: ignore[attr-defined]
    launch_all.wait_for_url_ready = wait_for_url_ready


def startup_patches_enabled() -> bool:
    """Whether cosmos-sana's start-up and shutdown patches run: by default they do, and
    ``COSMOS_SANA_FAST_STARTUP=0`` keeps cosmos-rl's own start-up and shutdown unchanged (ValueError
    for a value other than 0 or 1; the launcher has refused one before starting this process)."""
    from cosmos_sana.compat.autoload import fast_startup

    return fast_startup()


#: ``train.fsdp_reshard_after_forward`` → FSDP2's ``reshard_after_forward`` of every sharded module of a
#: diffusers transformer. ``"default"`` keeps what cosmos-rl's diffusers path does (every block and the
#: root reshard after each forward), not the "all but the last layer" of its LLM paths, so a recipe that
#: leaves the key unset runs as before.
RESHARD_AFTER_FORWARD = {"always": True, "default": True, "never": False}


def reshard_after_forward(policy: str) -> bool:
    """FSDP2's ``reshard_after_forward`` for a ``train.fsdp_reshard_after_forward`` value (ValueError naming the key)."""
    if policy not in RESHARD_AFTER_FORWARD:
        raise ValueError(
            f"train.fsdp_reshard_after_forward = {policy!r}: must be one of {sorted(RESHARD_AFTER_FORWARD)}"
        )
    return RESHARD_AFTER_FORWARD[policy]


def parallelize_diffusers(model: Any, parallel_dims: Any, config: Any) -> None:
    """cosmos-rl's FSDP2 sharding of a diffusers model's transformer (``DiffuserModel.parallelize_fn``),
    with ``train.fsdp_reshard_after_forward`` honoured.

    cosmos-rl 0.4.7's diffusers ``apply_fsdp`` takes that setting but passes
    ``reshard_after_forward=True`` to every ``fully_shard`` call, so each forward all-gathers every
    block's weights again (Diffusion-NFT runs three forwards per backward: four all-gathers per block
    and training micro-step). Afterwards every sharded module gets the setting's value; with
    ``"never"`` a module's weights stay gathered from their first forward until the backward after it
    (FSDP2 reshards there) or an explicit ``reshard``."""
    value = reshard_after_forward(config.train.fsdp_reshard_after_forward)
    parallelize, _ = model.parallelize_fn
    parallelize(model, parallel_dims, config, pp_loss_fn=None)
    from torch.distributed.fsdp import FSDPModule

    for module in model.transformer.modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_forward(value, recurse=False)


def reports_rewards(parallel_dims: Any) -> bool:
    """Whether cosmos-rl scores this rank's rollouts: its rollout worker's ``should_report``
    (first TP rank of the last pipeline stage). Other ranks' samples are never rewarded."""
    if parallel_dims is None:
        return True
    pp_rank, pp_size = parallel_dims.pp_coord
    return parallel_dims.tp_coord[0] == 0 and pp_rank == pp_size - 1


def tag_payload_prompt(payload: Any, sample_ids: list[str]) -> None:
    """List the ids of a payload's samples in its prompt, where the reward function finds them.

    cosmos-rl hands the ``RLPayload`` objects it gave ``rollout_generation`` (or shallow copies
    made after it returns) to its reward calculator, which calls reward functions with
    ``prompt=payload.prompt``; ``extra_info`` never reaches them. The prompt is replaced, not
    mutated: it may be the dataset's own dict.
    """
    from cosmos_sana.rewards.ledger import tagged

    payload.prompt = tagged(payload.prompt, sample_ids)


def register_all(registry: PluginRegistry) -> None:
    """Put every plugin component into cosmos-rl's registries (once per registry)."""
    if id(registry) in _registered_into:
        return
    register_models(registry)
    register_trainers(registry)
    register_rollouts(registry)
    register_data_packers(registry)
    register_tokenizer_loader()
    patch_remote_reward_not_ready()
    patch_blocking_reward_wait()
    patch_colocated_resume()
    patch_command_poll()
    if startup_patches_enabled():
        patch_shutdown_sleep()
    _registered_into.add(id(registry))


def run_worker_entry(**kwargs: Any) -> Any:
    """Call cosmos-rl's role dispatcher (Controller / Policy / Rollout / Reference)."""
    from cosmos_rl.launcher.worker_entry import main as worker_main

    unknown = set(kwargs) - set(WORKER_ENTRY_KWARGS)
    if unknown:
        raise TypeError(f"unsupported worker-entry arguments: {sorted(unknown)}")
    on_error = os.environ.get(WORKER_ERROR_ENV, "stop")
    if on_error not in ("stop", "wait"):
        raise ValueError(f"{WORKER_ERROR_ENV}={on_error!r}: use 'stop' (the default) or 'wait'")
    if on_error == "wait":
        return worker_main(**kwargs)
    try:
        return worker_main(**kwargs)
    except Exception:
        # a crashed replica otherwise leaves `cosmos-rl` running with nothing to train
        logger.exception(
            "worker failed; stopping the whole launch (set %s=wait to keep the controller up)", WORKER_ERROR_ENV
        )
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(worker_failure_exit_code())


def controller_config() -> tuple[Any, Any]:
    """``(args, Config)`` of the Controller role, read as cosmos-rl's controller main reads them."""
    from cosmos_rl.dispatcher.data.packer.base import worker_entry_parser

    from cosmos_sana.config.recipe_file import read_toml

    args = worker_entry_parser().parse_args()
    if args.config is None:
        raise SystemExit("cosmos-rl controller: --config X.toml is required")
    return args, cosmos_config_class().from_dict(read_toml(args.config))


def run_controller(**kwargs: Any) -> Any:
    """The Controller role: cosmos-rl's controller main, called directly because
    ``worker_entry.main`` drops ``resume_adapter``."""
    from cosmos_rl.dispatcher.run_web_panel import main as controller_main

    unknown = set(kwargs) - set(CONTROLLER_KWARGS)
    if unknown:
        raise TypeError(f"unsupported controller arguments: {sorted(unknown)}")
    return controller_main(**kwargs)
