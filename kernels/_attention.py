"""Kernel 4 of the writeup: scaled dot-product attention that loads *all* of K and V at once.

One program handles BLOCK_Q query rows and holds the whole of K (BLOCK_K = n_k rounded up to a power
of two) on chip, so its shared-memory need grows linearly with n_k until the compiler refuses to
launch it ("out of resource: shared memory"): the wall the writeup names. This is kept on purpose;
``flash_attention`` is the rung that removes it.

``attention_writeup`` is the writeup's kernel as printed. Its loads and stores are masked along rows
only, while the head-dim block is BLOCK_V = next_power_of_2(d), and at least 16 (tl.dot's smallest): for
a head dim that is not a power of two, or below 16, each row reads (and writes) BLOCK_V - d elements of
the next row, the softmax bug's shape of mistake along the other axis. ``attention`` is that kernel
with the one-line fix, a head-dim mask on every load and store (the variant ``head_dim_mask``);
otherwise identical.
"""
from __future__ import annotations

import math

import torch

from . import _checks, backend
from ._launch import serialized
from ._triton import tl, triton

__all__ = ["attention", "attention_ref", "launch_config", "attention_writeup", "shared_memory_required"]


MIN_DOT = 16  # tl.dot needs every block dimension >= 16 on the GPU


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    row_stride, col_stride, n_rows, n_cols, head_dim, scale,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row_pid = tl.program_id(0)
    row_offsets = row_pid * BLOCK_Q + tl.arange(0, BLOCK_Q)
    col_offsets = tl.arange(0, BLOCK_K)
    d_offsets = tl.arange(0, BLOCK_V)
    row_mask = row_offsets < n_rows
    col_mask = col_offsets < n_cols
    d_mask = d_offsets < head_dim

    q_offsets = row_offsets[:, None] * row_stride + d_offsets[None, :] * col_stride
    q = tl.load(q_ptr + q_offsets, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    # All of K, transposed: (BLOCK_V, BLOCK_K). This is the load that stops fitting on chip.
    k_offsets = d_offsets[:, None] * col_stride + col_offsets[None, :] * row_stride
    k = tl.load(k_ptr + k_offsets, mask=d_mask[:, None] & col_mask[None, :], other=0.0)

    qk = tl.dot(q, k) * scale
    qk = tl.where(col_mask[None, :], qk, float("-inf"))
    m = tl.max(qk, axis=1)
    p = tl.exp(qk - m[:, None])
    weights = p / tl.sum(p, axis=1)[:, None]

    v_offsets = col_offsets[:, None] * row_stride + d_offsets[None, :] * col_stride
    v = tl.load(v_ptr + v_offsets, mask=col_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.dot(weights.to(v.dtype), v)
    out_offsets = row_offsets[:, None] * row_stride + d_offsets[None, :] * col_stride
    tl.store(out_ptr + out_offsets, out, mask=row_mask[:, None] & d_mask[None, :])


@triton.jit
def attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    row_stride, col_stride, n_rows, n_cols, scale,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row_pid = tl.program_id(0)
    row_offsets = row_pid * BLOCK_Q + tl.arange(0, BLOCK_Q)
    col_offsets = tl.arange(0, BLOCK_K)
    d_offsets = tl.arange(0, BLOCK_V)

    row_mask = row_offsets < n_rows
    col_mask = col_offsets < n_cols

    q_offsets = tl.expand_dims(row_offsets, 1) * row_stride + tl.expand_dims(d_offsets, 0) * col_stride
    q = tl.load(q_ptr + q_offsets, mask=tl.expand_dims(row_mask, 1), other=0.0)

    k_offsets = tl.expand_dims(d_offsets, 1) * col_stride + tl.expand_dims(col_offsets, 0) * row_stride
    k = tl.load(k_ptr + k_offsets, mask=tl.expand_dims(col_mask, 0), other=0.0)

    qk = tl.dot(q, k) * scale
    qk = tl.where(tl.expand_dims(col_mask, 0), qk, float("-inf"))

    m = tl.max(qk, axis=1)
    p = tl.exp(qk - tl.expand_dims(m, 1))
    l = tl.sum(p, axis=1)  # noqa: E741  (the writeup's name)
    weights = p / tl.expand_dims(l, 1)

    v_offsets = tl.expand_dims(col_offsets, 1) * row_stride + tl.expand_dims(d_offsets, 0) * col_stride
    v = tl.load(v_ptr + v_offsets, mask=tl.expand_dims(col_mask, 1), other=0.0)

    out = tl.dot(weights.to(v.dtype), v)
    out_offsets = tl.expand_dims(row_offsets, 1) * row_stride + tl.expand_dims(d_offsets, 0) * col_stride
    tl.store(out_ptr + out_offsets, out, mask=tl.expand_dims(row_mask, 1))


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
@serialized
def attention_writeup(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The writeup's kernel as printed; same contract as ``attention``, but wrong wherever its head-dim
    block is wider than d: d not a power of two, or below 16. The writeup does not show its launcher.
    This one copies q, k, v into buffers with BLOCK_V - d zeros after them and writes into such a
    buffer, so the reads and writes past a row stay in memory it owns: what they touch is the next row
    (the bug), or zeros after the last. Not differentiable: inputs that require grad are refused
    (RuntimeError). Inside torch.compile it runs eagerly (a graph break, so fullgraph=True refuses it)."""
    args, cfg = _arguments(q, k, v)
    _checks.forward_only("attention_writeup", q=q, k=k, v=v)
    q, k, v, out, row_stride, col_stride, n_q, n_k, d, scale = args
    pad = cfg["BLOCK_V"] - d
    q, k, v, padded_out = (_padded(t, pad) for t in (q, k, v, out))
    if n_q:
        attention_kernel[(triton.cdiv(n_q, cfg["BLOCK_Q"]),)](q, k, v, padded_out, row_stride, col_stride, n_q, n_k,
                                                              scale, **cfg)
    return padded_out[: n_q * d].view(n_q, d)


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """t's elements, flat, followed by ``pad`` zeros (t itself, flat, when pad is 0: no copy)."""
    if not pad:
        return t.reshape(-1)
    flat = torch.zeros(t.numel() + pad, dtype=t.dtype, device=t.device)
    flat[: t.numel()] = t.reshape(-1)
    return flat


def launch_config(n_k: int, head_dim: int, block_q: int = 16) -> dict:
    """The block sizes `attention` launches with for n_k keys of width head_dim."""
    n_k, head_dim = _checks.integer(n_k, "n_k"), _checks.integer(head_dim, "head_dim")
    for name, value in (("n_k", n_k), ("head_dim", head_dim)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    block_q = _checks.block_size(block_q, "block_q")
    return dict(BLOCK_Q=block_q, BLOCK_K=max(MIN_DOT, triton.next_power_of_2(n_k)),
                BLOCK_V=max(MIN_DOT, triton.next_power_of_2(head_dim)))


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for q (n_q, d), k and v (n_k, d), with all of K/V loaded at once.

    Raises triton's OutOfResources when K/V no longer fit in shared memory (the writeup's wall).
    Differentiable to any order: the writeup has no backward kernel, so the backward is plain attention's
    in torch ops (fp32), from the saved inputs.
    Inside torch.compile it runs eagerly (a graph break, so fullgraph=True refuses it).
    """
    args, cfg = _arguments(q, k, v)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v)
    return _forward(args, cfg)


@serialized
def _forward(args: tuple, cfg: dict) -> torch.Tensor:
    out, n_q = args[3], args[6]
    if n_q:
        _attention_kernel[(triton.cdiv(n_q, cfg["BLOCK_Q"]),)](*args, **cfg)
    return out


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return _forward(*_arguments(q, k, v))

    @staticmethod
    def backward(ctx, do):
        """With P = softmax(S), S = q k^T s: dv = P^T do, dP = do v^T, dS = P * (dP - rowsum(P * dP)), dq = dS k s,
        dk = dS^T q s. Torch ops on the saved inputs, so create_graph=True gets a graph."""
        q, k, v = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        q32, k32, v32, do32 = q.float(), k.float(), v.float(), do.float()
        p = torch.softmax((q32 @ k32.T) * scale, dim=-1)
        dp = do32 @ v32.T
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        return (ds @ k32 * scale).to(q.dtype), (ds.T @ q32 * scale).to(k.dtype), (p.T @ do32).to(v.dtype)


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
@serialized
def shared_memory_required(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes of shared memory the writeup's kernel asks for at these shapes (``attention`` asks for the
    same: the mask adds no buffer), compiled for this GPU without launching, so also where the launch
    would fail. GPU only. Inside torch.compile it runs eagerly (a graph break, so fullgraph=True refuses
    it)."""
    args, cfg = _arguments(q, k, v)
    if backend.current() != "gpu":
        raise RuntimeError("shared_memory_required compiles for the GPU it runs on: there is none here (the "
                           f"{backend.current()!r} backend); lab.sm90 compiles for Hopper on any machine")
    printed = (*args[:8], args[9])  # the printed kernel has no head_dim argument
    return attention_kernel.warmup(*printed, grid=(1,), **cfg).metadata.shared


def _arguments(q, k, v) -> tuple[tuple, dict]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(t, name, ndim=2)
    _checks.same("k", k, "v", v)
    _checks.same("q", q, "k", k, shape=False)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must share the head dimension: {tuple(q.shape)} vs {tuple(k.shape)}")
    n_q, d = q.shape
    n_k = k.shape[0]
    if n_k == 0:
        raise ValueError(f"k (and v) must have at least one key (row): got k of shape {tuple(k.shape)}")
    if d == 0:
        raise ValueError(f"attention needs a head dimension of at least 1, got q of shape {tuple(q.shape)}")
    # The writeup's kernel uses one (row_stride, col_stride) pair for all four tensors: dense rows of d,
    # (d, 1). Not q's own strides: contiguous() keeps any stride on a dimension of size 1 (one query row
    # sliced from a fused qkv has a row stride of 3d), and k, v and out have (d, 1) whatever q has.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty((n_q, d), dtype=q.dtype, device=q.device)
    return (q, k, v, out, d, 1, n_q, n_k, d, 1.0 / math.sqrt(d)), launch_config(n_k, d)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 (or fp64 for fp64 input) reference: softmax(q k^T / sqrt(d)) v."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(acc) @ k.to(acc).T) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v.to(acc)
