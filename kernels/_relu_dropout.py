"""Kernel 2 of the writeup: ReLU then dropout fused into one pass (one load, one store).

``relu_dropout_writeup`` is the writeup's kernel as written: one ``tl.rand`` (one Philox evaluation)
per element. ``relu_dropout`` is the improved kernel: four random numbers per Philox evaluation, so it
runs at memory speed rather than RNG speed, and it has a backward that draws its mask again from the
seed (no mask tensor is saved). Both are pure functions of (seed, element index), but they draw
different masks for the same seed. The writeup's kernel computes its offsets in int32 as printed, so
it faults past 2**31 elements; the improved one switches to 64-bit offsets and two-word Philox counters
there (kernels._offsets), so its mask neither wraps nor repeats.
"""
from __future__ import annotations

import torch

from . import _checks, backend
from ._launch import serialized
from ._offsets import block_start, wide
from ._triton import tl, triton

__all__ = ["relu_dropout", "relu_dropout_ref", "relu_dropout_writeup", "relu_dropout_backward"]


@triton.jit
def _kept(seed, start, p, BLOCK_SIZE: tl.constexpr, WIDE: tl.constexpr):
    """Which of elements [start, start + BLOCK_SIZE) survive: those whose uniform u in [0, 1) has u >= p (so
    with probability 1 - p, and every one at p = 0; the writeup's u > p drops a u of exactly 0, which
    tl.rand draws with probability 2**-31). The writeup draws tl.rand(seed, offsets): one
    Philox evaluation per element, which makes the kernel compute-bound on a GPU. One tl.rand4x call yields
    four uniforms, so element 4c + j takes the j-th draw of counter c: a quarter of the Philox work, still
    a pure function of (seed, element index), so the backward draws the same mask again.
    WIDE (int64 counters): the counter goes into Philox as two 32-bit words, low and high. Below 2**32 that
    is exactly what tl.rand4x draws (its high word is 0), so a mask never depends on the tensor's size."""
    counters = start // 4 + tl.arange(0, BLOCK_SIZE // 4)
    if WIDE:
        low = counters.to(tl.uint32)
        high = (counters >> 32).to(tl.uint32)
        i0, i1, i2, i3 = tl.philox(seed, low, high, low * 0, low * 0)
        r0, r1 = tl.uint_to_uniform_float(i0), tl.uint_to_uniform_float(i1)
        r2, r3 = tl.uint_to_uniform_float(i2), tl.uint_to_uniform_float(i3)
    else:
        r0, r1, r2, r3 = tl.rand4x(seed, counters)
    return tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_SIZE]) >= p  # element 4c + j: r_j


@triton.jit
def _fp32(value):
    """A float argument as fp32, in Triton's interpreter too (which would keep a Python float's 64 bits)."""
    return tl.full([], value, tl.float32)


@triton.jit
def _relu_dropout_kernel(x_ptr, out_ptr, n_elements, p, keep, seed, BLOCK_SIZE: tl.constexpr, WIDE: tl.constexpr):
    """keep = 1 - p, computed by the caller in float64: 1 - p in fp32 from p in fp32 loses p's rounding
    error relative to 1 - p (p = 0.999: the survivors' scale 1000.013 for 1000)."""
    start = block_start(BLOCK_SIZE, WIDE)
    offsets = start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    x = tl.where(x < 0.0, 0.0, x)  # relu that keeps NaN, as torch.relu does (tl.maximum would return 0)
    out = tl.where(_kept(seed, start, _fp32(p), BLOCK_SIZE, WIDE), x / _fp32(keep), 0.0)
    tl.store(out_ptr + offsets, out, mask=mask)


