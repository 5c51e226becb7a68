"""Start-up and shutdown of a launch: what the launch-only processes import, the shutdown wait, and the
start-up bench's log split."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cosmos_sana.compat import autoload
from cosmos_sana.compat import cosmos_rl as compat

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_startup.py"
OURS = '[train]\noutput_dir = "{out}"\n[custom]\npackage = "cosmos-sana"\n'


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_")}
    env.update(extra)
    return env


def _flagged_worker_env(**extra: str) -> dict[str, str]:
    """A worker of our recipe's launch with the default start-up (the patches on)."""
    return _clean_env(COSMOS_ROLE="Policy", **{autoload.ENV_FLAG: "1"}, **extra)


@pytest.fixture
def ours(tmp_path: Path) -> Path:
    path = tmp_path / "ours.toml"
    path.write_text(OURS.format(out=tmp_path / "out"))
    return path


@pytest.fixture
def restore_meta_path():
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = before


STARTUP_FINDERS = (autoload.DeferredPackageFinder, autoload.PostImportPatchFinder)


def _startup_finders() -> list[type]:
    return [type(finder) for finder in sys.meta_path if isinstance(finder, STARTUP_FINDERS)]


def test_launch_only_processes_defer_the_package_bodies_unless_switched_off(ours: Path, restore_meta_path) -> None:
    launcher = [sys.executable, "/venv/bin/cosmos-rl", "--config", str(ours)]
    wrapper = [sys.executable, "-m", autoload.TORCHRUN_WRAPPER_MODULE, "--nproc-per-node=1", "-m", "x"]
    worker = {"COSMOS_ROLE": "Policy", autoload.ENV_FLAG: "1"}
    # by default (unset, empty) and with 1 the patches are on
    for fast in ({}, {autoload.FAST_STARTUP_FLAG: ""}, {autoload.FAST_STARTUP_FLAG: "1"}):
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, STARTUP_FINDERS)]
        assert autoload.activate(launcher, dict(fast)) == "launcher-flagged"
        assert _startup_finders() == [autoload.PostImportPatchFinder, autoload.DeferredPackageFinder]
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, STARTUP_FINDERS)]
        assert autoload.activate(wrapper, {**worker, **fast}) == "deferred-package-bodies"
        assert _startup_finders() == [autoload.DeferredPackageFinder]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, STARTUP_FINDERS)]
    # with 0, and for a process that is not a worker of our recipe, upstream's start-up is untouched
    off = {autoload.FAST_STARTUP_FLAG: "0"}
    assert autoload.activate(wrapper, {**worker, **off}) == "inactive"
    assert autoload.activate(launcher, dict(off)) == "launcher-flagged"
    assert _startup_finders() == []
    assert autoload.activate(wrapper, {"COSMOS_ROLE": "Policy"}) == "inactive"
    assert _startup_finders() == []


@pytest.mark.parametrize("value", ["true", "yes", "2", " 1", "off"])
def test_a_launch_only_process_refuses_any_other_value_of_the_flag(ours: Path, restore_meta_path, monkeypatch,
                                                                   value: str) -> None:
    """In the launcher and the torchrun wrapper the check runs at interpreter start, where it stops the
    process with a message (here recorded instead of exiting) rather than picking a side."""
    refused: list[str] = []

    def record(message: str) -> None:
        refused.append(message)
        raise SystemExit(2)

    monkeypatch.setattr(autoload, "_refuse", record)
    bad = {autoload.FAST_STARTUP_FLAG: value}
    launcher = [sys.executable, "/venv/bin/cosmos-rl", "--config", str(ours)]
    wrapper = [sys.executable, "-m", autoload.TORCHRUN_WRAPPER_MODULE, "--nproc-per-node=1", "-m", "x"]
    env = dict(bad)
    with pytest.raises(SystemExit):
        autoload.activate(launcher, env)
    assert autoload.ENV_FLAG not in env  # refused before flagging any child
    with pytest.raises(SystemExit):
        autoload.activate(wrapper, {"COSMOS_ROLE": "Policy", autoload.ENV_FLAG: "1", **bad})
    expected = (f"cosmos-sana: COSMOS_SANA_FAST_STARTUP={value!r}: use 0 (cosmos-rl's own start-up and shutdown) "
                "or 1 (cosmos-sana's start-up patches, also what unset means)\n")
    assert refused == [expected, expected]
    assert _startup_finders() == []


