"""FlashAttention (the next rung, claim 13): correctness of forward and gradients, running past the
writeup's wall, memory that grows O(N), past 2**31 elements and 65535 batch x heads (claim 20), and speed
against SDPA's backends."""
from __future__ import annotations

import contextlib
import os
import tempfile
import time

import torch
import torch.nn.functional as F

from .. import isolated
from ..measure import (BF16_IN_INTERPRETER, QUANTILES, bench, is_gpu, lengths, probe_rows, randn, runnable, sdpa_backend_of,
                       timing_rows)
from ..table import needs_gpu, row
from ..verify import attention_eps, flash_errors, max_abs_diff, within_fa_rule
from . import experiment


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
        params = dict(dtype=dtype_name, d=d, n_k=n_k, n_q=s["n_q"], provider="triton_flash", eps=eps)
        rows += [row("max_abs_diff", err, **params), row("torch_max_abs_diff", err_torch, **params),
                 row("matches", within_fa_rule(err, err_torch, eps), "bool", **params)]
    return rows + _peak_memory(s)


@experiment()
def limits(s: dict) -> list[dict]:
    """batch x heads past 65535 (a grid axis's limit) with more than 2**31 elements per tensor (GPU only),
    forward and gradients, in its own process (a fault poisons the CUDA context)."""
    b, h, n, d = s["batch"], s["heads"], s["seq"], s["head_dim"]
    params = dict(provider="triton_flash", batch=b, heads=h, seq=n, d=d, dtype=s["dtype"], elements=b * h * n * d,
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
    peers = (("triton_flash", lambda q, k, v: flash_attention(q, k, v)),
             ("torch_math", lambda q, k, v: _sdpa(q, k, v, "MATH")))
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
            which = {"sdpa_backend": sdpa_backend_of(lambda: fn(q, k, v))} if provider == "torch_math" else {}
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
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION"}


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
                providers = {"triton_flash": lambda: flash_attention(q, k, v, causal=causal)}
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
                        if provider != "triton_flash" and "sdpa_backend" not in params:  # once it ran
                            params["sdpa_backend"] = sdpa_backend_of(fwd)
                        tiles = tiles_in_use() if provider == "triton_flash" else {}
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
            rows.append(row("tuning_ms", ms, "ms", provider="triton_flash", variant=kind, tile=tile, causal=causal,
                            block_d=block_d, bucket_q=bucket_q, bucket_k=bucket_k, dtype=str(dtype).split(".")[-1]))
    return rows


def _launch_floor(s: dict) -> list[dict]:
    """Time per call on a problem too small to keep the GPU busy: the per-call host cost (argument
    checks, autograd, tile lookup, launch) that bounds short sequences. Calls run back to back, with no
    cache flush between them (a flush would hide the host's time behind the GPU's)."""
    from kernels import flash_attention

    q, k, v = _qkv(1, 1, 16, 16, 64, s["dtype"], s["seed"])
    providers = {"triton_flash": lambda: flash_attention(q, k, v)}
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
    params = dict(provider="triton_flash", batch=1, heads=1, d=d, dtype=s["dtype"])

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
