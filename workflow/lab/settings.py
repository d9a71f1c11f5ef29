"""Config checks a JSON schema cannot express. Each error names the offending key."""
from __future__ import annotations


class ConfigError(ValueError):
    pass


def _ranges(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _ranges(value, f"{path}.{key}" if path else key)
    elif path.rsplit(".", 1)[-1].startswith("log2_") and isinstance(node, list) and len(node) == 2:
        yield path, node


def check(config: dict) -> None:
    for path, (first, last) in _ranges(config):
        if first > last:
            raise ConfigError(f"config key {path}: range [{first}, {last}] is empty (first > last)")
