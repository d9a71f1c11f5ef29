"""Pin each job to a GPU, and never let a timing job share its GPU.

Snakemake's ``resources: gpu=1`` bounds how many timing jobs run at once (when the GPUs are declared
with ``--resources gpu=N`` or a profile), but it does not say *which* GPU a job gets, and it cannot
keep correctness jobs off a GPU that is being timed. So every job locks one GPU index with flock and
sets CUDA_VISIBLE_DEVICES before torch or triton is imported:

- timing jobs, and jobs that take much of a GPU's memory (lab.units' ``alone``), take an exclusive lock:
  nothing else runs on that GPU meanwhile;
- other correctness and statistics jobs take a shared lock: they may run side by side, not beside an
  exclusive one.

The lock is held until the process exits; a job that finds no suitable GPU waits for one.

Timing jobs also share a lock on the host, which plotting jobs take exclusively (``quiet_host``): a
figure job's CPU load delays the Python that launches a timed kernel, and at microsecond sizes that
delay shows up in the timing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

LOCKS = Path(tempfile.gettempdir()) / "triton-lab-gpu-locks"


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


def claim(gpus: list[str], lock_dir: str | os.PathLike, exclusive: bool = True, poll_s: float = 0.5,
          timeout_s: float | None = None):
    """Lock one of ``gpus``; returns (gpu id, open lock file). Blocks while none can be locked."""
    import fcntl  # here: figure jobs import this module on any system; only locking needs POSIX

    lock_dir = Path(lock_dir)
    if not lock_dir.is_dir():
        lock_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):  # another user made it meanwhile
            lock_dir.chmod(0o1777)  # every user's jobs lock here (sticky: each keeps its own files)
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    start = time.monotonic()
    while True:
        for gpu in gpus:
            handle = _lock_file(lock_dir / f"gpu-{gpu}.lock")
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return gpu, handle
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"no free GPU among {gpus} after {timeout_s} s")
        time.sleep(poll_s)


def pin(lock_dir: str | os.PathLike, exclusive: bool, timing: bool):
    """Claim a GPU (``exclusive``: alone on it) and make it the only one this process sees; a ``timing`` job
    also holds the host's lock. Returns the locks (keep them open)."""
    gpus = visible_gpus()
    if not gpus:
        return None
    gpu, handle = claim(gpus, lock_dir, exclusive)
    host = claim(["host"], lock_dir, exclusive=False)[1] if timing else None
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    return handle, host


def _lock_file(path: Path):
    """The lock file, open for appending, readable and writable by every user (another user's jobs lock
    the same GPU): the umask would narrow a plain open's mode."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    with contextlib.suppress(PermissionError):  # another user's file: they made it open to all
        os.fchmod(fd, 0o666)
    return os.fdopen(fd, "a")


def quiet_host(lock_dir: str | os.PathLike = LOCKS):
    """For CPU-heavy jobs (figures): wait until no timing job runs on this machine, and keep timing jobs
    from starting meanwhile. Returns the lock (keep it open); None where there is no flock (Windows)."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return None
    return claim(["host"], lock_dir, exclusive=True)[1]
