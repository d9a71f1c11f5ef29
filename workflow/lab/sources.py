"""Which source files a module runs: its imports within this project, followed transitively.

An experiment's table depends on exactly these files (its kernels, its experiment module and the lab
helpers they use), so the workflow declares them as the job's input and hashes their content. Imports
are read from the syntax tree, nothing is executed; imports inside functions count too. A name taken
from ``kernels`` is followed to the module that defines it (``kernels.EXPORTS``).
"""
from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"kernels": ROOT / "kernels", "lab": ROOT / "workflow" / "lab"}


def path_of(module: str) -> Path | None:
    """kernels._softmax -> <root>/kernels/_softmax.py; None outside this project."""
    top, *rest = module.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _kernel_exports() -> dict[str, str]:
    tree = ast.parse((PACKAGES["kernels"] / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXPORTS" for t in node.targets):
            return {name: f"kernels.{mod}" for name, mod in ast.literal_eval(node.value).items()}
    return {}


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = ".".join(base[: len(base) - node.level + 1]) if node.level else ""
            source = ".".join(p for p in (base, node.module or "") if p)
            found.add(source)
            for alias in node.names:  # `from pkg import name`: name may be a submodule or an export
                found.add(f"{source}.{alias.name}")
                if source == "kernels":
                    found.add(_kernel_exports().get(alias.name, ""))
    # a module's parent packages run first
    return {m for f in found if f for m in (f, *(f.rsplit(".", i)[0] for i in range(1, f.count(".") + 1)))}


@lru_cache(maxsize=None)
def closure(module: str) -> tuple[str, ...]:
    """Project source files ``module`` runs, relative to the project root, sorted."""
    seen, todo = {}, [module]
    while todo:
        name = todo.pop()
        path = path_of(name)
        if path is None or path in seen.values():
            continue
        seen[name] = path
        todo.extend(_imports(name, path) - set(seen))
    return tuple(sorted(str(p.relative_to(ROOT)) for p in seen.values()))


def digest(files) -> str:
    """Content hash of ``files`` (paths relative to the project root): what changes when code changes."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.encode() + b"\0" + (ROOT / f).read_bytes() + b"\0")
    return h.hexdigest()[:16]
