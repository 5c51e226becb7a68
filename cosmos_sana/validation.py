"""Strict validation of a whole recipe TOML, before anything is built.

Checks what cosmos-rl itself lets through:

* keys cosmos-rl's pydantic ``Config`` would drop silently (``timestep_fraction``
  instead of ``timesteps_fraction``), with a "did you mean" hint;
* values outside the ``choices`` its fields document but never enforce;
* cosmos-rl's own type and consistency errors, with their key paths;
* values its types let through (:mod:`cosmos_sana.value_rules`: ``epoch = 0``, ``optm_lr = nan``,
  ``mini_batch = 0``, ...) and non-finite numbers anywhere;
* our ``[custom]`` table (``extra="forbid"`` everywhere) and every plugin
  component's ``args`` against that component's params model;
* on request, the local paths it names (:mod:`cosmos_sana.local_paths`).

Every problem is reported in one pass, each with its key path.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import io
import re
import tomllib
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from cosmos_sana.config import PACKAGE_MARKER, SanaCustomConfig, wants_cosmos_sana
from cosmos_sana.config.recipe_file import ConfigInvalid, Issue, read_toml
from cosmos_sana.plugin_manager import PluginError, PluginRegistry


# ---------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` with VALUE parsed as a TOML value (bare words stay strings)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} must look like key.path=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {text!r}: {part!r} is not a table")
        node[path[-1]] = value
    return data


def load_toml(path: str | Path, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The recipe at ``path`` (:func:`~cosmos_sana.config.recipe_file.read_toml`) with ``key.path=value`` overrides."""
    return apply_overrides(read_toml(path), overrides)


# ---------------------------------------------------------------- upstream sections


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic model classes an annotation may hold (through Optional/Union/List)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_model_classes(arg))
    return found


def _is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        return True
    return any(_is_list(a) for a in typing.get_args(annotation) if typing.get_origin(a) is not None)


TABLE_EXPECTED = "must be a table"