def test_the_cosmos_rl_command_with_a_bad_flag_stops_before_starting_anything(ours: Path) -> None:
    """The real ``cosmos-rl`` entry (the autoload runs from its ``.pth``): status 2, the message, no usage text."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "cosmos-rl"), "--config", str(ours), "--help"],
        env=_clean_env(**{autoload.FAST_STARTUP_FLAG: "true"}), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "COSMOS_SANA_FAST_STARTUP='true': use 0" in out.stderr and "usage:" not in out.stdout


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("", True), ("1", True), ("0", False)])
def test_the_shutdown_patch_is_applied_unless_switched_off(monkeypatch, value: str | None, enabled: bool) -> None:
    if value is None:
        monkeypatch.delenv(autoload.FAST_STARTUP_FLAG, raising=False)
    else:
        monkeypatch.setenv(autoload.FAST_STARTUP_FLAG, value)
    assert compat.startup_patches_enabled() is enabled


def test_a_worker_with_a_bad_flag_raises_naming_it(monkeypatch) -> None:
    monkeypatch.setenv(autoload.FAST_STARTUP_FLAG, "on")
    with pytest.raises(ValueError, match=r"^COSMOS_SANA_FAST_STARTUP='on': use 0 .* or 1 "):
        compat.startup_patches_enabled()


PROBE = """
import contextlib, io, json, sys
from cosmos_sana.compat import autoload
autoload.defer_cosmos_rl_package_bodies()
from cosmos_rl.launcher.torchrun import FATAL_TRANSPORT_EXIT_CODE
seen = {"code": FATAL_TRANSPORT_EXIT_CODE, "after_wrapper": sorted(m for m in ("torch", "cosmos_rl.policy", "cosmos_rl.launcher.worker_entry") if m in sys.modules)}
import cosmos_rl.launcher
cosmos_rl.launcher.launch  # a name the launcher package body defines: the body runs now
seen["after_launch_name"] = "cosmos_rl.launcher.worker_entry" in sys.modules
with contextlib.redirect_stdout(io.StringIO()):
    names = cosmos_rl.__all__  # the root body runs now, model auto-discovery included
seen["after_root_name"] = "simulators" in names and "cosmos_rl.policy.model" in sys.modules and "cosmos_rl.rollout" in sys.modules
try:
    cosmos_rl.no_such_name
except AttributeError as exc:
    seen["missing"] = str(exc)
