"""Input checks shared by the public kernel functions: bad input is refused, never computed on."""
from __future__ import annotations

import numbers
import os

import torch

from . import backend

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def tensor(x, name: str, *, ndim: int | tuple[int, ...] | None = None, dtypes=FLOATS) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_nested:
        raise TypeError(f"{name} must be a dense tensor (torch.strided layout), got a nested one")
    if x.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor (torch.strided layout), got {x.layout}: pass {name}.to_dense()")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.dim() not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, got shape {tuple(x.shape)}")
    # The kernels read memory as it is, without torch's lazy negation (e.g. z.conj().imag). Not under
    # torch.compile, which cannot trace is_neg (and whose graphs, Inductor's at least, read such an input
    # as its memory in torch's own ops too: torch 2.13, `a + 1` on a negated view is wrong there).
    if not torch.compiler.is_compiling() and x.is_neg():
        raise TypeError(f"{name} is a lazily negated view (torch's negative bit is set): pass {name}.resolve_neg()")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name} has unsupported dtype {x.dtype}; supported: {', '.join(map(str, dtypes))}")
    if backend.current() == "aot":
        raise RuntimeError("the 'aot' backend (KERNELS_BACKEND=aot) only compiles kernels ahead of time for a GPU "
                           f"target; it cannot launch them, so {name} cannot be computed on: unset KERNELS_BACKEND "
                           "to run on a GPU or in Triton's interpreter")
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
    """A block size: a Python or NumPy int (not a bool), a power of two in [smallest, largest], as an int."""
    value = integer(value, name)
    if not smallest <= value <= largest or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{smallest}, {largest}], got {value}")
    return value


def real(value, name: str) -> float:
    """A number argument: a Python or NumPy int or float, as a float. Refused for its type (TypeError) when
    it is not one: a bool, a string, a tensor (even 0-dim: its value may live on the GPU; pass .item())."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ": pass a Python number (.item())" if isinstance(value, torch.Tensor) else ""
        raise TypeError(f"{name} must be a real number (a Python or NumPy int or float), got "
                        f"{type(value).__name__} {value!r}{hint}")
    try:
        return float(value)
    except OverflowError:  # an int past the largest float
        raise ValueError(f"{name} must be a real number a float can hold, got an int of {int(value).bit_length()} "
                         "bits") from None


def integer(value, name: str) -> int:
    """An integer argument: a Python or NumPy int (not a bool, float or tensor), as an int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = ": pass a Python int (.item())" if isinstance(value, torch.Tensor) else ""
        raise TypeError(f"{name} must be an integer (a Python or NumPy int), got {type(value).__name__} "
                        f"{value!r}{hint}")
    return int(value)


def switch(name: str) -> bool:
    """An on/off environment variable (read at each call; on where unset): 0 or 1, anything else refused, so that
    ``off`` or ``false`` is not read as on."""
    value = os.environ.get(name, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def flag(value, name: str) -> bool:
    """A yes/no argument: a real bool, so that causal="False" is not read as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def forward_only(function: str, **tensors: torch.Tensor) -> None:
    """Refuse to run a kernel that has no backward when autograd would want one: its output would be
    silently detached from the graph (gradients missing, not wrong-looking)."""
    if torch.is_grad_enabled():
        wanting = [name for name, t in tensors.items() if t.requires_grad]
        if wanting:
            raise RuntimeError(f"{function} is not differentiable (forward only), but {' and '.join(wanting)} "
                               f"{'requires' if len(wanting) == 1 else 'require'} grad: call it under "
                               "torch.no_grad() or pass detached tensors")


def no_double_backward(function: str) -> None:
    """Call at the top of a backward that runs Triton kernels: grad mode is on there only when autograd
    was asked for create_graph=True, and a kernel's output has no graph, so second-order terms would be
    silently zero."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{function} does not support double backward: its backward runs Triton kernels "
                           "whose outputs have no graph (create_graph=True would give silently zero "
                           "second-order terms)")