def _is_table(annotation: Any) -> bool:
    """True when a field only takes a table: a pydantic model, or a union of models (``train_policy``)."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) is not None else (annotation,)
    members = tuple(m for m in members if m is not type(None))
    return bool(members) and all(isinstance(m, type) and issubclass(m, BaseModel) for m in members)


def _pick_variant(models: list[type[BaseModel]], value: dict[str, Any]) -> type[BaseModel] | None:
    """For a discriminated union (``train_policy``), the member matching ``type``."""
    if len(models) == 1:
        return models[0]
    tag = value.get("type")
    for model in models:
        field = model.model_fields.get("type")
        if field is not None and tag in typing.get_args(field.annotation):
            return model
    return None


#: keys whose values name registry entries (``RolloutRegistry``), not a fixed list
REGISTRY_KEYS = {"rollout.backend"}


def _choices(field: Any) -> list[Any] | None:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("choices"), list):
        return extra["choices"]
    return None


def unknown_and_out_of_choice(model: type[BaseModel], data: dict[str, Any], prefix: str) -> list[Issue]:
    """Keys ``model`` does not define, and values outside documented choices."""
    issues: list[Issue] = []
    fields = model.model_fields
    names = set(fields) | {f.alias for f in fields.values() if f.alias}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            hint = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.6)
            suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
            issues.append(Issue(path, f"unknown key; cosmos-rl would silently ignore it{suffix}"))
            continue
        field = fields.get(key) or next(f for f in fields.values() if f.alias == key)
        choices = _choices(field)
        if path in REGISTRY_KEYS:  # documented choices list only the LLM backends; plugins register more
            choices = None
        if choices is not None and not isinstance(value, (dict, list)) and value not in choices:
            issues.append(Issue(path, f"{value!r} is not one of {choices}"))
        models = _model_classes(field.annotation)
        if not models:
            continue
        if not isinstance(value, dict) and _is_table(field.annotation):
            issues.append(Issue(path, f"{value!r} {TABLE_EXPECTED} ([{path}] with its keys)"))
        elif isinstance(value, dict):
            variant = _pick_variant(models, value)
            if variant is not None:
                issues.extend(unknown_and_out_of_choice(variant, value, path))
        elif isinstance(value, list) and _is_list(field.annotation):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    variant = _pick_variant(models, item)
                    if variant is not None:
                        issues.extend(unknown_and_out_of_choice(variant, item, f"{path}[{index}]"))
    return issues


#: a location part pydantic adds for the member of a union it tried (``float``, ``list[float]``),
#: not a key of the TOML
_UNION_MEMBER = re.compile(r"^(int|float|str|bool|none|(list|dict|tuple|set|literal)\[.*\])$", re.I)


def _named_key(err: dict[str, Any]) -> str | None:
    """For an error a table's own validator raised (cosmos-rl's ``save_freq must be greater than 0``),
    the first key of that table its message names, so that the report points at the key."""
    table = err.get("input")
    if err.get("type") not in ("value_error", "assertion_error") or not isinstance(table, dict):
        return None
    named = [(m.start(), key) for key in table if (m := re.search(rf"\b{re.escape(str(key))}\b", err["msg"]))]
    return min(named)[1] if named else None


def validation_issues(exc: ValidationError, prefix: str = "") -> list[Issue]:
    """One issue per key path: a value that matches no member of a union (``optm_lr``: a float, a
    list or a dict) is one issue listing the accepted types, not one per member."""
    entries: list[tuple[str, str, bool]] = []  # (path, message or the refused value, from a union)
    members: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        # discriminated-union members appear as a tag in the location: drop it
        loc = [p for p in loc if p not in ("grpo", "sft", "function-after[check_params_value(), GrpoConfig]")]
        tried = [p for p in loc if _UNION_MEMBER.match(p)]
        loc = [p for p in loc if not _UNION_MEMBER.match(p)]
        key = _named_key(err)
        if key is not None:
            loc.append(key)
        path = ".".join(([prefix] if prefix else []) + loc) or "<root>"
        if not tried:
            entries.append((path, err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, "), False))
            continue
        if path not in members:
            entries.append((path, repr(err.get("input")), True))
        members.setdefault(path, []).extend(tried)
    return [
        Issue(path, f"{text} is none of the accepted types: {', '.join(dict.fromkeys(members[path]))}" if union else text)
        for path, text, union in entries
    ]


def check_upstream(data: dict[str, Any]) -> list[Issue]:
    """cosmos-rl's sections, strictly."""
    from cosmos_sana.compat.cosmos_rl import cosmos_config_class

    CosmosConfig = cosmos_config_class()
    upstream = {k: v for k, v in data.items() if k != "custom"}
    issues = unknown_and_out_of_choice(CosmosConfig, upstream, "")
    if any(TABLE_EXPECTED in issue.message for issue in issues):
        return issues  # cosmos-rl's own validators would index such a value as a table and crash
    if not isinstance(data.get("train"), dict):  # cosmos-rl's own checks would fail with a KeyError
        issues.append(Issue("train", "missing table: cosmos-rl requires [train] (with output_dir)"))
        return issues
    if "output_dir" not in data["train"]:
        issues.append(Issue("train.output_dir", "missing: cosmos-rl requires it"))
    try:
        CosmosConfig.model_validate(copy.deepcopy(data))
    except ValidationError as exc:
        issues.extend(validation_issues(exc))
    except (AssertionError, ValueError) as exc:
        issues.append(Issue("<cosmos-rl>", str(exc)))
    return issues


# ---------------------------------------------------------------- our section


def check_custom(data: dict[str, Any], registry: PluginRegistry | None) -> list[Issue]:
    """``[custom]`` against its models, then each plugin component's ``args``; a component is
    checked even when another part of ``[custom]`` is invalid, so one pass reports both."""
    custom = data.get("custom", {})
    try:
        SanaCustomConfig.model_validate(custom)
        issues: list[Issue] = []
    except ValidationError as exc:
        issues = validation_issues(exc, "custom")
    if registry is None:
        return issues
    plugins = custom.get("plugins")
    if isinstance(plugins, list) and all(isinstance(name, str) for name in plugins):
        issues.extend(check_required_plugins(plugins, registry))
    issues.extend(check_components(component_refs(custom), registry))
    return issues


