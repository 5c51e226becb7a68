"""Value rules for a recipe's cosmos-rl sections: what their pydantic models accept but a run cannot use.

cosmos-rl types its fields (``int``, ``float``) without bounds, so ``epoch = 0``, ``optm_lr = nan``
or ``mini_batch = 0`` validate and then fail late, silently, or with a raw ``ZeroDivisionError``.
:func:`rule_issues` checks a raw TOML dict against :data:`RULES` (one key each) and nan/inf anywhere,
:func:`relation_issues` the rules that relate several keys; every problem is reported with its key path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MISSING = object()

#: the ``[train.train_policy] type`` of the RL trainers (cosmos-rl's GRPO config carries all of them)
RL_POLICY_TYPE = "grpo"


def lookup(data: dict[str, Any], dotted: str) -> Any:
    """The value at ``a.b.c`` in a raw TOML dict, or :data:`MISSING`."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def under_tables(data: dict[str, Any], dotted: str) -> bool:
    """False when a parent of ``a.b.c`` is given but is not a table (``rollout = 1``): its default
    does not apply then, the parent itself is the error."""
    node: Any = data
    for part in dotted.split(".")[:-1]:
        if part not in node:
            return True
        node = node[part]
        if not isinstance(node, dict):
            return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(value: Any) -> bool:
    return _is_int(value) and value >= 1


