"""The bf16 split backward with its chunks held packed, two bf16 in each 32-bit word (GPU only; not part of the
pipeline), a row ahead or a row at a time, for rows wider than 32768 columns; to be measured.

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_packed.py out.csv [--widths 262144,1048576]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_packed.py --check    # the CPU, Triton's interpreter

kernels/_softmax.py's split backward runs a row ahead for fp32 rows (0.94 of copy at 2^20 columns on an H100)
but not for bf16 ones, where the same kernel ran at 0.67-0.75 (bench_softmax_ahead.py). Its sm_90a builds hold a
bf16 chunk in about as many registers as an fp32 one (rows ahead, 4096 columns x 8 warps: 121 registers a
thread against 128), so a bf16 program keeps half the bytes in flight an fp32 one of the same occupancy does.
Here y, dy and dx are seen as int32 words (torch's view of contiguous rows of even width), each word two bf16
columns: a program holds and loads words, and converts them to fp32 only to use them, so that its registers
hold bytes at bf16's size. dx is rounded to bf16 by integer arithmetic (to nearest, ties to even; NaN stays
NaN), which also runs in Triton's interpreter, where bf16 arithmetic does not.

For each width it times the public ``softmax_backward`` (the defaults) and the packed kernel over its sizes and
both orders, each checked against torch, beside a copy of the same tensor (do_bench medians; fractions of that
copy), one CSV row per measurement, and prints the best of each.
"""
from __future__ import annotations

import argparse
import sys

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax_backward
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps, summarize, timed  # a sibling: scripts run with their folder on sys.path

BYTES = 2**28
SIZES = [(2048, 4), (4096, 4), (4096, 8), (8192, 4), (8192, 8), (8192, 16), (16384, 16)]  # bf16 columns, warps


@triton.jit
def _unpack(w):
    """A word's two bf16 as fp32: the low half is the even column (little-endian), the high half the odd."""
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_bits(x):
    """x rounded to bf16 (to nearest, ties to even; a NaN stays a quiet NaN), its 16 bits in the low half."""
    u = x.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, rounded)


@triton.jit
def _load_words(y_ptr, dy_ptr, row, y_row, dy_row, words, n_words, n_rows):
    present = sm._row_mask(words, n_words, row, n_rows)
    r = tl.cast(row, tl.int64)
    return (tl.load(y_ptr + r * y_row + words, mask=present, other=0),
            tl.load(dy_ptr + r * dy_row + words, mask=present, other=0))


@triton.jit
def _dot(y, dy):
    y_even, y_odd = _unpack(y)
    dy_even, dy_odd = _unpack(dy)
    return tl.sum(y_even * dy_even + y_odd * dy_odd, axis=0)


@triton.jit
def split_backward_packed(dx_ptr, y_ptr, dy_ptr, part_ptr, counter_ptr, n_rows, n_cols, y_row, dy_row, dx_row,
                          n_groups, CHUNK: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                          PHASE: tl.constexpr, AHEAD: tl.constexpr):
    """kernels/_softmax.py's _split_backward on words: n_cols, CHUNK and the row strides count words."""
    pid = tl.program_id(0)
    group = pid // SPLITS
    chunk = pid % SPLITS
    words = chunk * CHUNK + tl.arange(0, CHUNK)
    splits = tl.arange(0, SPLITS_P2)
    y, dy = _load_words(y_ptr, dy_ptr, group, y_row, dy_row, words, n_cols, n_rows)
    if AHEAD:
        if PHASE != 2:
            tl.store(part_ptr + tl.cast(group, tl.int64) * SPLITS + chunk, _dot(y, dy))
            if PHASE == 0:
                sm._arrive(counter_ptr + group)
        y_next, dy_next = _load_words(y_ptr, dy_ptr, group + n_groups, y_row, dy_row, words, n_cols, n_rows)
    for row in range(group, n_rows, n_groups):
        r = tl.cast(row, tl.int64)
        part = part_ptr + r * SPLITS
        if AHEAD:
            if PHASE != 2:
                if row + n_groups < n_rows:
                    tl.store(part_ptr + (r + n_groups) * SPLITS + chunk, _dot(y_next, dy_next))
                    if PHASE == 0:
                        sm._arrive(counter_ptr + row + n_groups)
            y_after, dy_after = _load_words(y_ptr, dy_ptr, row + 2 * n_groups, y_row, dy_row, words, n_cols, n_rows)
        else:
            if PHASE != 2:
                tl.store(part + chunk, _dot(y, dy))
            y_after, dy_after = _load_words(y_ptr, dy_ptr, row + n_groups, y_row, dy_row, words, n_cols, n_rows)
            if PHASE == 0:
                sm._arrive(counter_ptr + row)
        if PHASE == 0:
            sm._wait(counter_ptr + row, SPLITS)
        if PHASE != 1:
            dot = tl.sum(tl.load(part + splits, mask=splits < SPLITS, other=0.0, volatile=True), axis=0)
            y_even, y_odd = _unpack(y)
            dy_even, dy_odd = _unpack(dy)
            dx = _bf16_bits(y_even * (dy_even - dot)) | (_bf16_bits(y_odd * (dy_odd - dot)) << 16)
            tl.store(dx_ptr + r * dx_row + words, dx.to(tl.int32, bitcast=True), mask=words < n_cols)
        if AHEAD:
            y, dy = y_next, dy_next
            y_next, dy_next = y_after, dy_after
        else:
            y, dy = y_after, dy_after


