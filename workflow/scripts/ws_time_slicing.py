"""Triton's warp specialization beside another process on the same GPU (GPU only, Hopper; not part of the
pipeline): why flash_attention's '/ws' kernels went wrong beside another process, and what fixed them.

    python workflow/scripts/ws_time_slicing.py

A minimal matmul (bf16, 8192^3, in-kernel tensor descriptors, 128x128x64 tiles, 4 warps, 3 stages) in four
forms: its K loop warp-specialized (``tl.range(..., warp_specialize=True)``: a producer warp group and two
consumer groups with setmaxnreg), the same without setmaxnreg, the same without its dead barriers (both
below), and plain. Each runs 40 times into an output filled with NaN, compared with torch's matmul tile by
tile: first with the GPU to itself, then while a second process loops torch matmuls on the same GPU (its
context and this one's time-slice). Prints TFLOP/s alone and the wrong 128x128 tiles (of 4096) per call.

The cause, found last: Triton 3.6 allocates barrier arrays that no partition waits on or arrives at (the
``ttng.init_barrier`` of allocations with no other use in its TTGIR), initializes them at the first bytes of
shared memory (offsets 0, 8 and 16 in the PTX: ``mbarrier.init`` only) and lets the operand ring, which TMA
fills, take the same bytes, with no ``mbarrier.inval`` between (its plain kernels invalidate theirs). Beside
the busy process on the H200: the warp-specialized form wrong in 40 of 40 calls (9-105 tiles) and the same
kernel compiled from its IR without those barriers (kernels/_dead_barriers.py) right in 40 of 40, in one run;
with the 12 init lines deleted from its PTX instead, right in 100 of 100 calls where the unedited form, before
and after them in the same process, was wrong in 40 of 40. At 496-499 TFLOP/s alone against 511-530 for the
unedited kernel in the same runs.

Earlier findings, kept for the record:
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

Also measured: Triton's concurrency sanitizer cannot tell. Under TRITON_INSTRUMENTATION_MODE=consan (triton 3.6,
sm_90; TRITON_DISABLE_LINE_INFO=1, else its LLVMDIScope pass fails on the warp-specialized form) the plain form,
which the run above finds right beside the busy process, stops at once with "Deadlock detected: all active
threads are waiting on mbarriers" in every program (its threads wait on the TMA copies' mbarrier, which no thread
arrives on): a false report, so none from the warp-specialized form would mean anything.

The form without setmaxnreg is the warp-specialized kernel with every ``setmaxnreg`` taken out of its PTX
(Triton's ``ir_override`` option compiles the edited PTX; the kernel keeps ``.maxnreg 168``, so every warp group
holds 168 registers throughout instead of the loader's 40 and the two matmul groups' 232). Triton 3.6 has no
option that leaves them out (``maxnreg=128`` still emits them). On the H200 (triton 3.6, 40 calls each; TFLOP/s
alone): warp-specialized 511, without setmaxnreg 503, plain 547; alone, 0 wrong tiles in every call, all three;
beside the busy process, warp-specialized 1-102 wrong tiles in 40 of 40 calls, without setmaxnreg 1-101 in 39 of
40, plain 0 in 40. So the register hand-over is not the cause. Read from the same PTX: each matmul group frees a
stage on mbarriers of its own (one arrival of 128 after a named barrier over its four warps and wait_group 0),
and the loader waits on both groups' before it refills the stage they share, so no stage is freed early on the
face of it either.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time

import torch

from kernels import _dead_barriers
from kernels._triton import tl, triton  # the backend chosen before triton is imported

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


def launch(a, b, c, form: str):
    options = dict(num_warps=4, num_stages=3)
    if form in FORMS[1:3]:
        options["ir_override"] = _edited(a, b, c, form)
    return matmul_kernel[(triton.cdiv(M, BM) * triton.cdiv(N, BN),)](a, b, c, M, N, K, BM, BN, BK, form != FORMS[3],
                                                                     **options)


FORMS = ("warp-specialized", "warp-specialized, no setmaxnreg", "warp-specialized, no dead barriers", "plain")
_paths: dict[str, str] = {}


def _edited(a, b, c, form: str) -> str:
    """A file for ir_override: the warp-specialized kernel's PTX with its setmaxnreg lines deleted, or its
    TritonGPU IR without the barriers it initializes and never uses (kernels/_dead_barriers.py)."""
    if form not in _paths:
        compiled = launch(a, b, torch.empty_like(c), FORMS[0])
        if form == FORMS[1]:
            edited, n = re.subn(r"^\s*setmaxnreg\.[^\n]*\n", "", compiled.asm["ptx"], flags=re.M)
            assert n, "no setmaxnreg in the warp-specialized kernel's PTX"
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(edited)
            _paths[form] = f.name
        else:
            _paths[form] = _dead_barriers.override(compiled)
            assert _paths[form], "no dead barrier in the warp-specialized kernel's IR"
    return _paths[form]


def wrong_tiles(a, b, want, form: str, calls: int) -> list[int]:
    """Per call: the output tiles with an element off by more than 1 (bf16 rounding is far below), NaN included."""
    counts = []
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(a, b, c, form)
        torch.cuda.synchronize()
        bad = ~((c.float() - want).abs() <= 1.0)
        counts.append(int(bad.view(M // BM, BM, N // BN, BN).any(3).any(1).sum()))
    return counts


def main(calls: int = 40) -> None:
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(n, K, device="cuda", dtype=torch.bfloat16, generator=g) for n in (M, N))
    want = (a @ b.T).float()
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for form in FORMS:  # TFLOP/s with the GPU to itself
        ms = triton.testing.do_bench(lambda form=form: launch(a, b, c, form), rep=200)
        print(f"alone {form}: {2 * M * N * K / ms / 1e9:.0f} TFLOP/s", flush=True)
    for shared in (False, True):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if shared else None
        try:
            if busy:
                time.sleep(5)  # until its loop runs
            for form in FORMS:
                print("beside another process" if shared else "alone", form, "wrong tiles per call:",
                      wrong_tiles(a, b, want, form, calls), flush=True)
        finally:
            if busy:
                busy.kill()
                busy.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40, help="calls of each form, alone and beside the busy process")
    main(parser.parse_args().calls)
