"""The split path with no lockstep: one program per chunk of a row, taken in the order programs start (GPU only;
not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_ticket.py out.csv [--widths 65536,262144,1048576]
        [--rounds 3]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_ticket.py --check    # the CPU, Triton's interpreter

The committed split forward (kernels/_softmax.py, ``_split_forward``) is persistent: a group of resident programs
owns a column range of every row of its group and moves through the rows in step, each row's programs waiting
for the slowest of them. A program that runs slow for a while (its SM slow, bench_softmax_trace.py asks) holds
its whole group back, where a copy's blocks would go to the other SMs; the split path's speed moves by a third
between timings at constant clocks (bench_softmax_spread.py). Here the grid is rows x chunks, one program per
chunk of a row, and each program takes the next ticket of a launch-wide counter as it starts: ticket t is chunk
t % SPLITS of row t // SPLITS. A program that has started therefore holds a lower ticket than every program
that has not, so a row's programs wait only for programs that have started or will start next; where at least
SPLITS programs fit on the GPU at once, the row's last program always finds a place, and no launch can hang
(``measure`` checks the fit from the compiled kernel first). Programs are handed to SMs as SMs free up, as a
copy's are: an SM that runs slow takes fewer chunks. What it gives up: the committed kernels' row-ahead
(publishing the next row and loading the one after while it waits), since a program has one chunk. Forward
and backward (dx = y * (dy - sum(y * dy))), the committed split kernels' arithmetic per chunk, 16-bit rows
as they are or packed (two columns to a 32-bit word, as the committed defaults hold bf16 wide rows).

Each row of the CSV: the public kernel and the ticket kernels at each size (chunk columns, warps, packed or
not), timed in turn over ``--rounds``, fraction of a copy of the same tensor, error against torch, the GPU's
clocks.

``--check`` runs the ticket kernels in the interpreter with rows of one chunk (the interpreter runs programs one
after another, so a program waiting for a later one would wait forever; rows of several chunks need the GPU),
against torch.

H100 80GB HBM3, 2026-12-07, three rounds (medians, fraction of copy; the public kernel polling back to back, as
``_wait`` was then, against the best ticket size): slower at 17 of 18 points. fp32 forward 0.960 / 0.946 (65536
columns), 0.925 / 0.947 (262144, the one gain), 0.913 / 0.893 (2^20); bf16 forward 0.974 / 0.850, 0.859 / 0.855,
0.816 / 0.787; fp32 backward 0.990 / 0.984, 0.992 / 0.977, 0.941 / 0.924; bf16 backward 0.937 / 0.915, 0.988 /
0.942, 0.931 / 0.829. Packing made no difference to speed. So the row-ahead is worth more than freedom from
lockstep, and the ticket form was not taken.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward
from kernels._softmax import (LOG2E, _combined, _dx, _load_chunk, _load_pair, _pack, _publish, _publish_dot, _store,
                              _unpack, _wait)
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps, timed_rounds  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
SIZES = {torch.float32: [(4096, 4), (2048, 4), (8192, 8)], torch.bfloat16: [(8192, 4), (4096, 4), (16384, 8)]}


@triton.jit
def _ticket(counter_ptr, n_rows, SPLITS: tl.constexpr, CHUNK: tl.constexpr):
    """(row, its int64, chunk, the chunk's columns) of the ticket this program takes as it starts: its place in
    the order programs start. counter_ptr: n_rows arrival counters, then the ticket counter, all zero at the
    launch."""
    ticket = tl.atomic_add(counter_ptr + n_rows, 1)
    row = ticket // SPLITS
    chunk = ticket % SPLITS
    return row, tl.cast(row, tl.int64), chunk, chunk * CHUNK + tl.arange(0, CHUNK)


@triton.jit
def _ticket_forward(out_ptr, x_ptr, part_ptr, counter_ptr, n_rows, n_cols, row_stride, CHUNK: tl.constexpr,
                    SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, LANES: tl.constexpr, EVEN: tl.constexpr,
                    PACKED: tl.constexpr):
    """_split_forward's arithmetic for one chunk (PACKED: 16-bit rows as 32-bit words of two columns, n_cols,
    CHUNK and row_stride in words)."""
    row, r, chunk, cols = _ticket(counter_ptr, n_rows, SPLITS, CHUNK)
    x = _load_chunk(x_ptr, row, row_stride, cols, 1, n_cols, n_rows, EVEN, PACKED)
    part = part_ptr + r * (2 * SPLITS)  # [max of each chunk..., sum of exp of each chunk...]
    e, m = _publish(x, part, counter_ptr + row, chunk, SPLITS, 0, PACKED, LANES)
    _wait(counter_ptr + row, SPLITS)
    splits = tl.arange(0, SPLITS_P2)
    ms = tl.load(part + splits, mask=splits < SPLITS, other=-float("inf"), volatile=True)
    ls = tl.load(part + SPLITS + splits, mask=splits < SPLITS, other=0.0, volatile=True)
    row_max, total = _combined(ms, ls)
    if PACKED:  # e is x as loaded
        even, odd = _unpack(e, PACKED)
        log2_scale = -tl.log2(total)
        y = _pack(tl.exp2(tl.fma(even - row_max, LOG2E, log2_scale)), tl.exp2(tl.fma(odd - row_max, LOG2E, log2_scale)),
                  PACKED)
    else:
        scale = tl.exp2((m - row_max) * LOG2E) / total  # a lane's
        y = tl.reshape(tl.reshape(e, [CHUNK // LANES, LANES]) * scale[None, :], [CHUNK]).to(out_ptr.dtype.element_ty)
    _store(out_ptr + r * row_stride + cols, y, cols < n_cols, EVEN)


@triton.jit
def _ticket_backward(dx_ptr, y_ptr, dy_ptr, part_ptr, counter_ptr, n_rows, n_cols, row_stride, CHUNK: tl.constexpr,
                     SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, PACKED: tl.constexpr):
    """_split_backward's arithmetic for one chunk: dx = y * (dy - sum(y * dy)); the partial is the chunk's
    sum(y * dy)."""
    row, r, chunk, cols = _ticket(counter_ptr, n_rows, SPLITS, CHUNK)
    y, dy = _load_pair(y_ptr, dy_ptr, row, row_stride, 1, row_stride, 1, cols, n_cols, n_rows)
    part = part_ptr + r * SPLITS
    _publish_dot(y, dy, part, counter_ptr + row, chunk, 0, PACKED)
    _wait(counter_ptr + row, SPLITS)
    splits = tl.arange(0, SPLITS_P2)
    dot = tl.sum(tl.load(part + splits, mask=splits < SPLITS, other=0.0, volatile=True), axis=0)
    tl.store(dx_ptr + r * row_stride + cols, _dx(y, dy, dot, dx_ptr, PACKED), mask=cols < n_cols)


def _words(packed: bool, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows as the kernels take them: 16-bit rows as 32-bit words of two columns where ``packed``."""
    return tuple(t.view(torch.int32) if packed else t for t in tensors)


