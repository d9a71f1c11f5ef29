"""The sweep behind kernels/_softmax.py's sizes (GPU only; not part of the pipeline).

    PYTHONPATH=.:workflow python workflow/scripts/tune_softmax.py out.csv [--widths 32768,65536]
        [--dtypes bfloat16] [--directions forward] [--against OLD_SOFTMAX.py]

For every row width N (M x N holds 2^28 bytes) and dtype it times, forward and backward, each candidate
configuration of the improved kernel beside torch, torch.compile's softmax (provider "compiled": Inductor's
kernel, the pipeline's torch_compile) and, forward, the writeup's kernel, the public
``softmax`` / ``softmax_backward`` (provider "public": the defaults as the pipeline calls them), and a
device copy of the same tensor (provider "copy": the fraction of copy is gbps over its gbps), checks each
result against torch, and writes one CSV row per (direction, dtype, N, provider), the file rewritten
after each width so that a run cut short keeps what it measured. The options narrow the sweep;
``--against`` names another version of kernels/_softmax.py (a file), whose candidates are timed beside the
checkout's, each right after it in the same process (provider "<label> [against]"): an A/B free of the
drift between two processes.

Narrow fp32 rows against the compiled softmax (H100 80GB HBM3, stop 74, forward, fractions of copy): at 512 /
1024 / 2048 / 4096 columns the public softmax 0.999 / 0.999 / 1.001 / 1.005, the compiled 1.007 / 1.000 / 1.000 /
1.003, every candidate tile 0.998-1.004: all at the copy's rate within half a percent, so which of the two leads
there is the timing's noise, not a tile to choose (the committed H100 run's 0.995-0.997 of the compiled at
512-4096 is the same tie). At 32768: public 0.980, the two-pass path with one segment 0.989, compiled 0.764.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import pandas as pd
import torch

import kernels._softmax as sm  # first: it chooses the backend before triton is imported
from kernels import softmax, softmax_backward, softmax_writeup
from kernels._triton import triton
from lab.units.softmax import _softmax_backward, _softmax_forward

BYTES = 2**28
WIDTHS = [2**k for k in range(7, 19)] + [2**20]


def candidates(n: int, direction: str, half: bool) -> dict:
    """label -> keyword arguments of sm._forward / sm._backward: the defaults, and the grid they were chosen from
    (rows tiles forward; the split and two-pass paths from 32768 columns). Also tried on the H200 and dropped, as
    slower: eviction_policy="evict_first", persistent programs looping over tiles (num_stages 1 and 2), and a split
    path that does not run a row ahead. Dropped later (H200, triton 3.6, fractions of copy): for bf16 rows of 32768
    columns (0.79 with the rows path and 16 warps), a rows kernel that keeps x in bf16 and computes exp twice
    (0.60-0.75 with 4-32 warps) and the split path (0.61-0.68, chunks of 2048-8192, 4-16 warps). Kept from the same
    sweep: 4 warps up to 4096-element tiles (bf16 at 4096 columns 0.81 -> 0.97), the backward's rows path to 32768
    columns with 8 warps (bf16 0.58 -> 0.99, fp32 0.80 -> 0.97), and a warp per KiB of chunk on the split backward
    (bf16 at 65536 columns 0.57 -> 0.81). Measured next and not kept (H200, triton 3.6, fractions of a copy of
    4165-4168 GB/s; the committed sizes first): bf16 rows of 32768 columns forward 0.79, with 32 warps 0.79, 8 warps
    0.65, two rows per program 0.75, the split path with one program per row running a row ahead (chunk 32768, 16-32
    warps) 0.09-0.27, two programs per row (chunk 16384, 8-16 warps) 0.50-0.54; bf16 at 65536 the split path 0.63, one
    row per program with 32 warps 0.70 (fp32 there: 0.77 against 0.58); and a two-pass kernel, one program per row
    walking it in chunks twice so that the second read would come from L2 (chunks of 2048-8192, 4-16 warps, 2-3
    stages, one program per row or 2-4 per SM looping over rows, L2 eviction hints or none): at best bf16 0.73
    (32768), 0.64, 0.62, 0.51 (65536, 131072, 2^20), fp32 0.75, 0.66, 0.62, 0.48 where the committed kernel had 0.95,
    0.76, 0.77, 0.74. torch.compile's softmax in the same runs: forward 0.41-0.47 (bf16) and 0.39-0.66 (fp32),
    backward 0.99 at 32768 columns (ours 0.96 fp32, 0.99 bf16), 0.57-0.61 wider (ours 0.71-0.80). A two-pass backward
    (sum(y * dy) over the row in chunks, then dx from a second read; chunks of 1024-8192, 4-16 warps, 2-3 stages, one
    program per row or 4 per SM): at best 0.80 (fp32) and 0.77 (bf16) at 32768 columns, 0.60 wider, and 0.60-0.62 with
    Inductor's L2 hints (evict_last on the first read, evict_first on the second), where the committed kernel had
    0.95-0.99 and 0.59-0.81. Inductor's own backward at 32768 columns, which beats ours in fp32 (0.98-0.99 against
    0.95-0.96), is that two-pass reduction with those hints and one large block: XBLOCK 1, R0_BLOCK 32768 (the whole
    row; 16384 in bf16), 32 warps, 1 stage.

    That led to the two-pass path (kept; the WIDE table in kernels/_softmax.py): a program walks a row, or a
    segment of it, twice in chunks of 8192-32768 with 16-32 warps, so that few programs are resident and
    their lines stay in L2 for the second walk; the segments of a row meet at its counter between the
    walks. Measured (H200, triton 3.6, copy 4132-4186 GB/s; before -> after; 2^28 bytes per input):
    forward fp32 at 65536 columns 0.77 -> 0.87 (one program per row, chunks of 32768, 32 warps), bf16
    at 65536..2^20 0.53-0.63 -> 0.60-0.72 (segments of 131072), backward bf16 at 65536 0.57-0.80 -> 0.88
    (the row, chunks of 16384, 32 warps) and wider 0.45-0.63 -> 0.72-0.78 (segments of 16384, 16 warps).
    The split backward now holds its chunks in the input dtype, and takes 4 warps in fp32: 0.80 -> 0.90
    (65536), 0.87 (131072), 0.78 (262144). The bf16 backward at 32768 columns takes 16 warps on the rows
    path (0.99-1.01, compiled 0.99-1.00). Not kept: the two-pass forward for fp32 rows wider than 65536
    (0.61-0.73 against the split path's 0.74-0.77: two programs per row sync where one alone did not
    need to), and at bf16 32768 (0.81-0.87 against 0.79, within run-to-run spread; the rows path stays);
    a two-pass kernel that scales x by log2(e) once (3% faster, but fp32 errors grow with |x|); the fp32
    backward at 32768 columns with Inductor's sizes in our two-pass kernel (0.93 against Inductor's 0.98
    and our rows path's 0.96) and on the rows path with 16 or 32 warps (0.74-0.84); a split forward
    holding bf16 chunks as bf16 (0.51-0.61, no gain). How a segment's end is computed matters: as
    first + min(n_cols - first, SEGMENT) the bf16 backward at 131072 columns ran at 0.61 (the committed run
    made with it: 0.51-0.60 from 131072 up), as min(first, n_cols - SEGMENT) + SEGMENT, or as
    min(first + SEGMENT, n_cols), at 0.78-0.79. At 2^20 columns that backward measured 0.72 in one process
    and 0.48 in two later ones (64 segments per row, two rows at a time): not understood yet.

    Then (H200, triton 3.6, copy 4140-4169 GB/s): the backward's rows path reads y and dy a second time
    after their row sum (evict_last, then evict_first) instead of holding them, where that measured faster
    (BACKWARD_ROWS): bf16 at 16384 columns 1.03 against 0.97, at 32768 with 32 warps 1.00 against 0.95,
    fp32 at 32768 with 32 warps 0.99 against 0.98 (Inductor 0.99), 2048-4096 columns 1.02-1.04 against
    1.01-1.02; holding stays at 8192 (1.01-1.02 against 1.00) and fp32 16384 (level). A minimal whole-row
    kernel ran fp32 at 32768 columns at 1.00 with the width a constexpr and no mask, 0.62 with the width a
    runtime argument and a mask: so the rows path drops its masks when the tiles cover the rows. bf16
    forward at 32768 and 65536 columns: the two-pass path with one segment per row, chunks of 16384 and
    16 warps, 0.87 and 0.82 against 0.79 (rows path) and 0.70-0.72 (chunks of 32768, 32 warps), once a
    one-segment row's bounds are [0, n_cols) as such; through the general segment bounds the same sizes
    ran at 0.58-0.61. The backward goes the other way (bf16 at 65536: 0.76 with the plain bounds, 0.85 with
    the general ones) and keeps them. The one-FMA output exp2(x * log2(e) - shift), 16-bit outputs only:
    +0.01 in our two-pass kernel, +0.06 in a minimal one. Unchanged or slower, not kept: bf16 forward at
    131072 with chunks of 16384 (0.66 against 0.73), at 262144 and 2^20 every size tried (0.50-0.62); bf16
    backward at 2^20 columns 0.71-0.72 in three repeats (segments of 16384), 0.60-0.67 with segments of
    32768-131072, 0.62 on the split path.

    Then the split and two-pass forwards drop their column masks where the chunks cover the rows (EVEN,
    _covers). Measured on the H200 (triton 3.6, copy 4159-4170 GB/s, three processes) with a first form of
    it whose code was lost before it landed, the same design (masks dropped on the same condition; the
    split path's read-ahead past the last row reads the last row again): bf16 forward at 65536 / 131072 /
    262144 / 2^20 columns 0.823-0.827 / 0.736-0.740 / 0.620-0.622 / 0.601-0.602 against 0.788-0.790 /
    0.712-0.717 / 0.600-0.602 / 0.586-0.589 with the masks, fp32 at 65536 0.895-0.897 against 0.868. The
    backward keeps its masks: the one-segment bf16 backward at 65536 columns ran slower without them (0.79
    against 0.90), and its wider rows measured two speeds by process (0.77-0.81 or 0.50-0.58 at 131072 to
    2^20, not understood) whichever form. The form committed here is still to be measured.

    Thread-block clusters (num_ctas, a row spread over up to 8 CTAs that reduce through distributed shared
    memory, as QuACK does), compiled for sm_90 on a CPU: Triton 3.9 builds the rows path's forward at one
    row of 65536-262144 fp32 columns over 2-8 CTAs (the columns split between the CTAs, the reductions
    through mapa and barrier.cluster); Triton 3.6, the H200's, fails on it and on a 1-D
    kernel (TritonGPUPlanCTAPass: "invalid layout" for the 2-D slice, "parent layout must have at least
    rank >= 2" for 1-D). So not measured: the path for a GPU with a newer Triton.

    Then the rows forward's prefetching form (PREFETCH_FROM): a bf16 row of 32768 columns held as fp32 fills
    a program's registers (64 per thread at 32 warps), so an SM runs one row at a time and idles between
    its load and its arithmetic. A program per SM walking the rows, loading the next before it computes this
    one (H200, triton 3.6, copy 4129-4163 GB/s): bf16 at 32768 columns 0.902-0.904 with 32 warps, 0.85-0.90
    with 16, 0.50 with 8, two programs per SM the same, num_stages 1 or 3 the same (the default before:
    the two-pass path, 0.86-0.89 with its committed sizes); fp16 there 0.70-0.74 (the two-pass path 0.89:
    kept for fp16); bf16 at 8192-16384 and fp32 at 16384-32768 0.61-0.91, where one program per row made
    0.94-0.98. At 20000 columns (bf16, masked) 0.79.

    Then the wait at a row's counter, and the wide backward's sizes (H200, triton 3.6, fractions of a copy of
    the same tensor measured beside them, 2^28 bytes per input, four processes: the committed wait twice, and
    each variant once). The wait polls the counter with an atomic add of 0 (one thread, its value shared
    through shared memory; Triton builds it as an acquire load, bench_softmax_backoff.py); polling it with ld.acquire.gpu from every thread instead, with or without a
    nanosleep of 64 ns between polls, was slower where the defaults run: the split backward at 65536-262144
    fp32 columns 0.78-0.62 against 0.91-0.79, the public bf16 backward at 131072-262144 0.63-0.47 against
    0.80-0.78; it helped only split forwards that are not the defaults (fp32, chunks of 8192 and 8 warps, at
    131072: 0.82 against 0.71). Not kept. In the same runs, kept: the fp32 backward wider than 131072 columns
    in chunks of 8192 on 4 warps, 0.85 at 262144 and 0.71 at 2^20 against 0.79-0.80 and 0.60 with chunks of
    4096 (0.87 against 0.88 at 131072, so the split stays at 4096 there); the bf16 backward wider than
    262144 in segments of 65536 (chunks of 16384, 16 warps), 0.69-0.70 at 2^20 in all four processes
    against 0.41-0.48 with segments of 16384 (the two speeds recorded above: the slow one in these four;
    the committed run's softmax job then measured 0.674 with the new sizes, where the run before had 0.696
    with the old: steadier, not faster than the old sizes' fast speed).
    Forward: every default was the fastest candidate or within 0.01 of it (fp32 at 65536 0.90, 131072-2^20
    0.72-0.76; bf16 0.83, 0.74-0.75, 0.62, 0.60); bf16 at 32768 columns (this script's own run, a copy of
    the 256 MiB tensor at 4107 GB/s), the public forward 0.901, the prefetching rows kernel 0.907 (32 warps)
    and 0.906 (16), the two-pass path with one segment 0.885 (chunks of 8192, 16 warps): 3699 GB/s for the
    public forward, 0.87 of the pipeline's 1 GiB copy (4225-4258 GB/s), which its tables divide by.

    Measured, not kept: the split path with the next rows' chunks staged in shared memory by Triton's
    pipeliner and the wait in inline PTX (bench_softmax_staged.py's docstring has the figures: 4-8% faster in
    fp32, slower in bf16).
    Read from sm_90 builds as a launch specializes them (triton 3.6, ptxas), a lead for bf16 at 32768 columns
    (0.836 of the pipeline's copy): the prefetching rows kernel there, 32 warps, is held to 64 registers a
    thread (1024 threads) and spills 64 B (fp32: 144 B; on 16 warps 228 and 252 B); a program per row on 16
    warps spills nothing (128 registers).

    On an H100 80GB HBM3 (no H200 lent that session; triton 3.6, fractions of a copy measured beside them):
    the split forward holding bf16 chunks in x's dtype, converted at use (fewer registers in the sm_90 build),
    against fp32 chunks in one process each: at 32768 / 65536 / 262144 / 2^20 columns chunks of 4096 on 4
    warps 0.81 / 0.83 / 0.69 / 0.64 against 0.76 / 0.77 / 0.66 / 0.64, the other split sizes within 0.012
    (one outlier), and the defaults unchanged (0.93 / 0.94 / 0.69 / 0.68-0.69: no default takes the split path
    there). Not kept. Narrow rows there, the public kernels against torch.compile's: forward bf16 and fp32 at
    128-16384 columns 0.991-1.007 of copy against 0.985-1.006 (bf16 compiled 0.58-0.63 from 2048 up),
    backward 1.02-1.04 against 0.98-1.04: ties within the spread of one process.

    Then one exp per element in the split forward (the chunk's exp(x - chunk max), computed for its partial
    sum, kept and rescaled by exp(chunk max - row max) / row sum). On an H100 (triton 3.6), in one process with
    ``--against`` the file before it, GB/s: fp32 defaults 2762 / 2706 / 2608 against 2761 / 2668 / 2544 at 65536
    / 262144 / 2^20 columns, bf16 split chunks 2-12% faster. With it, two processes on another H100 (within 0.005
    of each other; fractions of copy at 131072 / 262144 / 524288 / 2^20 columns; the defaults before, then the
    best other size): fp32 forward 0.94 / 0.92 / 0.91 / 0.90 (split 4096/4, the best); bf16 forward 0.88 / 0.67 /
    0.68 / 0.68 (segments of 131072), segments of 65536 with chunks of 32768 on 32 warps 0.75 / 0.75 / 0.74 /
    0.70 (kept past 131072 columns); bf16 backward 0.83 / 0.84 / 0.72 / 0.72 (segments of 16384 to 262144, of
    65536 beyond), the split path with chunks of 8192 on 4 warps 0.92 / 0.90 / 0.82 / 0.69 and on 8 warps 0.69
    / 0.65 / 0.85 / 0.73 (kept: 4 warps to 262144 columns, 8 warps to 524288; at 2^20 the tie is left to the
    segments)."""
    out = {"default": {}}
    width = triton.next_power_of_2(n)
    for tile in (1024, 2048, 4096, 8192, 16384, 32768) if direction == "forward" else ():
        for warps in (4, 8, 16):
            if width <= tile <= max(2 * width, 16384):  # narrow rows: tiles of up to 16384 elements too
                out[f"rows tile={tile} warps={warps}"] = dict(tile=tile, row_limit=2**21, warps=warps, prefetch=False)
    for tile in (2048, 4096, 8192, 16384) if direction == "backward" and n <= 4096 else ():
        for warps in (4, 8, 16):
            if width <= tile:
                out[f"rows tile={tile} warps={warps}"] = dict(tile=tile, warps=warps, reload=False)
    if direction == "forward" and 8192 <= n <= sm.ROW_LIMIT:
        for warps in (16, 32):
            out[f"rows prefetch warps={warps}"] = dict(tile=1, row_limit=sm.ROW_LIMIT, prefetch=True, warps=warps)
    if n <= sm.BACKWARD_ROW_LIMIT and direction == "backward":
        for reload in (False, True):
            for warps in (8, 16, 32):
                out[f"rows reload={reload} warps={warps}"] = dict(reload=reload, warps=warps)
    if n >= 32768:
        for chunk, warps in ((4096, 4), (8192, 4), (8192, 8), (8192, 16)):
            out[f"split chunk={chunk} warps={warps}"] = dict(row_limit=1, chunk=chunk, warps=warps, segment=0,
                                                             packed=False)
            if half:  # 16-bit rows held two to a 32-bit word (the backward then runs a row ahead)
                out[f"split packed chunk={chunk} warps={warps}"] = dict(row_limit=1, chunk=chunk, warps=warps,
                                                                        segment=0, packed=True)
        for segment, chunk, warps in ((32768, 8192, 16), (65536, 16384, 16), (65536, 32768, 32), (131072, 32768, 32)):
            out[f"two-pass segment={segment} chunk={chunk} warps={warps}"] = dict(
                row_limit=1, segment=segment, chunk=chunk, warps=warps)
    return out


def load_against(path: str):
    """Another version of kernels/_softmax.py, loaded beside the checkout's as kernels._softmax_against (its
    relative imports resolve in the checkout's package)."""
    spec = importlib.util.spec_from_file_location("kernels._softmax_against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40)


def main(path: str, widths: list[int], dtypes: list[str], directions: list[str], against: str | None = None) -> None:
    # Inductor's softmax as the pipeline's torch_compile provider compiles it: the same functions, once per
    # shape (past Dynamo's recompile limit it would run the eager op instead)
    compiled = {"forward": torch.compile(_softmax_forward, dynamic=False),
                "backward": torch.compile(_softmax_backward, dynamic=False)}
    with torch._dynamo.config.patch(recompile_limit=len(widths) * len(dtypes) + 8):
        sweep(path, widths, dtypes, directions, compiled, load_against(against) if against else None)


def sweep(path: str, widths: list[int], dtypes: list[str], directions: list[str], compiled: dict, other=None) -> None:
    rows = []
    versions = [(sm, "")] + ([(other, " [against]")] if other else [])  # (module, label suffix)
    for dtype in (getattr(torch, name) for name in dtypes):
        for n in widths:
            m = max(1, BYTES // (n * dtype.itemsize))
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            ref = torch.softmax(x, -1)
            dy = torch.randn_like(x)
            ref_dx = torch._softmax_backward_data(dy, ref, -1, dtype)
            moved = {"forward": 2 * x.numel() * dtype.itemsize, "backward": 3 * x.numel() * dtype.itemsize}
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            copy = torch.empty_like(x)
            ms = bench(lambda: copy.copy_(x))
            rows.append(dict(direction="copy", dtype=str(dtype)[6:], n=n, m=m, provider="copy", ms=ms,
                             gbps=2 * x.numel() * dtype.itemsize / ms / 1e6))
            for direction in directions:
                runs = {"torch": (lambda: torch.softmax(x, -1)) if direction == "forward"
                        else (lambda: torch._softmax_backward_data(dy, ref, -1, dtype)),
                        # Inductor's kernel, the pipeline's torch_compile provider (compiled at its first run)
                        "compiled": (lambda: compiled["forward"](x)) if direction == "forward"
                        else (lambda: compiled["backward"](ref, dy)),
                        # the defaults through the public API, as the pipeline times them (input checks and
                        # an output allocated per call): beside "default" it shows what the host adds
                        "public": (lambda: softmax(x)) if direction == "forward" else (lambda: softmax_backward(ref, dy))}
                if direction == "forward" and n <= 32768:
                    runs["writeup"] = lambda: softmax_writeup(x)
                for label, kw in candidates(n, direction, dtype.itemsize == 2).items():
                    for module, suffix in versions:
                        if direction == "forward":
                            out = torch.empty_like(x)
                            runs[label + suffix] = lambda kw=kw, out=out, module=module: module._forward(x, out, **kw)
                        else:
                            runs[label + suffix] = lambda kw=kw, module=module: module._backward(ref, dy, **kw)
                for label, fn in runs.items():
                    try:
                        got = fn()
                        want = ref if direction == "forward" else ref_dx
                        err = (got.float() - want.float()).abs().max().item()
                        ms = bench(fn)
                        rows.append(dict(direction=direction, dtype=str(dtype)[6:], n=n, m=m, provider=label, ms=ms,
                                         gbps=moved[direction] / ms / 1e6, max_err=err, ok=err <= tol))
                    except Exception as e:  # noqa: BLE001  (a config that does not compile is a data point)
                        rows.append(dict(direction=direction, dtype=str(dtype)[6:], n=n, m=m, provider=label,
                                         error=repr(e)[:200]))
                    print(rows[-1], flush=True)
            pd.DataFrame(rows).to_csv(path, index=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=WIDTHS,
                        help="row widths, comma-separated (default: 128..2^20)")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"])
    parser.add_argument("--directions", type=lambda s: s.split(","), default=["forward", "backward"])
    parser.add_argument("--against", help="another version of kernels/_softmax.py to time beside this one")
    args = parser.parse_args()
    unknown = [d for d in args.dtypes if not isinstance(getattr(torch, d, None), torch.dtype)]
    unknown += [d for d in args.directions if d not in ("forward", "backward")]
    if unknown:
        parser.error(f"unknown dtypes or directions: {unknown}")
    if args.against and not os.path.isfile(args.against):
        parser.error(f"--against: no such file: {args.against}")
    main(args.out, args.widths, args.dtypes, args.directions, args.against)