def _learning_rates(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return list(value.values())
    return [value]


def learning_rate(value: Any) -> bool:
    """``optm_lr`` may be one rate, a list or a dict of rates; each finite and >= 0."""
    rates = _learning_rates(value)
    return bool(rates) and all(_is_number(r) and math.isfinite(r) and r >= 0 for r in rates)


def redis_port(value: Any) -> bool:
    """cosmos-rl's ``redis`` is a port number as a string ("" lets the controller pick one)."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    return value == "" or (text.isdigit() and 1 <= int(text) <= 65535)


def fraction(value: Any) -> bool:
    return _is_number(value) and 0.0 < value <= 1.0


def non_negative(value: Any) -> bool:
    return _is_number(value) and value >= 0


def keep_count(value: Any) -> bool:
    return _is_int(value) and (value >= 1 or value == -1)


def size_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(positive_int(v) for v in value)


def adam_betas(value: Any) -> bool:
    """torch's Adam/AdamW refuse a beta outside [0, 1) only when the optimizer is built."""
    return isinstance(value, list) and len(value) == 2 and all(_is_number(b) and 0.0 <= b < 1.0 for b in value)


#: the sampling steps a recipe may ask for: SANA's schedulers train on 1000 timesteps, so more steps add
#: no precision, while RL keeps every step's latents (a typo such as 100000 would exhaust memory late)
MAX_SAMPLING_STEPS = 1000


def sampling_steps(value: Any) -> bool:
    return _is_int(value) and 1 <= value <= MAX_SAMPLING_STEPS


def non_empty_names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


@dataclass(frozen=True)
class Rule:
    key: str
    test: Callable[[Any], bool]
    requirement: str


RULES: tuple[Rule, ...] = (
    Rule("redis", redis_port, 'must be a port number 1-65535 as a string, e.g. "12800" ("" picks one)'),
    Rule("train.epoch", positive_int, "must be an integer >= 1"),
    Rule("train.max_num_steps", positive_int, "must be an integer >= 1 (or unset)"),
    Rule("train.train_batch_per_replica", positive_int, "must be an integer >= 1"),
    Rule("train.output_dir", lambda v: isinstance(v, str) and bool(v.strip()), 'must name a folder, e.g. "outputs/run"'),
    Rule("train.optm_lr", learning_rate, "must be a finite learning rate >= 0"),
    Rule("train.optm_warmup_steps", lambda v: _is_number(v) and v >= 0, "must be >= 0"),
    Rule("train.optm_betas", adam_betas, "must be [beta1, beta2], each in [0, 1), e.g. [0.9, 0.999]"),
    Rule("train.optm_weight_decay", non_negative, "must be >= 0 (0 turns weight decay off)"),
    Rule("train.epsilon", non_negative, "must be >= 0 (the optimizer's epsilon, e.g. 1e-8)"),
    Rule("train.train_policy.mini_batch", positive_int, "must be an integer >= 1"),
    Rule("train.train_policy.kl_beta", non_negative, "must be >= 0 (0 turns the KL term off)"),
    Rule("train.ckpt.max_keep", keep_count, "must be an integer >= 1, or -1 to keep every checkpoint"),
    Rule("rollout.batch_size", positive_int, "must be an integer >= 1"),
    Rule("rollout.n_generation", positive_int, "must be an integer >= 1"),
    Rule("rollout.n_generation_mini_batch", positive_int, "must be an integer >= 1 (or unset)"),
    Rule("validation.batch_size", positive_int, "must be an integer >= 1 (or unset)"),
    Rule("validation.freq", positive_int, "must be an integer >= 1"),
    Rule("validation.n_generation", positive_int, "must be an integer >= 1"),
    Rule("policy.lora.r", positive_int, "must be an integer >= 1 (the LoRA rank)"),
    Rule("policy.lora.lora_alpha", lambda v: _is_number(v) and v > 0, "must be > 0"),
    Rule("policy.lora.lora_names", non_empty_names, "must name at least one adapter"),
    Rule("policy.diffusers.inference_size", size_pair, "must be [height, width], both integers >= 1"),
    Rule("policy.diffusers.max_prompt_length", positive_int, "must be an integer >= 1"),
    Rule("policy.diffusers.train_frames", positive_int, "must be an integer >= 1"),
    Rule("policy.diffusers.inference_frames", positive_int, "must be an integer >= 1"),
    Rule("policy.diffusers.timesteps_fraction", fraction, "must be in (0, 1]"),
    Rule("policy.diffusers.sample.num_steps", sampling_steps, f"must be an integer in [1, {MAX_SAMPLING_STEPS}]"),
    Rule("policy.diffusers.sample.eval_num_steps", sampling_steps,
         f"must be an integer in [1, {MAX_SAMPLING_STEPS}]"),
    Rule("policy.diffusers.sample.guidance_scale", non_negative,
         "must be >= 0 (values up to 1 sample without classifier-free guidance)"),
    Rule("policy.diffusers.sample.noise_level", non_negative, "must be >= 0 (the SDE noise level eta; 0 adds no noise)"),
)


def non_finite_numbers(node: Any, prefix: str = "") -> Iterator[str]:
    """Key paths (``a.b.0.c``, as pydantic writes them) of every nan/inf float in a TOML tree."""
    if isinstance(node, float) and not math.isfinite(node):
        yield prefix or "<root>"
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from non_finite_numbers(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from non_finite_numbers(value, f"{prefix}.{index}" if prefix else str(index))


def rule_issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, message)`` for every non-finite number and every :data:`RULES` entry a value breaks."""
    found = [(path, "must be a finite number (nan and inf are not accepted)") for path in non_finite_numbers(data)]
    flagged = {path for path, _ in found}
    for rule in RULES:
        value = lookup(data, rule.key)
        if value is MISSING or rule.key in flagged:
            continue
        if not rule.test(value):
            found.append((rule.key, f"{value!r}: {rule.requirement}"))
    return found


def relation_issues(data: dict[str, Any], defaults: Callable[[str], Any]) -> list[tuple[str, str]]:
    """Rules between keys; ``defaults(key)`` gives cosmos-rl's default of a key the TOML leaves out."""
    found: list[tuple[str, str]] = []

    def get(key: str) -> Any:
        value = lookup(data, key)
        if value is not MISSING:
            return value
        return defaults(key) if under_tables(data, key) else None

    is_rl = get("train.train_policy.type") == RL_POLICY_TYPE
    custom = data.get("custom") if isinstance(data.get("custom"), dict) else {}
    if is_rl and not custom.get("rewards"):
        found.append(("custom.rewards", "an RL recipe needs at least one [[custom.rewards]] entry to score rollouts"))
    n, batch = get("rollout.n_generation"), get("train.train_batch_per_replica")
    if is_rl and positive_int(n) and positive_int(batch) and batch % n:
        found.append((
            "train.train_batch_per_replica",
            f"{batch} is not a multiple of rollout.n_generation ({n}): every prompt's {n} samples form one group",
        ))
    mini_batch = get("train.train_policy.mini_batch")
    if is_rl and positive_int(mini_batch) and positive_int(batch) and batch % mini_batch:
        found.append((
            "train.train_policy.mini_batch",
            f"{mini_batch} does not divide train.train_batch_per_replica ({batch}): each optimizer step takes "
            f"mini_batch samples of every replica's batch",
        ))
    # the RL trainers train K = max(1, int(num_steps * timesteps_fraction)) steps per sample: a fraction
    # worth less than half a step would silently train a whole one (1e-9 of 4 steps trains 25%)
    fraction_, steps = get("policy.diffusers.timesteps_fraction"), get("policy.diffusers.sample.num_steps")
    if is_rl and fraction(fraction_) and sampling_steps(steps) and steps * fraction_ < 0.5:
        found.append((
            "policy.diffusers.timesteps_fraction",
            f"{fraction_!r} of {steps} sampling steps is {steps * fraction_:.3g} step, and the trainer trains at "
            f"least 1: set it to 1/{steps} = {1 / steps:.4g} (one step) or more",
        ))
    best_of_n = lookup(data, "custom.rollout.best_of_n")
    drafts = best_of_n.get("num_drafts") if isinstance(best_of_n, dict) else None
    if positive_int(n) and positive_int(drafts) and n > drafts:
        found.append((
            "rollout.n_generation",
            f"{n} exceeds custom.rollout.best_of_n.num_drafts ({drafts}): best-of-n keeps n_generation of the drafts",
        ))
    return found

