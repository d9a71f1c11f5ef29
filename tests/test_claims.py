"""Verdicts come from the data: every check of lab/claims.py, fed small tables built to say one thing, gives
every verdict it can write, with its thresholds read from claims.yaml; a coverage test proves that CASES
reach every verdict each check names and execute every statement that names one, so a new branch without
a case fails here."""
import ast
import copy
import functools
import inspect
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lab import claims, settings, units
from lab.claims import FALSE_POINT_HOLDS, NEEDS_GPU, NOT_REPRODUCED, NOT_SETTLED, NUANCE, REPRODUCED
from lab.table import needs_gpu, row

ROOT = Path(claims.__file__).parents[2]
CLAIMS_LIST = yaml.safe_load((ROOT / "workflow" / "claims.yaml").read_text())
CLAIMS = {c["id"]: c for c in CLAIMS_LIST}
S = {i: c.get("settings", {}) for i, c in CLAIMS.items()}  # every threshold below is read from here
CONFIG = yaml.safe_load((ROOT / "config.yaml").read_text())

GPU = dict(device="NVIDIA H200", backend="gpu", triton="3.6.0")
CPU = dict(device="cpu (x86_64, Triton interpreter)", backend="interpreter", triton="3.9.0")
BF16 = "bfloat16 arithmetic is broken in Triton's interpreter"


def frame(rows, origin=GPU) -> pd.DataFrame:
    return pd.DataFrame(rows).assign(**origin)


def verdict(claim_id: int, tables: dict, **overrides) -> tuple[str, str]:
    """The check of ``claim_id`` on ``tables`` (exactly the tables it declares), with claims.yaml's settings."""
    check = units.checks()[claim_id]
    assert set(tables) == set(check.tables)
    return check.fn(tables, {**S[claim_id], **overrides})


def timing(provider, ms, **params):
    return [row("time_ms", ms, "ms", quantile=0.5, provider=provider, **params)]


# --- claim 1: vector add ---------------------------------------------------------------------------------------

def vector_add(wrong=(), bf16_on_cpu=False, sizes=(1, 1025, 4096)):
    rows = []
    for provider in ("triton_writeup", "triton"):
        for size in sizes:
            for dtype in ("float32", "int32"):
                exact = (provider, size) not in wrong
                params = dict(provider=provider, size=size, dtype=dtype)
                rows += [row("exact_match", exact, "bool", **params), row("max_abs_diff", 0 if exact else 0.5, **params)]
            if bf16_on_cpu:
                rows.append(row("exact_match", None, status="needs_gpu", error=BF16, provider=provider, size=size,
                                dtype="bfloat16"))
    return {"vector_add/correctness": frame(rows, CPU if bf16_on_cpu else GPU)}


# --- claims 2, 3 and 15: dropout statistics --------------------------------------------------------------------

TOLERANCE = S[2]["band"]


def statistics(rate_error=0.0005, ulp=0.0, *, worst=None, pvalue=0.5, r=0.002, agreement_gap=0.0, same=True,
               mask_ref=True, close_ref=True, size=100_000, ps=(0.1, 0.5, 0.9), providers=("triton_writeup", "triton_fused")):
    """A relu_dropout/statistics table; ``ulp`` and ``close_ref`` may be {provider: value}."""
    def at(v, provider):
        return v[provider] if isinstance(v, dict) else v

    rows = []
    for provider in providers:
        for p in ps:
            params = dict(provider=provider, p=p, size=size, dtype="float32", variant=f"p={p}")
            sigma = (p * (1 - p) / size) ** 0.5
            expected = p * p + (1 - p) * (1 - p)
            rows += [row("drop_rate_single_seed", p + rate_error, "fraction", seed=0, **params),
                     row("drop_rate", p + rate_error, "fraction", seed=0, sigma=sigma, **params),
                     row("max_abs_rate_error", rate_error if worst is None else worst, seeds=100, sigma=sigma, **params),
                     row("survivor_max_ulp_error", at(ulp, provider), "ulp", seeds=100, **params),
                     row("pooled_binomtest_pvalue", pvalue, "p-value", seeds=100, **params),
                     row("per_seed_ks_pvalue", pvalue, "p-value", seeds=100, **params),
                     row("neighbour_correlation", r, "pearson r", pvalue=0.5, **params),
                     row("same_seed_identical", same, "bool", **params),
                     row("other_seed_mask_agreement", expected + agreement_gap, "fraction", expected=expected, **params),
                     row("mask_equals_seed_reference", mask_ref, "bool", **params),
                     row("allclose_seed_reference", at(close_ref, provider), "bool", rtol=1e-6, **params)]
    return {"relu_dropout/statistics": frame(rows)}


# --- claim 4: stability ------------------------------------------------------------------------------------------

def stability(fused_nonfinite=0.0, fused_diff=S[4]["atol"] / 10, naive_from=100):
    rows = []
    for scale in (1, 10, 100, 1000):
        params = dict(scale=scale, n_rows=8, n_cols=1000, max_input=4.2 * scale)
        naive = 0.5 if naive_from and scale >= naive_from else 0.0
        rows += [row("nonfinite_fraction", fused_nonfinite, provider="triton_fused", **params),
                 row("max_abs_diff", fused_diff, provider="triton_fused", **params),
                 row("nonfinite_fraction", naive, provider="naive_exp", **params),
                 row("max_abs_diff", float("nan") if naive else 1e-7, provider="naive_exp", **params)]
    return {"softmax/stability": frame(rows)}


# --- claims 5-8, 16, 19: the softmax bug sweep --------------------------------------------------------------------

BLOCK = 1024          # the writeup's hard-coded BLOCK_SIZE (config.yaml softmax.bug.block_size)
MAX_BLOCK = 2 ** 20   # Triton's largest block (TRITON_MAX_TENSOR_NUMEL), a column of the bug table
N5, N6, N19 = S[5]["n_cols"], S[6]["n_cols"], S[19]["n_cols"]
SWEEP = tuple(sorted({N5, 1000, 1024, 1025, N6, 4096, N19}))
TOO_BIG = ("CompilationError: at 4:18:\ndef _softmax_kernel(output_ptr, input_ptr, n_cols, BLOCK_SIZE: tl.constexpr):\n"
           "    col_offsets = tl.arange(0, BLOCK_SIZE)\n                  ^\n"
           "numel (2097152) exceeds triton maximum tensor numel (1048576)")


def bug_point(variant, n, *, raised=None, exact=False, matches=None, dropped=None, warnings=0, diff=None,
              first_diff=1e-9):
    """One (variant, n_cols) of softmax/bug, as the writeup's kernel behaves unless told otherwise."""
    hard = variant == "hardcoded"
    params = dict(variant=variant, n_rows=4, n_cols=n, dtype="float32", block_size=BLOCK if hard else 0,
                  expected_dropped=max(0, n - BLOCK) if hard else 0, max_block=MAX_BLOCK)
    if raised is None:
        raised = TOO_BIG if not hard and n > MAX_BLOCK else False
    if raised:
        return [row("raised", True, "bool", status="raised", error=raised, **params)]
    dropped = params["expected_dropped"] if dropped is None else dropped
    matches = dropped == 0 if matches is None else matches
    diff = (1.5e-8 if matches else 8e-3) if diff is None else diff
    return [row("columns_dropped", dropped, "columns", **params), row("max_abs_diff", diff, **params),
            row("exact_match", exact, "bool", **params), row("matches_torch", matches, "bool", atol=1e-6, **params),
            row("warnings_raised", warnings, "count", **params),
            row("diff_vs_softmax_of_written_columns", first_diff, written_columns=min(n, BLOCK) if hard else n,
                atol=1e-6, **params)]


def bug(at=None, n_cols=SWEEP):
    """The sweep; ``at`` overrides points: {(variant, n_cols): bug_point keywords}."""
    at = at or {}
    rows = [r for n in n_cols for v in ("hardcoded", "dynamic") for r in bug_point(v, n, **at.get((v, n), {}))]
    return {"softmax/bug": frame(rows)}


WIDE = (N19, 4 * 2 ** 20)


def wide(bad=(), gpu_only=(), only=WIDE):
    rows = []
    for dtype in ("float32", "bfloat16"):
        for n in only:
            for direction in ("forward", "backward"):
                params = dict(dtype=dtype, n_rows=2, n_cols=n, direction=direction,
                              atol=1e-6 if direction == "forward" else 4e-6)
                if n in gpu_only:
                    rows.append(needs_gpu(f"a row of {n} columns (minutes in the interpreter)", **params))
                    continue
                good = (dtype, n, direction) not in bad
                rows += [row("max_abs_diff", 1e-11 if good else 0.5, **params),
                         row("matches_torch", good, "bool", **params)]
    return {"softmax/wide": frame(rows)}


