"""The machine's ceilings, measured in the same run as everything they are compared with (claim 11)."""
from __future__ import annotations

import pandas as pd
import torch
import yaml

from .. import summary
from ..claims import FALSE_POINT_HOLDS, NEEDS_GPU, NOT_REPRODUCED, REPRODUCED
from ..measure import ceilings as measure_ceilings
from ..measure import is_gpu, timing_rows
from ..table import needs_gpu, row
from . import claim, experiment, section

RUNG = 0  # before the ladder: what every rung is measured against
SCHEMA = yaml.safe_load("""
ceilings:
  copy_bytes: {type: integer, minimum: 1048576, maximum: 17179869184}
  matmul_n: {type: integer, minimum: 256, maximum: 32768}
""")
COPY, MATMUL, DEVICE = "device_copy", "bf16_matmul", "device"
PROVIDERS = {COPY: "a device-to-device copy (`torch.Tensor.copy_`): the memory system's ceiling",
             MATMUL: "a bf16 matmul (`torch.matmul`): the tensor cores' ceiling",
             DEVICE: "the device's properties, as Triton's driver and torch report them"}


@experiment(timing=True, seeded=False, ceilings=False)  # it is the ceiling
def ceilings(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("measuring the device's ceilings")]
    import triton

    props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
    torch_props = torch.cuda.get_device_properties(torch.cuda.current_device())
    rows = [row("shared_memory_per_block", props["max_shared_mem"], "bytes", provider=DEVICE),
            row("multiprocessors", props["multiprocessor_count"], "count", provider=DEVICE),
            row("device_memory", torch_props.total_memory, "bytes", provider=DEVICE)]
    per_sm = getattr(torch_props, "shared_memory_per_multiprocessor", None)  # not in every torch
    if per_sm:
        rows.append(row("shared_memory_per_multiprocessor", per_sm, "bytes", provider=DEVICE))
    n_bytes, n = s["copy_bytes"], s["matmul_n"]
    times = measure_ceilings(n_bytes, n, **s["bench"])
    rows += timing_rows(times["copy"], 2 * n_bytes / 1e9, "GB", provider=COPY, bytes=2 * n_bytes)
    rows += timing_rows(times["matmul"], 2 * n**3 / 1e12, "TFLOP", provider=MATMUL, n=n)
    return rows


# --- what the other units read of it ------------------------------------------------------------------------

def device_ceilings(cal: pd.DataFrame) -> dict:
    """copy GB/s and bf16 matmul TFLOP/s (medians) and the device's properties (shared memory per block,
    per SM, device memory, ... as recorded); {} without a GPU."""
    if summary.ok(cal).empty:
        return {}
    return {
        "copy_gbps": summary.median(cal, "bandwidth", provider=COPY)["value"].iloc[0],
        "matmul_tflops": summary.median(cal, "throughput", provider=MATMUL)["value"].iloc[0],
        "device": cal["device"].iloc[0],
        **{m: int(g["value"].iloc[0]) for m, g in summary.ok(cal, provider=DEVICE).groupby("metric")},
    }


def own_ceiling(df: pd.DataFrame, name: str, cal: pd.DataFrame | None = None) -> float | None:
    """The ceiling ('copy_gbps' or 'matmul_tflops') a timing table's job measured on its own GPU before it
    started (lab.runner); a table from before that was recorded falls back to the calibration table's."""
    d = summary.ok(df)
    if name in d and d[name].notna().any():
        return float(d[name].dropna().iloc[0])
    return device_ceilings(cal).get(name) if cal is not None else None


# --- the claim it settles -----------------------------------------------------------------------------------

@claim(11, ['calibration/ceilings'])
def shared_memory(t, s):
    c = device_ceilings(t["calibration/ceilings"])
    if not c:
        return "the shared-memory limits are properties of the GPU: not measurable in the interpreter", NEEDS_GPU
    per_sm = c.get("shared_memory_per_multiprocessor") or c["shared_memory_per_block"]
    low, high = s["said_bytes"]
    measured = (f"{c['device']}: {per_sm} B = {per_sm / 1024:.0f} KiB of shared memory per SM "
                f"({c['shared_memory_per_block']} B = {c['shared_memory_per_block'] / 1024:.0f} KiB usable by one "
                f"block, the kernels' limit); device memory {c['device_memory'] / 2**30:.0f} GiB, "
                f"{c['device_memory'] / per_sm:.1e}x one SM's shared memory")
    if low <= per_sm < high:
        return measured + f" - within 'tens of kilobytes' ({low}..{high} B)", REPRODUCED
    if per_sm * s["min_ratio_to_device_memory"] <= c["device_memory"]:
        return (measured + f" - not 'tens of kilobytes' ({low}..{high} B) on this GPU, but tiny next to device "
                "memory, the point of the sentence"), FALSE_POINT_HOLDS
    return measured, NOT_REPRODUCED


# --- its report section -------------------------------------------------------------------------------------

@section(["calibration/ceilings"])
def section_calibration(tables) -> str:
    ceil = device_ceilings(tables["calibration/ceilings"])
    if not ceil:
        return ""
    return (f"\nThe calibration job on {ceil['device']}: device-to-device copy **{ceil['copy_gbps']:.0f} GB/s**, "
            f"bf16 matmul **{ceil['matmul_tflops']:.0f} TFLOP/s**, shared memory per block "
            f"**{ceil['shared_memory_per_block']} B**.")
