"""The wide softmax paths a row ahead (GPU only; not part of the pipeline): the split backward's forms (a row
at a time or ahead; bf16 packed or not), a row-ahead two-pass forward and the packed split forward (bf16), for
rows wider than 32768 columns.

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_ahead.py out.csv [--widths 262144,1048576]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_ahead.py --check    # the CPU, Triton's interpreter

The split backward (kernels/_softmax.py) publishes a row's partial (its chunk's sum(y * dy)), issues the next
row's loads, then arrives at the row's counter and waits there at once: every program of a group meets the
slowest at every row. bench_softmax_wait.py measured what that costs on an H100: without the wait (wrong
results) the fp32 backward at 2^20 columns ran at 0.92 of copy against 0.78. Its AHEAD form runs a row ahead
as the split forward does: it holds this row's and the next row's chunks of y and dy, publishes and arrives for
the next row before it waits for this one, and has the row after that in flight (three rows of two tensors).
Its PACKED form holds bf16 rows as 32-bit words, two columns each, unpacked only at use and dx rounded to bf16 (by
integer arithmetic at first, now by the GPU's paired conversion, below): the sm_90a builds of the other forms hold
a bf16 chunk in about as many registers as an fp32 one, so that a bf16 program of the same occupancy keeps half
the bytes in flight.

The two-pass forward (bf16 rows wider than 65536 columns) waits likewise: a program walks its segment of a row
for the max and sum, arrives, and waits for the row's other segments before its second walk. Without the
exchange (bench_softmax_wait.py, H100) it ran at 0.79 of copy at 2^20 columns against 0.68. Here it walks the
next row's segment first, arrives for it, and only then waits for this row's partials and makes its second walk:
L2 must then hold two rows' segments of every resident program for the second reads (bf16, one 32-warp program
an SM: 132 x 2 x 128 KiB = 33 MiB with segments of 65536, half that with 32768, of an L2 of about 50 MB).

Measured on an H100 (do_bench medians, fractions of a copy of the same tensor; 65536 / 131072 / 262144 /
524288 / 2^20 columns), against the defaults of the time (fp32 backward a row at a time, chunks of 4096 x 4
warps to 131072 columns, then 8192 x 4):
- fp32 backward a row ahead, 4096 x 8 warps: 0.99 / 1.00 / 0.99 / 0.96 / 0.94 against 0.98 / 0.98 / 0.95 /
  0.86 / 0.78; 2048 x 4 within 0.01 of it, 8192 x 8 and 8192 x 16 0.87-0.98; 8192 x 4 and 16384 x 16 spill
  and run at 0.11-0.15. Kept: the fp32 default (its WIDE entry's form "ahead").
- bf16 backward a row ahead, best of the sizes: 0.75 / 0.74 / 0.72 / 0.70 / 0.67 against 0.95 / 0.92 / 0.90 /
  0.84 / 0.72 a row at a time. Not kept.
- bf16 backward packed, a row ahead, 8192 x 4 warps (255 registers, 48 B of spills): 0.90 / 0.91 / 0.91 / 0.88
  / 0.85 against 0.95 / 0.92 / 0.90 / 0.84 / 0.72 (the defaults); 2048 x 4 0.92 at 65536 then 0.85-0.63; 4096
  x 4 or 8 0.85-0.89 to 262144, 0.60 at 2^20; 8192 x 8 and x 16 (one program an SM) 0.56-0.66. Packed a row at
  a time: 0.90 / 0.89 / 0.86 / 0.75 / 0.66 at best. Kept: packed a row ahead for bf16 rows wider than 262144.
  The pipeline's H100 run at 94f9220 then timed it at 2350 GB/s at 2^20 columns (0.778 of its 3023 GB/s
  copy); on a third H100, three do_bench medians each, twice, with its inputs and with this script's: 2546-2559
  GB/s against a copy of the same tensor at 2956-2964 (0.86); so the run's figure is that GPU's or that
  moment's, not the inputs'.
- bf16 two-pass forward a row ahead, best of the segments: 0.65 at every width against 0.92 / 0.89 / 0.75 /
  0.74 / 0.70. Not kept.
- bf16 split forward packed (rows held as 32-bit words, two exps per element, the output rounded by integer
  arithmetic), best of the sizes: 0.76 / 0.72 / 0.61 / 0.58 / 0.56 (4096 x 8 warps first, 8192 x 4 at 262144)
  against 0.92 / 0.89 / 0.75 / 0.74 / 0.71, on another H100. Not kept then: the second exp, the unpacking and
  the rounding cost more than the registers they free (sm_90a, 4096 x 4 warps: 96 registers against the split
  forward's 127; 8192 x 4: 197 against 237).
- Both packed forms with the output rounded by the GPU's cvt.rn.bf16x2.f32 (two values an instruction;
  kernels/_softmax.py's _pack) instead, on two more H100s: the backward a row ahead, 8192 x 4 warps, 0.98
  / 0.98 / 0.98 / 0.94 at 131072 / 262144 / 524288 / 2^20 against 0.91 / 0.91 / 0.89 / 0.86 with integer
  rounding (two alternated runs each; 4096 x 4 0.60-0.98 by width and run, 4096 x 8 0.62-0.92); at 65536
  0.97-0.98 against 0.95 for the default two-pass (one segment). The forward, 8192 x 4: 0.84 / 0.81 / 0.77 at
  262144 / 524288 / 2^20 against 0.75 / 0.74 / 0.70 for the defaults of the time (two-pass); at 131072 and
  narrower the defaults win (0.89 against 0.85); 4096 x 4 0.64-0.84, 8192 x 8 0.66-0.85, 16384 x 8 or 16
  0.60-0.68. Kept: packed past 131072 columns, both directions (the backward from 131072).
- Two changes to the packed forward's partials, on two more H100s (scratch bench, alternated twice each): the
  row's partials combined in one block reduction of (max, sum) pairs (online softmax's combine) instead of a max
  and then a sum, 0.823-0.828 / 0.786 / 0.773-0.774 against 0.814-0.816 / 0.742-0.743 / 0.755-0.757 at 262144 /
  524288 / 2^20 (8192 x 4); then each chunk's partials taken per lane (a thread's own words) and combined once,
  so that its exps wait for no block-wide max: 0.854-0.857 / 0.813-0.816 / 0.809-0.812 against 0.832-0.833 /
  0.799-0.800 / 0.794-0.798 (and 0.88 against 0.85 at 131072; 8192 x 8 0.83-0.86 against 0.70-0.72 to 262144,
  0.66-0.69 past it; 4096 x 4 and 16384 x 8 0.60-0.86, below 8192 x 4 everywhere). Issuing the loads of the
  row after next before publishing the next row's partials (so that they fly during it) lost 0.03-0.07: its
  sm_90a build takes 191 registers against 156, two programs an SM instead of three. Kept: both changes, and
  the lane partials for the unpacked split forward too: fp32 (the public default, 4096 x 4) 0.92 / 0.92 / 0.90
  against 0.92 / 0.90 / 0.88 at 262144 / 524288 / 2^20 (121 registers against 119: four programs an SM still).
- fp16 rows packed the same way (words of two fp16, converted at use, dx and the output rounded by the GPU's
  cvt.rn.f16x2.f32), on another H100 (scratch bench, one run; the public defaults of the time beside them:
  two-pass forwards, the backward a row at a time): forward 8192 x 4 0.855 / 0.816 / 0.810 at 262144 / 524288 /
  2^20 against 0.758 / 0.746 / 0.715, at 65536 / 131072 0.878 / 0.883 against 0.936 / 0.891; backward 0.962 /
  0.979 / 0.980 / 0.975 / 0.915 at 65536 .. 2^20 against 0.950 / 0.938 / 0.905 / 0.824 / 0.697; 4096 x 4
  below 8192 x 4 everywhere (0.65-0.94). Kept: the "packed" entries for fp16 rows too (the bf16 widths).

Registers a thread and spills of the sm_90a builds (triton 3.9, ptxas, rows of 2^20 columns, unit column
strides, 16-divisible pointers and row strides), the row-ahead backward against the row-at-a-time one,
chunk/warps: fp32 2048/4 128 (96), 4096/4 240 (183), 4096/8 128 (103), 8192/8 241 (187), 8192/16 128 (108), no
spills; 8192/4 spills 4596 B (92 B), 16384/16 1532 B (68 B). bf16 2048/4 119 (96), 4096/4 219 (183), 4096/8 121
(102), 8192/8 221 (187), 8192/16 113 (109), no spills; 8192/4 spills 478 B (72 B), 16384/16 372 B (136 B);
packed (triton 3.9, cuobjdump), a row ahead and at a time: 4096/4 168, 133; 4096/8 99, 72; 8192/4 255 (48 B
of stack), 237; 8192/8 180, 142; 8192/16 100, 79; 16384/16 128 (48 B), 128 (none). The
row-ahead two-pass forward (bf16, FAST, unmasked) against _two_pass_forward, segment/chunk/warps: 32768/8192/16 49
(48), 32768/16384/16 64 (64), 65536/16384/16 64 (64), 65536/32768/32 53 (53); spills 8 B at chunks of 16384 (none).

For each width and dtype it times the public ``softmax_backward`` and (bf16) ``softmax`` (the defaults), the
split backward in each form, and the row-ahead and packed forwards, over their sizes, each checked against
torch, beside a copy of the same tensor (do_bench medians; fractions of that copy), one CSV row per
measurement, and prints the best of each.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps, timed  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
SIZES = [(2048, 4), (4096, 4), (4096, 8), (8192, 4), (8192, 8), (8192, 16), (16384, 16)]  # backward: chunk, warps
PACKED_SIZES = [(4096, 4), (4096, 8), (8192, 4), (8192, 8), (8192, 16), (16384, 8), (16384, 16)]  # forward
SEGMENTS = [(32768, 8192, 16), (32768, 16384, 16), (65536, 16384, 16), (65536, 32768, 32)]  # forward: segment, chunk, warps


@triton.jit
def _first_walk(x_ptr, part, counter, row, x_row, x_col, part_index, first, end, CHUNK: tl.constexpr,
                SPLITS: tl.constexpr, PHASE: tl.constexpr, EVEN: tl.constexpr):
    """_two_pass_forward's first walk of one row's segment: its max and sum of exp, published at ``part``
    (asking L2 to keep the lines for the second walk), then (PHASE 0) an arrival at the row's counter."""
    r = tl.cast(row, tl.int64)
    offsets = tl.arange(0, CHUNK)
    m = tl.full([], -float("inf"), tl.float32)
    total = tl.full([], 0.0, tl.float32)
    for start in range(first, end, CHUNK):
        cols = start + offsets
        x = sm._load(x_ptr + r * x_row + cols * x_col, cols < end, -float("inf"), EVEN, "evict_last")
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a chunk of -inf sums to 0, not NaN
        total = total * tl.exp2((m - m_safe) * sm.LOG2E) + tl.sum(tl.exp2((x - m_safe) * sm.LOG2E), axis=0)
        m = m_new
    tl.store(part + part_index, m)
    tl.store(part + SPLITS + part_index, total)
    if PHASE == 0:
        sm._arrive(counter)


