"""How far one softmax launch's time moves between timings, and whether where its tensors lie decides it (GPU
only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_spread.py out.csv [--widths 262144,1048576] [--rounds 3]
        [--scratch]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_spread.py --check    # the CPU, Triton's interpreter

On an H100 the split forward, timed twice in one process with the same settings, ran at 0.674 and 0.858 of copy
(bf16 rows of 262144 columns; bench_softmax_keep.py's docstring). Within one do_bench every repetition gets the
same memory from torch's caching allocator (the output, the partials, the counters), so one timing sees one
placement and the next may see another. Here x and out are views into larger buffers at chosen byte offsets
(PLACEMENTS, multiples of 16 bytes), and each placement is timed ``--rounds`` times in turn, a copy between the
same two views beside it (``of_copy`` divides by one copy of x at offset 0 into a fresh tensor; the ``copy``
rows give each placement's own): if the spread follows the placements, placement decides it; if one placement spreads as much
across rounds, it does not. The summary gives each run's median over rounds with its lowest and highest.

On an H100 (stop 73, --rounds 3) it did not: one placement ran at 0.924 / 0.923 / 0.824 (fp32, 262144 columns)
and 0.914 / 0.913 / 0.532 (fp32, 2^20), 0.859 / 0.858 / 0.719 (bf16, 262144), the copies between the same views
within 0.005 each round; placement itself moved softmax by 0.01-0.02 (x 66048 bytes in, out 2^20 + 16: 0.90
against 0.92, and that copy 0.98). What a placed x and out leave free is the scratch each call allocates: the
partials and the counters. ``--scratch`` times the public forward at placement (0, 0) with them as the call
allocates them (``fresh``, their addresses recorded for each timing, modulo 2 MiB) and pinned at byte offsets
SCRATCH into buffers made once, over --rounds: if slow timings follow the scratch's addresses, or vanish
when it is pinned, the scratch's placement is the cause.

It is not (H100 80GB HBM3, stop 74, --scratch --rounds 5, fractions of copy, median / lowest / highest over the
rounds): bf16 at 262144 columns 0.633 / 0.562 / 0.827 as allocated, 0.635 / 0.546 / 0.721 pinned at 0, 0.622 /
0.540 / 0.853 at 4096; fp32 at 2^20 0.783 / 0.654 / 0.860 as allocated, 0.773 / 0.694 / 0.838 at 0, 0.771 /
0.584 / 0.816 at 65552; fp32 at 262144 0.909-0.924 every way. Every scratch placement spreads as much as the
allocator's, and the rounds move together (bf16 262144, rounds 0-2 0.54-0.68 whatever the scratch, round 4
0.72-0.85): the cause lies elsewhere (the co-resident groups' arrival order or the GPU's state), not in where
any tensor lies. The same machine's committed-run figure for bf16 262144 was 0.827 (another H100, stop 73).
Every row carries the GPU's clocks, temperature and power just after its timing (softmax_bench_rows.gpu_state).
Run so (another H100 80GB HBM3, stop 75, --scratch --rounds 5), every one of the 100 timings read 1980 MHz SM and
2619 MHz memory clocks, at 43-48 C and 148-390 W, and the spread was as wide: fp32 at 2^20 columns 0.59 to 0.92 of
copy (medians over rounds 0.872-0.889 by scratch), bf16 at 262144 0.59 to 0.86 (medians 0.715-0.856), fp32 at
262144 0.72 to 0.93; 33 of the 100 below 0.8, at every power draw from 149 W up. Slow timings come in spells
a few timings long whatever the scratch (bf16 262144, round 3: all five placements 0.59-0.62, the rounds before
and after 0.81-0.86). So they follow no clock, temperature or power that nvidia-smi reads, nor any placement:
what stays is the split path's lockstep (each row's programs wait for the slowest of them; a copy, whose
blocks are handed out as SMs free up, timed beside it held within 0.005) and its polls at the counters
(bench_softmax_backoff.py times a backoff between them).
"""
from __future__ import annotations

