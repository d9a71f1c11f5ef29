"""Softmax: correctness for any width (forward and backward), the writeup's bug and its fix past Triton's
largest block (claims 5-8, 16, 19), numerical stability (claim 4), the passes each implementation makes
(claim 17), sizes past 2**31 elements (claim 20), and the improved kernel, the writeup's, torch and the
naive multi-op version timed forward and backward at every row width (claim 12)."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import pandas as pd
import torch
import yaml

from .. import isolated, plots, summary, verify
from ..claims import (FALSE_POINT_HOLDS, NEEDS_GPU, NOT_REPRODUCED, NOT_SETTLED, NUANCE, REPRODUCED, first_line, said,
                      weakest)
from ..measure import BF16_IN_INTERPRETER, bench, cuda_kernels, is_gpu, probe_rows, randn, runnable, timing_rows, wall_seconds
from ..measure import dtype as to_dtype
from ..providers import FUSED, WRITEUP
from ..report import md_table
from ..summary import median, needed, ok
from ..table import needs_gpu, row
from ..verify import max_abs_diff
from . import claim, experiment, figure, section
from .calibration import own_ceiling

if TYPE_CHECKING:  # annotations only: pyplot is imported on first use (plots.libs)
    import matplotlib.pyplot as plt

RUNG = 3
SCHEMA = yaml.safe_load("""
correctness:
  shapes: {type: array, items: {$ref: "#/$defs/pair"}, minItems: 1, uniqueItems: true}
  dtypes: {$ref: "#/$defs/dtypes"}
bug:
  n_rows: {$ref: "#/$defs/size"}
  n_cols: {$ref: "#/$defs/sizes"}
  block_size: {$ref: "#/$defs/block_size"}
wide:
  n_rows: {$ref: "#/$defs/size"}
  n_cols: {$ref: "#/$defs/sizes"}
  dtypes: {$ref: "#/$defs/dtypes"}
  interpreter_max_cols: {description: "wider rows run only on a GPU", $ref: "#/$defs/size"}
limits:
  shapes: {description: "[n_rows, n_cols], each past 2**31 elements", type: array,
           items: {$ref: "#/$defs/pair"}, minItems: 1, uniqueItems: true}
  dtype: {$ref: "#/$defs/dtype"}
stability:
  n_rows: {$ref: "#/$defs/size"}
  n_cols: {$ref: "#/$defs/size"}
  scales: {type: array, items: {type: number, exclusiveMinimum: 0, maximum: 1.0e+30}, minItems: 1, uniqueItems: true}
passes:
  n_rows: {$ref: "#/$defs/size"}
  n_cols: {$ref: "#/$defs/size"}
  dtypes: {$ref: "#/$defs/dtypes"}
performance:
  input_bytes:
    description: bytes of each M x N input; M = input_bytes / (N x element size)
    type: integer
    minimum: 1024
    maximum: 17179869184
  n_cols: {$ref: "#/$defs/sizes"}
  writeup_max_cols:
    description: widest row the writeup's kernel (one block per row) is timed at
    type: integer
    minimum: 1
    maximum: 1048576
  dtypes: {$ref: "#/$defs/dtypes"}
