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
