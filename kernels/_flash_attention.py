"""The rung the writeup did not climb: tiled attention with an online softmax (FlashAttention).

K and V stream through on-chip memory one BLOCK_N tile at a time. Each program keeps, for its BLOCK_M
query rows, a running max ``m``, a running sum ``l`` and an fp32 output accumulator; when a tile
reveals a larger max, the accumulator and sum are rescaled by ``exp(m_old - m_new)``. Shared memory
therefore depends on the tile sizes, never on the sequence length, so there is no wall.

Conventions:
- Layout (batch, heads, seq, head_dim); any strides (e.g. a (B, S, H, D).transpose(1, 2) view).
- seq_q may differ from seq_k; any length, 0 too (no key: every row 0, as SDPA gives); head_dim 1..256,
  powers of two or not (the head-dim block is the power of two at or above it, at least tl.dot's 16; the
  columns past head_dim masked).
- causal=True aligns the mask to the bottom-right corner (as FlashAttention >= 2.1 and KV caches do):
  query i sees key j iff j <= i + seq_k - seq_q. With seq_q > seq_k the first seq_q - seq_k rows see no
  key at all; their output (and gradient) is zero (V finite: see the next point). The output of a row
  whose every score is -inf (-inf in the input) is zero too, as SDPA gives.
- NaN or inf in the input reaches every row that sees it. Under a causal mask, one in V at a key that
  some rows of its tile do not see reaches those rows too, rows that see no key at all included (P @ V
  multiplies it by their zero weight: 0 * NaN = NaN; their gradients too), so which of them depends on
  the tiles: at most the BLOCK_M + BLOCK_N rows before the key. flash_attention_ref, like SDPA's math
  path, spreads it to every row.
- Softmax in base 2: scores are pre-multiplied by sm_scale * log2(e) and exp2 is used; the stored
  log-sum-exp (for the backward) is in that base too.
- fp16/bf16 inputs use tensor cores with fp32 accumulation; fp32 inputs use TF32 on the GPU
  (Triton's default) and full fp32 in the interpreter.
- The backward's delta = rowsum(dO * O) is taken from the output as returned (16-bit for 16-bit inputs),
  as FlashAttention 2 and 3 do: where attention is nearly one-hot (a large sm_scale), dP - delta cancels,
  and the gradients' error grows past that of torch's fp16 math path (fp16, head_dim 72, causal,
  sm_scale=3, in the interpreter: dQ off by 9.2e-3 against 7.3e-4).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import Callable

import torch

from . import _checks, _dead_barriers, _flash_tiles, backend
from ._flash_tiles import Tile, bucket
from ._device import sm_count
from ._launch import DirectLaunch, Prepared, _aligned
from ._triton import tl, triton

__all__ = ["flash_attention", "flash_attention_ref", "tiles_in_use"]

LOG2E = 1.4426950408889634
FP32_NORMAL, FP32_MAX = 2.0**-126, (2 - 2.0**-23) * 2.0**127  # fp32's smallest normal and largest finite number
HEAD_DIMS = (1, 256)

# Candidate tiles per kernel, (BLOCK_M, BLOCK_N, warps, stages), in order of preference: the first that
# fits is taken without tuning. BLOCK_M counts queries, BLOCK_N keys, in every kernel.
CANDIDATES = {
    # a fifth item True: the warp-specialized TMA kernel, for Hopper where warp_specialized(), inputs it can
    # address (_tma_ready; causal: split with the pointer kernel); 128x64/w4/s3 and 3 stages at 64x64 returned
    # NaN on triton 3.6
    "fwd": [(128, 128, 4, 2, True),
            (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3), (128, 128, 8, 3), (64, 32, 4, 2), (32, 32, 4, 1)],
    # dk/dv: a program keeps BLOCK_N keys and streams query tiles past them; dq: the other way round. A
    # fifth item True: the warp-specialized TMA dK/dV kernel, for Hopper, no causal mask (wrong under one
    # on triton 3.6), inputs it can address
    # (32, 128, 8, 3): (32, 128, 4, 3)'s sizes on 8 warps; that tile, the tuner's pick for causal head_dim 64,
    # spills 120 B in its sm_90 build (triton 3.6, as launched), this one none (204 registers); offered to the
    # tuner on the H200 (causal head_dim 64, S = 8192 and 16384, bench_ws_causal.py), which still chose 32x128/w4/s3
    "bwd_dkdv": [(64, 128, 4, 2, True),
                 (64, 128, 8, 2), (32, 128, 4, 3), (32, 128, 8, 3), (64, 64, 4, 2), (32, 64, 4, 2), (32, 32, 4, 1)],
    # dq: a fifth item True: the warp-specialized TMA dQ kernel, for Hopper, seq_q % 4 == 0 (causal: masked on every key tile)
    "bwd_dq": [(128, 64, 4, 2, True),
               (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2), (128, 128, 8, 2), (32, 64, 4, 2), (32, 32, 4, 1)],
    # the one-pass backward (KERNELS_FLASH_BACKWARD=one_pass): the dk/dv kernel adding dQ (on Hopper the TMA
    # kernel); FlashAttention-3's sm_90 tile first, then the one that won at head_dim 64
    "bwd_one_pass": [(64, 128, 8, 3), (64, 64, 4, 3), (64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 2), (32, 64, 4, 2),
                     (32, 32, 4, 1)],
}  # from workflow/scripts/tune_flash.py on the H200: the tiles that won or came close at some shape
# The head-dim blocks at which the '/ws' tiles are offered: where they paid on the H200.
WS_HEAD_DIMS = {"fwd": (64, 128), "bwd_dkdv": (128,), "bwd_dq": (128,)}
MASKED_KINDS = ("fwd", "bwd_dkdv")  # the kernels whose '/ws' tiles have a '/ws/masked' form (below)
# A causal forward on a '/ws' tile runs the TMA kernel over the key tiles no row's mask cuts, then the
# pointer kernel over those it cuts, with this tile (BLOCK_M, BLOCK_N, warps, stages); its BLOCK_M at most
# the '/ws' tile's and a divisor of it (a smaller one: more programs, each fewer registers, for the same work).
# The fastest of four on the H200 at head_dim 128 and 64 (tune_flash.py, nineteenth round, has the figures).
DIAGONAL_FWD = (64, 64, 4, 2)
# Under a causal mask a '/ws' tile of the forward or the two-pass backward's dK/dV kernel runs in one of two
# forms, both offered to the tuner: '/ws' splits at the diagonal (the pointer kernel takes the tiles the mask
# cuts: for the forward after the TMA kernel, with DIAGONAL_FWD's sizes; for dK/dV before
# it, with the tile's sizes and DIAGONAL_DKDV's warps and stages, leaving its partial sums in fp32, a scratch
# buffer per call of 4x K's size in bf16), '/ws/masked' runs every tile in the TMA kernel, masked, in one launch.
# H200, head_dim 128, bf16 (tune_flash.py, seventeenth round): the masked forward 7.6% faster at S = 4096 and
# 2.5-6.5% slower at 8192-16384, the masked dK/dV 2-6% faster; at head_dim 64 the split forward faster everywhere.
DIAGONAL_DKDV = (8, 2)
# The causal dK/dV and dQ kernels take their programs longest first (in LPT groups of heads, below; the pointer
# kernels across all heads on the H200: dK/dV 8% faster at head_dim 64, S = 4096; dQ 2% at head_dim 128;
# tune_flash.py, eleventh round).
BWD_LONGEST_FIRST = True
# The causal backward's kernels take their tiles longest first in groups of heads whose streamed tensors (K and
# V for dQ, Q and dO for dK/dV) fill at most this many bytes, so that the programs running at once share them in
# L2 (the H200 has 60 MB); 0: one group of every head (longest first over the whole grid). As FlashAttention-3's
# longest-first scheduler groups heads (40 MB sections, a power of two of heads). The forward runs one group
# (see _Forward). Measured on an H100 (tune_flash.py, twentieth round).
LPT_GROUP_BYTES = 32 * 2**20
SHARED_BUDGET = 180 * 1024  # of Hopper's 227 KiB per block, leaving room for what the estimate omits
WS_BUDGET = 220 * 1024  # the '/ws' kernels' estimates are close to what they allocate
ONE_PASS_TMA_BUDGET = 200 * 1024  # the TMA backward allocates up to ~9% more than its estimate (214040 B at 64x128/s3)


def fits(kind: str, tile: Tile, block_d: int, element_size: int, tma: bool = False) -> bool:
    """Would this tile fit in shared memory? An estimate (the test compiles every candidate for sm_90 as a
    launch builds it, to check): the rows a program keeps, plus ``stages - 1`` buffers of the two tiles it
    streams (K and V, or Q and dO), within SHARED_BUDGET, which leaves room for the buffer a launch adds (it
    stages every one of ``stages``), and for the one-pass backward each fp32 dQ tile; a '/ws' kernel buffers
    every stage and stages P for its second dot (the forward: 197112 B allocated at 128x128/s2, head_dim 128,
    bf16, against 196608 estimated; the dK/dV kernel keeps K and V: 164440 B at 64x128/s2 against 147456); the
    one-pass backward's TMA kernel (``tma``) buffers every stage and stages each fp32 dQ tile for its reduce-add."""
    keys_kept = kind in ("bwd_dkdv", "bwd_one_pass")
    kept, streamed = (tile.block_n, tile.block_m) if keys_kept else (tile.block_m, tile.block_n)
    if kind == "bwd_one_pass" and tma:
        need = (2 * kept + tile.stages * 2 * streamed) * block_d * element_size + streamed * block_d * 4
        return need <= ONE_PASS_TMA_BUDGET
    if tile.ws:
        need = ((1 if kind == "fwd" else 2) * kept + tile.stages * 2 * streamed) * block_d + tile.block_m * tile.block_n
        return need * element_size <= WS_BUDGET
    rows = (1 if kind == "fwd" else 2) * kept + max(1, tile.stages - 1) * 2 * streamed
    # the one-pass backward stages each fp32 dQ tile for its atomic adds too (head_dim 256, bf16, 64x64/w4/s2:
    # 263168 B as a launch builds it, past Hopper's 232448)
    dq = streamed * block_d * 4 if kind == "bwd_one_pass" else 0
    return rows * block_d * element_size + dq <= SHARED_BUDGET


