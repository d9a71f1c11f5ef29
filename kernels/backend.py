"""Where the kernels run: compiled on a CUDA GPU, or in Triton's interpreter on the CPU.

Triton decides between compiling and interpreting when a ``@triton.jit`` function is *defined*
(it reads ``TRITON_INTERPRET`` then), so the choice has to be made before any kernel module is
imported. Each kernel module calls :func:`select` before defining its kernels; set ``KERNELS_BACKEND``
before the first kernel import to override the automatic choice:

- ``auto``: ``gpu`` when torch sees a CUDA device, else ``interpreter``;
- ``gpu``: compiled and launched on the GPU;
- ``interpreter``: Triton's interpreter runs kernels on CPU tensors (TRITON_INTERPRET=1);
- ``aot``: ahead-of-time only: kernels stay real JIT functions that ``triton.compile`` can build for a
  GPU target (e.g. sm_90) on a machine without one; they cannot be launched.
"""
from __future__ import annotations

import os
import sys

CHOICES = ("auto", "gpu", "interpreter", "aot")
ENV_VAR = "KERNELS_BACKEND"

_selected: str | None = None


def resolve(requested: str | None = None) -> str:
    """Turn a requested backend (or the environment's) into 'gpu', 'interpreter' or 'aot'."""
    requested = requested or os.environ.get(ENV_VAR) or "auto"
    if requested not in CHOICES:
        raise ValueError(f"backend must be one of {CHOICES}, got {requested!r}")
    if requested == "interpreter":
        return requested
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if requested == "aot":
        if interpreting:
            raise RuntimeError("backend 'aot' requested but TRITON_INTERPRET is set in the environment")
        return requested
    if requested == "auto":
        if interpreting:
            return "interpreter"
        import torch

        return "gpu" if torch.cuda.is_available() else "interpreter"
    import torch  # requested == "gpu"

    if interpreting:
        raise RuntimeError("backend 'gpu' requested but TRITON_INTERPRET is set in the environment")
    if not torch.cuda.is_available():
        raise RuntimeError("backend 'gpu' requested but torch sees no CUDA device")
    return "gpu"


def select(requested: str | None = None) -> str:
    """Fix the backend for this process; must run before any @triton.jit module is imported."""
    global _selected
    if _selected is not None:
        if requested not in (None, "auto", _selected):
            raise RuntimeError(f"kernels were already set up for the {_selected!r} backend; "
                               f"choose the backend before the first kernel is used")
        return _selected
    backend = resolve(requested)
    if backend == "interpreter" and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:  # its own @jit helpers (tl.max, tl.rand, ...) are already compiled-mode
            raise RuntimeError(
                "triton was imported before the kernels chose Triton's interpreter (import kernels loads no "
                "kernel; torch.compile and torch.use_deterministic_algorithms import triton too): call "
                "kernels.backend.select() before whatever imports triton, or set TRITON_INTERPRET=1 in the "
                "environment")
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ[ENV_VAR] = backend
    _selected = backend
    return backend


def current() -> str:
    """The backend chosen for this process ('gpu', 'interpreter' or 'aot')."""
    return _selected or select()


def device() -> str:
    """The torch device kernels expect their tensors on."""
    return "cuda" if current() == "gpu" else "cpu"
