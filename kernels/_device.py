"""What a kernel's launch asks of the GPU it runs on, asked once per device (a launch sized by it runs on
every call). Apart from _launch.py, which every kernel imports: only the kernels that use it depend on it."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The GPU's SM count: a persistent grid's size."""
    return torch.cuda.get_device_properties(device).multi_processor_count
