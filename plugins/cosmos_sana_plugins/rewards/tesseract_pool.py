"""Tesseract that stays loaded: worker processes that each keep one initialised engine across calls.

Starting the ``tesseract`` program costs more than reading a 512² image (it loads the language
model every time), so each worker loads ``libtesseract`` once through its C API and reads the raw
RGB pixels the pool sends it. Where the library is not found (only the program is installed), a
worker runs the program once per image instead, with the same settings.

Workers are lean child interpreters (``python -m`` this module: no torch, no fork of a process
that may hold CUDA state) talking over their stdin/stdout: a request is ``<III`` (width, height,
byte count) + pixels; a reply is ``<BI`` (0 = text, 1 = error message, 2 = no text: the read was
stopped, see below) + UTF-8. Tesseract runs single-threaded in each worker
(``OMP_THREAD_LIMIT=1`` in the worker's environment unless this process's environment sets it):
its own OpenMP threads would oversubscribe the cores the pool fills. This process's environment is
left as it is.

A library worker can stop a read through the C API's progress monitor: Tesseract calls the
monitor's cancel function before it recognises each word candidate, with the number of candidates
its layout analysis found on the page. The worker cancels when that number exceeds
``ReadSettings.max_words`` (decided at the first candidate, before any recognition) or once its
thread has spent ``ReadSettings.cpu_limit_ms`` of CPU time on this image. Only recognition is
stopped: layout analysis before the first candidate is never interrupted, and neither is paragraph
detection after the last, which on a field of noise split into hundreds of candidates (fine stripes)
costs more than all the rest; hence the candidate count, which tells such a field before that cost.
A stopped read returns no text, not the words recognised so far: those would depend on how fast the
machine is, and an image split into that many candidates or read that long is no legible short text.
CPU time, not wall time (Tesseract's own ``TessMonitorSetDeadlineMSecs``), so that a loaded host does
not change the reward; the worker is single-threaded, so its thread's CPU time is all of Tesseract's
work on the image. The pool counts the reads it stopped (``cut_reads``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

_REQUEST, _REPLY = struct.Struct("<III"), struct.Struct("<BI")
_CUT = 2  # reply status of a read stopped past max_words or cpu_limit_ms
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding cosmos_sana_plugins/


@dataclass(frozen=True)
class ReadSettings:
    """What each worker's engine is set up with (the ``TesseractOptions`` of ``ocr.py``)."""

    lang: str = "eng"
    psm: int = 3
    max_side: int | None = None
    max_words: int | None = None  # library engine only; None: no limit
    cpu_limit_ms: float | None = None  # library engine only; None: no limit
    variables: dict[str, str] = field(default_factory=dict)
    library: str | None = None  # libtesseract to load; None: run the ``tesseract`` program per image
    datapath: str | None = None  # tessdata folder when TESSDATA_PREFIX is unset; None: the library's default


def find_library() -> tuple[str, str | None] | None:
    """``(libtesseract, tessdata folder or None)``: the system's library, else the one a cosmos-sana
    wheelhouse carries next to its ``bin/tesseract`` wrapper (with that bundle's tessdata)."""
    system = ctypes.util.find_library("tesseract")
    if system:
        return system, None
    program = shutil.which("tesseract")
    if program:
        bundle = Path(program).resolve().parent.parent / "tesseract"
        carried = sorted((bundle / "lib").glob("libtesseract.so*"))
        if carried:
            return str(carried[0]), str(bundle / "share" / "tessdata")
    return None


_CANCEL = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int)  # Tesseract's CANCEL_FUNC


