"""Write a small captioned image dataset (the ``folder`` layout: NAME.png + NAME.txt) for device runs.

    python scripts/device/make_image_dataset.py OUT_DIR [--count 64] [--size 512] [--seed 0]

Each image is a flat background with one filled shape; its caption names the shape and both colours,
so a fine-tuned model has something learnable. Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 70), "blue": (40, 80, 220), "yellow": (240, 210, 40),
           "black": (20, 20, 20), "white": (245, 245, 245), "orange": (245, 140, 30), "purple": (130, 50, 170)}
SHAPES = ("circle", "square", "triangle")


def draw_sample(rng: random.Random, size: int) -> tuple[Image.Image, str]:
    background, foreground = rng.sample(sorted(COLOURS), 2)
    shape = rng.choice(SHAPES)
    image = Image.new("RGB", (size, size), COLOURS[background])
    draw = ImageDraw.Draw(image)
    half = rng.randint(size // 6, size // 3)
    cx, cy = rng.randint(half, size - half), rng.randint(half, size - half)
    box = (cx - half, cy - half, cx + half, cy + half)
    if shape == "circle":
        draw.ellipse(box, fill=COLOURS[foreground])
    elif shape == "square":
        draw.rectangle(box, fill=COLOURS[foreground])
    else:
        draw.polygon([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)], fill=COLOURS[foreground])
    return image, f"a {foreground} {shape} on a {background} background"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    for index in range(args.count):
        image, caption = draw_sample(rng, args.size)
        image.save(args.out / f"{index:05d}.png")
        (args.out / f"{index:05d}.txt").write_text(caption + "\n")
    print(f"wrote {args.count} images of {args.size}px to {args.out}")


if __name__ == "__main__":
    main()
