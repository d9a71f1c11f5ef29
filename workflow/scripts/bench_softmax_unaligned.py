"""Softmax rows that no 16-byte vector divides (GPU only; not part of the pipeline): the aligned two-pass walk
(ALIGN) at several sizes against the unaligned two-pass forms, the public defaults and torch.

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_unaligned.py out.csv [--widths 50257,151937]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_unaligned.py --check    # the CPU, Triton's interpreter

Rows of 4001 or 50257 columns (contiguous: every row but one in a vector's starts off a 16-byte boundary) are
rows Triton cannot see aligned, so it loads and stores them a column at a time. The aligned walk starts each
row's walk at the 16-byte boundary at or before its first column and loads whole vectors (kernels/_softmax.py,
_walk_load); its sizes by width are the UNALIGNED table there, chosen from this script's runs.

Measured on an H100 80GB HBM3 with an earlier form of this script (the same kernels and sizes, the defaults
through kernels._softmax._forward / _backward; triton 3.6, do_bench medians, fractions of a copy of the same
tensor, 2^28 bytes per input, every result checked), the defaults of the time (before the UNALIGNED table)
against the aligned walk:
- bf16 forward 16001 / 32001 / 50257 / 100003 / 151937 / 1000003 columns: defaults 0.872 / 0.500 / 0.550 /
  0.591 / 0.231 / 0.293; aligned, one segment a row, 8192 x 8 warps 0.895 / 0.863 / 0.719 / 0.611 / 0.568 /
  0.421, 32768 x 32 0.425 / 0.765 / 0.711 / 0.790 / 0.763 / 0.487; segments of 65536 (32768 x 32) 0.507 at
  1000003; the unaligned two-pass of 32768 x 32 0.430 / 0.630 / 0.608 / 0.594 / 0.493 / 0.287; torch 0.38-0.70.
- bf16 backward 4001 / 8001 / 16001 / 32001 / 50257 / 100003 / 151937 / 1000003: defaults 0.475 / 0.924 / 0.616 /
  0.594 / 0.734 / 0.335 / 0.298 / 0.362; aligned 4096 x 8 0.939 / 1.000 / 0.966 / 0.718 / 0.646 / 0.583 / 0.545 /
  0.464, 16384 x 32 0.277 / 0.503 / 0.869 / 0.830 / 0.772 / 0.686 / 0.641 / 0.482, segments of 65536 (16384 x 32)
  0.691 / 0.695 / 0.708 at 100003 / 151937 / 1000003; torch 0.38-0.45.
- fp32 forward: the defaults ahead or level (rows path 0.95-1.01 to 32001; split path 0.81 / 0.64 / 0.65 at
  100003 / 151937 / 1000003 against aligned 0.68 / 0.63 / 0.64) but at 50257 (two-pass): aligned 32768 x 32
  0.891 against 0.759.
- fp32 backward: the defaults ahead or level everywhere but 32001 (0.754), where the aligned 8192 x 16 reached
  0.827 and the unaligned two-pass of 16384 x 32 0.943 (not understood: kept as the defaults).

Then this script on two more H100 80GB HBM3s (triton 3.6, the UNALIGNED table of the time), at 1001 .. 1000003
columns: the fp32 backward's defaults are slow where they are the rows path with one row a program that reads
y and dy twice (BACKWARD_ROWS' reload): 0.69 / 0.71 at 3001 / 4001 columns (twice at 4001) and 0.74 / 0.75 at
24001 / 32001 (twice at 32001), where the unaligned (plain) two-pass reached 0.97 / 1.04 (4096 x 8 warps) and
0.97 / 0.92-0.93 (16384 x 32), the aligned walk at best 0.71 / 0.73 / 0.83 / 0.82; the rows path elsewhere
0.98-1.03 (1001, 2001, 6001-16001). The fp32 forward at 24001 / 32001: the rows path 0.86 / 0.95, the aligned
walk of 32768 x 32 0.97 / 0.98 (at 16001 0.79 against 0.98). Kept: those entries (the "plain" form for the two
fp32 backward ranges, 2049-4096 and 16385-32768 columns; the fp32 forward's aligned entry from 16385 columns).
With those entries committed (7cda4dd), on another H100 80GB HBM3, the public path took them at the same pace
as the overrides: fp32 backward 1.001 / 1.008 / 0.990 / 0.949 at 3001 / 4001 / 24001 / 32001 columns (overrides
0.967 / 1.047 / 0.989 / 0.951), fp32 forward 0.972 / 0.985 at 24001 / 32001. The bf16 backward's public calls
again ran behind the override of the same sizes where the row is one segment: 0.713 / 0.869 / 0.756 against
0.805 / 0.945 / 0.841 at 3001 / 4001 / 24001 (at 32001, segments of 65536 both ways, 0.835 alike): the third
run to show it. Its one difference, the SEGMENT constexpr (next_pow2(n) against 2^21), gives the same bounds, but
a SEGMENT of one or two chunks lets the compiler build the walk for that many trips (their sm_90 builds differ);
the public path has taken 2^21 since (kernels._softmax.ONE_SEGMENT). Timed so at 772a48a on a third H100: the
bf16 backward's public calls 0.803 / 0.941 against 0.802 / 0.941 for the override at 3001 / 4001 columns.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward
from softmax_bench_rows import copy_gbps, main as bench_main, timed

BYTES = 2**28
ONE_SEGMENT = sm.ONE_SEGMENT  # wider than any row timed here: one segment a row, as the public path takes it
SIZES = {"forward": [(ONE_SEGMENT, 8192, 8), (ONE_SEGMENT, 16384, 16), (ONE_SEGMENT, 32768, 32), (65536, 32768, 32)],
         "backward": [(ONE_SEGMENT, 4096, 8), (ONE_SEGMENT, 8192, 16), (ONE_SEGMENT, 16384, 32), (65536, 16384, 32)]}


def run(direction: str, tensors: tuple, segment: int, chunk: int, warps: int, align: bool) -> torch.Tensor:
    sizes = dict(row_limit=1, segment=segment, chunk=chunk, warps=warps, align=align)
    if direction == "forward":
        return sm._forward(tensors[0], torch.empty_like(tensors[0]), **sizes)
    return sm._backward(*tensors, **sizes)


def check() -> None:
    """The aligned walk against torch in the interpreter, fp32 and fp16, both directions: rows shorter than a
    vector and longer, one and several segments, chunks smaller than a vector; the walk taken every time."""
    for dtype in (torch.float32, torch.float16):
        for n_rows, n_cols in ((3, 5), (5, 97), (4, 130)):
            x = torch.randn(n_rows, n_cols).to(dtype)
            y = torch.softmax(x.float(), -1).to(dtype)
            dy = torch.randn(n_rows, n_cols).to(dtype)
            want = {"forward": torch.softmax(x.float(), -1),
                    "backward": torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)}
            tol = 1e-6 if dtype == torch.float32 else 2e-3
            for direction, tensors in (("forward", (x,)), ("backward", (y, dy))):
                for segment, chunk in ((ONE_SEGMENT, 64), (64, 32), (32, 2)):
                    assert sm._settings(n_cols, tensors * 2, direction == "backward", dict(
                        row_limit=1, segment=segment, chunk=chunk, align=True)).align
                    got = run(direction, tensors, segment, chunk, 1, True).float()
                    torch.testing.assert_close(got, want[direction], atol=tol, rtol=0)
    print("interpreter check passed")


def measure(widths: list[int]) -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for n in widths:
            m = max(1, BYTES // (n * dtype.itemsize))
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            y = torch.softmax(x.float(), -1)
            dy = torch.randn_like(x)
            want = {"forward": y, "backward": torch._softmax_backward_data(dy.float(), y, -1, torch.float32)}
            y = y.to(dtype)
            copy_rate = copy_gbps(x)
            for direction, tensors in (("forward", (x,)), ("backward", (y, dy))):
                runs = {"public": (lambda: softmax(x)) if direction == "forward" else (lambda: softmax_backward(y, dy)),
                        "torch": (lambda: torch.softmax(x, -1)) if direction == "forward"
                        else (lambda: torch._softmax_backward_data(dy, y, -1, dtype))}
                for segment, chunk, warps in SIZES[direction]:
                    where = "row" if segment == ONE_SEGMENT else f"segments of {segment}"
                    for align in (True, False):
                        runs[f"{'aligned' if align else 'unaligned'} {where} {chunk}/w{warps}"] = (
                            lambda d=direction, t=tensors, s=(segment, chunk, warps), a=align: run(d, t, *s, a))
                moved = (2 if direction == "forward" else 3) * x.numel() * dtype.itemsize
                for label, fn in runs.items():
                    rows.append(timed(fn, want[direction], moved, copy_rate, direction=direction, dtype=str(dtype)[6:],
                                      n_cols=n, n_rows=m, unit=sm._unit(n, x), sizes=label))
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths),
               [4001, 8001, 16001, 32001, 50257, 100003, 151937, 1000003])