@triton.jit
def two_pass_forward_ahead(out_ptr, x_ptr, part_ptr, counter_ptr, n_rows, n_cols, x_row, x_col, out_row, out_col,
                           n_groups, SEGMENT: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                           SPLITS_P2: tl.constexpr, PHASE: tl.constexpr, FAST: tl.constexpr, EVEN: tl.constexpr):
    """_two_pass_forward (rows of two segments or more), the next row's first walk before this row's wait."""
    tl.static_assert(SPLITS > 1, "a row of one segment waits for no one: kernels/_softmax.py's path")
    group, part_index, first, end = sm._segment(n_cols, SEGMENT, SPLITS, True)
    offsets = tl.arange(0, CHUNK)
    splits = tl.arange(0, SPLITS_P2)
    if PHASE != 2:
        _first_walk(x_ptr, part_ptr + tl.cast(group, tl.int64) * (2 * SPLITS), counter_ptr + group, group, x_row,
                    x_col, part_index, first, end, CHUNK, SPLITS, PHASE, EVEN)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        if PHASE != 2:
            if row + n_groups < n_rows:  # the next row's partials first: the row's segments have a walk's time
                _first_walk(x_ptr, part_ptr + (r + n_groups) * (2 * SPLITS), counter_ptr + row + n_groups,
                            row + n_groups, x_row, x_col, part_index, first, end, CHUNK, SPLITS, PHASE, EVEN)
        if PHASE != 1:
            if PHASE == 0:
                sm._wait(counter_ptr + row, SPLITS)
            part = part_ptr + r * (2 * SPLITS)
            ms = tl.load(part + splits, mask=splits < SPLITS, other=-float("inf"), volatile=True)
            ls = tl.load(part + SPLITS + splits, mask=splits < SPLITS, other=0.0, volatile=True)
            row_max = tl.max(ms, axis=0)
            scale = 1.0 / tl.sum(ls * tl.exp2((ms - row_max) * sm.LOG2E), axis=0)
            log2_scale = tl.log2(scale)
            for start in range(first, end, CHUNK):
                cols = start + offsets
                x = sm._load(x_ptr + r * x_row + cols * x_col, cols < end, 0.0, EVEN, "evict_first")
                if FAST:
                    y = tl.exp2(tl.fma(x - row_max, sm.LOG2E, log2_scale))
                else:
                    y = tl.exp2((x - row_max) * sm.LOG2E) * scale
                sm._store(out_ptr + r * out_row + cols * out_col, y.to(out_ptr.dtype.element_ty), cols < end, EVEN)


