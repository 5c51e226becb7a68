"""OCR reward: does the image show the prompt's quoted text?

target = the text between the first pair of double quotes in the prompt; recognised =
everything the backend reads. Both are lowercased with whitespace removed;
distance = 0 when target ⊂ recognised, else Levenshtein(recognised, target), capped at
len(target); reward = 1 − distance / len(target).

The recognition backend is pluggable: ``backend = "tesseract"`` (pytesseract over the
Debian ``tesseract-ocr`` engine) or ``"package.module:factory"``, where
``factory(**backend_args)`` returns ``recognize(images: list[PIL.Image.Image]) -> list[str]``.
"""

from __future__ import annotations

import os
from collections import ChainMap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field

from cosmos_sana.config.base import StrictModel
from cosmos_sana.specs import resolve

Recognize = Callable[[list[Any]], list[str]]


class OcrOptions(StrictModel):
    backend: str = Field(default="tesseract", description="'tesseract' or 'package.module:factory'")
    backend_args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the backend factory")


def target_text(prompt: str) -> str:
    """The text between the first pair of double quotes."""
    parts = prompt.split('"')
    if len(parts) < 3:
        raise ValueError(f'OCR reward needs the target text in double quotes, e.g. a sign saying "OPEN"; got {prompt!r}')
    return parts[1]


def normalise(text: str) -> str:
    return "".join(text.lower().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions all cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def ocr_reward(recognised: str, target: str) -> float:
    """1 − min(distance, len(target)) / len(target), distance 0 when the target is contained."""
    target, recognised = normalise(target), normalise(recognised)
    if not target:
        raise ValueError("OCR reward: the quoted target text is empty")
    distance = 0 if target in recognised else min(levenshtein(recognised, target), len(target))
    return 1.0 - distance / len(target)


def default_threads() -> int:
    """Tesseract processes run at once: one a CPU core, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores))


class TesseractBackend:
    """Tesseract through pytesseract, ``threads`` images at a time (one process each).

    Each Tesseract process runs single-threaded (``OMP_THREAD_LIMIT=1`` unless this process's environment
    sets it): Tesseract's own OpenMP threads would otherwise oversubscribe the cores the pool fills. The
    limit goes only to Tesseract, through the environment pytesseract hands it (its module-level
    ``environ``); this process's environment is left as it is.
    """

    def __init__(self, lang: str = "eng", config: str = "", threads: int | None = None) -> None:
        import pytesseract

        try:
            pytesseract.get_tesseract_version()
        except pytesseract.TesseractNotFoundError as exc:
            raise RuntimeError(
                "reward 'ocr': the tesseract binary is missing; install it (Debian: apt-get install tesseract-ocr "
                "tesseract-ocr-eng) or choose another args.backend"
            ) from exc
        if threads is not None and threads < 1:
            raise ValueError(f"reward 'ocr': backend_args.threads must be at least 1, got {threads}")
        self.lang, self.config, self.threads = lang, config, threads or default_threads()
        module = pytesseract.pytesseract
        if not isinstance(module.environ, ChainMap):
            module.environ = ChainMap(os.environ, {"OMP_THREAD_LIMIT": "1"})  # os.environ's value wins
        self._pytesseract = pytesseract

    def _one(self, image: Any) -> str:
        return self._pytesseract.image_to_string(image, lang=self.lang, config=self.config)

    def __call__(self, images: list[Any]) -> list[str]:
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            return list(pool.map(self._one, images))


def make_backend(options: OcrOptions) -> Recognize:
    factory = TesseractBackend if options.backend == "tesseract" else resolve(options.backend)
    return factory(**options.backend_args)


def to_pil(images: Any) -> list[Any]:
    """Float ``B×3×H×W`` in [0, 1] → RGB PIL images."""
    from PIL import Image

    arrays = (images.detach().float().clamp(0, 1) * 255).round().to("cpu").byte().permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arrays]


class OcrScorer:
    def __init__(self, options: OcrOptions, device: Any) -> None:
        self.recognize = make_backend(options)

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        targets = []
        for i, prompt in enumerate(prompts):
            try:
                targets.append(target_text(prompt))
            except ValueError as exc:
                raise ValueError(f"sample {i}: {exc}") from exc
        texts = self.recognize(to_pil(media))
        if len(texts) != len(targets):
            raise ValueError(f"OCR backend returned {len(texts)} texts for {len(targets)} images")
        return [ocr_reward(text, target) for text, target in zip(texts, targets)]
