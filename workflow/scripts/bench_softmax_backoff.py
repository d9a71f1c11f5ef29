"""Whether backing off between polls of a row's counter steadies the wide softmax paths (GPU only; not part of
the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_backoff.py out.csv [--widths 262144,1048576]
        [--rounds 4] [--sleeps 0,32,128,512]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_backoff.py --check    # the CPU, Triton's interpreter

The split path's programs wait at each row's counter for the rest of their group (kernels/_softmax.py, ``_wait``).
Timed again and again with the same tensors, the same scratch and the GPU at the same clocks, its speed moves by
a third between timings (H100, fp32 rows of 2^20 columns: 0.59 to 0.92 of copy; bench_softmax_spread.py). One
suspect is the polling itself. ``_wait``'s atomic add of 0 is no atomic in the sm_90 build: Triton (3.6 and 3.9
alike) lowers it to one thread's ``ld.global.gpu.acquire``, its value handed to the other threads through shared
memory between two CTA barriers, so that a group's programs (256 at 2^20 fp32 columns) poll one L2 line back
to back while the chip's loads of the rows pass through the same slices. Here every poll that finds the row
not yet complete sleeps first (PTX ``nanosleep.u32``; the hardware sleeps up to about twice the ns asked), for
each of ``--sleeps``. The sleep is read from device memory at each wait, so that one compiled kernel serves
every sleep and the sleeps are timed in turn, round after round, in one process (0: polls back to back, plus that
one load). Forward and backward, bf16 and fp32, the public entry points (each width's default path: the split
path, or the two-pass path where its segments meet at a counter). Each row: sleep, round, GB/s, fraction of a
copy of the same tensor, the error against torch, and the GPU's clocks after the timing. An earlier try
(tune_softmax.py: every thread polling with ``ld.acquire.gpu``, 64 ns between polls) ran slower where the
defaults run, each form timed in a process of its own, before the spread between timings was known; here the
poll stays the committed one, and the sleeps take turns.

H100 80GB HBM3, 2026-12-07, two runs (medians, fraction of copy; sleep 0 / 1024 ns): fp32 forward 0.916 /
0.954 at 262144 columns, 0.890 / 0.938 at 2^20; bf16 forward 0.840 / 0.864 and 0.777 / 0.803; fp32 backward
0.996 / 0.996 and 0.931 / 0.955; bf16 backward 0.951 / 0.954 and 0.883 / 0.923; 64 and 256 ns between, 2048 ns
alike to 1024 (bf16 backward at 262144 0.929), 4096 ns 0.75-0.89, 8192 ns 0.49-0.66. Every timing that day was
steady (low and high within 0.01 of each other but one). kernels/_softmax.py's ``_wait`` took 1024 ns
(``WAIT_SLEEP_NS``), so this bench's sleep 0 is no longer the committed kernel. That kernel built with 0 and
with 1024 (one process each, one round, the same H100 type on 2026-12-08; 0 / 1024): fp32 forward 0.959 / 0.960,
0.923 / 0.951, 0.905 / 0.939 (65536, 262144, 2^20 columns); bf16 forward 0.969 / 0.968, 0.853 / 0.858, 0.812 /
0.813; fp32 backward 0.991 / 0.988, 0.987 / 0.992, 0.944 / 0.969; bf16 backward 0.952 / 0.951, 0.962 / 0.961,
0.881 / 0.931.

``--check`` runs the public kernels with the backoff wait installed in the interpreter, against torch: there
the split paths run as two launches that never wait, so it checks the installation, not the sleep.
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward
from kernels._softmax import _nanosleep
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps, timed  # a sibling: scripts run with their folder on sys.path
from softmax_bench_rows import main as bench_main

BYTES = 2**28
DTYPES = (torch.bfloat16, torch.float32)
# The address of an int32 on the GPU holding the sleep in ns (set by install(), before any kernel compiles:
# the kernels read it as a constant of their build)
SLEEP_AT = tl.constexpr(0)


@triton.jit
def _wait_backoff(counter_ptr, target):
    ns = tl.load(tl.full([], SLEEP_AT, tl.int64).to(tl.pointer_type(tl.int32)))
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < target:
        if ns > 0:
            seen = _nanosleep(ns, seen)
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")


def install(device: str) -> torch.Tensor:
    """kernels._softmax's waits replaced by _wait_backoff, reading its sleep from the int32 returned."""
    global SLEEP_AT
    sleep = torch.zeros(1, dtype=torch.int32, device=device)
    SLEEP_AT = tl.constexpr(sleep.data_ptr())
    sm._wait = _wait_backoff
    return sleep


def check() -> None:
    """The public forward and backward, forced onto the split and two-pass paths at small widths, with the
    backoff wait installed: right against torch (fp32, fp16)."""
    install("cpu")
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(5, 300).to(dtype)
        y, dy = torch.softmax(x.float(), -1), torch.randn(5, 300)
        tol = dict(atol=1e-5, rtol=0) if dtype == torch.float32 else dict(atol=2e-3, rtol=0)
        for segment in (0, 128):  # the split path, the two-pass path
            assert sm._settings(300, (x, x), False, dict(row_limit=16, chunk=64, segment=segment)).split
            out = sm._forward(x, torch.empty_like(x), row_limit=16, chunk=64, segment=segment)
            torch.testing.assert_close(out.float(), y, **tol)
        assert sm._settings(300, (x, x, x), True, dict(row_limit=16, chunk=64, segment=0)).split
        dx = sm._backward(y.to(dtype), dy.to(dtype), row_limit=16, chunk=64, segment=0)
        want = torch._softmax_backward_data(dy.to(dtype).float(), y.to(dtype).float(), -1, torch.float32)
        torch.testing.assert_close(dx.float(), want, **tol)
    print("interpreter check passed")


def measure(widths: list[int], rounds: int, sleeps: list[int]) -> list[dict]:
    sleep = install("cuda")
    rows = []
    for dtype in DTYPES:
        for n in widths:
            x = torch.randn(max(1, BYTES // (n * dtype.itemsize)), n, device="cuda").to(dtype)
            y, dy, out = torch.softmax(x, -1), torch.randn_like(x), torch.empty_like(x)
            runs = [("forward", lambda: softmax(x, out=out), torch.softmax(x.float(), -1), 2),
                    ("backward", lambda: softmax_backward(y, dy),
                     torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32), 3)]
            base = copy_gbps(x)
            for r in range(rounds):
                for direction, fn, want, tensors in runs:
                    for ns in sleeps:
                        sleep.fill_(ns)
                        torch.cuda.synchronize()
                        rows.append(timed(fn, want, tensors * x.numel() * x.element_size(), base, round=r,
                                          sizes=f"sleep {ns}", sleep_ns=ns, direction=direction,
                                          dtype=str(dtype)[6:], n_cols=n, n_rows=x.shape[0]))
    import pandas as pd

    of_copy = pd.DataFrame(rows).query("ok").groupby(["direction", "dtype", "n_cols", "sleep_ns"]).of_copy
    print(pd.DataFrame({"median": of_copy.median(), "low": of_copy.min(), "high": of_copy.max()}).round(3).to_string())
    return rows


if __name__ == "__main__":
    bench_main(__doc__, check, lambda args: measure(args.widths, args.rounds, args.sleeps), [262144, 2**20],
               lambda parser: parser.add_argument("--sleeps", type=lambda s: [int(v) for v in s.split(",")],
                                                  default=[0, 32, 128, 512], help="ns to sleep between polls"))
