"""What the wait at a row's counter costs the wide softmax paths (GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_wait.py out.csv [--widths 131072,1048576]

Rows wider than 32768 (65536) columns are shared by a group of programs (the split path) or walked in segments
(the two-pass path) that meet at the row's counter (kernels/_softmax.py, ``_wait``). The committed run has the
wide forwards at 0.58-0.88 of copy and the backwards at 0.67-0.89 (tune_softmax.py has the sweeps). This times
the public softmax and softmax_backward at those widths with ``_wait`` in three forms, each in a process of its
own (the kernels compile once per process, with the form the module holds):

- ``atomic``: the committed form, one thread polling with an atomic add of 0 (acquire), which Triton builds as
  an acquire load (``ld.global.gpu.acquire``; bench_softmax_backoff.py);
- ``relaxed``: every thread polling with a relaxed load (``ld.relaxed.gpu``, no read-modify-write on the
  line the arrivals add to), then one ``fence.acq_rel.gpu``;
- ``none``: no wait at all: wrong results (the ``ok`` column says so), and the speed the paths would have if
  the meeting cost nothing: the bound on what any better wait can give;
- ``no_exchange``: as ``none``, and the split forward publishes no partials either (no stores of them, no
  arrival): what reading and writing the rows alone costs it (wrong results);
- ``no_store``: the committed wait, and the forwards store no output (Triton then drops the output's
  arithmetic): what reading the rows and exchanging partials costs (wrong results). With the committed form
  and ``no_exchange`` this splits the split forward's time between reading, the exchange and writing.

For the split forward in fp32 it also times other chunk sizes (``chunk``/``warps`` columns). Each row of the CSV:
form, direction, dtype, width, sizes, GB/s, the fraction of a copy of the same tensor timed in that process,
the max error against torch.

What bounds the split forward besides the wait, read from its sm_90 build (triton 3.6, ptxas -v, unit column
strides as Triton specializes them): it holds three rows' chunks in registers (this one, the next, whose
partials it publishes before the wait, and the one after, whose loads are in flight), so fp32 chunks of 4096
on 4 warps take 128 registers a thread: 4 programs an SM, 64 KB of each row a step per SM, about 8.4 MB a step
on 132 SMs (chunks of 8192 on 8 warps: 128 registers, 2 programs, the same 64 KB; on 4 warps 254 registers).
Shared memory is left unused (16-128 B).

Measured on an H100 80GB HBM3 (torch 2.11, triton 3.6, kernels at db1f13a, before the split forward's one exp
per element; fractions of copy, 131072 / 2^20 columns):

| path | atomic (committed) | relaxed | none | no_exchange |
|---|---|---|---|---|
| forward fp32, default (split 4096/4) | 0.92 / 0.86 | 0.83 / 0.84 | 0.88 / 0.83 | 0.93 / 0.92 |
| forward bf16, default (two-pass) | 0.88 / 0.68 | 0.88 / 0.60 | 0.88 / 0.79 | 0.88 / 0.79 |
| backward fp32 | 0.96 / 0.78 | 0.76 / 0.72 | 0.91 / 0.92 | 0.91 / 0.92 |
| backward bf16 | 0.82 / 0.70 | 0.70 / 0.69 | 0.80 / 0.59 | 0.80 / 0.86 |

So the wait itself is not what the forwards lose: with no wait at all the split forward runs no faster
(0.83-0.88 against 0.86-0.92), and polling with relaxed loads is slower than the one atomic everywhere. What
they lose is the exchange: with no partials published (no chunk max and sum, no stores of them, no arrival)
fp32 at 2^20 runs at 0.92 against 0.86, bf16's two-pass at 0.79 against 0.68. The backward differs
(``no_exchange`` changes only the forwards, so its backward columns are a second process of ``none``): without
the wait fp32 at 2^20 runs at 0.92 against 0.78 (at 131072 0.91 against 0.96), and bf16 at 2^20 measured 0.59
and 0.86 in the two processes, the spread between processes seen before at that width (tune_softmax.py).
Other chunk sizes for the split forward in fp32 stay within 0.81-0.87 at 2^20. ``no_store``
reads above 1 of copy (the output is not written, and the count includes it) and is no guide for bf16's
two-pass path, where Triton drops the loads with the store. The one exp per element that followed (the chunk's
exp kept from its partial sum) is the first cut at the exchange's arithmetic.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pandas as pd
import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward
from kernels._triton import tl, triton

BYTES = 2**28
FORMS = ("atomic", "relaxed", "none", "no_exchange", "no_store")
FP32_FORWARD_SIZES = ((4096, 4), (8192, 4), (8192, 8), (16384, 16))


@triton.jit
def _ld_relaxed(ptr):
    return tl.inline_asm_elementwise("ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _fence_after(x):
    return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _wait_relaxed(counter_ptr, target):
    seen = _ld_relaxed(counter_ptr)
    while seen < target:
        seen = _ld_relaxed(counter_ptr)
    _fence_after(seen)


@triton.jit
def _wait_none(counter_ptr, target):
    pass


@triton.jit
def _publish_none(x, part, counter, chunk, SPLITS: tl.constexpr, PHASE: tl.constexpr, PACKED: tl.constexpr,
                  LANES: tl.constexpr = 1):
    return x, tl.full([LANES], 0.0, tl.float32)  # _publish's (e, lanes' m) without computing or sharing a partial


@triton.jit
def _store_none(ptrs, value, mask, EVEN: tl.constexpr):
    pass


def measure(form: str, widths: list[int]) -> list[dict]:
    # before any kernel compiles: the kernels resolve these from the module at compile time
    if form in ("relaxed", "none", "no_exchange"):
        sm._wait = _wait_relaxed if form == "relaxed" else _wait_none
    if form == "no_exchange":
        sm._publish = _publish_none
    if form == "no_store":
        sm._store = _store_none
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in widths:
            x = torch.randn(max(1, BYTES // (n * dtype.itemsize)), n, device="cuda", dtype=dtype)
            y, dy = torch.softmax(x, -1), torch.randn_like(x)
            want_dx = torch._softmax_backward_data(dy, y, -1, dtype)
            copy = torch.empty_like(x)
            copy_gbps = 2 * x.numel() * dtype.itemsize / triton.testing.do_bench(lambda: copy.copy_(x), rep=100) / 1e6
            runs = [("forward", "default", lambda: softmax(x), y, 2), ("backward", "default",
                                                                         lambda: softmax_backward(y, dy), want_dx, 3)]
            if dtype == torch.float32:
                for chunk, warps in FP32_FORWARD_SIZES:
                    out = torch.empty_like(x)
                    runs.append(("forward", f"split {chunk}/{warps}", lambda c=chunk, w=warps, o=out: sm._forward(
                        x, o, row_limit=1, chunk=c, warps=w, segment=0), y, 2))
            for direction, sizes, fn, want, tensors in runs:
                err = (fn().float() - want.float()).abs().max().item()
                gbps = tensors * x.numel() * dtype.itemsize / triton.testing.do_bench(fn, rep=100) / 1e6
                rows.append(dict(form=form, direction=direction, dtype=str(dtype)[6:], n_cols=n, n_rows=x.shape[0],
                                 sizes=sizes, gbps=gbps, of_copy=gbps / copy_gbps, max_err=err,
                                 ok=err <= (1e-5 if dtype == torch.float32 else 2e-2)))
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")],
                        default=[65536, 131072, 262144, 2**20])
    parser.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)  # a child's one form
    args = parser.parse_args()
    if args.form:
        pd.DataFrame(measure(args.form, args.widths)).to_csv(args.out, index=False)
        return
    parts = []
    for form in FORMS:
        part = f"{args.out}.{form}.csv"
        widths = ",".join(map(str, args.widths))
        if subprocess.run([sys.executable, __file__, part, "--widths", widths, "--form", form]).returncode == 0:
            parts.append(pd.read_csv(part))
            os.remove(part)
    pd.concat(parts).to_csv(args.out, index=False)
    table = pd.concat(parts).pivot_table(index=["direction", "dtype", "n_cols", "sizes"], columns="form",
                                         values="of_copy")
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
