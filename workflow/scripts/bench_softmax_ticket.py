"""A split forward with no lockstep: one program per chunk of a row, taken in the order programs start (GPU only;
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
copy's are: an SM that runs slow takes fewer chunks. What it gives up: the committed kernel's row-ahead
(publishing the next row and loading the one after while it waits), since a program has one chunk.

Each row of the CSV: the public forward and the ticket forward at each size (chunk columns, warps), timed in
turn over ``--rounds``, fraction of a copy of the same tensor, error against torch, the GPU's clocks.

``--check`` runs the ticket kernel in the interpreter with rows of one chunk (the interpreter runs programs one
after another, so a program waiting for a later one would wait forever; rows of several chunks need the GPU),
against torch.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax
from kernels._softmax import LOG2E, _combined, _load_chunk, _publish, _store, _wait
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps, timed_rounds  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
SIZES = {torch.float32: [(4096, 4), (2048, 4), (8192, 8)], torch.bfloat16: [(8192, 4), (4096, 4), (16384, 8)]}


@triton.jit
def _ticket_forward(out_ptr, x_ptr, part_ptr, counter_ptr, n_rows, n_cols, row_stride, CHUNK: tl.constexpr,
                    SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, LANES: tl.constexpr, EVEN: tl.constexpr):
    """counter_ptr: n_rows arrival counters, then the launch's ticket counter, all zero at the launch."""
    ticket = tl.atomic_add(counter_ptr + n_rows, 1)  # this program's place in the order programs start
    row = ticket // SPLITS
    chunk = ticket % SPLITS
    r = tl.cast(row, tl.int64)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = _load_chunk(x_ptr, row, row_stride, cols, 1, n_cols, n_rows, EVEN, 0)
    part = part_ptr + r * (2 * SPLITS)  # [max of each chunk..., sum of exp of each chunk...]
    e, m = _publish(x, part, counter_ptr + row, chunk, SPLITS, 0, 0, LANES)
    _wait(counter_ptr + row, SPLITS)
    splits = tl.arange(0, SPLITS_P2)
    ms = tl.load(part + splits, mask=splits < SPLITS, other=-float("inf"), volatile=True)
    ls = tl.load(part + SPLITS + splits, mask=splits < SPLITS, other=0.0, volatile=True)
    row_max, total = _combined(ms, ls)
    scale = tl.exp2((m - row_max) * LOG2E) / total  # a lane's
    y = tl.reshape(tl.reshape(e, [CHUNK // LANES, LANES]) * scale[None, :], [CHUNK])
    _store(out_ptr + r * row_stride + cols, y.to(out_ptr.dtype.element_ty), cols < n_cols, EVEN)


def _arguments(x: torch.Tensor, out: torch.Tensor, chunk: int, warps: int) -> tuple[tuple, dict]:
    n_rows, n_cols = x.shape
    splits = triton.cdiv(n_cols, chunk)
    part = torch.empty((n_rows, 2 * splits), dtype=torch.float32, device=x.device)
    counters = torch.zeros(n_rows + 1, dtype=torch.int32, device=x.device)
    lanes = min(chunk, 16 // x.element_size() * 32 * warps)
    return (out, x, part, counters, n_rows, n_cols, x.stride(0)), dict(
        CHUNK=chunk, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), LANES=lanes, EVEN=n_cols % chunk == 0,
        num_warps=warps)


def ticket_forward(x: torch.Tensor, out: torch.Tensor, chunk: int, warps: int) -> torch.Tensor:
    """Softmax of x's rows (contiguous) into out by _ticket_forward."""
    args, consts = _arguments(x, out, chunk, warps)
    _ticket_forward[(x.shape[0] * consts["SPLITS"],)](*args, **consts)
    return out


def fits(x: torch.Tensor, chunk: int, warps: int) -> bool:
    """Do a row's programs all fit on the GPU at once (the condition under which no launch can hang)?"""
    from triton.runtime import driver

    args, consts = _arguments(x, torch.empty_like(x), chunk, warps)
    compiled = _ticket_forward.warmup(*args, **consts, grid=(1,))
    compiled._init_handles()
    props = driver.active.utils.get_device_properties(x.device.index or 0)
    per_sm = min(props["max_num_regs"] // max(1, compiled.n_regs * 32 * warps), 2048 // (32 * warps))
    if compiled.metadata.shared:
        per_sm = min(per_sm, props["max_shared_mem"] // compiled.metadata.shared)
    return per_sm * sm._sms(x.device) >= consts["SPLITS"]


def check() -> None:
    """Rows of one chunk (widths that fill it and not), fp32 and fp16, -inf in a row, against torch."""
    for dtype in (torch.float32, torch.float16):
        for n_rows, n_cols, chunk in ((5, 256, 256), (3, 200, 256), (4, 64, 64)):
            x = torch.randn(n_rows, n_cols).to(dtype)
            x[1, :30] = -float("inf")
            out = ticket_forward(x, torch.empty_like(x), chunk, 4)
            tol = 1e-6 if dtype == torch.float32 else 1e-3
            torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=tol, rtol=0)
    print("interpreter check passed")


def measure(widths: list[int], rounds: int) -> list[dict]:
    rows = []
    for dtype, sizes in SIZES.items():
        for n in widths:
            x = torch.randn(max(1, BYTES // (n * dtype.itemsize)), n, device="cuda").to(dtype)
            out, want, base = torch.empty_like(x), torch.softmax(x.float(), -1), copy_gbps(x)
            runs = [("public", lambda: softmax(x, out=out))]
            for chunk, warps in sizes:
                if fits(x, chunk, warps):
                    runs.append((f"ticket {chunk}/{warps}", lambda c=chunk, w=warps: ticket_forward(x, out, c, w)))
                else:
                    print(f"{dtype} {n}: ticket {chunk}/{warps} skipped: a row's programs do not fit at once")
            rows += timed_rounds(runs, want, 2 * x.numel() * x.element_size(), base, rounds, direction="forward",
                                 dtype=str(dtype)[6:], n_cols=n, n_rows=x.shape[0])
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, args.rounds), [65536, 262144, 2**20])