def forward_packed(x: torch.Tensor, chunk: int, warps: int) -> torch.Tensor:
    """The split forward holding 16-bit rows as words (kernels/_softmax.py, PACKED), ``chunk`` columns a program."""
    out = torch.empty_like(x)
    settings = dict(segment=0, chunk=chunk, warps=warps, packed=True)
    assert sm._settings(x.shape[1], (x, out), False, settings).packed, "rows that do not pack"
    return sm._forward(x, out, **settings)


def forward_arguments(x: torch.Tensor, out: torch.Tensor) -> dict:
    return dict(out_ptr=out, x_ptr=x, x_row=x.stride(0), x_col=x.stride(1), out_row=out.stride(0),
                out_col=out.stride(1))


def forward(x: torch.Tensor, segment: int, chunk: int, warps: int) -> torch.Tensor:
    """Through kernels/_softmax.py's launcher: one cooperative launch on a GPU, two (partials, then output)
    in the interpreter."""
    out = torch.empty_like(x)
    cfg = sm.Settings(True, 1, 0, chunk, warps, segment)
    sm._split_launch(two_pass_forward_ahead, forward_arguments(x, out), *x.shape, cfg, 2,
                     EVEN=sm._covers(x.shape[1], cfg), FAST=x.element_size() <= 2)
    return out


