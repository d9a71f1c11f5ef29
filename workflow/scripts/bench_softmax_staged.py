"""The split path with the next rows' chunks staged in shared memory by Triton's pipeliner (GPU only; not part of
the pipeline): a design for rows wider than 32768 columns, measured, not kept (below).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_staged.py out.csv [--widths 131072,1048576] [--quick]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_staged.py --check    # the CPU, Triton's interpreter

kernels/_softmax.py's split path (``_split_forward``, ``_split_backward``) holds its rows' chunks in registers:
the forward three rows' (this one, the next, whose partials it publishes before it waits, and the one after,
whose loads are in flight), the backward two rows' of y and dy. Fp32 chunks of 4096 on 4 warps take 124
registers a thread (the forward), 4 programs an SM: one row ahead in flight while the group waits at the row's counter. The
committed H200 run has the wide forwards at 0.71-0.88 of copy, the backwards at 0.67-0.89 (issue 20 asks 0.85
in fp32, 0.8 in bf16).

Here a program holds one row's chunk in registers and Triton's pipeliner stages the next ``STAGES - 1`` rows'
chunks in shared memory by asynchronous copies (``tl.range(..., num_stages=STAGES)``), so that memory stays busy
while the group waits and the registers stay free for more programs or larger chunks. The pipeliner takes no
loop with ``tl.debug_barrier`` or a nested loop in it (compiled for sm_90 with triton 3.6: no ``cp.async``
with either), and it would stage the partials' loads too, ahead of the wait (it stages volatile loads). So the
meeting at the counter is inline PTX, as CUTLASS's generic barrier does it: ``bar.sync`` then one thread's
``red.release.gpu`` to arrive; one thread polling with ``ld.acquire.gpu``, then ``bar.sync``, to wait; the
partials read by ``ld.relaxed.gpu`` whose operand depends on the wait's result, so nothing moves them ahead of
it. Loads are staged where they move 4 to 16 bytes a thread (cp.async), so a launch's specialization matters:
Triton knows 16-divisible pointers and row strides and vectorizes; built without it (every integer a plain i32) no
16-bit load is staged (two bytes a thread). Built for sm_90 as a launch specializes them (unit column strides
constant, pointers and row strides 16-divisible; triton 3.6, ptxas, chunks of 2^20-column rows, unmasked),
registers a thread and shared memory, no spills: fp32 forward chunks of 4096 / 4 warps / 3 stages 56 and
32784 B (16-byte cp.async), 8192 / 8 / 3 63 and 65568 B; bf16 forward 4096 / 4 / 3 56 and 16400 B, 16384 / 16 /
3 77 and 65600 B; fp32 backward 4096 / 4 / 3 80 and 65552 B; bf16 backward 4096 / 4 / 3 80 and 32784 B. The
committed split kernels, fp32 chunks of 4096 on 4 warps: the forward 124 registers, the backward 183 (two
programs an SM).

Measured on the H200 (triton 3.6, 256 MiB tensors, fractions of a copy of the same tensor in the same process,
every result checked; best of the 15 sizes against the public path, the committed defaults), at 131072 / 2^20
columns: fp32 forward 0.799 (8192/w8/s3) / 0.763 (8192/w8/s2) against 0.757 / 0.728; fp32 backward 0.926 /
0.773 (4096/w4/s2) against 0.872 / 0.718; bf16 forward 0.714 / 0.549 against 0.749 / 0.602; bf16 backward
0.798 / 0.634 (16384/w16/s4) against 0.803 / 0.704. So staging pays in fp32 (+4 to +8%), short of issue 20's 0.85
in the forward, and loses in bf16, where the chunks staged are half the bytes for the same wait at the counter.
Not folded into kernels/_softmax.py: a second split path for a partial gain in one dtype.

For each width, dtype and direction it times the public ``softmax`` / ``softmax_backward`` (the committed
defaults) and the staged kernels over chunk, warps and stages, each checked against torch, beside a copy of the
same tensor (do_bench medians; fractions of that copy), one CSV row per measurement, and prints the best of each.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps, timed  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

LOG2E = sm.LOG2E
BYTES = 2**28
SIZES = [(chunk, warps, stages) for chunk, warps in ((4096, 4), (8192, 8), (16384, 16)) for stages in (2, 3, 4)] \
    + [(2048, 4, 3), (4096, 8, 3), (8192, 4, 3)]
QUICK = [(4096, 4, 3), (8192, 8, 3), (16384, 16, 2)]
SHARED = 200 * 1024  # of the H200's 227 KiB a block, for the staged chunks


@triton.jit
def _arrive(counter_ptr):
    """Count this program in: the CTA's earlier stores (the partials) ordered before one thread's release add."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred q; .reg .u32 t; bar.sync 0; mov.u32 t, %tid.x; setp.eq.u32 q, t, 0; "
        "@q red.release.gpu.global.add.u32 [$1], 1; mov.u32 $0, 0; }",
        "=r,l", [counter_ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait(counter_ptr, target, after):
    """Until the counter reaches target: thread 0 polls (acquire), the CTA meets it at a barrier. ``after``
    (the arrival's result) orders the wait after the arrival."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p, q; .reg .u32 t; mov.u32 $0, $2; add.u32 $0, $0, $3; mov.u32 t, %tid.x; "
        "setp.ne.u32 q, t, 0; @q bra DONE; SPIN: ld.acquire.gpu.global.u32 $0, [$1]; setp.lt.s32 p, $0, $2; "
        "@p bra SPIN; DONE: bar.sync 0; }",
        "=r,l,r,r", [counter_ptr, target, after], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _read(ptrs, after):
    """Loads no pipeliner moves ahead of ``after`` (the wait's result)."""
    return tl.inline_asm_elementwise("ld.relaxed.gpu.global.f32 $0, [$1];", "=f,l,r", [ptrs, after],
                                     dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _partials(part, after, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, OTHER: tl.constexpr, PHASE: tl.constexpr):
    """The SPLITS partials at ``part`` (OTHER past them): after the wait (PHASE 0), or from an earlier launch."""
    splits = tl.arange(0, SPLITS_P2)
    if PHASE == 0:
        return tl.where(splits < SPLITS, _read(part + tl.minimum(splits, SPLITS - 1), after), OTHER)
    return tl.load(part + splits, mask=splits < SPLITS, other=OTHER, volatile=True)


@triton.jit
def split_forward_staged(out_ptr, x_ptr, part_ptr, counter_ptr, n_rows, n_cols, x_row, x_col, out_row, out_col,
                         n_groups, CHUNK: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                         PHASE: tl.constexpr, EVEN: tl.constexpr, STAGES: tl.constexpr):
    """_split_forward's layout and phases, a row at a time, the next rows' loads staged by the pipeliner."""
    pid = tl.program_id(0)
    group = pid // SPLITS
    chunk = pid % SPLITS
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    for row in tl.range(group, n_rows, n_groups, num_stages=STAGES):
        r = tl.cast(row, tl.int64)
        x = sm._load(x_ptr + r * x_row + cols * x_col, cols < n_cols, -float("inf"), EVEN, "")
        part = part_ptr + r * (2 * SPLITS)  # [max of each chunk..., sum of exp of each chunk...]
        token = 0
        if PHASE != 2:
            sm._publish(x, part, counter_ptr + row, chunk, SPLITS, 1, False)  # the partials alone: this kernel arrives below
            if PHASE == 0:
                token = _wait(counter_ptr + row, SPLITS, _arrive(counter_ptr + row))
        if PHASE != 1:
            ms = _partials(part, token, SPLITS, SPLITS_P2, -float("inf"), PHASE)
            ls = _partials(part + SPLITS, token, SPLITS, SPLITS_P2, 0.0, PHASE)
            row_max = tl.max(ms, axis=0)
            total = tl.sum(ls * tl.exp2((ms - row_max) * LOG2E), axis=0)
            y = tl.exp2((x - row_max) * LOG2E) * (1.0 / total)
            sm._store(out_ptr + r * out_row + cols * out_col, y.to(out_ptr.dtype.element_ty), cols < n_cols, EVEN)


@triton.jit
def split_backward_staged(dx_ptr, y_ptr, dy_ptr, part_ptr, counter_ptr, n_rows, n_cols, y_row, y_col, dy_row, dy_col,
                          dx_row, dx_col, n_groups, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
                          SPLITS_P2: tl.constexpr, PHASE: tl.constexpr, EVEN: tl.constexpr, STAGES: tl.constexpr):
    """_split_backward's layout and phases, y and dy of the next rows staged by the pipeliner."""
    pid = tl.program_id(0)
    group = pid // SPLITS
    chunk = pid % SPLITS
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    for row in tl.range(group, n_rows, n_groups, num_stages=STAGES):
        r = tl.cast(row, tl.int64)
        y = sm._load(y_ptr + r * y_row + cols * y_col, cols < n_cols, 0.0, EVEN, "")
        dy = sm._load(dy_ptr + r * dy_row + cols * dy_col, cols < n_cols, 0.0, EVEN, "")
        part = part_ptr + r * SPLITS
        token = 0
        if PHASE != 2:
            tl.store(part + chunk, tl.sum(y * dy, axis=0))
            if PHASE == 0:
                token = _wait(counter_ptr + row, SPLITS, _arrive(counter_ptr + row))
        if PHASE != 1:
            dot = tl.sum(_partials(part, token, SPLITS, SPLITS_P2, 0.0, PHASE), axis=0)
            sm._store(dx_ptr + r * dx_row + cols * dx_col, (y * (dy - dot)).to(dx_ptr.dtype.element_ty),
                      cols < n_cols, EVEN)


def forward(x: torch.Tensor, chunk: int, warps: int, stages: int) -> torch.Tensor:
    out = torch.empty_like(x)
    cfg = sm.Settings(True, 1, 0, chunk, warps)
    sm._split_launch(split_forward_staged, dict(out_ptr=out, x_ptr=x, x_row=x.stride(0), x_col=x.stride(1),
                                                out_row=out.stride(0), out_col=out.stride(1)),
                     *x.shape, cfg, 2, EVEN=sm._covers(x.shape[1], cfg), STAGES=stages)
    return out


def backward(y: torch.Tensor, dy: torch.Tensor, chunk: int, warps: int, stages: int) -> torch.Tensor:
    dx = torch.empty_like(y)
    cfg = sm.Settings(True, 1, 0, chunk, warps)
    sm._split_launch(split_backward_staged, dict(dx_ptr=dx, y_ptr=y, dy_ptr=dy, y_row=y.stride(0), y_col=y.stride(1),
                                                 dy_row=dy.stride(0), dy_col=dy.stride(1), dx_row=dx.stride(0),
                                                 dx_col=dx.stride(1)),
                     *y.shape, cfg, 1, EVEN=sm._covers(y.shape[1], cfg), STAGES=stages)
    return dx


def check() -> None:
    """The phases the interpreter runs (partials, then output), against torch: fp32 and fp16, at widths that do
    and do not fill the chunks, a chunk of -inf and a row of it. Rows of two chunks or more: a row of one chunk takes
    the one-launch form (PHASE 0) in the interpreter too, whose meeting here is inline PTX it cannot run."""
    for dtype in (torch.float32, torch.float16):
        for n_rows, n_cols, chunk in ((5, 96, 32), (3, 100, 32), (4, 128, 64), (3, 101, 32)):
            x = torch.randn(n_rows, n_cols).to(dtype)
            x[1, :40] = -float("inf")
            x[2] = -float("inf")  # NaN, as torch gives
            y, dy = torch.softmax(x.float(), -1).to(dtype), torch.randn(n_rows, n_cols).to(dtype)
            tol = 1e-6 if dtype == torch.float32 else 1e-3
            torch.testing.assert_close(forward(x, chunk, 4, 3), y, atol=tol, rtol=0, equal_nan=True)
            want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(dtype)
            torch.testing.assert_close(backward(y, dy, chunk, 4, 3), want, atol=tol, rtol=0, equal_nan=True)
    print("interpreter check passed")


def measure(widths: list[int], sizes: list[tuple[int, int, int]]) -> list[dict]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in widths:
            x = torch.randn(max(1, BYTES // (n * dtype.itemsize)), n, device="cuda", dtype=dtype)
            y, dy = torch.softmax(x, -1), torch.randn_like(x)
            want = {"forward": y, "backward": torch._softmax_backward_data(dy, y, -1, dtype)}
            copy_rate = copy_gbps(x)
            runs = [("forward", "public", lambda: softmax(x)), ("backward", "public", lambda: softmax_backward(y, dy))]
            for chunk, warps, stages in sizes:
                for direction in ("forward", "backward"):
                    tensors = 1 if direction == "forward" else 2
                    if chunk > n or (stages - 1) * tensors * chunk * dtype.itemsize > SHARED:
                        continue
                    label = f"staged {chunk}/w{warps}/s{stages}"
                    runs.append((direction, label, (lambda c=chunk, w=warps, s=stages: forward(x, c, w, s))
                                 if direction == "forward" else (lambda c=chunk, w=warps, s=stages: backward(y, dy, c, w, s))))
            for direction, label, fn in runs:
                moved = (2 if direction == "forward" else 3) * x.numel() * dtype.itemsize
                rows.append(timed(fn, want[direction].float(), moved, copy_rate, direction=direction,
                                  dtype=str(dtype)[6:], n_cols=n, n_rows=x.shape[0], sizes=label))
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, QUICK if args.quick else SIZES),
               [65536, 131072, 262144, 2**20],
               lambda parser: parser.add_argument("--quick", action="store_true", help=f"only the sizes {QUICK}"))