""")
TORCH_SOFTMAX, NAIVE, COMPILED = "torch_softmax", "torch_naive", "torch_compile"
PROVIDERS = {WRITEUP: "`kernels.softmax_writeup`, the writeup's kernel: one block per row sized to the row (its fix); "
                      "`softmax_writeup(x, 1024)` is its bug. For fp16/bf16 inputs it computes in fp32, the one change, "
                      "which fp32 inputs (every claim's) do not see",
             FUSED: "`kernels.softmax`, the project's kernel: narrow rows share a program, wider rows are cut "
                    "into chunks over a group of programs (any width) or walked twice (the second read from L2); "
                    "backward `kernels.softmax_backward`",
             TORCH_SOFTMAX: "`torch.softmax`; backward `torch._softmax_backward_data`, the kernel autograd runs",
             NAIVE: "softmax as five torch ops (max, subtract, exp, sum, divide)",
             COMPILED: "`torch.softmax` under `torch.compile` (Inductor's generated Triton kernel, the Triton peer a user "
                       "would pick), compiled once per shape outside the timing (its compile time recorded as "
                       "`compile_s`); backward `torch._softmax_backward_data` compiled the same way"}
# max |out - torch.softmax in fp32, cast back| for one fused op (no matmul); the backward gets 4x (BACKWARD_SLACK)
ATOL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


def check_settings(section: dict) -> None:
    """What the schema cannot say: each limits shape is past 2**31 elements (else claim 20 tests nothing)."""
    for n_rows, n_cols in (section.get("limits") or {}).get("shapes", []):
        if n_rows * n_cols < 2**31:
            raise ValueError(f"limits.shapes: [{n_rows}, {n_cols}] holds {n_rows * n_cols} elements, not past 2**31")


def softmax_atol(dtype) -> float:
    return ATOL[verify.dtype_name(dtype)]


@experiment()
def correctness(s: dict) -> list[dict]:
    """The improved softmax against torch, forward and (dx for a random dy) backward, at every shape."""
    return _against_torch(s["shapes"], s["dtypes"], s["seed"])


def _against_torch(shapes, dtypes, seed: int, interpreter_max_cols: int | None = None) -> list[dict]:
    from kernels import softmax, softmax_backward, softmax_ref

    rows = []
    for dtype_name in dtypes:
        for n_rows, n_cols in shapes:
            for direction in ("forward", "backward"):
                params = dict(dtype=dtype_name, n_rows=n_rows, n_cols=n_cols, direction=direction)
                if not runnable(dtype_name):
                    rows.append(row("max_abs_diff", None, status="needs_gpu", error=BF16_IN_INTERPRETER, **params))
                    continue
                if interpreter_max_cols and not is_gpu() and n_cols > interpreter_max_cols:
                    rows.append(needs_gpu(f"a row of {n_cols} columns (minutes in the interpreter)", **params))
                    continue
                x = randn([n_rows, n_cols], dtype_name, seed)
                if direction == "forward":
                    ref, exact = _references(x)
                    diff = max_abs_diff(softmax(x), ref.to(x.dtype))  # ref.to(x.dtype) is softmax_ref(x)
                else:
                    y, dy = softmax_ref(x), randn([n_rows, n_cols], dtype_name, seed + 1)
                    ref, exact = _references(y, dy)
                    diff = max_abs_diff(softmax_backward(y, dy), ref)
                params["atol"] = scaled_atol(dtype_name, direction, ref, exact)
                rows.append(row("max_abs_diff", diff, **params))
                rows.append(row("matches_torch", diff <= params["atol"], "bool", **params))
    return rows


# dx = y * (dy - sum(y * dy)) rounds a difference of two terms: its tolerance is a few times the forward's
BACKWARD_SLACK = 4


def _references(y: torch.Tensor, dy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's softmax of y (or, given dy, its backward) computed in fp32, the reference, and in fp64 (exact)."""
    def at(t):
        return torch.softmax(y.to(t), dim=-1) if dy is None else torch._softmax_backward_data(dy.to(t), y.to(t), -1, t)
    return at(torch.float32), at(torch.float64)


def scaled_atol(dtype_name: str, direction: str, ref: torch.Tensor, exact: torch.Tensor) -> float:
    """The absolute tolerance of one case against ``ref`` (torch, computed in fp32): the dtype's, relative to
    the largest |value| of the reference (at most 1 in the forward), plus twice torch's own fp32 error against
    ``exact`` (fp64). A wide row's values are tiny (~1/n_cols): against a fixed tolerance even zeros would
    pass. And its sum runs over up to millions of fp32 terms, which costs torch itself ~1e-6 of the largest
    value, the fp32 tolerance: the kernel may be off by as much again, the other way."""
    scale = ref.abs().max().item() if ref.numel() else 1.0
    own = max_abs_diff(ref, exact)
    return softmax_atol(dtype_name) * (1 if direction == "forward" else BACKWARD_SLACK) * scale + 2 * own


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
    interpreter runs the wide paths' programs one after another: minutes per row there)."""
    return _against_torch([[s["n_rows"], n] for n in s["n_cols"]], s["dtypes"], s["seed"], s["interpreter_max_cols"])


@experiment(alone=True)
def limits(s: dict) -> list[dict]:
    """Past 2**31 elements (GPU only): the writeup's kernel as printed (int32 row offsets) and the project's
    softmax, forward and backward, each in its own process (a fault poisons the CUDA context)."""
    rows = []
    for n_rows, n_cols in s["shapes"]:
        for provider in (WRITEUP, FUSED):
            params = dict(provider=provider, n_rows=n_rows, n_cols=n_cols, elements=n_rows * n_cols, dtype=s["dtype"])
            if not is_gpu():
                rows.append(needs_gpu(f"{n_rows * n_cols} elements (GPU memory)", **params))
                continue
            rows += probe_rows(isolated.call(_probe, provider, n_rows, n_cols, s["dtype"], s["seed"]), **params)
    return rows