def _arguments(tensors: tuple, chunk: int, warps: int, packed: bool, **consts) -> tuple[tuple, dict, int, torch.Tensor]:
    """A ticket kernel's arguments over ``tensors`` (their rows contiguous, the first the output), its
    constexprs (with ``consts``), its programs (one per chunk of ``chunk`` columns, words where packed, of a
    row) and the output as the caller sees it."""
    t = _words(packed, *tensors)
    n_rows, n_cols = t[1].shape
    splits = triton.cdiv(n_cols, chunk)
    part = torch.empty((n_rows, 2 * splits), dtype=torch.float32, device=t[0].device)
    counters = torch.zeros(n_rows + 1, dtype=torch.int32, device=t[0].device)
    consts = dict(consts, CHUNK=chunk, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
                  PACKED=sm._pair_format(tensors[0].dtype) if packed else 0)
    return (*t, part, counters, n_rows, n_cols, t[1].stride(0)), consts, n_rows * splits, tensors[0]


def forward_arguments(x: torch.Tensor, out: torch.Tensor, chunk: int, warps: int, packed: bool = False):
    """_arguments of _ticket_forward for softmax of x's rows into out."""
    element = 4 if packed else x.element_size()  # a thread's 16-byte vector: its lanes (kernels._softmax._lanes)
    return _arguments((out, x), chunk, warps, packed, LANES=min(chunk, 16 // element * 32 * warps),
                      EVEN=_words(packed, x)[0].shape[1] % chunk == 0)


def backward_arguments(y: torch.Tensor, dy: torch.Tensor, chunk: int, warps: int, packed: bool = False):
    """_arguments of _ticket_backward for dx, from softmax output y and its gradient dy."""
    return _arguments((torch.empty_like(y), y, dy), chunk, warps, packed)


def run(kernel, warps: int, arguments: tuple) -> torch.Tensor:
    """Launch ``kernel`` with ``arguments`` (forward_arguments' or backward_arguments'); returns the output."""
    args, consts, programs, out = arguments
    kernel[(programs,)](*args, **consts, num_warps=warps)
    return out


def fits(kernel, warps: int, arguments: tuple) -> bool:
    """Do a row's programs all fit on the GPU at once (the condition under which no launch can hang)? Counted as
    kernels._softmax counts its split launches' programs (_resident), from the compiled kernel."""
    args, consts, _, _ = arguments
    key = (kernel, torch.cuda.current_device(), warps, tuple(sorted(consts.items())))
    sm._compiled[key] = kernel.warmup(*args, **consts, num_warps=warps, grid=(1,))
    return sm._resident(*key) * sm._sms(args[0].device) >= consts["SPLITS"]


def ticket_forward(x: torch.Tensor, out: torch.Tensor, chunk: int, warps: int, packed: bool = False) -> torch.Tensor:
    """Softmax of x's rows (contiguous) into out by _ticket_forward."""
    return run(_ticket_forward, warps, forward_arguments(x, out, chunk, warps, packed))


def ticket_backward(y: torch.Tensor, dy: torch.Tensor, chunk: int, warps: int, packed: bool = False) -> torch.Tensor:
    """dx for softmax output y and its gradient dy (rows contiguous) by _ticket_backward."""
    return run(_ticket_backward, warps, backward_arguments(y, dy, chunk, warps, packed))


def check() -> None:
    """Rows of one chunk (widths that fill it and not; -inf in a row), fp32 and fp16, as they are and packed (fp16
    in 32-bit words), forward and backward, against torch."""
    for dtype, packed in ((torch.float32, False), (torch.float16, False), (torch.float16, True)):
        for n_rows, n_cols, chunk in ((5, 256, 256), (3, 200, 256), (4, 64, 64)):
            x = torch.randn(n_rows, n_cols).to(dtype)
            x[1, :30] = -float("inf")
            words = chunk // 2 if packed else chunk
            tol = dict(atol=1e-6 if dtype == torch.float32 else 1e-3, rtol=0)
            y = ticket_forward(x, torch.empty_like(x), words, 4, packed)
            torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), **tol)
            dy = torch.randn(n_rows, n_cols).to(dtype)
            want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
            torch.testing.assert_close(ticket_backward(y, dy, words, 4, packed).float(), want, **tol)
    print("interpreter check passed")


