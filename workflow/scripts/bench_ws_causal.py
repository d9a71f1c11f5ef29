"""The '/ws' tiles under a causal mask in their two forms, split at the diagonal ('/ws') and in one launch
('/ws/masked'), and as the tuner picks with and without the masked form (GPU only, Hopper; not part of the
pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/bench_ws_causal.py out.csv [--no-errors] [--d 128,64]
        [--lengths 4096,8192]

First (unless --no-errors) the errors against fp64 (output and the three gradients, bf16, head_dim 128 and 80)
at lengths whose diagonal cuts tiles at every offset, the '/ws' tiles pinned in either form; then, at bf16,
each head_dim, batch x seq = 16384, 16 heads, causal forward and forward+backward TFLOP/s (do_bench medians;
4·B·H·S²·D x 0.5, x 3.5 with the backward) beside cuDNN in the same process: the forward and (head_dim 128)
dK/dV pinned to their '/ws' tiles, split and masked, then everything tuned afresh with and without the
masked forms (the tiles chosen are in the label). ``--diagonal 128x64/w8/s2,64x64/w4/s2``: the split form once
with each of those tiles for the pointer kernel at the diagonal (kernels._flash_attention.DIAGONAL_FWD; its
BLOCK_M divides the '/ws' tile's), errors included. One CSV row per measurement; the summary is printed.
A masked forward with a split backward costs fwd(masked) + (fwd_bwd - fwd)(split): the kernels run one after
another.
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


FWD, DKDV = "128x128/w4/s2/ws", "64x128/w4/s2/ws"
MASKED_KINDS, DIAGONAL_FWD = fa.MASKED_KINDS, fa.DIAGONAL_FWD


def max_errors(d: int, causal: bool, lengths, form: str = "") -> dict:
    """Max |error| against fp64 of out, dq, dk, dv (bf16, batch 2, 3 heads) over (seq_q, seq_k) ``lengths``,
    the '/ws' tiles pinned for the call (``form``: '' or '/masked'); NaN if any error is NaN."""
    fa.pin(fwd=FWD + form, bwd_dkdv=DKDV + form)
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


def diagonal(tile: str | None) -> tuple:
    """DIAGONAL_FWD for a tile given as 'BMxBN/wW/sS' (None: the committed one)."""
    if tile is None:
        return DIAGONAL_FWD
    t = _flash_tiles.Tile.parse(tile, "--diagonal")
    return (t.block_m, t.block_n, t.warps, t.stages)


def main(path: str, with_errors: bool, head_dims: list[int], lengths: list[int], diagonals: list) -> None:
    os.environ.setdefault(fa.WS_ENV, "1")  # the '/ws' kernels studied here (the default; a caller's 0 stays)
    rows = []
    for d in (128, 80) if with_errors else ():
        for form in ("", "/masked"):
            for diag in diagonals if not form else [None]:
                fa.DIAGONAL_FWD = diagonal(diag)
                rows += [dict(what="max_error", d=d, form=(form or "split") + (f" {diag}" if diag else ""), tensor=name,
                              value=err) for name, err in max_errors(d, True, ERROR_LENGTHS, form).items()]
                print(pd.DataFrame(rows).tail(4).to_string(), flush=True)
    fa.DIAGONAL_FWD = DIAGONAL_FWD
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

            dkdv = d in fa.WS_HEAD_DIMS["bwd_dkdv"]  # elsewhere a '/ws' dK/dV tile would run the pointer kernel
            # (label, tiles pinned, the masked forms offered to the tuner); None: cuDNN
            splits = [(f"split {diag or ''}".strip(), dict(fwd=FWD, bwd_dkdv=DKDV if dkdv else None), True, diag)
                      for diag in diagonals]
            for name, pinned, masked, diag in (*splits,
                                               ("masked", dict(fwd=FWD + "/masked", bwd_dkdv=DKDV + "/masked" if dkdv else None),
                                                True, None),
                                               ("tuned", {}, True, None), ("tuned without masked", {}, False, None),
                                               ("sdpa_cudnn", None, None, None)):
                fa.DIAGONAL_FWD = diagonal(diag)
                if pinned is None:
                    label, fn = name, cudnn
                else:
                    fa.MASKED_KINDS = MASKED_KINDS if masked else ()
                    fa._candidates.cache_clear()
                    _flash_tiles.forget()  # drops the plans and choices made under the other setting too
                    fa.pin(**pinned)
                    label = f"flash {name} {fa.tune(q, k, v, causal=True)}"
                    fn = lambda: fa.flash_attention(q, k, v, causal=True)  # noqa: E731
                with torch.no_grad():
                    fwd = bench(fn)
                fwd_bwd = bench(lambda: fn().backward(do))
                fa.pin()
                rows.append(dict(what="tflops", d=d, seq=n, provider=label, fwd=flop / fwd / 1e9,
                                 fwd_bwd=3.5 * flop / fwd_bwd / 1e9))
                print(rows[-1], flush=True)
    fa.MASKED_KINDS, fa.DIAGONAL_FWD = MASKED_KINDS, DIAGONAL_FWD
    fa._candidates.cache_clear()
    df = pd.DataFrame(rows)
    df.to_csv(path, index=False)
    print(df.to_string())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("--no-errors", action="store_true", help="speed only")
    parser.add_argument("--d", type=lambda s: [int(x) for x in s.split(",")], default=[128], help="head dims")
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=SPEED_LENGTHS)
    parser.add_argument("--diagonal", type=lambda s: s.split(","), default=[None],
                        help="tiles for the pointer kernel at the diagonal, e.g. 128x64/w8/s2,64x64/w4/s2")
    args = parser.parse_args()
    main(args.out, not args.no_errors, args.d, args.lengths, args.diagonal)
