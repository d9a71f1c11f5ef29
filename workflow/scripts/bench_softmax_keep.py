"""The packed split forward keeping each chunk's exps (GPU only; not part of the pipeline): a design for 16-bit rows
wider than 131072 columns, to measure.

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_keep.py out.csv [--widths 262144,1048576] [--rounds 3]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_keep.py --check    # the CPU, Triton's interpreter

kernels/_softmax.py's packed split forward (16-bit rows held as 32-bit words of two columns) takes two exps per
element: one for its chunk's partial sum, one for the output, because it keeps the chunk as loaded (packed, half
an fp32 chunk's registers) rather than its exps. At copy speed on the H200 (4252 GB/s over 132 SMs at 1.98 GHz:
16.3 bytes a clock an SM, 4 bytes a bf16 element read and written) that is about 8 exps a clock an SM, half of
what its special-function units issue (16); fp32's one exp per 8 bytes is an eighth. The committed H200 run at
4c54920 had the bf16 forward at 0.666 / 0.627 of copy at 262144 / 2^20 columns (fp32 0.759 / 0.755), the H100
run at 72fecaa 0.826 / 0.768 (fp32 0.899 / 0.873).

Here (kernels/_softmax.py's KEEP, off by default) the chunk's exps (of x minus each lane's max) are packed in its
place, rounded to the rows' 16-bit format by the GPU's paired conversion, and the output is each lane's exps times
one scale (exp(lane max - row max) / row sum): a multiply where there was an exp, in no more registers (built for
sm_90 with CI's triton, 8192 columns on 4 warps: 128 a thread against 156; MUFU instructions 187 against 246). The
price is a second rounding: the output is within about one unit in the last place of the correctly rounded
softmax, against half a unit (the ``ulps`` column: the largest distance from torch's fp32 softmax rounded to the
rows' format, in units of that format).

Measured once on an H100 80GB HBM3 (at bddd77b, one round, 512 rows of 262144 or 128 of 2^20 columns, copy timed
beside each): at 2^20 columns the kept exps led at every size, by 0.01-0.06 of copy (best 0.832 bf16 / 0.829 fp16
at 8192/w4, against the committed form's 0.821 / 0.816); at 262144 the best were the committed form's 0.858 /
0.852 (8192/w4) against 0.846 / 0.846 (8192/w8). But the same sizes moved by up to 0.38 between the two forms in
both directions (8192/w4 bf16: 0.858 committed, 0.476 kept; 8192/w8: 0.651 and 0.846), and the public call,
the same launch as the committed form at 8192/w4, ran at 0.674 against its 0.858 for bf16 rows of 262144 columns
and 0.755 against 0.821 at 2^20 (fp16 0.853 / 0.852, 0.817 / 0.816): the split path's run-to-run spread is larger
than the difference measured, so nothing was decided (hence ``--rounds``). Both forms were within 1 ulp.

Again on another H100 80GB HBM3 (at 0525a35, ``--rounds 3``; median, lowest-highest): each size's median held
within 0.005 across rounds apart from single slow timings (lowest 0.259 for the committed form at 8192/w4, bf16,
262144), but sizes moved between the two sessions (kept 8192/w4 at 262144: 0.476 then, 0.656 now). At 2^20 the kept
exps led: 0.836 (0.835-0.840) bf16 and 0.830 fp16 at 8192/w4, against the committed form's 0.819 / 0.822 and the
public call's 0.824 / 0.821; at 262144 the committed form did: public 0.858 / 0.854, committed 8192/w4 0.855 /
0.856, kept at best 0.845 / 0.846 (8192/w8). A gain of 0.01-0.015 at 2^20 alone, inside what one session to the
next moves: KEEP stays off. Not yet run on an H200, where the exps' share of the special-function units is the
larger.

For each width and 16-bit dtype it times the public ``softmax`` (the committed defaults), the committed packed
split forward and this one over chunk sizes, each checked against torch, beside a copy of the same tensor
(do_bench medians; fractions of that copy), ``--rounds`` times in turn, one CSV row per measurement, and prints
the best of each (over rounds: the median, with the lowest and highest).
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax
from softmax_bench_rows import copy_gbps, timed_rounds  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
SIZES = [(4096, 4), (4096, 8), (8192, 4), (8192, 8), (16384, 8), (16384, 16)]  # chunk, warps


def forward_keep(x: torch.Tensor, chunk: int, warps: int, **overrides) -> torch.Tensor:
    """The packed split forward with KEEP at these sizes (``overrides`` as kernels._softmax.launch_settings takes
    them)."""
    out = torch.empty_like(x)
    assert sm._settings(x.shape[1], (x, out), False, dict(segment=0, chunk=chunk, warps=warps, packed=True,
                                                          keep=True, **overrides)).keep, "rows that do not pack"
    return sm._forward(x, out, segment=0, chunk=chunk, warps=warps, packed=True, keep=True, **overrides)


def forward_packed(x: torch.Tensor, chunk: int, warps: int) -> torch.Tensor:
    """The committed packed split forward at these sizes."""
    return sm._forward(x, torch.empty_like(x), segment=0, chunk=chunk, warps=warps, packed=True)


def ulps(out: torch.Tensor, x: torch.Tensor) -> int:
    """The largest distance of ``out`` (a softmax, so >= 0: its bit patterns order as its values) from torch's
    fp32 softmax of ``x`` rounded to out's format, in units in the last place of that format."""
    want = torch.softmax(x.float(), -1).to(out.dtype)
    return int((out.view(torch.int16).int() - want.view(torch.int16).int()).abs().max())


def check() -> None:
    """This kernel against torch in the interpreter, fp16 (bf16 arithmetic is wrong there): several chunks a row
    (two launches there: the partials, then the output from x), one chunk a row (one launch: the output from the
    kept exps), more rows than the launcher's groups, widths that fill the chunks and not, a row of -inf but for
    one column, columns of -inf; within 1 ulp of the correctly rounded softmax."""
    for n_rows, n_cols, chunk in ((5, 256, 64), (7, 300, 64), (4, 1000, 128), (5, 256, 256), (7, 200, 256)):
        x = torch.randn(n_rows, n_cols).to(torch.float16)
        x[1, :40] = -float("inf")
        x[2, 1:] = -float("inf")
        for warps in (1, 2):
            out = forward_keep(x, chunk, warps, row_limit=16)  # narrow rows split too
            torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1e-2)
            assert ulps(out, x) <= 1, ulps(out, x)
    print("interpreter check passed")


def measure(widths: list[int], rounds: int) -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for n in widths:
            m = max(1, BYTES // (n * dtype.itemsize))
            x = torch.randn(m, n, device="cuda", dtype=torch.float32).to(dtype)
            want = torch.softmax(x.float(), -1)
            copy_rate = copy_gbps(x)
            runs = [("public", lambda: softmax(x))]
            runs += [(f"{form} {c}/w{w}", lambda c=c, w=w, f=f: f(x, c, w))
                     for c, w in SIZES if c <= n for form, f in (("packed", forward_packed), ("keep", forward_keep))]
            timed_here = timed_rounds(runs, want, 2 * x.numel() * dtype.itemsize, copy_rate, rounds,
                                      direction="forward", dtype=str(dtype)[6:], n_cols=n, n_rows=m)
            distance = {label: ulps(fn(), x) for label, fn in runs
                        if not any(r["error"] for r in timed_here if r["sizes"] == label)}
            rows += [dict(row, ulps=distance.get(row["sizes"])) for row in timed_here]
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, args.rounds), [131072, 262144, 524288, 2**20])
