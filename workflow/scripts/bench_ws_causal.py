"""The '/ws' kernels under a causal mask (kernels._flash_attention.WS_CAUSAL), against the committed split
forward and pointer dK/dV kernel (GPU only, Hopper; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_ws_causal.py out.csv [--no-errors] [--d 128,64]
        [--lengths 4096,8192]

First (unless --no-errors) the errors against fp64 (output and the three gradients, bf16, head_dim 128 and 80)
at lengths whose diagonal cuts tiles at every offset, with WS_CAUSAL off and on and the '/ws' tiles pinned;
then, at bf16, each head_dim, batch x seq = 16384, 16 heads, causal forward and forward+backward TFLOP/s
(do_bench medians; 4·B·H·S²·D x 0.5, x 3.5 with the backward) beside cuDNN in the same process: the forward
pinned to the '/ws' tile, split (WS_CAUSAL off) and in one launch (on), then everything tuned afresh with
WS_CAUSAL off and on (the tiles chosen are in the label). One CSV row per measurement; the summary is printed.
"""
from __future__ import annotations

import argparse
import os

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels._flash_attention as fa  # first: it chooses the backend before triton is imported
from kernels import _flash_tiles
from kernels._triton import triton

ERROR_LENGTHS = [(1000, 1000), (300, 1100), (1100, 300), (4096, 4096), (113, 203)]
SPEED_LENGTHS = [4096, 8192, 16384]


def errors(ws_causal: bool, d: int) -> dict:
    """Max |error| against fp64 of out, dq, dk, dv over ERROR_LENGTHS, causal, the '/ws' tiles pinned."""
    fa.WS_CAUSAL = ws_causal
    return max_errors(d, True, ERROR_LENGTHS)


def max_errors(d: int, causal: bool, lengths) -> dict:
    """Max |error| against fp64 of out, dq, dk, dv (bf16, batch 2, 3 heads) over (seq_q, seq_k) ``lengths``,
    the '/ws' tiles pinned for the call; NaN if any error is NaN."""
    fa.pin(fwd="128x128/w4/s2/ws", bwd_dkdv="64x128/w4/s2/ws")
    errors = dict(out=[], dq=[], dk=[], dv=[])
    try:
        for sq, sk in lengths:
            q, k, v = (torch.randn(2, 3, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for s in (sq, sk, sk))
            do = torch.randn_like(q)
            out = fa.flash_attention(q, k, v, causal=causal)
            got = (out, *torch.autograd.grad(out, (q, k, v), do))
            ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
            ref = fa.flash_attention_ref(*ref_in, causal=causal, dtype=torch.float64)
            want = (ref, *torch.autograd.grad(ref, ref_in, do.double()))
            for name, g, w in zip(errors, got, want):
                errors[name].append((g.double() - w).abs().max())
    finally:
        fa.pin()
    return {name: torch.stack(e).max().item() for name, e in errors.items()}  # torch's max keeps NaN


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main(path: str, with_errors: bool, head_dims: list[int], lengths: list[int]) -> None:
    os.environ.setdefault(fa.WS_ENV, "1")  # the '/ws' kernels studied here (the default; a caller's 0 stays)
    rows = []
    for d in (128, 80) if with_errors else ():
        for ws_causal in (False, True):
            rows += [dict(what="max_error", d=d, ws_causal=ws_causal, tensor=name, value=err)
                     for name, err in errors(ws_causal, d).items()]
            print(pd.DataFrame(rows).tail(4).to_string(), flush=True)
    h = 16
    for d in head_dims:
        for n in lengths:
            b = 16384 // n
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn_like(q)
            flop = 4 * b * h * n * n * d * 0.5

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            # (label, WS_CAUSAL, forward tile pinned or None); None: cuDNN
            for name, ws_causal, pinned in (("split", False, "128x128/w4/s2/ws"), ("one launch", True, "128x128/w4/s2/ws"),
                                            ("tuned", False, None), ("tuned", True, None), ("sdpa_cudnn", None, None)):
                if ws_causal is None:
                    label, fn = name, cudnn
                else:
                    fa.WS_CAUSAL = ws_causal
                    _flash_tiles.forget()  # drops the plans made under the other setting too
                    fa.pin(fwd=pinned)
                    label = f"flash {name} ws_causal={ws_causal} {fa.tune(q, k, v, causal=True)}"
                    fn = lambda: fa.flash_attention(q, k, v, causal=True)  # noqa: E731
                with torch.no_grad():
                    fwd = bench(fn)
                fwd_bwd = bench(lambda: fn().backward(do))
                fa.pin()
                rows.append(dict(what="tflops", d=d, seq=n, provider=label, fwd=flop / fwd / 1e9,
                                 fwd_bwd=3.5 * flop / fwd_bwd / 1e9))
                print(rows[-1], flush=True)
    fa.WS_CAUSAL = False
    df = pd.DataFrame(rows)
    df.to_csv(path, index=False)
    print(df.to_string())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("--no-errors", action="store_true", help="speed only")
    parser.add_argument("--d", type=lambda s: [int(x) for x in s.split(",")], default=[128], help="head dims")
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=SPEED_LENGTHS)
    args = parser.parse_args()
    main(args.out, not args.no_errors, args.d, args.lengths)
