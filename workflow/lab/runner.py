"""Run one experiment (kernel x experiment) and write its table: the body of every experiment job.

Order matters: the GPU is claimed and the backend chosen *before* torch/triton/kernels are imported.
"""
from __future__ import annotations

import importlib
import os
import sys
import time


TIMING = ("ceilings", "performance")  # experiments that measure time: alone on their GPU, autotuned


def run(kernel: str, experiment: str, config: dict, output: str, lock_dir: str | None = None) -> None:
    timing = experiment in TIMING
    if config["backend"] == "gpu" and lock_dir:
        from . import gpu

        lock = gpu.pin(lock_dir, exclusive=timing)  # noqa: F841  (held until the process exits)
    os.environ["KERNELS_BACKEND"] = config["backend"]
    os.environ.setdefault("KERNELS_AUTOTUNE", "1" if timing else "0")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default

    import kernels
    from . import provenance, table

    backend = kernels.backend.current()
    module = importlib.import_module(f"lab.experiments.{kernel}")
    settings = {**config.get(kernel, {}).get(experiment, {}), "seed": config["seed"],
                "bench": config["bench"]}
    start = time.perf_counter()
    print(f"[{kernel}/{experiment}] backend={backend} settings={settings}", flush=True)
    rows = getattr(module, experiment)(settings)
    df = table.to_frame(rows, kernel, experiment, provenance.provenance(backend, config))
    table.write_parquet(df, output)
    print(f"[{kernel}/{experiment}] {len(df)} rows in {time.perf_counter() - start:.1f} s -> {output}", flush=True)


def main_from_snakemake(smk) -> None:
    log = open(smk.log[0], "w") if smk.log else None
    if log:
        sys.stdout = sys.stderr = log
    run(smk.params.kernel, smk.wildcards.experiment, smk.config, smk.output[0], smk.params.get("lock_dir"))
