"""FlashAttention (the next rung, claim 13): correctness of forward and gradients, running past the
writeup's wall, memory that grows O(N), past 2**31 elements and 65535 batch x heads (claim 20), and speed
against SDPA's backends."""
from __future__ import annotations

import contextlib
import os
import tempfile
import time

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch
import torch.nn.functional as F
import yaml

from .. import isolated, plots
from ..claims import NEEDS_GPU, NOT_REPRODUCED, REPRODUCED, bools
from ..providers import FLASH
from ..report import md_table
from ..summary import median, ok
from ..measure import (BF16_IN_INTERPRETER, QUANTILES, bench, is_gpu, lengths, probe_rows, randn, runnable, sdpa_backend_of,
                       timing_rows)
from ..table import needs_gpu, row
from ..verify import attention_eps, flash_errors, max_abs_diff, within_fa_rule
from . import claim, experiment, figure, section
from .calibration import own_ceiling

RUNG = 5  # the rung the writeup did not climb
SCHEMA = yaml.safe_load("""
correctness:
  batch: {$ref: "#/$defs/size"}
  heads: {$ref: "#/$defs/size"}
  base_head_dim: {$ref: "#/$defs/head_dim"}
  base_lengths: {$ref: "#/$defs/pair"}
  lengths: {description: "[seq_q, seq_k] pairs", type: array, items: {$ref: "#/$defs/pair"}, minItems: 1}
  head_dims: {type: array, items: {$ref: "#/$defs/head_dim"}, minItems: 1}
  dtypes: {$ref: "#/$defs/dtypes"}
past_wall:
  n_q: {$ref: "#/$defs/size"}
  head_dim: {$ref: "#/$defs/head_dim"}
  dtype: {$ref: "#/$defs/dtype"}
  log2_n_k: {$ref: "#/$defs/log2_range"}
  memory_lengths: {$ref: "#/$defs/sizes"}
  memory_heads: {$ref: "#/$defs/size"}
limits:
  batch: {$ref: "#/$defs/size"}
  heads: {$ref: "#/$defs/size"}
  seq: {$ref: "#/$defs/size"}
  head_dim: {$ref: "#/$defs/head_dim"}
  dtype: {$ref: "#/$defs/dtype"}
performance:
  tokens: {description: "batch x seq, held constant", type: integer, minimum: 1}
  heads: {$ref: "#/$defs/size"}
  head_dims: {type: array, items: {$ref: "#/$defs/head_dim"}, minItems: 1}
  lengths: {$ref: "#/$defs/sizes"}
  dtype: {$ref: "#/$defs/dtype"}
  first_call:
    description: the cost of a call at a length not seen before (B=1, H=1, D=64)
    type: object
    additionalProperties: false
    required: [tuned_length, new_length, memory_length]
    properties:
      tuned_length: {description: "tuned first; new_length should share its bucket", $ref: "#/$defs/size"}
      new_length: {$ref: "#/$defs/size"}
      memory_length: {description: "peak memory of the first (tuning) call vs later ones", $ref: "#/$defs/size"}
""")
MATH = "torch_math"
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION"}
PROVIDERS = {FLASH: "`kernels.flash_attention`, the rung the writeup did not climb (tiled online softmax, forward and "
                    "backward; one grid axis, so any batch x heads)",
             MATH: "`F.scaled_dot_product_attention` with the math backend (it materialises the S x S scores)",
             **{name: f"`F.scaled_dot_product_attention` with `sdpa_kernel(SDPBackend.{backend})` (column `sdpa_backend`: "
                      "the kernels it launched)" for name, backend in SDPA_BACKENDS.items()}}


def _qkv(b, h, sq, sk, d, dtype_name, seed, strided=False):
    if strided:  # (B, S, H, D) storage viewed as (B, H, S, D): non-contiguous, as models produce it
        shapes = ([b, sq, h, d], [b, sk, h, d], [b, sk, h, d])
        return [randn(sh, dtype_name, seed + i).transpose(1, 2).requires_grad_() for i, sh in enumerate(shapes)]
    shapes = ([b, h, sq, d], [b, h, sk, d], [b, h, sk, d])
    return [randn(sh, dtype_name, seed + i).requires_grad_() for i, sh in enumerate(shapes)]


