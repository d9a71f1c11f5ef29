"""The config, checked before any job starts: the JSON schema (workflow/schemas/config.schema.yaml for the
keys every run has, each unit's SCHEMA for its own section), then what a schema cannot express. Each
error names the offending key."""
from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import jsonschema
import yaml

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


def experiment_schema(settings: dict) -> dict:
    """A unit's schema of one experiment: {setting: its schema}, each setting required and no other allowed."""
    return {"type": "object", "additionalProperties": False, "required": list(settings),
            "properties": copy.deepcopy(settings)}


def schema(units: dict[str, dict]) -> dict:
    """The whole config's schema: the top level's, with one section per unit (``units``: kernel -> its
    SCHEMA, {experiment: {setting: schema}}). A section may be left out; a key no unit declares may not."""
    full = yaml.safe_load(SCHEMA.read_text())
    for kernel, experiments in units.items():
        if kernel in full["properties"]:
            raise ConfigError(f"the unit {kernel} (workflow/lab/units/{kernel}.py) is named as the config's top-level "
                              f"key {kernel!r}, whose section it would replace: rename the unit")
        full["properties"][kernel] = {"type": "object", "additionalProperties": False,
                                      "properties": {e: experiment_schema(s) for e, s in experiments.items()}}
    return full


# Strict types: 1.0 is not an integer (JSON Schema's default says it is), True is not a number, nor are
# NaN and infinity (they pass every minimum/maximum: no comparison with NaN is false).
_STRICT = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=(
    jsonschema.Draft202012Validator.TYPE_CHECKER
    .redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    .redefine("number", lambda _, x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))))


def validate(config: dict, units: dict[str, dict]) -> None:
    e = jsonschema.exceptions.best_match(_STRICT(schema(units)).iter_errors(config))
    if e is not None:
        where = ".".join(map(str, e.absolute_path)) or "(top level)"
        raise ConfigError(f"config key {where}: {e.message} (schema rule '{e.validator}')")


def _types(node: dict) -> set:
    kind = node.get("type", ())
    return {kind} if isinstance(kind, str) else set(kind)


def _parsed(text: str, types: set):
    """A command-line string as the type the schema asks for (as it stands when it is none of them)."""
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind, parse in (("integer", int), ("number", float)):
        if kind in types:
            try:
                return parse(text)
            except ValueError:
                pass
    return text


def _as_typed(key: str, value, argv: list[str]) -> str:
    """A top-level text value that Snakemake parsed as a number (``run=007`` arrives as 7, ``run=1e3`` as 1000.0):
    the text as typed, from the command line, where it is there."""
    typed = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{key}=")]
    return typed[-1] if typed else str(value)


def from_command_line(config: dict, given: dict, units: dict[str, dict], argv: list[str] | None = None) -> None:
    """Values given with ``--config key=value`` arrive as strings wherever Snakemake does not parse them (a
    YAML mapping such as ``softmax='{bug: {n_rows: 3}}'`` holds only strings, and ``true`` stays a string):
    each becomes the type the schema asks for at its key, in place in ``config``. Values from files keep
    their types (a YAML file's types are checked as they are). A top-level text value Snakemake read as a number
    is taken as typed in ``argv`` (default: this process's command line)."""
    full = schema(units)
    argv = sys.argv if argv is None else argv

    def resolve(node: dict) -> dict:
        while "$ref" in node:
            node = full["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        return node

    def typed(value, node: dict, top_key: str | None = None):
        """value with every string in it (lists of lists too) as the type its place in the schema asks for;
        ``top_key``: the top-level key it is the value of (its text is then on the command line)."""
        node = resolve(node)
        if isinstance(value, str):
            return _parsed(value, _types(node))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _types(node) == {"string"}:
            # Snakemake parsed run=2024 as a number; the schema asks for text
            return _as_typed(top_key, value, argv) if top_key else str(value)
        if isinstance(value, list):
            return [typed(v, node.get("items") or {}) for v in value]
        if isinstance(value, dict):
            return {k: typed(v, (node.get("properties") or {}).get(k, {})) for k, v in value.items()}
        return value

    def walk(target: dict, cli: dict, node: dict):
        for key, value in cli.items():
            sub = resolve((node.get("properties") or {}).get(key, {}))
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                walk(target[key], value, sub)
            elif key in target:
                target[key] = typed(target[key], sub, key if node is full else None)

    walk(config, given, full)


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (plain YAML keeps the last, silently)."""


def _mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"{loader.name}: key {key!r} given twice (lines {seen[key]} and "
                              f"{key_node.start_mark.line + 1})")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def check_files(paths) -> None:
    """Every config file: YAML whose top level is a mapping, with no key given twice; errors name the file."""
    for path in paths:
        with open(path) as fh:
            loader = _StrictLoader(fh)
            loader.name = str(path)
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config file must be a mapping of keys at its top level, "
                              f"got {type(data).__name__}")


def _ranges(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _ranges(value, f"{path}.{key}" if path else key)
    elif path.rsplit(".", 1)[-1].startswith("log2_") and isinstance(node, list) and len(node) == 2:
        yield path, node


def check(config: dict, experiments: dict, unit_checks: dict | None = None) -> None:
    """``experiments``: the registry ('kernel/name' -> Experiment) the config's sections must name;
    ``unit_checks``: kernel -> a check of its section (default: each unit's check_settings)."""
    if unit_checks is None:
        from .units import setting_checks

        unit_checks = setting_checks()
    kernels = {e.kernel for e in experiments.values()}
    for kernel in kernels:
        for name in config.get(kernel, {}) or {}:
            if f"{kernel}/{name}" not in experiments:
                known = sorted(e.name for e in experiments.values() if e.kernel == kernel)
                raise ConfigError(f"config key {kernel}.{name}: no such experiment; {kernel} has {known}")
    for path, (first, last) in _ranges(config):
        if first > last:
            raise ConfigError(f"config key {path}: range [{first}, {last}] is empty (first > last)")
    for kernel, check_section in unit_checks.items():
        if config.get(kernel):
            try:
                check_section(config[kernel])
            except ValueError as e:
                raise ConfigError(f"config key {kernel}.{e}") from None
