"""Compile a kernel ahead of time for Hopper (sm_90) on any machine, GPU or not.

Triton can lower and assemble for a target it is not running on; the compiled metadata then says how
much shared memory a launch would need. This is how a CPU-only run measures the writeup's wall.
"""
from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

HOPPER = GPUTarget("cuda", 90, 32)


def _jit_function(kernel) -> JITFunction:
    # Under TRITON_INTERPRET=1 @triton.jit returns an InterpretedFunction; rebuild the JIT one.
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def compile_for_hopper(kernel, arg_types: dict[str, str], constexprs: dict[str, object],
                       num_warps: int = 4, num_stages: int = 3):
    """Compile ``kernel`` for sm_90. arg_types maps each runtime argument to a Triton type string
    ('*fp16', 'i32', 'fp32', ...); every other argument must be in constexprs."""
    fn = _jit_function(kernel)
    signature = {name: arg_types.get(name, "constexpr") for name in fn.arg_names}
    missing = [n for n, t in signature.items() if t == "constexpr" and n not in constexprs]
    if missing:
        raise ValueError(f"no type or constexpr value for {missing}")
    src = ASTSource(fn, signature, constexprs=constexprs)
    return triton.compile(src, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})


def shared_memory_bytes(kernel, arg_types, constexprs, num_warps: int = 4, num_stages: int = 3) -> int:
    return int(compile_for_hopper(kernel, arg_types, constexprs, num_warps, num_stages).metadata.shared)
