"""Where a result came from: the software and device a job ran on, the commit, and the hashes of
what determined it (settings and code).

``software()`` is computed twice: by the workflow when it plans a job (it becomes the job's params,
so a new torch, triton, CUDA, driver or device reruns the job) and by the job itself, which refuses to
run when the two disagree (the plan would then describe another machine).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What a row records about its origin. The first block is software(), then the job's own context.
SOFTWARE = ["device", "backend", "torch", "triton", "cuda", "cudnn", "driver", "kernel_env"]
COLUMNS = SOFTWARE + ["gpu_uuid", "sm_clock_mhz", "sm_clock_max_mhz", "git_commit", "git_dirty", "job_start",
                      "timestamp", "config_hash", "code_hash", "fingerprint", "rerun_marker"]


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint(settings: dict, code_hash: str, software: dict) -> str:
    """One hash of everything that determines a table; recorded in it, compared on every plan."""
    return digest({"settings": settings, "code": code_hash, "software": software})


def _git(*args) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str:
    # A copy of the tree without .git (the GPU machine's) gets the commit from the caller.
    return os.environ.get("LAB_GIT_COMMIT") or _git("rev-parse", "--short=12", "HEAD") or "unknown"


def git_dirty() -> str:
    """'true' when tracked files outside results/ differ from the commit, 'false' when not, 'unknown'
    without git. results/ does not count: a run rewrites its own tracked tables and report as it goes,
    which says nothing about the code that made them."""
    if os.environ.get("LAB_GIT_DIRTY") in ("true", "false"):
        return os.environ["LAB_GIT_DIRTY"]
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return "unknown" if status is None else str(bool(status)).lower()


@lru_cache(maxsize=None)
def nvidia_smi(gpu: str | None = None) -> dict:
    """Name, driver, UUID and SM clocks of one GPU (nvidia-smi numbering), without touching CUDA.
    Read once per process: a job's software and its clocks are those of its start."""
    if not shutil.which("nvidia-smi"):
        return {}
    fields = ["name", "driver_version", "uuid", "clocks.sm", "clocks.max.sm"]
    cmd = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", gpu or "0"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode or not out.stdout.strip():
        return {}
    return dict(zip(fields, (v.strip() for v in out.stdout.strip().splitlines()[0].split(","))))


def _pinned_gpu() -> str | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or None


def kernel_env() -> str:
    """The environment variables set here that change what the kernels run or how fast ('NAME=value ...'):
    every KERNELS_* but the backend (a column of its own) and the tile cache's path, and Triton's fp fusion."""
    names = sorted(k for k in os.environ if k == "TRITON_DEFAULT_FP_FUSION"
                   or (k.startswith("KERNELS_") and k not in ("KERNELS_BACKEND", "KERNELS_TILE_CACHE")))
    return " ".join(f"{k}={os.environ[k]}" for k in names)


def software(backend: str) -> dict:
    """The backend, device and software stack a job runs on (strings: they are Snakemake params)."""
    import torch

    smi = nvidia_smi(_pinned_gpu()) if backend == "gpu" else {}
    cudnn = torch.backends.cudnn.version() if backend == "gpu" else None
    return {
        "device": (smi.get("name") or torch.cuda.get_device_name()) if backend == "gpu"
        else f"cpu ({platform.machine()}, Triton interpreter)",
        "backend": backend,
        "torch": torch.__version__,
        "triton": importlib.metadata.version("triton"),
        "cuda": str(torch.version.cuda or "") if backend == "gpu" else "",
        "cudnn": str(cudnn or ""),
        "driver": smi.get("driver_version", ""),
        "kernel_env": kernel_env(),
    }


def job_context(backend: str) -> dict:
    """What a job records at its start besides software(): GPU identity and clocks, commit, time."""
    smi = nvidia_smi(_pinned_gpu()) if backend == "gpu" else {}

    def mhz(key):
        try:
            return float(smi[key])
        except (KeyError, ValueError):
            return float("nan")

    return {"gpu_uuid": smi.get("uuid", ""), "sm_clock_mhz": mhz("clocks.sm"), "sm_clock_max_mhz": mhz("clocks.max.sm"),
            "git_commit": git_commit(), "git_dirty": git_dirty(), "timestamp": now()}


def now() -> str:
    """UTC time to the millisecond: when a job started (``job_start``) and wrote its table (``timestamp``)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def run_name(software: dict) -> str:
    """Default results folder: one per device, so runs on different machines never collide."""
    if software["backend"] == "gpu":
        return re.sub(r"[^a-z0-9]+", "-", software["device"].lower()).strip("-")
    return "cpu-interpreter"