def candidates(kind: str, block_d: int, element_size: int, interpreter: bool, tma: bool = False,
               causal: bool = False) -> list[Tile]:
    """The tiles kernel ``kind`` may run with at this head dim and precision, in order of preference;
    ``tma``: the inputs allow a TMA kernel (for fwd, bwd_dkdv and bwd_dq its '/ws' tiles are then among them;
    for bwd_one_pass its tiles are estimated for the TMA kernel); ``causal``: fwd's and bwd_dkdv's '/ws' tiles
    come in both forms, split at the diagonal and '/ws/masked'."""
    if interpreter:  # one small tile: the interpreter's cost is per program
        return [Tile(32, 32, 4, 1)]
    tiles = [Tile(*t) for t in CANDIDATES[kind] if not t[4:] or (tma and block_d in WS_HEAD_DIMS.get(kind, ()))]
    if causal and kind in MASKED_KINDS:
        tiles = [form for t in tiles for form in ((t, dataclasses.replace(t, masked=True)) if t.ws else (t,))]
    return [t for t in tiles if fits(kind, t, block_d, element_size, tma)] or tiles[-1:]


# Sequence lengths are not specialized on (Triton would otherwise compile again when a length's
# divisibility by 16 changes): any length reuses the compiled kernel. Nor is lpt_group, which lengths decide.
_jit = triton.jit(do_not_specialize=["seq_q", "seq_k", "lpt_group"])


