"""Run one call in a fresh process, so that a fault it causes is a result, not the end of the job.

A kernel that writes out of bounds leaves "CUDA error: an illegal memory access" behind, and the CUDA
context of that process is unusable afterwards: every later call fails too. A probe that may fault
(the writeup's kernels as printed, past 2**31 elements) therefore runs in a spawned child with the
job's environment (backend, GPU); its outcome comes back as a status: 'ok' with what it measured,
'raised' with the exception, 'crashed' with the exit code when the child died without a word, or
'timed_out' when it gave no result in time (it is killed: a hang is not a fault).
"""
from __future__ import annotations

import multiprocessing
import traceback
from typing import Callable


def _child(conn, fn, args):
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as e:  # noqa: BLE001  (whatever it was, it is the result)
        traceback.print_exc()
        conn.send(("raised", f"{type(e).__name__}: {e}"[:2000]))
    finally:
        conn.close()


def call(fn: Callable, *args, timeout_s: float = 900) -> dict:
    """fn(*args) in a spawned process (fn must be importable by name). Returns {"status": "ok", "result":
    what fn returned} or {"status": "raised" | "crashed" | "timed_out", "error": text} (timed_out: no result
    within ``timeout_s``, the process killed)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args))
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            proc.kill()
            proc.join()
            return {"status": "timed_out", "error": f"no result within {timeout_s:g} s: the process was killed"}
        message = parent.recv()
    except EOFError:  # the child died before it could send anything
        message = None
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if message is None:
        return {"status": "crashed", "error": f"the process ended without a result (exit code {proc.exitcode})"}
    status, payload = message
    return {"status": "ok", "result": payload} if status == "ok" else {"status": "raised", "error": payload}