def backward(y: torch.Tensor, dy: torch.Tensor, chunk: int, warps: int, ahead: bool) -> torch.Tensor:
    """dx for bf16 rows of even width with unit column strides, ``chunk`` bf16 columns a program."""
    if y.dtype != torch.bfloat16 or y.shape[1] % 2 or y.stride(1) != 1 or dy.stride(1) != 1:
        raise ValueError("packed: bf16 rows of even width, unit column strides")
    dx = torch.empty_like(y)
    words = [t.view(torch.int32) for t in (dx, y, dy)]
    sm._split_launch(split_backward_packed, dict(dx_ptr=words[0], y_ptr=words[1], dy_ptr=words[2],
                                                 y_row=words[1].stride(0), dy_row=words[2].stride(0),
                                                 dx_row=words[0].stride(0)),
                     y.shape[0], y.shape[1] // 2, sm.Settings(True, 1, 0, chunk // 2, warps), 1, AHEAD=ahead)
    return dx


def _bits(x: torch.Tensor) -> torch.Tensor:
    """_bf16_bits on the CPU through the interpreter, for its check."""
    out = torch.empty(x.numel(), dtype=torch.int32)

    @triton.jit
    def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i, _bf16_bits(tl.load(x_ptr + i, mask=i < n)).to(tl.int32, bitcast=True), mask=i < n)

    kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out


def check() -> None:
    """In the interpreter: the rounding against torch's on ties, subnormals, infinities and NaN; then dx against
    torch's backward rounded to bf16 (the kernel's sum, in another order, may move a value by an ulp), rows of
    several chunks (two launches) and of one chunk (the one-launch form), ragged widths, more rows than
    programs. bf16 tensors are made and compared by torch alone: the kernel itself does no bf16 arithmetic."""
    x = torch.tensor([1.0, 1.00390625, 1.01171875, -2.5e-39, 1e-45, 3.4e38, float("inf"), -float("inf"),
                      float("nan"), -0.0] + torch.randn(1000).tolist())
    want = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    got = _bits(x)
    assert torch.equal(got[~x.isnan()], want[~x.isnan()]), "rounding"
    assert got[x.isnan()].to(torch.int16).view(torch.bfloat16).isnan().all()
    for n_rows, n_cols, chunk in ((5, 256, 64), (3, 100, 64), (7, 64, 64), (300, 40, 64)):
        y = torch.softmax(torch.randn(n_rows, n_cols) * 3, -1).to(torch.bfloat16)
        dy = torch.randn(n_rows, n_cols).to(torch.bfloat16)
        want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
        for ahead in (False, True):
            got = backward(y, dy, chunk, 4, ahead).float()
            torch.testing.assert_close(got, want, atol=2**-8 * want.abs().max().item(), rtol=2**-8)
    print("interpreter check passed")


def measure(widths: list[int]) -> list[dict]:
    rows = []
    for n in widths:
        m = max(1, BYTES // (n * 2))
        y = torch.softmax(torch.randn(m, n, device="cuda"), -1).to(torch.bfloat16)
        dy = torch.randn_like(y)
        want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
        copy_rate = copy_gbps(y)
        runs = [("public", lambda: softmax_backward(y, dy))]
        runs += [(f"packed {'ahead' if a else 'row'} {c}/w{w}", lambda c=c, w=w, a=a: backward(y, dy, c, w, a))
                 for c, w in SIZES if c <= n for a in (True, False)]
        for label, fn in runs:
            rows.append(timed(fn, want, 3 * y.numel() * 2, copy_rate, 2e-2, direction="backward", dtype="bfloat16",
                              n_cols=n, n_rows=m, sizes=label))
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
    summarize(table)


if __name__ == "__main__":
    main()
