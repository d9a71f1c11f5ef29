"""The config, checked before any job starts: the JSON schema (workflow/schemas/config.schema.yaml for the
keys every run has, each unit's SCHEMA for its own section), then what a schema cannot express. Each
error names the offending key."""
from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


def experiment_schema(settings: dict) -> dict:
    """A unit's schema of one experiment: {setting: its schema}, each setting required and no other allowed
    (or a whole schema by reference, {"$ref": ...})."""
    if "$ref" in settings:
        return copy.deepcopy(settings)
    return {"type": "object", "additionalProperties": False, "required": list(settings),
            "properties": copy.deepcopy(settings)}


def schema(units: dict[str, dict]) -> dict:
    """The whole config's schema: the top level's, with one section per unit (``units``: kernel -> its
    SCHEMA, {experiment: {setting: schema}}). A section may be left out; a key no unit declares may not."""
    full = yaml.safe_load(SCHEMA.read_text())
    for kernel, experiments in units.items():
        full["properties"][kernel] = {"type": "object", "additionalProperties": False,
                                      "properties": {e: experiment_schema(s) for e, s in experiments.items()}}
    return full


def validate(config: dict, units: dict[str, dict]) -> None:
    e = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema(units)).iter_errors(config))
    if e is not None:
        where = ".".join(map(str, e.absolute_path)) or "(top level)"
        raise ConfigError(f"config key {where}: {e.message} (schema rule '{e.validator}')")


def _ranges(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _ranges(value, f"{path}.{key}" if path else key)
    elif path.rsplit(".", 1)[-1].startswith("log2_") and isinstance(node, list) and len(node) == 2:
        yield path, node


def check(config: dict, experiments: dict) -> None:
    """``experiments``: the registry ('kernel/name' -> Experiment) the config's sections must name."""
    kernels = {e.kernel for e in experiments.values()}
    for kernel in kernels:
        for name in config.get(kernel, {}) or {}:
            if f"{kernel}/{name}" not in experiments:
                known = sorted(e.name for e in experiments.values() if e.kernel == kernel)
                raise ConfigError(f"config key {kernel}.{name}: no such experiment; {kernel} has {known}")
    for path, (first, last) in _ranges(config):
        if first > last:
            raise ConfigError(f"config key {path}: range [{first}, {last}] is empty (first > last)")
