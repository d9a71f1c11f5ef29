"""Softmax: correctness for any width (forward and backward), the writeup's bug and its fix past Triton's
largest block (claims 5-8, 16, 19), numerical stability (claim 4), the passes each implementation makes
(claim 17), sizes past 2**31 elements (claim 20), and the improved kernel, the writeup's, torch and the
naive multi-op version timed forward and backward at every row width (claim 12)."""
from __future__ import annotations

import warnings

import torch

from .. import isolated
from ..measure import BF16_IN_INTERPRETER, bench, cuda_kernels, is_gpu, probe_rows, randn, runnable, timing_rows
from ..measure import dtype as to_dtype
from ..table import needs_gpu, row
from ..verify import max_abs_diff, softmax_atol
from . import experiment


@experiment()
def correctness(s: dict) -> list[dict]:
    """The improved softmax against torch, forward and (dx for a random dy) backward, at every shape."""
    return _against_torch(s["shapes"], s["dtypes"], s["seed"])


def _against_torch(shapes, dtypes, seed: int, interpreter_max_cols: int | None = None) -> list[dict]:
    from kernels import softmax, softmax_backward, softmax_ref

    rows = []
    for dtype_name in dtypes:
        atol = softmax_atol(dtype_name)
        for n_rows, n_cols in shapes:
            for direction in ("forward", "backward"):
                params = dict(dtype=dtype_name, n_rows=n_rows, n_cols=n_cols, direction=direction,
                              atol=atol if direction == "forward" else BACKWARD_SLACK * atol)
                if not runnable(dtype_name):
                    rows.append(row("max_abs_diff", None, status="needs_gpu", error=BF16_IN_INTERPRETER, **params))
                    continue
                if interpreter_max_cols and not is_gpu() and n_cols > interpreter_max_cols:
                    rows.append(needs_gpu(f"a row of {n_cols} columns (minutes in the interpreter)", **params))
                    continue
                x = randn([n_rows, n_cols], dtype_name, seed)
                if direction == "forward":
                    diff = max_abs_diff(softmax(x), softmax_ref(x))
                else:
                    y, dy = softmax_ref(x), randn([n_rows, n_cols], dtype_name, seed + 1)
                    ref = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
                    diff = max_abs_diff(softmax_backward(y, dy), ref)
                rows.append(row("max_abs_diff", diff, **params))
                rows.append(row("matches_torch", diff <= params["atol"], "bool", **params))
    return rows


# dx = y * (dy - sum(y * dy)) rounds a difference of two terms: its tolerance is a few times the forward's
BACKWARD_SLACK = 4


@experiment()
def bug(s: dict) -> list[dict]:
    """Sweep n_cols across the hard-coded 1024 in both modes of the writeup's kernel (hard-coded block,
    and block sized to the row: the writeup's fix), up to past Triton's largest block.

    Columns dropped are counted exactly: the output is pre-filled with NaN, so a column still NaN after
    the call was never written. The max abs diff is read from an output that starts as zeros, so the
    unwritten columns count as 0 rather than as whatever memory happened to hold. A call that raises
    (the fix asks for a block past Triton's largest) is a row with status 'raised' and the error.
    """
    from triton.language import TRITON_MAX_TENSOR_NUMEL

    from kernels import softmax_ref, softmax_writeup

    rows, atol = [], softmax_atol("float32")
    for n_cols in s["n_cols"]:
        x = randn([s["n_rows"], n_cols], "float32", s["seed"])
        ref = softmax_ref(x)
        for mode, block_size in (("hardcoded", s["block_size"]), ("dynamic", None)):
            params = dict(variant=mode, n_rows=s["n_rows"], n_cols=n_cols, dtype="float32",
                          block_size=block_size or 0, expected_dropped=max(0, n_cols - s["block_size"]) if block_size else 0,
                          max_block=TRITON_MAX_TENSOR_NUMEL)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    sentinel = softmax_writeup(x, block_size, out=torch.full_like(x, float("nan")))
                    zeroed = softmax_writeup(x, block_size, out=torch.zeros_like(x))
                except Exception as e:  # noqa: BLE001  (how it breaks is the result)
                    rows.append(row("raised", True, "bool", status="raised", error=f"{type(e).__name__}: {e}"[:2000],
                                    **params))
                    continue
            dropped = int(sentinel.isnan().all(dim=0).sum().item())
            diff = max_abs_diff(zeroed, ref)
            # What the written columns hold: the softmax of the first block_size columns alone?
            first = min(n_cols, block_size or n_cols)
            first_diff = max_abs_diff(sentinel[:, :first], softmax_ref(x[:, :first]))
            rows += [row("columns_dropped", dropped, "columns", **params),
                     row("max_abs_diff", diff, **params),
                     row("exact_match", torch.equal(zeroed, ref), "bool", **params),
                     row("matches_torch", torch.allclose(zeroed, ref, atol=atol, rtol=0), "bool", atol=atol, **params),
                     row("warnings_raised", len(caught), "count", **params),
                     row("diff_vs_softmax_of_written_columns", first_diff, written_columns=first, atol=atol, **params)]
    return rows