def _cases(s: dict):
    """Lengths at the base head dim, head dims at the base lengths, each causal or not, plus strided."""
    d0, (sq0, sk0) = s["base_head_dim"], s["base_lengths"]
    for causal in (False, True):
        for sq, sk in s["lengths"]:
            yield dict(seq_q=sq, seq_k=sk, d=d0, causal=causal, strided=False)
        for d in s["head_dims"]:
            yield dict(seq_q=sq0, seq_k=sk0, d=d, causal=causal, strided=False)
        yield dict(seq_q=sq0, seq_k=sk0, d=d0, causal=causal, strided=True)


@experiment()
def correctness(s: dict) -> list[dict]:
    """The FlashAttention rule, for the output and each gradient: error vs an fp64 reference no more
    than twice torch's own error at the input precision, plus eps."""
    from kernels import flash_attention, flash_attention_ref

    rows, b, h = [], s["batch"], s["heads"]
    for dtype_name in s["dtypes"]:
        eps = attention_eps(dtype_name, is_gpu())
        for case in _cases(s):
            params = dict(dtype=dtype_name, batch=b, heads=h, eps=eps, **case)
            if not runnable(dtype_name):
                rows.append(row("max_abs_diff", None, status="needs_gpu", error=BF16_IN_INTERPRETER, variant="out", **params))
                continue
            q, k, v = _qkv(b, h, case["seq_q"], case["seq_k"], case["d"], dtype_name, s["seed"], case["strided"])
            do = randn([b, h, case["seq_q"], case["d"]], dtype_name, s["seed"] + 7)
            errors = flash_errors(flash_attention, flash_attention_ref, q, k, v, do, case["causal"])
            for what, (err, err_torch) in errors.items():
                rows += [row("max_abs_diff", err, variant=what, **params),
                         row("torch_max_abs_diff", err_torch, variant=what, **params),
                         row("matches", within_fa_rule(err, err_torch, eps), "bool", variant=what, **params)]
    return rows


@experiment()
def past_wall(s: dict) -> list[dict]:
    """The wall experiment's sweep, run with flash_attention; then peak memory against SDPA's math path."""
    from kernels import flash_attention, flash_attention_ref

    rows, d, dtype_name = [], s["head_dim"], s["dtype"]
    eps = attention_eps(dtype_name, is_gpu())
    for n_k in lengths(s["log2_n_k"]):
        q, k, v = (randn([1, 1, n, d], dtype_name, s["seed"] + i) for i, n in enumerate((s["n_q"], n_k, n_k)))
        ref = flash_attention_ref(q, k, v, dtype=torch.float64)
        err = max_abs_diff(flash_attention(q, k, v), ref)
        err_torch = max_abs_diff(flash_attention_ref(q, k, v, dtype=q.dtype), ref)
        params = dict(dtype=dtype_name, d=d, n_k=n_k, n_q=s["n_q"], provider=FLASH, eps=eps)
        rows += [row("max_abs_diff", err, **params), row("torch_max_abs_diff", err_torch, **params),
                 row("matches", within_fa_rule(err, err_torch, eps), "bool", **params)]
    return rows + _peak_memory(s)


@experiment()
def limits(s: dict) -> list[dict]:
    """batch x heads past 65535 (a grid axis's limit) with more than 2**31 elements per tensor (GPU only),
    forward and gradients, in its own process (a fault poisons the CUDA context)."""
    b, h, n, d = s["batch"], s["heads"], s["seq"], s["head_dim"]
    params = dict(provider=FLASH, batch=b, heads=h, seq=n, d=d, dtype=s["dtype"], elements=b * h * n * d,
                  eps=attention_eps(s["dtype"], True))
    if not is_gpu():
        return [needs_gpu(f"{b * h * n * d} elements per tensor (GPU memory)", **params)]
    return probe_rows(isolated.call(_probe, b, h, n, d, s["dtype"], s["seed"]), **params)


