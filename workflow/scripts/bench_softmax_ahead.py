"""The split backward a row ahead (GPU only; not part of the pipeline): a design for the softmax backward on rows
wider than 65536 columns, to be measured.

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_ahead.py out.csv [--widths 262144,1048576]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_ahead.py --check    # the CPU, Triton's interpreter

kernels/_softmax.py's split backward publishes a row's partial (its chunk's sum(y * dy)), issues the next row's
loads, then arrives at the row's counter and waits there at once: every program of a group meets the slowest
at every row. bench_softmax_wait.py measured what that costs on an H100: without the wait (wrong results) the
fp32 backward at 2^20 columns ran at 0.92 of copy against 0.78. The split forward does not pay it, as it runs a
row ahead: it publishes the next row's partials before it waits for this row's, so that the group's other
programs have had a whole row's time to arrive. Here the backward does the same: it holds this row's and the
next row's chunks of y and dy, publishes and arrives for the next row before it waits for this one, and has the
row after that in flight (three rows of two tensors: 16-bit chunks held in their dtype, converted at use).

Registers a thread and spills of the sm_90a builds (triton 3.9, ptxas, rows of 2^20 columns, unit column
strides, 16-divisible pointers and row strides), the row-ahead kernel against the committed _split_backward,
chunk/warps: fp32 2048/4 128 (96), 4096/4 240 (183), 4096/8 128 (103), 8192/8 241 (187), 8192/16 128 (108), no
spills; 8192/4 spills 4596 B (92 B), 16384/16 1532 B (68 B). bf16 2048/4 119 (96), 4096/4 219 (183), 4096/8 121
(102), 8192/8 221 (187), 8192/16 113 (109), no spills; 8192/4 spills 478 B (72 B), 16384/16 372 B (136 B). Not yet
run on a GPU.

For each width and dtype it times the public ``softmax_backward`` (the committed defaults) and the row-ahead
kernel over chunk and warps, each checked against torch, beside a copy of the same tensor (do_bench medians;
fractions of that copy), one CSV row per measurement, and prints the best of each.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax_backward
from kernels._triton import tl, triton

BYTES = 2**28
SIZES = [(2048, 4), (4096, 4), (4096, 8), (8192, 4), (8192, 8), (8192, 16), (16384, 16)]


@triton.jit
def _load_pair(y_ptr, dy_ptr, row, y_row, y_col, dy_row, dy_col, cols, n_cols, n_rows):
    """Row ``row``'s chunks of y and dy in their dtype; zeros past the row, or for a row past the last."""
    present = sm._row_mask(cols, n_cols, row, n_rows)
    r = tl.cast(row, tl.int64)
    y = tl.load(y_ptr + r * y_row + cols * y_col, mask=present, other=0.0)
    dy = tl.load(dy_ptr + r * dy_row + cols * dy_col, mask=present, other=0.0)
    return y, dy


@triton.jit
def _publish(y, dy, part, counter, chunk, PHASE: tl.constexpr):
    """Store a chunk's partial sum(y * dy) and (PHASE 0) count in at its row's counter."""
    tl.store(part + chunk, tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=0))
    if PHASE == 0:
        sm._arrive(counter)


@triton.jit
def split_backward_ahead(dx_ptr, y_ptr, dy_ptr, part_ptr, counter_ptr, n_rows, n_cols, y_row, y_col, dy_row, dy_col,
                         dx_row, dx_col, n_groups, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                         SPLITS_P2: tl.constexpr, PHASE: tl.constexpr):
    """_split_backward's layout and phases, run a row ahead as _split_forward is."""
    pid = tl.program_id(0)
    group = pid // SPLITS
    chunk = pid % SPLITS
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    splits = tl.arange(0, SPLITS_P2)
    y, dy = _load_pair(y_ptr, dy_ptr, group, y_row, y_col, dy_row, dy_col, cols, n_cols, n_rows)
    if PHASE != 2:
        _publish(y, dy, part_ptr + tl.cast(group, tl.int64) * SPLITS, counter_ptr + group, chunk, PHASE)
    y1, dy1 = _load_pair(y_ptr, dy_ptr, group + n_groups, y_row, y_col, dy_row, dy_col, cols, n_cols, n_rows)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        if PHASE != 2:
            if row + n_groups < n_rows:  # the next row's partial first: the group has a row's time to arrive
                _publish(y1, dy1, part_ptr + (r + n_groups) * SPLITS, counter_ptr + row + n_groups, chunk, PHASE)
        y2, dy2 = _load_pair(y_ptr, dy_ptr, row + 2 * n_groups, y_row, y_col, dy_row, dy_col, cols, n_cols, n_rows)
        if PHASE == 0:
            sm._wait(counter_ptr + row, SPLITS)
        if PHASE != 1:
            dot = tl.sum(tl.load(part_ptr + r * SPLITS + splits, mask=splits < SPLITS, other=0.0, volatile=True),
                         axis=0)
            dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
            tl.store(dx_ptr + r * dx_row + cols * dx_col, dx.to(dx_ptr.dtype.element_ty), mask=cols < n_cols)
        y, dy = y1, dy1
        y1, dy1 = y2, dy2