@experiment()
def wide(s: dict) -> list[dict]:
    """The project's softmax past Triton's largest block (forward and backward against torch): rows the
    writeup's fix cannot hold in one block. Widths above interpreter_max_cols run only on a GPU (the
    interpreter runs the split path's programs one after another: minutes per row there)."""
    return _against_torch([[s["n_rows"], n] for n in s["n_cols"]], s["dtypes"], s["seed"], s["interpreter_max_cols"])


@experiment()
def limits(s: dict) -> list[dict]:
    """Past 2**31 elements (GPU only): the writeup's kernel as printed (int32 row offsets) and the project's
    softmax, forward and backward, each in its own process (a fault poisons the CUDA context)."""
    rows = []
    for n_rows, n_cols in s["shapes"]:
        for provider in ("triton_writeup", "triton_fused"):
            params = dict(provider=provider, n_rows=n_rows, n_cols=n_cols, elements=n_rows * n_cols, dtype=s["dtype"],
                          atol=softmax_atol(s["dtype"]))
            if not is_gpu():
                rows.append(needs_gpu(f"{n_rows * n_cols} elements (GPU memory)", **params))
                continue
            rows += probe_rows(isolated.call(_probe, provider, n_rows, n_cols, s["dtype"], s["seed"]), **params)
    return rows


def _probe(provider: str, n_rows: int, n_cols: int, dtype_name: str, seed: int) -> dict:
    """Max |diff| against torch.softmax on the first rows, the rows that straddle element 2**31, and the last."""
    from kernels import softmax, softmax_backward, softmax_ref, softmax_writeup

    x = randn([n_rows, n_cols], dtype_name, seed)
    y = (softmax_writeup if provider == "triton_writeup" else softmax)(x)
    torch.cuda.synchronize()
    middle = 2**31 // n_cols
    picks = [slice(0, 4), slice(max(0, middle - 2), middle + 2), slice(n_rows - 4, n_rows)]
    result = {"max_abs_diff": max(max_abs_diff(y[r], softmax_ref(x[r])) for r in picks)}
    if provider == "triton_fused":
        dy = torch.ones_like(x)
        dy[-4:] = randn([4, n_cols], dtype_name, seed + 1)
        dx = softmax_backward(y, dy)
        ref = torch._softmax_backward_data(dy[-4:].float(), y[-4:].float(), -1, torch.float32)
        result["backward_max_abs_diff"] = max_abs_diff(dx[-4:], ref)
    return result


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


def _providers(x: torch.Tensor) -> dict:
    """Forward: provider -> (call, bytes it must move at the least). Fused kernels and torch.softmax: read
    x once, write once. Naive five-op: max (read x), x - max (read, write), exp (read, write), sum (read),
    divide (read two, write): 8 passes over an M x N tensor."""
    from kernels import softmax, softmax_unfused, softmax_writeup

    b = x.numel() * x.element_size()
    return {"triton_fused": (lambda: softmax(x), 2 * b),
            "triton_writeup": (lambda: softmax_writeup(x), 2 * b),
            "torch_softmax": (lambda: torch.softmax(x, dim=-1), 2 * b),
            "torch_naive": (lambda: softmax_unfused(x), 8 * b)}


def _backward_providers(y: torch.Tensor, dy: torch.Tensor) -> dict:
    """Backward, dx from y and dy: read two, write one, for the project's kernel and for torch's own."""
    from kernels import softmax_backward

    b = y.numel() * y.element_size()
    return {"triton_fused": (lambda: softmax_backward(y, dy), 3 * b),
            "torch_softmax": (lambda: torch._softmax_backward_data(dy, y, -1, y.dtype), 3 * b)}


@experiment()
def passes(s: dict) -> list[dict]:
    """How many kernels (passes over memory) each softmax launches, read from the CUDA profiler."""
    if not is_gpu():
        return [needs_gpu("counting the CUDA kernels a call launches")]
    rows = []
    for dtype_name in s["dtypes"]:
        x = randn([s["n_rows"], s["n_cols"]], dtype_name, s["seed"])
        for provider, (fn, moved) in _providers(x).items():
            names = cuda_kernels(fn)
            rows.append(row("cuda_kernels", len(names), "kernels", provider=provider, dtype=dtype_name,
                            n_rows=s["n_rows"], n_cols=s["n_cols"], kernel_names="; ".join(names), bytes=moved,
                            input_bytes=x.numel() * x.element_size()))
    return rows


@experiment(timing=True)
def performance(s: dict) -> list[dict]:
    """Every row width with inputs of the same size (M = input_bytes / row bytes), forward and backward."""
    if not is_gpu():
        return [needs_gpu("timing softmax")]
    rows = []
    for dtype_name in s["dtypes"]:
        for n in s["n_cols"]:
            x = randn([max(1, s["input_bytes"] // (n * to_dtype(dtype_name).itemsize)), n], dtype_name, s["seed"])
            y, dy = torch.softmax(x, dim=-1), torch.randn_like(x)
            forward = _providers(x)
            if n > s["writeup_max_cols"]:
                del forward["triton_writeup"]
            for direction, providers in (("forward", forward), ("backward", _backward_providers(y, dy))):
                for provider, (fn, moved) in providers.items():
                    rows += timing_rows(bench(fn, **s["bench"]), moved / 1e9, "GB", provider=provider,
                                        direction=direction, n_rows=x.shape[0], n_cols=n, dtype=dtype_name,
                                        bytes=moved)
            del x, y, dy
    return rows
