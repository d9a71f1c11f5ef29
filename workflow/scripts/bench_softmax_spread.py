"""How far one softmax launch's time moves between timings, and whether where its tensors lie decides it (GPU
only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_spread.py out.csv [--widths 262144,1048576] [--rounds 3]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_spread.py --check    # the CPU, Triton's interpreter

On an H100 the split forward, timed twice in one process with the same settings, ran at 0.674 and 0.858 of copy
(bf16 rows of 262144 columns; bench_softmax_keep.py's docstring). Within one do_bench every repetition gets the
same memory from torch's caching allocator (the output, the partials, the counters), so one timing sees one
placement and the next may see another. Here x and out are views into larger buffers at chosen byte offsets
(PLACEMENTS, multiples of 16 bytes), and each placement is timed ``--rounds`` times in turn, a copy between the
same two views beside it (``of_copy`` divides by one copy of x at offset 0 into a fresh tensor; the ``copy``
rows give each placement's own): if the spread follows the placements, placement decides it; if one placement spreads as much
across rounds, it does not. The summary gives each run's median over rounds with its lowest and highest.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax
from softmax_bench_rows import copy_gbps, timed_rounds  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
DTYPES = (torch.bfloat16, torch.float32)
# (x's offset, out's offset) in bytes from their buffers' starts (which torch aligns to 512 bytes)
PLACEMENTS = [(0, 0), (0, 4096), (4096, 0), (65536 + 512, 2**20 + 16), (2**20 + 16, 65536 + 512)]


def view_at(buffer: torch.Tensor, offset: int, shape: tuple[int, int]) -> torch.Tensor:
    """The (rows, columns) tensor starting ``offset`` bytes into the 1-D ``buffer``."""
    start = offset // buffer.element_size()
    return buffer[start:start + shape[0] * shape[1]].view(shape)


def buffers(shape: tuple[int, int], dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A random input buffer and an output buffer, each room for ``shape`` at every offset of PLACEMENTS."""
    room = shape[0] * shape[1] + max(max(p) for p in PLACEMENTS) // dtype.itemsize
    return torch.randn(room, device=device).to(dtype), torch.empty(room, dtype=dtype, device=device)


def check() -> None:
    """The split forward (forced at small widths) on views at every placement, against torch, fp32 and fp16."""
    for dtype in (torch.float32, torch.float16):
        shape = (5, 300)
        xs, outs = buffers(shape, dtype, "cpu")
        for x_at, out_at in PLACEMENTS:
            x, out = view_at(xs, x_at, shape), view_at(outs, out_at, shape)
            assert sm._settings(shape[1], (x, out), False, dict(row_limit=16, chunk=64)).split
            sm._forward(x, out, row_limit=16, chunk=64)
            torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1e-2)
    print("interpreter check passed")


def measure(widths: list[int], rounds: int) -> list[dict]:
    rows = []
    for dtype in DTYPES:
        for n in widths:
            shape = (max(1, BYTES // (n * dtype.itemsize)), n)
            xs, outs = buffers(shape, dtype, "cuda")
            base = copy_gbps(view_at(xs, 0, shape))
            runs, want = [], {}
            for x_at, out_at in PLACEMENTS:
                x, out = view_at(xs, x_at, shape), view_at(outs, out_at, shape)
                where = f"x+{x_at} out+{out_at}"
                runs += [(f"softmax {where}", lambda x=x, out=out: softmax(x, out=out)),
                         (f"copy {where}", lambda x=x, out=out: out.copy_(x))]
                want[f"softmax {where}"], want[f"copy {where}"] = torch.softmax(x.float(), -1), x.float()
            rows += [dict(row, placement=row["sizes"].split(" ", 1)[1])
                     for row in timed_rounds(runs, want, 2 * shape[0] * n * dtype.itemsize, base, rounds,
                                             direction="forward", dtype=str(dtype)[6:], n_cols=n, n_rows=shape[0])]
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, args.rounds), [262144, 2**20])