def backward(y: torch.Tensor, dy: torch.Tensor, chunk: int, warps: int) -> torch.Tensor:
    dx = torch.empty_like(y)
    sm._split_launch(split_backward_ahead, dict(dx_ptr=dx, y_ptr=y, dy_ptr=dy, y_row=y.stride(0), y_col=y.stride(1),
                                                dy_row=dy.stride(0), dy_col=dy.stride(1), dx_row=dx.stride(0),
                                                dx_col=dx.stride(1)),
                     *y.shape, sm.Settings(True, 1, 0, chunk, warps), 1)
    return dx


def check() -> None:
    """Against torch in the interpreter, fp32 and fp16: rows of several chunks (two launches, partials then
    output) and of one chunk (the one-launch form, a group of one program: the row-ahead order itself), widths
    that do and do not fill the chunks, more rows than programs, transposed strides."""
    for dtype in (torch.float32, torch.float16):
        for n_rows, n_cols, chunk in ((5, 96, 32), (3, 100, 32), (7, 64, 64), (4, 50, 64), (300, 40, 64)):
            y = torch.softmax(torch.randn(n_rows, n_cols), -1).to(dtype)
            dy = torch.randn(n_rows, n_cols).to(dtype)
            want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
            tol = 1e-6 if dtype == torch.float32 else 1e-3
            torch.testing.assert_close(backward(y, dy, chunk, 4).float(), want, atol=tol, rtol=0)
            yt, dyt = y.t().contiguous().t(), dy.t().contiguous().t()  # column strides > 1
            torch.testing.assert_close(backward(yt, dyt, chunk, 4).float(), want, atol=tol, rtol=0)
    print("interpreter check passed")


def measure(widths: list[int]) -> list[dict]:
    import triton.testing

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in widths:
            m = max(1, BYTES // (n * dtype.itemsize))
            y = torch.softmax(torch.randn(m, n, device="cuda", dtype=torch.float32), -1).to(dtype)
            dy = torch.randn_like(y)
            want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
            copy = torch.empty_like(y)
            copy_gbps = 2 * y.numel() * dtype.itemsize / triton.testing.do_bench(lambda: copy.copy_(y), rep=100) / 1e6
            runs = [("public", lambda: softmax_backward(y, dy))]
            runs += [(f"ahead {c}/w{w}", lambda c=c, w=w: backward(y, dy, c, w)) for c, w in SIZES if c <= n]
            for label, fn in runs:
                row = dict(dtype=str(dtype)[6:], n_cols=n, n_rows=m, sizes=label, ok=False, error="")
                try:
                    out = fn().float()
                    err = ((out - want).abs().max() / want.abs().max()).item()
                    gbps = 3 * y.numel() * dtype.itemsize / triton.testing.do_bench(fn, rep=60) / 1e6
                    row.update(gbps=gbps, of_copy=gbps / copy_gbps, rel_err=err,
                               ok=err <= (1e-5 if dtype == torch.float32 else 2e-2))
                except Exception as e:  # noqa: BLE001  (a size that does not compile or launch is a data point)
                    row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the CSV to write")
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")],
                        default=[65536, 131072, 262144, 524288, 2**20])
    parser.add_argument("--check", action="store_true", help="the interpreter check (CPU), nothing timed")
    args = parser.parse_args()
    if args.check:
        check()
        return
    if not args.out:
        sys.exit("give the CSV to write (or --check)")
    import pandas as pd

    table = pd.DataFrame(measure(args.widths))
    table.to_csv(args.out, index=False)
    ok = table[table.ok]
    best = ok.loc[ok.groupby(["dtype", "n_cols", ok.sizes == "public"]).of_copy.idxmax()]
    print(best[["dtype", "n_cols", "sizes", "of_copy"]].round(3).to_string(index=False))
    bad = table[~table.ok]  # wrong, or failed (its error said)
    if len(bad):
        print(f"{len(bad)} runs wrong or failed:", os.linesep, bad.to_string(index=False))


if __name__ == "__main__":
    main()
