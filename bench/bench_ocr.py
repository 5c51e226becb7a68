"""Tesseract OCR reward: read time and reward values of today's way vs candidate settings, interleaved.

    python bench/bench_ocr.py [--threads 2] [--repeats 3] [--variants today library ...] [--json-out FILE]

Images (512², seeded): the quoted texts of ``builtin:ocr`` rendered in the DejaVu fonts at 18–64 px,
dark on light, light on dark, on a sign over a smooth noisy scene (blurred, with pixel noise), with a
one-letter typo; and images without text like an untrained model's output (flat colour, pixel noise,
smooth and mid-frequency noise fields); fields of fine horizontal stripes over 32-pixel colour blocks
like a 512² SANA's rollouts after a few RL steps from random weights (``striped``); with ``--images
DIR``, a model's generated PNGs too. Batches of 16 like a 512² SANA step: ``early`` (no text),
``text``, ``text2``, ``mixed`` and ``striped``. Each round times every variant on each batch in turn,
the variants' order rotating from batch to batch, so a machine shared with other work slows all
variants alike.

Accuracy vs ``today``: mean |reward difference| on the text and the no-text images, whether every
image ``today`` reads exactly (reward 1) is still read exactly, and the mean reward vs the reward
the rendered text should get (1, or the typo's hand-computed value). Per variant and batch: the
median milliseconds per image and how many reads ``max_words`` or ``cpu_limit_ms`` stopped (first round).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import ChainMap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

SIZE = 512
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
PROMPTS = Path(__file__).resolve().parents[1] / "plugins/cosmos_sana_plugins/datasets/prompts/ocr.txt"

#: the worker pool as it read before ``max_words`` and ``cpu_limit_ms``: every read to its end
_LIBRARY: dict[str, Any] = {"engine": "library", "max_words": None, "cpu_limit_ms": None}

#: name → TesseractBackend arguments (``today`` is the previous code: the program once per image)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "today": None,
    "program_pool": {"engine": "program"},
    "library": _LIBRARY,
    "library_words150": {**_LIBRARY, "max_words": 150},
    "library_words200": {**_LIBRARY, "max_words": 200},
    "library_limit50": {**_LIBRARY, "cpu_limit_ms": 50},
    "library_limit100": {**_LIBRARY, "cpu_limit_ms": 100},
    "library_para_first": {**_LIBRARY, "variables": {"paragraph_text_based": "0"}},
    "library_psm11": {**_LIBRARY, "psm": 11},
    "library_psm6": {**_LIBRARY, "psm": 6},
    "library_psm7": {**_LIBRARY, "psm": 7},
    "library_max384": {**_LIBRARY, "max_side": 384},
    "library_max256": {**_LIBRARY, "max_side": 256},
    "library_no_invert": {**_LIBRARY, "variables": {"tessedit_do_invert": "0"}},
}


class SpawnPerImage:
    """The OCR backend before the worker pool: pytesseract starts the program once per image,
    ``threads`` at a time, each single-threaded (``OMP_THREAD_LIMIT=1``)."""

    def __init__(self, threads: int) -> None:
        import pytesseract

        if not isinstance(pytesseract.pytesseract.environ, ChainMap):
            pytesseract.pytesseract.environ = ChainMap(os.environ, {"OMP_THREAD_LIMIT": "1"})
        self.threads, self._pytesseract = threads, pytesseract

    def __call__(self, images: list[Any]) -> list[str]:
        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(self._pytesseract.image_to_string, images))

    def close(self) -> None:
        pass


# -- images ---------------------------------------------------------------------------------------


@functools.cache
def fonts() -> list[Path]:
    found = sorted(p for p in FONT_DIR.glob("*.ttf") if "Math" not in p.name)
    if not found:
        raise SystemExit(f"no DejaVu fonts in {FONT_DIR} (Debian: fonts-dejavu-core)")
    return found


def smooth_noise(rng: np.random.Generator, grid: int) -> Image.Image:
    cells = (rng.random((grid, grid, 3)) * 255).astype(np.uint8)
    return Image.fromarray(cells).resize((SIZE, SIZE), Image.Resampling.BICUBIC)


def striped(rng: np.random.Generator) -> Image.Image:
    """Fine horizontal stripes over 32-pixel colour blocks, like a 512² SANA's rollouts after a few RL
    steps from random weights: one colour with blocks a few levels apart; each row offset per channel
    (a 16-row pattern plus noise) across the whole width, and again per 32-pixel column block; colour
    varying slowly along each row. Tesseract segments such a field into hundreds of word candidates."""
    cells = SIZE // 32
    blocks = rng.integers(60, 200, 3) + rng.normal(0, 8, (cells, cells, 3))
    image = np.repeat(np.repeat(blocks, 32, 0), 32, 1)
    rows = np.tile(rng.normal(0, 20, (16, 3)), (SIZE // 16, 1)) + rng.normal(0, 15, (SIZE, 3))
    image += rows[:, None, :] + np.repeat(rng.normal(0, 10, (SIZE, cells, 3)), 32, 1)
    knots = rng.normal(0, 7, (SIZE, SIZE // 8 + 1, 3))  # along each row: linear between every 8th pixel
    x = np.arange(SIZE) / 8
    left, weight = x.astype(int), (x - x.astype(int))[None, :, None]
    image += knots[:, left] * (1 - weight) + knots[:, left + 1] * weight
    return Image.fromarray(image.clip(0, 255).astype(np.uint8))


def typo(text: str, rng: np.random.Generator) -> str:
    """``text`` with one letter replaced by another letter (one substitution)."""
    letters = [i for i, c in enumerate(text) if c.isalpha()]
    i = letters[rng.integers(len(letters))]
    choices = [c for c in "abcdefghijklmnopqrstuvwxyz" if c != text[i].lower()]
    return text[:i] + str(rng.choice(choices)) + text[i + 1:]


def draw_text(image: Image.Image, text: str, font: ImageFont.FreeTypeFont, colour: tuple, rng: np.random.Generator,
              box: tuple[int, int, int, int] = (0, 0, SIZE, SIZE)) -> None:
    """Text (on two lines when too wide) at a random place inside ``box``."""
    draw = ImageDraw.Draw(image)
    lines = [text]
    if draw.textlength(text, font=font) > box[2] - box[0] - 24 and " " in text:
        words = text.split()
        lines = [" ".join(words[: len(words) // 2]), " ".join(words[len(words) // 2:])]
    body = "\n".join(lines)
    left, top, right, bottom = draw.multiline_textbbox((0, 0), body, font=font)
    free_x = max(1, box[2] - box[0] - (right - left) - 16)
    free_y = max(1, box[3] - box[1] - (bottom - top) - 16)
    x = box[0] + 8 + int(rng.integers(free_x)) - left
    y = box[1] + 8 + int(rng.integers(free_y)) - top
    draw.multiline_text((x, y), body, font=font, fill=colour, spacing=8)


def render(kind: str, text: str, rng: np.random.Generator) -> tuple[Image.Image, float | None]:
    """One 512² image and the reward its text should get (None: no text)."""
    font_file = fonts()[rng.integers(len(fonts()))]
    light = tuple(int(v) for v in rng.integers(190, 256, 3))
    dark = tuple(int(v) for v in rng.integers(0, 70, 3))
    if kind in ("plain", "typo", "small"):
        size = int(rng.integers(18, 25)) if kind == "small" else int(rng.integers(32, 65))
        shown = typo(text, rng) if kind == "typo" else text
        image = Image.new("RGB", (SIZE, SIZE), light)
        draw_text(image, shown, ImageFont.truetype(str(font_file), size), dark, rng)
        from cosmos_sana_plugins.rewards.ocr import ocr_reward

        return image, ocr_reward(shown, text)
    if kind == "inverted":
        image = Image.new("RGB", (SIZE, SIZE), dark)
        draw_text(image, text, ImageFont.truetype(str(font_file), int(rng.integers(32, 65))), light, rng)
        return image, 1.0
    if kind == "scene":
        image = smooth_noise(rng, int(rng.integers(4, 12)))
        top = int(rng.integers(60, 260))
        sign = (24, top, SIZE - 24, top + 190)
        ImageDraw.Draw(image).rectangle(sign, fill=light)
        draw_text(image, text, ImageFont.truetype(str(font_file), int(rng.integers(30, 56))), dark, rng, sign)
        image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.2))))
        noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 8, (SIZE, SIZE, 3))
        return Image.fromarray(noisy.clip(0, 255).astype(np.uint8)), 1.0
    if kind == "flat":
        return Image.new("RGB", (SIZE, SIZE), tuple(int(v) for v in rng.integers(0, 256, 3))), None
    if kind == "pixel_noise":
        return Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)), None
    if kind == "smooth_noise":
        return smooth_noise(rng, int(rng.integers(6, 24))), None
    if kind == "mid_noise":
        return smooth_noise(rng, int(rng.integers(48, 128))), None
    if kind == "striped":
        return striped(rng), None
    raise ValueError(f"unknown image kind {kind!r}")


TEXT_KINDS = ("plain", "inverted", "scene", "small", "typo")
BLANK_KINDS = ("flat", "pixel_noise", "smooth_noise", "mid_noise")


def image_set(seed: int) -> dict[str, list[dict[str, Any]]]:
    """Batches ``early`` (16 without text), ``text`` (2 × 16 with text), ``mixed`` (8 + 8) and ``striped``
    (16; from a generator of their own, so the other batches are the same images with or without them)."""
    from cosmos_sana_plugins.rewards.ocr import target_text

    rng = np.random.default_rng(seed)
    texts = [target_text(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    with_text = [(k, t) for k in TEXT_KINDS for t in texts]  # 5 kinds × 8 texts = 40
    rng.shuffle(with_text)
    without = [(BLANK_KINDS[i % len(BLANK_KINDS)], texts[i % len(texts)]) for i in range(24)]

    def item(kind: str, text: str, rng: np.random.Generator = rng) -> dict[str, Any]:
        image, ideal = render(kind, text, rng)
        return {"kind": kind, "target": text, "image": image, "ideal": ideal}

    batches = {
        "early": [item(*x) for x in without[:16]],
        "text": [item(*x) for x in with_text[:16]],
        "text2": [item(*x) for x in with_text[16:32]],
        "mixed": [item(*x) for x in with_text[32:40] + without[16:24]],
    }
    striped_rng = np.random.default_rng([seed, 1])
    batches["striped"] = [item("striped", texts[i % len(texts)], striped_rng) for i in range(16)]
    return batches


def generated(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Batches ``generated``, ``generated2``, … of a model's images; scored against the prompts' texts in turn."""
    from cosmos_sana_plugins.rewards.ocr import target_text

    texts = [target_text(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    files = sorted(folder.glob("*.png"))
    if not files:
        raise SystemExit(f"no *.png in {folder}")
    items = [{"kind": "generated", "target": texts[i % len(texts)], "image": Image.open(f).convert("RGB"),
              "ideal": None} for i, f in enumerate(files)]
    return {f"generated{'' if i == 0 else i // 16 + 1}": items[i:i + 16] for i in range(0, len(items), 16)}


# -- measurement ----------------------------------------------------------------------------------


def build(name: str, threads: int) -> Any:
    from cosmos_sana_plugins.rewards.ocr import TesseractBackend

    args = VARIANTS[name]
    return SpawnPerImage(threads) if args is None else TesseractBackend(threads=threads, **args)


def accuracy(rewards: dict[str, list[float]], items: list[dict[str, Any]], baseline: str) -> dict[str, dict]:
    text = [i for i, item in enumerate(items) if item["ideal"] is not None]
    blank = [i for i, item in enumerate(items) if item["ideal"] is None]
    exact = [i for i in text if rewards[baseline][i] == 1.0]
    out = {}
    for name, values in rewards.items():
        out[name] = {
            "mean_abs_diff_vs_today_text": statistics.fmean(abs(values[i] - rewards[baseline][i]) for i in text),
            "mean_abs_diff_vs_today_no_text": statistics.fmean(abs(values[i] - rewards[baseline][i]) for i in blank),
            "exact_reads_kept": f"{sum(values[i] == 1.0 for i in exact)}/{len(exact)}",
            "exact_reads": sum(values[i] == 1.0 for i in text),
            "mean_reward_text": statistics.fmean(values[i] for i in text),
            "mean_abs_error_vs_rendered": statistics.fmean(abs(values[i] - items[i]["ideal"]) for i in text),
            "mean_reward_no_text": statistics.fmean(values[i] for i in blank),
            "by_kind_mean_reward": {
                kind: round(statistics.fmean(values[i] for i, it in enumerate(items) if it["kind"] == kind), 4)
                for kind in dict.fromkeys(item["kind"] for item in items)
            },
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=min(8, len(os.sched_getaffinity(0))))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--machine", default="", help="a label for the machine, stored in the JSON")
    parser.add_argument("--images", help="a folder of generated *.png to read too, in batches of 16 (no text assumed)")
    parser.add_argument("--json-out")
    options = parser.parse_args()
    names = ["today"] + [n for n in options.variants if n != "today"]

    from benchlib import write_json

    from cosmos_sana_plugins.rewards.ocr import ocr_reward

    batches = image_set(options.seed)
    if options.images:
        batches.update(generated(Path(options.images)))
    items = [item for batch in batches.values() for item in batch]
    backends, startup = {}, {}
    for name in names:
        began = time.perf_counter()
        backends[name] = build(name, options.threads)
        backends[name]([batches["early"][0]["image"]])  # starts a pool's workers
        startup[name] = time.perf_counter() - began
    seconds: dict[str, dict[str, list[float]]] = {n: {b: [] for b in batches} for n in names}
    by_batch: dict[str, dict[str, list[str]]] = {n: {} for n in names}
    cut: dict[str, dict[str, int]] = {n: {} for n in names}  # reads stopped by max_words or cpu_limit_ms, first round
    for round_ in range(options.repeats):
        for shift, (batch_name, batch) in enumerate(batches.items()):
            turn = (round_ + shift) % len(names)
            for name in names[turn:] + names[:turn]:
                pool = getattr(backends[name], "pool", None)
                cut_before = pool.cut_reads if pool else 0
                began = time.perf_counter()
                read = backends[name]([item["image"] for item in batch])
                seconds[name][batch_name].append(time.perf_counter() - began)
                by_batch[name].setdefault(batch_name, read)
                cut[name].setdefault(batch_name, (pool.cut_reads if pool else 0) - cut_before)
    texts = {n: [t for b in batches for t in by_batch[n][b]] for n in names}
    for backend in backends.values():
        backend.close()

    rewards = {n: [ocr_reward(t, item["target"]) for t, item in zip(texts[n], items)] for n in names}
    quality = accuracy(rewards, items, "today")
    per_image = {n: sum(statistics.median(v) for v in seconds[n].values()) / len(items) for n in names}
    results: dict[str, Any] = {
        "bench": "ocr",
        "machine": options.machine,
        "config": {"threads": options.threads, "repeats": options.repeats, "seed": options.seed, "size": SIZE,
                   "batch": 16, "images": len(items), "batches": {b: len(v) for b, v in batches.items()}},
        "baseline": "today",
        "variants": {},
    }
    for name in names:
        results["variants"][name] = {
            "settings": VARIANTS[name],
            "startup_s": startup[name],
            "median_s_per_batch": {b: statistics.median(v) for b, v in seconds[name].items()},
            "median_ms_per_image": {b: 1e3 * statistics.median(v) / len(batches[b]) for b, v in seconds[name].items()},
            "reads_cut_at_cpu_limit": cut[name],
            "images_per_s": 1 / per_image[name],
            "speedup_vs_today": per_image["today"] / per_image[name],
            "same_text_as_today": sum(a == b for a, b in zip(texts[name], texts["today"])) / len(items),
            **quality[name],
        }
    write_json(results, options.json_out)


if __name__ == "__main__":
    main()