def measure(widths: list[int], rounds: int) -> list[dict]:
    rows = []
    for dtype, sizes in SIZES.items():
        for n in widths:
            x = torch.randn(max(1, BYTES // (n * dtype.itemsize)), n, device="cuda").to(dtype)
            out, y, dy, base = torch.empty_like(x), torch.softmax(x, -1), torch.randn_like(x), copy_gbps(x)
            directions = {"forward": (lambda: softmax(x, out=out), _ticket_forward,
                                      lambda *a: forward_arguments(x, out, *a), torch.softmax(x.float(), -1), 2),
                          "backward": (lambda: softmax_backward(y, dy), _ticket_backward,
                                       lambda *a: backward_arguments(y, dy, *a),
                                       torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32), 3)}
            for direction, (public, kernel, arguments, want, tensors) in directions.items():
                runs = [("public", public)]
                for (chunk, warps), packed in ((s, p) for s in sizes for p in ((False, True) if dtype.itemsize == 2
                                                                                  else (False,))):
                    words = chunk // 2 if packed else chunk  # the same columns a program
                    label = f"ticket {chunk}/{warps}{' packed' if packed else ''}"
                    if fits(kernel, warps, arguments(words, warps, packed)):
                        runs.append((label, lambda k=kernel, a=arguments, c=words, w=warps, p=packed:
                                     run(k, w, a(c, w, p))))
                    else:
                        print(f"{dtype} {n} {direction}: {label} skipped: a row's programs do not fit at once")
                rows += timed_rounds(runs, want, tensors * x.numel() * x.element_size(), base, rounds,
                                     direction=direction, dtype=str(dtype)[6:], n_cols=n, n_rows=x.shape[0])
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, args.rounds), [65536, 262144, 2**20])