class LibraryEngine:
    """One ``TessBaseAPI`` handle, initialised once; reads raw RGB pixels (stopping a read past
    ``max_words`` or ``cpu_limit_ms`` when set: see the module's docstring)."""

    def __init__(self, settings: ReadSettings) -> None:
        lib = ctypes.CDLL(settings.library)
        handle, text = ctypes.c_void_p, ctypes.c_char_p
        lib.TessBaseAPICreate.restype = handle
        lib.TessBaseAPIInit3.argtypes = [handle, text, text]
        lib.TessBaseAPISetPageSegMode.argtypes = [handle, ctypes.c_int]
        lib.TessBaseAPISetVariable.argtypes = [handle, text, text]
        lib.TessBaseAPISetImage.argtypes = [handle, ctypes.c_char_p] + [ctypes.c_int] * 4
        lib.TessBaseAPIGetUTF8Text.argtypes = [handle]
        lib.TessBaseAPIGetUTF8Text.restype = ctypes.c_void_p  # freed with TessDeleteText, so not c_char_p
        lib.TessDeleteText.argtypes = [ctypes.c_void_p]
        lib.TessBaseAPIClear.argtypes = [handle]
        lib.TessBaseAPIRecognize.argtypes = [handle, handle]
        lib.TessMonitorCreate.restype = handle
        lib.TessMonitorSetCancelFunc.argtypes = [handle, _CANCEL]
        self._lib, self._api = lib, lib.TessBaseAPICreate()
        self._monitor, self._max_words, self.cancelled = None, settings.max_words, False
        self._limit_s = settings.cpu_limit_ms / 1000 if settings.cpu_limit_ms is not None else None
        self._ends_at = 0.0
        if self._max_words is not None or self._limit_s is not None:
            self._cancel = _CANCEL(self._over_limit)  # referenced for as long as Tesseract may call it
            self._monitor = lib.TessMonitorCreate()
            lib.TessMonitorSetCancelFunc(self._monitor, self._cancel)
        datapath = os.environ.get("TESSDATA_PREFIX") or settings.datapath  # as the program's wrapper decides
        if lib.TessBaseAPIInit3(self._api, datapath.encode() if datapath else None, settings.lang.encode()):
            raise RuntimeError(
                f"Tesseract could not load language {settings.lang!r} (tessdata: {datapath or 'its default'}); "
                f"install its traineddata (Debian: tesseract-ocr-{settings.lang}) or set TESSDATA_PREFIX"
            )
        lib.TessBaseAPISetPageSegMode(self._api, settings.psm)
        # the program prints its notes ("Estimating resolution as …") only for a human; a worker reads thousands
        for name, value in {"debug_file": os.devnull, **settings.variables}.items():
            if not lib.TessBaseAPISetVariable(self._api, name.encode(), str(value).encode()):
                raise ValueError(f"Tesseract has no variable {name!r}")

    def _over_limit(self, _cancel_this: int, words: int) -> bool:
        self.cancelled = (self._max_words is not None and words > self._max_words) or (
            self._limit_s is not None and time.thread_time() > self._ends_at
        )
        return self.cancelled

    def __call__(self, rgb: bytes, width: int, height: int) -> str:
        self._lib.TessBaseAPISetImage(self._api, rgb, width, height, 3, 3 * width)
        pointer = None
        try:
            if self._monitor is not None:
                self.cancelled, self._ends_at = False, time.thread_time() + (self._limit_s or 0.0)
                self._lib.TessBaseAPIRecognize(self._api, self._monitor)
                if self.cancelled:
                    return ""
            pointer = self._lib.TessBaseAPIGetUTF8Text(self._api)
            return ctypes.string_at(pointer).decode("utf-8", "replace") if pointer else ""
        finally:
            if pointer:
                self._lib.TessDeleteText(pointer)
            self._lib.TessBaseAPIClear(self._api)


class ProgramEngine:
    """The ``tesseract`` program once per image (pytesseract), for hosts without the library."""

    cancelled = False  # the program has no monitor to stop a read

    def __init__(self, settings: ReadSettings) -> None:
        import pytesseract

        self._pytesseract, self.lang = pytesseract, settings.lang
        self.config = " ".join([f"--psm {settings.psm}"] + [f"-c {k}={v}" for k, v in settings.variables.items()])

    def __call__(self, rgb: bytes, width: int, height: int) -> str:
        from PIL import Image

        image = Image.frombytes("RGB", (width, height), rgb)
        return self._pytesseract.image_to_string(image, lang=self.lang, config=self.config)


def downscale(rgb: bytes, width: int, height: int, max_side: int) -> tuple[bytes, int, int]:
    """Lanczos-resample so that the longer side is ``max_side`` (images already smaller are kept)."""
    if max(width, height) <= max_side:
        return rgb, width, height
    from PIL import Image

    scale = max_side / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return Image.frombytes("RGB", (width, height), rgb).resize(size, Image.Resampling.LANCZOS).tobytes(), *size


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def serve(settings: ReadSettings, requests: BinaryIO, replies: BinaryIO) -> None:
    """A worker's loop: build the engine once, then answer requests until ``requests`` closes."""
    try:
        engine = (LibraryEngine if settings.library else ProgramEngine)(settings)
        failure = None
    except Exception as exc:  # answered to every request, so the caller sees why
        engine, failure = None, f"{type(exc).__name__}: {exc}"
    while (header := _read_exactly(requests, _REQUEST.size)) is not None:
        width, height, size = _REQUEST.unpack(header)
        rgb = _read_exactly(requests, size)
        if rgb is None:
            return
        status, message = 1, (failure or "").encode()
        if failure is None:
            try:
                if settings.max_side:
                    rgb, width, height = downscale(rgb, width, height, settings.max_side)
                message = engine(rgb, width, height).encode()
                status = _CUT if engine.cancelled else 0
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}".encode()
        replies.write(_REPLY.pack(status, len(message)) + message)
        replies.flush()


