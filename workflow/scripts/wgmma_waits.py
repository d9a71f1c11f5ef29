"""Where Triton waits for Hopper's asynchronous matmuls in a FlashAttention loop (no GPU needed: it compiles
for sm_90 and reads the IR; not part of the pipeline).

    python workflow/scripts/wgmma_waits.py

FlashAttention-3's forward overlaps the softmax of key tile j with the matmul Q K_{j+1}^T: the wgmma for tile
j+1 is issued, and waited for only after tile j's exponentials. Without warp specialization, the only way to
ask Triton for that is the order of the source: issue ``qk_next = tl.dot(q, k_next)`` before the softmax of
``qk``, and use ``qk_next`` in the next iteration. This script compiles both loops (128x64 tiles, head_dim 128,
bf16, 8 warps, 3 stages: flash_attention's pointer forward at head_dim 128) and prints, for each matmul in the
loop, how many wgmma groups Triton lets stay in flight after issuing it (``warp_group_dot_wait``'s
``pendings``), and the order of wgmma issues, waits and exp2s in the PTX.

Found with triton 3.6 (the H200's) and 3.9 (CI's): ``pendings = 0`` right after every matmul in both loops,
so the reordered source issues Q K_{j+1}^T and at once waits for it; the exponentials never run beside a
matmul. Triton keeps a wgmma in flight across iterations only when its result is the loop-carried
accumulator of the same dot (a K loop), which neither of attention's matmuls is (the scores are fresh each
tile; the output is rescaled by alpha first). So without warp specialization (the '/ws' tiles; off with
KERNELS_FLASH_WS=0, and where the inputs do not allow TMA) the forward's matmuls and softmax take turns whatever
the tile: a limit on the pointer kernel, at 0.77-0.89 of cuDNN's forward (tune_flash.py's twelfth round).
"""
from __future__ import annotations

import argparse
import re

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _update(acc, l_i, m_i, qk, v):
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return tl.dot(p.to(v.dtype), v, acc * alpha[:, None]), l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def in_turn(q_ptr, k_ptr, v_ptr, o_ptr, n, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """The usual loop: scores of tile j, then its softmax and P V."""
    rows, keys, dims = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :])
    k_ptrs, v_ptrs = k_ptr + keys[None, :] * D + dims[:, None], v_ptr + keys[:, None] * D + dims[None, :]
    acc, l_i, m_i = tl.zeros([BM, D], tl.float32), tl.zeros([BM], tl.float32), tl.full([BM], -1e30, tl.float32)
    for start in tl.range(0, n, BN):
        qk = tl.dot(q, tl.load(k_ptrs + start * D))
        acc, l_i, m_i = _update(acc, l_i, m_i, qk, tl.load(v_ptrs + start * D))
    tl.store(o_ptr + rows[:, None] * D + dims[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))


@triton.jit
def reordered(q_ptr, k_ptr, v_ptr, o_ptr, n, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """The scores of tile j+1 issued before the softmax of tile j (n >= BN)."""
    rows, keys, dims = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :])
    k_ptrs, v_ptrs = k_ptr + keys[None, :] * D + dims[:, None], v_ptr + keys[:, None] * D + dims[None, :]
    acc, l_i, m_i = tl.zeros([BM, D], tl.float32), tl.zeros([BM], tl.float32), tl.full([BM], -1e30, tl.float32)
    qk = tl.dot(q, tl.load(k_ptrs))
    for start in tl.range(BN, n, BN):
        qk_next = tl.dot(q, tl.load(k_ptrs + start * D))
        acc, l_i, m_i = _update(acc, l_i, m_i, qk, tl.load(v_ptrs + (start - BN) * D))
        qk = qk_next
    acc, l_i, m_i = _update(acc, l_i, m_i, qk, tl.load(v_ptrs + (n - BN) * D))
    tl.store(o_ptr + rows[:, None] * D + dims[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))


def _runs(ops: list[str]) -> str:
    """'a a a b' -> 'a x3, b'."""
    out: list[list] = []
    for op in ops:
        if out and out[-1][0] == op:
            out[-1][1] += 1
        else:
            out.append([op, 1])
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in out)


def main() -> None:
    print(f"triton {triton.__version__}, sm_90, 128x64 tiles, head_dim 128, bf16, 8 warps, 3 stages")
    signature = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    signature.update(n="i32", BM="constexpr", BN="constexpr", D="constexpr")
    for fn in (in_turn, reordered):
        source = ASTSource(fn, signature=signature, constexprs={"BM": 128, "BN": 64, "D": 128})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
        waits = re.findall(r"warp_group_dot_wait .*?pendings = (\d+)", compiled.asm["ttgir"])
        ops = re.findall(r"^\s*(wgmma\.mma_async|wgmma\.wait_group\S* \d+|ex2)", compiled.asm["ptx"], re.M)
        print(f"\n{fn.__name__}: {fn.__doc__}\n  wgmma groups left in flight after each wait: {waits}"
              f"\n  PTX order: {_runs([op.replace('.sync.aligned', '') for op in ops])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    main()
