"""Kernel 3 of the writeup, row-wise softmax, then a softmax for any row width at memory speed.

``softmax_writeup(x, block_size)`` is the writeup's kernel as written: one program per row, one block.
With ``block_size=1024`` it is the writeup's bug on purpose: the block covers columns [0, 1024) only, and
the mask checks ``col < n_cols`` but never ``n_cols <= BLOCK_SIZE``, so wider rows are normalised over
their first 1024 columns and the rest of the output is never written. No error, no warning.
``block_size=None`` is the one-line fix (the block sized to the row). ``softmax(x, block_size=1024)``
still runs the writeup's kernel, so the bug stays reachable under its old name.

``softmax(x)`` is the improved kernel, one of three paths by row width and dtype (``launch_settings``), with a
backward for autograd:

- rows that fit on chip: a [BLOCK_M, BLOCK_N] tile holds several narrow rows (one row alone is too little
  work for a program) or one medium row; one read, one write (the backward, at some widths, reads y and dy
  a second time from L2 rather than hold them across the row sum: BACKWARD_ROWS). Where one row fills a
  program's registers (bf16 rows past PREFETCH_FROM columns, forward), a program per SM walks the rows and
  loads the next while it computes this one.
- wider rows: a row is split into chunks, one per program, and a group of programs shares the row (and
  then the group's next rows). Each program keeps its chunk in registers, publishes the chunk's max and
  sum of exp, counts itself in at the row's counter, waits until the whole group has, combines the
  partials and writes its chunk (the forward keeps its chunk's exp(x - chunk max) from the partial sum and
  rescales it: one exp per element; 16-bit rows held packed, two to a 32-bit word, take two): still one read
  and one write. The wait needs every program of a group
  resident at once, so the grid never exceeds what fits on the GPU at a time (read from the compiled
  kernel). Triton's interpreter runs programs one after another, where the wait would never end, so
  there (and on a GPU too small for one row's group) the same kernel runs in two launches, partials
  first, and the second reads x again; a row of one chunk, whose program waits for itself, keeps one.
- wider rows, two-pass: a program walks its row, or its segment of a row, twice in chunks: the max and the
  sum of exp first, then the output. The first walk asks L2 to keep the lines, so that while the segments
  of the resident programs fit there the second read comes from L2 and memory still sees one read and one
  write. Segments of one row meet at the row's counter between the walks, as on the split path. Rows that no
  16-byte vector divides (UNALIGNED), which Triton would load a column at a time, are walked from each row's
  16-byte boundary in whole vectors instead (ALIGN), at the widths where that is faster.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from . import _checks, backend
from ._device import sm_count
from ._launch import serialized
from ._triton import tl, triton

__all__ = ["softmax", "softmax_backward", "softmax_ref", "softmax_naive", "softmax_unfused", "softmax_writeup"]

BUGGY_BLOCK_SIZE = 1024  # the writeup's hard-coded value

# Sizes chosen on an H200 (workflow/scripts/tune_softmax.py, and the benches its docstring records; bf16 and
# fp32, rows of 128..2^20 columns; fractions of a device copy), some of the WIDE table's on an H100 (so marked).
# The rows path. Forward: a tile of TILE_BYTES of input per program for narrow rows (one row at least), one row
# per program up to ROW_LIMIT columns (next power of two); 4 warps up to SMALL_TILE elements per program, else 16
# (bf16 rows of 4096 columns: 0.97 with 4 warps, 0.81 with 16). 16-bit rows end the rows path at PREFETCH_FROM
# columns (fp16 at 32768: two-pass 0.89, a program per row 0.80), but for bf16: one such row fills a program's
# registers alone, so an SM holds one and idles between its loads; there the programs stay resident, one per
# SM, each loading its next row while it computes this one, with PREFETCH_WARPS warps (bf16 at 32768 columns
# 0.90; a program per row 0.79-0.80, the two-pass path 0.86-0.89; 16 warps 0.85-0.90; two programs per SM no
# faster; fp16 0.70-0.74, its conversions costlier than bf16's; fp32 at 16384-32768 columns 0.68-0.91
# against 0.95-0.97 without).
TILE_BYTES, ROW_LIMIT, SMALL_TILE = 4096, 32768, 4096
PREFETCH_FROM, PREFETCH_WARPS = 16384, 32
# Backward (two tensors in, one out): tiles of BACKWARD_TILE elements of each up to BACKWARD_ROW_LIMIT columns.
# BACKWARD_ROWS: (widest row in columns, (warps, reload) for fp32, the same for 16-bit), the first that fits.
# Reload reads y and dy again after their row sum (from L2) instead of holding them: 1.02-1.04 of copy against
# 1.01-1.02 at 2048-4096 columns, 1.03 against 0.97 for bf16 at 16384, 0.99-1.00 against 0.95-0.98 at 32768
# with 32 warps; holding is ahead at 8192 (1.01-1.02 against 1.00) and level for fp32 at 16384.
BACKWARD_TILE, BACKWARD_ROW_LIMIT = 4096, 32768
BACKWARD_ROWS = (
    (1024, (16, False), (16, False)),
    (4096, (16, True), (16, True)),
    (8192, (16, False), (16, False)),
    (16384, (16, False), (16, True)),
    (32768, (32, True), (32, True)),
)
KiB = 1024
# Wider rows: (direction, element size, widest row in bytes or None) -> (segment, chunk, warps[, form]), the
# first entry that matches. Segment 0 is the split path (chunks of `chunk` columns held on chip, one read); a
# segment > 0 is the two-pass path (each `segment` columns of a row walked twice in chunks, the second read
# from L2). The split path's form: "packed" (16-bit chunks held two to a 32-bit word, Settings.packed; the backward
# then runs a row ahead; an entry for rows that pack, others take the next), and for the backward, a row
# at a time (none) or "ahead" (Settings.ahead); the split forward always runs a row ahead.
WIDE = (
    ("forward", 4, 256 * KiB, (65536, 32768, 32)),  # fp32 to 65536 columns: 0.87 (split path 0.77)
    # wider fp32: 0.74-0.77 (two-pass 0.65-0.73); H100, with each chunk's partials taken lane by lane (_publish),
    # 262144 / 524288 / 2^20 columns: 0.92 / 0.92 / 0.90 against 0.92 / 0.90 / 0.88 (two alternated runs each)
    ("forward", 4, None, (0, 4096, 4)),
    # 16-bit, two-pass, one segment a row; H100 (bf16, _two_pass_forward's first walk per thread), chunks of
    # 16384 x 16 warps against 32768 x 32: 0.97 / 0.98 / 0.97 / 0.93 against 0.66 / 0.77 / 0.81 / 0.91 at 36864 /
    # 45056 / 49152 / 57344 columns (a chunk mostly masked still costs its exps), 0.90 / 0.79 / 0.76 / 0.72 against
    # 0.96 / 0.89 / 0.96 / 0.90 at 65536 / 81920 / 98304 / 131072. Before the first walk took partials per thread,
    # the H200 chose 16384 x 16 to 65536 columns (0.82-0.87; 32768 x 32 0.68-0.79)
    ("forward", 2, 112 * KiB, (131072, 16384, 16)),
    ("forward", 2, 256 * KiB, (131072, 32768, 32)),
    # wider bf16, H100, packed (two exps per element, the output rounded by the GPU's cvt), 262144 / 524288 /
    # 2^20 columns: 0.84 / 0.81 / 0.77 against 0.75 / 0.74 / 0.70 two-pass (segments of 65536 x 32768 x 32),
    # 0.67 / 0.68 / 0.68 with segments of 131072, the split path unpacked 0.69-0.75; then with each chunk's
    # partials taken lane by lane (_publish) 0.86 / 0.81 / 0.81 against 0.83 / 0.80 / 0.80 (bench_softmax_ahead.py).
    # fp16 packed likewise, H100: 0.85 / 0.82 / 0.81 against 0.76 / 0.75 / 0.71 two-pass (the entry below); at
    # 65536 / 131072 columns 0.88 / 0.88 against the entries above, 0.94 / 0.89
    ("forward", 2, None, (0, 8192, 4, "packed")),
    # 16-bit rows that do not pack: two-pass, 0.76 / 0.74 / 0.70 (fp16, H100) against 0.72 / 0.69 / 0.68
    # for the split forward of 8192 x 4 warps (4096 x 4 0.68-0.70, 8192 x 8 0.69-0.74)
    ("forward", 2, None, (65536, 32768, 32)),
    # fp32, H100, a row ahead, 65536 / 262144 / 524288 / 2^20 columns: 0.99 / 0.99 / 0.96 / 0.94 (chunks of
    # 2048 x 4 warps 0.98 / 0.98 / 0.97 / 0.94; 8192 x 8 0.96 / 0.96 / 0.92 / 0.87); a row at a time, 4096 x 4
    # to 131072 columns then 8192 x 4: 0.98 / 0.96 / 0.86 / 0.78
    ("backward", 4, None, (0, 4096, 8, "ahead")),
    ("backward", 2, 128 * KiB, (65536, 16384, 32)),  # bf16 to 65536 columns: 0.88 (split path 0.57-0.80)
    # wider bf16, H100, packed a row ahead (dx rounded by the GPU's cvt), 131072 / 262144 / 524288 / 2^20
    # columns: 0.98 / 0.98 / 0.98 / 0.94 against 0.91 / 0.91 / 0.89 / 0.86 with dx rounded by integer arithmetic,
    # and 0.92 / 0.90 a row at a time (8192 x 4, to 262144 columns); a row ahead but not packed, 0.67-0.75: a bf16
    # value then takes about an fp32's registers, so that a program of the same occupancy keeps half the bytes
    # in flight (workflow/scripts/bench_softmax_ahead.py). fp16 packed likewise, H100, 131072 / 262144 / 524288 /
    # 2^20: 0.98 / 0.98 / 0.98 / 0.92 against 0.94 / 0.90 / 0.82 / 0.70 a row at a time (the entry below)
    ("backward", 2, None, (0, 8192, 4, "packed")),
    ("backward", 2, None, (0, 8192, 4)),  # 16-bit rows that do not pack: a row at a time (see above)
)

# Rows that no 16-byte vector divides (1001 or 50257 columns: a unit below a vector, _unit) load a column at a
# time wherever Triton cannot see them aligned. Where x and the output (y, dy and dx) meet 16-byte boundaries
# at the same columns (_alike), such rows take the two-pass path walked from those boundaries in whole vectors
# (ALIGN): (direction, element size, widest row in columns or None, (segment, chunk, warps[, "plain"]) or None),
# the first entry that matches; None keeps the aligned rows' defaults, segment None is one segment a row, "plain"
# the two-pass path walked as Triton sees the rows (a column at a time, no ALIGN). Chosen on H100 80GB HBM3s
# (workflow/scripts/bench_softmax_unaligned.py; fractions of copy, the entry's sizes against the defaults, at rows
# of 1001 .. 1000003 columns):
UNALIGNED = (
    ("forward", 4, 16384, None),  # the rows path: 0.98-1.01 at 1001-16001 columns
    # 0.97 / 0.98 / 0.96 against 0.86 / 0.95 (the rows path) / 0.76 (the split path, before this entry) at 24001 /
    # 32001 / 50257 (16001: 0.79 against 0.98)
    ("forward", 4, 65536, (None, 32768, 32)),
    # the split path, 0.81 / 0.64 / 0.65 at 100003 / 151937 / 1000003 (ALIGN 0.68 / 0.63 / 0.64)
    ("forward", 4, None, None),
    ("forward", 2, 16384, None),  # the rows path: 0.98 / 0.87 / 0.87 at 4001 / 8001 / 16001
    ("forward", 2, 65536, (None, 8192, 8)),  # 0.86 / 0.72 against 0.50 / 0.55 at 32001 / 50257
    # 0.79 / 0.76 / 0.49 against 0.59 / 0.23 / 0.29 at 100003 / 151937 / 1000003
    ("forward", 2, None, (None, 32768, 32)),
    # fp32 backward: where the defaults are the rows path with one row a program that reads y and dy twice
    # (BACKWARD_ROWS' reload, 2049-4096 and 16385-32768 columns), the plain two-pass path instead (ALIGN there at
    # best 0.71 / 0.73 / 0.83 / 0.82); elsewhere the defaults (the rows path 0.98-1.03 at 1001 / 2001 / 6001-16001
    # columns, where the plain two-pass made 0.47-1.02; the split path 0.55-0.66 from 50257 up, others within 0.04)
    ("backward", 4, 2048, None),
    ("backward", 4, 4096, (None, 4096, 8, "plain")),  # 0.97 / 1.04 against 0.69 / 0.71 at 3001 / 4001
    ("backward", 4, 16384, None),
    ("backward", 4, 32768, (None, 16384, 32, "plain")),  # 0.97 / 0.92-0.93 against 0.74 / 0.75 at 24001 / 32001
    ("backward", 4, None, None),
    ("backward", 2, 2048, None),  # the rows path (0.92 at 1001)
    # 0.94 / 1.00 / 0.97 against 0.48 / 0.92 / 0.62 at 4001 / 8001 / 16001, and 0.92 / 0.83 against 0.63 / 0.75
    # with the next entry's sizes at 20001 / 24001 (where those win from 26001 up: 0.79-0.83 against 0.78-0.71)
    ("backward", 2, 24576, (None, 4096, 8)),
    ("backward", 2, 65536, (None, 16384, 32)),  # 0.83 / 0.77 against 0.59 / 0.73 at 32001 / 50257
    # 0.69 / 0.70 / 0.71 against 0.34 / 0.30 / 0.36 at 100003 / 151937 / 1000003
    ("backward", 2, None, (65536, 16384, 32)),
)


# ---------------------------------------------------------------------------------------------------------
# The writeup's kernel, as written
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


def _writeup_warps(block_size: int) -> int:
    # More warps for wider rows so each thread keeps a handful of elements in registers.
    return 4 if block_size <= 2048 else 8 if block_size <= 8192 else 16


@torch.compiler.disable  # Dynamo cannot trace Triton's launcher: no custom op for this one
@serialized
def softmax_writeup(x: torch.Tensor, block_size: int | None = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """The writeup's kernel: one program per row, one block of ``block_size`` columns.

    block_size=None sizes the block to the row (the fix); an explicit block_size is used as is, so
    block_size=1024 silently drops every column past 1024 (the writeup's bug). ``out`` (optional, any
    layout) receives the result; columns the kernel never writes keep their old content. Not differentiable: an
    x that requires grad is refused (RuntimeError).
    Inside torch.compile it runs eagerly (a graph break, so fullgraph=True refuses it).
    """
    _checks.tensor(x, "x", ndim=2)
    _checks.forward_only("softmax_writeup (and softmax with a block_size)", x=x)
    n_rows, n_cols = x.shape
    block_size = triton.next_power_of_2(n_cols) if block_size is None else _checks.block_size(block_size)
    out = _out(x, out)  # checked against x as given, before any copy
    if x.stride(1) != 1:
        x = x.contiguous()
    # the kernel takes a row stride only: an out of other columns gets the result through a dense copy of
    # itself, so that the columns the kernel does not write still keep their old content
    dense = out if out.stride(1) == 1 or n_cols == 1 else out.contiguous()
    if n_rows and n_cols:
        _softmax_kernel[(n_rows,)](dense, x, x.stride(0), dense.stride(0), n_cols,
                                   BLOCK_SIZE=block_size, num_warps=_writeup_warps(block_size))
    if dense is not out:
        out.copy_(dense)
    return out


# ---------------------------------------------------------------------------------------------------------
# The improved kernels
LOG2E = tl.constexpr(1.4426950408889634)
_INTERPRETED = tl.constexpr(backend.current() == "interpreter")
# The split kernels' PACKED: 16-bit rows held as 32-bit words of two columns, of bf16 or of fp16 (0: not packed)
BF16_PAIRS, FP16_PAIRS = tl.constexpr(1), tl.constexpr(2)
NEG_INF_BF16_PAIR, NEG_INF_FP16_PAIR = tl.constexpr(-8323200), tl.constexpr(-67044352)  # 0xFF80FF80, 0xFC00FC00


@triton.jit
def _load_rows(x_ptr, first, n_rows, n_cols, x_row, x_col, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows [first, first + BLOCK_M) as a tile; rows past the end load the last row again (they are not
    stored): no all -inf row, no NaN. A tile wholly past the end (a prefetch past the last) loads nothing."""
    rows = first + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    src = tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None]
    width = tl.where(first < n_rows, n_cols, 0)
    return tl.load(x_ptr + src * x_row + cols[None, :] * x_col, mask=(cols < width)[None, :], other=-float("inf"))


