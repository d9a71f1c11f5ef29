"""Launching a Triton kernel again without Triton's per-call argument binding, behind one small class.

``kernel[grid](...)`` costs ~25 us of host time per call on the H200 host (Triton binds and specializes
every argument again), more than a whole attention at short lengths. A ``DirectLaunch`` remembers the
compiled kernel an earlier call made and launches it directly when a call would be specialized the same
way: same device, dtypes, constexprs and launch options, same integer arguments (their values decide
Triton's specialization), and every pointer 16-byte aligned. It is

- bounded: a least-recently-used cache of ``maxsize`` specializations, so a process that meets ever new
  shapes does not grow without end;
- guarded: used only on the GPU backend and with the Triton versions it was written and tested for
  (``TESTED``: their compiled kernels take ``[grid](*arguments, *constexprs, stream=...)``, constexprs by
  position, in the kernel's own order); any other version takes ``kernel[grid](...)`` every time;
- switchable: ``KERNELS_DIRECT_LAUNCH=0`` turns it off (read at each call).

``DirectLaunch.prepare`` goes one step further for a caller that repeats one configuration (FlashAttention
keeps one per call shape): a ``Prepared`` launch keeps the compiled kernel's launcher for its grid and its
arguments other than the tensors, so a repeated call does no key building or lookup at all.
"""
from __future__ import annotations

import collections
import functools
import threading

import torch

from . import _checks, backend
from ._triton import triton

TESTED = ("3.6",)  # Triton major.minor versions whose compiled-kernel launch this was checked against
ENV = "KERNELS_DIRECT_LAUNCH"


# One lock for every kernel launch and for tuning, so the kernels can be called from several threads: Triton's
# interpreter keeps a launch's grid and its patched language module in process-wide state, and on the GPU
# tuning captures CUDA graphs, during which another thread's launch or allocation on the default stream is
# illegal. On the GPU it is held only while work is enqueued (and while a bucket is tuned). Re-entrant:
# tuning launches, and softmax(block_size=...) calls softmax_writeup.
LOCK = threading.RLock()