print(json.dumps(seen))
"""


def test_deferred_bodies_import_only_named_modules_and_run_when_a_name_is_asked() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["code"] == 86
    assert seen["after_wrapper"] == []  # the torchrun wrapper needs one constant, not torch or the policy
    assert seen["after_launch_name"] is True
    assert seen["after_root_name"] is True
    assert seen["missing"] == "module 'cosmos_rl' has no attribute 'no_such_name'"


def test_torchrun_wrapper_runs_workers_and_passes_the_fatal_status_with_deferred_bodies(tmp_path: Path) -> None:
    """The wrapper as cosmos-rl's replica script starts it, flagged for our recipe: a worker runs, a worker
    exiting with the fatal transport status stops it with that status, and it never imported the policy."""
    wrapper = [sys.executable, "-m", autoload.TORCHRUN_WRAPPER_MODULE, "--standalone", "--nproc-per-node=1"]
    env = _flagged_worker_env(PYTHONPROFILEIMPORTTIME="1")
    ok = subprocess.run([*wrapper, "-m", "this"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "Beautiful is better than ugly." in ok.stdout
    assert "cosmos_rl.utils.transport_failure" in ok.stderr and "cosmos_rl.policy" not in ok.stderr
    fatal = subprocess.run(
        [*wrapper, "--no-python", "sh", "-c", "exit 86"], env=_flagged_worker_env(), capture_output=True,
        text=True, timeout=120, cwd=tmp_path,
    )
    assert fatal.returncode == 86, fatal.stderr[-3000:]


def test_launcher_arguments_are_the_same_with_deferred_bodies(ours: Path) -> None:
    def help_text(**extra: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", autoload.LAUNCHER_MODULE, "--config", str(ours), "--help"],
            env=_clean_env(**extra), capture_output=True, text=True, timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    deferred, eager = help_text(), help_text(**{autoload.FAST_STARTUP_FLAG: "0"})
    assert "Auto-discovering" in eager and "Auto-discovering" not in deferred  # no model discovery here
    assert deferred.startswith("usage: ") and "--config" in deferred and "--log-dir" in deferred
    assert eager[eager.index("usage: "):] == deferred


# ----------------------------------------------------------------------------- shutdown wait


def _lingering_upstream_thread(stop: threading.Event, linger_s: float) -> threading.Thread:
    """A thread running code of a ``cosmos_rl`` module that ends ``linger_s`` after ``stop`` is set."""

    def run() -> None:
        stop.wait()
        time.sleep(linger_s)

    run.__module__ = "cosmos_rl.background"
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_ends_when_upstream_threads_end_and_ignores_others() -> None:
    stop, forever = threading.Event(), threading.Event()
    other = threading.Thread(target=forever.wait, daemon=True)  # not cosmos-rl code: not waited for
    other.start()
    try:
        upstream = _lingering_upstream_thread(stop, 0.3)
        assert upstream in compat.upstream_threads_alive() and other not in compat.upstream_threads_alive()
        stop.set()
        waited = compat.wait_for_upstream_threads(15)
        assert 0.2 < waited < 3 and not upstream.is_alive()
        stuck = _lingering_upstream_thread(forever, 0)
        assert 0.3 <= compat.wait_for_upstream_threads(0.3) < 2 and stuck.is_alive()  # bounded by the limit
    finally:
        forever.set()
    stuck.join(5)


def _stub_worker_class():
    from cosmos_rl.policy.worker.rl_worker import RLPolicyWorker

    class StubWorker(RLPolicyWorker):
        """Just the state upstream's ``handle_shutdown`` reads, its teardown calls recorded."""

        def __init__(self) -> None:  # no model, no process group
            self.calls: list[str] = []
            self.payload_prefetch = None
            self.trainer = None
            self.shutdown_signal = threading.Event()
            self.shutdown_mp_signal = threading.Event()
            self.inter_policy_nccl = type("Nccl", (), {"shutdown": lambda _: self.calls.append("nccl")})()
            self.fetch_rollouts_thread = self.fetch_command_thread = None
            self.teacher_interact_thread = self.heartbeat_thread = None

        def _shutdown_payload_data_packers(self) -> None:
            self.calls.append("packers")

        def destroy_worker(self) -> None:
            self.calls.append("destroy")

        def unregister_from_controller(self) -> None:
            self.calls.append("unregister")

    return StubWorker


def test_policy_shutdown_waits_for_upstream_threads_not_15_s(caplog) -> None:
    import cosmos_rl.policy.worker.rl_worker as rl_worker

    compat.patch_shutdown_sleep()
    worker = _stub_worker_class()()
    lingering = _lingering_upstream_thread(worker.shutdown_signal, 0.5)
    started = time.monotonic()
    with caplog.at_level("INFO", logger="cosmos_sana"):
        worker.handle_shutdown()
    took = time.monotonic() - started
    assert 0.4 < took < 5, took
    assert not lingering.is_alive()
    assert worker.calls == ["packers", "nccl", "destroy", "unregister"]  # upstream's teardown, in its order
    assert "cosmos-rl's threads stopped after" in caplog.text
    assert rl_worker.time is time  # the module's clock is restored
    compat.patch_shutdown_sleep()  # idempotent
    assert getattr(rl_worker.RLPolicyWorker.handle_shutdown, "_cosmos_sana_patch", False)


