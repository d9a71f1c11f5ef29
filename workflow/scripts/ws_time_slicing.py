"""Triton's warp specialization beside another process on the same GPU (GPU only, Hopper; not part of the
pipeline): the reason flash_attention runs its '/ws' kernels only where KERNELS_FLASH_WS=1.

    python workflow/scripts/ws_time_slicing.py

A minimal matmul (bf16, 8192^3, in-kernel tensor descriptors, 128x128x64 tiles, 4 warps, 3 stages), once with
its K loop warp-specialized (``tl.range(..., warp_specialize=True)``: a producer warp group and two consumer
groups with setmaxnreg) and once without, each 40 times into an output filled with NaN, compared with torch's
matmul tile by tile: first with the GPU to itself, then while a second process loops torch matmuls on the same
GPU (its context and this one's time-slice). Prints the wrong 128x128 tiles (of 4096) per call.

On the H200 (torch 2.11, triton 3.6): alone, 0 wrong tiles in every call, both forms; beside the second process,
the warp-specialized form 57-110 wrong tiles in every one of 40 calls, the plain form 0. flash_attention's own
'/ws' kernels did the same (tune_flash.py's docstring, twelfth round), cuDNN's did not. Other forms, beside the
process, 12 calls each (BM x BN x BK, warps, stages): 128x128x64/w4/s2 50-102 wrong tiles per call,
128x128x128/w4/s2 1-82, 128x64x64/w4/s3 48-112, 64x128x64/w4/s3 2-188; 128x128x64/w4/s4 0 in all 12 (not shown
safe: a deeper ring may only make the window rarer); 128x128x64/w8/s3 0, but Triton 3.6 does not specialize it
(8 warps and no setmaxnreg in its sm_90 PTX). In the PTX of the 4-warp form, each consumer group waits for its
wgmma to finish (wait_group 0) before it frees a stage, so it is not the early release that PR 1278 of
facebookexperimental/triton fixed; the worker groups do resize their registers (setmaxnreg) each time they
take up work.

    python workflow/scripts/ws_time_slicing.py --consan

runs both forms alone on the GPU, a few calls, under Triton's concurrency sanitizer (ConSan:
TRITON_INSTRUMENTATION_MODE=consan, which tracks every shared-memory access of the partitions against their
barriers and stops the kernel at a race whether or not the race changed a result). Triton 3.6 compiles the
warp-specialized form for sm_90 under it only without line info (TRITON_DISABLE_LINE_INFO=1; with line info its
LLVMDIScope pass fails), which this mode sets, with a cache of its own. Not run on a GPU yet: a race reported
there is the cause to send upstream; none would point at the context switch itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

CONSAN = "--consan" in sys.argv[1:]
if CONSAN:  # before triton is imported: its knobs and cache are read then
    os.environ.update(TRITON_INSTRUMENTATION_MODE="consan", TRITON_DISABLE_LINE_INFO="1",
                      TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="consan-"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

M = N = K = 8192
BM, BN, BK = 128, 128, 64
BUSY = "import torch\nx = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\nwhile True:\n    x @ x\n"


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  WS: tl.constexpr):
    """c = a @ b.T, one BM x BN tile per program; WS: the K loop warp-specialized."""
    pid = tl.program_id(0)
    m0 = (pid // tl.cdiv(N, BN)) * BM
    n0 = (pid % tl.cdiv(N, BN)) * BN
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        acc = tl.dot(a_desc.load([m0, k]), b_desc.load([n0, k]).T, acc)
    c_desc.store([m0, n0], acc.to(tl.bfloat16))


def wrong_tiles(a, b, want, ws: bool, calls: int) -> list[int]:
    """Per call: the output tiles with an element off by more than 1 (bf16 rounding is far below), NaN included."""
    counts = []
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        matmul_kernel[(triton.cdiv(M, BM) * triton.cdiv(N, BN),)](a, b, c, M, N, K, BM, BN, BK, ws, num_warps=4,
                                                                  num_stages=3)
        torch.cuda.synchronize()
        bad = ~((c.float() - want).abs() <= 1.0)
        counts.append(int(bad.view(M // BM, BM, N // BN, BN).any(3).any(1).sum()))
    return counts


def main(calls: int = 40) -> None:
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(n, K, device="cuda", dtype=torch.bfloat16, generator=g) for n in (M, N))
    want = (a @ b.T).float()
    if CONSAN:  # a race stops the kernel (a device-side error), so the plain form goes first
        for ws in (False, True):
            print("ConSan, alone,", "warp-specialized" if ws else "plain", "wrong tiles per call:",
                  wrong_tiles(a, b, want, ws, 3), "(no race reported)", flush=True)
        return
    for shared in (False, True):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if shared else None
        try:
            if busy:
                time.sleep(5)  # until its loop runs
            for ws in (True, False):
                print("beside another process" if shared else "alone", "warp-specialized" if ws else "plain",
                      "wrong tiles per call:", wrong_tiles(a, b, want, ws, calls), flush=True)
        finally:
            if busy:
                busy.kill()
                busy.wait()


if __name__ == "__main__":
    main()