def output(out: torch.Tensor, name: str = "out", **inputs: torch.Tensor) -> None:
    """Refuse an output tensor that torch would refuse for an ``out=`` argument: one with internal overlap
    (two of its elements at one memory location, e.g. expanded), or one that shares memory with an input
    without being exactly it (an input's exact view is in-place use, which the kernels compute right).
    Conservative where an exact answer is dear: a layout too large to check element by element (past
    OVERLAP_CHECKED elements) whose dimensions interleave, and one whose elements merely interleave with an
    input's, are refused too. In grad mode, an output that requires grad is refused, as torch refuses it:
    the kernel writes it outside autograd."""
    if torch.is_grad_enabled() and out.requires_grad:
        raise ValueError(f"{name} requires grad: an out= argument cannot take part in autograd (pass none and "
                         f"use the result, or write into a tensor that does not require grad)")
    overlap = internal_overlap(out)
    if overlap is None:
        raise ValueError(f"{name}'s dimensions interleave in memory (shape {tuple(out.shape)}, strides "
                         f"{out.stride()}) and it has too many elements to check that none share a location; "
                         f"pass a tensor of a plainer layout, e.g. {name}.clone()")
    if overlap:
        raise ValueError(f"{name} has internal overlap: more than one of its elements refers to a single memory "
                         f"location (shape {tuple(out.shape)}, strides {out.stride()}); pass a tensor that does "
                         f"not, e.g. {name}.clone()")
    for other, t in inputs.items():
        if spans_overlap(out, t) and not (out.data_ptr() == t.data_ptr() and out.shape == t.shape
                                          and out.stride() == t.stride()):
            raise ValueError(f"{name} overlaps {other} in memory with a different layout (offset, shape or "
                             f"strides): pass {other} itself for in-place use, or a tensor of its own")


def rows_fit_int32(t: torch.Tensor) -> bool:
    """Does the last element of t's last two dimensions (one row block of a head: offsets the kernels
    compute in int32) lie less than 2^31 elements from the first?"""
    return sum(s * (n - 1) for s, n in zip(t.stride()[-2:], t.shape[-2:])) < 2**31


def overlaps_itself(t: torch.Tensor) -> bool:
    """May two of t's elements share a memory location (an expand's stride 0, an unfold's overlapping
    windows)? False where they certainly do not: each dimension, smallest stride first, steps past
    everything the smaller ones span. No sort (each dimension's smaller ones are found by comparison), so
    that torch.compile traces it with symbolic sizes."""
    dims = [(stride, size) for stride, size in zip(t.stride(), t.shape) if size > 1]
    for i, (stride, size) in enumerate(dims):
        # the dimensions before this one in (stride, size, index) order
        span = sum(s * (n - 1) for j, (s, n) in enumerate(dims)
                   if s < stride or (s == stride and (n < size or (n == size and j < i))))
        if stride <= span:
            return True
    return False


OVERLAP_CHECKED = 2**22  # elements: internal_overlap enumerates offsets up to this many (32 MiB of int64)


def internal_overlap(t: torch.Tensor) -> bool | None:
    """Do two of t's elements share a memory location? True or False; None where overlaps_itself cannot
    rule it out and t has more than OVERLAP_CHECKED elements (its offsets are then not enumerated)."""
    if not overlaps_itself(t):
        return False
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
        return True
    if t.numel() > OVERLAP_CHECKED:
        return None
    offsets = torch.zeros((), dtype=torch.int64)
    for stride, size in zip(t.stride(), t.shape):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return offsets.unique().numel() < t.numel()


def spans_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do the memory ranges a and b reach (first to last element) intersect?"""
    if not a.numel() or not b.numel() or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        last = sum(s * (n - 1) for s, n in zip(t.stride(), t.shape))  # in elements, from the first
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