@triton.jit
def _store_softmax(out_ptr, x, first, n_rows, n_cols, out_row, out_col, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    rows = first + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    x = x.to(tl.float32)
    e = tl.exp2((x - tl.max(x, axis=1)[:, None]) * LOG2E)
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    dst = rows.to(tl.int64)[:, None] * out_row + cols[None, :] * out_col
    tl.store(out_ptr + dst, y.to(out_ptr.dtype.element_ty), mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :])


@triton.jit
def _rows_forward(out_ptr, x_ptr, n_rows, n_cols, x_row, x_col, out_row, out_col,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, UNIT: tl.constexpr = 1):
    """A tile of rows per program; PREFETCH: fewer programs, each walking tiles pid, pid + grid, ... and
    loading the next tile before it computes this one, so that its loads overlap its arithmetic. n_cols and
    the row strides come divided by UNIT (_unit)."""
    n_cols, x_row, out_row = n_cols * UNIT, x_row * UNIT, out_row * UNIT
    first = tl.program_id(0) * BLOCK_M
    if PREFETCH:
        step = tl.num_programs(0) * BLOCK_M
        x_next = _load_rows(x_ptr, first, n_rows, n_cols, x_row, x_col, BLOCK_M, BLOCK_N)
        for tile_first in range(first, n_rows, step):
            x = x_next
            x_next = _load_rows(x_ptr, tile_first + step, n_rows, n_cols, x_row, x_col, BLOCK_M, BLOCK_N)
            _store_softmax(out_ptr, x, tile_first, n_rows, n_cols, out_row, out_col, BLOCK_M, BLOCK_N)
    else:
        x = _load_rows(x_ptr, first, n_rows, n_cols, x_row, x_col, BLOCK_M, BLOCK_N)
        _store_softmax(out_ptr, x, first, n_rows, n_cols, out_row, out_col, BLOCK_M, BLOCK_N)


