"""Kernel 1 of the writeup: out = x + y, one program per BLOCK_SIZE-element chunk.

``vector_add_writeup`` is the writeup's kernel as printed: its offsets are int32, so past 2**31 elements
they wrap and the kernel faults. ``vector_add`` is the same kernel with 64-bit offsets where the size
needs them (kernels._offsets), and is otherwise identical.
"""
from __future__ import annotations

import torch

from . import _checks
from ._launch import serialized
from ._offsets import block_start, wide
from ._triton import tl, triton

__all__ = ["vector_add", "vector_add_ref", "vector_add_unmasked", "vector_add_writeup"]


DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32)
BLOCK_SIZE = 1024  # the writeup's block, the default of both kernels


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements

    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def _vector_add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr, WIDE: tl.constexpr):
    offsets = block_start(BLOCK_SIZE, WIDE) + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """x + y for same-shape tensors of any rank, size and strides; the result is a new contiguous tensor.
    Differentiable (the gradient of each input is the output's gradient); works inside torch.compile."""
    return _add(_vector_add_kernel, x, y, block_size)


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
def vector_add_writeup(x: torch.Tensor, y: torch.Tensor, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """The writeup's kernel as printed (int32 offsets: it faults past 2**31 elements); same contract otherwise
    (differentiable too). Inside torch.compile it runs eagerly (a graph break, so fullgraph=True refuses it)."""
    return _add(add_kernel, x, y, block_size)


def _add(kernel, x, y, block_size):
    _checks.tensor(x, "x", dtypes=DTYPES)
    _checks.tensor(y, "y", dtypes=DTYPES)
    _checks.same("x", x, "y", y)
    block_size = _checks.block_size(block_size)
    if torch.compiler.is_compiling() and kernel is _vector_add_kernel:
        return _vector_add_op(x, y, block_size)
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
        return _VectorAdd.apply(kernel, x, y, block_size)
    return _launch(kernel, x, y, block_size)


@serialized
def _launch(kernel, x, y, block_size):
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = out.numel()
    if n:
        wide_offsets = {"WIDE": wide(n, block_size)} if kernel is _vector_add_kernel else {}  # the writeup's: int32
        kernel[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size, **wide_offsets)
    return out


class _VectorAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, x, y, block_size):
        return _launch(kernel, x, y, block_size)

    @staticmethod
    def backward(ctx, dout):  # d(x + y)/dx = d(x + y)/dy = 1; differentiable again (it is the identity)
        return None, dout, dout, None


# For torch.compile: an opaque op with a known output (the fake below) and a backward, instead of Dynamo
# tracing into Triton's launcher (which it cannot).
@torch.library.custom_op("kernels::vector_add", mutates_args=(),
                         schema="(Tensor x, Tensor y, int block_size) -> Tensor")
def _vector_add_op(x, y, block_size):
    return _launch(_vector_add_kernel, x, y, block_size)


@_vector_add_op.register_fake
def _(x, y, block_size):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


_vector_add_op.register_autograd(lambda ctx, dout: (dout, dout, None))


@triton.jit
def _vector_add_unmasked_kernel(x_ptr, y_ptr, out_ptr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
@serialized
def vector_add_unmasked(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, block_size: int = 1024) -> None:
    """The add kernel with its mask removed, to show what the mask prevents (claim 14): the last block
    reads and writes up to ``block_size - 1`` elements past the end of x, y and out. Memory safe only
    when the three are views into buffers with at least that much room after them, and out's room is not
    x's or y's; this function checks that they are, and is not for computing anything (nor
    differentiable: inputs that require grad are refused). Inside torch.compile it runs eagerly (a
    graph break, so fullgraph=True refuses it)."""
    block_size = _checks.block_size(block_size)
    for name, t in (("x", x), ("y", y), ("out", out)):
        _checks.tensor(t, name, ndim=1, dtypes=DTYPES)
        _checks.same("x", x, name, t)
        room = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
        if not t.is_contiguous() or room < triton.cdiv(t.numel(), block_size) * block_size:
            raise ValueError(f"{name} must be a contiguous view with room for whole blocks of {block_size} "
                             f"after it: {room} elements of storage for {t.numel()}")
    _checks.output(out, "out", x=x, y=y)
    # The last block's store runs past out's end: onto an input there (in the same buffer), it would
    # change what other blocks read.
    written = out.as_strided((triton.cdiv(out.numel(), block_size) * block_size,), (1,))
    for name, t in (("x", x), ("y", y)):
        if t.data_ptr() != out.data_ptr() and _checks.spans_overlap(written, t):
            raise ValueError(f"out's last block writes {written.numel() - out.numel()} elements past its end, "
                             f"onto {name}: pass an out with room of its own after it")
    _checks.forward_only("vector_add_unmasked", x=x, y=y, out=out)
    if out.numel():
        _vector_add_unmasked_kernel[(triton.cdiv(out.numel(), block_size),)](x, y, out, BLOCK_SIZE=block_size)


def vector_add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y