def forward_phased(x: torch.Tensor, segment: int, chunk: int, groups: int) -> torch.Tensor:
    """Two launches (partials, then output) of ``groups`` row groups, fewer than the rows: each program walks
    several rows, the next row's partials published from the loop, as in the one-launch form (which the
    interpreter cannot run: it runs programs one after another, and a program there waits for later ones)."""
    n_rows, n_cols = x.shape
    splits = triton.cdiv(n_cols, segment)
    out = torch.empty_like(x)
    part = torch.empty((n_rows, 2 * splits), dtype=torch.float32, device=x.device)
    counter = torch.zeros(n_rows, dtype=torch.int32, device=x.device)
    for phase in (1, 2):
        two_pass_forward_ahead[(groups * splits,)](
            **forward_arguments(x, out), part_ptr=part, counter_ptr=counter, n_rows=n_rows, n_cols=n_cols,
            n_groups=groups, SEGMENT=segment, CHUNK=chunk, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
            PHASE=phase, FAST=False, EVEN=n_cols % chunk == 0 and segment % chunk == 0)
    return out


FORMS = {"ahead": dict(ahead=True, packed=False), "row": dict(ahead=False, packed=False),
         "packed ahead": dict(ahead=True, packed=True), "packed row": dict(ahead=False, packed=True)}


