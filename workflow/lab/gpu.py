"""One GPU per job: claim a free GPU with a lock file and pin the process to it.

Snakemake's ``resources: gpu=1`` keeps the *number* of concurrent GPU jobs at the number of GPUs (when
the profile declares them), but it does not say *which* GPU a job gets. Each job therefore takes an
exclusive lock on one GPU index and sets CUDA_VISIBLE_DEVICES before torch or triton is imported.
The lock is held until the process exits, so even without a profile two GPU jobs never share a GPU:
a job that finds every GPU taken waits for one.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path


def visible_gpus() -> list[str]:
    """GPU ids this process may use, without importing torch (which would fix the device set)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def claim(gpus: list[str], lock_dir: str | os.PathLike, poll_s: float = 0.5, timeout_s: float | None = None):
    """Lock one of ``gpus``; returns (gpu id, open lock file). Blocks while all are taken."""
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    while True:
        for gpu in gpus:
            handle = open(lock_dir / f"gpu-{gpu}.lock", "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return gpu, handle
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"no free GPU among {gpus} after {timeout_s} s")
        time.sleep(poll_s)


def pin(lock_dir: str | os.PathLike):
    """Claim a free GPU and make it the only one this process sees. Returns the lock (keep it open)."""
    gpus = visible_gpus()
    if not gpus:
        return None
    gpu, handle = claim(gpus, lock_dir)
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    return handle