def _probe(provider: str, n_rows: int, n_cols: int, dtype_name: str, seed: int) -> list[dict]:
    """Max |diff| against torch.softmax on the first rows, the rows that straddle element 2**31, and the last,
    each with its tolerance (scaled_atol)."""
    from kernels import softmax, softmax_backward, softmax_writeup

    x = randn([n_rows, n_cols], dtype_name, seed)
    y = (softmax_writeup if provider == WRITEUP else softmax)(x)
    torch.cuda.synchronize()
    middle = 2**31 // n_cols
    picks = [slice(0, 4), slice(max(0, middle - 2), middle + 2), slice(n_rows - 4, n_rows)]
    refs = [_references(x[r]) for r in picks]
    result = [dict(metric="max_abs_diff", value=max(max_abs_diff(y[r], ref.to(x.dtype)) for r, (ref, _) in zip(picks, refs)),
                   tolerance=min(scaled_atol(dtype_name, "forward", *ref) for ref in refs))]
    if provider == FUSED:
        dy = torch.ones_like(x)
        dy[-4:] = randn([4, n_cols], dtype_name, seed + 1)
        dx = softmax_backward(y, dy)
        ref, exact = _references(y[-4:], dy[-4:])
        result.append(dict(metric="backward_max_abs_diff", value=max_abs_diff(dx[-4:], ref),
                           tolerance=scaled_atol(dtype_name, "backward", ref, exact)))
    return result


@experiment()
def stability(s: dict) -> list[dict]:
    """Large inputs: the kernel subtracts the row max; exp(x) alone overflows to inf and gives NaN."""
    from kernels import softmax, softmax_naive

    rows = []
    for scale in s["scales"]:
        x = randn([s["n_rows"], s["n_cols"]], "float32", s["seed"], scale)
        ref = torch.softmax(x.double(), dim=-1)
        for provider, out in ((FUSED, softmax(x)), ("naive_exp", softmax_naive(x))):
            params = dict(provider=provider, scale=scale, n_rows=s["n_rows"], n_cols=s["n_cols"],
                          max_input=x.abs().max().item())
            finite = out.isfinite()
            rows.append(row("nonfinite_fraction", 1 - finite.float().mean().item(), "fraction", **params))
            rows.append(row("max_abs_diff", max_abs_diff(out[finite], ref[finite]) if finite.any() else None,
                            **params))
    return rows


def _softmax_forward(x):
    return torch.softmax(x, dim=-1)


def _softmax_backward(y, dy):
    return torch._softmax_backward_data(dy, y, -1, y.dtype)


def _providers(x: torch.Tensor, compiled=None) -> dict:
    """Forward: provider -> (call, bytes it must move at the least). Fused kernels and torch.softmax (eager,
    or ``compiled``, its torch.compile'd form, when given): read x once, write once. Naive five-op: max
    (read x), x - max (read, write), exp (read, write), sum (read), divide (read two, write): 8 passes over
    an M x N tensor."""
    from kernels import softmax, softmax_unfused, softmax_writeup

    b = x.numel() * x.element_size()
    out = {FUSED: (lambda: softmax(x), 2 * b),
           WRITEUP: (lambda: softmax_writeup(x), 2 * b),
           TORCH_SOFTMAX: (lambda: _softmax_forward(x), 2 * b),
           NAIVE: (lambda: softmax_unfused(x), 8 * b)}
    if compiled:
        out[COMPILED] = (lambda: compiled(x), 2 * b)
    return out


