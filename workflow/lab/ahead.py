"""Compile an experiment's kernels ahead, several at once, before the experiment runs its cases in order.

On a GPU a correctness experiment spends nearly all its time in Triton's compiler, one kernel after another:
flash_attention/correctness (864 rows) took 281 s on an H100 with Triton's on-disk cache empty, and 4.7 s
with the 201 kernels it builds already in that cache. ``compile_ahead`` runs the cases first in a few spawned
processes (the job's environment: backend, GPU, switches) and throws their results away: each kernel is built
in one of them, in parallel, into the on-disk cache, and the experiment's own pass (this process, every case in
order, as before) finds it there. The table still comes only from that pass, so it is the same table.
Measured on a fresh H100 (16 CPUs): 72 cases compiled ahead in 8 processes in 58.7 s, the job 65.1 s in all
against 281.1 s, its 864 rows identical to the committed run's, value for value and tile for tile.
attention/wall does the same for its sweeps (a kernel per length), and flash_attention/performance for the tiles
its tuning will try (each launched once, untimed: kernels._flash_tiles.untimed), before anything is timed.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable

MAX_WORKERS = 8  # each holds a CUDA context and its case's tensors beside the jobs running on the same GPU


def workers() -> int:
    """The processes to compile in: the CPUs this job may use (a scheduler's share), at most MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def compile_ahead(fn: Callable, cases: Iterable[tuple], processes: int | None = None,
                  gpu_only: bool = True) -> dict:
    """Call ``fn(*case)`` for every case in ``processes`` spawned processes (default ``workers()``), results
    discarded; ``fn`` must be importable by name (a module-level function, or a functools.partial of one).
    Only on the GPU backend unless ``gpu_only=False`` (the interpreter compiles nothing). A case that raises
    there, or a process that dies, is left to the experiment's own pass, which records what happens. Returns
    what it did: {"cases", "processes", "failed", "seconds"} ({"processes": 0} when it did nothing)."""
    cases = list(cases)
    processes = min(len(cases), workers() if processes is None else processes)
    if processes < 2 or (gpu_only and not _gpu()):
        return {"cases": len(cases), "processes": 0, "failed": 0, "seconds": 0.0}
    start, failed = time.perf_counter(), 0
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_end_with, initargs=(os.getpid(),)) as pool:
        for future in [pool.submit(_quiet, fn, case) for case in cases]:
            try:
                failed += future.result()
            except Exception:  # noqa: BLE001  (a process that died breaks the pool: the rest fail here too)
                failed += 1
    done = {"cases": len(cases), "processes": processes, "failed": failed, "seconds": round(time.perf_counter() - start, 1)}
    print(f"[compile ahead] {done}", flush=True)  # in the job's log
    return done


def _gpu() -> bool:
    from .measure import is_gpu

    return is_gpu()


def _end_with(parent: int) -> None:
    from .job import die_with_parent

    die_with_parent(parent)  # a worker outlives no experiment (killed, timed out)


def _quiet(fn: Callable, case: tuple) -> int:
    """1 if ``fn(*case)`` raised, else 0: its result, or its error, is the experiment's own pass's to record."""
    try:
        fn(*case)
    except Exception:  # noqa: BLE001
        return 1
    return 0
