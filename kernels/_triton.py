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


def _interpreter_scalars_as_numpy_2_4_wants() -> None:
    """Triton 3.6's interpreter (the GPU machine's Triton) turns a scalar it holds, a one-element array, into
    a Python int with ``int(array)``, which numpy 2.4 refuses (triton-lang/triton#9171, fixed upstream since,
    as in 3.9): a ``tl.range`` that starts at a program id fails there. Where numpy refuses it, take
    upstream's fix (squeeze first); on a Triton that has it, the same function again."""
    import numpy as np
    from triton.runtime import interpreter

    try:
        int(np.zeros(1))
        return
    except TypeError:
        pass
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


if backend.current() == "interpreter":
    _interpreter_scalars_as_numpy_2_4_wants()