def _probe(b: int, h: int, n: int, d: int, dtype_name: str, seed: int) -> list[dict]:
    """Forward and backward at full size; the output and gradients checked (FlashAttention rule) on the
    first head, the head at batch x heads index 65535 (the first past axis 1's limit) and the last."""
    from kernels import flash_attention, flash_attention_ref

    q, k, v = _qkv(b, h, n, n, d, dtype_name, seed)
    do = randn([b, h, n, d], dtype_name, seed + 7)
    out = flash_attention(q, k, v)
    out.backward(do)
    torch.cuda.synchronize()
    eps, results = attention_eps(dtype_name, True), []
    for bh in (0, 65535, b * h - 1):
        i, j = divmod(bh, h)

        def head(t):
            return t.detach()[i:i + 1, j:j + 1]

        part = [head(t).clone().requires_grad_() for t in (q, k, v)]
        mine = [head(out), *(head(t.grad) for t in (q, k, v))]
        truth, same_precision = (_with_grads(flash_attention_ref(*part, dtype=dt), part, head(do))
                                 for dt in (torch.float64, q.dtype))
        for what, m, t64, tp in zip(("out", "dq", "dk", "dv"), mine, truth, same_precision):
            err = max_abs_diff(m, t64)
            results += [dict(metric="max_abs_diff", value=err, variant=what, bh=bh),
                        dict(metric="matches", value=within_fa_rule(err, max_abs_diff(tp, t64), eps), variant=what, bh=bh)]
    return results


def _with_grads(out: torch.Tensor, inputs: list, do: torch.Tensor) -> tuple:
    return (out, *torch.autograd.grad(out, inputs, do.to(out.dtype)))


def _peak_memory(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("peak GPU memory")]
    from kernels import flash_attention

    rows, d = [], s["head_dim"]
    peers = ((FLASH, lambda q, k, v: flash_attention(q, k, v)),
             (MATH, lambda q, k, v: _sdpa(q, k, v, "MATH")))
    for n in s["memory_lengths"]:
        q, k, v = (randn([1, s["memory_heads"], n, d], s["dtype"], s["seed"] + i) for i in range(3))
        inputs = torch.cuda.memory_allocated()
        for provider, fn in peers:
            fn(q, k, v)  # once first: compiling and tuning allocate scratch that steady state does not
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn(q, k, v)
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - inputs  # beyond q, k, v themselves
            which = {"sdpa_backend": sdpa_backend_of(lambda: fn(q, k, v))} if provider == MATH else {}
            rows.append(row("peak_extra_memory", extra, "bytes", provider=provider, seq=n, d=d,
                            heads=s["memory_heads"], dtype=s["dtype"], **which))
    return rows


def _sdpa(q, k, v, backend: str, causal: bool = False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, backend)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def flops(batch: int, heads: int, seq: int, d: int, causal: bool) -> float:
    """The forward's FLOPs by FlashAttention's convention: two S x S x D matmuls per head, 2 FLOPs per
    multiply-add, half of them under a causal mask. fwd+bwd counts 3.5x (the backward does 5 matmuls
    where the forward does 2; recomputing S adds no credit)."""
    return 4 * batch * heads * seq * seq * d * (0.5 if causal else 1.0)


FWD_BWD = 3.5


@contextlib.contextmanager
def _fresh_tiles():
    """Tile choices made in this run only: an empty tile cache, removed afterwards."""
    from kernels import _flash_tiles

    with tempfile.TemporaryDirectory() as tmp:
        before = os.environ.get(_flash_tiles.CACHE_ENV)
        os.environ[_flash_tiles.CACHE_ENV] = os.path.join(tmp, "tiles.json")
        _flash_tiles.forget()
        try:
            yield _flash_tiles
        finally:
            _flash_tiles.forget()
            if before is None:
                del os.environ[_flash_tiles.CACHE_ENV]
            else:
                os.environ[_flash_tiles.CACHE_ENV] = before