@triton.jit
def _tile_and_head(seq, BLOCK: tl.constexpr):
    """(first row of this program's tile, batch * heads index). The grid is one axis, tiles of one head
    next to each other (they share K/V in L2): axis 1 would cap batch * heads at 65535."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(seq, BLOCK)
    return (pid % tiles) * BLOCK, pid // tiles


@triton.jit
def _by_length(t, tiles, n_bh, group):
    """(batch * heads index, rank) of work item ``t`` of a causal kernel whose tiles differ in length, rank 0
    the longest tile of a head: the heads in groups of ``group`` (the last one smaller), and within a group
    every head's tiles of one rank together, the longest first. One group of all heads is longest first
    over the whole grid; groups whose heads' streamed tensors fit in L2 keep the programs that run at once
    reading the same few heads (lpt_group)."""
    per_group = group * tiles
    g = t // per_group
    local = t - g * per_group
    heads_here = tl.minimum(group, n_bh - g * group)
    return g * group + local % heads_here, local // heads_here


@triton.jit
def _longest_tile_first(seq, group, BLOCK: tl.constexpr, FROM_END: tl.constexpr):
    """_tile_and_head for a causal kernel whose programs differ in length, in _by_length's order (FROM_END:
    a head's last tile is its longest), so that the short ones fill the end of the grid."""
    tiles = tl.cdiv(seq, BLOCK)
    bh, rank = _by_length(tl.program_id(0), tiles, tl.num_programs(0) // tiles, group)
    return (tiles - 1 - rank if FROM_END else rank) * BLOCK, bh


@triton.jit
def _head_rows(ptr, b, h, stride_b, stride_h, stride_row, rows, HEAD_DIM: tl.constexpr,
               BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tensor descriptor over one head's (rows, HEAD_DIM) matrix, in BLOCK_ROWS x BLOCK_D tiles: the TMA
    kernels' loads and stores, which arrive as zeros (and are not written) past the head's last row and
    past HEAD_DIM. The head dim must have a unit stride."""
    return tl.make_tensor_descriptor(ptr + b * stride_b + h * stride_h, shape=[rows, HEAD_DIM],
                                     strides=[stride_row, 1], block_shape=[BLOCK_ROWS, BLOCK_D])


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, offs_m, offs_n, d_mask,
               seq_k, causal_offset, qk_scale,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASK or not EVEN_D:
            k = tl.load(k_ptrs + start_n * stride_kn, mask=d_mask[:, None] & (cols[None, :] < seq_k), other=0.0)
            v = tl.load(v_ptrs + start_n * stride_vn, mask=(cols[:, None] < seq_k) & d_mask[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs + start_n * stride_kn)
            v = tl.load(v_ptrs + start_n * stride_vn)
        qk = tl.dot(q, k) * qk_scale
        if MASK:
            keep = cols[None, :] < seq_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + causal_offset)
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # a row may have seen no key yet, or only -inf scores (-inf in the input): keep exp2 away from
        # (-inf) - (-inf), so that such a tile adds nothing, whichever tiles the keys fall in
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_new_safe[:, None])
        alpha = tl.math.exp2(m_i - m_new_safe)  # rescales what earlier tiles accumulated
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@_jit
def _flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, part_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, seq_q, seq_k, qk_scale, lpt_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS_N: tl.constexpr, WS_M: tl.constexpr,
):
    # STORE_LSE=False: no backward will follow (inference), so the log-sum-exp is not written.
    # WS_N > 0 (causal, after _flash_fwd_tma_kernel with PARTIAL, BLOCK_M WS_M, a multiple of this BLOCK_M):
    # for each of its query tiles that kernel has run the key tiles before the last multiple of WS_N at or
    # before the diagonal of the tile's first row, unmasked, and left
    # each row's output over them, normalised, in o and its log-sum-exp in part_ptr ((seq_q, 4) rows per
    # head); this kernel starts from there and runs the rest.
    if CAUSAL and WS_N == 0:  # the last query tile sees the most keys (after the TMA kernel, tiles of one length)
        start_m, bh = _longest_tile_first(seq_q, lpt_group, BLOCK_M, True)
    else:
        start_m, bh = _tile_and_head(seq_q, BLOCK_M)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    row_mask = offs_m < seq_q
    tile_mask = row_mask[:, None] & d_mask[None, :]  # of a (BLOCK_M, BLOCK_D) tile: q's, o's

    q_ptrs = q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = k_ptr + b * stride_kb + h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    o_ptrs = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    q = tl.load(q_ptrs, mask=tile_mask, other=0.0)

    # Key tiles [0, full_hi) need no mask at all (WS_N: the TMA kernel ran them); [full_hi, hi) straddle the
    # causal diagonal or seq_k.
    causal_offset = seq_k - seq_q
    if CAUSAL:
        hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + causal_offset), 0)
        full_hi = tl.maximum(tl.minimum(seq_k, start_m + causal_offset + 1), 0)
    else:
        hi = seq_k
        full_hi = seq_k
    if WS_N > 0:  # a softmax over those keys alone: max lse, sum 1 (0 where the row saw none of them)
        ws_first = (start_m // WS_M) * WS_M  # the first row of the TMA kernel's tile these rows were in
        full_hi = (tl.maximum(tl.minimum(seq_k, ws_first + causal_offset + 1), 0) // WS_N) * WS_N
        acc = tl.load(o_ptrs, mask=tile_mask, other=0.0).to(tl.float32)
        m_i = tl.load(part_ptr + (bh.to(tl.int64) * seq_q + offs_m) * 4, mask=row_mask, other=float("-inf"))
        l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    else:
        full_hi = (full_hi // BLOCK_N) * BLOCK_N
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, 0, full_hi,
                                   offs_m, offs_n, d_mask, seq_k, causal_offset, qk_scale,
                                   False, CAUSAL, EVEN_D, BLOCK_N)
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, full_hi, hi,
                               offs_m, offs_n, d_mask, seq_k, causal_offset, qk_scale,
                               True, CAUSAL, EVEN_D, BLOCK_N)

    # Rows that see no key (causal, seq_q > seq_k), or whose every score is -inf (-inf in the input): output
    # 0, as SDPA gives, and lse +inf -> p = 0 in the backward.
    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    if STORE_LSE:
        lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        tl.store(lse_ptr + bh.to(tl.int64) * seq_q + offs_m, lse, mask=row_mask)
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _longest_first(tile, tiles, n_bh, group):
    """(head, rank) of a causal kernel's tile number ``tile`` of a grid-stride loop, in _by_length's order;
    a persistent grid takes its rounds (one tile per program) alternately forwards and backwards, so that
    each program's total evens out (the last round, partial, forwards)."""
    programs = tl.num_programs(0)
    k = tile // programs
    turn = (k % 2 == 1) & ((k + 1) * programs <= tiles * n_bh)
    t = tl.where(turn, (2 * k + 1) * programs - 1 - tile, tile)
    return _by_length(t, tiles, n_bh, group)


@_jit
def _flash_fwd_tma_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, seq_q, seq_k, qk_scale, lpt_group, n_bh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_K: tl.constexpr, PARTIAL: tl.constexpr,
    FLAT: tl.constexpr, TILE_STAGES: tl.constexpr,
):
    # The forward on Hopper (a '/ws' tile): _flash_fwd_kernel's arithmetic, with the tiles moved by the
    # tensor-memory accelerator (a head's rows past its length arrive as zeros, never from the next
    # head) and the key loop warp-specialized: a producer warp group issues the copies, two consumer
    # groups run the dots and the softmax. Persistent: about one program per SM (_Forward), each running
    # query tiles in a grid-stride loop (16 heads x 4096 rows, head_dim 128, on the H200: 595-608 TFLOP/s
    # against 519-529 with a program per tile, which paid a prologue and an epilogue per tile); causal,
    # the longest tiles first, in rounds that alternate direction (_longest_first).
    # FLAT (whole tiles, heads one after another: _flat): the descriptors are made once per program;
    # else per tile, over its head. Triton 3.6's warp specialization
    # takes no tl.reshape, so no 3-D or 4-D descriptor. Triton (3.6-3.9) specializes one loop per kernel
    # and none with a branch inside, so the key loop is one loop, masked throughout unless no tile needs
    # it (EVEN_K: seq_k a multiple of BLOCK_N, or PARTIAL, below). Under a causal mask (PARTIAL) it runs
    # the key tiles that no row's mask cuts, unmasked; the output over them, normalised, and its
    # log-sum-exp (-inf where a row saw no key) go to o and lse_ptr, from which _flash_fwd_kernel (WS_N)
    # runs the tiles at the diagonal (measured faster than the mask inside this loop: tune_flash.py).
    # The caller guarantees a unit stride in head_dim and 16-byte aligned bases and strides (_tma_ready).
    MASK: tl.constexpr = (CAUSAL and not PARTIAL) or not EVEN_K
    tiles = tl.cdiv(seq_q, BLOCK_M)
    if FLAT:  # every head's rows one after another, in whole tiles: one descriptor per tensor, made once
        q_desc = _head_rows(q_ptr, 0, 0, 0, 0, stride_qm, n_bh * seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
        k_desc = _head_rows(k_ptr, 0, 0, 0, 0, stride_kn, n_bh * seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
        v_desc = _head_rows(v_ptr, 0, 0, 0, 0, stride_vn, n_bh * seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
        o_desc = _head_rows(o_ptr, 0, 0, 0, 0, stride_om, n_bh * seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
        if STORE_LSE or PARTIAL:
            lse_desc = tl.make_tensor_descriptor(lse_ptr, shape=[n_bh * seq_q, 4], strides=[4, 1],
                                                 block_shape=[BLOCK_M, 4])
    # Rows counted from start_m, start_m kept out of the range: triton 3.6 splits the rows between the two
    # consumer groups and, for the second, both shifts start_m + tl.arange(0, BLOCK_M)'s start_m by half a
    # tile and slices the range to its second half (TTGIR: the shift counted twice), so a mask built on
    # that sum missed by BLOCK_M / 2 rows there. A scalar added to the mask's other side is not shifted.
    rows = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    causal_offset = seq_k - seq_q
    # TILE_STAGES (tile_stages): the tile loop pipelined (the next tile's Q loaded early) where it fits
    for tile in tl.range(tl.program_id(0), tiles * n_bh, tl.num_programs(0), num_stages=TILE_STAGES):
        if CAUSAL:  # tiles differ in length: the last rows' first
            bh, rank = _longest_first(tile, tiles, n_bh, lpt_group)
            start_m = (tiles - 1 - rank) * BLOCK_M
        else:
            bh = tile // tiles
            start_m = (tile % tiles) * BLOCK_M
        if FLAT:
            q_row = bh * seq_q + start_m
            k_row = bh * seq_k
        else:  # one head's descriptors: its rows past its length arrive as zeros, and are not written
            b = (bh // n_heads).to(tl.int64)
            h = (bh % n_heads).to(tl.int64)
            q_desc = _head_rows(q_ptr, b, h, stride_qb, stride_qh, stride_qm, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
            k_desc = _head_rows(k_ptr, b, h, stride_kb, stride_kh, stride_kn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
            v_desc = _head_rows(v_ptr, b, h, stride_vb, stride_vh, stride_vn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
            o_desc = _head_rows(o_ptr, b, h, stride_ob, stride_oh, stride_om, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
            if STORE_LSE or PARTIAL:
                lse_desc = tl.make_tensor_descriptor(lse_ptr + bh.to(tl.int64) * seq_q * 4, shape=[seq_q, 4],
                                                     strides=[4, 1], block_shape=[BLOCK_M, 4])
            q_row = start_m
            k_row = 0
        q = q_desc.load([q_row, 0])
        # The running max starts at -FLT_MAX, not -inf: a row that has seen only -inf scores then takes
        # exp2(-inf - m) = 0 with no guard against -inf - -inf (4-6% faster at head_dim 64 on the H200)
        m_i = tl.full([BLOCK_M], -3.4028234663852886e38, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        hi = seq_k
        if PARTIAL:  # up to the last multiple of BLOCK_N at or before the tile's first row's diagonal
            hi = (tl.maximum(tl.minimum(seq_k, start_m + causal_offset + 1), 0) // BLOCK_N) * BLOCK_N
        elif CAUSAL:
            hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + causal_offset), 0)
        for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
            k = k_desc.load([k_row + start_n, 0])
            qk = tl.dot(q, k.T)
            # Masked: the raw scores are set to -inf, so the scale still folds into one multiply-add
            # (qk_scale > 0: _check); keys counted from start_n. Causal, no key test: a row below seq_q
            # sees no key past seq_k, and the rows past seq_q are never stored (sm_90 PTX: ~250 fewer
            # instructions per thread per key tile than a key test and a scale before the mask)
            if MASK and CAUSAL:  # row start_m + i sees key start_n + j iff j <= i + offset
                qk = tl.where(offs_n[None, :] <= rows[:, None] + (start_m + causal_offset - start_n), qk,
                              float("-inf"))
            elif MASK:
                qk = tl.where(offs_n[None, :] < seq_k - start_n, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = v_desc.load([k_row + start_n, 0])
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new

        empty = l_i == 0.0
        acc = acc / tl.where(empty, 1.0, l_i)[:, None]
        if STORE_LSE or PARTIAL:  # as (seq_q, 4) rows through a descriptor: a plain store after the loop is lost on 3.6
            if PARTIAL:
                lse = m_i + tl.math.log2(l_i)  # -inf where l_i = 0 (log2(0) = -inf, m_i -FLT_MAX)
            else:
                lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
            lse_desc.store([q_row, 0], tl.broadcast_to(lse[:, None], [BLOCK_M, 4]))
        o_desc.store([q_row, 0], acc.to(o_ptr.dtype.element_ty))


@_jit
def _bwd_delta_kernel(o_ptr, do_ptr, delta_ptr,
                      stride_ob, stride_oh, stride_om, stride_od,
                      stride_dob, stride_doh, stride_dom, stride_dod,
                      n_heads, seq_q,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    # delta_i = sum_d O_id dO_id = sum_j P_ij dP_ij: the softmax backward's row term.
    start_m, bh = _tile_and_head(seq_q, BLOCK_M)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=mask, other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_ptr + bh.to(tl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom, lse_ptr, delta_ptr, dq_acc_ptr, row_base,
                lo, hi, offs_m, offs_n, offs_d, d_mask, seq_q, seq_k, causal_offset, qk_scale,
                CAUSAL: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                ADD_DQ: tl.constexpr):
    """Query tiles [lo, hi) past one program's keys. CAUSAL: the tiles a causal mask cuts (it is applied);
    ROWS: tiles that may pass seq_q (their rows are masked). Elsewhere neither test runs. Rows past seq_q
    and keys past seq_k arrive as zeros, whose scores against a -inf in the input are NaN: P is zeroed
    there, where such a NaN would reach dK/dV (rows) or dQ (keys, ADD_DQ)."""
    for start_m in tl.range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        if ROWS:
            row_mask = rows < seq_q
            q = tl.load(q_ptrs + start_m * stride_qm, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
            do = tl.load(do_ptrs + start_m * stride_dom, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
            lse = tl.load(lse_ptr + row_base + rows, mask=row_mask, other=float("inf"))
            delta = tl.load(delta_ptr + row_base + rows, mask=row_mask, other=0.0)
        else:
            q = tl.load(q_ptrs + start_m * stride_qm, mask=d_mask[None, :], other=0.0)
            do = tl.load(do_ptrs + start_m * stride_dom, mask=d_mask[None, :], other=0.0)
            lse = tl.load(lse_ptr + row_base + rows)
            delta = tl.load(delta_ptr + row_base + rows)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])  # (BLOCK_N, BLOCK_M)
        if ROWS:
            keep = row_mask[None, :]
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :] + causal_offset)
            p_t = tl.where(keep, p_t, 0.0)
        elif CAUSAL:
            p_t = tl.where(offs_n[:, None] <= rows[None, :] + causal_offset, p_t, 0.0)
        if ADD_DQ:
            p_t = tl.where(offs_n[:, None] < seq_k, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
        if ADD_DQ:
            dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k)  # (BLOCK_M, BLOCK_D); scaled once, after all adds
            dq_ptrs = dq_acc_ptr + (row_base + rows[:, None]) * BLOCK_D + offs_d[None, :]
            if ROWS:
                tl.atomic_add(dq_ptrs, dq, mask=(rows < seq_q)[:, None], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _diagonal_tiles(start_n, causal_offset, seq_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, mid): the query tiles (from 0, BLOCK_M apart) that a causal mask cuts for keys [start_n,
    +BLOCK_N): query i sees key j iff i >= j - causal_offset. No tile before lo sees a key; from mid on
    (the first tile whose first query sees the last key) every tile sees them all."""
    lo = (tl.maximum(start_n - causal_offset, 0) // BLOCK_M) * BLOCK_M
    mid = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M, lo),
                     seq_q)
    return lo, mid


@_jit
def _flash_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_acc_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    n_heads, seq_q, seq_k, sm_scale, qk_scale, lpt_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ADD_DQ: tl.constexpr, DIAGONAL: tl.constexpr,
    LONGEST_FIRST: tl.constexpr,
):
    # One program owns BLOCK_N keys and walks every query tile that can see them. ADD_DQ (the one-pass
    # backward, FlashAttention-2/3's scheme): it also adds each query tile's share of dQ, dS K, to an fp32
    # (batch * heads, seq_q, BLOCK_D) buffer with atomics, so no second kernel recomputes P and dP for
    # dQ (5 matmuls per tile pair instead of 7); the order of those additions varies from run to run.
    # DIAGONAL (causal, before _flash_bwd_tma_kernel's PARTIAL run with the same BLOCK_M and BLOCK_N): only
    # the tiles the diagonal cuts, their sums (dK unscaled) left in fp32 at dq_acc_ptr, a (batch * heads *
    # seq_k, 2 * BLOCK_D) buffer, dK's then dV's, for that kernel to go on from; dk and dv not written.
    if CAUSAL and LONGEST_FIRST:  # the first key tile sees the most queries
        start_n, bh = _longest_tile_first(seq_k, lpt_group, BLOCK_N, False)
    else:
        start_n, bh = _tile_and_head(seq_k, BLOCK_N)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    kv_mask = (offs_n[:, None] < seq_k) & d_mask[None, :]

    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    q_ptrs = q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    do_ptrs = do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
    row_base = bh.to(tl.int64) * seq_q
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Query tiles in three runs: those the causal mask cuts (query i sees key j iff i >= j - causal_offset),
    # then whole tiles no mask touches, then the tile that passes seq_q: the mask's arithmetic only where
    # it changes something.
    causal_offset = seq_k - seq_q
    mid = 0
    if CAUSAL:
        lo, mid = _diagonal_tiles(start_n, causal_offset, seq_q, BLOCK_M, BLOCK_N)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom, lse_ptr, delta_ptr, dq_acc_ptr,
                             row_base, lo, mid, offs_m, offs_n, offs_d, d_mask, seq_q, seq_k, causal_offset, qk_scale,
                             True, True, BLOCK_M, BLOCK_D, ADD_DQ)
    if DIAGONAL:  # every key row, zeros too: the TMA kernel reads them all
        part = dq_acc_ptr + (bh.to(tl.int64) * seq_k + offs_n[:, None]) * (2 * BLOCK_D) + offs_d[None, :]
        tl.store(part, dk, mask=(offs_n < seq_k)[:, None])
        tl.store(part + BLOCK_D, dv, mask=(offs_n < seq_k)[:, None])
    else:
        whole = tl.maximum(mid, (seq_q // BLOCK_M) * BLOCK_M)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom, lse_ptr, delta_ptr, dq_acc_ptr,
                             row_base, mid, whole, offs_m, offs_n, offs_d, d_mask, seq_q, seq_k, causal_offset,
                             qk_scale, False, False, BLOCK_M, BLOCK_D, ADD_DQ)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom, lse_ptr, delta_ptr, dq_acc_ptr,
                             row_base, whole, seq_q, offs_m, offs_n, offs_d, d_mask, seq_q, seq_k, causal_offset,
                             qk_scale, False, True, BLOCK_M, BLOCK_D, ADD_DQ)
        tl.store(dk_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                 (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(dv_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                 dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@_jit
def _flash_bwd_tma_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_acc_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    n_heads, seq_q, seq_k, sm_scale, qk_scale, lpt_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_Q: tl.constexpr, ADD_DQ: tl.constexpr, WS: tl.constexpr,
    PARTIAL: tl.constexpr, LONGEST_FIRST: tl.constexpr,
):
    # The one-pass backward on Hopper (FlashAttention-3's scheme): _flash_bwd_dkdv_kernel with ADD_DQ,
    # but every tile moved by the tensor-memory accelerator, one 2-D descriptor per head (rows past a
    # head's length arrive as zeros and are never written), and each query tile's share of dQ added to
    # the fp32 buffer by one TMA reduce-add instead of BLOCK_M * BLOCK_D atomics. Without ADD_DQ it is
    # the two-pass backward's dK/dV kernel. WS: the query loop is warp-specialized (a producer warp group
    # issues the copies, two consumer groups split the keys); Triton (3.9) specializes it only without
    # ADD_DQ. One loop (Triton specializes no more), masked throughout unless no tile needs it (EVEN_Q:
    # seq_q a multiple of BLOCK_M, and not causal or PARTIAL). PARTIAL (causal, a '/ws' tile, not masked): only
    # the query tiles no causal mask cuts, unmasked, going on from the sums over the others that
    # _flash_bwd_dkdv_kernel (DIAGONAL) left at dq_acc_ptr.
    # A program per key tile (persistent measured no faster on the H200: tune_flash.py, tenth round).
    # The caller guarantees a unit stride in head_dim and 16-byte aligned bases and strides (_tma_ready).
    if CAUSAL and LONGEST_FIRST:  # the first key tile sees the most queries
        start_n, bh = _longest_tile_first(seq_k, lpt_group, BLOCK_N, False)
    else:
        start_n, bh = _tile_and_head(seq_k, BLOCK_N)
    MASK: tl.constexpr = (CAUSAL and not PARTIAL) or not EVEN_Q
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    q_desc = _head_rows(q_ptr, b, h, stride_qb, stride_qh, stride_qm, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
    do_desc = _head_rows(do_ptr, b, h, stride_dob, stride_doh, stride_dom, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
    k_desc = _head_rows(k_ptr, b, h, stride_kb, stride_kh, stride_kn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    v_desc = _head_rows(v_ptr, b, h, stride_vb, stride_vh, stride_vn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    dk_desc = _head_rows(dk_ptr, b, h, stride_kb, stride_kh, stride_kn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)  # K's strides
    dv_desc = _head_rows(dv_ptr, b, h, stride_vb, stride_vh, stride_vn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    row_base = bh.to(tl.int64) * seq_q
    dq_desc = tl.make_tensor_descriptor(dq_acc_ptr + row_base * BLOCK_D, shape=[seq_q, BLOCK_D],
                                        strides=[BLOCK_D, 1], block_shape=[BLOCK_M, BLOCK_D])
    # Keys counted from start_n, as the forward counts its rows from start_m (_flash_fwd_tma_kernel): the
    # warp-specialized loop splits the keys between the consumer groups
    keys = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    k = k_desc.load([start_n, 0])  # keys past seq_k arrive as 0 (P is zeroed there for dQ; dK/dV clip them)
    v = v_desc.load([start_n, 0])
    if PARTIAL:  # only ever causal. The sums by pointer loads into registers (right on the H200): a TMA load
        # here was staged in shared memory that triton 3.6 seems to give both consumer groups at once (dK came
        # out wrong). Keys counted from start_n, start_n in the base (see keys, above).
        part = dq_acc_ptr + (bh.to(tl.int64) * seq_k + start_n) * (2 * BLOCK_D) \
            + keys[:, None] * (2 * BLOCK_D) + tl.arange(0, BLOCK_D)[None, :]
        dk = tl.load(part, mask=(keys < seq_k - start_n)[:, None], other=0.0)
        dv = tl.load(part + BLOCK_D, mask=(keys < seq_k - start_n)[:, None], other=0.0)
    else:
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    causal_offset = seq_k - seq_q
    lo = 0
    if CAUSAL:  # query i sees key j iff i >= j - causal_offset
        lo, mid = _diagonal_tiles(start_n, causal_offset, seq_q, BLOCK_M, BLOCK_N)
        if PARTIAL:
            lo = mid
    for start_m in tl.range(lo, seq_q, BLOCK_M, warp_specialize=WS):
        rows = start_m + offs_m
        q = q_desc.load([start_m, 0])
        do = do_desc.load([start_m, 0])
        if not EVEN_Q:  # rows past seq_q: lse +inf, so p = 0
            lse = tl.load(lse_ptr + row_base + rows, mask=rows < seq_q, other=float("inf"))
            delta = tl.load(delta_ptr + row_base + rows, mask=rows < seq_q, other=0.0)
        else:
            lse = tl.load(lse_ptr + row_base + rows)
            delta = tl.load(delta_ptr + row_base + rows)
        p_t = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse[None, :])  # (BLOCK_N, BLOCK_M)
        # rows past seq_q (only where not EVEN_Q) arrive as zeros: NaN against a -inf key, which must not
        # reach dK/dV. Key start_n + j sees query i iff j <= i + (causal_offset - start_n).
        if MASK and CAUSAL and not PARTIAL and EVEN_Q:
            p_t = tl.where(keys[:, None] <= rows[None, :] + (causal_offset - start_n), p_t, 0.0)
        elif MASK and CAUSAL and not PARTIAL:
            p_t = tl.where((rows[None, :] < seq_q) & (keys[:, None] <= rows[None, :] + (causal_offset - start_n)),
                           p_t, 0.0)
        elif MASK:
            p_t = tl.where(rows[None, :] < seq_q, p_t, 0.0)
        if ADD_DQ:  # keys past seq_k likewise, for dQ
            p_t = tl.where(keys[:, None] < seq_k - start_n, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        ds_t = p_t * (tl.dot(v, do.T) - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
        if ADD_DQ:
            dq_desc.atomic_add([start_m, 0], tl.dot(ds_t.to(k.dtype).T, k))  # scaled once, after all adds
    dk_desc.store([start_n, 0], (dk * sm_scale).to(dk_ptr.dtype.element_ty))
    dv_desc.store([start_n, 0], dv.to(dv_ptr.dtype.element_ty))


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, offs_m, offs_n, d_mask,
              seq_k, causal_offset, qk_scale, MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles [lo, hi) past one program's queries; MASK: tiles the causal mask or seq_k cuts."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASK:
            kv_mask = (cols[:, None] < seq_k) & d_mask[None, :]
        else:
            kv_mask = d_mask[None, :]
        k = tl.load(k_ptrs + start_n * stride_kn, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=kv_mask, other=0.0)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None])
        if MASK:
            keep = cols[None, :] < seq_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + causal_offset)
            p = tl.where(keep, p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@_jit
def _flash_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    n_heads, seq_q, seq_k, sm_scale, qk_scale, lpt_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LONGEST_FIRST: tl.constexpr,
):
    # One program owns BLOCK_M queries and walks the key tiles they can see.
    if CAUSAL and LONGEST_FIRST:  # the last query tile sees the most keys
        start_m, bh = _longest_tile_first(seq_q, lpt_group, BLOCK_M, True)
    else:
        start_m, bh = _tile_and_head(seq_q, BLOCK_M)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    row_mask = offs_m < seq_q
    q_mask = row_mask[:, None] & d_mask[None, :]

    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=q_mask, other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                 mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * seq_q + offs_m, mask=row_mask, other=float("inf"))
    delta = tl.load(delta_ptr + bh.to(tl.int64) * seq_q + offs_m, mask=row_mask, other=0.0)
    k_ptrs = k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Key tiles in two runs: whole tiles every query here sees, then those the causal mask or seq_k cuts.
    causal_offset = seq_k - seq_q
    hi = seq_k
    whole = (seq_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + causal_offset), 0)
        # tiles whose last key the first query here sees
        whole = tl.minimum(whole, (tl.maximum(start_m + causal_offset + 1, 0) // BLOCK_N) * BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, 0, whole, offs_m, offs_n, d_mask,
                   seq_k, causal_offset, qk_scale, False, CAUSAL, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, whole, hi, offs_m, offs_n, d_mask,
                   seq_k, causal_offset, qk_scale, True, CAUSAL, BLOCK_N)
    dq = dq * sm_scale
    tl.store(dq_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
             dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


@_jit
def _flash_bwd_dq_tma_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    n_heads, seq_q, seq_k, sm_scale, qk_scale, lpt_group,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr, CAUSAL: tl.constexpr, LONGEST_FIRST: tl.constexpr,
):
    # The dQ kernel on Hopper (a '/ws' tile): _flash_bwd_dq_kernel's arithmetic with every tile moved by TMA
    # and the key loop warp-specialized (a producer warp group, two consumer groups splitting the queries);
    # H200, head_dim 128, no causal mask: 5-7% faster than the pointer kernel (bench_dq_tma.py). CAUSAL: the
    # mask on every key tile (one loop: Triton specializes no more), rows counted from start_m as the
    # forward counts them (_flash_fwd_tma_kernel), the longest tiles first (LONGEST_FIRST, lpt_group).
    # lse and delta come through 1-D descriptors over every head's rows: pointer loads of them do not
    # compile specialized (Triton 3.6 and 3.9), and a descriptor's start must be 16-byte aligned, so the
    # caller guarantees seq_q % 4 == 0 and fewer than 2^31 rows. A last tile's rows past seq_q read the next
    # head's values (or zeros): they reach only dQ rows that the descriptor's store does not write.
    if CAUSAL and LONGEST_FIRST:  # the last query tile sees the most keys
        start_m, bh = _longest_tile_first(seq_q, lpt_group, BLOCK_M, True)
    else:
        start_m, bh = _tile_and_head(seq_q, BLOCK_M)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    q_desc = _head_rows(q_ptr, b, h, stride_qb, stride_qh, stride_qm, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
    do_desc = _head_rows(do_ptr, b, h, stride_dob, stride_doh, stride_dom, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)
    k_desc = _head_rows(k_ptr, b, h, stride_kb, stride_kh, stride_kn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    v_desc = _head_rows(v_ptr, b, h, stride_vb, stride_vh, stride_vn, seq_k, HEAD_DIM, BLOCK_N, BLOCK_D)
    dq_desc = _head_rows(dq_ptr, b, h, stride_qb, stride_qh, stride_qm, seq_q, HEAD_DIM, BLOCK_M, BLOCK_D)  # q's strides
    rows = (tl.num_programs(0) // tl.cdiv(seq_q, BLOCK_M)) * seq_q  # every head's
    lse_desc = tl.make_tensor_descriptor(lse_ptr, shape=[rows], strides=[1], block_shape=[BLOCK_M])
    delta_desc = tl.make_tensor_descriptor(delta_ptr, shape=[rows], strides=[1], block_shape=[BLOCK_M])
    lse = lse_desc.load([bh * seq_q + start_m])
    delta = delta_desc.load([bh * seq_q + start_m])
    q = q_desc.load([start_m, 0])
    do = do_desc.load([start_m, 0])
    keys = tl.arange(0, BLOCK_N)  # counted from start_n, as _flash_bwd_tma_kernel counts them
    rows = tl.arange(0, BLOCK_M)  # counted from start_m (the consumer groups split them)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = seq_k
    if CAUSAL:  # query i sees key j iff j <= i + seq_k - seq_q
        hi = tl.maximum(tl.minimum(seq_k, start_m + BLOCK_M + seq_k - seq_q), 0)
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        k = k_desc.load([start_n, 0])  # keys past seq_k arrive as zeros: their scores are not -inf
        v = v_desc.load([start_n, 0])
        p = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse[:, None])
        if CAUSAL:  # no key test: a row below seq_q sees no key past seq_k (rows past it are not stored)
            p = tl.where(keys[None, :] <= rows[:, None] + (start_m + seq_k - seq_q - start_n), p, 0.0)
        elif not EVEN_K:
            p = tl.where(keys[None, :] < seq_k - start_n, p, 0.0)
        ds = p * (tl.dot(do, v.T) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    dq_desc.store([start_m, 0], (dq * sm_scale).to(dq_ptr.dtype.element_ty))


_last: dict[str, Tile] = {}  # kernel -> the tile it last ran with, for the performance tables


def tiles_in_use() -> dict[str, str]:
    """The tile each kernel last ran with (tuned, cached, pinned or first fitting), as 'BMxBN/wW/sS'; of the
    backward's kernels, those the last backward ran (bwd_dkdv and bwd_dq, or bwd_one_pass), the others ''."""
    return {kind: str(_last[kind]) if kind in _last else "" for kind in CANDIDATES}


@functools.lru_cache(maxsize=None)
def _candidates(kind: str, block_d: int, dtype: torch.dtype, tma: bool, causal: bool = False) -> list[Tile]:
    return candidates(kind, block_d, dtype.itemsize, backend.current() == "interpreter", tma, causal)


def _tile(kind: str, q, seq_q: int, seq_k: int, block_d: int, causal: bool, run, tma: bool = False) -> Tile:
    key = (kind, q.dtype, block_d, causal, bucket(seq_q), bucket(seq_k)) + (("tma",) if tma else ()) \
        + (("masked",) if tma and causal and kind in MASKED_KINDS else ())  # '/ws/masked' tiles among the candidates
    tile = _last[kind] = _flash_tiles.choose(key, _candidates(kind, block_d, q.dtype, tma, causal), run)
    return tile


@functools.lru_cache(maxsize=None)
def _hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] == 9  # where the TMA kernel was written and measured


try:  # in-kernel tensor descriptors live in a scratch buffer that Triton asks an allocator for
    from triton.runtime._allocation import NullAllocator, _allocator
    _HAS_TMA = hasattr(tl, "make_tensor_descriptor")
except ImportError:  # a Triton without them: the pointer kernel only
    _HAS_TMA = False
_HAS_TMA_REDUCE = _HAS_TMA and hasattr(tl.tensor_descriptor, "atomic_add")  # the one-pass backward's dQ adds


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Can the TMA kernels address these (b, h, s, d) tensors? Hopper, fp16/bf16, unit stride in
    head_dim, a row of whole 16-byte units (a TMA store writes whole units: no padding past a row is
    touched), rows that do not repeat (a zero row stride, as autograd may hand dO, is no descriptor), and
    every base and stride 16-byte aligned, as tensor descriptors require."""
    t0 = tensors[0]
    return (_HAS_TMA and t0.dtype in (torch.float16, torch.bfloat16) and backend.current() == "gpu"
            and _hopper(t0.device)
            and all(t.stride(-1) == 1 and t.stride(-2) > 0 and t.data_ptr() % 16 == 0
                    and t.shape[-1] * t.element_size() % 16 == 0
                    and all(st * t.element_size() % 16 == 0 for st in t.stride()[:-1]) for t in tensors))


def tile_stages(block_d: int, causal: bool) -> int:
    """The persistent TMA forward's tile-loop stages: 2 (the next tile's Q loaded during this one's loop)
    at head_dim blocks up to 64, +3-6% there on the H200; 1 above, where Triton 3.9 would need 295512 B
    of shared memory at 128x128/s2 (and 3.6 measured within noise of 1), and under a causal mask (chosen
    when a causal program ran one tile; not measured since it runs several)."""
    return 2 if block_d <= 64 and not causal else 1


def diagonal_fwd(tile: Tile) -> Tile:
    """The pointer kernel's tile for the key tiles at the diagonal, after the TMA kernel ran the '/ws' tile
    ``tile`` (DIAGONAL_FWD; its BLOCK_M no larger than the '/ws' tile's, which it must divide)."""
    block_m, *rest = DIAGONAL_FWD
    block_m = min(block_m, tile.block_m)
    if tile.block_m % block_m:
        raise ValueError(f"DIAGONAL_FWD's BLOCK_M {block_m} does not divide the '/ws' tile's {tile.block_m}")
    return Tile(block_m, *rest)


def _flat(t: torch.Tensor, block: int) -> bool:
    """Are t's (b, h, s, d) rows one (b * h * s, d) matrix, with whole ``block``-row tiles in each head
    and row indices that fit in int32? Then one tensor descriptor addresses every head."""
    batch, heads, seq, _ = t.shape
    return (seq % block == 0 and batch * heads * seq < 2**31 and (heads == 1 or t.stride(1) == seq * t.stride(2))
            and (batch == 1 or t.stride(0) == heads * seq * t.stride(2)))


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # torch's allocator: stream-ordered, capture-safe


def _ensure_allocator() -> None:
    """Give Triton torch's allocator for descriptor scratch, unless this thread's caller set one."""
    if isinstance(_allocator.get(), NullAllocator):
        triton.set_allocator(_scratch)


def _cdiv(a: int, b: int) -> int:  # plain ints: triton.cdiv is a constexpr function, ~5 us per host call
    return -(-a // b)


def lpt_group(n_bh: int, streamed_rows: int, head_dim: int, element_size: int) -> int:
    """How many heads a causal kernel's longest-first order takes at a time (_by_length): the largest power of
    two of heads whose two streamed (streamed_rows, head_dim) tensors fit in LPT_GROUP_BYTES, at least 1 (and at
    most every head); every head where LPT_GROUP_BYTES is 0."""
    fit = LPT_GROUP_BYTES // max(1, 2 * streamed_rows * head_dim * element_size)
    if not LPT_GROUP_BYTES or fit >= n_bh:
        return max(1, n_bh)
    return 1 << max(0, fit.bit_length() - 1)


# Each kernel is launched through a DirectLaunch (kernels/_launch.py), and each call shape keeps its
# prepared launches in a _Plan, so a repeated call does no checks, tile lookup or argument binding. The
# TMA kernels (the '/ws' ones among them) are compiled without the barriers Triton's warp specialization
# initializes and never uses, which made them wrong beside another process (kernels/_dead_barriers.py).
_direct: dict = {}


def _prepare(kernel, programs: int, numbers: tuple, consts: dict, tile: Tile | None = None) -> Prepared:
    """kernel[(programs,)](*tensors, *numbers, **consts, **tile.kwargs), for the tensors given at each call."""
    if kernel not in _direct:
        tma = kernel in (_flash_fwd_tma_kernel, _flash_bwd_tma_kernel, _flash_bwd_dq_tma_kernel)
        _direct[kernel] = (_dead_barriers.WithoutDeadBarriers if tma else DirectLaunch)(kernel)
    return _direct[kernel].prepare(programs, numbers, {**consts, **tile.kwargs} if tile else consts)


def _capturing() -> bool:  # a tile chosen during a CUDA graph capture is provisional (_flash_tiles.choose)
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _Forward:
    """The forward of one configuration (shapes, strides, dtypes, causal, scale, log-sum-exp stored or
    not), its tile chosen on the first call's tensors (tuning if no process had) and its launch prepared:
    ``forward(q, k, v) -> (o, lse)``."""

    def __init__(self, q, k, v, causal: bool, sm_scale: float, store_lse: bool, ws: bool = False):
        batch, heads, seq_q, head_dim = q.shape
        seq_k, block_d = k.shape[2], bucket(head_dim)  # the head-dim block: the power of two at or above it
        self.shape, self.store_lse = q.shape, store_lse
        o, lse = self._outputs(q)
        # the causal forward takes its tiles longest first across every head, one group: in groups of heads
        # (lpt_group, as the backward's kernels take them) it measured ~10% slower (H100, bf16, D=128, S=4096
        # / 16384: 445 / 504 against 495 / 559 TFLOP/s), where the backward gained
        numbers = (*q.stride(), *k.stride(), *v.stride(), *o.stride(), heads, seq_q, seq_k, sm_scale * LOG2E,
                   batch * heads)
        consts = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=causal, STORE_LSE=store_lse)
        tma = ws and _tma_ready(q, k, v, o)  # its one TMA kernel is the warp-specialized one

        def prepared(tile: Tile) -> tuple[Prepared | None, Prepared | None]:
            """(the TMA kernel's launch or None, the pointer kernel's launch or None): causal on a '/ws'
            tile runs both, the TMA kernel over the tiles no row's mask cuts, then the pointer kernel
            (DIAGONAL_FWD's sizes) over the rest."""
            programs = _cdiv(seq_q, tile.block_m) * batch * heads
            if tile.ws and tma:
                split = causal and not tile.masked
                flat = _flat(q, tile.block_m) and _flat(o, tile.block_m) and _flat(k, tile.block_n) \
                    and _flat(v, tile.block_n)
                ws = _prepare(_flash_fwd_tma_kernel, min(programs, sm_count(q.device)), (*numbers, batch * heads),
                              {**consts, "EVEN_K": split or seq_k % tile.block_n == 0, "PARTIAL": split,
                               "FLAT": flat, "TILE_STAGES": tile_stages(block_d, causal)}, tile)
                diagonal = diagonal_fwd(tile)
                return ws, _prepare(_flash_fwd_kernel, _cdiv(seq_q, diagonal.block_m) * batch * heads, numbers,
                                    {**consts, "WS_N": tile.block_n, "WS_M": tile.block_m}, diagonal) if split else None
            # a pinned '/ws' tile where the TMA kernel cannot run runs its sizes in the pointer kernel
            return None, _prepare(_flash_fwd_kernel, programs, numbers, {**consts, "WS_N": 0, "WS_M": 0}, tile)

        self.tile = _tile("fwd", q, seq_q, seq_k, block_d, causal, lambda t: self._run(*prepared(t), q, k, v, o, lse), tma)
        self.ws, self.launch = prepared(self.tile)
        self.tma = self.ws is not None  # its kernel needs 16-byte aligned bases at every call
        self.final = not _capturing()

    def _outputs(self, q):
        # contiguous whatever q's strides; 1.9 us of host time on the H200, where new_empty took 3.3
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        return o, q.new_empty(self.shape[:3], dtype=torch.float32) if self.store_lse else o  # o: never written

    def _run(self, ws: Prepared | None, launch: Prepared | None, q, k, v, o, lse) -> None:
        if ws is None:
            launch(q, k, v, o, lse, lse)  # part_ptr: never read
            return
        _ensure_allocator()
        lse4 = q.new_empty((*self.shape[:3], 4), dtype=torch.float32) if self.store_lse or launch is not None else o
        ws(q, k, v, o, lse4)
        if launch is not None:  # causal: the tiles at the diagonal, from the partial output in o and lse4
            launch(q, k, v, o, lse, lse4)
        elif self.store_lse:
            lse.copy_(lse4[..., 0])

    def __call__(self, q, k, v):
        o, lse = self._outputs(q)
        self._run(self.ws, self.launch, q, k, v, o, lse)
        return o, lse


class _Backward:
    """The backward of one configuration (the forward's, dO's strides, which backward): the row term
    delta, then a dK/dV and a dQ kernel (two_pass) or one kernel adding dQ (one_pass):
    ``backward(do, q, k, v, o, lse) -> (dq, dk, dv)``."""

    def __init__(self, do, q, k, v, o, lse, causal: bool, sm_scale: float, kind: str, ws: bool = False,
                 deterministic: bool = False):
        batch, heads, seq_q, head_dim = q.shape
        seq_k, block_d = k.shape[2], bucket(head_dim)
        self.delta = _prepare(_bwd_delta_kernel, _cdiv(seq_q, 64) * batch * heads, (*o.stride(), *do.stride(), heads, seq_q),
                              dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=64))
        numbers = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), heads, seq_q, seq_k, sm_scale, sm_scale * LOG2E)
        # the causal kernels' longest-first groups (lpt_group): dK/dV streams Q and dO, dQ streams K and V
        dkdv_numbers = (*numbers, lpt_group(batch * heads, seq_q, head_dim, q.element_size()))
        dq_numbers = (*numbers, lpt_group(batch * heads, seq_k, head_dim, q.element_size()))
        consts = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=causal)

        # on Hopper, for inputs TMA can address: the one-pass backward's kernel, and the two-pass backward's
        # warp-specialized dK/dV kernel for '/ws' tiles (a '/ws' tile elsewhere runs its sizes in the pointer kernel)
        self.tma = _tma_ready(q, k, v, do)
        kind = resolve_backward(kind, block_d, seq_q, seq_k, causal, self.tma and _HAS_TMA_REDUCE, deterministic)
        self.kind, self.sm_scale, self.acc_shape = kind, sm_scale, (batch, heads, seq_q, block_d)
        # the '/ws' dQ tiles: offered where the inputs allow TMA (the tuning key, so the same for every length of
        # a bucket); their kernel runs where lse and delta can be addressed by descriptors (_flash_bwd_dq_tma_kernel),
        # elsewhere the first pointer tile (a '/ws' tile's own sizes were never tuned for the pointer kernel)
        ws_dq = ws and self.tma
        dq_tma = ws_dq and seq_q % 4 == 0 and batch * heads * seq_q < 2**31 and lse.data_ptr() % 16 == 0
        ws = ws and self.tma

        def dkdv(tile: Tile, add_dq: bool) -> Callable[..., None]:
            programs = _cdiv(seq_k, tile.block_n) * batch * heads
            if (add_dq and self.tma and _HAS_TMA_REDUCE) or (tile.ws and ws):
                split = causal and not add_dq and not tile.masked
                tma_part = _prepare(_flash_bwd_tma_kernel, programs, dkdv_numbers,
                                    {**consts, "EVEN_Q": seq_q % tile.block_m == 0, "ADD_DQ": add_dq,
                                     "WS": tile.ws and not add_dq, "PARTIAL": split,
                                     "LONGEST_FIRST": BWD_LONGEST_FIRST}, tile)
                if not split:
                    return tma_part
                diagonal = _prepare(_flash_bwd_dkdv_kernel, programs, dkdv_numbers,
                                    {**consts, "ADD_DQ": False, "DIAGONAL": True, "LONGEST_FIRST": BWD_LONGEST_FIRST},
                                    Tile(tile.block_m, tile.block_n, *DIAGONAL_DKDV))

                def both(q, k, v, do, lse, delta, dk, dv, _):  # the TMA kernel goes on from the diagonal's sums
                    part = q.new_empty((batch * heads * seq_k, 2 * block_d), dtype=torch.float32)
                    diagonal(q, k, v, do, lse, delta, dk, dv, part)
                    tma_part(q, k, v, do, lse, delta, dk, dv, part)
                return both
            return _prepare(_flash_bwd_dkdv_kernel, programs, dkdv_numbers,
                            {**consts, "ADD_DQ": add_dq, "DIAGONAL": False, "LONGEST_FIRST": BWD_LONGEST_FIRST}, tile)

        def dq_of(tile: Tile) -> Prepared:
            if tile.ws and dq_tma:
                return _prepare(_flash_bwd_dq_tma_kernel, _cdiv(seq_q, tile.block_m) * batch * heads, dq_numbers,
                                dict(HEAD_DIM=head_dim, BLOCK_D=block_d, EVEN_K=seq_k % tile.block_n == 0, CAUSAL=causal,
                                     LONGEST_FIRST=BWD_LONGEST_FIRST), tile)
            if tile.ws:
                tile = _candidates("bwd_dq", block_d, q.dtype, False)[0]
            programs = _cdiv(seq_q, tile.block_m) * batch * heads
            return _prepare(_flash_bwd_dq_kernel, programs, dq_numbers, {**consts, "LONGEST_FIRST": BWD_LONGEST_FIRST},
                            tile)

        delta, dq, dk, dv = self._outputs(q, k, v, lse)  # for tuning, which runs on these tensors
        self.delta(o, do, delta)
        if self.tma:
            _ensure_allocator()
        if kind == "one_pass":
            dq_acc = self._accumulator(q)

            def run(tile: Tile):
                dq_acc.zero_()  # in the timed call too: tuning runs it more than once
                dkdv(tile, True)(q, k, v, do, lse, delta, dk, dv, dq_acc)

            tma = self.tma and _HAS_TMA_REDUCE
            self.tiles = {"bwd_one_pass": _tile("bwd_one_pass", q, seq_q, seq_k, block_d, causal, run, tma)}
            self.dkdv = dkdv(self.tiles["bwd_one_pass"], True)
        else:
            self.tiles = {
                "bwd_dkdv": _tile("bwd_dkdv", q, seq_q, seq_k, block_d, causal,
                                  lambda t: dkdv(t, False)(q, k, v, do, lse, delta, dk, dv, dk), ws),
                "bwd_dq": _tile("bwd_dq", q, seq_q, seq_k, block_d, causal,
                                lambda t: dq_of(t)(q, k, v, do, lse, delta, dq), ws_dq)}
            self.dkdv, self.dq = dkdv(self.tiles["bwd_dkdv"], False), dq_of(self.tiles["bwd_dq"])
        self.final = not _capturing()

    @staticmethod
    def _outputs(q, k, v, lse):
        # dk/dv take the strides of k/v and dq those of q (the kernels index them so); delta is lse's layout
        delta = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)
        dq, dk, dv = (torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))
        return delta, dq, dk, dv

    def _accumulator(self, q):
        return torch.zeros(self.acc_shape, dtype=torch.float32, device=q.device)

    def __call__(self, do, q, k, v, o, lse):
        delta, dq, dk, dv = self._outputs(q, k, v, lse)
        self.delta(o, do, delta)
        if self.tma:
            _ensure_allocator()
        if self.kind == "one_pass":
            dq_acc = self._accumulator(q)
            self.dkdv(q, k, v, do, lse, delta, dk, dv, dq_acc)
            torch.mul(dq_acc[..., :q.shape[-1]], self.sm_scale, out=dq)  # scaled and cast in one pass
        else:
            self.dkdv(q, k, v, do, lse, delta, dk, dv, dk)
            self.dq(q, k, v, do, lse, delta, dq)
        return dq, dk, dv


def _scale(head_dim: int, sm_scale) -> float:
    """The softmax scale: sm_scale, or 1/sqrt(head_dim) by default."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


class _Plan:
    """What calls of one shape (shapes, strides, dtypes, devices, causal, sm_scale as given) share, made
    as they first need it: a forward per (``store_lse``, warp_specialized()), a backward per (dO's and O's
    strides, backward kind, warp_specialized(), torch's deterministic mode and its warn_only). Holds no tensor."""

    def __init__(self, head_dim: int, causal: bool, sm_scale: float | None):
        self.causal = causal
        self.sm_scale = _scale(head_dim, sm_scale)
        self.forwards: dict[tuple, _Forward] = {}
        self.backwards: dict[tuple, _Backward] = {}

    def forward(self, q, k, v, store_lse: bool = True):
        key = (store_lse, warp_specialized())
        f = self.forwards.get(key)
        if f is None or (f.tma and not _aligned((q, k, v))):  # the TMA kernel needs 16-byte aligned bases
            f = _Forward(q, k, v, self.causal, self.sm_scale, *key)
            if f.final and _aligned((q, k, v)):  # a misaligned first call would deny later ones the TMA kernel
                self.forwards[key] = f
        _last["fwd"] = f.tile
        return f(q, k, v)

    def backward(self, do, q, k, v, o, lse):
        if not _checks.rows_fit_int32(do):  # as for q, k and v in flash_attention()
            do = do.contiguous()
        key = (do.stride(), o.stride(), backward_kind(), warp_specialized(), torch.are_deterministic_algorithms_enabled(),
               torch.is_deterministic_algorithms_warn_only_enabled())  # a warn_only plan must not serve strict mode
        b = self.backwards.get(key)
        if b is None or (b.tma and not _aligned((q, k, v, do, lse))):  # as in forward(): TMA needs aligned bases
            b = _Backward(do, q, k, v, o, lse, self.causal, self.sm_scale, *key[2:5])
            if b.final and _aligned((q, k, v, do, lse)):
                self.backwards[key] = b
        for kind in BACKWARD_KERNELS:  # tiles_in_use() names this backward's kernels only
            _last.pop(kind, None)
        _last.update(b.tiles)
        return b(do, q, k, v, o, lse)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_plans: dict = {}  # call key -> _Plan
_plans_generation = [_flash_tiles.generation]  # pin() and forget() change tiles: plans made before are dropped
MAX_PLANS = 1024  # past this many call shapes the plans start afresh: a process meeting ever new shapes stays bounded


def _key(q, k, v, causal, sm_scale):
    """What decides a call's checks and launches, or None for arguments not of the plain kinds (they are
    checked, and planned, at every call)."""
    if (type(q) in _PLAIN and type(k) in _PLAIN and type(v) in _PLAIN and type(causal) is bool
            and (sm_scale is None or type(sm_scale) is float) and not (q.is_neg() or k.is_neg() or v.is_neg())):
        try:
            return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
                    v.shape, v.stride(), v.dtype, v.device, causal, sm_scale)
        except RuntimeError:  # a nested tensor has no sizes
            pass
    return None


def _known(key) -> _Plan | None:
    """The plan an earlier call with this key made since the last pin() or forget(), if any."""
    if _plans_generation[0] != _flash_tiles.generation:
        _plans.clear()
        _plans_generation[0] = _flash_tiles.generation
    return _plans.get(key)


def _plan(q, k, v, causal: bool, sm_scale: float | None) -> _Plan:
    """The plan for these checked arguments, made if it is the first call of their shape."""
    key = _key(q, k, v, causal, sm_scale)
    plan = _known(key)
    if plan is None:
        plan = _Plan(q.shape[-1], causal, sm_scale)
        if key is not None:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan


BACKWARD_ENV = "KERNELS_FLASH_BACKWARD"
BACKWARDS = ("auto", "two_pass", "one_pass")
BACKWARD_KERNELS = ("bwd_dkdv", "bwd_dq", "bwd_one_pass")
# Where 'auto' takes the one-pass backward: Hopper's TMA kernel for it, head-dim blocks in ONE_PASS_HEAD_DIMS,
# query and key lengths both in a bucket of at least ONE_PASS_MIN_BUCKET (tiles are tuned per bucket, so the
# choice must be the same across one), no causal mask; there it beat the two-pass backward (tune_flash.py, tenth
# round), elsewhere lost (-3% at 1024 keys on an H100). It was measured at equal lengths only: fewer queries
# than that leave many key blocks adding into the same few dQ tiles, so those stay two_pass.
ONE_PASS_HEAD_DIMS = (64,)
ONE_PASS_MIN_BUCKET = 4096
WS_ENV = "KERNELS_FLASH_WS"


def warp_specialized() -> bool:
    """May the warp-specialized Hopper kernels (the '/ws' tiles of fwd, bwd_dkdv and bwd_dq) run? Yes unless
    ``KERNELS_FLASH_WS=0`` (read at each call; default 1). Triton 3.6 compiles them with barriers it
    initializes and never uses, in shared memory its TMA copies then fill; on the H200 that made them return
    NaN in some heads of a call whenever another process's kernels shared the GPU (contexts time-sliced),
    until they were compiled without those barriers (kernels/_dead_barriers.py; the counts in
    workflow/scripts/ws_time_slicing.py). So they also stay off where that edit cannot be made
    (_dead_barriers.applies()). ``KERNELS_FLASH_WS=0`` runs the pointer kernels instead."""
    return _checks.switch(WS_ENV) and _dead_barriers.applies()


def backward_kind() -> str:
    """Which backward is asked for (``KERNELS_FLASH_BACKWARD``, read at each call): 'two_pass' (deterministic:
    a dK/dV kernel and a dQ kernel, each owning what it writes), 'one_pass' (one kernel adds dQ, by TMA
    reduce-adds of whole tiles on Hopper (_flash_bwd_tma_kernel) or fp32 atomics elsewhere: two fewer
    matmuls per tile pair, bits that vary from run to run) or 'auto' (the default: resolve_backward)."""
    kind = os.environ.get(BACKWARD_ENV, "auto")
    if kind not in BACKWARDS:
        raise ValueError(f"{BACKWARD_ENV} must be one of {', '.join(BACKWARDS)}, got {kind!r}")
    return kind


def resolve_backward(kind: str, block_d: int, seq_q: int, seq_k: int, causal: bool, tma_reduce: bool,
                     deterministic: bool) -> str:
    """The backward that runs. 'auto' is 'one_pass' where it was measured faster (ONE_PASS_HEAD_DIMS,
    ONE_PASS_MIN_BUCKET, no causal mask, its TMA kernel: ``tma_reduce``) unless torch's deterministic mode is on
    (torch.use_deterministic_algorithms), else 'two_pass'. An explicit 'one_pass' in deterministic mode
    raises RuntimeError (a warning under warn_only), as torch's own nondeterministic operations do."""
    if kind == "auto":
        long = bucket(min(seq_q, seq_k)) >= ONE_PASS_MIN_BUCKET
        fast = block_d in ONE_PASS_HEAD_DIMS and long and not causal and tma_reduce
        return "one_pass" if fast and not deterministic else "two_pass"
    if kind == "one_pass" and deterministic:
        message = (f"flash_attention's one-pass backward ({BACKWARD_ENV}=one_pass) adds dQ with atomics and is "
                   "not deterministic, but torch.use_deterministic_algorithms(True) is set: unset "
                   f"{BACKWARD_ENV} (or set it to two_pass) for the deterministic backward")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise RuntimeError(message)
        warnings.warn(message, UserWarning)
    return kind


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan):
        o, lse = plan.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan = plan
        return o

    @staticmethod
    def backward(ctx, do):
        _checks.no_double_backward("flash_attention")
        q, k, v, o, lse = ctx.saved_tensors
        return (*ctx.plan.backward(do, q, k, v, o, lse), None)


# The same computation as custom ops, for torch.compile: the compiler sees an opaque call with known
# output shapes (the fake kernels below) and a registered backward, instead of tracing into Triton code.
@torch.library.custom_op("kernels::flash_attention_forward", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, bool causal, float sm_scale) -> (Tensor, Tensor)")
def _forward_op(q, k, v, causal, sm_scale):
    return _plan(q, k, v, causal, sm_scale).forward(q, k, v)


@_forward_op.register_fake
def _(q, k, v, causal, sm_scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("kernels::flash_attention_backward", mutates_args=(), schema=(
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, float sm_scale) "
    "-> (Tensor, Tensor, Tensor)"))
def _backward_op(do, q, k, v, o, lse, causal, sm_scale):
    return _plan(q, k, v, causal, sm_scale).backward(do, q, k, v, o, lse)


@_backward_op.register_fake
def _(do, q, k, v, o, lse, causal, sm_scale):
    return tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.causal, ctx.sm_scale = causal, sm_scale


def _backward_of_op(ctx, do, _dlse):
    _checks.no_double_backward("flash_attention")
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _backward_op(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


_forward_op.register_autograd(_backward_of_op, setup_context=_setup_context)


def _check(q, k, v, sm_scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(t, name, ndim=4)
    _checks.same("k", k, "v", v)
    _checks.same("q", q, "k", k, shape=False)
    (b, h, sq, d), (bk, hk, sk, dk) = q.shape, k.shape
    if (b, h, d) != (bk, hk, dk):
        raise ValueError(f"q {tuple(q.shape)} and k/v {tuple(k.shape)} must agree on batch, heads and head_dim")
    if not HEAD_DIMS[0] <= d <= HEAD_DIMS[1]:
        raise ValueError(f"head_dim must be in [{HEAD_DIMS[0]}, {HEAD_DIMS[1]}], got {d}")
    if max(sq, sk) * d > 2**31:  # a head's rows, even dense, would leave the kernels' int32 offsets
        raise ValueError(f"seq * head_dim must be <= 2^31 per head, got seq_q={sq}, seq_k={sk}, head_dim={d}")
    # the kernels take sm_scale and sm_scale * log2(e) as fp32: both normal numbers (a scale that rounds to 0
    # or inf there would turn the masked scores' -inf into NaN)
    if sm_scale is not None and not (FP32_NORMAL <= _checks.real(sm_scale, "sm_scale") <= FP32_MAX / LOG2E):
        raise ValueError(f"sm_scale must be a positive finite number within fp32's normal range "
                         f"[{FP32_NORMAL:.4g}, {FP32_MAX / LOG2E:.4g}], got {sm_scale!r}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """softmax(sm_scale * q k^T [+ causal mask]) v for (batch, heads, seq, head_dim) tensors.

    Differentiable once: the backward runs in Triton from the stored log-sum-exp; double backward
    (create_graph=True) raises RuntimeError rather than return gradients without a graph. Works inside
    torch.compile (fullgraph too) and CUDA graph capture. sm_scale, a positive number within fp32's normal
    range, defaults to 1/sqrt(head_dim); see the module docstring for the causal convention. Tiles are chosen per shape bucket
    (kernels/_flash_tiles.py):
    ``flash_attention.tune(q, k, v, causal)`` tunes ahead of time, ``flash_attention.pin(fwd="128x64/w8/s3")``
    fixes a tile. On Hopper, warp-specialized kernels are among the tiles unless ``KERNELS_FLASH_WS=0``
    (warp_specialized()).
    """
    # A call shaped like an earlier one (same shapes, strides, dtypes, devices, causal and sm_scale) passed
    # the same checks then: its plan is all it needs.
    plan = None if torch.compiler.is_compiling() else _known(_key(q, k, v, causal, sm_scale))
    if plan is None:
        _check(q, k, v, sm_scale)
        causal = _checks.flag(causal, "causal")
        sm_scale = None if sm_scale is None else float(sm_scale)
        # The backward writes each gradient with its input's strides: an input whose elements share memory
        # (stride 0, e.g. K/V expanded across heads; an unfold's overlapping windows) would have them write
        # into one place, and one whose rows lie 2^31 elements apart or more (a long (B, S, H, D) tensor's
        # transpose(1, 2)) would leave the kernels' int32 row offsets. A dense copy instead; autograd sums
        # its gradient back through the view.
        q, k, v = (t.contiguous() if _checks.overlaps_itself(t) or not _checks.rows_fit_int32(t) else t
                   for t in (q, k, v))
        if not (q.shape[2] and k.shape[2]):  # no query, or no key to see (every row 0, as in SDPA): nothing to tile
            return flash_attention_ref(q, k, v, causal, sm_scale, dtype=q.dtype)
        if torch.compiler.is_compiling():
            return _forward_op(q, k, v, causal, _scale(q.shape[-1], sm_scale))[0]
        plan = _plan(q, k, v, causal, sm_scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FlashAttention.apply(q, k, v, plan)
    return plan.forward(q, k, v, store_lse=False)[0]  # no gradient wanted: no autograd, no lse


def tune(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, backward: bool = True) -> dict[str, str]:
    """Choose the tiles for the bucket of these shapes now (tuning if no process has yet), outside any
    training step or CUDA graph capture; the choice is cached in memory and in ``KERNELS_TILE_CACHE``.
    Returns the tile of each kernel that ran, as tiles_in_use() gives it."""
    _check(q, k, v, None)
    backward = _checks.flag(backward, "backward")
    q, k, v = (t.detach().requires_grad_(backward) for t in (q, k, v))
    with torch.enable_grad():
        out = flash_attention(q, k, v, causal=causal)
        if backward:
            out.backward(torch.ones_like(out))
    ran = ("fwd", *BACKWARD_KERNELS) if backward else ("fwd",)
    return {kind: tile for kind, tile in tiles_in_use().items() if kind in ran and tile}


def pin(**tiles: str | None) -> None:
    """Run the named kernels (fwd, bwd_dkdv, bwd_dq, bwd_one_pass) with these tiles ('128x64/w8/s3': BLOCK_M x BLOCK_N
    / warps / stages, '/ws' for a warp-specialized TMA kernel: fwd, bwd_dkdv, bwd_dq, run as such where the inputs
    allow it and KERNELS_FLASH_WS is not 0, elsewhere its sizes in the pointer kernel, for bwd_dq the first
    pointer candidate; '/ws/masked' for fwd and bwd_dkdv: under a causal mask the TMA kernel takes the diagonal
    too, in one launch) in every bucket, never tuning them; None unpins one, ``pin()`` unpins all."""
    for kind, text in tiles.items():
        if not isinstance(text, str):
            continue
        if kind not in WS_HEAD_DIMS and "/ws" in text:
            raise ValueError(f"{kind}: only {', '.join(WS_HEAD_DIMS)} have warp-specialized kernels, got {text!r}")
        if kind not in MASKED_KINDS and text.endswith("/masked"):
            raise ValueError(f"{kind}: only {', '.join(MASKED_KINDS)} have a '/ws/masked' form, got {text!r}")
    _flash_tiles.pin(tuple(CANDIDATES), **tiles)


flash_attention.tune = tune
flash_attention.pin = pin


def causal_mask(seq_q: int, seq_k: int, device=None) -> torch.Tensor:
    """Bottom-right aligned causal mask: True where query i may see key j."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    return j <= i + (seq_k - seq_q)


def flash_attention_ref(q, k, v, causal: bool = False, sm_scale: float | None = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Plain attention in ``dtype`` (fp32 by default) with the same conventions as flash_attention: rows
    that see no key (causal, seq_q > seq_k) or whose every score is -inf are zero, as in SDPA; NaN and
    inf elsewhere in the inputs propagate as in SDPA."""
    sm_scale = _scale(q.shape[-1], sm_scale)
    s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * sm_scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    # a row of -inf alone: softmax would be NaN, and its backward NaN too; such a row is 0, its gradient 0
    empty = (s == float("-inf")).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return p @ v.to(dtype)
