"""OCR reward: does the image show the prompt's quoted text?

target = the text between the first pair of double quotes in the prompt; recognised =
everything the backend reads. Both are lowercased with whitespace removed;
distance = 0 when target ⊂ recognised, else Levenshtein(recognised, target), capped at
len(target); reward = 1 − distance / len(target).

Knowing differences from flow_grpo's OCR reward (the same formula over PaddleOCR's reading): the
reader is Tesseract, and by default a page that Tesseract splits into more than ``max_words`` (150)
word candidates reads as no text, so a target hidden in such clutter scores 0 where flow_grpo could
score 1 (:class:`TesseractOptions`; ``max_words = 0`` reads every page to its end).

The recognition backend is pluggable: ``backend = "tesseract"`` (Tesseract 5 in worker processes
that keep the language model loaded across calls, :mod:`.tesseract_pool`; its ``backend_args`` are
:class:`TesseractOptions`) or ``"package.module:factory"``, where ``factory(**backend_args)``
returns ``recognize(images: list[PIL.Image.Image]) -> list[str]``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from cosmos_sana.config.base import StrictModel
from cosmos_sana.rewards.scorers import MediaError
from cosmos_sana.specs import resolve
from cosmos_sana_plugins.rewards.tesseract_pool import ReadSettings, TesseractPool, find_library

Recognize = Callable[[list[Any]], list[str]]


class OcrOptions(StrictModel):
    backend: str = Field(default="tesseract", description="'tesseract' or 'package.module:factory'")
    backend_args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the backend factory")

    @model_validator(mode="after")
    def _tesseract_args_are_checked(self) -> OcrOptions:
        """The built-in backend's ``backend_args`` are checked with the rest of the recipe (a typo or a bad
        value is refused by ``cosmos-sana validate``, not when the reward is first built)."""
        if self.backend == "tesseract":
            try:
                TesseractOptions.model_validate(self.backend_args)
            except ValidationError as error:
                raise ValueError("; ".join(
                    f"backend_args.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
                )) from None
        return self


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
    """Tesseract workers: one a CPU core, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores))


#: page-segmentation modes that return text (0 is orientation detection only, 2 layout only)
TEXT_PSMS = (1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)


class TesseractOptions(StrictModel):
    """``backend_args`` of ``backend = "tesseract"``.

    ``max_words`` (default 150): a page that Tesseract's layout analysis splits into more word candidates
    reads as no text (reward 0) without being recognised. The reward's targets are a few words on a sign;
    the fields of fine stripes a 512² SANA generates a few RL steps from random weights are split into
    200–400 candidates, read as no text or a few stray characters, and cost 0.3–0.5 s of one core each, most of it in
    Tesseract's paragraph detection after recognition, which nothing can interrupt; stopped at the first
    candidate they cost their layout analysis, ~0.05–0.1 s (bench/README.md, "OCR reward read time").
    Photos and screenshots with real text measured 8–87 candidates, the bench's signs 1–7. A dense page
    of small text can exceed 150: raise it, or ``0`` (``None`` from Python) reads every page to its end
    as before.
    ``cpu_limit_ms`` (default None) stops a read once its worker has spent that much CPU time on it (the
    image then reads as no text); it is checked only during recognition, so it bounds images with many
    real word candidates, not the stripe fields, whose cost comes after recognition. Both need the
    library engine; where ``engine = "auto"`` finds only the program, images are read to their end.
    """

    lang: str = Field(default="eng", description="Tesseract language(s), e.g. 'eng' or 'eng+deu'")
    psm: int = Field(default=3, description=f"page-segmentation mode, one of {TEXT_PSMS} (3: automatic)")
    max_side: int | None = Field(
        default=None, ge=32, description="downscale images whose longer side exceeds this before reading (None: never)"
    )
    max_words: int | None = Field(
        default=150, ge=0,
        description="an image that layout analysis splits into more word candidates reads as no text, "
        "without recognising them (library engine; 0 or None: no limit, as before; see the class docstring)",
    )
    cpu_limit_ms: float | None = Field(
        default=None, gt=0,
        description="CPU milliseconds a library worker may spend on one image; a read that reaches it stops "
        "and reads as no text (checked before each word candidate; None: no limit; see tesseract_pool)",
    )
    variables: dict[str, str] = Field(default_factory=dict, description="Tesseract variables (`-c name=value`)")
    threads: int | None = Field(default=None, ge=1, description="worker processes (default: one a core, at most 8)")
    engine: Literal["auto", "library", "program"] = Field(
        default="auto",
        description="'library': libtesseract loaded once per worker; 'program': the tesseract program per image; "
        "'auto': the library when found",
    )

    @field_validator("psm")
    @classmethod
    def _reads_text(cls, psm: int) -> int:
        if psm not in TEXT_PSMS:
            raise ValueError(f"psm must be one of {TEXT_PSMS} (modes that return text), got {psm}")
        return psm

    @field_validator("max_words")
    @classmethod
    def _zero_is_no_limit(cls, max_words: int | None) -> int | None:
        """0 means no limit: the form a recipe can write (TOML has no null)."""
        return None if max_words == 0 else max_words

    @model_validator(mode="after")
    def _limits_need_the_library(self) -> TesseractOptions:
        for key in ("max_words", "cpu_limit_ms"):
            if self.engine == "program" and key in self.model_fields_set and getattr(self, key) is not None:
                raise ValueError(f"{key} needs the library engine (the tesseract program cannot be stopped "
                                 f"mid-read); set engine = 'library' or 'auto', or leave {key} out")
        return self


