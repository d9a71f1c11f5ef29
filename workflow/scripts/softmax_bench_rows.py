"""What the softmax bench scripts (bench_softmax_staged.py, bench_softmax_ahead.py) share: one timed and
checked CSV row per run, the copy each run is a fraction of, and the summary of a table of them."""
from __future__ import annotations

import os


def copy_gbps(t) -> float:
    """GB/s of a device copy of tensor ``t`` (one read, one write; do_bench median): what a run's GB/s is divided by."""
    import torch
    import triton.testing

    out = torch.empty_like(t)
    return 2 * t.numel() * t.element_size() / triton.testing.do_bench(lambda: out.copy_(t), rep=100) / 1e6


def timed(fn, ref, moved: int, copy_gbps: float, tol: float, **labels) -> dict:
    """``labels`` and fn's GB/s (``moved`` bytes over the do_bench median), its fraction of the copy timed beside
    it, and its largest error relative to ref's largest value (ok: within ``tol``); a run that does not compile
    or launch is a row too, its error said."""
    import triton.testing

    row = dict(labels, ok=False, error="")
    try:
        err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
        gbps = moved / triton.testing.do_bench(fn, rep=60) / 1e6
        row.update(gbps=gbps, of_copy=gbps / copy_gbps, rel_err=err, ok=err <= tol)
    except Exception as e:  # noqa: BLE001  (a size that does not compile or launch is a data point)
        row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
    print(row, flush=True)
    return row


def summarize(table) -> None:
    """The best run of each direction, dtype and width, the public kernel's beside it; then what went wrong."""
    ok = table[table.ok]
    best = ok.loc[ok.groupby(["direction", "dtype", "n_cols", ok.sizes == "public"]).of_copy.idxmax()]
    print(best[["direction", "dtype", "n_cols", "sizes", "of_copy"]].round(3).to_string(index=False))
    bad = table[~table.ok]  # wrong, or failed (its error said)
    if len(bad):
        print(f"{len(bad)} runs wrong or failed:", os.linesep, bad.to_string(index=False))
