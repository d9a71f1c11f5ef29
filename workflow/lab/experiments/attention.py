"""The writeup's attention kernel: correctness against SDPA (claim 9), at head dims that are not powers of
two (claim 18), the shared-memory wall (claims 10, 11) and its speed next to flash_attention and SDPA
where it runs. Provider triton_writeup is the kernel as printed (kernels.attention_writeup), triton the
same kernel with the head-dim mask (kernels.attention)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..measure import BF16_IN_INTERPRETER, bench, is_gpu, lengths, randn, runnable, sdpa_backend_of, timing_rows
from ..table import needs_gpu, row
from ..verify import attention_eps, max_abs_diff, within_fa_rule
from . import experiment


def dot_precision(dtype_name: str) -> str:
    """What tl.dot computes in for these inputs on this backend."""
    if dtype_name == "float32":
        return "tf32 (Triton's GPU default)" if is_gpu() else "fp32 (interpreter)"
    return f"{dtype_name} inputs, fp32 accumulation"


def _kernels() -> dict:
    """provider -> kernel: the writeup's as printed, and with the head-dim mask."""
    from kernels import attention, attention_writeup

    return {"triton_writeup": attention_writeup, "triton": attention}


@experiment()
def correctness(s: dict) -> list[dict]:
    return _against_sdpa(s["shapes"], s["dtypes"], s["seed"])


@experiment()
def head_dims(s: dict) -> list[dict]:
    """The printed kernel masks rows only, and its head-dim block is next_power_of_2(d): at every other d
    it reads the next row. Both kernels at each head dim, the same n_q and n_k."""
    return _against_sdpa([[s["n_q"], s["n_k"], d] for d in s["head_dims"]], s["dtypes"], s["seed"])


def _against_sdpa(shapes, dtypes, seed: int) -> list[dict]:
    """Each kernel at each (n_q, n_k, d) and dtype, judged by the FlashAttention rule against SDPA's error."""
    from kernels import attention_ref

    rows = []
    for provider, kernel in _kernels().items():
        for dtype_name in dtypes:
            eps = attention_eps(dtype_name, is_gpu())
            for n_q, n_k, d in shapes:
                params = dict(provider=provider, dtype=dtype_name, n_q=n_q, n_k=n_k, d=d,
                              dot_precision=dot_precision(dtype_name), eps=eps)
                if not runnable(dtype_name):
                    rows.append(row("max_abs_diff", None, status="needs_gpu", error=BF16_IN_INTERPRETER, **params))
                    continue
                q, k, v = (randn(sh, dtype_name, seed + i) for i, sh in enumerate(([n_q, d], [n_k, d], [n_k, d])))
                ref = attention_ref(q.double(), k.double(), v.double())
                out = kernel(q, k, v)
                sdpa = F.scaled_dot_product_attention(q[None], k[None], v[None])[0]  # torch at the same precision
                err, err_torch = max_abs_diff(out, ref), max_abs_diff(sdpa, ref)
                rows += [row("max_abs_diff", err, **params),
                         row("sdpa_max_abs_diff", err_torch, **params),
                         row("diff_vs_sdpa", max_abs_diff(out, sdpa), **params),
                         row("matches", within_fa_rule(err, err_torch, eps), "bool", **params)]
    return rows


def hopper_shared_bytes(n_k: int, d: int, dtype_name: str) -> int:
    """Shared memory the writeup's kernel needs on sm_90, by compiling it here (no GPU needed)."""
    from kernels import launch_config

    from ..sm90 import shared_memory_bytes

    ptr = {"float16": "*fp16", "float32": "*fp32", "bfloat16": "*bf16"}[dtype_name]
    types = dict(q_ptr=ptr, k_ptr=ptr, v_ptr=ptr, out_ptr=ptr, row_stride="i32", col_stride="i32",
                 n_rows="i32", n_cols="i32", scale="fp32")
    return shared_memory_bytes("kernels._attention", "attention_kernel", types, launch_config(n_k, d))


@experiment()
def wall(s: dict) -> list[dict]:
    """Grow n_k until the kernel no longer launches. The failure is the result: a row, not a crash."""
    if not is_gpu():
        return _wall_compiled(s["compile_only"])
    import triton

    limit = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())["max_shared_mem"]
    return [r for dtype_name in s["dtypes"] for d in s["head_dims"] for r in _sweep_until_wall(s, dtype_name, d, limit)]


def _sweep_until_wall(s: dict, dtype_name: str, d: int, limit: int) -> list[dict]:
    from triton.runtime.errors import OutOfResources

    from kernels import attention_ref, attention_writeup, launch_config, shared_memory_required

    rows, eps = [], attention_eps(dtype_name, True)
    for n_k in lengths(s["log2_n_k"]):
        params = dict(provider="triton_writeup", dtype=dtype_name, d=d, n_k=n_k, n_q=s["n_q"],
                      block_k=launch_config(n_k, d)["BLOCK_K"], shared_limit=limit, eps=eps)
        q, k, v = (randn(shape, dtype_name, s["seed"] + i) for i, shape in enumerate(([s["n_q"], d], [n_k, d], [n_k, d])))
        try:
            out = attention_writeup(q, k, v)
            torch.cuda.synchronize()
        except OutOfResources as e:
            rows.append(row("shared_required", e.required, "bytes", status="out_of_resources", error=str(e), **params))
            return rows  # the wall: longer sequences only need more
        ref = attention_ref(q.double(), k.double(), v.double())
        err = max_abs_diff(out, ref)
        err_torch = max_abs_diff(F.scaled_dot_product_attention(q[None], k[None], v[None])[0], ref)
        rows += [row("max_abs_diff", err, **params), row("sdpa_max_abs_diff", err_torch, **params),
                 row("matches", within_fa_rule(err, err_torch, eps), "bool", **params),
                 row("shared_required", shared_memory_required(q, k, v), "bytes", **params)]
    return rows


def _wall_compiled(s: dict) -> list[dict]:
    from kernels import launch_config

    rows = []
    for n_k in s["n_k"]:
        params = dict(dtype=s["dtype"], d=s["head_dim"], n_k=n_k, block_k=launch_config(n_k, s["head_dim"])["BLOCK_K"],
                      target="sm_90")
        rows.append(row("shared_required", hopper_shared_bytes(n_k, s["head_dim"], s["dtype"]), "bytes",
                        status="compiled_only",
                        error="compiled for sm_90 on a CPU machine; whether it launches needs a GPU", **params))
    return rows


@experiment(timing=True)
def performance(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("timing attention")]
    from kernels import attention_writeup, flash_attention

    rows, d = [], s["head_dim"]
    for n in s["lengths"]:
        q, k, v = (randn([n, d], s["dtype"], s["seed"] + i) for i in range(3))
        tflop = 4 * n * n * d / 1e12  # two matmuls of n x n x d, 2 flops per multiply-add
        peers = (("triton_writeup", lambda: attention_writeup(q, k, v)),
                 ("triton_flash", lambda: flash_attention(q[None, None], k[None, None], v[None, None])),
                 ("torch_sdpa", lambda: F.scaled_dot_product_attention(q[None, None], k[None, None], v[None, None])))
        for provider, fn in peers:
            which = {"sdpa_backend": sdpa_backend_of(fn)} if provider == "torch_sdpa" else {}
            rows += timing_rows(bench(fn, **s["bench"]), tflop, "TFLOP", provider=provider, n_q=n, n_k=n, d=d,
                                dtype=s["dtype"], **which)
    return rows