@experiment(timing=True)
def performance(s: dict) -> list[dict]:
    """Throughput against SDPA's backends (the tiles tuned afresh in this run, every candidate's tuning
    time recorded), the per-call host cost, and the cost of a call at a length not seen before."""
    if not is_gpu():
        return [needs_gpu("timing flash_attention")]
    with _fresh_tiles() as choices:
        rows = _throughput(s, choices) + _launch_floor(s)
    with _fresh_tiles():
        return rows + _first_call(s)


def _throughput(s: dict, choices) -> list[dict]:
    from kernels import flash_attention, tiles_in_use

    rows, h = [], s["heads"]
    for d in s["head_dims"]:
        for causal in (False, True):
            for n in s["lengths"]:
                b = max(1, s["tokens"] // n)  # constant tokens per batch, as FlashAttention's benchmark
                q, k, v = _qkv(b, h, n, n, d, s["dtype"], s["seed"])
                do = torch.randn_like(q)
                fwd_tflop = flops(b, h, n, d, causal) / 1e12
                providers = {FLASH: lambda: flash_attention(q, k, v, causal=causal)}
                providers.update({name: (lambda be=be: _sdpa(q, k, v, be, causal)) for name, be in SDPA_BACKENDS.items()})
                for provider, fwd in providers.items():
                    params = dict(provider=provider, batch=b, heads=h, seq=n, d=d, causal=causal, dtype=s["dtype"])
                    for mode, fn, tflop in (("fwd", fwd, fwd_tflop),
                                            ("fwd_bwd", lambda fwd=fwd: fwd().backward(do), FWD_BWD * fwd_tflop)):
                        try:
                            with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                                times = bench(fn, **s["bench"], grad_to_none=[q, k, v])
                        except RuntimeError as e:  # a backend that does not support this shape/device
                            rows.append(row("time_ms", None, status="unsupported", error=str(e)[:300], variant=mode, **params))
                            continue
                        if provider != FLASH and "sdpa_backend" not in params:  # once it ran
                            params["sdpa_backend"] = sdpa_backend_of(fwd)
                        tiles = tiles_in_use() if provider == FLASH else {}
                        if mode == "fwd":  # the backward tiles belong to the previous shape
                            tiles = {k: v for k, v in tiles.items() if k == "fwd"}
                        rows += timing_rows(times, tflop, "TFLOP", variant=mode, **params,
                                            **{f"tile_{k}": v for k, v in tiles.items()})
    return rows + _tuning_rows(choices.timings)


def _tuning_rows(timings: dict) -> list[dict]:
    """What each candidate tile measured while its bucket was tuned (median ms, CUDA-graph replay)."""
    rows = []
    for (kind, dtype, block_d, causal, bucket_q, bucket_k), per_tile in timings.items():
        for tile, ms in per_tile.items():
            rows.append(row("tuning_ms", ms, "ms", provider=FLASH, variant=kind, tile=tile, causal=causal,
                            block_d=block_d, bucket_q=bucket_q, bucket_k=bucket_k, dtype=str(dtype).split(".")[-1]))
    return rows


def _launch_floor(s: dict) -> list[dict]:
    """Time per call on a problem too small to keep the GPU busy: the per-call host cost (argument
    checks, autograd, tile lookup, launch) that bounds short sequences. Calls run back to back, with no
    cache flush between them (a flush would hide the host's time behind the GPU's)."""
    from kernels import flash_attention

    q, k, v = _qkv(1, 1, 16, 16, 64, s["dtype"], s["seed"])
    providers = {FLASH: lambda: flash_attention(q, k, v)}
    providers.update({name: (lambda be=be: _sdpa(q, k, v, be)) for name, be in SDPA_BACKENDS.items()})
    rows = []
    with torch.no_grad():
        for provider, fn in providers.items():
            which = {"sdpa_backend": sdpa_backend_of(fn)} if provider.startswith("sdpa") else {}
            for quantile, ms in _per_call_ms(fn).items():
                rows.append(row("time_ms", ms, "ms", variant="launch_floor", provider=provider, quantile=quantile,
                                batch=1, heads=1, seq=16, d=64, dtype=s["dtype"], **which))
    return rows


def _per_call_ms(fn, calls: int = 200, repeats: int = 25) -> dict[float, float]:
    """Milliseconds per call of ``calls`` back-to-back calls between two CUDA events, at each of QUANTILES
    over ``repeats`` such runs."""
    for _ in range(calls):
        fn()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / calls)
    return dict(zip(QUANTILES, torch.tensor(runs).quantile(torch.tensor(QUANTILES, dtype=torch.float32)).tolist()))


