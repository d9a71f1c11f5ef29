"""Softmax: correctness for any width, the writeup's bug (claims 5-8), numerical stability (claim 4),
and fused vs torch vs naive multi-op time and bytes (claim 12)."""
from __future__ import annotations

import warnings

import torch

from ..measure import BF16_IN_INTERPRETER, bench, is_gpu, randn, runnable, timing_rows
from ..table import needs_gpu, row
from ..verify import max_abs_diff, softmax_atol
from . import experiment


@experiment()
def correctness(s: dict) -> list[dict]:
    from kernels import softmax, softmax_ref

    rows = []
    for dtype_name in s["dtypes"]:
        atol = softmax_atol(dtype_name)
        for n_rows, n_cols in s["shapes"]:
            params = dict(dtype=dtype_name, n_rows=n_rows, n_cols=n_cols, atol=atol)
            if not runnable(dtype_name):
                rows.append(row("max_abs_diff", None, status="needs_gpu", error=BF16_IN_INTERPRETER, **params))
                continue
            x = randn([n_rows, n_cols], dtype_name, s["seed"])
            diff = max_abs_diff(softmax(x), softmax_ref(x))
            rows.append(row("max_abs_diff", diff, **params))
            rows.append(row("matches_torch", diff <= atol, "bool", **params))
    return rows


@experiment()
def bug(s: dict) -> list[dict]:
    """Sweep n_cols across the hard-coded 1024 in both modes.

    Columns dropped are counted exactly: the output is pre-filled with NaN, so a column still NaN after
    the call was never written. The max abs diff is read from an output that starts as zeros, so the
    unwritten columns count as 0 rather than as whatever memory happened to hold.
    """
    from kernels import softmax, softmax_ref

    rows, atol = [], softmax_atol("float32")
    for n_cols in s["n_cols"]:
        x = randn([s["n_rows"], n_cols], "float32", s["seed"])
        ref = softmax_ref(x)
        for mode, block_size in (("hardcoded", s["block_size"]), ("dynamic", None)):
            params = dict(variant=mode, n_rows=s["n_rows"], n_cols=n_cols, dtype="float32",
                          block_size=block_size or 0, expected_dropped=max(0, n_cols - s["block_size"]) if block_size else 0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sentinel = softmax(x, block_size, out=torch.full_like(x, float("nan")))
                zeroed = softmax(x, block_size, out=torch.zeros_like(x))
            dropped = int(sentinel.isnan().all(dim=0).sum().item())
            diff = max_abs_diff(zeroed, ref)
            rows += [row("columns_dropped", dropped, "columns", **params),
                     row("max_abs_diff", diff, **params),
                     row("matches_torch", torch.allclose(zeroed, ref, atol=atol, rtol=0), "bool", atol=atol, **params),
                     row("warnings_raised", len(caught), "count", **params)]
    return rows


@experiment()
def stability(s: dict) -> list[dict]:
    """Large inputs: the kernel subtracts the row max; exp(x) alone overflows to inf and gives NaN."""
    from kernels import softmax, softmax_naive

    rows = []
    for scale in s["scales"]:
        x = randn([s["n_rows"], s["n_cols"]], "float32", s["seed"], scale)
        ref = torch.softmax(x.double(), dim=-1)
        for provider, out in (("triton_fused", softmax(x)), ("naive_exp", softmax_naive(x))):
            params = dict(provider=provider, scale=scale, n_rows=s["n_rows"], n_cols=s["n_cols"],
                          max_input=x.abs().max().item())
            finite = out.isfinite()
            rows.append(row("nonfinite_fraction", 1 - finite.float().mean().item(), "fraction", **params))
            rows.append(row("max_abs_diff", max_abs_diff(out[finite], ref[finite]) if finite.any() else None,
                            **params))
    return rows


@experiment(timing=True)
def performance(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("timing softmax")]
    from kernels import softmax, softmax_unfused

    rows, m = [], s["n_rows"]
    for dtype_name in s["dtypes"]:
        for n in s["n_cols"]:
            x = randn([m, n], dtype_name, s["seed"])
            b = m * n * x.element_size()
            # Fused and torch.softmax: read x once, write once. Naive: max (read x), x - max (read, write),
            # exp (read, write), sum (read), divide (read two, write): 8 passes over an M x N tensor.
            peers = (("triton_fused", lambda: softmax(x), 2 * b),
                     ("torch_softmax", lambda: torch.softmax(x, dim=-1), 2 * b),
                     ("torch_naive", lambda: softmax_unfused(x), 8 * b))
            for provider, fn, moved in peers:
                rows += timing_rows(bench(fn, **s["bench"]), moved / 1e9, "GB", provider=provider,
                                    n_rows=m, n_cols=n, dtype=dtype_name, bytes=moved)
    return rows
