"""flash_attention in several processes on one GPU at once (GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/ws_crowd.py [--workers 6] [--rounds 2] [--ws 1] [--pin-fwd TILE]
        [--blocking] [--tune 1] [--user-cache]

Why: on the H200 (triton 3.6), with six pytest processes of tests/test_flash_attention_gpu.py's '/ws' grid
running at once, one forward+backward stopped with "an illegal instruction" (head_dim 48, fp16, causal, 1100
queries x 300 keys, forward pinned to 128x128/w4/s2/ws; reported at the synchronize of the dK/dV tiles'
tuning), and did not come back when that test ran alone (twice). This asks whether it comes back in a crowd,
and with which kernels: each worker runs the grid's odd shapes (lengths, head dims, dtypes, causal or not,
strided or not) in its own order, every kernel tuned in that process as a first call tunes it, checks the
output and every gradient against flash_attention_ref in fp32, and prints one line per shape that was wrong
or raised (a raised CUDA error ends the worker: its context is lost). ``--ws 0`` is the control without the
warp-specialized kernels; ``--pin-fwd`` pins the forward's tile as the test did (default: tuned);
``--blocking`` sets CUDA_LAUNCH_BLOCKING=1 in the workers, so that a fault is raised at the launch that made it
(the worker prints where), not at a later synchronize. Every run's workers share a new, empty tile cache, so
they tune as first calls on a new machine do (``--user-cache``: the usual cache file instead, where buckets
tuned before are not tuned again); ``--tune 0`` sets KERNELS_AUTOTUNE=0 (the first candidate, nothing timed).

What it found on the H200 (triton 3.6, six workers, one round, b20d55f), the usual cache removed before
each run: 4 of 6 workers raised "an illegal instruction" (reported at the synchronize of a tuning,
_flash_tiles.choose) with the forward pinned to 128x128/w4/s2/ws, and with it pinned to
128x128/w4/s2/ws/masked 3 of 6 raised and one more returned NaN dK and dV (d=48 fp16 causal 203x113, no
error raised); a first masked run had 4 raised and NaN dQ/dK/dV in another. Run again with those tiles
already in the cache (nothing tuned in the shapes that ran), 0 of 6 with either. Earlier that session, at
a8fa95c, tuned with buckets new to the cache: 0 of 6. So it comes with tuning in a crowd, not every time.

The likely cause (found reading the code, after that run): the tuner's timer, triton.testing.do_bench_cudagraph,
runs on a new stream that waits for nothing, so its first runs (before its first synchronize) overlapped the
kernels the worker had queued just before: writing dK/dV into freshly allocated buffers that the pending
forward still read as its lse or its tensor descriptors' scratch (freed in Python at launch, so reused at
once). Alone, a worker's queue is empty by the time tuning starts; in a crowd its kernels wait their turn.
_flash_tiles.choose now synchronizes the caller's stream first; the next GPU run of this script (6 workers,
2 rounds, fresh cache, fwd pinned to '/ws' and to '/ws/masked') says whether that was all of it.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import traceback

LENGTHS = [(1, 1), (113, 203), (203, 113), (1024, 1024), (300, 1100), (1100, 300), (4096, 4096)]
HEADS = [(128, "bfloat16"), (128, "float16"), (80, "bfloat16"), (64, "bfloat16"), (48, "float16")]


def worker(seed: int, rounds: int, pin_fwd: str | None) -> int:
    import torch

    from kernels import _flash_attention as fa
    from kernels import flash_attention

    if pin_fwd:
        fa.pin(fwd=pin_fwd)
    shapes = [(sq, sk, d, dt, causal, strided) for sq, sk in LENGTHS for d, dt in HEADS
              for causal in (False, True) for strided in (False, True)]
    wrong = 0
    for r in range(rounds):
        random.Random(seed * 1000 + r).shuffle(shapes)
        for sq, sk, d, dt, causal, strided in shapes:
            label = f"worker {seed} round {r}: {sq}x{sk} d={d} {dt} causal={causal} strided={strided}"
            dtype = getattr(torch, dt)
            if strided:  # (B, S, H, D) storage viewed as (B, H, S, D)
                q, k, v = (torch.randn(2, s, 3, d, device="cuda", dtype=dtype).transpose(1, 2) for s in (sq, sk, sk))
            else:
                q, k, v = (torch.randn(2, 3, s, d, device="cuda", dtype=dtype) for s in (sq, sk, sk))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            do = torch.randn_like(q)
            try:
                out = flash_attention(q, k, v, causal=causal)
                got = (out, *torch.autograd.grad(out, (q, k, v), do))
                torch.cuda.synchronize()
            except Exception as e:  # a CUDA error leaves this process's context unusable: report and stop
                where = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_tb(e.__traceback__)
                         if "/kernels/" in f.filename][-3:]
                print(f"RAISED {label}: {type(e).__name__}: {str(e).splitlines()[0]} at {' <- '.join(where[::-1])}",
                      flush=True)
                return 2
            qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
            ref = fa.flash_attention_ref(qf, kf, vf, causal=causal)
            want = (ref, *torch.autograd.grad(ref, (qf, kf, vf), do.float()))
            for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
                err = (g.float() - w).abs().max().item() if g.numel() else 0.0
                if not err <= 0.05 * max(1.0, w.abs().max().item()):  # NaN fails too
                    wrong += 1
                    print(f"WRONG {label}: {name} max |diff| {err:.3g}", flush=True)
    print(f"worker {seed}: {rounds * len(shapes)} shapes, {wrong} wrong tensors", flush=True)
    return 1 if wrong else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ws", choices=("0", "1"), default="1", help="KERNELS_FLASH_WS in every worker")
    parser.add_argument("--pin-fwd", default=None, help="pin the forward's tile, e.g. 128x128/w4/s2/ws")
    parser.add_argument("--blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1 in every worker")
    parser.add_argument("--tune", choices=("0", "1"), default="1", help="KERNELS_AUTOTUNE in every worker")
    parser.add_argument("--user-cache", action="store_true", help="the usual tile cache, not a new empty one")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        sys.exit(worker(args.worker, args.rounds, args.pin_fwd))
    env = dict(os.environ, KERNELS_FLASH_WS=args.ws, KERNELS_AUTOTUNE=args.tune,
               **({"CUDA_LAUNCH_BLOCKING": "1"} if args.blocking else {}))
    if not args.user_cache:
        env["KERNELS_TILE_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="ws_crowd"), "flash_tiles.json")
    extra = ["--pin-fwd", args.pin_fwd] if args.pin_fwd else []
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--rounds", str(args.rounds), *extra],
                              env=env) for i in range(args.workers)]
    codes = [p.wait() for p in procs]
    print(f"KERNELS_FLASH_WS={args.ws} KERNELS_AUTOTUNE={args.tune} user_cache={args.user_cache} "
          f"pin_fwd={args.pin_fwd} blocking={args.blocking}: exit codes {codes} "
          "(0 right, 1 some tensor wrong, 2 raised)", flush=True)


if __name__ == "__main__":
    main()
