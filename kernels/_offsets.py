"""Where a kernel's element offsets need 64 bits, and the one helper that computes them.

``pid * BLOCK_SIZE`` is int32 arithmetic in Triton: past 2**31 elements it wraps to a negative offset,
which the mask ``offsets < n`` lets through (the writeup's kernels, as printed, fault there). The
project's kernels compute offsets in int64 only when a tensor needs it (a constexpr, so the common case
keeps its int32 code).
"""
from __future__ import annotations

from ._triton import tl, triton

INT32_MAX = 2**31 - 1  # tests lower this to run the 64-bit path at small sizes


def wide(n: int, block_size: int) -> bool:
    """Would offsets up to ``n + block_size`` (the last block's end) overflow int32?"""
    return n + block_size > INT32_MAX


@triton.jit
def block_start(BLOCK_SIZE: tl.constexpr, WIDE: tl.constexpr):
    """The first element of this program's block, in int64 when WIDE."""
    pid = tl.program_id(axis=0)
    if WIDE:
        pid = pid.to(tl.int64)
    return pid * BLOCK_SIZE