def test_other_threads_keep_their_sleeps_during_shutdown() -> None:
    import cosmos_rl.policy.worker.rl_worker as rl_worker

    compat.patch_shutdown_sleep()
    worker = _stub_worker_class()()
    slept: list[float] = []
    ready = threading.Event()

    def other_thread_sleeps() -> None:  # another thread runs rl_worker code during the shutdown
        ready.wait()
        started = time.monotonic()
        rl_worker.time.sleep(compat.UPSTREAM_SHUTDOWN_SLEEP_S / 30)
        slept.append(time.monotonic() - started)

    original_unregister = worker.unregister_from_controller

    def unregister_while_other_sleeps() -> None:
        ready.set()
        other.join()
        original_unregister()

    worker.unregister_from_controller = unregister_while_other_sleeps
    other = threading.Thread(target=other_thread_sleeps)
    other.start()
    worker.handle_shutdown()
    assert slept and slept[0] >= compat.UPSTREAM_SHUTDOWN_SLEEP_S / 30 * 0.9


# ----------------------------------------------------------------------------- the bench's log split


def _bench():
    spec = importlib.util.spec_from_file_location("bench_startup", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STAMPED = """\
+0.900 | [cosmos] 2026-12-01 11:22:06,530 - cosmos - INFO - Using rollout backend: sana
+1.000 | [Controller] Using script: cosmos_rl.dispatcher.run_web_panel
+8.000 | [cosmos-sana INFO cosmos_sana.bridge] cosmos-sana bridge active in role Controller (6.9 s after interpreter start); registered
+9.500 | [cosmos] 2026-12-01 11:22:15,130 - cosmos - INFO - Controller is ready at localhost:8000
+9.600 | Launching command: python -m cosmos_rl.launcher.torchrun --nproc-per-node=1 -m cosmos_rl.policy.train
+19.600 | [rank0]:[cosmos-sana INFO cosmos_sana.bridge] cosmos-sana bridge active in role Policy (8.2 s after interpreter start); registered
+20.100 | [rank0]:[cosmos] 2026-12-01 11:22:26,130 - cosmos - INFO - [Policy] Loaded configuration: {'controller_execution_id': 'a2'}
+25.000 | [rank0]:[cosmos-sana INFO cosmos_sana_plugins.sana.model] loaded SanaPipeline on cuda:0 (transformer torch.bfloat16, offload=False)
+26.000 | [rank0]:[cosmos] - cosmos - CRITICAL - [Policy] Meta init not supported for diffusers trainer.
+66.000 | [rank0]:[cosmos-sana INFO cosmos_sana_plugins.rollout.rollout] rollout: 2 prompts x 8 in 3.10 s
+70.000 | done
"""


def test_bench_splits_a_stamped_launch_log(tmp_path: Path) -> None:
    log = tmp_path / "startup.log"
    log.write_text(STAMPED)
    result = _bench().main(["parse", str(log), "--json-out", str(tmp_path / "out.json")])
    assert result["missing_milestones"] == []
    assert result["phases_s"] == {
        "launcher_imports": 0.9,
        "launcher_to_controller_process": 0.1,
        "controller_imports": 7.0,
        "controller_setup": 1.5,
        "launcher_wait_to_replica": 8.6,
        "torchrun_and_worker_imports": 10.0,
        "worker_imported_to_configured": 0.5,
        "worker_setup_and_model_load": 4.9,
        "start_to_worker_configured": 20.1,
        "model_loaded_to_first_rollout": 41.0,
        "total_to_first_rollout": 66.0,
    }
    assert result["bridge_import_s"] == {"Controller": 6.9, "Policy": 8.2}
    gap = result["longest_gaps"][0]
    assert gap["seconds"] == 40.0 and "Meta init not supported" in gap["after"] and "rollout: 2 prompts" in gap["before"]
    assert json.loads((tmp_path / "out.json").read_text())["end_s"] == 70.0


def test_bench_refuses_a_log_without_stamps(tmp_path: Path) -> None:
    log = tmp_path / "plain.log"
    log.write_text("Using rollout backend: sana\n")
    with pytest.raises(ValueError, match="no stamped lines"):
        _bench().main(["parse", str(log)])


def test_bench_launch_stamps_each_line(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import time; print('Using rollout backend: x'); time.sleep(0.5); print('end')"]
    result = _bench().main(["launch", "--log-dir", str(tmp_path), "--", *command])
    assert result["exit_status"] == 0
    assert result["milestones_s"]["launcher_imported"] < result["end_s"]
    assert result["end_s"] - result["milestones_s"]["launcher_imported"] >= 0.45
    lines = (tmp_path / "startup.log").read_text().splitlines()
    assert [line.split(" | ", 1)[1] for line in lines] == ["Using rollout backend: x", "end"]


def test_bench_compare_runs_cosmos_rl_s_start_up_first_then_the_default(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COSMOS_SANA_FAST_STARTUP", "1")  # an inherited value must not leak into "before"
    script = (
        "import os, sys, time; fast = os.environ.get('COSMOS_SANA_FAST_STARTUP') == '1'; "
        "time.sleep(0.1 if fast else 0.6); print('Using rollout backend: ' + sys.argv[1])"
    )
    result = _bench().main(["launch", "--compare", "--log-dir", str(tmp_path), "--", sys.executable, "-c", script, "{mode}"])
    assert result["before"]["env"] == {"COSMOS_SANA_FAST_STARTUP": "0"}
    assert result["after"]["env"] == {"COSMOS_SANA_FAST_STARTUP": "1"}
    assert result["before"]["command"][-1] == "before" and result["after"]["command"][-1] == "after"
    assert "Using rollout backend: before" in (tmp_path / "before" / "startup.log").read_text()
    assert result["saved_s"]["launcher_imports"] >= 0.4


# ----------------------------------------------------------------------------- replicas start with the controller


@pytest.fixture
def launch_all_copy():
    """cosmos-rl's launcher module as a fresh copy (its real ``wait_for_url_ready``), patched in isolation."""
    import types

    import cosmos_rl.launcher.launch_all as launch_all

    module = types.ModuleType("launch_all_copy")
    module.wait_for_url_ready = getattr(launch_all.wait_for_url_ready, "__wrapped__", launch_all.wait_for_url_ready)
    compat.patch_launcher_controller_wait(module)
    return module


def _serve_meta_after(delay_s: float):
    """An HTTP server answering ``GET /api/meta`` with 200, listening only ``delay_s`` from now."""
    import http.server
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class Meta(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/api/meta" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    servers: list = []

    def serve() -> None:
        time.sleep(delay_s)
        servers.append(http.server.HTTPServer(("127.0.0.1", port), Meta))
        servers[0].serve_forever(poll_interval=0.05)

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{port}", servers


def test_launcher_starts_replicas_while_the_local_controller_starts(launch_all_copy, caplog) -> None:
    url, servers = _serve_meta_after(0.5)
    controller = subprocess.Popen(["sleep", "30"])
    try:
        with caplog.at_level("INFO", logger="cosmos_sana"):
            started = time.monotonic()
            launch_all_copy.wait_for_url_ready(url, controller)
            assert time.monotonic() - started < 0.2  # the launcher goes on to start the replicas
            deadline = time.monotonic() + 10
            while "answered" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert f"controller at {url} answered" in caplog.text  # upstream's own poll ran to the end
    finally:
        controller.kill()
        controller.wait()
        for server in servers:
            server.shutdown()


def test_a_remote_controller_is_waited_for_and_a_failed_one_is_left_to_the_monitor(launch_all_copy, caplog) -> None:
    url, servers = _serve_meta_after(0.5)
    started = time.monotonic()
    launch_all_copy.wait_for_url_ready(url, None)  # on another node: upstream's wait, in the caller
    assert time.monotonic() - started >= 0.5
    servers[0].shutdown()
    failed = subprocess.Popen(["sh", "-c", "exit 3"])
    failed.wait()
    waiter_count = threading.active_count()
    with caplog.at_level("INFO", logger="cosmos_sana"):
        launch_all_copy.wait_for_url_ready("127.0.0.1:9", failed)
        deadline = time.monotonic() + 5
        while threading.active_count() > waiter_count and time.monotonic() < deadline:
            time.sleep(0.05)
    assert threading.active_count() == waiter_count  # upstream's exit ended only the waiting thread
    assert "answered" not in caplog.text


def test_the_cosmos_rl_command_gets_the_patched_wait(ours: Path) -> None:
    probe = (
        "import json, os, sys; from cosmos_sana.compat import autoload; "
        f"print(autoload.activate([sys.executable, '/venv/bin/cosmos-rl', '--config', {str(ours)!r}], dict(os.environ))); "
        "from cosmos_rl.launcher import launch_all; "
        "print(json.dumps([getattr(launch_all.wait_for_url_ready, '_cosmos_sana_patch', False), "
        "'cosmos_rl.policy.model' in sys.modules]))"
    )
    for extra, expected in (({autoload.FAST_STARTUP_FLAG: "0"}, [False, True]), ({}, [True, False])):
        out = subprocess.run([sys.executable, "-c", probe], env=_clean_env(**extra), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = out.stdout.strip().splitlines()
        assert lines[0] == "launcher-flagged" and json.loads(lines[-1]) == expected


@pytest.mark.slow
def test_cpu_launch_configures_the_worker_with_the_replica_started_beside_the_controller(
    tiny_image_pipeline_dir: Path, tmp_path: Path
) -> None:
    """A real ``cosmos-rl --config`` launch of a tiny recipe with the default start-up patches (a fake
    ``nvidia-smi`` lets the launcher start): the replica starts before the controller answers, the worker
    still gets its configuration from the controller, and the launch ends only at NCCL set-up, which needs
    a GPU."""
    import signal

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    venv_bin = Path(sys.executable).parent
    env = _clean_env(PATH=f"{bin_dir}:{venv_bin}:{os.environ['PATH']}", PYTHONUNBUFFERED="1")
    recipe = Path(__file__).resolve().parents[1] / "toml" / "tiny" / "sana-image-nft.toml"
    subprocess.run(
        [str(venv_bin / "cosmos-sana"), "validate", str(recipe), "--set", f"policy.model_name_or_path={tiny_image_pipeline_dir}",
         "--set", f"train.output_dir={tmp_path / 'out'}", "--dump", str(tmp_path / "run.toml")],
        env=env, check=True, capture_output=True, timeout=120,
    )
    log = tmp_path / "launch.log"
    with log.open("w") as sink:
        launch = subprocess.Popen(
            [str(venv_bin / "cosmos-rl"), "--config", str(tmp_path / "run.toml")],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
        )
        try:
            status = launch.wait(timeout=240)
        finally:
            if launch.poll() is None:
                os.killpg(launch.pid, signal.SIGKILL)
                launch.wait()
    text = log.read_text()

    def at(needle: str) -> int:
        assert needle in text, f"{needle!r} not logged:\n{text[-4000:]}"
        return text.index(needle)

    assert at("starting the replicas while the controller") < at("Launching command:") < at("answered")
    assert at("cosmos-sana bridge active in role Policy") < at("[Policy] Loaded configuration:")
    assert status != 0 and "ProcessGroupNCCL is only supported with GPUs" in text


def test_bench_launch_stops_reading_when_a_left_behind_process_holds_the_output(tmp_path: Path, monkeypatch) -> None:
    bench = _bench()
    monkeypatch.setattr(bench, "OUTPUT_GRACE_S", 0.5)
    command = ["sh", "-c", "echo 'Using rollout backend: x'; sleep 30 & exit 0"]
    started = time.monotonic()
    result = bench.main(["launch", "--log-dir", str(tmp_path), "--", *command])
    assert time.monotonic() - started < 10
    assert result["exit_status"] == 0 and result["output_left_open"] is True and "launcher_imported" in result["milestones_s"]


@pytest.mark.parametrize(
    ("argv_tail", "module"),
    [
        (["-m", "cosmos_rl.launcher.torchrun", "--nproc-per-node=1"], "cosmos_rl.launcher.torchrun"),
        (["-u", "-X", "importtime", "-W", "ignore", "-m", "cosmos_rl.policy.train"], "cosmos_rl.policy.train"),
        (["script.py", "-m", "x"], None),
        (["-c", "import x"], None),
        (["-m"], None),
    ],
)
def test_the_module_of_an_interpreter_command_line(argv_tail: list[str], module: str | None) -> None:
    assert autoload._argv_module([sys.executable, *argv_tail]) == module
