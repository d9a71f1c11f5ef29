"""Who the split path waits for: each program's waits at the rows' counters, timed on the GPU, launch by launch
(GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_trace.py out.csv [--widths 1048576] [--dtype float32]
        [--launches 300]
    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_trace.py --check    # the CPU, Triton's interpreter

The split forward's programs stay resident and move through their rows in step: each row's programs wait at its
counter until the last of them has published its partials (kernels/_softmax.py, ``_wait``). Timed again and
again, it runs at 0.59 to 0.92 of copy, slow in spells a few timings long, at constant clocks
(bench_softmax_spread.py). If one SM runs slow for a while, every group with a program on it waits for that
program, where a copy's blocks would go to the other SMs. This installs a ``_wait`` that records, for every wait
of every program, the GPU's clock (``%globaltimer``, ns) on entering and on leaving it, the row's counter and
the SM it ran on (``%smid``); then times ``--launches`` launches of the public forward one by one (the L2
flushed before each, as do_bench does), reading the records after each. Per launch (one CSV row): its time
and fraction of a copy of the same tensor; ``lag_us``, the mean over rows of how long after the median
program the last one began to wait (the time the others spend waiting for it); ``straggler_sm``, the SM
holding the last program most often, and ``straggler_share``, how often. Slow launches whose lag is large and
whose stragglers sit on one SM or a few would say that one slow SM sets the pace.

``--check`` runs the public forward with the traced wait installed in the interpreter, against torch: there the
split path runs as two launches that never wait, so it checks the installation, not the records.

H100 80GB HBM3, 2026-12-07, 300 launches each (the polls back to back, as ``_wait`` was then): no SM set the
pace. fp32 rows of 2^20 columns (512 programs): the last program of a row began its wait 4.8-7.1 us after the
median one (mean 6.0), in slow launches as in fast ones (6.04 against 5.95 us); the SM most often last held 13-66%
of a launch's rows, a different SM from launch to launch (46 most often: 7 launches of 300). bf16 rows of
262144 columns (384 programs): lag 4.3-5.3 us, the most often last SM 5-23% of rows, 38-72 SMs last at least once
per launch. The records cost much: traced launches ran at 0.26-0.47 of copy, so the lag is an upper bound, and
that day's untraced timings did not spread (bench_softmax_backoff.py).
"""
from __future__ import annotations

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax
from kernels._triton import tl, triton
from softmax_bench_rows import copy_gbps  # a sibling: scripts run with their folder on sys.path

BYTES = 2**28
# Set by install(), before any kernel compiles (the kernels read them as constants of their build): the address of
# the int64 records, and how many programs and waits per program they have room for
TRACE_AT = tl.constexpr(0)
N_PROGRAMS, N_SLOTS = 4096, 1024
PROGRAMS, SLOTS = tl.constexpr(N_PROGRAMS), tl.constexpr(N_SLOTS)


@triton.jit
def _clock(after):
    """The GPU's ns clock, read after ``after`` is known."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _sm(after):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [after], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_traced(counter_ptr, target):
    """kernels._softmax._wait, recording (entered, left, counter, SM) in the program's next slot; the first
    PROGRAMS int64 of the records count each program's waits."""
    entered = _clock(target)
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    left = _clock(seen)
    records = tl.full([], TRACE_AT, tl.int64).to(tl.pointer_type(tl.int64))
    pid = tl.program_id(0)
    slot = tl.atomic_add(records + pid, 1)
    if (pid < PROGRAMS) & (slot < SLOTS):
        at = records + PROGRAMS + (pid.to(tl.int64) * SLOTS + slot) * 4
        tl.store(at, entered)
        tl.store(at + 1, left)
        tl.store(at + 2, counter_ptr.to(tl.int64))
        tl.store(at + 3, _sm(seen).to(tl.int64))


def install(device: str) -> torch.Tensor:
    """kernels._softmax's waits replaced by _wait_traced, recording into the int64 tensor returned."""
    global TRACE_AT
    records = torch.zeros(N_PROGRAMS + N_PROGRAMS * N_SLOTS * 4, dtype=torch.int64, device=device)
    TRACE_AT = tl.constexpr(records.data_ptr())
    sm._wait = _wait_traced
    return records


def check() -> None:
    """The public forward, forced onto the split path at a small width, with the traced wait installed: right
    against torch (fp32, fp16)."""
    install("cpu")
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(5, 300).to(dtype)
        assert sm._settings(300, (x, x), False, dict(row_limit=16, chunk=64, segment=0)).split
        out = sm._forward(x, torch.empty_like(x), row_limit=16, chunk=64, segment=0)
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=tol, rtol=0)
    print("interpreter check passed")


def summary(records: torch.Tensor) -> dict:
    """One launch's records: lag_us (mean over rows of the last program's start of waiting after the median
    program's), the SM holding the last program most often and how often, the programs and rows seen."""
    import pandas as pd

    counts = records[:N_PROGRAMS].clamp(max=N_SLOTS).cpu()
    used = int(counts.max())
    waits = records[N_PROGRAMS:].view(N_PROGRAMS, N_SLOTS, 4)[:, :used].cpu()
    taken = torch.arange(used)[None, :] < counts[:, None]
    w = pd.DataFrame(waits[taken].numpy(), columns=["entered", "left", "counter", "sm"])
    by_row = w.groupby("counter").entered
    last = w[w.entered == by_row.transform("max")].drop_duplicates("counter").sm.value_counts()
    return dict(programs=int((counts > 0).sum()), rows=len(by_row), lag_us=(by_row.max() - by_row.median()).mean() / 1e3,
                straggler_sm=int(last.index[0]), straggler_share=last.iloc[0] / len(by_row), straggler_sms=len(last))


def measure(widths: list[int], dtype_name: str, launches: int) -> list[dict]:
    records = install("cuda")
    dtype = getattr(torch, dtype_name)
    flush = torch.empty(2**28, dtype=torch.int8, device="cuda")  # as do_bench clears L2 before each run
    rows = []
    for n in widths:
        x = torch.randn(max(1, BYTES // (n * dtype.itemsize)), n, device="cuda").to(dtype)
        out, base = torch.empty_like(x), copy_gbps(x)
        softmax(x, out=out)  # compiled, its programs sized
        err = ((out.float() - torch.softmax(x.float(), -1)).abs().max()).item()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(launches):
            records[:N_PROGRAMS].zero_()
            flush.zero_()
            start.record()
            softmax(x, out=out)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            row = dict(dtype=dtype_name, n_cols=n, n_rows=x.shape[0], launch=i, ms=ms,
                       of_copy=2 * x.numel() * x.element_size() / ms / 1e6 / base, max_err=err, **summary(records))
            rows.append(row)
            if i % 25 == 0:
                print(row, flush=True)
    import pandas as pd

    table = pd.DataFrame(rows)
    table["slow"] = table.of_copy < table.groupby("n_cols").of_copy.transform("median") * 0.9
    print(table.groupby(["n_cols", "slow"])[["of_copy", "lag_us", "straggler_share", "straggler_sms"]].median()
          .round(3).to_string())
    print(table[table.slow].groupby("n_cols").straggler_sm.value_counts().head(20).to_string())
    return rows


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the CSV to write")
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[2**20])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--check", action="store_true", help="the interpreter check (CPU), nothing timed")
    args = parser.parse_args()
    if args.check:
        check()
    elif not args.out:
        sys.exit("give the CSV to write (or --check)")
    else:
        import pandas as pd

        pd.DataFrame(measure(args.widths, args.dtype, args.launches)).to_csv(args.out, index=False)