class _Worker:
    def __init__(self, settings: ReadSettings) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_THREAD_LIMIT", "1")
        # the worker imports this module from where this process found it
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
        if settings.library and os.path.isabs(settings.library):  # a carried library finds its own deps beside it
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                filter(None, [str(Path(settings.library).parent), env.get("LD_LIBRARY_PATH")])
            )
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, json.dumps(asdict(settings))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )

    def read(self, index: int, rgb: bytes, width: int, height: int) -> tuple[str, bool]:
        """The image's text, and whether the read was stopped (past ``max_words`` or ``cpu_limit_ms``)."""
        try:
            self.process.stdin.write(_REQUEST.pack(width, height, len(rgb)) + rgb)
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the reply read below reports the dead worker
        header = _read_exactly(self.process.stdout, _REPLY.size)
        status, size = _REPLY.unpack(header) if header else (None, 0)
        message = _read_exactly(self.process.stdout, size) if header else None
        if message is None:
            code = self.process.wait()
            raise RuntimeError(f"reward 'ocr': the Tesseract worker (pid {self.process.pid}) died "
                               f"reading image {index} (exit code {code})")
        if status not in (0, _CUT):
            raise RuntimeError(f"reward 'ocr': Tesseract failed on image {index}: {message.decode()}")
        return message.decode(), status == _CUT


def _stop(workers: list[_Worker]) -> None:
    for worker in workers:
        try:
            worker.process.stdin.close()  # the worker's loop ends at end of input
        except BrokenPipeError:  # it had exited already
            pass
    for worker in workers:
        try:
            worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        worker.process.stdout.close()
    workers.clear()


class TesseractPool:
    """``workers`` processes started on the first read and kept across reads until :meth:`close`
    (or interpreter exit); a worker that died is replaced at the next read. ``cut_reads`` counts the
    images whose read was stopped past ``settings.max_words`` or ``cpu_limit_ms`` (they read as no text)."""

    def __init__(self, settings: ReadSettings, workers: int) -> None:
        self.settings, self.workers, self.cut_reads = settings, workers, 0
        self._live: list[_Worker] = []
        self._lock = threading.Lock()  # one read at a time: each worker serves one request at a time
        weakref.finalize(self, _stop, self._live)

    def read(self, images: list[tuple[bytes, int, int]]) -> list[str]:
        """Text of each raw RGB image ``(pixels, width, height)``, in order."""
        if not images:
            return []
        with self._lock:
            for worker in [w for w in self._live if w.process.poll() is not None]:
                self._live.remove(worker)
                _stop([worker])  # closes its pipes
            while len(self._live) < min(self.workers, max(1, len(images))):
                self._live.append(_Worker(self.settings))
            texts: list[Any] = [None] * len(images)
            jobs, taken = iter(enumerate(images)), threading.Lock()

            def drain(worker: _Worker) -> None:
                while True:
                    with taken:
                        job = next(jobs, None)
                    if job is None:
                        return
                    index, image = job
                    texts[index], cut[index] = worker.read(index, *image)

            cut = [False] * len(images)
            with ThreadPoolExecutor(len(self._live)) as threads:
                for future in [threads.submit(drain, w) for w in self._live]:
                    future.result()
            self.cut_reads += sum(cut)
            return texts

    def pids(self) -> list[int]:
        """Process ids of the running workers (none before the first read or after :meth:`close`)."""
        return [w.process.pid for w in self._live]

    def close(self) -> None:
        """Stop the workers and wait for them to exit (a later read starts new ones)."""
        with self._lock:
            _stop(self._live)


if __name__ == "__main__":
    _replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the engine prints goes to stderr, never into the replies
    serve(ReadSettings(**json.loads(sys.argv[1])), sys.stdin.buffer, _replies)