@triton.jit
def _load(ptrs, mask, other, EVEN: tl.constexpr, POLICY: tl.constexpr):
    """A load as fp32, masked unless EVEN (the caller knows every address is in the tensor)."""
    if EVEN:
        return tl.load(ptrs, eviction_policy=POLICY).to(tl.float32)
    return tl.load(ptrs, mask=mask, other=other, eviction_policy=POLICY).to(tl.float32)


@triton.jit
def _store(ptrs, value, mask, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ptrs, value)
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _rows_backward(dx_ptr, y_ptr, dy_ptr, n_rows, n_cols, y_row, y_col, dy_row, dy_col, dx_row, dx_col,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, RELOAD: tl.constexpr,
                   UNIT: tl.constexpr = 1):
    """dx = y * (dy - sum(y * dy)) row by row. EVEN: the tiles cover the rows exactly (no masks). RELOAD: y
    and dy are read again after the sum (from L2, which the first read asks to keep them) instead of being
    held across it: for wide rows, fewer registers per program and so more rows in flight. n_cols and the
    row strides come divided by UNIT (_unit)."""
    n_cols, y_row, dy_row, dx_row = n_cols * UNIT, y_row * UNIT, dy_row * UNIT, dx_row * UNIT
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    src = tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None]
    cmask = (cols < n_cols)[None, :]
    y_ptrs = y_ptr + src * y_row + cols[None, :] * y_col
    dy_ptrs = dy_ptr + src * dy_row + cols[None, :] * dy_col
    y = _load(y_ptrs, cmask, 0.0, EVEN, "evict_last" if RELOAD else "")
    dy = _load(dy_ptrs, cmask, 0.0, EVEN, "evict_last" if RELOAD else "")
    dot = tl.sum(y * dy, axis=1)[:, None]
    if RELOAD:
        y = _load(y_ptrs, cmask, 0.0, EVEN, "evict_first")
        dy = _load(dy_ptrs, cmask, 0.0, EVEN, "evict_first")
    dx = (y * (dy - dot)).to(dx_ptr.dtype.element_ty)
    dst = dx_ptr + rows.to(tl.int64)[:, None] * dx_row + cols[None, :] * dx_col
    _store(dst, dx, (rows < n_rows)[:, None] & cmask, EVEN)


@triton.jit
def _arrive(counter_ptr):
    """Count this program in at its row's counter. The CTA barrier first, so that the release publishes
    every thread's earlier stores (the partials)."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release")


# ns a program sleeps after each poll of a row's counter that finds it short (_wait); 0: polls back to back
WAIT_SLEEP_NS = tl.constexpr(1024)


@triton.jit
def _nanosleep(ns, seen):
    """Sleep about ``ns`` ns (PTX nanosleep); returns ``seen``, a value the next poll depends on, so that the
    sleep stays in place."""
    return tl.inline_asm_elementwise("nanosleep.u32 $2;\n\tmov.u32 $0, $1;", "=r,r,r", [seen, ns], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _wait(counter_ptr, target):
    """Wait until ``target`` programs have arrived at the counter, sleeping WAIT_SLEEP_NS (PTX nanosleep; the
    hardware sleeps up to about twice that) after each poll that finds it short: back-to-back polls, one
    thread's acquiring load each, contend with the rows' own loads. H100, bench_softmax_backoff.py, rows of
    262144 and 2^20 columns: 1024 ns raised the split paths by up to 5 points of copy (fp32 forward at 2^20:
    0.89 to 0.94), 2048 ns about the same, 4096 ns and more lost. This kernel built with 0 and with 1024, one
    process each (H100, 65536 / 262144 / 2^20 columns, fp32 and bf16, both directions): 1024 won or tied at
    every point (within 0.003 where it did not win), most at 2^20 (bf16 backward 0.881 to 0.931, fp32 forward
    0.905 to 0.939). Triton's interpreter never gets here short: its split paths run as two launches that
    never wait."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < target:
        if WAIT_SLEEP_NS > 0:
            seen = _nanosleep(tl.full([], WAIT_SLEEP_NS, tl.int32), seen)
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")


@triton.jit
def _row_mask(cols, n_cols, row, n_rows):
    """cols < n_cols where row exists, else nothing (a scalar & a vector mask breaks Triton's interpreter)."""
    return cols < tl.where(row < n_rows, n_cols, 0)


@triton.jit
def _load_chunk(x_ptr, row, x_row, cols, x_col, n_cols, n_rows, EVEN: tl.constexpr, PACKED: tl.constexpr):
    """A chunk of row ``row`` as fp32 (PACKED: 32-bit words of two columns, as stored), -inf past the row; a row
    past the last (the loop reads ahead) is all -inf, or, EVEN (chunks cover the rows exactly: no mask), the
    last row again, which is never used."""
    if EVEN:
        row = tl.minimum(row, n_rows - 1)
    ptrs = x_ptr + tl.cast(row, tl.int64) * x_row + cols * x_col
    present = _row_mask(cols, n_cols, row, n_rows)
    if not PACKED:
        chunk = _load(ptrs, present, -float("inf"), EVEN, "")
    elif EVEN:
        chunk = tl.load(ptrs)
    elif PACKED == FP16_PAIRS:
        chunk = tl.load(ptrs, mask=present, other=NEG_INF_FP16_PAIR)
    else:
        chunk = tl.load(ptrs, mask=present, other=NEG_INF_BF16_PAIR)
    return chunk  # one return: Triton type-checks each return it meets, past a constexpr branch that returned too


