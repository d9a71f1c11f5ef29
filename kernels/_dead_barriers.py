"""Compiling Triton's warp-specialized kernels without the barriers it initializes and never uses.

Triton 3.6's warp specialization (sm_90) allocates mbarriers that no partition waits on or arrives at,
initializes them, and lets the shared memory allocator hand their bytes to the tiles that TMA then fills
(the first bytes of the operand ring, in the PTX), with no ``mbarrier.inval`` in between, which the PTX
ISA requires before an mbarrier's memory is used for anything else. On the H200 such a kernel is right
with the GPU to itself and wrong in some tiles whenever another process's kernels share the GPU (its
context and the other's time-sliced); the same kernel with those initializations deleted is right there
too (``workflow/scripts/ws_time_slicing.py`` has the counts). Triton 3.9 still allocates such barriers
but places them apart from the tiles and invalidates them; the edit is made with every Triton, since it
only deletes what nothing uses.

``without_dead_barriers(ttgir)`` deletes, from a kernel's TritonGPU IR, every barrier allocation whose only
uses are its own initialization (and invalidation), and ``override(compiled)`` writes such an edited IR
to a file named by its content, for Triton's ``ir_override`` launch option: Triton then compiles the
kernel again from that IR on. A kernel with no dead barrier gets no override. ``applies()`` says whether
the edit can be made at all: not where Triton keeps no IR (``TRITON_STORE_BINARY_ONLY``), ignores
``ir_override`` (``TRITON_KERNEL_OVERRIDE``) or has no such option; flash_attention then runs no
warp-specialized kernel. ``WithoutDeadBarriers`` is a DirectLaunch (kernels/_launch.py) that launches its
kernel so compiled.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import os
import re
import tempfile

from . import backend
from ._launch import DirectLaunch, _device, serialized
from ._triton import triton

# a barrier array or barrier: shared memory of i64 allocated with no initial value
_ALLOC = re.compile(r"^\s*(%[\w.$-]+) = ttg\.local_alloc(?:\s*\{[^}]*\})?\s*:\s*\(\)\s*->\s*!ttg\.memdesc<[\dx]*i64\b")
_INDEX = re.compile(r"^\s*(%[\w.$-]+) = ttg\.memdesc_index (%[\w.$-]+)\[")
_BARRIER_OP = re.compile(r"^\s*ttng\.(?:init|inval)_barrier (%[\w.$-]+)\b")


def _uses(name: str, lines: list[str]) -> list[int]:
    """Indices of the lines that mention SSA value ``name`` (its definition included)."""
    token = re.compile(re.escape(name) + r"(?![\w.$-])")
    return [i for i, line in enumerate(lines) if token.search(line)]


def _only_initialized(name: str, lines: list[str], dead: set[int]) -> bool:
    """Whether ``name`` (a barrier or an array of them) is used only by init/inval_barrier, directly or
    through memdesc_index; if so, adds those lines to ``dead``."""
    found = set()
    for i in _uses(name, lines):
        line = lines[i]
        if (m := _BARRIER_OP.match(line)) and m.group(1) == name:
            found.add(i)
        elif (m := _INDEX.match(line)) and m.group(2) == name:
            found.add(i)
            if not _only_initialized(m.group(1), lines, found):
                return False
        elif not ((m := _ALLOC.match(line)) and m.group(1) == name) and \
                not ((m := _INDEX.match(line)) and m.group(1) == name):
            return False  # any other use: a wait, an arrive, a TMA copy, a partition's capture...
    dead |= found
    return True


def without_dead_barriers(ttgir: str) -> str:
    """The IR with every barrier allocation that is only initialized (or invalidated) deleted, with its
    initializations; the IR unchanged if there is none."""
    lines = ttgir.splitlines(keepends=True)
    dead: set[int] = set()
    for i, line in enumerate(lines):
        m = _ALLOC.match(line)
        if m:
            found: set[int] = set()
            if _only_initialized(m.group(1), lines, found):
                dead |= found | {i}
    return "".join(line for i, line in enumerate(lines) if i not in dead) if dead else ttgir


def applies() -> bool:
    """Whether kernels can be compiled from an edited IR here (Triton's settings, read at each call)."""
    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)
    return compilation is not None and _has_ir_override() and not compilation.store_binary_only \
        and not compilation.override


@functools.lru_cache(maxsize=None)
def _has_ir_override() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "ir_override" in getattr(CUDAOptions, "__dataclass_fields__", {})


_written: dict[str, str | None] = {}  # compiled kernel's hash -> override path (or None)


def override(compiled) -> str | None:
    """For a compiled kernel: the path of its IR without dead barriers (for ``ir_override``), written once
    per content, or None if it has none (or Triton kept no IR)."""
    key = getattr(compiled, "hash", None)
    if key is not None and key in _written:
        return _written[key]
    ttgir = getattr(compiled, "asm", {}).get("ttgir")
    edited = without_dead_barriers(ttgir) if ttgir else None
    path = _write(edited) if edited and edited != ttgir else None
    if key is not None:
        _written[key] = path
    return path


def _write(text: str) -> str | None:
    """text in a file named by its content, in this user's cache (or temporary) folder; None if neither
    can be written."""
    name = f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.ttgir"
    for folder in (os.path.join(os.path.expanduser("~"), ".cache", "kernels-lab", "ttgir"),
                   os.path.join(tempfile.gettempdir(), f"kernels-lab-ttgir-{os.getuid()}")):
        path = os.path.join(folder, name)
        try:
            if os.path.exists(path):
                with open(path) as f:
                    if f.read() == text:
                        return path
            os.makedirs(folder, mode=0o700, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
                f.write(text)
            try:
                os.replace(f.name, path)  # atomic: another process may write the same file
            finally:
                if os.path.exists(f.name):
                    os.unlink(f.name)
            return path
        except OSError:  # a read-only home: the next folder
            continue
    return None


class WithoutDeadBarriers(DirectLaunch):
    """A DirectLaunch whose kernel, on the GPU, is compiled without dead barriers: each specialization is
    compiled once as Triton would, and launched with the override its IR calls for, if any."""

    def __init__(self, kernel, maxsize: int = 256):
        super().__init__(kernel, maxsize)
        self._overrides: collections.OrderedDict = collections.OrderedDict()  # specialization -> path or None

    def clear(self) -> None:
        super().clear()
        self._overrides.clear()

    @serialized
    def _launch(self, programs: int, tensors: tuple, numbers: tuple, consts: dict):
        if backend.current() == "gpu":
            key = (_device(), *((t.dtype, t.data_ptr() % 16 == 0) for t in tensors), *numbers,
                   *sorted(consts.items()))
            if key not in self._overrides:
                self._overrides[key] = override(self.kernel.warmup(*tensors, *numbers, grid=(programs,), **consts))
                if len(self._overrides) > self.maxsize:
                    self._overrides.popitem(last=False)
            self._overrides.move_to_end(key)
            if self._overrides[key]:
                consts = {**consts, "ir_override": self._overrides[key]}
        return super()._launch(programs, tensors, numbers, consts)