def component_refs(custom: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``(kind, key path, ref)`` of every plugin component ``[custom]`` names whose own table
    validates (an invalid one is already reported by the ``[custom]`` model)."""
    from cosmos_sana.config import DataRef, RewardRef

    def parsed(model: type[BaseModel], raw: Any, kind: str, where: str) -> list[tuple[str, str, Any]]:
        try:
            return [(kind, where, model.model_validate(raw))] if isinstance(raw, dict) else []
        except ValidationError:
            return []

    def entries(raw: Any) -> list[Any]:
        return raw if isinstance(raw, list) else []

    refs: list[tuple[str, str, Any]] = []
    for field in ("data", "val_data", "real_data"):
        refs += parsed(DataRef, custom.get(field), "dataset", f"custom.{field}")
    for i, raw in enumerate(entries(custom.get("rewards"))):
        refs += parsed(RewardRef, raw, "reward", f"custom.rewards[{i}]")
    guards = custom.get("guards") if isinstance(custom.get("guards"), dict) else {}
    for i, raw in enumerate(entries(guards.get("holdout_rewards"))):
        refs += parsed(RewardRef, raw, "reward", f"custom.guards.holdout_rewards[{i}]")
    return refs


def check_required_plugins(required: list[str], registry: PluginRegistry) -> list[Issue]:
    present = {
        entry.distribution.split(" ")[0].lower().replace("_", "-")
        for kind in registry.kinds()
        for entry in registry.entries(kind)
    }
    return [
        Issue(f"custom.plugins[{i}]", f"distribution {name!r} provides no installed cosmos-sana plugin")
        for i, name in enumerate(required)
        if name.lower().replace("_", "-") not in present
    ]


def check_components(refs: list[tuple[str, str, Any]], registry: PluginRegistry) -> list[Issue]:
    """Each component's ``args`` against the params model of the plugin that registered its name."""
    from cosmos_sana.settings import SettingsError, component_params

    issues = []
    for kind, where, ref in refs:
        try:
            component_params(registry, kind, ref, where)
        except (SettingsError, PluginError) as exc:
            issues.append(Issue(f"{where}.name" if isinstance(exc, PluginError) else where, str(exc)))
    return issues


def check_trainer(data: dict[str, Any], registry: PluginRegistry, values_ok: bool = True) -> list[Issue]:
    """cosmos-rl's policy-worker start-up check, then the selected plugin trainer's own
    ``check_config`` (settings it cannot honour). Arithmetic errors (a division by a zero batch)
    are dropped when the value rules have already named the bad key (``values_ok`` false)."""
    from cosmos_sana.compat.cosmos_rl import (
        DIFFUSERS_SFT_PREFIX,
        check_policy_worker_config,
        cosmos_config_class,
        register_all,
    )

    key = data.get("train", {}).get("train_policy", {}).get("trainer_type")
    if key is None:
        return []
    with contextlib.redirect_stdout(io.StringIO()):  # cosmos-rl's model auto-discovery prints at import
        register_all(registry)
    try:
        check_policy_worker_config(cosmos_config_class().model_validate(copy.deepcopy(data)))
    except ArithmeticError as exc:
        return [] if not values_ok else [Issue("train", f"cosmos-rl's policy worker would fail on this config: {exc}")]
    except ValueError as exc:
        return [Issue("train", f"cosmos-rl's policy worker would refuse this config: {exc}")]
    wanted = {key, f"{DIFFUSERS_SFT_PREFIX}{key}"}  # cosmos-rl's SFT path prefixes the key
    for entry in registry.entries("trainer"):
        if (entry.spec.trainer_type or entry.spec.name) in wanted:
            check = getattr(entry.spec.load(), "check_config", None)
            if check is None:
                return []
            try:
                check(cosmos_config_class().model_validate(copy.deepcopy(data)))
            except ArithmeticError as exc:
                return [] if not values_ok else [Issue(f"trainer {key!r}", f"fails on this config: {exc}")]
            except ValueError as exc:
                return [Issue(f"trainer {key!r}", str(exc))]
    return []


# ---------------------------------------------------------------- values and paths


def upstream_default(key: str, data: dict[str, Any]) -> Any:
    """cosmos-rl's default of a dotted key (through the ``train_policy`` variant ``data`` picks)."""
    from cosmos_sana.compat.cosmos_rl import cosmos_config_class

    model: type[BaseModel] | None = cosmos_config_class()
    node: Any = data
    parts = key.split(".")
    for index, part in enumerate(parts):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        if index == len(parts) - 1:
            return field.get_default(call_default_factory=True)
        node = node.get(part)
        node = node if isinstance(node, dict) else {}  # a value where a table belongs is reported elsewhere
        models = _model_classes(field.annotation)
        model = _pick_variant(models, node) if models else None
        if model is None and models:
            model = models[0]
    return None


def check_values(data: dict[str, Any], ours: bool) -> list[Issue]:
    """Values pydantic's types let through: non-finite numbers anywhere, the bounds of
    :data:`cosmos_sana.value_rules.RULES`, rules between keys and, for a local model, the image grid."""
    from cosmos_sana import local_paths, value_rules

    found = value_rules.rule_issues(data)
    if ours:
        found += value_rules.relation_issues(data, lambda key: upstream_default(key, data))
    found += local_paths.inference_size_issues(data)
    return [Issue(path, message) for path, message in found]


def check_paths(data: dict[str, Any]) -> list[Issue]:
    from cosmos_sana.local_paths import path_issues

    return [Issue(path, message) for path, message in path_issues(data)]


def check_package(data: dict[str, Any]) -> list[Issue]:
    """A ``[custom]`` table that names no package or another one: without the marker nothing in
    ``[custom]`` would be checked, and cosmos-sana would not load at launch."""
    custom = data.get("custom")
    if not isinstance(custom, dict):
        return []
    if "package" not in custom:
        return [Issue("custom.package", f'missing: set package = "{PACKAGE_MARKER}" to use cosmos-sana')]
    return [Issue("custom.package", f'{custom["package"]!r} is not a known package; cosmos-sana recipes say '
                                    f'package = "{PACKAGE_MARKER}"')]


# ---------------------------------------------------------------- whole file


def validate_data(
    data: dict[str, Any], registry: PluginRegistry | None, paths: bool = False, startup_check: bool = True
) -> list[Issue]:
    """Every problem of a TOML dict; with ``paths``, also the local files it names that are missing.
    ``startup_check=False`` leaves out :func:`check_trainer` (its imports take seconds), for a launch
    whose controller runs it instead (:func:`check_at_startup`)."""
    structural = check_upstream(data)
    ours = wants_cosmos_sana(data)
    if ours:
        structural.extend(check_custom(data, registry))
    else:
        structural.extend(check_package(data))
    values = check_values(data, ours)
    # a value rule names the value and what its key accepts: at the same key it replaces pydantic's
    # type message ("Input should be a valid string" for redis = 12800)
    ruled = {issue.path for issue in values}
    issues = [issue for issue in structural if issue.path not in ruled] + values
    if paths:
        issues.extend(check_paths(data))
    if ours and not structural and registry is not None and startup_check:
        trainer = check_trainer(data, registry, values_ok=not values)
        issues.extend(issue for issue in trainer if issue not in issues)
    return issues


def validate_file(
    path: str | Path,
    overrides: Iterable[str] = (),
    registry: PluginRegistry | None = None,
    paths: bool = False,
    startup_check: bool = True,
) -> dict:
    """Validated TOML data (overrides applied); raises :class:`ConfigInvalid` listing every problem."""
    data = load_toml(path, overrides)
    issues = validate_data(data, registry, paths, startup_check)
    if issues:
        raise ConfigInvalid(str(path), issues)
    return data


# ---------------------------------------------------------------- at launch


TRAINER_TYPE_KEY = "train.train_policy.trainer_type"


class StartupCheckError(ValueError):
    """:func:`check_trainer` refused a config a launch is starting with. The message is one line that
    starts with the trainer-type key, so the launcher's failure report shows all of it."""


def check_at_startup(path: str | Path, registry: PluginRegistry) -> None:
    """:func:`check_trainer` on the recipe at ``path`` (cosmos-rl's policy-worker start-up check, then
    the selected trainer's ``check_config``), for a process that imports cosmos-rl anyway: the
    controller of a launch whose ``cosmos-sana validate`` left it out (``--no-startup-check``)."""
    data = read_toml(path)
    issues = check_trainer(data, registry)
    if issues:
        key = data.get("train", {}).get("train_policy", {}).get("trainer_type")
        found = "; ".join(f"{issue.path}: {issue.message}" for issue in issues).replace("\n", " ")
        raise StartupCheckError(f"{TRAINER_TYPE_KEY} = {key!r}: the start-up check refused the config: {found}")
