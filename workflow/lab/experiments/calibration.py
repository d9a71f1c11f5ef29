"""The machine's ceilings, measured in the same run as everything they are compared with (claim 11)."""
from __future__ import annotations

import torch

from ..measure import bench, is_gpu, timing_rows
from ..table import needs_gpu, row
from . import experiment


@experiment(timing=True, seeded=False)
def ceilings(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("measuring the device's ceilings")]
    import triton

    props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
    torch_props = torch.cuda.get_device_properties(torch.cuda.current_device())
    rows = [row("shared_memory_per_block", props["max_shared_mem"], "bytes", provider="device"),
            row("multiprocessors", props["multiprocessor_count"], "count", provider="device"),
            row("device_memory", torch_props.total_memory, "bytes", provider="device")]
    per_sm = getattr(torch_props, "shared_memory_per_multiprocessor", None)  # not in every torch
    if per_sm:
        rows.append(row("shared_memory_per_multiprocessor", per_sm, "bytes", provider="device"))
    n_bytes = s["copy_bytes"]
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    rows += timing_rows(bench(lambda: dst.copy_(src), **s["bench"]), 2 * n_bytes / 1e9, "GB",
                        provider="device_copy", bytes=2 * n_bytes)
    n = s["matmul_n"]
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows += timing_rows(bench(lambda: a @ b, **s["bench"]), 2 * n**3 / 1e12, "TFLOP", provider="bf16_matmul", n=n)
    return rows
