"""Start-up of a ``cosmos-rl --config`` launch, split per process and phase; prints JSON.

    python bench/bench_startup.py imports [--repeats 3] [--json-out FILE]
    python bench/bench_startup.py launch --log-dir DIR [--compare] [--json-out FILE] -- cosmos-rl --config X.toml
    python bench/bench_startup.py parse DIR/startup.log

``imports`` (runs anywhere, CPU included): each of the four processes of a launch, started in a fresh
interpreter the way cosmos-rl starts it, with our recipe, timed until it has imported what it needs:
the launcher and the torchrun wrapper until their ``--help`` (printed after their imports), the
controller and a policy worker until the bridge logs that it is active. Each is run with
``COSMOS_SANA_FAST_STARTUP=0`` (``before``: cosmos-rl's own start-up) and with ``=1`` (``after``: the
default, cosmos-sana's start-up patches; set explicitly so an inherited value cannot change a side), the
two interleaved so a shared machine slows both alike; the JSON has every sample and the medians.

``launch`` (the GPU machine): runs the command with ``PYTHONUNBUFFERED=1`` (so every process's lines
arrive when written), writes each output line to ``DIR/startup.log`` prefixed with the seconds since
the command started, and reports when each start-up milestone was first seen, the phases between
them, the end of the run (shutdown after the last step), and the longest silences with the line that
ended each (an unexplained pause shows up there). With ``--compare`` it runs the command twice,
first with ``COSMOS_SANA_FAST_STARTUP=0`` (``before``: cosmos-rl's own start-up and shutdown) in
``DIR/before``, then with ``COSMOS_SANA_FAST_STARTUP=1`` (``after``: the default, cosmos-sana's start-up
patches) in ``DIR/after``, and adds the difference of each phase;
``{mode}`` in the command becomes ``before`` / ``after`` (e.g. a recipe per run, so that the second
launch does not resume the first one's checkpoints).
``parse`` reports the same from such a log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: ``1`` opts a launch in to cosmos-sana's start-up patches; anything else keeps cosmos-rl's own
#: start-up and shutdown, the default (cosmos_sana.compat.autoload)
FAST_STARTUP_FLAG = "COSMOS_SANA_FAST_STARTUP"
#: the environment of each mode; ``before`` sets ``0`` so that an opt-in the caller exported does not leak in
MODE_ENV = {"before": {FAST_STARTUP_FLAG: "0"}, "after": {FAST_STARTUP_FLAG: "1"}}
#: start-up milestones in launch order: name → pattern of the line that marks it (first match wins)
MILESTONES: tuple[tuple[str, str], ...] = (
    ("launcher_imported", r"Using rollout backend:"),
    ("controller_started", r"\[Controller\] Using script:"),
    ("controller_imported", r"cosmos-sana bridge active in role Controller"),
    ("launcher_proceeds", r"Controller is ready at"),
    ("controller_answered", r"controller at \S+ answered \d"),
    ("replica_started", r"Launching command: .*torchrun"),
    ("worker_imported", r"cosmos-sana bridge active in role (Policy|Rollout)"),
    ("worker_configured", r"\[(Policy|Rollout)\] Loaded configuration:"),
    ("model_loaded", r"\] loaded .* \(transformer .*offload="),
    ("meta_init_message", r"Meta init not supported for diffusers trainer"),
    ("first_rollout", r"rollout: \d+ prompts x \d+ in"),
)
#: phases reported, each between two milestones (or the launch start)
PHASES: tuple[tuple[str, str, str], ...] = (
    ("launcher_imports", "start", "launcher_imported"),
    ("launcher_to_controller_process", "launcher_imported", "controller_started"),
    ("controller_imports", "controller_started", "controller_imported"),
    ("controller_setup", "controller_imported", "controller_ready"),
    ("launcher_wait_to_replica", "controller_started", "replica_started"),
    ("torchrun_and_worker_imports", "replica_started", "worker_imported"),
    ("worker_imported_to_configured", "worker_imported", "worker_configured"),
    ("worker_setup_and_model_load", "worker_configured", "model_loaded"),
    ("start_to_worker_configured", "start", "worker_configured"),
    ("model_loaded_to_first_rollout", "model_loaded", "first_rollout"),
    ("total_to_first_rollout", "start", "first_rollout"),
)
STEP_LINE = re.compile(r"\bstep[ =:]+(\d+)\b", re.IGNORECASE)
IMPORT_SECONDS = re.compile(r"bridge active in role \w+ \((\d+(?:\.\d+)?) s after interpreter start\)")
STAMP = re.compile(r"^\+(\d+\.\d+) \| (.*)$")
LONGEST_GAPS = 6
#: how long output is still read after the command exited
OUTPUT_GRACE_S = 10.0


def parse_stamped(lines: list[str]) -> dict[str, Any]:
    """The milestone times, phases, import times the bridges logged, and longest gaps of a stamped log."""
    stamped = []
    for line in lines:
        match = STAMP.match(line.rstrip("\n"))
        if match:
            stamped.append((float(match[1]), match[2]))
    if not stamped:
        raise ValueError("no stamped lines ('+SECONDS | text'): is this a log written by bench_startup.py launch?")
    seen: dict[str, float] = {"start": 0.0}
    bridge_imports: dict[str, float] = {}
    for stamp, text in stamped:
        for name, pattern in MILESTONES:
            if name not in seen and re.search(pattern, text):
                seen[name] = stamp
        found = IMPORT_SECONDS.search(text)
        role = re.search(r"in role (\w+)", text)
        if found and role and role[1] not in bridge_imports:
            bridge_imports[role[1]] = float(found[1])
    # the controller answers when the launcher proceeds, unless the launcher started the replicas
    # without waiting (cosmos-sana's patch), which logs when the controller answered
    ready = seen.get("controller_answered", seen.get("launcher_proceeds"))
    if ready is not None:
        seen["controller_ready"] = ready
    phases = {
        name: round(seen[end] - seen[begin], 2)
        for name, begin, end in PHASES
        if begin in seen and end in seen
    }
    gaps = sorted(
        ((later[0] - earlier[0], earlier, later) for earlier, later in zip(stamped, stamped[1:])),
        key=lambda gap: -gap[0],
    )[:LONGEST_GAPS]
    return {
        "milestones_s": {name: round(value, 2) for name, value in seen.items() if name != "start"},
        "missing_milestones": [
            name for name in ("controller_ready", *(name for name, _ in MILESTONES)) if name not in seen
            and name not in ("launcher_proceeds", "controller_answered")
        ],
        "phases_s": phases,
        "bridge_import_s": bridge_imports,
        "end_s": round(stamped[-1][0], 2),
        "longest_gaps": [
            {"seconds": round(gap, 2), "after_s": round(earlier[0], 2), "after": earlier[1][:200], "before": later[1][:200]}
            for gap, earlier, later in gaps
        ],
    }


def run_launch(command: list[str], log_dir: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``command``, stamping each output line; the parsed result plus the exit status."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "startup.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    started = time.monotonic()
    lines: list[str] = []
    with log_path.open("w") as sink:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None

        def read(stream: Any) -> None:
            for text in stream:
                line = f"+{time.monotonic() - started:.3f} | {text.rstrip()}"
                sink.write(line + "\n")
                sink.flush()
                lines.append(line)

        reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
        reader.start()
        status = proc.wait()
        exited = time.monotonic() - started
        # a process the command left behind may hold the output open: stop reading a while after the exit
        reader.join(timeout=OUTPUT_GRACE_S)
        output_left_open = reader.is_alive()
    result = parse_stamped(list(lines))
    result.update({
        "command": command, "env": extra_env or {}, "exit_status": status, "exit_s": round(exited, 2),
        "output_left_open": output_left_open, "log": str(log_path),
    })
    return result


def compare_launches(command: list[str], log_dir: Path) -> dict[str, Any]:
    """The launch by default (``before``: cosmos-rl's own start-up), then opted in to cosmos-sana's
    start-up patches (``after``)."""

    def for_mode(mode: str) -> list[str]:
        return [arg.replace("{mode}", mode) for arg in command]

    before = run_launch(for_mode("before"), log_dir / "before", MODE_ENV["before"])
    after = run_launch(for_mode("after"), log_dir / "after", MODE_ENV["after"])
    phases = before["phases_s"].keys() & after["phases_s"].keys()
    saved = {name: round(before["phases_s"][name] - after["phases_s"][name], 2) for name in sorted(phases)}
    saved["end"] = round(before["end_s"] - after["end_s"], 2)
    return {"before": before, "after": after, "saved_s": saved}


# ----------------------------------------------------------------------------- imports (CPU)

RECIPE = '[train]\noutput_dir = "{out}"\n[custom]\npackage = "cosmos-sana"\n'
BRIDGE_LINE = "cosmos-sana bridge active in role"


def _process_commands(recipe: Path) -> dict[str, tuple[list[str], dict[str, str], str | None]]:
    """Per process of a launch: its command line, environment additions, and the line that ends its
    import phase (``None``: the process exits on its own once imported)."""
    python = sys.executable
    worker_env = {"COSMOS_ROLE": "Policy", "COSMOS_SANA_AUTOLOAD": "1", "COSMOS_CONTROLLER_HOST": "127.0.0.1:9"}
    return {
        "launcher": ([python, "-m", "cosmos_rl.launcher.launch_all", "--config", str(recipe), "--help"], {}, None),
        "torchrun_wrapper": ([python, "-m", "cosmos_rl.launcher.torchrun", "--help"], worker_env, None),
        "controller": (
            [python, "-m", "cosmos_rl.dispatcher.run_web_panel", "--port", "0", "--config", str(recipe)],
            {**worker_env, "COSMOS_ROLE": "Controller"},
            BRIDGE_LINE,
        ),
        "policy_worker": (
            [python, "-u", "-m", "cosmos_rl.policy.train", "--port", "0", "--config", str(recipe)],
            worker_env,
            BRIDGE_LINE,
        ),
    }


def time_process(command: list[str], env: dict[str, str], needle: str | None, timeout: float = 300) -> float:
    """Seconds from start until the process exits (needle ``None``) or prints ``needle`` (then it is killed)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COSMOS_")}
    clean.update(env, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    proc = subprocess.Popen(command, env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    output: list[str] = []
    found = threading.Event()

    def read() -> None:
        for text in proc.stdout:
            output.append(text)
            if needle is not None and needle in text:
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if needle is None:
            status = proc.wait(timeout=timeout)
            reader.join(timeout=5)
            if status != 0:
                raise RuntimeError(f"{command} exited {status}:\n{''.join(output)[-2000:]}")
            return time.monotonic() - started
        if not found.wait(timeout=timeout):
            raise RuntimeError(f"{command} never printed {needle!r}:\n{''.join(output)[-2000:]}")
        return time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def measure_imports(repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        recipe = Path(scratch) / "recipe.toml"
        recipe.write_text(RECIPE.format(out=Path(scratch) / "out"))
        samples: dict[str, dict[str, list[float]]] = {}
        for round_index in range(repeats):
            for process, (command, env, needle) in _process_commands(recipe).items():
                modes = ("before", "after") if round_index % 2 == 0 else ("after", "before")
                for mode in modes:
                    seconds = time_process(command, {**env, **MODE_ENV[mode]}, needle)
                    samples.setdefault(process, {}).setdefault(mode, []).append(round(seconds, 2))
    medians = {
        process: {mode: round(statistics.median(values), 2) for mode, values in by_mode.items()}
        for process, by_mode in samples.items()
    }
    for values in medians.values():
        values["saved"] = round(values["before"] - values["after"], 2)
    return {
        "samples_s": samples,
        "median_s": medians,
        "sum_of_processes_s": {
            mode: round(sum(values[mode] for values in medians.values()), 2) for mode in ("before", "after")
        },
    }


def environment() -> dict[str, Any]:
    from importlib import metadata

    versions = {}
    for package in ("torch", "diffusers", "cosmos-rl", "cosmos-sana"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
        "versions": versions,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    imports = sub.add_parser("imports", help="per-process import time, with and without the start-up patches")
    imports.add_argument("--repeats", type=int, default=3)
    launch = sub.add_parser("launch", help="run a launch command and split its start-up")
    launch.add_argument("--log-dir", type=Path, required=True)
    launch.add_argument(
        "--compare", action="store_true", help="run it with COSMOS_SANA_FAST_STARTUP=0 (before), then =1, the default (after)"
    )
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. cosmos-rl --config X.toml")
    parse = sub.add_parser("parse", help="split the start-up of a log written by 'launch'")
    parse.add_argument("log", type=Path)
    for each in (imports, launch, parse):
        each.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)

    if args.mode == "imports":
        result = {"bench": "startup-imports", **measure_imports(args.repeats)}
    elif args.mode == "launch":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("launch: give the command after --")
        run = compare_launches if args.compare else run_launch
        result = {"bench": "startup-launch", **run(command, args.log_dir)}
    else:
        result = {"bench": "startup-launch", "log": str(args.log), **parse_stamped(args.log.read_text().splitlines())}
    result["environment"] = environment()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
