"""Every experiment, declared where it is defined.

    @experiment(timing=True)
    def performance(s: dict) -> list[dict]: ...

registers ``<kernel>/performance`` (the kernel is the module's name). The declaration says what the
job needs and what its table depends on:

- ``timing``: it measures time, so it runs alone on its GPU, autotunes, and receives the ``bench``
  settings (which then are part of what determines its table);
- ``seeded``: its inputs derive from ``seed`` (so ``--config seed=1`` reruns it, and only it);
- ``ceilings`` (timing experiments): the job measures the copy bandwidth and the bf16 matmul rate on its
  own GPU before it starts and records them on every row (columns copy_gbps, matmul_tflops), so every
  fraction of a ceiling divides by a ceiling of the same GPU and job. It receives ``ceilings`` settings.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

KERNELS = ("calibration", "vector_add", "relu_dropout", "softmax", "attention", "flash_attention")


@dataclass(frozen=True)
class Experiment:
    kernel: str
    name: str
    fn: Callable[[dict], list[dict]]
    timing: bool
    seeded: bool
    ceilings: bool

    @property
    def key(self) -> str:
        return f"{self.kernel}/{self.name}"

    @property
    def module(self) -> str:
        return f"{__name__}.{self.kernel}"


_REGISTRY: dict[str, Experiment] = {}


def experiment(*, timing: bool = False, seeded: bool = True, ceilings: bool | None = None):
    def register(fn):
        kernel = fn.__module__.rsplit(".", 1)[-1]
        exp = Experiment(kernel, fn.__name__, fn, timing, seeded, timing if ceilings is None else ceilings)
        _REGISTRY[exp.key] = exp
        return fn

    return register


def registry() -> dict[str, Experiment]:
    """'kernel/experiment' -> Experiment, in the order of KERNELS and of definition."""
    for kernel in KERNELS:
        importlib.import_module(f"{__name__}.{kernel}")
    return dict(_REGISTRY)
