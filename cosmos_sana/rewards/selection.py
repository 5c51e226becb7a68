"""Pick rewards on the command line (``--reward NAME[=WEIGHT]``, ``--reward-args NAME:JSON``) or from a recipe."""

from __future__ import annotations

import json
from pathlib import Path

from cosmos_sana.config import RewardRef, RewardRuntime
from cosmos_sana.settings import parse_custom
from cosmos_sana.config.recipe_file import ConfigInvalid, read_toml


class SelectionError(ValueError):
    """A ``--reward``/``--reward-args``/``--config`` value that cannot be used; says which."""


def parse_reward(text: str) -> tuple[str, float]:
    name, sep, weight = text.partition("=")
    if not name:
        raise SelectionError(f"--reward {text!r}: expected NAME or NAME=WEIGHT")
    try:
        return name, float(weight) if sep else 1.0
    except ValueError as exc:
        raise SelectionError(f"--reward {text!r}: weight {weight!r} is not a number") from exc


def parse_reward_args(text: str) -> tuple[str, dict]:
    name, sep, blob = text.partition(":")
    if not sep or not name:
        raise SelectionError(f"--reward-args {text!r}: expected NAME:JSON, e.g. 'pickscore:{{\"model\": \"/models/ps\"}}'")
    try:
        args = json.loads(blob)
    except json.JSONDecodeError as exc:
        raise SelectionError(f"--reward-args {name}: not JSON ({exc})") from exc
    if not isinstance(args, dict):
        raise SelectionError(f"--reward-args {name}: expected a JSON object, got {type(args).__name__}")
    return name, args


def select_rewards(
    rewards: list[str], reward_args: list[str], config: str | None
) -> tuple[list[RewardRef], RewardRuntime]:
    """The reward terms and runtime options: from ``config``'s ``[custom]`` table, else from the flags."""
    extra = dict(parse_reward_args(a) for a in reward_args)
    if config is not None:
        if rewards:
            raise SelectionError("give either --config or --reward, not both")
        path = Path(config)
        try:
            custom = read_toml(path).get("custom", {})
        except ConfigInvalid as exc:
            raise SelectionError(f"--config {exc}") from exc
        settings = parse_custom(custom, source=str(path))
        refs = [ref.model_copy(update={"args": {**ref.args, **extra.get(ref.name, {})}}) for ref in settings.rewards]
        runtime = settings.reward_runtime
    else:
        if not rewards:
            raise SelectionError("no reward chosen: give --reward NAME (repeatable) or --config RECIPE.toml")
        refs = [RewardRef(name=n, weight=w, args=extra.get(n, {})) for n, w in map(parse_reward, rewards)]
        runtime = RewardRuntime()
    unused = sorted(set(extra) - {ref.name for ref in refs})
    if unused:
        raise SelectionError(f"--reward-args for {unused}, which are not among the chosen rewards")
    return refs, runtime
