"""A rows-path softmax forward whose loads are TMA copies into shared memory, pipelined across rows (GPU only,
Hopper; not part of the pipeline): a design tried for bf16 rows of 16384-32768 columns, measured and not kept.

    PYTHONPATH=.:workflow python workflow/scripts/bench_softmax_tma.py out.csv

kernels/_softmax.py's prefetching rows kernel (bf16 past 16384 columns) holds the next row in registers while
it computes this one, so an SM has one row's loads in flight and its registers full. Here a program per SM
walks the rows and each row arrives by one TMA copy into shared memory; ``tl.range(..., num_stages=S)`` lets
Triton's pipeliner issue the copies of the next S - 1 rows before this one is computed, with no registers held
for them. TMA boxes are at most 256 elements a side, so a row of N columns (N a multiple of 256, up to 65536) is
read as an (N / 256) x 256 box of the tensor viewed as (rows * N / 256, 256). Stores are plain coalesced stores
from registers (a TMA store would need another staging buffer). Shared memory, compiled for sm_90 with triton
3.6: one row's bytes at 1 and 2 stages (at 2 the next row's copy is issued once this row is in registers),
two rows' at 3 (bf16 at 32768 columns: 65544, 65608 and 131152 B).

For each width and dtype it times this kernel at 1-4 stages beside the public ``softmax`` and a copy of the same
tensor (triton.testing.do_bench medians; fractions of that copy), checks each result against torch, and writes
one CSV row per measurement. Interpreter: ``TRITON_INTERPRET=1 python ... --check`` runs a small case on the CPU.

Measured on the H200 (triton 3.6, one process; fractions of a copy of the same 256 MiB tensor; the public
softmax first, then the best TMA form): not kept, slower at every width. bf16: 4096 columns 0.965 / 0.893 (4
stages, two programs per SM), 8192 0.979 / 0.890, 16384 0.938 / 0.887, 32768 0.898 / 0.855 (3
stages, one program per SM), 65536 0.833 / 0.59 (1-2 stages: two rows do not fit). fp32: 4096 0.966 / 0.885,
8192 0.984 / 0.896, 16384 0.979 / 0.862, 32768 0.949 / 0.808. With one stage, or one program per SM at the
narrow widths, 0.31-0.73. Every result right (max error 1.2e-4 in bf16).
"""
from __future__ import annotations

import argparse
import os

import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import backend
from kernels._device import sm_count
from kernels._triton import tl, triton

BOX = tl.constexpr(256)  # the widest a TMA box may be along one dimension
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def tma_rows_forward(out_ptr, x_ptr, n_rows, R: tl.constexpr, STAGES: tl.constexpr):
    """Rows of R * BOX columns, contiguous in x and out; program p does rows p, p + grid, ..."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[n_rows * R, BOX], strides=[BOX, 1], block_shape=[R, BOX])
    offsets = tl.arange(0, R)[:, None] * BOX + tl.arange(0, BOX)[None, :]
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        x = x_desc.load([row * R, 0]).to(tl.float32)
        m = tl.max(tl.max(x, axis=1), axis=0)
        e = tl.exp2((x - m) * LOG2E)
        y = e * (1.0 / tl.sum(tl.sum(e, axis=1), axis=0))
        tl.store(out_ptr + tl.cast(row, tl.int64) * (R * BOX) + offsets, y.to(out_ptr.dtype.element_ty))


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device=backend.device())  # the interpreter's check: CPU, GPU or not


def softmax_tma(x: torch.Tensor, stages: int, programs: int | None = None) -> torch.Tensor:
    (n_rows, n_cols), box = x.shape, BOX.value
    if n_cols % box or not 1 <= n_cols // box <= box or not x.is_contiguous():
        raise ValueError(f"x must be contiguous with a multiple of {box} columns up to {box * box}, got {tuple(x.shape)}")
    out = torch.empty_like(x)
    triton.set_allocator(_scratch)  # device-side descriptors live in scratch memory
    grid = min(n_rows, programs or (sm_count(x.device) if x.is_cuda else 3))
    tma_rows_forward[(grid,)](out, x, n_rows, R=n_cols // box, STAGES=stages, num_warps=16 if n_cols > 8192 else 8)
    return out


def check() -> None:
    """A small case in Triton's interpreter (or on the GPU): rows of 512 and 1024 columns, fp32."""
    for n_cols in (512, 1024):
        x = torch.randn(7, n_cols) * 5
        for stages in (1, 2):
            err = (softmax_tma(x, stages) - torch.softmax(x, -1)).abs().max().item()
            assert err < 1e-6, (n_cols, stages, err)
    print("check: right at 512 and 1024 columns, 1 and 2 stages")


def main(path: str) -> None:
    import pandas as pd

    rows = []
    bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=40)  # noqa: E731
    for dtype in (torch.bfloat16, torch.float32):
        for n in (4096, 8192, 16384, 32768, 65536):
            x = torch.randn(2**28 // (n * dtype.itemsize), n, device="cuda", dtype=dtype)
            ref = torch.softmax(x.float(), -1)
            copy = torch.empty_like(x)
            copy_gbps = 2 * x.numel() * x.element_size() / bench(lambda: copy.copy_(x)) / 1e6
            runs = {"public": lambda: sm.softmax(x)}
            for stages in (1, 2, 3, 4):
                if max(1, stages - 1) * n * dtype.itemsize <= 200 * 1024:  # the rows in shared memory at once
                    runs[f"tma s{stages}"] = lambda stages=stages: softmax_tma(x, stages)
                    runs[f"tma s{stages} 2/SM"] = lambda stages=stages: softmax_tma(x, stages, 2 * sm_count(x.device))
            for label, fn in runs.items():
                try:
                    err = (fn().float() - ref).abs().max().item()
                    ms = bench(fn)
                    rows.append(dict(dtype=str(dtype)[6:], n=n, provider=label, ms=ms, max_err=err,
                                     fraction=2 * x.numel() * x.element_size() / ms / 1e6 / copy_gbps))
                except Exception as e:  # noqa: BLE001  (a form that does not compile is a data point)
                    rows.append(dict(dtype=str(dtype)[6:], n=n, provider=label, error=repr(e)[:200]))
                print(rows[-1], flush=True)
            pd.DataFrame(rows).to_csv(path, index=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the CSV to write (GPU)")
    parser.add_argument("--check", action="store_true", help="only the small correctness case")
    args = parser.parse_args()
    if args.check or os.environ.get("TRITON_INTERPRET") == "1":
        check()
    else:
        main(args.out)