def _backward_providers(y: torch.Tensor, dy: torch.Tensor, compiled=None) -> dict:
    """Backward, dx from y and dy: read two, write one, for the project's kernel and for torch's own (eager,
    or ``compiled`` when given)."""
    from kernels import softmax_backward

    b = y.numel() * y.element_size()
    out = {FUSED: (lambda: softmax_backward(y, dy), 3 * b),
           TORCH_SOFTMAX: (lambda: _softmax_backward(y, dy), 3 * b)}
    if compiled:
        out[COMPILED] = (lambda: compiled(y, dy), 3 * b)
    return out


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
    # one compile per shape, dtype and direction, as a model with fixed shapes gets: past Dynamo's
    # recompile limit (8) it would run the eager op instead
    compiled = {"forward": torch.compile(_softmax_forward, dynamic=False),
                "backward": torch.compile(_softmax_backward, dynamic=False)}
    with torch._dynamo.config.patch(recompile_limit=len(s["n_cols"]) * len(s["dtypes"]) + 8):
        for dtype_name in s["dtypes"]:
            for n in s["n_cols"]:
                x = randn([max(1, s["input_bytes"] // (n * to_dtype(dtype_name).itemsize)), n], dtype_name, s["seed"])
                y, dy = torch.softmax(x, dim=-1), torch.randn_like(x)
                forward = _providers(x, compiled["forward"])
                if n > s["writeup_max_cols"]:
                    del forward[WRITEUP]
                backward = _backward_providers(y, dy, compiled["backward"])
                for direction, providers in (("forward", forward), ("backward", backward)):
                    for provider, (fn, moved) in providers.items():
                        params = dict(provider=provider, direction=direction, n_rows=x.shape[0], n_cols=n,
                                      dtype=dtype_name)
                        try:
                            if provider == COMPILED:  # compile outside the timing, and say how long it took
                                rows.append(row("compile_s", wall_seconds(fn), "s", **params))
                            times = bench(fn, **s["bench"])
                        except Exception as e:  # noqa: BLE001  (Inductor's own errors: that provider's point only)
                            if provider != COMPILED:
                                raise
                            rows.append(row("time_ms", None, status="unsupported", error=str(e)[:300], **params))
                            continue
                        rows += timing_rows(times, moved / 1e9, "GB", **params, bytes=moved)
                del x, y, dy
    return rows


# --- claims it settles --------------------------------------------------------------------------------------

@claim(4, ['softmax/stability'])
def softmax_stability(t, s):
    d = ok(t["softmax/stability"])
    bad = needed(d[d["metric"] == "nonfinite_fraction"], "nonfinite_fraction rows").pivot_table(
        index="scale", columns="provider", values="value")
    top = bad.index.max()
    fused_diff = needed(ok(d, metric="max_abs_diff", provider=FUSED), f"max_abs_diff rows of {FUSED!r}")["value"].max()
    measured = (f"inputs up to {d['max_input'].max():.0f}: fused kernel non-finite fraction "
                f"{bad['triton_fused'].max():.0%} at every scale (max |diff| vs fp64 {fused_diff:.2g}); "
                f"naive exp(x): {bad.loc[top, 'naive_exp']:.0%} non-finite at scale {top:g}, "
                f"first non-finite at scale {bad.index[bad['naive_exp'] > 0].min():g}")
    good = bad[FUSED].max() == 0 and bad["naive_exp"].max() > 0 and fused_diff <= s["atol"]
    return measured + f" (atol {s['atol']:g})", REPRODUCED if good else NOT_REPRODUCED


def _bug_at(t, n_cols, variant):
    """The bug table's metrics at one point, and the error if the call raised there (None if it did not)."""
    d = t["softmax/bug"]
    d = needed(d[(d["n_cols"] == n_cols) & (d["variant"] == variant)], f"softmax/bug rows at n_cols={n_cols}, variant={variant}")
    raised = d[d["status"] == "raised"]["error"]
    return {m: g["value"].iloc[0] for m, g in ok(d).groupby("metric")}, (raised.iloc[0] if len(raised) else None)


@claim(5, ['softmax/bug'])
def softmax_small_input(t, s):
    r, raised = _bug_at(t, s["n_cols"], "hardcoded")
    if raised or not r:
        return f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: {raised or 'not measured'}", NOT_REPRODUCED
    measured = (f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: bit-exact {bool(r['exact_match'])}, "
                f"within atol {bool(r['matches_torch'])}, max |diff| {r['max_abs_diff']:.2g}")
    if r["exact_match"]:
        return measured, REPRODUCED
    if r["matches_torch"]:
        return (measured + " - not exactly: it matches to rounding, which is what the test showed (bit-exact would need "
                "Triton's exp and its order of summation to be torch's)"), FALSE_POINT_HOLDS
    return measured, NOT_REPRODUCED


@claim(6, ['softmax/bug'])
def softmax_bug_2000(t, s):
    r, raised = _bug_at(t, s["n_cols"], "hardcoded")
    if raised or not r:
        return f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: {raised or 'not measured'} - not silent", NOT_REPRODUCED
    measured = (f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: matches torch {bool(r['matches_torch'])}, max |diff| "
                f"{r['max_abs_diff']:.5f} (writeup {s['writeup_max_abs_diff']:g}; the value depends on the random input), "
                f"{int(r['columns_dropped'])} columns never written, {int(r['warnings_raised'])} warnings, "
                "returned without an exception")
    silent_and_wrong = not r["matches_torch"] and r["warnings_raised"] == 0 and r["columns_dropped"] > 0
    return measured, REPRODUCED if silent_and_wrong else NOT_REPRODUCED


@claim(7, ['softmax/bug'])
def softmax_fix_2000(t, s):
    r, raised = _bug_at(t, s["n_cols"], "dynamic")
    if raised or not r:
        return f"n_cols={s['n_cols']}, BLOCK_SIZE=next_power_of_2: {raised or 'not measured'}", NOT_REPRODUCED
    return (f"n_cols={s['n_cols']}, BLOCK_SIZE=next_power_of_2({s['n_cols']}): matches torch {bool(r['matches_torch'])}, "
            f"max |diff| {r['max_abs_diff']:.2g}", REPRODUCED if r["matches_torch"] else NOT_REPRODUCED)


@claim(8, ['softmax/bug'])
def softmax_sweep(t, s):
    d = t["softmax/bug"]
    dropped = needed(ok(d, metric="columns_dropped", variant="hardcoded"), "columns_dropped rows of variant hardcoded")
    exact = (dropped["value"] == dropped["expected_dropped"]).all()
    dyn = d[d["variant"] == "dynamic"]
    ran = needed(ok(dyn, metric="matches_torch"), "matches_torch rows of variant dynamic")
    dyn_dropped = needed(ok(dyn, metric="columns_dropped"), "columns_dropped rows of variant dynamic")
    dyn_ok = ran["value"].astype(bool).all() and (dyn_dropped["value"] == 0).all()
    broke = dyn[dyn["status"] == "raised"]
    n = sorted(int(x) for x in d["n_cols"].unique())
    measured = (f"n_cols in {n}: hard-coded drops exactly max(0, n_cols - 1024) columns in every case: {bool(exact)}; "
                f"dynamic matches torch with 0 columns dropped wherever it ran ({len(ran)} widths, up to "
                f"{int(ran['n_cols'].max())}): {bool(dyn_ok)}")
    if not (exact and dyn_ok):
        return measured, NOT_REPRODUCED
    if broke.empty:
        return measured, REPRODUCED
    max_block = int(broke["max_block"].iloc[0])
    past = (broke["n_cols"] > max_block).all()
    measured += (f"; dynamic raises at n_cols = {', '.join(str(int(x)) for x in sorted(broke['n_cols']))}, where "
                 f"next_power_of_2(n_cols) exceeds Triton's largest block ({max_block} elements): "
                 f"\"{first_line(broke['error'].iloc[0])}\"")
    if past:
        return (measured + " - it does break, loudly, past 2^20 columns; below that it never does"), FALSE_POINT_HOLDS
    return measured, NOT_REPRODUCED


@claim(16, ['softmax/bug'])
def first_block_softmax(t, s):
    d = needed(ok(t["softmax/bug"], variant="hardcoded"), "rows of variant hardcoded")
    wide = d[d["n_cols"] > d["block_size"]]
    if wide.empty:
        return "no n_cols wider than the block in this run's sweep", NOT_REPRODUCED
    diff = needed(wide[wide["metric"] == "diff_vs_softmax_of_written_columns"],
                  "diff_vs_softmax_of_written_columns rows past the block")
    dropped = needed(wide[wide["metric"] == "columns_dropped"], "columns_dropped rows past the block")
    measured = (f"n_cols in {sorted(int(n) for n in diff['n_cols'])}, BLOCK_SIZE={int(diff['block_size'].iloc[0])}: "
                f"columns [0, {int(diff['written_columns'].iloc[0])}) hold softmax(x[:, :{int(diff['block_size'].iloc[0])}]) "
                f"to max |diff| {diff['value'].max():.2g} (atol {diff['atol'].iloc[0]:g}); the other "
                f"{int(dropped['value'].min())}..{int(dropped['value'].max())} columns are never written")
    good = (diff["value"] <= diff["atol"]).all() and (dropped["value"] == dropped["expected_dropped"]).all()
    return measured, REPRODUCED if good else NOT_REPRODUCED


def _short(kernel_names: str) -> str:
    """'void at::native::(anonymous namespace)::cunn_SoftMaxForward<float, ...>(...)' -> 'cunn_SoftMaxForward'."""
    names = (n.replace("(anonymous namespace)::", "").split("<")[0].split("(")[0] for n in kernel_names.split("; "))
    return "; ".join(n.split("::")[-1].split()[-1] for n in names if n.strip())


@claim(17, ['softmax/passes', 'softmax/performance'])
def torch_softmax_passes(t, s):
    """Several passes if torch.softmax launches several kernels. If it launches one, the statement's
    point (op by op, each step is a pass, and passes cost time) holds only if the five-op version is
    measured slower, by at least min_naive_slowdown at the counted width."""
    d = ok(t["softmax/passes"])
    if d.empty:
        return "counting the CUDA kernels torch.softmax launches needs a GPU", NEEDS_GPU
    times = summary.median(summary.forward(t["softmax/performance"]), "time_ms")
    if len(ok(t["softmax/performance"])):  # timed: then these rows are there (a width not timed needs a GPU, below)
        needed(times, "forward time_ms rows in softmax/performance")
    if "dtype" not in times:  # only needs_gpu rows: nothing was timed
        times = times.assign(dtype=pd.Series(dtype=object), n_cols=pd.Series(dtype=float))
    parts, verdicts = [], []
    for dtype, g in d.groupby("dtype"):
        g = g.set_index("provider")
        n_cols = int(g["n_cols"].iloc[0])
        n_torch, n_naive = int(g.loc[TORCH_SOFTMAX, "value"]), int(g.loc[NAIVE, "value"])
        text = (f"{dtype} {int(g['n_rows'].iloc[0])}x{n_cols}: torch.softmax launches "
                f"{n_torch} CUDA kernel(s) ({_short(g.loc['torch_softmax', 'kernel_names'])}), moving "
                f"{g.loc['torch_softmax', 'bytes'] / g.loc['torch_softmax', 'input_bytes']:.0f}x the input's bytes; "
                f"the five-op version launches {n_naive}, moving "
                f"{g.loc['torch_naive', 'bytes'] / g.loc['torch_naive', 'input_bytes']:.0f}x; the Triton kernel "
                f"{int(g.loc['triton_fused', 'value'])}")
        timed = times[(times["dtype"] == dtype) & (times["n_cols"] == n_cols)]
        at = timed.set_index("provider")["value"]
        slowdown = at.get(NAIVE, float("nan")) / at.get(TORCH_SOFTMAX, float("nan"))
        shape = f"{int(timed['n_rows'].iloc[0])}x{n_cols}" if len(timed) and "n_rows" in timed else f"{n_cols} columns"
        if n_torch >= s["several"]:
            verdicts.append(REPRODUCED)
        elif slowdown != slowdown:  # NaN: the same width was not timed
            verdicts.append(NEEDS_GPU)
            text += f"; the five-op version's cost was not timed at {n_cols} columns"
        elif slowdown >= s["min_naive_slowdown"]:
            verdicts.append(NUANCE)
            text += (f"; done op by op it takes {slowdown:.2f}x torch.softmax's time (timed at {shape}) - torch.softmax "
                     "itself is one fused kernel: the several passes are what the op-by-op ('naive execution model') "
                     "version makes")
        else:
            verdicts.append(NOT_REPRODUCED)
            text += (f"; the op-by-op version takes only {slowdown:.2f}x the time (timed at {shape}): its extra passes "
                     "cost little here")
        parts.append(text)
    return "; ".join(parts) + " (bytes: the least each kernel must read and write, counted in code)", weakest(verdicts)


@claim(19, ['softmax/bug', 'softmax/wide'])
def softmax_past_largest_block(t, s):
    """Finding: the writeup's fix asks for a block of next_power_of_2(n_cols) elements, which Triton refuses
    past 2^20; the project's softmax (rows split over programs) is right there."""
    r, raised = _bug_at(t, s["n_cols"], "dynamic")
    wide = t["softmax/wide"]
    matched = ok(wide, metric="matches_torch")
    if len(ok(wide)):  # some width ran here (the others need a GPU): each says whether it matched
        needed(matched, "matches_torch rows in softmax/wide")
    right = matched["value"].astype(bool)
    widths = sorted(int(x) for x in matched["n_cols"].unique())
    gpu_only = sorted(int(x) for x in wide[wide["status"] == "needs_gpu"]["n_cols"].dropna().unique())
    text = (f"the writeup's fix at n_cols={s['n_cols']}: "
            + (f"raises \"{first_line(raised)}\"" if raised else "ran, max |diff| "
               + (f"{r['max_abs_diff']:.2g}" if r else "(not measured)"))
            + f"; the project's softmax, forward and backward, within atol at {int(right.sum())}/{len(right)} cases, "
            f"widths {widths or 'none'}" + (f" (widths {gpu_only} need a GPU)" if gpu_only else ""))
    if not raised or not right.all():
        return text, NOT_REPRODUCED
    if not any(w >= s["n_cols"] for w in widths):  # the project's softmax must be right where the fix raised
        if any(w >= s["n_cols"] for w in gpu_only):
            return text, NEEDS_GPU
        return text + f"; the sweep has no width of {s['n_cols']} columns or more", NOT_SETTLED
    return text, REPRODUCED


# --- numbers derived from its tables ------------------------------------------------------------------------

def softmax_widths(df: pd.DataFrame, copy_gbps: float | None) -> pd.DataFrame:
    """Per direction, dtype and row width: median GB/s of the project's softmax, torch's (eager and
    compiled, where timed) and the writeup's kernel, their times over the project's (> 1: the project's is
    faster), and the fraction of copy."""
    d = median(df, "bandwidth")
    if d.empty or "direction" not in d:  # no timings, or a table from before the backward was timed
        return d.iloc[:0]
    wide = d.pivot_table(index=["direction", "dtype", "n_cols", "n_rows"], columns="provider", values="value")
    wide.columns.name = None
    out = wide.reset_index()
    out["torch/triton time"] = out[FUSED] / out[TORCH_SOFTMAX]  # same bytes: GB/s ratio = time ratio
    if COMPILED in out:
        out["compiled/triton time"] = out[FUSED] / out[COMPILED]
    if copy_gbps:
        out["triton/copy"] = out[FUSED] / copy_gbps
    return out.sort_values(["direction", "dtype", "n_cols"], ascending=[False, True, True]).reset_index(drop=True)


# --- figures ------------------------------------------------------------------------------------------------

@figure("softmax_bug", ["softmax/bug"], "Softmax", caption="""
Softmax with the writeup's hard-coded ``BLOCK_SIZE=1024`` ("hardcoded") vs the fix
``BLOCK_SIZE=next_power_of_2(n_cols)`` ("dynamic"), over a sweep of ``n_cols`` across 1024 (red line) and past
2^20, Triton's largest block (a dotted black line where a call raised instead of returning: the fix asks for a
block of ``next_power_of_2(n_cols)`` elements). Left: columns the kernel never wrote (counted exactly from a
NaN-filled output). Right, on a log axis: max absolute difference from ``torch.softmax`` (output zero-filled
before the call); dotted: the 0.00978 the writeup printed at n_cols=2000 (its input was different, so only the
order of magnitude can agree). Claims 5 to 8, 16 and 19.""")
def figure_softmax_bug(t):
    return plot_softmax_bug(t["softmax/bug"], said(6, "writeup_max_abs_diff"), said(6, "n_cols"))


@figure("softmax_widths", ["calibration/ceilings", "softmax/performance"], "Performance", caption="""
``kernels.softmax`` (the project's), ``torch.softmax`` (eager, and under ``torch.compile`` where timed) and the
writeup's kernel (one block per row, sized to the row) at every row width, forward and backward, every input
of the same size. Bandwidth counts what the op
must move at the least: read x and write y forward; read y and dy and write dx backward. Rows up to 32768
columns (16384 for the 16-bit forward) fit one program (narrow rows share one); wider rows are read twice
by one program each (the second read from L2) or cut over a group of programs that meet at a per-row
barrier. The dashed line is the copy measured in the same run, the dotted one 0.9 of it.""")
def figure_softmax_widths(t):
    perf = t["softmax/performance"]
    copy = own_ceiling(perf, "copy_gbps", t["calibration/ceilings"])
    return plot_softmax_widths(softmax_widths(perf, copy), copy, plots.device_of(perf))


def plot_softmax_bug(df: pd.DataFrame, writeup_diff: float, writeup_n_cols: int) -> plt.Figure:
    plt, sns = plots.libs()
    d = plots.measured(df)
    raised = df[df["status"] == "raised"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    block = int(d.loc[d["variant"] == "hardcoded", "block_size"].iloc[0])
    for ax, metric, label in ((axes[0], "columns_dropped", "columns never written (log)"),
                              (axes[1], "max_abs_diff", "max |triton - torch| (log)")):
        sns.lineplot(data=d[d["metric"] == metric], x="n_cols", y="value", hue="variant", style="variant",
                     markers=True, dashes=False, ax=ax)
        ax.axvline(block, color="red", ls="--", lw=1)
        for n in raised["n_cols"].unique():  # where a call raised instead of returning
            ax.axvline(n, color="black", ls=":", lw=1)
            ax.text(n, 0.5, f"{int(n)}: {', '.join(sorted(raised[raised['n_cols'] == n]['variant']))} raised",
                    rotation=90, fontsize=7, ha="right", va="center", transform=ax.get_xaxis_transform())
        ax.set(xlabel="n_cols (log)", ylabel=label, xscale="log")
        if metric == "columns_dropped":  # 0 and up to 2^20: linear below 1, log above
            ax.set_yscale("symlog", linthresh=1)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
    axes[1].axhline(writeup_diff, color="grey", ls=":", lw=1)
    axes[1].annotate(f"writeup at n_cols={writeup_n_cols}: {writeup_diff:g}", (writeup_n_cols, writeup_diff),
                     xytext=(-4, 4), ha="right", textcoords="offset points", fontsize=8, color="grey")
    for ax in axes:
        ax.text(block, 0.02, f" BLOCK_SIZE={block}", color="red", fontsize=9, transform=ax.get_xaxis_transform())
    fig.suptitle(f"softmax: the hard-coded BLOCK_SIZE bug vs the fix ({plots.device_of(df)})")
    fig.tight_layout()
    return fig


def plot_softmax_widths(w, copy_gbps: float | None, device: str) -> plt.Figure:
    """softmax GB/s against row width, forward and backward: the project's kernel, torch, the writeup's."""
    plt, sns = plots.libs()
    if w.empty:
        return plots.needs_gpu("softmax at every row width", device)
    providers = [p for p in (FUSED, TORCH_SOFTMAX, COMPILED, WRITEUP) if p in w]
    long = w.melt(id_vars=["direction", "dtype", "n_cols"], value_vars=providers, var_name="provider",
                  value_name="GB/s").dropna()
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 4.4), sharey=True)
    for ax, direction in zip(axes, ("forward", "backward")):
        sns.lineplot(data=long[long["direction"] == direction], x="n_cols", y="GB/s", hue="provider", style="dtype",
                     marker="o", ax=ax)
        if copy_gbps:
            ax.axhline(copy_gbps, color="black", ls="--", lw=1)
            ax.axhline(0.9 * copy_gbps, color="grey", ls=":", lw=1)
            ax.text(w["n_cols"].min(), copy_gbps, f" device copy {copy_gbps:.0f} GB/s; dotted: 0.9 of it",
                    va="bottom", fontsize=8)
        ax.set(xscale="log", xlabel="n_cols (every input the same size)", ylabel="GB/s (bytes the op must move / time)",
               title=direction)
    handles, labels = axes[0].get_legend_handles_labels()  # the forward panel has every provider
    for ax in axes:
        ax.get_legend().remove()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle(f"softmax at every row width, median ({device})")
    fig.tight_layout(rect=(0, 0, 0.89, 1))
    return fig


# --- its report section -------------------------------------------------------------------------------------

@section(["softmax/performance"])
def section_widths(tables: dict[str, pd.DataFrame]) -> str:
    """The project's softmax against torch's at every row width, forward and backward (and as a fraction of
    the copy rate its job measured, where it recorded one: tables from before jobs did have none)."""
    w = softmax_widths(tables["softmax/performance"], own_ceiling(tables["softmax/performance"], "copy_gbps"))
    if w.empty:
        return ""
    out = ["\n### softmax at every row width, median GB/s (inputs of the same size; `torch/triton time` > 1: the "
           "project's kernel is faster)\n"]
    for (direction, dtype), g in w.groupby(["direction", "dtype"], sort=False):
        worst = g.loc[g["torch/triton time"].idxmin()]
        wide = g[g["n_cols"] >= 1024]
        low = wide.loc[wide["triton/copy"].idxmin()] if len(wide) and "triton/copy" in wide else None
        against = [f"against torch {g['torch/triton time'].min():.2f}x..{g['torch/triton time'].max():.2f}x "
                   f"(lowest at {int(worst['n_cols'])} columns)"]
        if g.get("compiled/triton time", pd.Series(dtype=float)).notna().any():
            slow = g.loc[g["compiled/triton time"].idxmin()]
            against.append(f"against torch.compile {g['compiled/triton time'].min():.2f}x.."
                           f"{g['compiled/triton time'].max():.2f}x (lowest at {int(slow['n_cols'])} columns)")
        out.append(f"- {direction}, {dtype}: " + ", ".join(against)
                   + (f"; from 1024 columns up at least {low['triton/copy']:.2f} of copy (at {int(low['n_cols'])})"
                      if low is not None else ""))
    cols = [c for c in ("direction", "dtype", "n_cols", "n_rows", FUSED, TORCH_SOFTMAX, COMPILED, WRITEUP,
                        "torch/triton time", "compiled/triton time", "triton/copy") if c in w]
    out.append("\n" + md_table(w[cols].astype({"n_cols": int, "n_rows": int})))
    return "\n".join(out)
