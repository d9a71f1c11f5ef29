"""The verification harness shared by tests/ and several units: the rules that judge a kernel's output
against a reference, and the FlashAttention rule's tolerances (attention and flash_attention both
follow it). A tolerance that one kernel alone uses lives in its unit (e.g. lab.units.softmax.ATOL).

Tolerances are per dtype and per backend: fp32 ``tl.dot`` is TF32 on the GPU (Triton's default) and
full fp32 in the interpreter, so matmul-based kernels get a looser fp32 bound on the GPU.
"""
from __future__ import annotations

import math

import torch

# The FlashAttention rule's epsilon (attention and flash_attention): absolute slack on top of twice
# torch's own error at the same precision.
ATTENTION_EPS = {"float32": 1e-5, "float32_tf32": 5e-3, "float16": 1e-3, "bfloat16": 1e-2}


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype


def attention_eps(dtype, on_gpu: bool) -> float:
    name = dtype_name(dtype)
    return ATTENTION_EPS[name + ("_tf32" if name == "float32" and on_gpu else "")]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def within_fa_rule(err: float, err_torch: float, eps: float) -> bool:
    """FlashAttention's test rule: no worse than twice torch's own error at the same precision, plus eps."""
    return math.isfinite(err) and err <= 2 * err_torch + eps


def flash_errors(flash, ref, q, k, v, do, causal: bool) -> dict[str, tuple[float, float]]:
    """For the output and each gradient: (the error of ``flash``, the error of ``ref`` at q's
    precision), both against ``ref`` in fp64. q, k, v must require grad.

    ``flash`` and ``ref`` are kernels.flash_attention and kernels.flash_attention_ref, passed in so
    this module imports no kernel (what an experiment depends on stays exactly what it imports)."""
    results = {}
    for name, fn in (("triton", lambda: flash(q, k, v, causal=causal)),
                     ("torch", lambda: ref(q, k, v, causal, dtype=q.dtype)),
                     ("fp64", lambda: ref(q, k, v, causal, dtype=torch.float64))):
        out = fn()
        results[name] = (out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype)))
    return {what: (max_abs_diff(results["triton"][i], results["fp64"][i]),
                   max_abs_diff(results["torch"][i], results["fp64"][i]))
            for i, what in enumerate(("out", "dq", "dk", "dv"))}
