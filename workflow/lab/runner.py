"""Run one experiment and write its table: the body of every experiment job.

Order matters: the GPU is claimed and the backend chosen *before* torch/triton/kernels are imported.
Everything the table depends on arrives as arguments (the workflow declares the same values as the
job's params); nothing here reads the workflow's config.
"""
from __future__ import annotations

import os
import time
from pathlib import Path


def run(key: str, settings: dict, software: dict, code_hash: str, output: str, overwrite_foreign: bool = False) -> None:
    """Run experiment ``key`` ('kernel/name') with ``settings`` on the backend ``software`` names."""
    from .experiments import registry  # no torch/triton import yet

    exp = registry()[key]
    backend = software["backend"]
    if backend == "gpu":
        from . import gpu

        lock = gpu.pin(gpu.LOCKS, exclusive=exp.timing)  # noqa: F841  (held until the process exits)
    os.environ["KERNELS_BACKEND"] = backend
    os.environ.setdefault("KERNELS_AUTOTUNE", "1" if exp.timing else "0")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default

    import kernels

    from . import provenance, runs, table

    kernels.backend.select(backend)
    here = provenance.software(backend)
    if here != software:
        changed = {k: (software.get(k), here.get(k)) for k in here if here.get(k) != software.get(k)}
        raise RuntimeError(f"{key} was planned for other software or another device than it runs on "
                           f"(planned, actual): {changed}")
    runs.check_owner(Path(output).parents[1], here["device"], backend, overwrite_foreign)
    start = time.perf_counter()
    print(f"[{key}] backend={backend} settings={settings}", flush=True)
    rows = exp.fn(settings)
    origin = {**here, **provenance.job_context(backend), "config_hash": provenance.digest(settings),
              "code_hash": code_hash, "fingerprint": provenance.fingerprint(settings, code_hash, software)}
    df = table.to_frame(rows, exp.kernel, exp.name, origin)
    table.write_parquet(df, output)
    print(f"[{key}] {len(df)} rows in {time.perf_counter() - start:.1f} s -> {output}", flush=True)