def serialized(fn):
    """fn, run holding LOCK, and on the GPU of its first tensor argument: Triton launches on the current
    device, which on a machine of several GPUs need not be the one the tensors are on."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with LOCK:
            if _several_gpus():
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if first is not None and first.is_cuda and first.get_device() != torch.cuda.current_device():
                    with torch.cuda.device(first.device):
                        return fn(*args, **kwargs)
            return fn(*args, **kwargs)
    return locked


@functools.lru_cache(maxsize=None)
def _several_gpus() -> bool:
    return backend.current() == "gpu" and torch.cuda.device_count() > 1


def enabled() -> bool:
    return _checks.switch(ENV) and backend.current() == "gpu" and _tested(triton.__version__)


@functools.lru_cache(maxsize=None)
def _tested(version: str) -> bool:
    return ".".join(version.split(".")[:2]) in TESTED


class DirectLaunch:
    """``launch(programs, tensors, numbers, consts)`` = ``kernel[(programs,)](*tensors, *numbers, **consts)``:
    tensors and numbers positional, in the kernel's order; consts by name (constexprs and launch options
    such as num_warps). ``prepare`` fixes everything but the tensors, for a caller that launches one
    configuration again and again."""

    def __init__(self, kernel, maxsize: int = 256):
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.kernel, self.maxsize = kernel, maxsize
        self._compiled: collections.OrderedDict = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._compiled)

    def clear(self) -> None:
        self._compiled.clear()

    def __call__(self, programs: int, tensors: tuple, numbers: tuple, consts: dict) -> None:
        self.prepare(programs, numbers, consts)(*tensors)

    def prepare(self, programs: int, numbers: tuple, consts: dict) -> Prepared:
        return Prepared(self, programs, tuple(numbers), dict(consts))

    @serialized
    def _launch(self, programs: int, tensors: tuple, numbers: tuple, consts: dict):
        """Launch, through Triton unless this specialization was compiled before; returns ((the compiled
        kernel, its constexprs in order), the device) when a later call may launch it directly, else None."""
        key = None
        if enabled() and _aligned(tensors):
            device = _device()
            key = (device, *(t.dtype for t in tensors), *numbers, *sorted(consts.items()))
            hit = self._compiled.get(key)
            if hit is not None:
                self._compiled.move_to_end(key)
                compiled, constexprs = hit
                compiled[(programs, 1, 1)](*tensors, *numbers, *constexprs, stream=_stream(device))
                return hit, device
        compiled = self.kernel[(programs,)](*tensors, *numbers, **consts)
        if key is None or compiled is None:
            return None
        names = self.kernel.arg_names[len(tensors) + len(numbers):]  # the constexprs, in the kernel's order
        hit = self._compiled[key] = (compiled, tuple(consts[n] for n in names))
        if len(self._compiled) > self.maxsize:
            self._compiled.popitem(last=False)
        return hit, device


class Prepared:
    """One launch configuration of a kernel (grid, numbers, constexprs, launch options), called with its
    tensors: ``prepared(*tensors)``. Once Triton has compiled it, a call costs an alignment check and
    the compiled kernel's own launcher. Every call must pass tensors of the dtypes the first call passed
    (the compiled kernel is specialized on them); any other change goes through Triton again."""

    __slots__ = ("direct", "programs", "numbers", "consts", "_runner", "_arguments", "_device")

    def __init__(self, direct: DirectLaunch, programs: int, numbers: tuple, consts: dict):
        self.direct, self.programs, self.numbers, self.consts = direct, programs, numbers, consts
        self._runner = self._arguments = self._device = None

    @serialized
    def __call__(self, *tensors) -> None:
        if self._runner is not None and enabled() and _aligned(tensors) and _device() == self._device:
            self._runner(*tensors, *self._arguments, stream=_stream(self._device))
            return
        found = self.direct._launch(self.programs, tensors, self.numbers, self.consts)
        if found is not None:
            (compiled, constexprs), self._device = found
            self._runner = _runner(compiled, self.programs)  # made once
            self._arguments = (*self.numbers, *constexprs)


def _runner(compiled, programs: int):
    """``runner(*arguments, stream=...)`` for one grid of a compiled kernel: Triton's own
    (``compiled[grid]``), or, for a kernel that needs no scratch memory, a call of its compiled launcher
    (C) itself, which skips what Triton's runner does in Python at every call (two scratch allocators
    asked for nothing, launch metadata built for the launch hooks, the hook chains called through C);
    while any launch hook is registered (a profiler's), Triton's runner, so that the hook sees the
    launch. Written against triton 3.6's CompiledKernel and CudaLauncher (TESTED); anything it does not
    find takes Triton's runner."""
    grid = compiled[(programs, 1, 1)]
    launcher, hooks = getattr(compiled, "run", None), _hook_chains()
    fields = ("launch", "launch_cooperative_grid", "launch_pdl", "global_scratch_size", "profile_scratch_size")
    if hooks is None or not all(hasattr(launcher, f) for f in fields) or launcher.global_scratch_size \
            or launcher.profile_scratch_size:
        return grid
    launch, function, metadata = launcher.launch, compiled.function, compiled.packed_metadata
    cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    enter, leave = hooks

    def run(*arguments, stream):
        if enter.calls or leave.calls:
            grid(*arguments, stream=stream)
        else:  # the argument order of triton 3.6's generated launcher
            launch(programs, 1, 1, stream, function, cooperative, pdl, None, None, metadata, None, None, None,
                   *arguments)
    return run


def _hook_chains():
    """(launch enter hooks, launch exit hooks) as lists-holding chains (triton 3.6's knobs.HookChain), or
    None for a Triton that keeps them otherwise."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    chains = (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None))
    return chains if all(isinstance(getattr(c, "calls", None), list) for c in chains) else None


def _aligned(tensors) -> bool:
    """Is every pointer 16-byte aligned, as Triton assumes of the kernels it compiled for such pointers?"""
    for t in tensors:
        if t.data_ptr() % 16:
            return False
    return True


def _device() -> int:
    return triton.runtime.driver.active.get_current_device()  # where Triton launches


def _stream(device: int):
    return triton.runtime.driver.active.get_current_stream(device)
