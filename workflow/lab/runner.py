"""Run one experiment and write its table: the body of every experiment job.

Order matters: the GPU is claimed and the backend chosen *before* torch/triton/kernels are imported.
Everything the table depends on arrives as arguments (the workflow declares the same values as the
job's params); nothing here reads the workflow's config.
"""
from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path


def run(key: str, settings: dict, software: dict, code_hash: str, output: str, overwrite_foreign: bool = False,
        rerun_marker: str = "") -> None:
    """Run experiment ``key`` ('kernel/name') with ``settings`` on the backend ``software`` names.
    ``rerun_marker``: the stale marker the workflow made this job wait for, if any (recorded: the workflow
    plans the job with the same marker again while the table is current, so its input set stays the same)."""
    from .units import registry  # no torch/triton import yet

    exp = registry()[key]
    backend = software["backend"]
    if backend == "gpu":
        from . import gpu

        lock = gpu.pin(gpu.LOCKS, exclusive=exp.exclusive, timing=exp.timing)  # noqa: F841  (held until it exits)
    os.environ["KERNELS_BACKEND"] = backend
    from . import provenance

    here = provenance.software(backend)  # before the defaults below: it records the environment the user set
    if here != software:
        changed = {k: (software.get(k), here.get(k)) for k in here if here.get(k) != software.get(k)}
        raise RuntimeError(f"{key} was planned for other software or another device than it runs on "
                           f"(planned, actual): {changed}")
    os.environ.setdefault("KERNELS_AUTOTUNE", "1" if exp.timing else "0")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its default

    import kernels

    from . import measure, runs, table

    kernels.backend.select(backend)
    run_dir = Path(output).parents[1]
    runs.check_owner(run_dir, here["device"], backend, overwrite_foreign)
    for built_from_old_tables in ("report.md", "claims.html"):  # a report never outlives its tables
        (run_dir / built_from_old_tables).unlink(missing_ok=True)
    start, started = time.perf_counter(), provenance.now()
    print(f"[{key}] backend={backend} settings={settings}", flush=True)
    fingerprint = provenance.fingerprint(settings, code_hash, software)
    try:
        ceilings = measure.ceiling_columns(settings) if exp.ceilings and backend == "gpu" else {}
        rows = [{**r, **ceilings} for r in exp.fn(settings)]
        df = _write(exp, rows, here, started, settings, code_hash, fingerprint, rerun_marker, output)
    except Exception as e:  # this experiment's failure is its own (its rows too, if no table can hold them):
        traceback.print_exc()  # record it, let the others' results stand
        rows = [table.row("not_measured", None, status="failed", error=f"{type(e).__name__}: {e}"[:2000])]
        print(f"[{key}] FAILED; recorded as a failed table, retried on the next run", flush=True)
        # fingerprint 'failed' matches no plan: the next run retries it
        df = _write(exp, rows, here, started, settings, code_hash, "failed", rerun_marker, output)
    print(f"[{key}] {len(df)} rows in {time.perf_counter() - start:.1f} s -> {output}", flush=True)


def _write(exp, rows: list[dict], software: dict, started: str, settings: dict, code_hash: str, fingerprint: str,
           rerun_marker: str, output: str):
    """The experiment's table: its rows and their origin (the software, the job, the hashes), written atomically."""
    from . import provenance, table

    origin = {**software, **provenance.job_context(software["backend"]), "job_start": started,
              "config_hash": provenance.digest(settings), "code_hash": code_hash, "fingerprint": fingerprint,
              "rerun_marker": rerun_marker}
    df = table.to_frame(rows, exp.kernel, exp.name, origin)
    table.write_parquet(df, output)
    return df


def record_death(key: str, settings: dict, software: dict, code_hash: str, output: str, signum: int, started: str,
                 rerun_marker: str = "") -> None:
    """Write the failed table of experiment ``key``, whose process died by signal ``signum``."""
    from . import table
    from .units import registry

    try:
        name = signal.Signals(signum).name
    except ValueError:  # a number no signal of this platform has
        name = f"signal {signum}"
    error = (f"the experiment's process died by {name} (a fault: a segfault, or an error that aborted the "
             f"process, such as a GPU fault); its log has what it printed before")
    rows = [table.row("not_measured", None, status="failed", error=error)]
    _write(registry()[key], rows, software, started, settings, code_hash, "failed", rerun_marker, output)
    print(f"[{key}] DIED by {name}; recorded as a failed table, retried on the next run", flush=True)
