"""The machine's ceilings, measured in the same run as everything they are compared with (claim 11)."""
from __future__ import annotations

import torch

from ..measure import ceilings as measure_ceilings
from ..measure import is_gpu, timing_rows
from ..table import needs_gpu, row
from . import experiment


@experiment(timing=True, seeded=False, ceilings=False)  # it is the ceiling
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
    n_bytes, n = s["copy_bytes"], s["matmul_n"]
    times = measure_ceilings(n_bytes, n, **s["bench"])
    rows += timing_rows(times["copy"], 2 * n_bytes / 1e9, "GB", provider="device_copy", bytes=2 * n_bytes)
    rows += timing_rows(times["matmul"], 2 * n**3 / 1e12, "TFLOP", provider="bf16_matmul", n=n)
    return rows
