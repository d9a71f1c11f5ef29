"""Input checks shared by the public kernel functions: bad input is refused, never computed on."""
from __future__ import annotations

import torch

from . import backend

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def tensor(x, name: str, *, ndim: int | tuple[int, ...] | None = None, dtypes=FLOATS) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.dim() not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name} has unsupported dtype {x.dtype}; supported: {', '.join(map(str, dtypes))}")
    if x.dtype == torch.bfloat16 and backend.current() == "interpreter":
        raise TypeError(f"{name} is bfloat16, and bf16 arithmetic is broken in Triton's interpreter (it returns "
                        "garbage): use float16/float32 here, or a GPU")
    want = backend.device()
    if x.device.type != want:
        raise ValueError(
            f"{name} is on {x.device}, but the {backend.current()!r} backend runs on {want} tensors"
        )


def same(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor, *, shape: bool = True) -> None:
    if a.device != b.device:
        raise ValueError(f"{name_a} and {name_b} are on different devices: {a.device} vs {b.device}")
    if a.dtype != b.dtype:
        raise TypeError(f"{name_a} and {name_b} have different dtypes: {a.dtype} vs {b.dtype}")
    if shape and a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} have different shapes: {tuple(a.shape)} vs {tuple(b.shape)}")


def block_size(value, name: str = "block_size", smallest: int = 1, largest: int = 2**17) -> int:
    """A block size: an int (not a bool), a power of two in [smallest, largest]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not smallest <= value <= largest or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{smallest}, {largest}], got {value}")
    return value


def flag(value, name: str) -> bool:
    """A yes/no argument: a real bool, so that causal="False" is not read as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value