@triton.jit
def _relu_dropout_backward_kernel(dy_ptr, x_ptr, dx_ptr, n_elements, p, keep, seed, BLOCK_SIZE: tl.constexpr,
                                  WIDE: tl.constexpr):
    """dx = dy / (1 - p) where the element was kept and x > 0 or NaN (torch's relu passes the gradient at a
    NaN, which it keeps), else 0; the mask drawn again from the seed; keep = 1 - p as in the forward."""
    start = block_start(BLOCK_SIZE, WIDE)
    offsets = start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    dy = tl.load(dy_ptr + offsets, mask=mask).to(tl.float32)
    dx = tl.where(_kept(seed, start, _fp32(p), BLOCK_SIZE, WIDE) & ((x > 0.0) | (x != x)), dy / _fp32(keep), 0.0)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _relu_dropout_writeup_kernel(x_ptr, out_ptr, n_elements, p, seed, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    x = tl.maximum(x, 0.0)
    randoms = tl.rand(seed, offsets)
    dropout_mask = randoms > p
    out = tl.where(dropout_mask, x / (1 - p), 0.0)
    tl.store(out_ptr + offsets, out, mask=mask)


def relu_dropout(x: torch.Tensor, p: float, seed: int, block_size: int | None = None) -> torch.Tensor:
    """dropout(relu(x)): each element is zeroed with probability p, survivors scaled by 1/(1-p).
    A NaN survives relu (as in torch) and is NaN if kept, 0 if dropped. Differentiable to any order: the
    backward saves x, not a mask, and draws the mask again from the seed. Works inside torch.compile
    (first-order gradients there). ``block_size``: elements per program, any power of two from 4 to 2**17
    (the output is the same bits at each); None: _default_block."""
    p, seed, block_size = _check_args(x, p, seed, block_size)
    if torch.compiler.is_compiling():
        return _relu_dropout_op(x, p, seed, block_size)
    if torch.is_grad_enabled() and x.requires_grad:
        return _ReluDropout.apply(x, p, seed, block_size)
    return _launch(_relu_dropout_kernel, x, p, seed, block_size, improved=True)


def relu_dropout_backward(dy: torch.Tensor, x: torch.Tensor, p: float, seed: int,
                          block_size: int | None = None) -> torch.Tensor:
    """The gradient of relu_dropout(x, p, seed) for the output gradient dy (any block_size: the mask is
    a function of the element index alone). Differentiable in dy; its gradient in x is zero where defined."""
    p, seed, block_size = _check_args(x, p, seed, block_size)
    _checks.tensor(dy, "dy")
    _checks.same("dy", dy, "x", x)
    if torch.compiler.is_compiling():
        return _relu_dropout_backward_op(dy, x, p, seed, block_size)
    return _backward(dy, x, p, seed, block_size)


def _backward(dy, x, p, seed, block_size):
    if torch.is_grad_enabled() and (dy.requires_grad or x.requires_grad):  # a graph is wanted (create_graph)
        return _MaskedScale.apply(dy, x, p, seed, block_size)
    return _backward_kernel(dy, x, p, seed, block_size)


class _MaskedScale(torch.autograd.Function):
    """relu_dropout's backward, dx = dy * (1/(1-p) where kept and x > 0, else 0), as a differentiable op:
    linear in dy (its derivative in dy is this op again, so every order is right) and constant in x (a zero
    derivative there, as torch's relu has: a gradient taken with create_graph=True has a graph in x)."""

    @staticmethod
    def forward(ctx, dy, x, p, seed, block_size):
        ctx.save_for_backward(x)
        ctx.args = (p, seed, block_size)
        return _backward_kernel(dy, x, p, seed, block_size)

    @staticmethod
    def backward(ctx, ddx):
        (x,) = ctx.saved_tensors
        dy = _backward(ddx, x, *ctx.args) if ctx.needs_input_grad[0] else None
        return dy, torch.zeros_like(x) if ctx.needs_input_grad[1] else None, None, None, None


@serialized
def _backward_kernel(dy, x, p, seed, block_size):
    x, dy = x.contiguous(), dy.contiguous()  # element i of the contiguous order: the index the mask is drawn at
    dx = torch.empty_like(x)
    n = dx.numel()
    if n:
        _relu_dropout_backward_kernel[(triton.cdiv(n, block_size),)](dy, x, dx, n, float(p), 1.0 - p, seed,
                                                                     BLOCK_SIZE=block_size, WIDE=wide(n, block_size))
    return dx


class _ReluDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed, block_size):
        ctx.save_for_backward(x)
        ctx.args = (p, seed, block_size)
        return _launch(_relu_dropout_kernel, x, p, seed, block_size, improved=True)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _backward(dy, x, *ctx.args), None, None, None


# For torch.compile: opaque ops with known outputs and a registered backward (Dynamo cannot trace Triton's
# launcher).
@torch.library.custom_op("kernels::relu_dropout", mutates_args=(),
                         schema="(Tensor x, float p, int seed, int block_size) -> Tensor")
