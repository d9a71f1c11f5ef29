"""Where a result came from: device, backend, software versions, commit, time and config."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def git_commit() -> str:
    # The GPU machine gets a copy of the tree without .git: the caller may pass the commit along.
    if os.environ.get("LAB_GIT_COMMIT"):
        return os.environ["LAB_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(backend: str) -> str:
    if backend == "gpu":
        import torch

        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, Triton interpreter)"


def run_name(backend: str) -> str:
    """Default results folder: one per device, so runs on different machines never collide."""
    if backend == "gpu":
        return re.sub(r"[^a-z0-9]+", "-", device_name(backend).lower()).strip("-")
    return "cpu-interpreter"


def provenance(backend: str, config: dict) -> dict:
    import torch
    import triton

    return {
        "device": device_name(backend),
        "backend": backend,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "git_commit": git_commit(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config_hash": config_hash(config),
    }