class TesseractBackend:
    """Tesseract in a pool of worker processes that lives as long as this backend (see
    :mod:`.tesseract_pool`): each worker loads the language model once, not once per image."""

    def __init__(self, **args: Any) -> None:
        options = TesseractOptions(**args)
        found = find_library() if options.engine != "program" else None
        if options.engine == "library" and found is None:
            raise RuntimeError("reward 'ocr': backend_args.engine = 'library' but libtesseract was not found "
                               "(Debian: apt-get install libtesseract5)")
        if found is None and shutil.which("tesseract") is None:
            raise RuntimeError(
                "reward 'ocr': the tesseract binary is missing; install it (Debian: apt-get install tesseract-ocr "
                "tesseract-ocr-eng) or choose another args.backend"
            )
        library, datapath = found or (None, None)
        self.threads = options.threads or default_threads()
        self.settings = ReadSettings(
            lang=options.lang, psm=options.psm, max_side=options.max_side, variables=options.variables,
            max_words=options.max_words if library else None,
            cpu_limit_ms=options.cpu_limit_ms if library else None,
            library=library, datapath=datapath,
        )
        self.pool = TesseractPool(self.settings, self.threads)

    def __call__(self, images: list[Any]) -> list[str]:
        raw = []
        for index, image in enumerate(images):
            if image.width == 0 or image.height == 0:
                raise ValueError(f"OCR: image {index} is {image.width}×{image.height} pixels")
            rgb = image.convert("RGB")
            raw.append((rgb.tobytes(), rgb.width, rgb.height))
        return self.pool.read(raw)

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        self.pool.close()


def make_backend(options: OcrOptions) -> Recognize:
    factory = TesseractBackend if options.backend == "tesseract" else resolve(options.backend)
    return factory(**options.backend_args)


def to_pil(images: Any) -> list[Any]:
    """Float ``B×3×H×W`` in [0, 1] → RGB PIL images."""
    from PIL import Image

    from cosmos_sana.media_writer import to_uint8

    return [Image.fromarray(a) for a in to_uint8(images).permute(0, 2, 3, 1).numpy()]


class OcrScorer:
    def __init__(self, options: OcrOptions, device: Any) -> None:
        self.recognize = make_backend(options)

    def __call__(self, media: Any, prompts: list[str], metadata: list[dict]) -> list[float]:
        if not media.is_floating_point():
            raise MediaError(f"OCR: media must be float in [0, 1], got dtype {media.dtype}")
        if media.ndim != 4 or media.shape[-1] == 0 or media.shape[-2] == 0:
            raise MediaError(f"OCR: media must be a B×C×H×W batch of non-empty images, got shape {tuple(media.shape)}")
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