def past_largest_block(at=None, n_cols=SWEEP, **wide_kw):
    return {**bug(at, n_cols), **wide(**wide_kw)}


# --- claim 9: attention shapes -------------------------------------------------------------------------------------

SHAPES = [tuple(s) for s in S[9]["shapes"]] + [(16, 16, 16)]


def attention_correctness(wrong=(), missing=(), bf16_on_cpu=False):
    rows = []
    for provider in ("triton_writeup", "triton"):
        for n_q, n_k, d in SHAPES:
            if (n_q, n_k, d) in missing:
                continue
            for dtype, precision in (("float32", "tf32"), ("float16", "float16 inputs, fp32 accumulation")):
                bad = (provider, (n_q, n_k, d)) in wrong
                params = dict(provider=provider, dtype=dtype, n_q=n_q, n_k=n_k, d=d, dot_precision=precision, eps=1e-3)
                rows += [row("max_abs_diff", 0.4 if bad else 1e-3, **params), row("sdpa_max_abs_diff", 1e-3, **params),
                         row("diff_vs_sdpa", 0.4 if bad else 1e-3, **params), row("matches", not bad, "bool", **params)]
            if bf16_on_cpu:
                rows.append(row("matches", None, status="needs_gpu", error=BF16, provider=provider, dtype="bfloat16",
                                n_q=n_q, n_k=n_k, d=d))
    return {"attention/correctness": frame(rows, CPU if bf16_on_cpu else GPU)}


# --- claims 10 and 13: the wall ----------------------------------------------------------------------------------

LIMIT = 232448  # the H200's shared memory per block


def wall_rows(dtype, d, ran_to, fails_at, wrong_at=()):
    rows = []
    for n in (64, 128, ran_to):
        params = dict(provider="triton_writeup", dtype=dtype, d=d, n_k=n, n_q=128, shared_limit=LIMIT)
        rows += [row("max_abs_diff", 0.3 if n in wrong_at else 1e-4, **params),
                 row("matches", n not in wrong_at, "bool", **params),
                 row("shared_required", 160 * n, "bytes", **params)]
    if fails_at:
        rows.append(row("shared_required", 327680, "bytes", status="out_of_resources", provider="triton_writeup",
                        dtype=dtype, d=d, n_k=fails_at, n_q=128, shared_limit=LIMIT,
                        error=f"OutOfResources: out of resource: shared memory, Required: 327680, Hardware limit: {LIMIT}."
                              " Reducing block sizes or `num_stages` may help."))
    return rows


def attention_wall(*walls):
    return {"attention/wall": frame([r for w in walls for r in wall_rows(*w)])}


def compiled_only():
    return frame([row("shared_required", 160 * n, "bytes", status="compiled_only", dtype="float16", d=64, n_k=n)
                  for n in (128, 512)], CPU)


def past_wall(lengths=(1024, 4096, 65537), wrong_at=(), grid_wrong=False, walls=(("float16", 64, 1024, 1025),),
              on_cpu=False):
    flash, grid = [], []
    for n in lengths:
        params = dict(provider="triton_flash", dtype="float16", d=64, n_k=n, n_q=32, eps=1e-3)
        rows = [row("max_abs_diff", 0.2 if n in wrong_at else 7e-5, **params), row("torch_max_abs_diff", 1e-4, **params),
                row("matches", n not in wrong_at, "bool", **params)]
        flash += rows
    flash.append(row("peak_extra_memory", 2 ** 20, "bytes", provider="torch_math", seq=4096, heads=16))
    for variant in ("out", "dq", "dk", "dv"):
        for seq_q, seq_k in ((113, 203), (1, 239)):
            params = dict(variant=variant, dtype="float16", batch=2, heads=2, seq_q=seq_q, seq_k=seq_k, d=64)
            grid.append(row("matches", not (grid_wrong and variant == "dq"), "bool", **params))
    origin = CPU if on_cpu else GPU
    wall = compiled_only() if on_cpu else frame([r for w in walls for r in wall_rows(*w)])
    return {"attention/wall": wall, "flash_attention/past_wall": frame(flash, origin),
            "flash_attention/correctness": frame(grid, origin)}


# --- claim 11: shared memory ---------------------------------------------------------------------------------------

LOW, HIGH = S[11]["said_bytes"]
RATIO = S[11]["min_ratio_to_device_memory"]
H200_SM = 228 * 1024


def ceilings(per_sm, per_block, device_memory):
    rows = [row("shared_memory_per_block", per_block, "bytes", provider="device"),
            row("device_memory", device_memory, "bytes", provider="device"),
            row("bandwidth", 4000, "GB/s", provider="device_copy", quantile=0.5),
            row("throughput", 700, "TFLOP/s", provider="bf16_matmul", quantile=0.5)]
    if per_sm is not None:
        rows.append(row("shared_memory_per_multiprocessor", per_sm, "bytes", provider="device"))
    return {"calibration/ceilings": frame(rows)}


# --- claim 12: fusion --------------------------------------------------------------------------------------------

SIZES = (2 ** 12, 2 ** 16, 2 ** 20, 2 ** 24)


def fusion(fused_ms, unfused_ms, writeup_over_fused=1.0):
    """Both fused relu+dropout kernels and the fused softmax, every size, with the given times of the size."""
    dr, sm = [], []
    for size in SIZES:
        dr += timing("triton_writeup", writeup_over_fused * fused_ms(size), size=size, dtype="float32", bytes=8 * size,
                     direction="forward")
        dr += timing("triton_fused", fused_ms(size), size=size, dtype="float32", bytes=8 * size, direction="forward")
        dr += timing("torch_unfused", unfused_ms(size), size=size, dtype="float32", bytes=17 * size, direction="forward")
        dr += timing("triton_fused", 50.0, size=size, dtype="float32", bytes=12 * size, direction="backward")
        n_cols = size // 4096
        sm += timing("triton_fused", fused_ms(size), n_cols=n_cols, dtype="float32", bytes=8 * size)
        sm += timing("torch_naive", unfused_ms(size), n_cols=n_cols, dtype="float32", bytes=17 * size)
    return {"relu_dropout/performance": frame(dr), "softmax/performance": frame(sm)}


def no_timings():
    return {"relu_dropout/performance": frame([needs_gpu("timing relu_dropout")], CPU),
            "softmax/performance": frame([needs_gpu("timing softmax")], CPU)}


FAST = (lambda n: 0.005 + n * 1e-9, lambda n: 0.010 + n * 2.125e-9)         # fused wins everywhere, by its bytes
COSTLIER = (FAST[0], lambda n: 0.010 + n * 4e-9)                            # unfused slower than its bytes say
CHEAPER = (FAST[0], lambda n: 0.010 + n * 1.5e-9)                           # unfused faster than its bytes say
LAUNCH_BOUND = (lambda n: 0.020 + n * 1e-9, lambda n: 0.008 + n * 2e-9)     # fused loses below 1.2e7 elements
GROWING = ({2 ** 12: 0.010, 2 ** 16: 0.012, 2 ** 20: 0.030, 2 ** 24: 0.100}.get,   # loses, and not by per-call cost
           {2 ** 12: 0.005, 2 ** 16: 0.006, 2 ** 20: 0.020, 2 ** 24: 0.300}.get)
ONE_SLOW = (lambda n: 0.005 + n * 1e-9 + (0.05 if n == 2 ** 16 else 0), lambda n: 0.010 + n * 2e-9)
SLOWER = (lambda n: 0.010 + n * 3e-9, lambda n: 0.005 + n * 2e-9)


# --- claim 14: the mask ------------------------------------------------------------------------------------------

def mask_table(unmasked_written=24, masked_written=0):
    rows = []
    for variant, written in (("masked", masked_written), ("unmasked", unmasked_written)):
        params = dict(variant=variant, size=1000, block_size=1024, expected_past_end=24, dtype="float32")
        rows += [row("elements_written_past_end", written, **params),
                 row("read_past_end", written > 0, "bool", **params),
                 row("in_bounds_exact", True, "bool", **params)]
    return {"vector_add/mask": frame(rows)}


# --- claim 17: passes of torch.softmax ---------------------------------------------------------------------------

SOFTMAX_KERNEL = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                  "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, const float*, int)")
PASSES_COLS = 4096


