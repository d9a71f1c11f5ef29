"""Host cost per call of flash_attention and of SDPA, measured fairly (GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/call_cost.py

Calls run back to back between two CUDA events on problems too small to keep the GPU busy, so the time
per call is the host's. SDPA is timed three ways: as a model calls it (no backend forced), inside
``sdpa_kernel(backend)`` entered once around all the calls, and with ``sdpa_kernel`` entered on every
call as the pipeline's launch-floor row does (which adds the context manager's own cost to SDPA). The
calls being compared take turns (lab.units.flash_attention.per_call_ms).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import flash_attention
from lab.measure import sdpa_backend_of
from lab.units.flash_attention import per_call_ms


def main() -> None:
    for b, h, s in ((1, 1, 16), (1, 8, 128)):
        q, k, v = (torch.randn(b, h, s, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731

        def flash_each_call():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa()

        with torch.no_grad():
            rows = per_call_ms({"flash_attention": lambda: flash_attention(q, k, v),
                                f"sdpa, no backend forced ({sdpa_backend_of(sdpa)})": sdpa,
                                "sdpa_kernel(FLASH) per call": flash_each_call})
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                rows.update(per_call_ms({"sdpa_kernel(FLASH) entered once": sdpa}))
        grads = [t.clone().requires_grad_() for t in (q, k, v)]
        rows.update(per_call_ms({"flash_attention fwd+bwd": lambda: flash_attention(*grads).backward(q),
                                 "sdpa fwd+bwd, no backend forced":
                                     lambda: F.scaled_dot_product_attention(*grads).backward(q)}))
        for name, quantiles in rows.items():
            print(f"B={b} H={h} S={s} D=64 bf16  {name:45s} median {quantiles[0.5] * 1e3:6.1f} us per call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    main()
