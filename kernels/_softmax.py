"""Kernel 3 of the writeup: row-wise softmax, one program per row, max subtracted before exp.

``softmax(x, block_size=1024)`` reproduces the writeup's bug on purpose: the block covers columns
[0, 1024) only, and the mask checks ``col < n_cols`` but never ``n_cols <= BLOCK_SIZE``, so wider rows
are normalised over their first 1024 columns and the rest of the output is never written. No error,
no warning. ``softmax(x)`` is the one-line fix: the block is sized to the row.
"""
from __future__ import annotations

import torch

from . import _checks
from ._triton import tl, triton


BUGGY_BLOCK_SIZE = 1024  # the writeup's hard-coded value


@triton.jit
def _softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols,
                    BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    row = tl.load(input_ptr + row_idx * input_row_stride + col_offsets, mask=mask, other=float("-inf"))
    row = row.to(tl.float32)  # exp and the sum in fp32 whatever the storage dtype
    numerator = tl.exp(row - tl.max(row, axis=0))
    softmax_output = numerator / tl.sum(numerator, axis=0)
    tl.store(output_ptr + row_idx * output_row_stride + col_offsets, softmax_output, mask=mask)


def _num_warps(block_size: int) -> int:
    # More warps for wider rows so each thread keeps a handful of elements in registers.
    return 4 if block_size <= 2048 else 8 if block_size <= 8192 else 16


def softmax(x: torch.Tensor, block_size: int | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the rows of a 2-D tensor.

    block_size=None sizes the block to the row (correct for any width); an explicit block_size is
    used as is, so block_size=1024 silently drops every column past 1024 (the writeup's bug).
    ``out`` (optional) receives the result; columns the kernel never writes keep their old content.
    """
    _checks.tensor(x, "x", ndim=2)
    n_rows, n_cols = x.shape
    if block_size is None:
        block_size = triton.next_power_of_2(n_cols)
    else:
        _checks.block_size(block_size)
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty_like(x)
    else:
        _checks.tensor(out, "out", ndim=2)
        _checks.same("x", x, "out", out)
        if out.stride(1) != 1:
            raise ValueError("out must have unit stride along its columns")
    if n_rows and n_cols:
        _softmax_kernel[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols,
                                   BLOCK_SIZE=block_size, num_warps=_num_warps(block_size))
    return out


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """Softmax without the max subtraction: exp overflows for large inputs (claim 4's foil)."""
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def softmax_unfused(x: torch.Tensor) -> torch.Tensor:
    """Stable softmax as five separate torch ops, each a round trip through memory (claim 12's foil)."""
    row_max = x.max(dim=-1, keepdim=True).values
    e = torch.exp(x - row_max)
    return e / e.sum(dim=-1, keepdim=True)
