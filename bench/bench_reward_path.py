"""Where a chunk's reward time goes between the rollout's submit and its scores (CPU).

    python bench/bench_reward_path.py --images /work/ocr_generated --repeats 5 --json-out r.json

One chunk of the ``sana`` rollout (8 images at 512², float B×3×H×W in [0, 1], as the rollout
submits it after decoding) scored with ``jpeg_compressibility`` + ``ocr`` (library Tesseract pool,
the recipe's defaults), split into stages, each timed with ``time.perf_counter`` and reported as the
median of ``--repeats`` rounds:

* ``submit_checks``: ``as_media_batch`` (range check + clamp) on the submitting thread;
* ``to_pil``: float tensor → 8 PIL images (each scorer does this once);
* ``jpeg_encode``: 8 q95 JPEG encodes of ready PIL images, one after the other (as the scorer does);
* ``jpeg_scorer``: the whole ``jpeg_compressibility`` call (``to_pil`` + 8 sequential q95 encodes);
* ``ocr_prepare``: what the Tesseract backend does before the pool (``to_pil``, ``convert``, ``tobytes``);
* ``ocr_read_in_process``: the same 8 reads by one ``LibraryEngine`` in this process (Tesseract alone);
* ``pool_read_1_worker`` / ``pool_read_2_workers``: ``TesseractPool.read`` (pipes to worker processes);
* ``blank_read_in_process`` / ``blank_pool_read_1_worker``: the same for 8 flat grey 512² images, which
  Tesseract reads in a few ms, so that the difference is the pipes' cost (``pool_ipc_per_image_ms``);
* ``pool_first_read_extra``: a fresh pool's first one-image read minus a warm pool's (worker start-up);
* ``ocr_scorer``: the whole ``ocr`` call (2 workers);
* ``scheduler_*``: ``RewardScheduler.submit`` → ``future.result()`` with both scorers, and the part of
  it that is not the scorers' own time (``dispatch_overhead``);
  ``*_beside_upstream`` repeats it while another thread runs cosmos-rl's ``report_rollouts(block=True)``
  on a pending local reward task, as the colocated loop does while it waits for the step's rewards
  (it polls ``RewardDispatcher.dequeue_rewards_cal`` without pause); ``*_beside_patched`` the same
  with ``patch_blocking_reward_wait``; ``*_beside_process`` a busy loop in another process (the
  polling's CPU load without its GIL holding: on a 2-core machine the CPU share matters too).

Rounds interleave the stages, so a busy shared machine slows them alike.
"""

from __future__ import annotations

import argparse
import inspect
import io
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import environment, write_json  # noqa: E402

from cosmos_sana.config import RewardRef  # noqa: E402
from cosmos_sana.plugin_manager import installed_plugins  # noqa: E402
from cosmos_sana.rewards.scheduler import RewardScheduler  # noqa: E402
from cosmos_sana.rewards.scorers import ScorerSet, as_media_batch  # noqa: E402
from cosmos_sana_plugins.rewards.ocr import to_pil  # noqa: E402
from cosmos_sana_plugins.rewards.tesseract_pool import LibraryEngine, ReadSettings, TesseractPool, find_library  # noqa: E402

PROMPT = 'a shop sign that says "OPEN"'