def _first_call(s: dict) -> list[dict]:
    """What a call at a length not seen before costs (B=1, H=1, D=64, forward): the time to its result
    when its bucket must be tuned first, and when another length already tuned the bucket; and the peak
    memory of the first (tuning) call against a later one."""
    from kernels import flash_attention

    c, d, rows = s["first_call"], 64, []
    params = dict(provider=FLASH, batch=1, heads=1, d=d, dtype=s["dtype"])

    def qkv(n):
        return [randn([1, 1, n, d], s["dtype"], s["seed"] + i) for i in range(3)]

    for variant, n in (("untuned_bucket", c["tuned_length"]), ("tuned_bucket", c["new_length"])):
        q, k, v = qkv(n)
        torch.cuda.synchronize()
        start = time.perf_counter()
        flash_attention(q, k, v)
        torch.cuda.synchronize()
        rows.append(row("first_call_ms", (time.perf_counter() - start) * 1e3, "ms", variant=variant, seq=n,
                        bucket_tuned_at=c["tuned_length"], **params))
    q, k, v = qkv(c["memory_length"])
    for variant in ("first_call", "later_call"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        flash_attention(q, k, v)
        torch.cuda.synchronize()
        rows.append(row("peak_extra_memory", torch.cuda.max_memory_allocated() - before, "bytes", variant=variant,
                        seq=c["memory_length"], **params))
    return rows


# --- claims it settles --------------------------------------------------------------------------------------

@claim(13, ['attention/wall', 'flash_attention/past_wall', 'flash_attention/correctness'])
def flash_past_wall(t, s):
    walls = t["attention/wall"]
    flash = t["flash_attention/past_wall"]
    runs = ok(flash, metric="max_abs_diff")
    right = bools(flash, "matches")
    corr = bools(t["flash_attention/correctness"], "matches")
    longest = int(runs["n_k"].max())
    base = (f"flash_attention ran every n_k up to {longest} ({runs['dtype'].iloc[0]}, d={int(runs['d'].iloc[0])}), "
            f"within the FlashAttention rule against fp64 at {int(right.sum())}/{len(right)} lengths (max |diff| "
            f"{runs['value'].max():.2g}); correctness grid (fwd + grads, odd lengths, odd head dims, causal, strided): "
            f"{int(corr.sum())}/{len(corr)} within the rule")
    if flash["backend"].iloc[0] != "gpu":
        return (base + "; the interpreter has no shared-memory limit, so running past the wall needs a GPU to mean anything",
                NEEDS_GPU)
    fail = walls[(walls["status"] == "out_of_resources") & (walls["dtype"] == runs["dtype"].iloc[0])
                 & (walls["d"] == runs["d"].iloc[0])]
    wall_at = int(fail["n_k"].min()) if len(fail) else None
    good = wall_at is not None and longest > wall_at and corr.all() and len(right) and right.all()
    return base + f"; the writeup's kernel fails at n_k={wall_at} on the same device", REPRODUCED if good else NOT_REPRODUCED


# --- numbers derived from its tables ------------------------------------------------------------------------

def flash_vs_sdpa(df: pd.DataFrame, matmul_tflops: float | None) -> pd.DataFrame:
    """Median TFLOP/s per provider for every (mode, d, causal, seq), with ratios to SDPA's flash backend
    and to the fastest SDPA backend at that point."""
    d = median(df, "throughput")
    if d.empty:
        return d
    wide = d.pivot_table(index=["variant", "d", "causal", "seq", "batch"], columns="provider",
                         values="value").reset_index()
    wide.columns.name = None
    sdpa = [c for c in wide.columns if str(c).startswith("sdpa_")]
    if "sdpa_flash" in wide:
        wide["triton/sdpa_flash"] = wide[FLASH] / wide["sdpa_flash"]
    if sdpa:  # the best peer at each point, not the easiest one
        wide["best_sdpa"] = wide[sdpa].idxmax(axis=1)
        wide["triton/best_sdpa"] = wide[FLASH] / wide[sdpa].max(axis=1)
    if matmul_tflops:
        wide["triton/matmul"] = wide[FLASH] / matmul_tflops
    return wide


def tuning(df: pd.DataFrame) -> pd.DataFrame:
    """Per FlashAttention kernel, head dim and causal: what tuning each length bucket bought. The
    untuned choice is the first candidate (the rows keep the candidates' order)."""
    d = ok(df, metric="tuning_ms")
    out = []
    for (kernel, block_d, causal), g in d.groupby(["variant", "block_d", "causal"], sort=True):
        per_bucket = [(b["value"].iloc[0] / b["value"].min(), b.loc[b["value"].idxmin(), "tile"])
                      for _, b in g.groupby("bucket_q")]
        out.append({"kernel": kernel, "d": int(block_d), "causal": bool(causal), "buckets": len(per_bucket),
                    "candidates": g.groupby("bucket_q").size().max(),
                    "winners": ", ".join(sorted({tile for _, tile in per_bucket})),
                    "first candidate / best, worst bucket": max(r for r, _ in per_bucket)})
    return pd.DataFrame(out)


def first_call(df: pd.DataFrame) -> dict[str, float]:
    """The cost of a new length: first-call milliseconds per variant (untuned_bucket, tuned_bucket) and
    peak bytes beyond the inputs of the first (tuning) and a later call."""
    d = ok(df)
    return {**{r.variant: r.value for r in d[d["metric"] == "first_call_ms"].itertuples()},
            **{f"{r.variant}_bytes": r.value for r in d[d["metric"] == "peak_extra_memory"].itertuples()}}


def launch_floor(df: pd.DataFrame) -> dict[str, float]:
    """Median microseconds per call on a 16-token problem, per provider."""
    d = median(df, "time_ms", variant="launch_floor")
    return {r.provider: r.value * 1e3 for r in d.itertuples()}


# --- figures ------------------------------------------------------------------------------------------------

@figure("flash_memory", ["flash_attention/past_wall"], "Attention", caption="""
Peak GPU memory beyond q, k and v for one attention forward, 16 heads: flash_attention (O(N): output and
log-sum-exp only) against SDPA's math backend, which materialises the N x N score matrix (O(N^2)).""")
def figure_flash_memory(t):
    return plot_flash_memory(t["flash_attention/past_wall"])


@figure("flash_performance", ["calibration/ceilings", "flash_attention/performance"], "Performance", caption="""
flash_attention (Triton) against SDPA's flash, cuDNN and memory-efficient backends, bf16, batch x sequence
length held constant, forward and forward+backward, causal or not, per head dimension: median TFLOP/s with p20
to p80 bands. FLOPs: 4 B H S^2 D for the forward (half for causal), 3.5x that for forward+backward. Dashed:
the bf16 matmul rate, measured by the same job on the same GPU. Claim 13.""")
def figure_flash_performance(t):
    perf = t["flash_attention/performance"]
    return plot_flash_performance(perf, own_ceiling(perf, "matmul_tflops", t["calibration/ceilings"]))


@figure("flash_vs_best_sdpa", ["flash_attention/performance"], "Performance", caption="""
flash_attention's median TFLOP/s over that of the fastest SDPA backend at the same point (cuDNN, flash or
memory-efficient: whichever was fastest, named in the title), bf16, forward and forward+backward, causal or
not, per head dimension, at a constant batch x sequence length (FlashAttention's benchmark method). Above 1,
flash_attention is faster than every SDPA backend. FLOPs: 4 B H S^2 D forward (half under causal), 3.5x that
for forward+backward.""")
def figure_flash_vs_best_sdpa(t):
    perf = t["flash_attention/performance"]
    return plot_flash_vs_best_sdpa(flash_vs_sdpa(perf, None), plots.device_of(perf))


@figure("call_latency", ["flash_attention/performance"], "Performance", caption="""
Median time per call on an attention problem too small to keep the GPU busy (B=1, H=1, S=16, D=64, bf16): the
per-call cost of argument checks, autograd, tuner lookup and launch, which bounds short sequences.
flash_attention against each SDPA backend, timed in the same job.""")
def figure_call_latency(t):
    perf = t["flash_attention/performance"]
    return plot_call_latency(launch_floor(perf), plots.device_of(perf))


def plot_flash_performance(df: pd.DataFrame, matmul_tflops: float | None) -> plt.Figure:
    d = plots.measured(df)
    d = d[d["metric"] == "throughput"]
    if d.empty:
        return plots.placeholder("flash_attention: TFLOP/s vs SDPA", df)
    d = d.assign(case=lambda f: f["variant"] + ", d=" + f["d"].astype(int).astype(str)
                 + f["causal"].astype(bool).map({True: ", causal", False: ", not causal"}))
    cases = sorted(d["case"].unique())
    cols = 4
    rows = -(-len(cases) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        plots.band(ax, d[d["case"] == case], "seq", "provider", "throughput")
        if matmul_tflops:
            ax.axhline(matmul_tflops, color="black", ls="--", lw=1)
        ax.set(xscale="log", xlabel="sequence length", ylabel="TFLOP/s", title=case)
    for ax in axes.flat[len(cases):]:
        ax.set_axis_off()
    tokens = int((d["batch"] * d["seq"]).max())
    fig.suptitle(f"flash_attention vs SDPA backends, {d['dtype'].iloc[0]}, batch x seq = {tokens} (batch = {tokens} / seq), "
                 f"H={int(d['heads'].iloc[0])} (dashed: bf16 matmul measured by the same job) ({plots.device_of(df)})")
    fig.tight_layout()
    return fig


def plot_flash_memory(df: pd.DataFrame) -> plt.Figure:
    d = plots.measured(df)
    d = d[d["metric"] == "peak_extra_memory"]
    if d.empty:
        return plots.placeholder("attention: peak memory vs sequence length", df)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=d.assign(MiB=d["value"] / 2**20), x="seq", y="MiB", hue="provider", marker="o", ax=ax)
    ax.set(xscale="log", yscale="log", xlabel="sequence length",
           ylabel="peak memory beyond q, k, v (MiB)",
           title=f"attention memory: O(N) flash vs O(N^2) math ({plots.device_of(df)})")
    fig.tight_layout()
    return fig


def plot_flash_vs_best_sdpa(wide: pd.DataFrame, device: str) -> plt.Figure:
    """flash_attention's TFLOP/s over the fastest SDPA backend's at each point."""
    if wide.empty or "triton/best_sdpa" not in wide:
        return plots.needs_gpu("flash_attention / best SDPA", device)
    d = wide.assign(case=lambda w: w["variant"] + ", d=" + w["d"].astype(int).astype(str)
                    + w["causal"].astype(bool).map({True: ", causal", False: ", not causal"}))
    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    sns.lineplot(data=d, x="seq", y="triton/best_sdpa", hue="case", style="variant", marker="o", ax=ax)
    ax.axhline(1.0, color="black", lw=1)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title=None)
    best = ", ".join(sorted(d["best_sdpa"].unique()))
    ax.set(xscale="log", xlabel="sequence length (batch x seq constant)",
           ylabel="flash_attention / best SDPA (TFLOP/s)",
           title=f"flash_attention against the fastest SDPA backend ({best}) ({device})")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def plot_call_latency(floor: dict[str, float], device: str) -> plt.Figure:
    """Microseconds per call on a problem too small to keep the GPU busy."""
    if not floor:
        return plots.needs_gpu("per-call latency", device)
    d = pd.DataFrame({"provider": list(floor), "us": list(floor.values())}).sort_values("us")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.barplot(data=d, y="provider", x="us", ax=ax, color="tab:blue")
    for i, us in enumerate(d["us"]):
        ax.text(us, i, f" {us:.0f}", va="center", fontsize=8)
    ax.set(xlabel="median time per call (us), B=1 H=1 S=16 D=64", ylabel="",
           title=f"attention: per-call latency ({device})")
    fig.tight_layout()
    return fig


