"""What the softmax bench scripts (bench_softmax_staged.py, bench_softmax_ahead.py) share: one timed and
checked CSV row per run, the copy each run is a fraction of, the summary of a table of them, and the command
line."""
from __future__ import annotations

import argparse
import os
import sys


def copy_gbps(t) -> float:
    """GB/s of a device copy of tensor ``t`` (one read, one write; do_bench median): what a run's GB/s is divided by."""
    import torch
    import triton.testing

    out = torch.empty_like(t)
    return 2 * t.numel() * t.element_size() / triton.testing.do_bench(lambda: out.copy_(t), rep=100) / 1e6


GPU_STATE = ["clocks.sm", "clocks.mem", "temperature.gpu", "power.draw"]  # fields every driver knows


def gpu_state() -> dict:
    """The GPU's state as nvidia-smi reads it now ({} where there is none): SM and memory clocks (MHz), temperature
    and power, so that a slow timing can be set beside the clocks it ran at. The GPU is the first of
    CUDA_VISIBLE_DEVICES, as the bench's."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return {}
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()) or "0"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_STATE)}", "--format=csv,noheader,nounits", "-i",
                          gpu], capture_output=True, text=True, timeout=30)
    values = out.stdout.strip().split(", ") if out.returncode == 0 else []
    return dict(zip(GPU_STATE, values)) if len(values) == len(GPU_STATE) else {}


def timed(fn, ref, moved: int, copy_gbps: float, **labels) -> dict:
    """``labels`` and fn's GB/s (``moved`` bytes over the do_bench median), its fraction of the copy timed beside
    it, and its largest error relative to ref's largest value (ok: within 1e-5 for an fp32 output, 2e-2 for a
    16-bit one); a run that does not compile or launch is a row too, its error said. Each row also says the
    GPU's state just after its timing (gpu_state)."""
    import torch
    import triton.testing

    row = dict(labels, ok=False, error="")
    try:
        out = fn()
        tol = 1e-5 if out.dtype == torch.float32 else 2e-2
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        gbps = moved / triton.testing.do_bench(fn, rep=60) / 1e6
        row.update(gbps=gbps, of_copy=gbps / copy_gbps, rel_err=err, ok=err <= tol, **gpu_state())
    except Exception as e:  # noqa: BLE001  (a size that does not compile or launch is a data point)
        row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
    print(row, flush=True)
    return row


def timed_rounds(runs: list, ref, moved: int, copy_gbps: float, rounds: int, **labels) -> list[dict]:
    """timed() of each (sizes label, fn) in ``runs``, ``rounds`` times in turn (every run once a round), so that a
    change of the GPU's state between runs falls on all of them alike; each row says its round. ``ref``: the
    reference of every run, or a dict of them by label. Two timings of one launch of the split path can differ
    by a fifth (H100, bf16 rows of 262144 columns: 0.674 and 0.858 of copy), more than the designs compared."""
    return [timed(fn, ref[label] if isinstance(ref, dict) else ref, moved, copy_gbps, **labels, sizes=label, round=r)
            for r in range(rounds) for label, fn in runs]


def summarize(table) -> None:
    """The best run of each direction, dtype and width, the public kernel's beside it (over rounds: each run's
    median, with its lowest and highest); then what went wrong."""
    keys = ["direction", "dtype", "n_cols", "sizes"]
    ok = table[table.ok]
    columns = keys + ["of_copy"]
    if "round" in ok:
        of_copy = ok.groupby(keys).of_copy
        ok = of_copy.median().reset_index().assign(low=of_copy.min().values, high=of_copy.max().values)
        columns += ["low", "high"]
    best = ok.loc[ok.groupby(keys[:3] + [ok.sizes == "public"]).of_copy.idxmax()]
    print(best[columns].round(3).to_string(index=False))
    bad = table[~table.ok]  # wrong, or failed (its error said)
    if len(bad):
        print(f"{len(bad)} runs wrong or failed:", os.linesep, bad.to_string(index=False))


def main(doc: str, check, measure, widths: list[int], options=lambda parser: None) -> None:
    """A bench script's command line: ``--check`` runs ``check()`` (the CPU, Triton's interpreter), nothing timed;
    else ``measure(args)`` (args: the parsed ``--widths``, default ``widths``, and what ``options(parser)`` adds)
    makes the rows written to the CSV given, then summarized."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out", nargs="?", help="the CSV to write")
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=widths)
    parser.add_argument("--rounds", type=int, default=1, help="times each run is timed, in turn (where measure uses it)")
    options(parser)
    parser.add_argument("--check", action="store_true", help="the interpreter check (CPU), nothing timed")
    args = parser.parse_args()
    if args.check:
        check()
        return
    if not args.out:
        sys.exit("give the CSV to write (or --check)")
    import pandas as pd

    table = pd.DataFrame(measure(args))
    table.to_csv(args.out, index=False)
    summarize(table)