def passes(kernels, slowdown):
    """torch.softmax launching kernels[dtype] kernels; the five-op version timed at slowdown[dtype] x
    torch.softmax's time at the counted width (a dtype absent from ``slowdown`` is timed at another width only)."""
    counted = []
    for dtype, n in kernels.items():
        params = dict(dtype=dtype, n_rows=4096, n_cols=PASSES_COLS, input_bytes=2 ** 26)
        counted += [row("cuda_kernels", n, provider="torch_softmax", kernel_names=SOFTMAX_KERNEL, bytes=2 ** 27, **params),
                    row("cuda_kernels", 5, provider="torch_naive", kernel_names="void at::native::reduce_kernel<512>(); "
                        "void at::native::elementwise_kernel<128>()", bytes=2 ** 29, **params),
                    row("cuda_kernels", 1, provider="triton_fused", kernel_names="_rows_forward", bytes=2 ** 27, **params)]
    timed = []
    for dtype in kernels:
        for n_cols in (1024, PASSES_COLS):
            if n_cols == PASSES_COLS and dtype not in slowdown:
                continue
            params = dict(dtype=dtype, n_cols=n_cols, n_rows=2 ** 26 // n_cols)
            naive = 0.25 * slowdown[dtype] if n_cols == PASSES_COLS else 0.01
            timed += timing("torch_softmax", 0.25, direction="forward", **params)
            timed += timing("torch_naive", naive, direction="forward", **params)
            timed += timing("torch_softmax", 9.0, direction="backward", **params)  # must not be read
    return {"softmax/passes": frame(counted), "softmax/performance": frame(timed)}


SEVERAL, MIN_SLOWDOWN = S[17]["several"], S[17]["min_naive_slowdown"]


# --- claim 18: head dims -------------------------------------------------------------------------------------------

HEAD_DIMS = (32, 48, 64, 80)


def head_dims(printed_wrong=(48, 80), fixed_wrong=(), dims=HEAD_DIMS, providers=("triton_writeup", "triton"),
              on_cpu=False):
    rows = []
    for provider in providers:
        for d in dims:
            params = dict(provider=provider, d=d, dtype="float16", n_q=64, n_k=250, eps=1e-3)
            if on_cpu:
                rows.append(row("matches", None, status="needs_gpu", error=BF16, **params))
                continue
            bad = d in (printed_wrong if provider == "triton_writeup" else fixed_wrong)
            rows += [row("max_abs_diff", 0.92 if bad else 3.4e-4, **params), row("sdpa_max_abs_diff", 3e-4, **params),
                     row("diff_vs_sdpa", 0.92 if bad else 1e-4, **params), row("matches", not bad, "bool", **params)]
    return {"attention/head_dims": frame(rows, CPU if on_cpu else GPU)}


# --- claim 20: past 2^31 elements --------------------------------------------------------------------------------

ILLEGAL = ("AcceleratorError: CUDA error: an illegal memory access was encountered\nSearch for `cudaErrorIllegalAddress' "
           "in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
           "For debugging consider passing CUDA_LAUNCH_BLOCKING=1")
SIZE = 2151677955
TOL, ULP = S[20]["rate_tolerance"], S[20]["max_ulp"]


def outcome(status, **params):
    return row("outcome", None, status=status, error=ILLEGAL if status == "raised" else "child died (EOF on the pipe)",
               **params)


def limits(*, on_cpu=False, writeup="raised", project="ok", writeup_exact=False, rate_error=0.0002, agreement_error=0.0004,
           tail_ulp=0, backward_same_mask=True, softmax_forward=2.4e-7, softmax_backward=3.4e-6,
           flash_matches=True, flash_nan=False, flash_nonfinite_unchecked=False, scaled=True):
    """The four limits tables: the printed kernels ``writeup`` ('raised', 'crashed' or 'ok'), the project's
    ``project`` ('ok' or how they broke) with their results given by the other keywords. ``scaled``: softmax's
    cases carry their own tolerance, scaled to values of ~1e-3 (a y of 65536 columns); else one absolute atol,
    as tables made before that had it."""
    va, rd, sm, fa = [], [], [], []
    if on_cpu:
        va = [needs_gpu(f"{SIZE} elements (GPU memory)", provider=p, size=SIZE, dtype="float16")
              for p in ("triton_writeup", "triton")]
        rd = [needs_gpu(f"{SIZE} elements (GPU memory)", provider=p, size=SIZE, p=0.5, dtype="float16")
              for p in ("triton_writeup", "triton_fused")]
        sm = [needs_gpu("GPU memory", provider=p, n_rows=524289, n_cols=4096, elements=524289 * 4096, dtype="float16",
                        atol=1e-3) for p in ("triton_writeup", "triton_fused")]
        fa = [needs_gpu("GPU memory", provider="triton_flash", batch=4400, heads=16, seq=256, d=128, dtype="bfloat16",
                        elements=2306867200)]
    else:
        params = dict(size=SIZE, dtype="float16")
        va.append(row("exact_match", writeup_exact, "bool", provider="triton_writeup", **params) if writeup == "ok"
                  else outcome(writeup, provider="triton_writeup", **params))
        va.append(row("exact_match", True, "bool", provider="triton", **params) if project == "ok"
                  else outcome(project, provider="triton", **params))
        params = dict(size=SIZE, p=0.5, dtype="float16")
        rd.append(outcome("raised" if writeup == "ok" else writeup, provider="triton_writeup", **params))
        rd += ([row("tail_drop_rate", 0.5 + rate_error, provider="triton_fused", **params),
                row("tail_survivors_max_ulp", tail_ulp, provider="triton_fused", **params),
                row("tail_head_mask_agreement", 0.5 + agreement_error, provider="triton_fused", **params),
                row("expected_agreement", 0.5, provider="triton_fused", **params),
                row("backward_same_mask_tail", backward_same_mask, "bool", provider="triton_fused", **params)]
               if project == "ok" else [outcome(project, provider="triton_fused", **params)])
        for n_rows, n_cols in ((524289, 4096), (32769, 65536)):
            params = dict(n_rows=n_rows, n_cols=n_cols, elements=n_rows * n_cols, dtype="float16")
            fixed = {} if scaled else dict(atol=1e-3)
            sm.append(row("max_abs_diff", float("nan"), provider="triton_writeup", **params, **fixed,
                          **({"tolerance": 1e-6} if scaled else {})))  # int32 offsets: NaN rows
            sm += [row("max_abs_diff", softmax_forward, provider="triton_fused", **params, **fixed,
                       **({"tolerance": 1e-6} if scaled else {})),
                   row("backward_max_abs_diff", softmax_backward, provider="triton_fused", **params, **fixed,
                       **({"tolerance": 2e-5} if scaled else {}))]
        for bh in (0, 65535, 70399):
            for variant in ("out", "dq", "dk", "dv"):
                params = dict(provider="triton_flash", variant=variant, batch=4400, heads=16, seq=256, d=128,
                              dtype="bfloat16", elements=2306867200, eps=0.01, bh=bh)
                good = flash_matches or not (bh == 65535 and variant == "dq")
                nan = flash_nan and bh == 70399 and variant in ("dk", "dv")  # as the H200 gave at 918f469
                fa += [row("max_abs_diff", float("nan") if nan else 0.0039 if good else 0.5, **params),
                       row("matches", good and not nan, "bool", **params)]
        # every head scanned: dk/dv NaN from head 65536 (flash_nan), or at heads between the checked ones
        for variant in ("out", "dq", "dk", "dv"):
            params = dict(provider="triton_flash", variant=variant, batch=4400, heads=16, seq=256, d=128,
                          dtype="bfloat16", elements=2306867200, eps=0.01)
            bad = (flash_nan or flash_nonfinite_unchecked) and variant in ("dk", "dv")
            params["tile_bwd_dkdv"] = "64x128/w4/s2/ws"
            fa.append(row("nonfinite_heads", 4864 if flash_nan else 3 if bad else 0, **params))
            if bad:
                fa.append(row("first_nonfinite_head", 65536 if flash_nan else 100, **params))
    origin = CPU if on_cpu else GPU
    return {"vector_add/limits": frame(va, origin), "relu_dropout/limits": frame(rd, origin),
            "softmax/limits": frame(sm, origin), "flash_attention/limits": frame(fa, origin)}


def printed_not_run_here():
    """The project's kernels measured past 2^31 elements, the printed ones recorded as needing a GPU."""
    gpu, cpu = limits(), limits(on_cpu=True)
    return {k: pd.concat([gpu[k][gpu[k]["provider"] != "triton_writeup"], cpu[k][cpu[k]["provider"] == "triton_writeup"]],
                         ignore_index=True) for k in gpu}


# --- the cases: (claim, tables, verdict, what `measured` must say) -------------------------------------------------

def case(claim_id, build, expected, *says, id):
    return pytest.param(claim_id, build, expected, says, id=f"{claim_id}-{id}")


CASES = [
    # 1: vector add is bit-exact
    case(1, vector_add, REPRODUCED, "triton_writeup: bit-exact in 6/6 cases", "incl. 1, 1025 (not multiples of 1024)",
         id="exact"),
    case(1, lambda: vector_add(bf16_on_cpu=True), REPRODUCED, "(6 bf16 cases need a GPU", id="exact-bf16-needs-gpu"),
    case(1, lambda: vector_add(wrong=[("triton", 1025)]), NOT_REPRODUCED, "triton: bit-exact in 4/6 cases",
         id="one-size-wrong"),
    case(1, lambda: vector_add(sizes=(1024, 4096)), NOT_SETTLED, "incl. none (not multiples of 1024)",
         "no size that is not a multiple of 1024", id="only-whole-blocks"),

    # 2: drop rates within the band, survivors scaled to max_ulp (a few ulp up to nuance_ulp: a nuance)
    case(2, statistics, REPRODUCED, "triton_writeup: seed 0: p=0.1: 0.1005", "triton_fused", id="in-band-exact"),
    case(2, lambda: statistics(ulp=S[2]["max_ulp"] + 1), NUANCE, f"within {S[2]['max_ulp'] + 1:.0f} ulp", "not bit-exact",
         id="few-ulp"),
    case(2, lambda: statistics(ulp={"triton_writeup": 0.0, "triton_fused": S[2]["nuance_ulp"]}), NUANCE,
         id="one-kernel-few-ulp"),
    case(2, lambda: statistics(ulp=S[2]["nuance_ulp"] + 1), NOT_REPRODUCED, id="many-ulp"),
    case(2, lambda: statistics(rate_error=2 * TOLERANCE), NOT_REPRODUCED, id="rate-out-of-band"),
    case(2, lambda: statistics(worst=1.5 * TOLERANCE), NOT_REPRODUCED, "worst |rate - p| is 0.0150 (band 0.01)",
         id="one-seed-in-band-others-not"),
    case(2, lambda: statistics(size=1000), NOT_SETTLED, "the writeup's setup is size 100000 at p = 0.1, 0.5, 0.9",
         "this table has size 1000", id="not-the-writeups-size"),
    case(2, lambda: statistics(ps=(0.1,)), NOT_SETTLED, "no p = 0.5, 0.9", id="not-every-p"),

    # 3: the distribution tests pass; a reference from the seed makes allclose work (false as stated)
    case(3, statistics, FALSE_POINT_HOLDS, "mask identical in 3/3, allclose in 3/3", "allclose can check dropout",
         id="seed-reference-matches"),
    case(3, lambda: statistics(close_ref={"triton_writeup": True, "triton_fused": False}), NOT_SETTLED,
         "allclose in 0/3 cases", "cannot say whether allclose can check dropout", id="seed-reference-differs"),
    case(3, lambda: {k: v[~v["metric"].isin(["mask_equals_seed_reference", "allclose_seed_reference"])]
                     for k, v in statistics().items()}, NOT_SETTLED, "no kernel was checked against a reference",
         id="no-seed-reference-in-old-tables"),
    case(3, lambda: statistics(pvalue=S[3]["alpha"] / 2), NOT_REPRODUCED, id="binomial-test-fails"),
    case(3, lambda: statistics(r=-2 * S[3]["max_neighbour_r"]), NOT_REPRODUCED, id="neighbours-correlated"),
    case(3, lambda: statistics(agreement_gap=2 * S[3]["max_agreement_gap"]), NOT_REPRODUCED, id="seeds-not-independent"),
    case(3, lambda: {k: v[v["metric"] != "same_seed_identical"] for k, v in statistics().items()}, NOT_SETTLED,
         "lack a test this check reads", id="no-same-seed-test"),
    case(3, lambda: {k: v.iloc[:0] for k, v in statistics().items()}, NOT_SETTLED, "holds no measurement",
         id="empty-table"),
    case(3, lambda: statistics(same=False, mask_ref=False, close_ref=False), REPRODUCED,
         "same seed -> identical output: False", "no reference can match it", id="not-deterministic"),

    # 4: subtracting the max keeps softmax finite and accurate
    case(4, stability, REPRODUCED, "naive exp(x): 50% non-finite at scale 1000", "first non-finite at scale 100",
         id="stable"),
    case(4, lambda: stability(fused_diff=10 * S[4]["atol"]), NOT_REPRODUCED, id="finite-but-inaccurate"),
    case(4, lambda: stability(fused_nonfinite=0.1), NOT_REPRODUCED, id="fused-overflows"),
    case(4, lambda: stability(naive_from=None), NOT_REPRODUCED, id="naive-never-overflows"),

    # 5: BLOCK_SIZE=1024 on the small input
    case(5, lambda: bug({("hardcoded", N5): dict(exact=True)}), REPRODUCED, "bit-exact True", id="bit-exact"),
    case(5, bug, FALSE_POINT_HOLDS, "bit-exact False, within atol True", "matches to rounding", id="to-rounding"),
    case(5, lambda: bug({("hardcoded", N5): dict(matches=False, diff=0.3)}), NOT_REPRODUCED, "within atol False",
         id="wrong"),
    case(5, lambda: bug({("hardcoded", N5): dict(raised="RuntimeError: boom")}), NOT_REPRODUCED, "RuntimeError: boom",
         id="raised"),

    # 6: wrong at 2000, silently
    case(6, bug, REPRODUCED, f"{N6 - BLOCK} columns never written, 0 warnings", f"writeup {S[6]['writeup_max_abs_diff']:g}",
         id="silently-wrong"),
    case(6, lambda: bug({("hardcoded", N6): dict(warnings=1)}), NOT_REPRODUCED, "1 warnings", id="warns"),
    case(6, lambda: bug({("hardcoded", N6): dict(dropped=0)}), NOT_REPRODUCED, "matches torch True", id="right"),
    case(6, lambda: bug({("hardcoded", N6): dict(raised="RuntimeError: boom")}), NOT_REPRODUCED, "not silent",
         id="raised"),

    # 7: next_power_of_2 fixes 2000
    case(7, bug, REPRODUCED, "matches torch True", id="fixed"),
    case(7, lambda: bug({("dynamic", N6): dict(matches=False, diff=0.2)}), NOT_REPRODUCED, "matches torch False",
         id="still-wrong"),
    case(7, lambda: bug({("dynamic", N6): dict(raised="RuntimeError: boom")}), NOT_REPRODUCED, "RuntimeError: boom",
         id="raised"),

    # 8: the sweep: exact drops; the fix never breaks below Triton's largest block, and breaks loudly past it
    case(8, lambda: bug(n_cols=[n for n in SWEEP if n <= MAX_BLOCK]), REPRODUCED, "in every case: True",
         "wherever it ran", id="never-breaks"),
    case(8, bug, FALSE_POINT_HOLDS, f"dynamic raises at n_cols = {N19}",
         "\"numel (2097152) exceeds triton maximum tensor numel (1048576)\"", "past 2^20", id="breaks-past-largest-block"),
    case(8, lambda: bug({("dynamic", 4096): dict(raised=TOO_BIG)}), NOT_REPRODUCED, f"dynamic raises at n_cols = 4096, {N19}",
         id="breaks-below-largest-block"),
    case(8, lambda: bug({("hardcoded", 1025): dict(dropped=0)}), NOT_REPRODUCED, "in every case: False",
         id="drops-not-exact"),
    case(8, lambda: bug({("dynamic", N6): dict(dropped=48, matches=False)}), NOT_REPRODUCED, "up to 4096): False",
         id="dynamic-drops"),

    # 9: attention matches SDPA at the writeup's shapes
    case(9, attention_correctness, REPRODUCED, "Q(5,32)/K,V(15,32): float32 max|triton - SDPA| 0.001 (tf32)",
         "all 12 shape x dtype cases (head dims 16, 32, 64)", id="matches"),
    case(9, lambda: attention_correctness(bf16_on_cpu=True), REPRODUCED, "(6 bf16 cases need a GPU", id="bf16-needs-gpu"),
    case(9, lambda: attention_correctness(wrong=[("triton_writeup", SHAPES[1])]), NOT_REPRODUCED,
         "float32 max|triton - SDPA| 0.4", id="printed-wrong-at-a-writeup-shape"),
    case(9, lambda: attention_correctness(wrong=[("triton", (16, 16, 16))]), NOT_REPRODUCED,
         "within the FlashAttention error rule: False", id="wrong-at-another-shape"),

    # 10: the wall: a wrong output is 'not gracefully'; a clean exception with right outputs is graceful
    case(10, lambda: attention_wall(("float16", 64, 1024, 1025, [1024]), ("float32", 64, 512, 513)), REPRODUCED,
         "not gracefully: wrong output at n_k = 1024", id="wrong-before-the-wall"),
    case(10, lambda: attention_wall(("float16", 64, 1024, 1025), ("float32", 64, 512, 513)), FALSE_POINT_HOLDS,
         "n_k = 513..1025", "out of resource: shared memory, Required: 327680", "gracefully", id="graceful-wall-moves"),
    case(10, lambda: attention_wall(("float16", 64, 1024, 1025), ("float16", 128, 1024, 1025)), FALSE_POINT_HOLDS,
         "the wall is at n_k = 1025 in every case", id="graceful-one-wall"),
    case(10, lambda: attention_wall(("float16", 64, 1024, 1025), ("float16", 32, 131072, None)), FALSE_POINT_HOLDS,
         "float16 d=32: ran every n_k up to 131072, no wall in the sweep", id="graceful-one-without-wall"),
    case(10, lambda: attention_wall(("float16", 64, 131072, None)), NOT_REPRODUCED, "no wall in the sweep", id="no-wall"),
    case(10, lambda: attention_wall(("float16", 64, 1024, 1025), ("float16", 48, 1024, 1025, [64, 128, 1024])),
         FALSE_POINT_HOLDS, "wrong at the padded head dims [48]: claim 18's bug, not the wall", "gracefully",
         id="padded-head-dim-wrong-everywhere"),
    case(10, lambda: {"attention/wall": compiled_only()}, NEEDS_GPU, "n_k=128: 20480 B, n_k=512: 81920 B",
         id="compiled-only"),

    # 11: 'tens of kilobytes per SM' ([low, high) bytes), 'not gigabytes' (min_ratio x smaller than device memory)
    case(11, lambda: ceilings(LOW, LOW, LOW * RATIO), REPRODUCED, f"{LOW} B", "within 'tens of kilobytes'",
         id="tens-of-kib"),
    case(11, lambda: ceilings(None, (LOW + HIGH) // 2, 2 ** 34), REPRODUCED, f"{(LOW + HIGH) // 2} B",
         id="per-block-when-no-per-sm"),
    case(11, lambda: ceilings(HIGH, HIGH - 1024, HIGH * RATIO), FALSE_POINT_HOLDS, f"{HIGH} B", "tiny next to device memory",
         id="hundred-kib-point-holds"),
    case(11, lambda: ceilings(H200_SM, H200_SM - 1024, 141 * 2 ** 30), FALSE_POINT_HOLDS, "228 KiB", id="h200"),
    case(11, lambda: ceilings(H200_SM, H200_SM - 1024, H200_SM * RATIO - 1), NOT_REPRODUCED, id="not-small-next-to-memory"),
    case(11, lambda: {"calibration/ceilings": frame([needs_gpu("measuring the device's ceilings")], CPU)}, NEEDS_GPU,
         id="interpreter"),

    # 12: fused kernels win by fewer round trips
    case(12, lambda: fusion(*FAST), REPRODUCED, "faster at every size (4096..16777216)", id="faster-everywhere"),
    case(12, lambda: fusion(*FAST, writeup_over_fused=0.99 * S[12]["flops_matter_ratio"]), REPRODUCED,
         id="writeup-slower-by-less-than-flops-ratio"),
    case(12, lambda: fusion(*FAST, writeup_over_fused=1.01 * S[12]["flops_matter_ratio"]), NUANCE,
         f"{1.01 * S[12]['flops_matter_ratio']:.2f}x the time at {2 ** 24}", "fewer operations",
         id="writeup-bound-by-its-rng"),
    case(12, lambda: fusion(*COSTLIER), NUANCE, "faster at every size", "costs more than its round trips",
         id="time-ratio-above-bytes-ratio"),
    case(12, lambda: fusion(*CHEAPER), NUANCE, "faster at every size", "round trips are not all of it",
         id="time-ratio-below-bytes-ratio"),
    case(12, lambda: fusion(*LAUNCH_BOUND), NUANCE, f"below {2 ** 24}", "per-call cost", id="crossover-launch-bound"),
    case(12, lambda: fusion(*GROWING), NUANCE, "more than per-call cost", id="crossover-not-launch-bound"),
    case(12, lambda: fusion(*ONE_SLOW), NUANCE, "no crossover", f"at {2 ** 16}", id="one-slow-timing"),
    case(12, lambda: fusion(*SLOWER), NOT_REPRODUCED, "slower at the largest size", id="slower"),
    case(12, no_timings, NEEDS_GPU, "time needs a GPU", id="interpreter"),

    # 13: flash attention runs past the wall
    case(13, past_wall, REPRODUCED, "every n_k up to 65537 (float16, d=64)", "fails at n_k=1025", "8/8 within the rule",
         id="past-the-wall"),
    case(13, lambda: past_wall(on_cpu=True), NEEDS_GPU, "interpreter has no shared-memory limit", id="interpreter"),
    case(13, lambda: past_wall(lengths=(256, 1024)), NOT_REPRODUCED, "up to 1024", id="stops-before-the-wall"),
    case(13, lambda: past_wall(wrong_at=(4096,)), NOT_REPRODUCED, "at 2/3 lengths", id="wrong-past-the-wall"),
    case(13, lambda: past_wall(grid_wrong=True), NOT_REPRODUCED, "6/8 within the rule", id="grid-wrong"),
    case(13, lambda: past_wall(walls=(("float16", 64, 131072, None),)), NOT_REPRODUCED, "fails at n_k=None",
         id="no-wall-in-the-sweep"),

    # 14: without the mask the last block reads and writes past the end
    case(14, mask_table, REPRODUCED, "24 of 24 elements past the end at size 1000", id="past-the-end"),
    case(14, lambda: mask_table(0), NOT_REPRODUCED, "0 of 24", id="nothing-past-the-end"),
    case(14, lambda: mask_table(5), NOT_REPRODUCED, "5 of 24", id="fewer-than-expected"),
    case(14, lambda: mask_table(24, masked_written=3), NOT_REPRODUCED, "with the mask: 3 written", id="mask-leaks"),

    # 15: 'a hundredth of a percent' (literal) vs the band the writeup used (claim 2's band)
    case(15, lambda: statistics(S[15]["literal"] / 2), REPRODUCED,
         f"'a hundredth of a percent' is {S[15]['literal']:g}", id="literally"),
    case(15, lambda: statistics((S[15]["literal"] + S[2]["band"]) / 2), FALSE_POINT_HOLDS, "literally false",
         "printed rates miss p by up to 0.0007", id="a-hundredth"),
    case(15, lambda: statistics(2 * S[2]["band"]), NOT_REPRODUCED, "max |rate - p| = 0.0200", id="out-of-band"),
    case(15, lambda: statistics(size=1000), NOT_SETTLED, "the writeup's setup is size 100000", id="not-the-writeups-size"),

    # 16: the buggy kernel writes softmax of the first block
    case(16, bug, REPRODUCED, "columns [0, 1024) hold softmax(x[:, :1024])", f"1..{N19 - BLOCK} columns are never written",
         id="first-block"),
    case(16, lambda: bug({("hardcoded", N6): dict(first_diff=0.3)}), NOT_REPRODUCED, "max |diff| 0.3", id="not-softmax"),
    case(16, lambda: bug({("hardcoded", 4096): dict(dropped=10)}), NOT_REPRODUCED, id="drops-differ"),
    case(16, lambda: bug(n_cols=[5, 1000, 1024]), NOT_REPRODUCED, "no n_cols wider than the block", id="no-wide-row"),

    # 17: torch.softmax is several kernels; if one, the op-by-op version must cost min_naive_slowdown x its time
    case(17, lambda: passes({"float32": SEVERAL}, {"float32": 1.0}), REPRODUCED,
         f"launches {SEVERAL} CUDA kernel(s) (cunn_SoftMaxForward)", "moving 2x the input's bytes", id="several-kernels"),
    case(17, lambda: passes({"float32": 1}, {"float32": MIN_SLOWDOWN}), NUANCE, f"{MIN_SLOWDOWN:.2f}x torch.softmax's time",
         "one fused kernel", id="one-kernel-naive-slower"),
    case(17, lambda: passes({"float32": SEVERAL, "bfloat16": 1}, {"float32": 1.0, "bfloat16": 2 * MIN_SLOWDOWN}), NUANCE,
         "float32 4096x4096", "bfloat16 4096x4096", id="weakest-of-two-dtypes"),
    case(17, lambda: passes({"float32": 1}, {"float32": 0.9 * MIN_SLOWDOWN}), NOT_REPRODUCED, "takes only", id="naive-as-fast"),
    case(17, lambda: passes({"float32": 1}, {}), NEEDS_GPU, f"not timed at {PASSES_COLS} columns", id="width-not-timed"),
    case(17, lambda: {"softmax/passes": frame([needs_gpu("counting the CUDA kernels a call launches")], CPU),
                      "softmax/performance": frame([needs_gpu("timing softmax")], CPU)}, NEEDS_GPU,
         "counting the CUDA kernels", id="interpreter"),

    # 18: the printed attention kernel is wrong exactly where its head-dim block pads d (not a power of two, < 16)
    case(18, lambda: head_dims(printed_wrong=(8, 48, 80), dims=(8, 32, 48, 64, 80)), REPRODUCED,
         "triton_writeup: wrong (outside the FlashAttention rule) at d = [8, 48, 80]", "d=48: 0.92",
         "triton: wrong (outside the FlashAttention rule) at d = none", "below 16", id="wrong-exactly-where-padded"),
    case(18, head_dims, NUANCE, "at d = [48, 80]", "no head dim below 16", id="nothing-below-16-measured"),
    case(18, lambda: head_dims(printed_wrong=(8,), dims=(8, 32, 64)), NUANCE, "no head dim of 16 or more",
         id="no-odd-dim-measured"),
    case(18, lambda: head_dims(printed_wrong=(48,)), NUANCE, "at d = [48]", "only in part", id="wrong-at-some"),
    case(18, lambda: head_dims(dims=(8, 32, 48, 64, 80)), NUANCE, "pads the head dims [8, 48, 80]",
         id="right-below-16"),
    case(18, lambda: head_dims(fixed_wrong=(80,)), NOT_REPRODUCED, "triton: wrong (outside the FlashAttention rule) at d = [80]",
         id="fix-wrong"),
    case(18, lambda: head_dims(printed_wrong=(), dims=(32, 64)), NOT_REPRODUCED, id="only-powers-of-two"),
    case(18, lambda: head_dims(on_cpu=True), NEEDS_GPU, "no head dim was run here: 8 cases need a GPU", id="nothing-run"),

    # 19: the fix raises past 2^20 columns; the project's softmax is right there
    case(19, past_largest_block, REPRODUCED, "raises \"numel (2097152) exceeds", "within atol at 8/8 cases",
         f"widths [{WIDE[0]}, {WIDE[1]}]", id="fix-raises-project-right"),
    case(19, lambda: past_largest_block(gpu_only=(WIDE[1],)), REPRODUCED, f"(widths [{WIDE[1]}] need a GPU)",
         id="widest-needs-gpu"),
    case(19, lambda: past_largest_block({("dynamic", N19): dict(raised=False)}), NOT_REPRODUCED, "ran, max |diff|",
         id="fix-runs"),
    case(19, lambda: past_largest_block(bad=[("bfloat16", WIDE[0], "backward")]), NOT_REPRODUCED, "within atol at 7/8",
         id="project-wrong"),
    case(19, lambda: past_largest_block(gpu_only=(WIDE[0],), only=(2000, WIDE[0])), NEEDS_GPU,
         f"widths [2000] (widths [{WIDE[0]}] need a GPU)", id="only-narrower-widths-ran-here"),
    case(19, lambda: past_largest_block(only=(2000,)), NOT_SETTLED, "widths [2000]", f"no width of {N19} columns",
         id="no-width-past-the-fix"),
    case(19, lambda: past_largest_block(gpu_only=WIDE), NEEDS_GPU, f"widths none (widths [{WIDE[0]}, {WIDE[1]}] need a GPU)",
         id="all-widths-need-gpu"),

    # 20: past 2^31 elements the printed kernels fail, the project's are right
    case(20, limits, REPRODUCED, f"vector_add triton_writeup at {SIZE} elements: raised: AcceleratorError: CUDA error: "
         "an illegal memory access was encountered", f"softmax triton_writeup at {524289 * 4096} elements: WRONG",
         f"relu_dropout triton_fused at {SIZE} elements: correct", id="printed-fail-project-right"),
    case(20, lambda: limits(writeup="crashed"), REPRODUCED, "crashed: child died", id="printed-crash"),
    case(20, lambda: limits(on_cpu=True), NEEDS_GPU, "not run in the interpreter", id="interpreter"),
    case(20, printed_not_run_here, NEEDS_GPU, "the kernels as printed were not run here", id="printed-not-run"),
    case(20, lambda: limits(writeup="ok", writeup_exact=True), NOT_REPRODUCED,
         f"vector_add triton_writeup at {SIZE} elements: correct", id="printed-right"),
    case(20, lambda: limits(writeup="ok", writeup_exact=False), REPRODUCED,
         f"vector_add triton_writeup at {SIZE} elements: WRONG", id="printed-wrong-result"),
    case(20, lambda: limits(project="crashed"), NOT_REPRODUCED, f"vector_add triton at {SIZE} elements: crashed",
         id="project-crashes"),
    case(20, lambda: limits(rate_error=2 * TOL), NOT_REPRODUCED, f"relu_dropout triton_fused at {SIZE} elements: WRONG",
         id="tail-rate-off"),
    case(20, lambda: limits(agreement_error=2 * TOL), NOT_REPRODUCED, id="tail-mask-agrees-with-head"),
    case(20, lambda: limits(tail_ulp=ULP + 1), NOT_REPRODUCED, id="tail-survivors-off"),
    case(20, lambda: limits(backward_same_mask=False), NOT_REPRODUCED, id="backward-mask-differs"),
    case(20, lambda: limits(softmax_forward=2e-3), NOT_REPRODUCED, "softmax triton_fused at 2147487744 elements: WRONG",
         id="softmax-forward-off"),
    case(20, lambda: limits(softmax_backward=5e-3), NOT_REPRODUCED, id="softmax-backward-off"),
    case(20, lambda: limits(softmax_forward=1e-4), NOT_REPRODUCED, "WRONG", id="softmax-zeros-under-a-fixed-atol"),
    case(20, lambda: limits(softmax_backward=1e-4), NOT_REPRODUCED, id="softmax-backward-past-its-scaled-tolerance"),
    case(20, lambda: limits(scaled=False), REPRODUCED, id="softmax-older-tables-one-atol"),
    case(20, lambda: limits(scaled=False, softmax_backward=3.9e-3), REPRODUCED, id="softmax-older-tables-backward-slack"),
    case(20, lambda: limits(scaled=False, softmax_backward=5e-3), NOT_REPRODUCED, id="softmax-older-tables-backward-off"),
    case(20, lambda: limits(flash_matches=False), NOT_REPRODUCED,
         re.compile(r"flash_attention triton_flash at 2306867200 elements[^;]*: WRONG"), id="flash-wrong-past-65535"),
    case(20, lambda: limits(flash_nan=True), NOT_REPRODUCED,
         "WRONG (max |diff| nan), wrong: dk at head 70399, dv at head 70399; not finite: dk at 4864 heads from head 65536, "
         "dv at 4864 heads from head 65536 (tiles: bwd_dkdv 64x128/w4/s2/ws)", id="flash-nan-gradients"),
    case(20, lambda: limits(flash_nonfinite_unchecked=True), NOT_REPRODUCED,
         "WRONG (max |diff| 0.0039); not finite: dk at 3 heads from head 100, dv at 3 heads from head 100",
         id="flash-nan-between-the-checked-heads"),
]


# --- proof that CASES drive every branch ----------------------------------------------------------------------------

VERDICT_NAMES = {"REPRODUCED", "NUANCE", "FALSE_POINT_HOLDS", "NOT_REPRODUCED", "NEEDS_GPU"}


def _verdict_sites(fn):
    """The verdicts ``fn``'s source names, and each simple statement naming one, as (first, last) file lines."""
    lines, start = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in VERDICT_NAMES}
    sites = sorted((start + s.lineno - 1, start + s.end_lineno - 1) for s in ast.walk(tree)
                   if isinstance(s, ast.stmt) and not hasattr(s, "body")  # a simple statement: return, append, ...
                   and any(isinstance(n, ast.Name) and n.id in VERDICT_NAMES for n in ast.walk(s)))
    return names, sites


def _traced(fn, call):
    """Run ``call``; return its result and the lines of ``fn`` it executed."""
    code, hit = fn.__code__, set()

    def local(frame, event, arg):
        if event == "line":
            hit.add(frame.f_lineno)
        return local

    old = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        result = call()
    finally:
        sys.settrace(old)
    return result, hit


RUNS = {}  # (claim, builder) -> (measured, verdict, lines of the check it executed): shared with the coverage test


def run_case(claim_id, build):
    """A case's check on its tables (built untraced: tracing costs a call per Python frame), once per session."""
    if (claim_id, build) not in RUNS:
        tables = build()
        (measured, got), lines = _traced(units.checks()[claim_id].fn, lambda: verdict(claim_id, tables))
        RUNS[claim_id, build] = measured, got, lines
    return RUNS[claim_id, build]


@pytest.mark.parametrize("claim_id, build, expected, says", CASES)
def test_verdict(claim_id, build, expected, says):
    measured, got, _ = run_case(claim_id, build)
    assert got == expected, measured
    for text in says:  # the numbers that decided it are named
        assert (text.search(measured) if isinstance(text, re.Pattern) else text in measured), (text, measured)


def test_cases_reach_every_verdict_and_every_verdict_statement_of_every_check():
    reached, executed = defaultdict(set), defaultdict(set)
    for p in CASES:
        claim_id, build, expected, _ = p.values
        _, got, lines = run_case(claim_id, build)
        assert got == expected, p.id
        reached[claim_id].add(got)
        executed[claim_id] |= lines
    gaps = []
    for claim_id, check in sorted(units.checks().items()):
        names, sites = _verdict_sites(check.fn)
        assert names, f"claim {claim_id}: {check.fn.__name__} names no verdict"
        missing = {getattr(claims, n) for n in names} - reached[claim_id]
        if missing:
            gaps.append(f"claim {claim_id} ({check.fn.__name__}): no case gives {sorted(missing)}")
        for first, last in sites:
            if not executed[claim_id] & set(range(first, last + 1)):
                gaps.append(f"claim {claim_id} ({check.fn.__name__}): no case runs line {first} of "
                            f"{inspect.getsourcefile(check.fn)}")
    assert not gaps, "\n".join(gaps)


def _example(t, s):
    if t:
        return "x", NEEDS_GPU
    verdicts = [REPRODUCED if s else NUANCE]
    return "y", verdicts[0]


def test_the_coverage_finds_verdicts_and_the_statements_that_name_them_and_sees_which_ran():
    names, sites = _verdict_sites(_example)
    assert names == {"NEEDS_GPU", "REPRODUCED", "NUANCE"}
    first = inspect.getsourcelines(_example)[1]
    assert sites == [(first + 2, first + 2), (first + 3, first + 3)]
    result, lines = _traced(_example, lambda: _example(False, True))
    assert result == ("y", REPRODUCED)
    assert first + 3 in lines and first + 2 not in lines  # the early return did not run


def test_head_dims_printed_kernel_right_everywhere_is_not_reproduced():
    measured, got = verdict(18, head_dims(printed_wrong=()))
    assert "at d = none" in measured
    assert got == NOT_REPRODUCED, measured


# --- settle ---------------------------------------------------------------------------------------------------------

def test_settle_a_missing_table_is_not_settled_naming_it():
    out = claims.settle(CLAIMS_LIST, {"softmax/passes": passes({"float32": 1}, {})["softmax/passes"]}).set_index("id")
    assert out.loc[17, "verdict"] == NOT_SETTLED
    assert "softmax/performance missing" in out.loc[17, "measured"]
    assert "softmax/passes" not in out.loc[17, "measured"]
    assert "missing" in out.loc[1, "measured"]


def test_settle_passes_a_check_its_verdict_and_leaves_the_rest_not_settled():
    out = claims.settle(CLAIMS_LIST, {**bug(), **passes({"float32": 1}, {"float32": MIN_SLOWDOWN})}).set_index("id")
    assert out.loc[6, "verdict"] == REPRODUCED and out.loc[8, "verdict"] == FALSE_POINT_HOLDS
    assert out.loc[17, "verdict"] == NUANCE
    assert out.loc[19, "verdict"] == NOT_SETTLED and "softmax/wide missing" in out.loc[19, "measured"]
    assert list(out.columns) == ["claim", "said", "measured", "verdict", "figure"]


def test_settle_a_failed_table_is_not_settled_with_its_error():
    failed = frame([row("failed", None, status="failed",
                        error="Traceback (most recent call last):\n  File \"x.py\"\nRuntimeError: boom")])
    out = claims.settle(CLAIMS_LIST, {"vector_add/correctness": failed}).set_index("id")
    assert out.loc[1, "verdict"] == NOT_SETTLED
    assert "vector_add/correctness job failed (RuntimeError: boom)" in out.loc[1, "measured"]


def test_settle_a_table_from_an_older_project_is_not_settled_naming_what_it_lacks():
    old = bug()["softmax/bug"]
    old = old[old["metric"] != "exact_match"]  # as results/nvidia-h200-x2 recorded it, before exact_match
    out = claims.settle(CLAIMS_LIST, {"softmax/bug": old}).set_index("id")
    assert out.loc[5, "verdict"] == NOT_SETTLED and "exact_match" in out.loc[5, "measured"]
    assert out.loc[6, "verdict"] == REPRODUCED  # the checks that read only what it has still settle


def test_settle_refuses_an_unknown_verdict(monkeypatch):
    units.checks()  # every unit loaded (and its checks registered) before one is replaced
    monkeypatch.setitem(units.CHECKS, 1, units.Check(1, ("vector_add/correctness",), lambda t, s: ("x", "maybe")))
    with pytest.raises(ValueError, match="claim 1: unknown verdict 'maybe'"):
        claims.settle(CLAIMS_LIST, vector_add())


# --- a selection the tables lack: not settled, never read as a result ------------------------------------------------

def _without_printed_limits():
    return {k: v[v["provider"] != "triton_writeup"] for k, v in limits().items()}


LACKING = [  # (claim, tables lacking what its check selects, what the 'not settled' text must name)
    pytest.param(5, lambda: bug(n_cols=[n for n in SWEEP if n != N5]), f"n_cols={N5}", id="5-probe-point-not-swept"),
    pytest.param(6, lambda: {k: v[v["variant"] != "hardcoded"] for k, v in bug().items()}, "variant=hardcoded",
                 id="6-no-hardcoded-variant"),
    pytest.param(8, lambda: {k: v[v["metric"] != "columns_dropped"] for k, v in bug().items()}, "columns_dropped",
                 id="8-no-columns-dropped"),
    pytest.param(9, lambda: attention_correctness(missing=[SHAPES[0]]), "Q(5,32)/K,V(15,32)", id="9-writeup-shape-not-run"),
    pytest.param(9, lambda: {k: v.assign(provider="") for k, v in attention_correctness().items()}, "triton_writeup",
                 id="9-no-provider-column-values"),
    pytest.param(10, lambda: {k: v[v["metric"] != "matches"] for k, v in
                              attention_wall(("float16", 64, 1024, 1025)).items()}, "matches",
                 id="10-no-matches-before-the-wall"),
    pytest.param(13, lambda: {**past_wall(), "flash_attention/correctness": past_wall()["flash_attention/correctness"].iloc[:0]},
                 "flash_attention/correctness", id="13-empty-correctness-grid"),
    pytest.param(13, lambda: {k: v[v["metric"] != "matches"] if k == "flash_attention/past_wall" else v
                              for k, v in past_wall().items()}, "flash_attention/past_wall", id="13-past-wall-without-matches"),
    pytest.param(13, lambda: past_wall(walls=(("float32", 64, 512, 513),)), "float16", id="13-wall-not-swept-there"),
    pytest.param(16, lambda: {k: v[v["metric"] != "diff_vs_softmax_of_written_columns"] for k, v in bug().items()},
                 "diff_vs_softmax_of_written_columns", id="16-no-first-block-diff"),
    pytest.param(18, lambda: head_dims(providers=("triton",)), "triton_writeup", id="18-printed-kernel-not-run"),
    pytest.param(18, lambda: head_dims(providers=("triton_writeup",)), "besides 'triton_writeup'", id="18-fix-not-run"),
    pytest.param(19, lambda: past_largest_block(n_cols=[n for n in SWEEP if n != N19]), f"n_cols={N19}",
                 id="19-fix-not-probed"),
    pytest.param(20, _without_printed_limits, "triton_writeup", id="20-printed-kernels-not-in-the-tables"),
]


@pytest.mark.parametrize("claim_id, build, names", LACKING)
def test_a_selection_the_tables_lack_leaves_the_claim_not_settled_naming_it(claim_id, build, names):
    out = claims.settle(CLAIMS_LIST, build()).set_index("id")
    assert out.loc[claim_id, "verdict"] == NOT_SETTLED, out.loc[claim_id, "measured"]
    assert "these tables lack what the check reads" in out.loc[claim_id, "measured"]
    assert names in out.loc[claim_id, "measured"], out.loc[claim_id, "measured"]


def test_needed_returns_a_selection_and_names_an_empty_one():
    from lab.summary import needed, ok

    d = vector_add()["vector_add/correctness"]
    assert len(needed(ok(d, metric="exact_match"), "exact_match rows")) == 12
    with pytest.raises(KeyError, match="no exact_match rows of provider x"):
        needed(ok(d, metric="exact_match", provider="x"), "exact_match rows of provider x")
    with pytest.raises(KeyError, match="no values"):
        needed(pd.Series(dtype=bool), "values")


# --- the committed runs: their reports' verdicts, and none from what their tables would lack ---------------------------

COMMITTED = ("nvidia-h200", "nvidia-h100-80gb-hbm3")  # the current runs under results/, reported by these checks


def _committed(run: str) -> dict[str, pd.DataFrame]:
    from lab.compare import run_tables
    from lab.table import read_each

    tables, unreadable = read_each(run_tables(ROOT / "results" / run))
    assert tables and not unreadable, unreadable
    return tables


def _reported(run: str) -> dict[int, str]:
    """The verdict column of the claims table of results/<run>/report.md."""
    section = (ROOT / "results" / run / "report.md").read_text().split("## Claims", 1)[1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in section.splitlines()
             if re.match(r"\| \d+ \| ", line)]
    return {int(c[0]): c[4] for c in cells}


@pytest.mark.parametrize("run", COMMITTED)
def test_a_committed_run_settles_to_the_verdicts_its_report_records(run):
    out = claims.settle(CLAIMS_LIST, _committed(run)).set_index("id")["verdict"].to_dict()
    assert out == _reported(run)


def _unknown(tables: dict, columns) -> dict:
    """Every value of ``columns`` renamed to one no check selects; statuses (and all else) kept."""
    return {k: d.assign(**{c: "unknown_" + d[c].astype(str) for c in columns if c in d}) for k, d in tables.items()}


@functools.cache  # each (run, columns) settled once for all the claims that read it
def _settled_unknown(run: str, columns: tuple) -> pd.DataFrame:
    return claims.settle(CLAIMS_LIST, _unknown(_committed(run), columns)).set_index("id")


@pytest.mark.parametrize("claim_id", sorted(CLAIMS))
@pytest.mark.parametrize("run", COMMITTED)
def test_no_claim_is_decided_by_providers_and_metrics_its_tables_lack(run, claim_id):
    """A committed run's tables with every provider and metric renamed: each check's selections are empty,
    so no claim may be reproduced, not reproduced, a nuance or false as stated. These tables ran on a GPU,
    so 'needs a GPU' would be as wrong as a verdict: each claim is 'not settled'."""
    out = _settled_unknown(run, ("provider", "metric")).loc[claim_id]
    assert out["verdict"] == NOT_SETTLED, out["measured"]


# The checks that select a value of one column (or read only rows that have it): with that column's values
# renamed, each of them is not settled.
SELECTS = {("metric",): sorted(CLAIMS), ("provider",): [4, 9, 12, 15, 17, 18, 20],
           ("variant",): [5, 6, 7, 8, 14, 16, 19], ("direction",): [12, 17]}


@pytest.mark.parametrize("columns", SELECTS, ids="-".join)
@pytest.mark.parametrize("run", COMMITTED)
def test_a_check_that_selects_values_a_table_lacks_is_not_settled(run, columns):
    out = _settled_unknown(run, columns).loc[SELECTS[columns]]
    decided = out[out["verdict"] != NOT_SETTLED]
    assert decided.empty, decided[["verdict", "measured"]].to_string()


# --- check_probes ---------------------------------------------------------------------------------------------------

def _probe_points():
    """(config path, value, the claim check_probes names: the first in claims.yaml that probes it)."""
    points = {}
    for c in CLAIMS_LIST:
        for setting, path in (c.get("probes") or {}).items():
            wanted = c["settings"][setting]
            for value in wanted if isinstance(wanted, list) else [wanted]:
                points.setdefault((path, repr(value)), (path, value, c["id"]))
    return list(points.values())


PROBES = _probe_points()


def _at(config, path):
    node = config
    for part in path.split("."):
        node = node[part]
    return node


def test_probes_of_the_shipped_config_pass():
    assert PROBES  # claims 2, 5-7, 9, 19 probe points
    claims.check_probes(CLAIMS_LIST, CONFIG)


@pytest.mark.parametrize("path, value, claim_id", PROBES, ids=lambda x: str(x))
def test_a_config_without_a_probe_point_is_refused_naming_the_claim(path, value, claim_id):
    config = copy.deepcopy(CONFIG)
    parent, key = path.rsplit(".", 1)
    if isinstance(_at(config, path), list):
        _at(config, path).remove(value)
    else:  # a single value (the dropout statistics' size)
        _at(config, parent)[key] = value + 1
    with pytest.raises(settings.ConfigError, match=rf"claim {claim_id} ") as err:
        claims.check_probes(CLAIMS_LIST, config)
    assert path in str(err.value) and repr(value) in str(err.value)


def test_the_2000_column_probe_names_claim_6():
    config = copy.deepcopy(CONFIG)
    config["softmax"]["bug"]["n_cols"] = [n for n in config["softmax"]["bug"]["n_cols"] if n != 2000]
    with pytest.raises(settings.ConfigError, match=r"softmax\.bug\.n_cols must include 2000: claim 6 "):
        claims.check_probes(CLAIMS_LIST, config)


@pytest.mark.parametrize("drop", [("softmax",), ("softmax", "bug"), ("attention", "correctness")])
def test_a_config_without_the_experiment_passes(drop):
    config = copy.deepcopy(CONFIG)
    *parents, last = drop
    del (_at(config, ".".join(parents)) if parents else config)[last]
    claims.check_probes(CLAIMS_LIST, config)  # the claim will be 'not settled'


# --- the registry matches claims.yaml ------------------------------------------------------------------------------

def test_every_claim_of_the_writeup_has_a_check_and_thresholds_live_in_claims_yaml():
    assert sorted(CLAIMS) == sorted(units.checks()) and len(CLAIMS) == 20
    claims.check_declarations(CLAIMS_LIST)
    sources = {"claims.py": Path(claims.__file__).read_text(),
               **{c.fn.__name__: inspect.getsource(c.fn) for c in units.checks().values()}}
    for name, source in sources.items():
        for number in ("0.01", "0.0001", "1e-4", "10240", "0.00978"):  # thresholds and said values: claims.yaml only
            assert number not in source, (name, number)


def test_settle_an_unreadable_table_is_not_settled_saying_why():
    why = "results/x/softmax/bug.parquet cannot be read as a table (ArrowInvalid: Parquet magic bytes not found)"
    out = claims.settle(CLAIMS_LIST, {}, {"softmax/bug": why}).set_index("id")
    assert out.loc[6, "verdict"] == NOT_SETTLED and out.loc[6, "measured"] == f"not settled: unreadable: {why}"
    assert "unreadable" not in out.loc[1, "measured"]  # a claim that needs other tables says only they are missing


def test_the_weakest_verdict_of_several_cases_leaves_a_claim_open_unless_one_is_not_reproduced():
    from lab.claims import weakest

    assert weakest([REPRODUCED, NOT_SETTLED, NEEDS_GPU]) == NOT_SETTLED
    assert weakest([NOT_SETTLED, NOT_REPRODUCED]) == NOT_REPRODUCED
    assert weakest([REPRODUCED, NUANCE]) == NUANCE