# --- its report section -------------------------------------------------------------------------------------

FLOPS = ("FLOPs for attention follow FlashAttention's convention: 4·B·H·S²·D for the forward (two S×S×D matmuls, "
         "2 FLOPs per multiply-add), ×0.5 under a causal mask, ×3.5 for forward+backward. Bandwidth counts the "
         "bytes an op must move at the least, stated per provider in the code (column `bytes`).")


@section(["flash_attention/past_wall"])
def section_memory(tables) -> str:
    mem = ok(tables["flash_attention/past_wall"], metric="peak_extra_memory")
    if mem.empty:
        return ""
    mem = mem.astype({"seq": int, "heads": int, "d": int})
    wide = mem.pivot_table(index=["seq", "heads", "d", "dtype"], columns="provider", values="value") / 2**20
    wide.columns.name = None
    return "\n### Peak memory beyond q, k, v for one forward, MiB\n\n" + md_table(wide.reset_index(), ".6g")


@section(["flash_attention/performance"])
def section_performance(tables) -> str:
    perf = tables["flash_attention/performance"]
    f = flash_vs_sdpa(perf, own_ceiling(perf, "matmul_tflops", None))
    if f.empty:
        return ""
    out = [f"\n### flash_attention vs SDPA backends, median TFLOP/s (bf16, batch x seq = "
           f"{int(f['batch'].mul(f['seq']).max())}, causal and not)\n\n" + FLOPS + " `best_sdpa` is the fastest SDPA "
           "backend at each point, and `triton/best_sdpa` the ratio against it.\n\n" + md_table(f)]
    out.append(_call_cost(perf))
    tiles = median(perf, "throughput", provider=FLASH)
    cols = [c for c in tiles.columns if c.startswith("tile_")]
    if cols:
        used = tiles[["variant", "d", "causal", "seq", *cols]].sort_values(["variant", "d", "causal", "seq"])
        out.append("\nTiles chosen for flash_attention (each length is its own bucket here):\n\n" + md_table(used))
    tuned = tuning(perf)
    if not tuned.empty:
        out.append("\nWhat tuning bought, per kernel (each bucket's candidates timed on the caller's tensors, "
                   "median of a CUDA graph replay; the first candidate is what runs untuned):\n\n" + md_table(tuned))
    return "\n".join(out)