def _relu_dropout_op(x, p, seed, block_size):
    return _launch(_relu_dropout_kernel, x, p, seed, block_size, improved=True)


@torch.library.custom_op("kernels::relu_dropout_backward", mutates_args=(),
                         schema="(Tensor dy, Tensor x, float p, int seed, int block_size) -> Tensor")
def _relu_dropout_backward_op(dy, x, p, seed, block_size):
    return _backward_kernel(dy, x, p, seed, block_size)


@_relu_dropout_op.register_fake
def _(x, p, seed, block_size):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@_relu_dropout_backward_op.register_fake
def _(dy, x, p, seed, block_size):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _op_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.args = inputs[1:]


def _op_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return _relu_dropout_backward_op(dy, x, *ctx.args), None, None, None


_relu_dropout_op.register_autograd(_op_backward, setup_context=_op_setup)


def _backward_op_backward(ctx, g):  # dx = dy * scale(x): linear in dy, a constant of x
    (x,) = ctx.saved_tensors
    return _relu_dropout_backward_op(g, x, *ctx.args), None, None, None, None


_relu_dropout_backward_op.register_autograd(
    _backward_op_backward, setup_context=lambda ctx, inputs, output: _op_setup(ctx, inputs[1:], output))


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
def relu_dropout_writeup(x: torch.Tensor, p: float, seed: int, block_size: int = 1024) -> torch.Tensor:
    """The writeup's kernel as printed (one tl.rand per element, int32 offsets: it faults past 2**31
    elements; its relu, tl.maximum(x, 0.0), turns NaN into 0, where torch.relu and relu_dropout keep it);
    same contract as relu_dropout otherwise (block_size=None: _default_block). Not differentiable: an input
    that requires grad is refused (RuntimeError). Inside torch.compile it runs eagerly (a graph break, so
    fullgraph=True refuses it)."""
    p, seed, block_size = _check_args(x, p, seed, block_size)
    _checks.forward_only("relu_dropout_writeup", x=x)
    return _launch(_relu_dropout_writeup_kernel, x, p, seed, block_size)


def _default_block(n: int) -> int:
    """The block where block_size is None: 1024 elements on a GPU. Triton's interpreter pays per
    program rather than per element, so there one block holds the whole input up to 2**17 elements (10**6
    fp32 elements: 0.2 s against 8.2 s with blocks of 1024 on one CPU core); the mask is a function of the
    seed and the element index alone, in both kernels, so the output is the same bits."""
    if backend.current() != "interpreter":
        return 1024
    return min(max(triton.next_power_of_2(n), 1024), 2**17)


def _check_args(x: torch.Tensor, p: float, seed: int, block_size: int | None) -> tuple[float, int, int]:
    """Check the arguments; return p, seed and block_size as a Python float and ints (they may come as
    NumPy scalars; a block_size of None is _default_block's)."""
    _checks.tensor(x, "x")
    p, seed = _checks.real(p, "p"), _checks.integer(seed, "seed")
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"p must be in [0, 1), got {p!r}")
    if not 0 <= seed < 2**63:  # int64, as torch.compile's custom ops take it; Philox keys on all 64 bits
        raise ValueError(f"seed must be in [0, 2**63), got {seed!r}")
    if block_size is None:
        return p, seed, _default_block(x.numel())
    block_size = _checks.block_size(block_size, smallest=4)  # the improved kernel draws four numbers per Philox call
    return p, seed, block_size


@serialized
def _launch(kernel, x: torch.Tensor, p: float, seed: int, block_size: int, improved: bool = False) -> torch.Tensor:
    """``improved``: the improved kernel, which takes 1 - p besides p and the WIDE constexpr (the writeup's neither)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = out.numel()
    if n:
        scalars, extra = ((float(p), 1.0 - p), {"WIDE": wide(n, block_size)}) if improved else ((float(p),), {})
        kernel[(triton.cdiv(n, block_size),)](x, out, n, *scalars, seed, BLOCK_SIZE=block_size, **extra)
    return out


def relu_dropout_ref(x: torch.Tensor, p: float, keep: torch.Tensor) -> torch.Tensor:
    """The reference for a given keep-mask (dropout has no single correct output otherwise)."""
    scaled = (torch.relu(x.float()) / (1 - p)).to(x.dtype)
    return torch.where(keep, scaled, torch.zeros_like(scaled))