@triton.jit
def _publish(x, part, counter, chunk, SPLITS: tl.constexpr, PHASE: tl.constexpr, PACKED: tl.constexpr,
             LANES: tl.constexpr = 1, KEEP: tl.constexpr = False):
    """Write a chunk's partials, the max m and the sum of e = exp(x - m), and (PHASE 0) count in. Returns
    (e, m): the output is then e * exp(m - row max) / row sum, one exp per element rather than two. PACKED
    returns x as it is (its words hold a chunk in half an fp32 chunk's registers), the output's exps taken
    again from it; PACKED with KEEP returns its exps packed likewise (rounded to the rows' format: the output is
    then within about 1 ulp rather than 0.5; workflow/scripts/bench_softmax_keep.py measures it, not a default).
    The partials are taken per lane first (LANES columns of x: a thread's own where LANES is the
    threads times their 16-byte vectors), so that the exps wait for no block-wide max, then combined in one
    block reduction rather than two; m is then each lane's max."""
    lanes = tl.reshape(x, [x.shape[0] // LANES, LANES])
    if PACKED:
        even, odd = _unpack(lanes, PACKED)
        lane_m = tl.maximum(tl.max(even, axis=0), tl.max(odd, axis=0))
        lane_safe = _finite(lane_m)[None, :]  # a lane of -inf sums to 0, not NaN
        e_even = tl.exp2((even - lane_safe) * LOG2E)
        e_odd = tl.exp2((odd - lane_safe) * LOG2E)
        lane_l = tl.sum(e_even + e_odd, axis=0)
        if KEEP:
            e = tl.reshape(_pack(e_even, e_odd, PACKED), [x.shape[0]])
        else:
            e = x
    else:
        lane_m = tl.max(lanes, axis=0)
        lane_safe = _finite(lane_m)[None, :]
        lane_e = tl.exp2((lanes - lane_safe) * LOG2E)
        lane_l = tl.sum(lane_e, axis=0)
        e = tl.reshape(lane_e, [x.shape[0]])
    m, total = _combined(lane_m, lane_l)
    tl.store(part + chunk, m)
    tl.store(part + SPLITS + chunk, total)
    if PHASE == 0:
        _arrive(counter)
    return e, lane_m  # not lane_safe: a lane of -inf then gets exp(-inf - row max) = 0, not 0 * overflow


@triton.jit
def _finite(m):
    """m as the shift of exp(x - m): 0 where m is -inf, so that exps of -inf give 0 rather than NaN."""
    return tl.where(m == -float("inf"), 0.0, m)


@triton.jit
def _combine_partials(m1, l1, m2, l2):
    """Two (max, sum of exp(x - max)) partials as one (online softmax's combine)."""
    m = tl.maximum(m1, m2)
    m_safe = _finite(m)  # two empty partials: 0, not NaN
    return m, l1 * tl.exp2((m1 - m_safe) * LOG2E) + l2 * tl.exp2((m2 - m_safe) * LOG2E)


@triton.jit
def _combined(ms, ls):
    """Partials (max, sum of exp(x - max)) along axis 0 as one: on the GPU one block reduction of the pairs
    rather than two; Triton's interpreter runs a combine function once per pair in Python (3 rows of 2^20
    fp32 columns took 195 s), so there a max and then a sum, each one array operation."""
    if _INTERPRETED:
        m = tl.max(ms, axis=0)
        total = tl.sum(ls * tl.exp2((ms - _finite(m)) * LOG2E), axis=0)
    else:
        m, total = tl.reduce((ms, ls), 0, _combine_partials)
    return m, total


@triton.jit
def _split_forward(out_ptr, x_ptr, part_ptr, counter_ptr, n_rows, n_cols, x_row, x_col, out_row, out_col,
                   n_groups, CHUNK: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                   PHASE: tl.constexpr, EVEN: tl.constexpr, PACKED: tl.constexpr, LANES: tl.constexpr = 1,
                   UNIT: tl.constexpr = 1, KEEP: tl.constexpr = False):
    """Program (group, chunk) handles columns [chunk * CHUNK, +CHUNK) of rows group, group + n_groups, ...
    PHASE 0: the whole softmax, waiting at each row's counter (GPU); 1: partials only; 2: output from
    partials. The loop runs a row ahead: before it waits for the other programs' partials of a row, it
    publishes its partials of the next row and issues the loads of the one after, so that a wait
    overlaps with work and loads. EVEN: the chunks cover the rows exactly, so no column is masked. PACKED:
    16-bit rows seen as 32-bit words of two columns (n_cols, CHUNK and the strides count words), their
    partials taken over LANES lanes (_publish; KEEP: their exps held, packed, rather than the words as loaded).
    n_cols and the row strides come divided by UNIT (_unit)."""
    n_cols, x_row, out_row = n_cols * UNIT, x_row * UNIT, out_row * UNIT
    pid = tl.program_id(0)
    group = pid // SPLITS  # < n_rows: the launch never has more groups than rows
    chunk = pid % SPLITS
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    splits = tl.arange(0, SPLITS_P2)
    x = _load_chunk(x_ptr, group, x_row, cols, x_col, n_cols, n_rows, EVEN, PACKED)
    m = tl.full([LANES], 0.0, tl.float32)
    if PHASE != 2:  # from here on x holds exp(x - m), m its lanes' maxima (PACKED: x as loaded)
        x, m = _publish(x, part_ptr + tl.cast(group, tl.int64) * (2 * SPLITS), counter_ptr + group, chunk,
                        SPLITS, PHASE, PACKED, LANES, KEEP)
    following = _load_chunk(x_ptr, group + n_groups, x_row, cols, x_col, n_cols, n_rows, EVEN, PACKED)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        m_following = tl.full([LANES], 0.0, tl.float32)
        if PHASE != 2:
            if row + n_groups < n_rows:
                following, m_following = _publish(following, part_ptr + (r + n_groups) * (2 * SPLITS),
                                                   counter_ptr + row + n_groups, chunk, SPLITS, PHASE, PACKED,
                                                   LANES, KEEP)
        after = _load_chunk(x_ptr, row + 2 * n_groups, x_row, cols, x_col, n_cols, n_rows, EVEN, PACKED)
        if PHASE == 0:
            _wait(counter_ptr + row, SPLITS)
        if PHASE != 1:
            part = part_ptr + r * (2 * SPLITS)  # [max of each chunk..., sum of exp of each chunk...]
            ms = tl.load(part + splits, mask=splits < SPLITS, other=-float("inf"), volatile=True)
            ls = tl.load(part + SPLITS + splits, mask=splits < SPLITS, other=0.0, volatile=True)
            row_max, total = _combined(ms, ls)
            if PACKED and KEEP and PHASE != 2:  # x holds the exps (_publish)
                scale = (tl.exp2((m - row_max) * LOG2E) / total)[None, :]  # a lane's
                even, odd = _unpack(tl.reshape(x, [CHUNK // LANES, LANES]), PACKED)
                y = tl.reshape(_pack(even * scale, odd * scale, PACKED), [CHUNK])
            elif PACKED:
                even, odd = _unpack(x, PACKED)
                log2_scale = -tl.log2(total)
                y = _pack(tl.exp2(tl.fma(even - row_max, LOG2E, log2_scale)),
                          tl.exp2(tl.fma(odd - row_max, LOG2E, log2_scale)), PACKED)
            elif PHASE == 2:
                y = (tl.exp2((x - row_max) * LOG2E) * (1.0 / total)).to(out_ptr.dtype.element_ty)
            else:
                scale = tl.exp2((m - row_max) * LOG2E) / total  # a lane's
                y = tl.reshape(tl.reshape(x, [CHUNK // LANES, LANES]) * scale[None, :], [CHUNK])
                y = y.to(out_ptr.dtype.element_ty)
            _store(out_ptr + r * out_row + cols * out_col, y, cols < n_cols, EVEN)
        x = following
        m = m_following
        following = after


@triton.jit
def _load_pair(y_ptr, dy_ptr, row, y_row, y_col, dy_row, dy_col, cols, n_cols, n_rows):
    """Row ``row``'s chunks of y and dy, held in their own dtype (half the registers for bf16) and converted
    at use; zeros past the row, or for a row past the last (the loop reads ahead)."""
    present = _row_mask(cols, n_cols, row, n_rows)
    r = tl.cast(row, tl.int64)
    return (tl.load(y_ptr + r * y_row + cols * y_col, mask=present, other=0),
            tl.load(dy_ptr + r * dy_row + cols * dy_col, mask=present, other=0))


@triton.jit
def _unpack(w, PACKED: tl.constexpr):
    """A 32-bit word's two 16-bit floats as fp32: the low half is the even column (little-endian), the high
    half the odd one. A bf16 is an fp32's upper half (a shift or a mask); an fp16 is converted."""
    if PACKED == FP16_PAIRS:
        even = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)  # the cast keeps the low 16 bits
        odd = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        even = (w << 16).to(tl.float32, bitcast=True)
        odd = (w & -65536).to(tl.float32, bitcast=True)
    return even, odd


@triton.jit
def _bf16_bits(x):
    """x rounded to bf16 (to nearest, ties to even; NaN stays a quiet NaN), its 16 bits in the low half of a
    uint32. Integer arithmetic, which Triton's interpreter runs right (its bf16 conversions it does not)."""
    u = x.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, rounded)


@triton.jit
def _pack(even, odd, PACKED: tl.constexpr):
    """fp32 pairs rounded (to nearest, ties to even) to PACKED's 16-bit format as 32-bit words, even in the
    low half. The GPU's cvt rounds two at once (bf16 backward at 2^20 columns, H100: 0.94 of copy against 0.86
    by integer arithmetic); Triton's interpreter truncates on conversion to bf16, so it takes _bf16_bits there
    (its conversion to fp16, numpy's, rounds right)."""
    if _INTERPRETED:
        if PACKED == FP16_PAIRS:
            low = even.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF  # sign-extended: masked
            high = odd.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) << 16
            return low | high
        return (_bf16_bits(even) | (_bf16_bits(odd) << 16)).to(tl.int32, bitcast=True)
    if PACKED == FP16_PAIRS:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $1, $2;", "=r,r,r", [odd, even], dtype=tl.int32,
                                         is_pure=True, pack=1)
    return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,r,r", [odd, even], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _dot(y, dy, PACKED: tl.constexpr):
    """This chunk's sum(y * dy) in fp32."""
    if PACKED:
        y_even, y_odd = _unpack(y, PACKED)
        dy_even, dy_odd = _unpack(dy, PACKED)
        return tl.sum(y_even * dy_even + y_odd * dy_odd, axis=0)
    return tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=0)


@triton.jit
def _publish_dot(y, dy, part, counter, chunk, PHASE: tl.constexpr, PACKED: tl.constexpr):
    """Write a chunk's partial, its sum(y * dy), and (PHASE 0) count in: _publish's part in the backward."""
    tl.store(part + chunk, _dot(y, dy, PACKED))
    if PHASE == 0:
        _arrive(counter)


@triton.jit
def _dx(y, dy, dot, dx_ptr, PACKED: tl.constexpr):
    """y * (dy - dot) in dx's dtype (PACKED: pairs in 32-bit words, as y and dy are)."""
    if PACKED:
        y_even, y_odd = _unpack(y, PACKED)
        dy_even, dy_odd = _unpack(dy, PACKED)
        return _pack(y_even * (dy_even - dot), y_odd * (dy_odd - dot), PACKED)
    return (y.to(tl.float32) * (dy.to(tl.float32) - dot)).to(dx_ptr.dtype.element_ty)


@triton.jit
def _split_backward(dx_ptr, y_ptr, dy_ptr, part_ptr, counter_ptr, n_rows, n_cols, y_row, y_col, dy_row, dy_col,
                    dx_row, dx_col, n_groups, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                    SPLITS_P2: tl.constexpr, PHASE: tl.constexpr, AHEAD: tl.constexpr, PACKED: tl.constexpr,
                    UNIT: tl.constexpr = 1):
    """_split_forward's layout for dx = y * (dy - sum(y * dy)); the partial is each chunk's sum(y * dy).
    It reads the next row before it waits. AHEAD: it runs a row ahead as _split_forward does, publishing and
    counting in for the next row before it waits for this one, so that the group's other programs have had a
    row's time to arrive; it then holds three rows of two tensors. PACKED: y, dy and dx are 16-bit rows seen as
    32-bit words, two columns each (n_cols, CHUNK and the strides count words), held so and unpacked at use.
    n_cols and the row strides come divided by UNIT (_unit)."""
    n_cols, y_row, dy_row, dx_row = n_cols * UNIT, y_row * UNIT, dy_row * UNIT, dx_row * UNIT
    pid = tl.program_id(0)
    group = pid // SPLITS
    chunk = pid % SPLITS
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    splits = tl.arange(0, SPLITS_P2)
    y, dy = _load_pair(y_ptr, dy_ptr, group, y_row, y_col, dy_row, dy_col, cols, n_cols, n_rows)
    if AHEAD:
        if PHASE != 2:
            _publish_dot(y, dy, part_ptr + tl.cast(group, tl.int64) * SPLITS, counter_ptr + group, chunk, PHASE,
                         PACKED)
        y_next, dy_next = _load_pair(y_ptr, dy_ptr, group + n_groups, y_row, y_col, dy_row, dy_col, cols, n_cols,
                                     n_rows)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        part = part_ptr + r * SPLITS
        if AHEAD:
            if PHASE != 2:
                if row + n_groups < n_rows:
                    _publish_dot(y_next, dy_next, part_ptr + (r + n_groups) * SPLITS, counter_ptr + row + n_groups,
                                 chunk, PHASE, PACKED)
            y_after, dy_after = _load_pair(y_ptr, dy_ptr, row + 2 * n_groups, y_row, y_col, dy_row, dy_col, cols,
                                           n_cols, n_rows)
        else:
            if PHASE != 2:
                tl.store(part + chunk, _dot(y, dy, PACKED))
            y_after, dy_after = _load_pair(y_ptr, dy_ptr, row + n_groups, y_row, y_col, dy_row, dy_col, cols,
                                           n_cols, n_rows)
            if PHASE == 0:
                _arrive(counter_ptr + row)
        if PHASE == 0:
            _wait(counter_ptr + row, SPLITS)
        if PHASE != 1:
            dot = tl.sum(tl.load(part + splits, mask=splits < SPLITS, other=0.0, volatile=True), axis=0)
            tl.store(dx_ptr + r * dx_row + cols * dx_col, _dx(y, dy, dot, dx_ptr, PACKED), mask=cols < n_cols)
        if AHEAD:
            y, dy = y_next, dy_next
            y_next, dy_next = y_after, dy_after
        else:
            y, dy = y_after, dy_after


@triton.jit
def _walk_start(row_start, first, VEC: tl.constexpr, ALIGN: tl.constexpr):
    """Where a walk of columns [first, end) of the row at element offset row_start begins: first, or (ALIGN) the
    column at the 16-byte boundary at or before it (VEC columns a vector), so that every chunk starts at one."""
    start = first
    if ALIGN:
        start = first - ((row_start + first) % VEC).to(tl.int32)
    return start


@triton.jit
def _walk_load(ptr, row_start, start, first, end, col_stride, other, EVEN: tl.constexpr, POLICY: tl.constexpr,
               CHUNK: tl.constexpr, VEC: tl.constexpr, ALIGN: tl.constexpr):
    """Columns [start, start + CHUNK) of a row as fp32, `other` outside [first, end). ALIGN (start at a 16-byte
    boundary, _walk_start; unit column strides): loaded in whole 16-byte vectors, those that reach into [first, end)
    (their columns outside it read from the same 16 bytes, never past them, then replaced), since Triton
    loads a row it cannot see aligned, or masked element by element, one column at a time. The last row's last
    vector may so read up to 15 bytes past the tensor's end: within the 16-byte block of its last element, which
    no GPU page or allocation boundary splits (a memory checker on an exact-size allocation may report it)."""
    if ALIGN:
        vectors = tl.arange(0, CHUNK // VEC)[:, None] * VEC
        offsets = vectors + tl.arange(0, VEC)[None, :]
        cols = start + offsets
        base = (row_start + start) // VEC * VEC  # = row_start + start, as Triton sees it: a multiple of VEC
        x = tl.load(ptr + base + offsets, mask=start + vectors < end, other=other, eviction_policy=POLICY)
        x = tl.reshape(tl.where((cols >= first) & (cols < end), x.to(tl.float32), other), [CHUNK])
    else:
        cols = start + tl.arange(0, CHUNK)
        x = _load(ptr + row_start + cols * col_stride, cols < end, other, EVEN, POLICY)
    return x


@triton.jit
def _walk_store(ptr, row_start, start, first, end, col_stride, value, EVEN: tl.constexpr, CHUNK: tl.constexpr,
                VEC: tl.constexpr, ALIGN: tl.constexpr):
    """_walk_load's columns stored from `value` ([CHUNK]) within [first, end). ALIGN: the 16-byte vectors wholly
    inside it but the walk's first and last (a masked column would store a column at a time); _walk_edges
    stores those two after the walk, from x as it was (in place, out is x: the walk must not have written them)."""
    if ALIGN:
        vectors = tl.arange(0, CHUNK // VEC)[:, None] * VEC
        base = (row_start + start) // VEC * VEC
        whole = (start + vectors > first) & (start + vectors + VEC < end)  # first vector <= first, last's end >= end
        tl.store(ptr + base + vectors + tl.arange(0, VEC)[None, :], tl.reshape(value, [CHUNK // VEC, VEC]), mask=whole)
    else:
        cols = start + tl.arange(0, CHUNK)
        _store(ptr + row_start + cols * col_stride, value, cols < end, EVEN)


@triton.jit
def _walk_edges(start, first, end, VEC: tl.constexpr):
    """The columns of the two 16-byte vectors at the ends of an ALIGN walk from `start` over [first, end)
    (_walk_store leaves them), as [2, VEC], and which of them are in [first, end) (a short row's ends may be one
    vector: it is stored twice, the same values)."""
    last = start + (end - 1 - start) // VEC * VEC
    cols = tl.where(tl.arange(0, 2)[:, None] == 0, start, last) + tl.arange(0, VEC)[None, :]
    return cols, (cols >= first) & (cols < end)


@triton.jit
def _segment(n_cols, SEGMENT: tl.constexpr, SPLITS: tl.constexpr, WHOLE_ROW: tl.constexpr):
    """This program's row group, its segment's index, and the segment's columns [first, end). WHOLE_ROW: a
    row of one segment is [0, n_cols) as such (bf16 forward at 65536 columns: 0.82 of copy, 0.61 through the
    general bounds; the backward goes the other way, 0.76 against 0.85, so it keeps them)."""
    pid = tl.program_id(0)
    part_index = pid % SPLITS
    if SPLITS == 1 and WHOLE_ROW:
        first = 0
        end = n_cols
    else:
        first = part_index * SEGMENT
        end = tl.minimum(first, n_cols - SEGMENT) + SEGMENT  # min(first + SEGMENT, n_cols), within int32
    return pid // SPLITS, part_index, first, end


@triton.jit
def _two_pass_forward(out_ptr, x_ptr, part_ptr, counter_ptr, n_rows, n_cols, x_row, x_col, out_row, out_col,
                      n_groups, SEGMENT: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                      SPLITS_P2: tl.constexpr, PHASE: tl.constexpr, FAST: tl.constexpr, EVEN: tl.constexpr,
                      LANES: tl.constexpr = 1, VEC: tl.constexpr = 1, UNIT: tl.constexpr = 1,
                      ALIGN: tl.constexpr = False):
    """Program (group, part) handles columns [part * SEGMENT, +SEGMENT) of rows group, group + n_groups, ...
    and walks them twice in chunks of CHUNK: first for the max and the sum of exp (loads that ask L2 to keep
    the lines), then to write y. When the segments of the resident programs fit in L2, the second read comes
    from there, not from memory. With SPLITS > 1 the programs of a row combine their partials between the
    two walks, at the row's counter as in _split_forward (PHASE as there). FAST (for 16-bit outputs): the second
    walk computes y = exp2((x - max) * log2(e) + log2(1 / sum)) in one multiply-add, one op fewer than
    exp2((x - max) * log2(e)) / sum and as exact for a 16-bit output. EVEN: the chunks cover the segments
    exactly, so no column is masked. The first walk keeps a max and a sum per thread, a chunk seen as
    [CHUNK // LANES, LANES // VEC, VEC] (LANES as in _publish, VEC columns a thread's vector), so that no chunk
    waits for a block reduction and one exp per thread rescales its sum; they are combined once, after the walk
    (H100, fp32 at 65536 columns: 0.96 of copy against 0.94 with a block max and sum per chunk; a max and sum
    per lane, VEC exps per thread, 0.95; bf16 at 131072 0.90 / 0.88 / 0.89). n_cols and the row strides come
    divided by UNIT (_unit). ALIGN: rows that do not start at 16-byte boundaries (x's and out's at the same
    column) walked from the boundary before each segment's first column, in whole vectors (_walk_load)."""
    n_cols, x_row, out_row = n_cols * UNIT, x_row * UNIT, out_row * UNIT
    group, part_index, first, end = _segment(n_cols, SEGMENT, SPLITS, True)
    splits = tl.arange(0, SPLITS_P2)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        x_start, out_start = r * x_row, r * out_row
        lo = _walk_start(x_start, first, VEC, ALIGN)
        part = part_ptr + r * (2 * SPLITS)  # [max of each segment..., sum of exp of each segment...]
        if PHASE != 2:
            m = tl.full([LANES // VEC], -float("inf"), tl.float32)
            total = tl.full([LANES // VEC], 0.0, tl.float32)
            for start in range(lo, end, CHUNK):
                x = _walk_load(x_ptr, x_start, start, first, end, x_col, -float("inf"), EVEN, "evict_last", CHUNK,
                               VEC, ALIGN)
                lanes = tl.reshape(x, [CHUNK // LANES, LANES // VEC, VEC])
                m_new = tl.maximum(m, tl.max(tl.max(lanes, axis=2), axis=0))
                m_safe = _finite(m_new)  # a thread's -inf sums to 0, not NaN
                chunk_sum = tl.sum(tl.sum(tl.exp2((lanes - m_safe[None, :, None]) * LOG2E), axis=2), axis=0)
                total = total * tl.exp2((m - m_safe) * LOG2E) + chunk_sum
                m = m_new
            m, total = _combined(m, total)
            if SPLITS == 1:
                row_max = m
                scale = 1.0 / total
            else:
                tl.store(part + part_index, m)
                tl.store(part + SPLITS + part_index, total)
                if PHASE == 0:
                    _arrive(counter_ptr + row)
        if PHASE != 1:
            if SPLITS > 1:
                if PHASE == 0:
                    _wait(counter_ptr + row, SPLITS)
                ms = tl.load(part + splits, mask=splits < SPLITS, other=-float("inf"), volatile=True)
                ls = tl.load(part + SPLITS + splits, mask=splits < SPLITS, other=0.0, volatile=True)
                row_max, total = _combined(ms, ls)
                scale = 1.0 / total
            log2_scale = tl.log2(scale)
            for start in range(lo, end, CHUNK):
                x = _walk_load(x_ptr, x_start, start, first, end, x_col, 0.0, EVEN, "evict_first", CHUNK, VEC, ALIGN)
                y = _softmax_of(x, row_max, scale, log2_scale, FAST)
                _walk_store(out_ptr, out_start, start, first, end, out_col, y.to(out_ptr.dtype.element_ty), EVEN,
                            CHUNK, VEC, ALIGN)
            if ALIGN:
                cols, inside = _walk_edges(lo, first, end, VEC)
                x = tl.load(x_ptr + x_start + cols, mask=inside, other=0.0).to(tl.float32)
                y = _softmax_of(x, row_max, scale, log2_scale, FAST)
                tl.store(out_ptr + out_start + cols, y.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _softmax_of(x, row_max, scale, log2_scale, FAST: tl.constexpr):
    """The second walk's y from x, the row's max and 1 / sum (FAST: as one multiply-add in the exponent)."""
    if FAST:
        y = tl.exp2(tl.fma(x - row_max, LOG2E, log2_scale))
    else:
        y = tl.exp2((x - row_max) * LOG2E) * scale
    return y


@triton.jit
def _two_pass_backward(dx_ptr, y_ptr, dy_ptr, part_ptr, counter_ptr, n_rows, n_cols, y_row, y_col, dy_row, dy_col,
                       dx_row, dx_col, n_groups, SEGMENT: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                       SPLITS_P2: tl.constexpr, PHASE: tl.constexpr, UNIT: tl.constexpr = 1, VEC: tl.constexpr = 1,
                       ALIGN: tl.constexpr = False):
    """_two_pass_forward's layout for dx = y * (dy - sum(y * dy)): the first walk sums y * dy, the second
    writes dx. n_cols and the row strides come divided by UNIT (_unit); ALIGN as there (y, dy and dx at the same
    column of a vector)."""
    n_cols, y_row, dy_row, dx_row = n_cols * UNIT, y_row * UNIT, dy_row * UNIT, dx_row * UNIT
    group, part_index, first, end = _segment(n_cols, SEGMENT, SPLITS, False)
    splits = tl.arange(0, SPLITS_P2)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        y_start, dy_start, dx_start = r * y_row, r * dy_row, r * dx_row
        lo = _walk_start(y_start, first, VEC, ALIGN)
        part = part_ptr + r * SPLITS
        if PHASE != 2:
            acc = tl.zeros([CHUNK], tl.float32)
            for start in range(lo, end, CHUNK):
                y = _walk_load(y_ptr, y_start, start, first, end, y_col, 0.0, False, "evict_last", CHUNK, VEC, ALIGN)
                dy = _walk_load(dy_ptr, dy_start, start, first, end, dy_col, 0.0, False, "evict_last", CHUNK, VEC,
                                ALIGN)
                acc += y * dy
            dot = tl.sum(acc, axis=0)
            if SPLITS > 1:
                tl.store(part + part_index, dot)
                if PHASE == 0:
                    _arrive(counter_ptr + row)
        if PHASE != 1:
            if SPLITS > 1:
                if PHASE == 0:
                    _wait(counter_ptr + row, SPLITS)
                dot = tl.sum(tl.load(part + splits, mask=splits < SPLITS, other=0.0, volatile=True), axis=0)
            for start in range(lo, end, CHUNK):
                y = _walk_load(y_ptr, y_start, start, first, end, y_col, 0.0, False, "evict_first", CHUNK, VEC, ALIGN)
                dy = _walk_load(dy_ptr, dy_start, start, first, end, dy_col, 0.0, False, "evict_first", CHUNK, VEC,
                                ALIGN)
                _walk_store(dx_ptr, dx_start, start, first, end, dx_col, (y * (dy - dot)).to(dx_ptr.dtype.element_ty),
                            False, CHUNK, VEC, ALIGN)
            if ALIGN:
                cols, inside = _walk_edges(lo, first, end, VEC)
                y = tl.load(y_ptr + y_start + cols, mask=inside, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + dy_start + cols, mask=inside, other=0.0).to(tl.float32)
                tl.store(dx_ptr + dx_start + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=inside)


@dataclasses.dataclass(frozen=True)
class Settings:
    """How softmax launches for one row width: a tile of BLOCK_M rows x BLOCK_N columns per program (the
    rows path), or the split path with rows cut into chunks of ``chunk`` columns, each held on chip
    (``segment`` 0), or into segments of ``segment`` columns, each walked twice in chunks (the two-pass
    path); ``num_warps`` per program."""
    split: bool
    block_m: int
    block_n: int
    chunk: int
    num_warps: int
    segment: int = 0
    reload: bool = False  # the backward's rows path reads y and dy a second time rather than hold them
    prefetch: bool = False  # the forward's rows path: a program per SM, each loading its next tile early
    ahead: bool = False  # the backward's split path runs a row ahead (_split_backward's AHEAD)
    packed: bool = False  # the split path holds 16-bit rows in pairs (PACKED), where the rows allow it (_in_words)
    align: bool = False  # the two-pass path walks rows from their 16-byte boundaries (ALIGN), where they allow it
    keep: bool = False  # the packed split forward holds its chunks' exps (KEEP; measured by a bench, no default)


MAX_COLS = 2**31 - 2**16  # column offsets are 32-bit in every path, a chunk (<= 32768) past the last column included
# The SEGMENT of a row walked as one segment (UNALIGNED's None), or the row's width rounded up to a power of two
# where wider. Not that width below it: a SEGMENT of one or two chunks lets the compiler bound the backward's walk
# (_segment's general bounds) to as many trips and build it apart, and the bf16 backward so built ran behind in
# three runs on H100s: in the last 0.71 / 0.87 / 0.76 of copy against 0.81 / 0.95 / 0.84 with this at 3001 / 4001 /
# 24001 columns (bench_softmax_unaligned.py; fp32 level both ways; the forward walks such a row as [0, n_cols))
ONE_SEGMENT = 2**21


def launch_settings(n_cols: int, element_size: int, backward: bool = False, *, bf16: bool = False,
                    tile: int | None = None, row_limit: int | None = None, chunk: int | None = None,
                    warps: int | None = None, segment: int | None = None, reload: bool | None = None,
                    prefetch: bool | None = None, ahead: bool | None = None, packed: bool | None = None,
                    align: bool | None = None, keep: bool = False, unaligned: bool = False) -> Settings:
    """The one place softmax's sizes are chosen (the tuned defaults above), by row width, element size,
    direction, (bf16) whether 16-bit rows are bf16, and (unaligned) whether they are rows that no 16-byte vector
    divides that the aligned walk can take (_settings sees the tensors): then UNALIGNED's entry, where it has
    sizes, gives the defaults (its walk aligned unless it says "plain"). Keyword overrides, for tuning and tests,
    replace a default each (the others stay the width's defaults): row_limit (columns) moves the rows path's end,
    segment picks the path past it (0: split, > 0: two-pass), ahead a split backward's form, packed the split
    path's (16-bit rows only), keep the packed forward's KEEP, align the two-pass path's walk from 16-byte
    boundaries. Sizes are in elements; the forward's default tile holds TILE_BYTES of input.
    Raises ValueError past MAX_COLS columns."""
    if not 1 <= n_cols <= MAX_COLS:
        raise ValueError(f"n_cols must be 1..{MAX_COLS} (column offsets are 32-bit), got {n_cols}")
    direction, size = "backward" if backward else "forward", 4 if element_size >= 4 else 2  # the tables' keys
    walk = unaligned and next(sizes for d, es, widest, sizes in UNALIGNED if d == direction and es == size
                              and (widest is None or n_cols <= widest))
    if walk:  # one segment a row where the entry says None
        row_limit = 1 if row_limit is None else row_limit
        align = walk[3:] != ("plain",) if align is None else align
        segment = (walk[0] or max(ONE_SEGMENT, triton.next_power_of_2(n_cols))) if segment is None else segment
        chunk, warps = chunk or walk[1], warps or walk[2]
    block_n = triton.next_power_of_2(n_cols)
    rows_limit = BACKWARD_ROW_LIMIT if backward else ROW_LIMIT if element_size >= 4 or bf16 else PREFETCH_FROM
    if block_n <= (row_limit or rows_limit):
        tile = tile or (BACKWARD_TILE if backward else TILE_BYTES // element_size)
        block_m = max(1, tile // block_n)
        default_reload = default_prefetch = False
        if backward:
            sizes = next((s for widest, *s in BACKWARD_ROWS if block_n <= widest), BACKWARD_ROWS[-1][1:])
            default_warps, default_reload = sizes[0 if element_size >= 4 else 1]
        else:
            default_prefetch = bf16 and block_n > PREFETCH_FROM
            default_warps = PREFETCH_WARPS if default_prefetch else 4 if block_m * block_n <= SMALL_TILE else 16
        return Settings(False, block_m, block_n, 0, warps or default_warps,
                        reload=backward and (default_reload if reload is None else reload),
                        prefetch=not backward and (default_prefetch if prefetch is None else prefetch))
    # a "packed" entry is for rows that pack (not told otherwise, nor given a two-pass segment); others take the next
    may_pack = element_size == 2 and packed is not False and not segment
    default = next(sizes for d, es, widest, sizes in WIDE if d == direction and es == size
                   and (widest is None or n_cols * element_size <= widest) and (sizes[3:] != ("packed",) or may_pack))
    default_segment, default_chunk, default_warps, *form = default
    segment = default_segment if segment is None else segment
    split_backward = backward and not segment
    packed = not segment and element_size == 2 and (form == ["packed"] if packed is None else packed)
    default_ahead = form in (["ahead"], ["packed"])
    return Settings(True, 1, 0, chunk or default_chunk, warps or default_warps, segment,
                    ahead=split_backward and (default_ahead if ahead is None else ahead), packed=packed,
                    align=bool(segment and align), keep=packed and not backward and keep)


@functools.lru_cache(maxsize=None)
def _resident(kernel, device: int, num_warps: int, constexprs: tuple) -> int:
    """How many programs of this compiled kernel one SM holds at once (registers, shared memory, threads):
    an estimate, which the cooperative launch then checks."""
    from triton.runtime import driver

    compiled = _compiled[(kernel, device, num_warps, constexprs)]
    compiled._init_handles()  # n_regs is known once the binary is loaded
    props = driver.active.utils.get_device_properties(device)
    by_regs = props["max_num_regs"] // max(1, compiled.n_regs * 32 * num_warps)
    shared = compiled.metadata.shared
    by_shared = props["max_shared_mem"] // shared if shared else by_regs
    return max(0, min(by_regs, by_shared, 2048 // (32 * num_warps)))


_compiled: dict = {}


def _sms(device: torch.device) -> int:
    """The GPU's SM count; in the interpreter a few programs, so that each walks several tiles."""
    return 3 if backend.current() == "interpreter" else sm_count(device)


@functools.lru_cache(maxsize=None)
def _unused(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-ins for the partials and counters of a launch that reads neither (made once per device, not
    per call)."""
    return torch.empty(1, dtype=torch.float32, device=device), torch.empty(1, dtype=torch.int32, device=device)


def _split_launch(kernel, arguments: dict, n_rows: int, n_cols: int, cfg: Settings, part_width: int, **flags):
    """Launch a split kernel with ``arguments`` (its tensors and strides, by name) and constexpr ``flags``.

    Its one-launch form (PHASE 0) has the programs of a row group wait at a per-row counter for each other,
    so it is correct only if every program of a group is resident on the GPU at once. It is therefore sized
    from the compiled kernel's occupancy and launched as a cooperative grid: the driver refuses a grid that
    cannot be co-resident (an error, here caught) instead of letting it wait forever. Where no group fits,
    where the driver refuses, and always in the interpreter (which runs programs one after another): two
    launches, partials first, then the output from them (reading the input again), unless a row is one
    chunk (a group of one program, which the interpreter runs in one launch too). A two-pass kernel
    (cfg.segment) whose row is one segment waits for no one: one program per row."""
    splits = triton.cdiv(n_cols, cfg.segment or cfg.chunk)
    n_cols //= flags.get("UNIT", 1)  # the kernel's n_cols, as its row strides, counts units (_unit)
    consts = dict(CHUNK=cfg.chunk, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), **flags)
    if cfg.segment:
        consts["SEGMENT"] = cfg.segment
    num_warps = cfg.num_warps
    device = next(iter(arguments.values())).device
    if cfg.segment and splits == 1:  # no partials to share and no counter to wait at: no scratch to fill
        part, counter = _unused(device)
        kernel[(n_rows,)](**arguments, n_rows=n_rows, n_cols=n_cols, n_groups=n_rows, PHASE=0, **consts,
                          part_ptr=part, counter_ptr=counter, num_warps=num_warps)
        return
    arguments = dict(arguments, n_rows=n_rows, n_cols=n_cols,
                     part_ptr=torch.empty((n_rows, part_width * splits), dtype=torch.float32, device=device),
                     counter_ptr=torch.zeros(n_rows, dtype=torch.int32, device=device))  # arrivals per row
    options = dict(num_warps=num_warps, launch_cooperative_grid=True)
    groups = 0
    if backend.current() != "interpreter":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (kernel, index, num_warps, tuple(sorted(consts.items())))
        if key not in _compiled:
            _compiled[key] = kernel.warmup(**arguments, n_groups=1, PHASE=0, **consts, **options, grid=(1,))
        groups = min(n_rows, _resident(*key) * _sms(device) // splits)
    elif splits == 1:  # a group of one program waits for itself alone: the one-launch form runs here too
        groups = min(n_rows, _sms(device))
    if groups:
        try:
            kernel[(groups * splits,)](**arguments, n_groups=groups, PHASE=0, **consts, **options)
            return
        except RuntimeError as e:  # the driver found the grid larger than what can be co-resident
            if "cooperative" not in str(e).lower():
                raise
    for phase in (1, 2):
        kernel[(n_rows * splits,)](**arguments, n_groups=n_rows, PHASE=phase, **consts, num_warps=num_warps)


def _covers(n_cols: int, cfg: Settings) -> bool:
    """Whether the split or two-pass path's chunks cover every row exactly (its segments, the last one's
    too, are whole chunks), so that its kernel can drop the column masks (EVEN)."""
    return n_cols % cfg.chunk == 0 and cfg.segment % cfg.chunk == 0


def _columns_fit(t: torch.Tensor) -> bool:
    """Whether the kernels' column offsets (column index x column stride, in 32 bits) hold t's columns."""
    return t.stride(1) == 1 or (t.shape[1] - 1) * t.stride(1) < 2**31


def _in_words(t: torch.Tensor) -> bool:
    """Whether t's rows can be seen as 32-bit words of two columns (torch's view as int32): unit column strides,
    even widths and row strides, 4-byte aligned."""
    return (t.stride(1) == 1 and t.shape[1] % 2 == 0 and t.stride(0) % 2 == 0 and t.storage_offset() % 2 == 0
            and t.data_ptr() % 4 == 0)


def _settings(n_cols: int, tensors: tuple, backward: bool, overrides: dict) -> Settings:
    """launch_settings for these tensors' rows: unaligned (UNALIGNED's sizes) where no 16-byte vector divides
    them and the aligned walk can take them (_alike), with no overrides; rows that a packed entry cannot see as
    words (_in_words) get the entry for rows that do not pack (unpacked, a packed entry's sizes would hold
    16-bit chunks in an fp32's registers and spill: the backward at 8192 x 4 warps a row ahead, 0.62 of copy on
    an H100)."""
    size, bf16 = tensors[0].element_size(), tensors[0].dtype == torch.bfloat16
    unaligned = not overrides and _unit(n_cols, *tensors) < 16 // size and _alike(tensors)
    cfg = launch_settings(n_cols, size, backward, bf16=bf16, unaligned=unaligned, **overrides)
    if cfg.packed and not (cfg.chunk > 1 and all(_in_words(t) for t in tensors)):
        cfg = launch_settings(n_cols, size, backward, bf16=bf16, **dict(overrides, packed=False))
    if cfg.align and not _alike(tensors):
        cfg = dataclasses.replace(cfg, align=False)
    return cfg


def _alike(tensors: tuple) -> bool:
    """Whether the tensors' rows meet their 16-byte boundaries at the same columns (the ALIGN walk): each starts
    at one, with unit column strides and row strides alike modulo a 16-byte vector."""
    vector = 16 // tensors[0].element_size()
    return all(t.data_ptr() % 16 == 0 and t.stride(1) == 1 and t.stride(0) % vector == tensors[0].stride(0) % vector
               for t in tensors)


def _words(cfg: Settings, *tensors: torch.Tensor) -> tuple:
    """(cfg, tensors) as a split kernel takes them: packed, int32 views (two columns a word) and half the chunk."""
    if not cfg.packed:
        return cfg, tensors
    return dataclasses.replace(cfg, chunk=cfg.chunk // 2), tuple(t.view(torch.int32) for t in tensors)


def _pair_format(dtype: torch.dtype) -> int:
    """PACKED for 32-bit words that hold two values of this 16-bit dtype."""
    return (FP16_PAIRS if dtype == torch.float16 else BF16_PAIRS).value


def _pairs(cfg: Settings, rows: torch.Tensor) -> int:
    """The split kernels' PACKED for these rows: 0, or the 16-bit format of the pairs a word holds."""
    return _pair_format(rows.dtype) if cfg.packed else 0


def _vector(cfg: Settings, element_size: int, unit: int) -> int:
    """Columns (words, packed) of a thread's vector, cfg as launched (after _words): 16 bytes, or the rows' unit
    (_unit) where that is less. Triton loads rows that it cannot see 16-byte aligned one column at a time; a
    thread that then holds 16 bytes of columns has a warp's load touch one column of each thread's 16 bytes
    (a 512-byte span for 64 bytes used) where, a column a thread, it reads 32 adjacent columns."""
    return min(4 if cfg.packed else 16 // element_size, unit)


def _lanes(cfg: Settings, element_size: int, unit: int) -> int:
    """The split and two-pass forwards' lanes (cfg as launched): a vector for each thread, so that a lane's
    partials need no exchange between threads."""
    return min(cfg.chunk, _vector(cfg, element_size, unit) * 32 * cfg.num_warps)


def _unit(n_cols: int, *tensors: torch.Tensor) -> int:
    """The kernels' UNIT: the largest power of two up to a thread's 16-byte vector that divides the row width
    and every row stride (unit column strides), by which they are passed divided and multiplied back by a
    constant, so that Triton knows rows of 1000, 3000 or 65000 columns start at 16-byte boundaries and loads
    them in vectors: it knows an integer argument divisible by 16, not by 8. A row stride past int32 goes as it
    is (unit 1): Triton types it int64 then, and a quotient that fits int32 would overflow when multiplied back.
    So does a tensor that does not start at a 16-byte boundary: Triton, which then knows no alignment, loads
    its rows a column at a time whatever the unit (and _vector follows)."""
    if any(t.stride(0) >= 2**31 or t.data_ptr() % 16 for t in tensors):
        return 1
    unit = 16 // tensors[0].element_size()
    while unit > 1 and (n_cols % unit or any(t.stride(1) != 1 or t.stride(0) % unit for t in tensors)):
        unit //= 2
    return unit


def _strides(unit: int, *tensors: torch.Tensor) -> list[int]:
    """Each tensor's row stride in units (_unit) and column stride, in turn, as the kernels take them."""
    return [s for t in tensors for s in (t.stride(0) // unit, t.stride(1))]


@serialized
def _forward(x: torch.Tensor, out: torch.Tensor, **overrides) -> torch.Tensor:
    """Rows that fit one program's tile (launch_settings), else the split or two-pass path; overrides as there."""
    n_rows, n_cols = x.shape
    if not (n_rows and n_cols):
        return out
    if not _columns_fit(x):
        x = x.contiguous()
    if not _columns_fit(out):  # computed contiguous, then copied in (out may be x itself)
        out.copy_(_forward.__wrapped__(x, torch.empty(x.shape, dtype=out.dtype, device=out.device), **overrides))
        return out
    cfg = _settings(n_cols, (x, out), False, overrides)
    if cfg.split:
        cfg, t = _words(cfg, out, x)
        unit = _unit(t[1].shape[1], *t)
        reach = 16 if cfg.align else unit  # the adjacent columns a thread can load at once (_vector)
        lanes = _lanes(cfg, x.element_size(), reach)
        form = (dict(FAST=out.element_size() <= 2, VEC=min(_vector(cfg, x.element_size(), reach), lanes),
                     ALIGN=cfg.align) if cfg.segment else dict(PACKED=_pairs(cfg, x), KEEP=cfg.keep))
        _split_launch(_two_pass_forward if cfg.segment else _split_forward,
                      dict(out_ptr=t[0], x_ptr=t[1],
                           **dict(zip(("x_row", "x_col", "out_row", "out_col"), _strides(unit, t[1], t[0])))),
                      n_rows, t[1].shape[1], cfg, 2, EVEN=_covers(t[1].shape[1], cfg) and not cfg.align, LANES=lanes,
                      UNIT=unit, **form)
    else:
        programs = triton.cdiv(n_rows, cfg.block_m)
        if cfg.prefetch:
            programs = min(programs, _sms(x.device))
        unit = _unit(n_cols, x, out)
        _rows_forward[(programs,)](out, x, n_rows, n_cols // unit, *_strides(unit, x, out), BLOCK_M=cfg.block_m,
                                   BLOCK_N=cfg.block_n, PREFETCH=cfg.prefetch, UNIT=unit, num_warps=cfg.num_warps)
    return out


@serialized
def _backward(y: torch.Tensor, dy: torch.Tensor, **overrides) -> torch.Tensor:
    """_forward's paths for dx."""
    n_rows, n_cols = y.shape
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if not (n_rows and n_cols):
        return dx
    y, dy = (t if _columns_fit(t) else t.contiguous() for t in (y, dy))
    cfg = _settings(n_cols, (y, dy, dx), True, overrides)
    if cfg.split:
        cfg, t = _words(cfg, dx, y, dy)
        unit = _unit(t[1].shape[1], *t)
        _split_launch(_two_pass_backward if cfg.segment else _split_backward,
                      dict(dx_ptr=t[0], y_ptr=t[1], dy_ptr=t[2],
                           **dict(zip(("y_row", "y_col", "dy_row", "dy_col", "dx_row", "dx_col"),
                                      _strides(unit, t[1], t[2], t[0])))),
                      n_rows, t[1].shape[1], cfg, 1, UNIT=unit,
                      **(dict(VEC=min(_vector(cfg, y.element_size(), 16), cfg.chunk), ALIGN=True) if cfg.align
                         else {} if cfg.segment else dict(AHEAD=cfg.ahead, PACKED=_pairs(cfg, y))))
    else:
        even = n_cols == cfg.block_n and n_rows % cfg.block_m == 0
        unit = _unit(n_cols, y, dy, dx)
        _rows_backward[(triton.cdiv(n_rows, cfg.block_m),)](
            dx, y, dy, n_rows, n_cols // unit, *_strides(unit, y, dy, dx), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            EVEN=even, RELOAD=cfg.reload, UNIT=unit, num_warps=cfg.num_warps)
    return dx


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _forward(x, _out(x, None))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _backward_with_graph(y, dy) if torch.is_grad_enabled() else _backward(y, dy)


def _backward_with_graph(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx in torch ops, for when autograd must differentiate the backward itself (create_graph=True, or
    softmax_backward on tensors that require grad): a kernel's output would have no graph."""
    y32, dy32 = y.float(), dy.float()
    return (y32 * (dy32 - (y32 * dy32).sum(dim=-1, keepdim=True))).to(y.dtype)


# For torch.compile: opaque ops with known outputs and a registered backward (Dynamo cannot trace Triton's
# launcher).
@torch.library.custom_op("kernels::softmax", mutates_args=(), schema="(Tensor x) -> Tensor")
def _softmax_op(x):
    return _forward(x, _out(x, None))


@torch.library.custom_op("kernels::softmax_backward", mutates_args=(), schema="(Tensor y, Tensor dy) -> Tensor")
def _softmax_backward_op(y, dy):
    return _backward(y, dy)


@_softmax_op.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@_softmax_backward_op.register_fake
def _(y, dy):
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _softmax_op_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


_softmax_op.register_autograd(lambda ctx, dy: _softmax_backward_op(ctx.saved_tensors[0], dy),
                              setup_context=_softmax_op_setup)


def _softmax_backward_op_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _softmax_backward_op_backward(ctx, g):
    """dx = y * (dy - s), s = sum(y * dy): d/d(dy) is the same map applied to g; d/dy = g * (dy - s) -
    dy * sum(g * y)."""
    y, dy = ctx.saved_tensors
    y32, dy32, g32 = y.float(), dy.float(), g.float()
    dgy = g32 * (dy32 - (y32 * dy32).sum(-1, keepdim=True)) - dy32 * (g32 * y32).sum(-1, keepdim=True)
    return dgy.to(y.dtype), _softmax_backward_op(y, g)


_softmax_backward_op.register_autograd(_softmax_backward_op_backward, setup_context=_softmax_backward_op_setup)


def _out(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _checks.tensor(out, "out", ndim=2)
    _checks.same("x", x, "out", out)
    _checks.output(out, "out", x=x)  # out=x itself (in place) is allowed: each row is read before it is written
    torch.autograd.graph.increment_version(out)  # as torch's out= does: a graph that saved out sees it changed
    return out


def softmax(x: torch.Tensor, block_size: int | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the rows of a 2-D tensor of any width and strides, differentiable to any order
    (first-order gradients run in Triton; under create_graph=True the backward runs in torch ops).

    An explicit block_size runs the writeup's kernel with that block (``softmax_writeup``), so
    block_size=1024 is the writeup's bug, and it is forward only. Works inside torch.compile (first-order
    gradients there; with block_size or out it runs eagerly: a graph break, so fullgraph=True refuses it).
    ``out`` (optional) receives the result; it may be x itself (in place), but not a tensor with internal
    overlap or one that overlaps x otherwise, and not when x requires grad.
    """
    if block_size is not None:
        return softmax_writeup(x, block_size, out=out)
    _checks.tensor(x, "x", ndim=2)
    if out is not None:
        return _softmax_into(x, out)
    if torch.compiler.is_compiling():
        return _softmax_op(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Softmax.apply(x)
    return _forward(x, _out(x, None))


@torch.compiler.disable  # it writes a tensor the graph does not own, and Dynamo cannot trace Triton's launcher
def _softmax_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        raise ValueError("out= cannot be used when x requires grad")
    return _forward(x, _out(x, out))


def softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The gradient of softmax at its output y: dx = y * (dy - sum(y * dy, row)). Differentiable: when y or
    dy requires grad (grad mode on), it is computed in torch ops instead of the kernel, so it has a graph."""
    _checks.tensor(y, "y", ndim=2)
    _checks.tensor(dy, "dy", ndim=2)
    _checks.same("y", y, "dy", dy)
    if torch.compiler.is_compiling():
        return _softmax_backward_op(y, dy)
    if torch.is_grad_enabled() and (y.requires_grad or dy.requires_grad):
        return _backward_with_graph(y, dy)
    return _backward(y, dy)


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