def _call_cost(perf: pd.DataFrame) -> str:
    """The per-call host cost and the cost of a call at a new length, from the performance table."""
    floor = launch_floor(perf)
    text = ("\nTime per call at B=1, H=1, S=16, D=64, calls back to back (the host's cost per call, which bounds "
            "short sequences): " + ", ".join(f"{p} {us:.0f} us" for p, us in sorted(floor.items())) + ". Each SDPA "
            "call here enters `sdpa_kernel(backend)` to pin its backend, and that context manager's own host cost "
            "is in SDPA's time: this row overstates what SDPA costs a model that calls it plainly "
            "(`workflow/scripts/call_cost.py` measures both ways).")
    first = first_call(perf)
    if {"untuned_bucket", "tuned_bucket"} <= set(first):
        rows = ok(perf, metric="first_call_ms")
        seq = dict(zip(rows["variant"], rows["seq"].astype(int)))
        text += (f"\n\nA length not seen before (B=1, H=1, D=64, forward, wall time to the result): "
                 f"{first['untuned_bucket']:.0f} ms at S={seq['untuned_bucket']}, whose bucket had to be tuned first "
                 f"(every candidate timed, and compiled if this process had not yet); {first['tuned_bucket']:.2f} ms at "
                 f"S={seq['tuned_bucket']}, in the bucket S={int(rows['bucket_tuned_at'].iloc[0])} had tuned.")
    if {"first_call_bytes", "later_call_bytes"} <= set(first):
        seq = int(ok(perf, metric="peak_extra_memory")["seq"].iloc[0])
        text += (f" Peak memory beyond q, k, v at S={seq}: {first['first_call_bytes'] / 2**20:.3f} MiB for the first "
                 f"(tuning) call, {first['later_call_bytes'] / 2**20:.3f} MiB for a later one.")
    return text