def backward(y: torch.Tensor, dy: torch.Tensor, chunk: int, warps: int, form: str) -> torch.Tensor:
    return sm._backward(y, dy, segment=0, chunk=chunk, warps=warps, **FORMS[form])


def check() -> None:
    """The row-ahead forward against torch in the interpreter, fp32 and fp16 (the split backward's forms are
    kernels/_softmax.py's, tested in tests/test_softmax.py, as is the packed forward): rows of several segments,
    widths that do and do not fill the chunks, more rows than programs (the phased launches), transposed
    strides."""
    for dtype in (torch.float32, torch.float16):
        for n_rows, n_cols, segment, chunk in ((5, 128, 64, 32), (7, 100, 32, 16), (4, 97, 64, 32)):
            x = torch.randn(n_rows, n_cols).to(dtype)
            x[1, :40] = -float("inf")
            want = torch.softmax(x.float(), -1)
            tol = 1e-6 if dtype == torch.float32 else 1e-3
            torch.testing.assert_close(forward(x, segment, chunk, 4).float(), want, atol=tol, rtol=0)
            for groups in (1, 2, 3):
                torch.testing.assert_close(forward_phased(x, segment, chunk, groups).float(), want, atol=tol, rtol=0)
            xt = x.t().contiguous().t()  # column strides > 1
            torch.testing.assert_close(forward(xt, segment, chunk, 4).float(), want, atol=tol, rtol=0)
    print("interpreter check passed")


def measure(widths: list[int], directions: list[str]) -> list[dict]:
    rows = []
    halves = (torch.bfloat16, torch.float16)
    for dtype in (torch.float32, *halves) if "backward" in directions else halves:
        for n in widths:
            m = max(1, BYTES // (n * dtype.itemsize))
            x = torch.randn(m, n, device="cuda", dtype=torch.float32)
            y = torch.softmax(x, -1).to(dtype)
            x = x.to(dtype)
            dy = torch.randn_like(y)
            want = {"forward": torch.softmax(x.float(), -1),
                    "backward": torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)}
            copy_rate = copy_gbps(y)
            runs = [("backward", "public", lambda: softmax_backward(y, dy))]
            forms = list(FORMS) if dtype.itemsize == 2 else ["ahead", "row"]
            runs += [("backward", f"{form} {c}/w{w}", lambda c=c, w=w, f=form: backward(y, dy, c, w, f))
                     for c, w in SIZES if c <= n for form in forms]
            if dtype.itemsize == 2:  # fp32 rows this wide take the split forward, already a row ahead
                runs.append(("forward", "public", lambda: softmax(x)))
                runs += [("forward", f"ahead {sg}/{c}/w{w}", lambda sg=sg, c=c, w=w: forward(x, sg, c, w))
                         for sg, c, w in SEGMENTS if sg < n]
                runs += [("forward", f"packed {c}/w{w}", lambda c=c, w=w: forward_packed(x, c, w))
                         for c, w in PACKED_SIZES if c <= n]
            for direction, label, fn in (run for run in runs if run[0] in directions):
                moved = (2 if direction == "forward" else 3) * y.numel() * dtype.itemsize
                rows.append(timed(fn, want[direction], moved, copy_rate, direction=direction, dtype=str(dtype)[6:],
                                  n_cols=n, n_rows=m, sizes=label))
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, args.directions),
               [65536, 131072, 262144, 524288, 2**20],
               lambda parser: parser.add_argument("--directions", type=lambda s: s.split(","),
                                                  default=["forward", "backward"]))
