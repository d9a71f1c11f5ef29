"""The one place that prepares Triton for every kernel module.

Triton decides between compiling and interpreting when a ``@triton.jit`` function is *defined*, its
own library functions (``tl.max``, ``tl.rand``) included, so the backend must be chosen before triton
is imported. Kernel modules import ``triton`` and ``tl`` from here and so can never get the order wrong.
"""
from __future__ import annotations

from . import backend

backend.select()

import triton  # noqa: E402,F401  (after select(): see above; kernel modules import it from here)
import triton.language as tl  # noqa: E402,F401
import triton.testing  # noqa: E402,F401  (do_bench, for the autotuner)
