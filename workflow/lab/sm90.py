"""Compile a kernel ahead of time for Hopper (sm_90) on any machine, GPU or not.

Triton can lower and assemble for a target it is not running on; the compiled metadata then says how
much shared memory a launch would need. This is how a CPU-only run measures the writeup's wall, and
how the tests catch GPU compile errors without a GPU.

The compile runs in a child process with KERNELS_BACKEND=aot: in a process that has chosen the
interpreter, Triton's own library functions are interpreted too and cannot be compiled.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

TARGET = ("cuda", 90, 32)


def compile_in_process(module: str, kernel: str, arg_types: dict[str, str], constexprs: dict,
                       num_warps: int = 4, num_stages: int = 3, aligned: tuple[str, ...] = ()):
    """Compile ``module.kernel`` for sm_90 in this process (its backend must be 'aot' or 'gpu').

    A launch specializes its arguments, and the build differs with it (vector widths, pipelined loads, their
    shared memory): an integer equal to 1 becomes a constant (pass it in ``constexprs``), and pointers and
    integers divisible by 16 are known so (name them in ``aligned``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), kernel)
    signature = {name: arg_types.get(name, "constexpr") for name in fn.arg_names}
    missing = [n for n, t in signature.items() if t == "constexpr" and n not in constexprs]
    if missing:
        raise ValueError(f"no type or constexpr value for {missing}")
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget(*TARGET), options={"num_warps": num_warps, "num_stages": num_stages})


def shared_memory_bytes(module: str, kernel: str, arg_types: dict[str, str], constexprs: dict,
                        num_warps: int = 4, num_stages: int = 3) -> int:
    """Shared memory (bytes) a launch of ``module.kernel`` needs on sm_90, compiled in a child process."""
    return shared_memory_each([dict(module=module, kernel=kernel, arg_types=arg_types, constexprs=constexprs,
                                    num_warps=num_warps, num_stages=num_stages)])[0]


def shared_memory_each(requests: list[dict]) -> list[int]:
    """shared_memory_bytes for each request (compile_in_process's arguments by name, ``aligned`` among them),
    all compiled in one child process: the child's start (importing torch and Triton) costs more than a compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KERNELS_BACKEND"] = "aot"
    done = subprocess.run([sys.executable, "-m", "lab.sm90", json.dumps(requests)], env=env, capture_output=True,
                          text=True)
    if done.returncode:
        names = sorted({f"{r['module']}.{r['kernel']}" for r in requests})
        raise RuntimeError(f"compiling {', '.join(names)} for sm_90 failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["shared"]


if __name__ == "__main__":
    print(json.dumps({"shared": [compile_in_process(**{**r, "aligned": tuple(r.get("aligned", ()))}).metadata.shared
                                 for r in json.loads(sys.argv[1])]}))
