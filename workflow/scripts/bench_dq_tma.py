"""The two-pass backward's warp-specialized TMA dQ kernel ('/ws' bwd_dq tiles) beside its pointer one
(GPU only; not part of the pipeline; prints one line per measurement).

    PYTHONPATH=.:workflow python workflow/scripts/bench_dq_tma.py [--compile-only]

The two-pass backward's time at head_dim 128 (H200, tune_flash.py's eleventh round): dK/dV 2.075 ms on its
'/ws' kernel, dQ 1.400 ms on the pointer kernel (589 TFLOP/s of its three matmuls), so dQ is 40% of it.
_flash_bwd_dq_tma_kernel moves its tiles by TMA and runs its key loop warp-specialized (a producer warp
group, two consumer groups splitting the queries), as _flash_fwd_tma_kernel does. It is checked against the
pointer kernel's dQ (same inputs, bf16) before it is timed. --compile-only: compile every variant for
sm_90 on this machine (any Triton: 3.6 on the GPU, the newest in CI) and print its shared memory.

Measured with the kernel then in this script (the same arithmetic, its rows count passed in), H200, triton
3.6, torch 2.11, bf16, 16 heads, batch x seq = 16384, do_bench medians, dQ alone, the
forward's log-sum-exp and delta as the backward gets them, TFLOP/s of the three matmuls:
- head_dim 128, S = 4096: pointer 128x64/w8/s3 (the committed dQ tile) 601-613; '/ws' 128x64/w4/s2 644,
  128x64/w4/s3 618, 128x128/w4/s2 645. S = 16384: pointer 621-623; '/ws' 660, 642, 668. S = 1000 (the keys'
  mask in the loop): pointer 480-483, '/ws' 473, 464, 480. dQ equal to the pointer kernel's to the bit.
- head_dim 64, S = 4096: pointer 506-523, '/ws' 439-460: slower, as the dK/dV '/ws' kernel is there.
- S = 1001: the '/ws' kernel stopped with "an illegal instruction": its 1-D descriptors of lse and delta
  were read from row bh * 1001 + start_m, not a multiple of 16 bytes (Triton's interpreter refuses such a
  start: "block offset start must be 16-byte aligned"), so it can run only where seq_q % 4 == 0.
- Pointer loads of lse and delta (before the loop or inside it) do not compile warp-specialized: Triton's
  pass (3.6 and 3.9) stops at "processProducerCommitOp ... Assertion `false'" (WSLowerToken.cpp), the
  consumer groups splitting the rows those loads index. Through descriptors it compiles on both: shared
  memory 165464 B (128x64/s2), 198456 (128x64/s3), 231000 (128x128/s2) on 3.6.
So at head_dim 128 a '/ws' dQ kernel would take 5-7% off dQ, ~40% of the backward: forward+backward
~1.5-2% faster. In kernels/_flash_attention.py as _flash_bwd_dq_tma_kernel ('/ws' bwd_dq tiles).
"""
from __future__ import annotations

import argparse
import math

import torch

import kernels._flash_attention as fa  # first: it chooses the backend before triton is imported
from kernels._flash_tiles import Tile
from kernels._triton import triton


POINTER_TILES = ["128x64/w8/s3", "64x64/w4/s2"]  # the committed dQ tiles at head_dim 128 and 64
TILES = ["128x64/w4/s2/ws", "128x64/w4/s3/ws", "128x128/w4/s2/ws"]  # the kernel is always warp-specialized
INTEGERS = ("n_heads", "seq_q", "seq_k", "lpt_group")
KERNEL = "_flash_bwd_dq_tma_kernel"


def compile_only() -> None:
    from lab.sm90 import compile_in_process
    types = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dq_ptr")}
    types |= {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "sm_scale": "fp32", "qk_scale": "fp32"}
    types |= {n: "i32" for n in getattr(fa, KERNEL).arg_names if n.startswith("stride") or n in INTEGERS}
    for text in TILES:
        t = Tile.parse(text)
        try:
            c = compile_in_process(fa.__name__, KERNEL, types,
                                   dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=t.block_m, BLOCK_N=t.block_n, EVEN_K=True,
                                        CAUSAL=False, LONGEST_FIRST=True),
                                   t.warps, t.stages)
            print(text, "shared", c.metadata.shared, "warps", c.metadata.num_warps, flush=True)
        except Exception as e:  # noqa: BLE001
            print(text, "FAILED", str(e).splitlines()[-1][:300], flush=True)


def main() -> None:
    torch.manual_seed(0)
    fa._ensure_allocator()
    fa.pin(fwd="128x64/w8/s3")  # the forward only makes lse: no tuning
    for d, seq, causal in ((128, 4096, False), (128, 16384, False), (128, 1000, False), (64, 4096, False)):
        batch, heads = max(1, 16384 // seq), 16
        q, k, v, do = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = 1 / math.sqrt(d)
        o, lse = fa._plan(q, k, v, causal, None).forward(q, k, v)
        delta = (o.float() * do.float()).sum(-1)
        numbers = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), heads, seq, seq, scale, scale * fa.LOG2E)
        group = fa.lpt_group(batch * heads, seq, d, q.element_size())  # the causal order's heads at a time
        consts = dict(HEAD_DIM=d, BLOCK_D=d, CAUSAL=causal)
        ref = torch.empty_like(q)
        for kind, text in [("pointer", t) for t in POINTER_TILES] + [("tma", t) for t in TILES]:
            t = Tile.parse(text)
            grid = -(-seq // t.block_m) * batch * heads
            # fa._prepare launches the TMA kernel as flash_attention does: compiled without dead barriers
            if kind == "pointer":
                prep = fa._prepare(fa._flash_bwd_dq_kernel, grid, (*numbers, group), {**consts, "LONGEST_FIRST": True}, t)
            else:
                prep = fa._prepare(getattr(fa, KERNEL), grid, (*numbers, group),
                                   dict(HEAD_DIM=d, BLOCK_D=d, EVEN_K=seq % t.block_n == 0, CAUSAL=causal,
                                        LONGEST_FIRST=True), t)
            name = f"{kind} {text}"
            out = torch.full_like(q, float("nan"))
            try:
                prep(q, k, v, do, lse, delta, out)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"d={d} S={seq} {name}: FAILED {str(e).splitlines()[-1][:200]}", flush=True)
                continue
            if name == "pointer 128x64/w8/s3":
                ref.copy_(out)
            err = (out.float() - ref.float()).abs().max().item()
            ms = triton.testing.do_bench(lambda: prep(q, k, v, do, lse, delta, out), warmup=25, rep=100)
            tflops = 3 * 2 * batch * heads * seq * seq * d / ms / 1e9
            print(f"d={d} S={seq} {name}: {ms:.3f} ms {tflops:.0f} TFLOP/s max|dq - pointer| {err:.3g} "
                  f"finite {bool(torch.isfinite(out).all())}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    compile_only() if args.compile_only else main()