def load_batch(folder: Path, size: int) -> torch.Tensor:
    files = sorted(folder.glob("*.png"))
    if not files:
        raise SystemExit(f"no PNG images in {folder}")
    arrays = [np.asarray(Image.open(files[i % len(files)]).convert("RGB")) for i in range(size)]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Waiter:
    """cosmos-rl's colocated loop waiting for the step's rewards: ``report_rollouts(block=True)`` on a
    dispatcher whose local reward task ends when :meth:`finish` is called. ``kind``: ``upstream``
    (cosmos-rl's polling as is), ``patched`` (with ``patch_blocking_reward_wait``), or ``process`` (a
    busy loop in another process: the same CPU load without holding this interpreter's GIL)."""

    def __init__(self, kind: str) -> None:
        from types import SimpleNamespace

        from cosmos_rl.reward.dispatcher import RewardDispatcher
        from cosmos_rl.rollout.worker.rollout_control import DisaggregatedRolloutControlWorker

        from cosmos_sana.compat.cosmos_rl import patch_blocking_reward_wait

        patch_blocking_reward_wait()
        self.kind, self.task, self._process = kind, Future(), None
        dispatcher = RewardDispatcher()
        dispatcher.is_remote = False  # as set up for local reward functions
        dispatcher.task_queue.put(self.task)
        report = DisaggregatedRolloutControlWorker.report_rollouts
        report = inspect.unwrap(report) if kind == "upstream" else report
        worker = SimpleNamespace(reward_dispatcher=dispatcher)
        self._thread = threading.Thread(target=report, args=(worker,), kwargs={"block": True}, daemon=True)

    def __enter__(self) -> "Waiter":
        if self.kind == "process":
            self._process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        else:
            self._thread.start()
        return self

    def finish(self) -> None:
        self.task.set_result(([], True, 0))  # a result report_rollouts returns at once

    def __exit__(self, *exc: Any) -> None:
        if not self.task.done():
            self.finish()
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        else:
            self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=Path, default=Path("/work/ocr_generated"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--machine", default="CPU")
    parser.add_argument("--waiters", nargs="*", default=["upstream", "patched", "process"],
                        help="also score beside these kinds of waiting loop (see Waiter)")
    parser.add_argument("--json-out")
    args = parser.parse_args()

    media = load_batch(args.images, args.batch)
    prompts, metadata = [PROMPT] * args.batch, [{}] * args.batch
    found = find_library()
    if found is None:
        raise SystemExit("libtesseract not found (Debian: apt-get install libtesseract5 tesseract-ocr-eng)")
    settings = ReadSettings(max_words=150, library=found[0], datapath=found[1])
    engine = LibraryEngine(settings)
    pil = to_pil(media)
    raw = [(image.tobytes(), image.width, image.height) for image in pil]
    blank = [(bytes([128]) * (3 * 512 * 512), 512, 512)] * args.batch
    pool1, pool2 = TesseractPool(settings, 1), TesseractPool(settings, 2)
    scorers = ScorerSet.build(
        [RewardRef(name="jpeg_compressibility"), RewardRef(name="ocr")], installed_plugins(), device="cpu"
    )
    own: dict[str, float] = {}
    for scorer in scorers.scorers:  # time each scorer's own call inside the scheduler
        def wrapped(m: Any, p: list[str], md: list[dict], fn: Callable = scorer.fn, name: str = scorer.name) -> Any:
            start = time.perf_counter()
            try:
                return fn(m, p, md)
            finally:
                own[name] = time.perf_counter() - start
        scorer.fn = wrapped
    scheduler = RewardScheduler(scorers, workers=1, retries=0)
    jpeg, ocr = scorers.get("jpeg_compressibility"), scorers.get("ocr")
    jpeg(media, prompts, metadata), ocr(media, prompts, metadata), pool1.read(raw), pool2.read(raw)  # warm-up

    def through_scheduler(tag: str) -> dict[str, float]:
        start = time.perf_counter()
        scheduler.submit(tag, [f"{tag}/{i}" for i in range(args.batch)], media, prompts, metadata)
        scheduler.collect(tag)
        wall = time.perf_counter() - start
        return {"wall": wall, "scorers": own["jpeg_compressibility"] + own["ocr"],
                "jpeg": own["jpeg_compressibility"], "ocr": own["ocr"]}

    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    for round_ in range(args.repeats):
        add("submit_checks", timed(lambda: as_media_batch(media)))
        add("to_pil", timed(lambda: to_pil(media)))
        add("jpeg_encode", timed(lambda: [image.save(io.BytesIO(), format="JPEG", quality=95) for image in pil]))
        add("jpeg_scorer", timed(lambda: jpeg(media, prompts, metadata)))
        add("ocr_prepare", timed(lambda: [(im.convert("RGB").tobytes(), im.width, im.height) for im in to_pil(media)]))
        add("ocr_read_in_process", timed(lambda: [engine(*image) for image in raw]))
        add("pool_read_1_worker", timed(lambda: pool1.read(raw)))
        add("blank_read_in_process", timed(lambda: [engine(*image) for image in blank]))
        add("blank_pool_read_1_worker", timed(lambda: pool1.read(blank)))
        add("pool_read_2_workers", timed(lambda: pool2.read(raw)))
        add("ocr_scorer", timed(lambda: ocr(media, prompts, metadata)))
        fresh = TesseractPool(settings, 1)
        first = timed(lambda: fresh.read(raw[:1]))
        add("pool_first_read_extra", first - timed(lambda: fresh.read(raw[:1])))
        fresh.close()
        plain = through_scheduler(f"plain{round_}")
        add("scheduler_wall", plain["wall"])
        add("scheduler_scorers_own", plain["scorers"])
        add("dispatch_overhead", plain["wall"] - plain["scorers"])
        for kind in args.waiters:
            with Waiter(kind) as waiter:
                time.sleep(0.05)  # the loop is running
                beside = through_scheduler(f"{kind}{round_}")
                waiter.finish()
            add(f"scheduler_wall_beside_{kind}", beside["wall"])
            add(f"jpeg_own_beside_{kind}", beside["jpeg"])
            add(f"ocr_own_beside_{kind}", beside["ocr"])
            add(f"dispatch_overhead_beside_{kind}", beside["wall"] - beside["scorers"])
        print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr)
    scheduler.close()
    pool1.close(), pool2.close()

    medians = {name: statistics.median(values) for name, values in rows.items()}
    derived = {
        "jpeg_encode_per_image_ms": 1000 * medians["jpeg_encode"] / args.batch,
        "pool_ipc_per_image_ms": 1000 * (medians["blank_pool_read_1_worker"] - medians["blank_read_in_process"])
        / args.batch,
        "ocr_read_per_image_ms": 1000 * medians["ocr_read_in_process"] / args.batch,
    }
    for kind in args.waiters:
        derived[f"extra_beside_{kind}"] = medians[f"scheduler_wall_beside_{kind}"] - medians["scheduler_wall"]
    result = {
        "bench": "reward_path",
        "machine": args.machine,
        "environment": environment(torch.device("cpu")),
        "settings": {"images": str(args.images), "batch": args.batch, "repeats": args.repeats,
                     "rewards": ["jpeg_compressibility", "ocr"], "ocr": "library pool, max_words 150",
                     "pool_workers": {"ocr_scorer": scorers.get("ocr").fn.__defaults__[0].recognize.threads}},
        "median_s": medians,
        "derived": derived,
        "raw_s": rows,
    }
    write_json(result, args.json_out)


if __name__ == "__main__":
    main()