import math

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax
from softmax_bench_rows import copy_gbps, timed, timed_rounds  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
DTYPES = (torch.bfloat16, torch.float32)
# (x's offset, out's offset) in bytes from their buffers' starts (which torch aligns to 512 bytes)
PLACEMENTS = [(0, 0), (0, 4096), (4096, 0), (65536 + 512, 2**20 + 16), (2**20 + 16, 65536 + 512)]
SCRATCH = [None, 0, 128, 4096, 65536 + 16]  # None: as the call allocates it ('fresh')


def view_at(buffer: torch.Tensor, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of ``shape`` starting ``offset`` bytes into the 1-D ``buffer``."""
    start = offset // buffer.element_size()
    return buffer[start:start + math.prod(shape)].view(shape)


class Scratch:
    """Stands in for torch inside kernels._softmax: records where each split launch's partials (torch.empty,
    fp32, rows x partials) and counters (torch.zeros, int32) lie, modulo 2 MiB, and, given a byte ``offset``,
    hands them out at that offset in buffers made once instead (the counters zeroed at each call, as
    torch.zeros does)."""

    def __init__(self, offset: int | None):
        self.offset, self.seen, self.buffers = offset, set(), {}

    def __getattr__(self, name):
        return getattr(torch, name)

    def _scratch(self, kind: str, shape, dtype, device, zero: bool) -> torch.Tensor:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if self.offset is None:
            t = (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)
        else:
            room = math.prod(shape) + self.offset // dtype.itemsize
            if kind not in self.buffers or self.buffers[kind].numel() < room:
                self.buffers[kind] = torch.empty(room, dtype=dtype, device=device)
            t = view_at(self.buffers[kind], self.offset, shape)
            if zero:
                t.zero_()
        self.seen.add(f"{kind}@{t.data_ptr() % 2**21:#x}")
        return t

    def empty(self, shape, *, dtype=None, device=None, **kwargs):
        if dtype is torch.float32 and isinstance(shape, tuple) and len(shape) == 2 and not kwargs:  # (rows, partials)
            return self._scratch("part", shape, dtype, device, zero=False)
        return torch.empty(shape, dtype=dtype, device=device, **kwargs)

    def zeros(self, shape, *, dtype=None, device=None, **kwargs):
        if dtype is torch.int32 and not kwargs:
            return self._scratch("counter", shape, dtype, device, zero=True)
        return torch.zeros(shape, dtype=dtype, device=device, **kwargs)


def with_scratch(stand_in: Scratch, fn):
    """fn, run with ``stand_in`` as kernels._softmax's torch."""
    def run():
        sm.torch = stand_in
        try:
            return fn()
        finally:
            sm.torch = torch
    return run


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
        for offset in SCRATCH:
            stand_in, out = Scratch(offset), torch.full(shape, float("nan"), dtype=dtype)
            with_scratch(stand_in, lambda: sm._forward(x, out, row_limit=16, chunk=64, segment=0))()  # the split path
            torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1e-2)
            assert {s.split("@")[0] for s in stand_in.seen} == {"part", "counter"}, stand_in.seen
            assert sm.torch is torch
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


def measure_scratch(widths: list[int], rounds: int) -> list[dict]:
    rows = []
    for dtype in DTYPES:
        for n in widths:
            shape = (max(1, BYTES // (n * dtype.itemsize)), n)
            x = torch.randn(shape, device="cuda").to(dtype)
            out, want, base = torch.empty_like(x), torch.softmax(x.float(), -1), copy_gbps(x)
            stand_ins = [Scratch(offset) for offset in SCRATCH]  # made once: a pinned scratch is the same every round
            for r in range(rounds):
                for stand_in in stand_ins:
                    stand_in.seen = set()  # this timing's addresses
                    call = with_scratch(stand_in, lambda: softmax(x, out=out))
                    row = timed(call, want, 2 * x.numel() * x.element_size(), base, direction="forward",
                                dtype=str(dtype)[6:], n_cols=n, n_rows=shape[0], round=r,
                                sizes=f"scratch {'fresh' if stand_in.offset is None else stand_in.offset}")
                    rows.append(dict(row, scratch=" ".join(sorted(stand_in.seen))))
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: (measure_scratch if args.scratch else measure)(args.widths, args.rounds),
               [262144, 2**20], lambda parser: parser.add_argument(
                   "--scratch", action="store_true", help="time the scratch's placements, not x's and out's"))
