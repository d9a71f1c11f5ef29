"""Tests run wherever they are started: in Triton's interpreter on a CPU machine (CI), compiled on a GPU.
Tolerances sit beside the dtypes they belong to."""
import os
import shutil
from pathlib import Path

import pytest
import torch

# Correctness tests run each kernel with its first fitting tile: tuning every shape bucket would compile
# every candidate tile for every head dim. The tests of tuning itself turn it back on.
os.environ.setdefault("KERNELS_AUTOTUNE", "0")

import kernels  # noqa: E402

pytest_plugins = ["pipeline"]  # the tiny-config pipeline fixture (``project``) of the workflow tests

DEVICE = kernels.backend.device()
ON_GPU = kernels.backend.current() == "gpu"

# (dtype, absolute tolerance for one fused op). bf16 runs only on the GPU: the interpreter computes it wrongly.
FLOAT_DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16",
                 marks=pytest.mark.skipif(not ON_GPU, reason="bf16 arithmetic is broken in Triton's interpreter")),
]


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)


@pytest.fixture
def fresh_tiles(tmp_path, monkeypatch):
    """FlashAttention tuning on, with no tile chosen or pinned and an empty cache file of its own."""
    from kernels import _flash_tiles

    monkeypatch.setenv(_flash_tiles.CACHE_ENV, str(tmp_path / "tiles.json"))
    monkeypatch.setenv(_flash_tiles.AUTOTUNE_ENV, "1")
    _flash_tiles.forget()
    yield _flash_tiles
    _flash_tiles.forget()


PROJECT = Path(__file__).resolve().parents[1]


def copy_project(dest: Path) -> dict:
    """Copy the project's sources into ``dest``; return the environment a command there runs in, which
    imports that copy's `kernels` and `lab` (as `pip install -e .` in the copy would), not this checkout's."""
    for item in ("Snakefile", "config.yaml", "workflow", "kernels", "tests"):
        src = PROJECT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    return runs_in(dest)


def runs_in(project: Path) -> dict:
    """The environment of a command that must import ``project``'s packages."""
    paths = [str(project), str(project / "workflow"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
