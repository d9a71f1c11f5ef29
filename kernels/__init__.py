"""Triton kernels climbing the writeup's ladder, then the rung it did not climb.

    from kernels import vector_add, relu_dropout, softmax, attention, flash_attention

The public API is what the kernel modules (``kernels/_<name>.py``) list in their ``__all__``, read from
their source without importing them: adding a kernel module adds its names, and nothing here is edited.
A module loads on first use of one of its names, and fixes the backend (compiled on a GPU, or Triton's
interpreter on the CPU; see kernels.backend) before it defines a @triton.jit function, which is when
Triton reads TRITON_INTERPRET. ``import kernels.backend`` alone has no side effects.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

from . import backend  # noqa: F401  (no side effects: choosing happens on first kernel use)


def exports() -> dict[str, str]:
    """Public name -> the module that defines it ('_softmax'), from each kernel module's ``__all__``."""
    found: dict[str, str] = {}
    for path in sorted(p for p in Path(__file__).parent.glob("_*.py") if p.name != "__init__.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                for name in ast.literal_eval(node.value):
                    if name in found:
                        raise ImportError(f"kernels: {name!r} is exported by both {found[name]} and {path.stem}")
                    found[name] = path.stem
    return found


EXPORTS = exports()
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
