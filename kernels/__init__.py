"""Triton kernels climbing the writeup's ladder, then the rung it did not climb.

    from kernels import vector_add, relu_dropout, softmax, attention, flash_attention

Kernel modules load on first use of a public name, and each fixes the backend (compiled on a GPU, or
Triton's interpreter on the CPU; see kernels.backend) before it defines a @triton.jit function, which
is when Triton reads TRITON_INTERPRET. ``import kernels.backend`` alone has no side effects.
"""
from __future__ import annotations

import importlib

from . import backend  # noqa: F401  (no side effects: choosing happens on first kernel use)

# public name -> the module that defines it (also read by lab.sources to find what an experiment runs)
EXPORTS = {
    "vector_add": "_vector_add", "vector_add_ref": "_vector_add", "vector_add_unmasked": "_vector_add",
    "vector_add_writeup": "_vector_add",
    "relu_dropout": "_relu_dropout", "relu_dropout_ref": "_relu_dropout",
    "relu_dropout_writeup": "_relu_dropout", "relu_dropout_backward": "_relu_dropout",
    "softmax": "_softmax", "softmax_ref": "_softmax", "softmax_naive": "_softmax",
    "softmax_unfused": "_softmax", "softmax_writeup": "_softmax", "softmax_backward": "_softmax",
    "attention": "_attention", "attention_ref": "_attention", "launch_config": "_attention",
    "attention_writeup": "_attention",
    "shared_memory_required": "_attention",
    "flash_attention": "_flash_attention", "flash_attention_ref": "_flash_attention",
    "tiles_in_use": "_flash_attention",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
