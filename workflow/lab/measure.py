"""Shared measurement helpers: dtypes by name, seeded inputs, timing with quantiles, ulp distance.
Tolerances and pass/fail rules live in lab.verify."""
from __future__ import annotations

import time

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "float64": torch.float64}
QUANTILES = (0.2, 0.5, 0.8)
BF16_IN_INTERPRETER = "bf16 arithmetic is broken in Triton's interpreter"


def dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def is_gpu() -> bool:
    import kernels

    return kernels.backend.current() == "gpu"


def device() -> str:
    import kernels

    return kernels.backend.device()


def runnable(dtype_name: str) -> bool:
    """bf16 runs only on the GPU (the interpreter computes bf16 wrongly)."""
    return dtype_name != "bfloat16" or is_gpu()


def generator(seed: int) -> torch.Generator:
    g = torch.Generator(device=device())
    g.manual_seed(seed)
    return g


def randn(shape, dtype_name: str, seed: int, scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(shape, generator=generator(seed), device=device(), dtype=torch.float32) * scale
    return x.to(dtype(dtype_name))


def lengths(log2_range) -> list[int]:
    """Powers of two and one past each: n_k = 2^i + 1 already needs the next power-of-two block."""
    return [n for i in range(log2_range[0], log2_range[1] + 1) for n in (2**i, 2**i + 1)]


def ulps(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| in units in the last place of ref (for normal numbers of ref's dtype)."""
    info = torch.finfo(ref.dtype)
    r = ref.double().abs().clamp_min(info.tiny)
    ulp = torch.exp2(torch.floor(torch.log2(r))) * info.eps
    return (out.double() - ref.double()).abs() / ulp


def bench(fn, warmup_ms: int, rep_ms: int, grad_to_none=None) -> dict[float, float]:
    """Kernel time in ms at each of QUANTILES (triton.testing.do_bench: CUDA events, L2 flushed)."""
    import triton.testing

    times = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES),
                                    grad_to_none=grad_to_none)
    return dict(zip(QUANTILES, times))


def wall_seconds(fn) -> float:
    """Wall seconds of one call of fn, to its result on the GPU (a compile, a first call)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def timing_rows(times: dict[float, float], work: float, work_unit: str, **params) -> list[dict]:
    """time_ms rows and the matching throughput rows (work / time) for every quantile.

    work_unit is 'GB' (bytes moved / 1e9 -> GB/s) or 'TFLOP' (flops / 1e12 -> TFLOP/s)."""
    from .table import row

    metric = {"GB": "bandwidth", "TFLOP": "throughput"}[work_unit]
    rows = []
    for q, ms in times.items():
        rows.append(row("time_ms", ms, "ms", quantile=q, **params))
        rows.append(row(metric, work / (ms * 1e-3), f"{work_unit}/s", quantile=q, **params))
    return rows


def probe_rows(outcome: dict, **params) -> list[dict]:
    """Rows for one lab.isolated.call outcome: what it returned (``{metric: value}``, or a list of
    ``{"metric", "value", **more params}``; bools get unit 'bool'), or one 'outcome' row with the status
    ('raised', 'crashed', 'timed_out') and the error."""
    from .table import row

    if outcome["status"] != "ok":
        return [row("outcome", None, status=outcome["status"], error=outcome["error"], **params)]
    result = outcome["result"]
    found = ([dict(metric=m, value=v) for m, v in result.items()] if isinstance(result, dict) else result)
    return [row(r["metric"], r["value"], "bool" if isinstance(r["value"], bool) else "", **params,
                **{k: v for k, v in r.items() if k not in ("metric", "value")}) for r in found]


def ceilings(copy_bytes: int, matmul_n: int, warmup_ms: int, rep_ms: int) -> dict[str, dict[float, float]]:
    """do_bench times (ms per quantile) of a device-to-device copy of copy_bytes and an n^3 bf16 matmul:
    the ceilings every timing table divides by, measured on the GPU that table ran on."""
    def copy():  # its buffers are freed on return, before the matmul's are allocated
        src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        return bench(lambda: dst.copy_(src), warmup_ms, rep_ms)

    copy_times = copy()
    a, b = (torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {"copy": copy_times, "matmul": bench(lambda: a @ b, warmup_ms, rep_ms)}


def ceiling_columns(s: dict) -> dict[str, float]:
    """The medians of ceilings(), as the columns a timing table carries on every row: copy_gbps (read +
    write counted) and matmul_tflops."""
    c = s["ceilings"]
    t = ceilings(c["copy_bytes"], c["matmul_n"], **s["bench"])
    return {"copy_gbps": 2 * c["copy_bytes"] / 1e9 / (t["copy"][0.5] * 1e-3),
            "matmul_tflops": 2 * c["matmul_n"] ** 3 / 1e12 / (t["matmul"][0.5] * 1e-3)}


def cuda_kernels(fn) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches, in order (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # once outside the profile: compiling or autotuning launches kernels that a steady call does not
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for e in prof.events():  # kernels appear as CUDA events, or attached to the op that launched them
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names.append(e.name)
        names += [k.name for k in getattr(e, "kernels", [])]
    return names


def sdpa_backend_of(fn) -> str:
    """Which SDPA backend a call actually ran, read from the names of the CUDA kernels it launched."""
    names = [n.lower() for n in cuda_kernels(fn)]
    for backend, marks in (("cudnn", ("cudnn",)), ("flash", ("flash",)),
                           ("efficient", ("fmha", "efficient", "mem_eff"))):
        if any(m in n for n in names for m in marks):
            return backend
    return "math" if names else "unknown (no CUDA kernel seen)"
