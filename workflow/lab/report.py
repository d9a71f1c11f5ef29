"""The markdown report: provenance, one row per claim (said / measured / verdict), performance, figures."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import yaml

from . import claims as claims_mod
from . import provenance, runs, summary
from .table import PROVENANCE, atomic_path

CAPTIONS = Path(__file__).resolve().parents[1] / "report"  # <figure name>.rst, shared with `snakemake --report`

# Which kernel each provider name in the tables is.
PROVIDERS = {
    "triton_writeup": "the writeup's kernel as written: `kernels.relu_dropout_writeup` (one `tl.rand` per element); "
                      "for softmax `kernels.softmax_writeup` (one block per row, sized to the row: the writeup's fix; "
                      "`softmax_writeup(x, 1024)` is its bug); "
                      "for attention `kernels.attention` (all of K/V at once, BLOCK_Q=16, BLOCK_K=next_power_of_2(n_k), "
                      "BLOCK_V=next_power_of_2(d): the writeup does not show its launcher)",
    "triton_fused": "the project's improved kernel: `kernels.relu_dropout` (`tl.rand4x`, four draws per Philox call; "
                    "backward `kernels.relu_dropout_backward`, the mask drawn again from the seed) or `kernels.softmax` "
                    "(narrow rows share a program, wide rows are split over a group of programs; backward "
                    "`kernels.softmax_backward`)",
    "triton": "`kernels.vector_add`, the writeup's kernel",
    "triton_flash": "`kernels.flash_attention`, the rung the writeup did not climb (tiled online softmax, fwd + bwd)",
    "torch_unfused": "`dropout(relu(x))`: two torch kernels; backward through autograd",
    "torch_softmax": "`torch.softmax`; backward `torch._softmax_backward_data`, the kernel autograd runs",
    "torch_naive": "softmax as five torch ops (max, subtract, exp, sum, divide)",
    "torch_sdpa / sdpa_*": "`F.scaled_dot_product_attention`, backend forced and then read from the kernels it launched "
                           "(column `sdpa_backend`)",
}
FLOPS = ("FLOPs for attention follow FlashAttention's convention: 4·B·H·S²·D for the forward (two S×S×D matmuls, "
         "2 FLOPs per multiply-add), ×0.5 under a causal mask, ×3.5 for forward+backward. Bandwidth counts the "
         "bytes an op must move at the least, stated per provider in the code (column `bytes`).")


def caption(name: str) -> str:
    path = CAPTIONS / f"{name}.rst"
    return " ".join(path.read_text().split()).replace("``", "`") if path.exists() else ""


def _md_table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    def fmt(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else format(v, floatfmt)
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "---|" * len(df.columns)
    body = ["| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def _provenance(tables: dict[str, pd.DataFrame]) -> str:
    """The run's origin (values shared by every table, or each distinct value), then each table's own."""
    allrows = pd.concat(tables.values(), ignore_index=True)
    lines = [f"This report was generated at commit `{provenance.git_commit()}` "
             f"(uncommitted changes to tracked files outside results/: {provenance.git_dirty()}) from the tables below.", ""]
    per_table = ["git_commit", "git_dirty", "job_start", "timestamp", "gpu_uuid", "sm_clock_mhz", "sm_clock_max_mhz",
                 "config_hash", "code_hash"]
    for key in PROVENANCE:
        if key in per_table or key == "fingerprint" or key not in allrows:
            continue
        vals = sorted(map(str, allrows[key].dropna().unique()))
        lines.append(f"- **{key}**: {', '.join(v for v in vals if v) or '(none)'}")
    origin = pd.DataFrame([{"table": f"`{k}`", "rows": len(v), **{c: v[c].iloc[0] for c in per_table if c in v}}
                           for k, v in sorted(tables.items())])
    for c in ("sm_clock_mhz", "sm_clock_max_mhz"):
        if c in origin:
            origin[c] = origin[c].map(lambda mhz: "" if pd.isna(mhz) else f"{mhz:.0f}")
    return ("\n".join(lines) + "\n\nEach table, as recorded in its rows (SM clocks in MHz at the job's start):\n\n"
            + _md_table(origin))


def _performance(tables: dict[str, pd.DataFrame]) -> str:
    ceil = summary.ceilings(tables["calibration/ceilings"])
    if not ceil:
        return ("Not measured: this run used Triton's interpreter, and timing needs a GPU. The committed GPU run "
                "is under `results/nvidia-h200/`.")
    out = [f"Ceilings measured in this run on {ceil['device']}: device-to-device copy **{ceil['copy_gbps']:.0f} GB/s**, "
           f"bf16 matmul **{ceil['matmul_tflops']:.0f} TFLOP/s**, shared memory per block "
           f"**{ceil['shared_memory_per_block']} B**. Medians of `triton.testing.do_bench`; p20/p80 are in the tables."]
    out.append("\n### Memory-bound kernels: best median bandwidth and fraction of the copy ceiling\n")
    for kernel, x in summary.MEMORY_BOUND.items():
        peak = summary.peak_bandwidth(tables[f"{kernel}/performance"], ceil["copy_gbps"], x)
        out.append(f"**{kernel}**\n\n" + _md_table(peak) + "\n")
    f = summary.fusion(tables)
    for kernel, g in f.groupby("kernel", sort=False) if not f.empty else ():
        wide = g.pivot_table(index="size", columns="pair", values="time_ratio")
        wide.columns.name = None
        wide.index.name = dict((k, x) for k, _, _, x in summary.FUSION)[kernel]
        out.append(f"\n### What fusion buys, {kernel}: unfused time / fused time (median; > 1: fused is faster)\n\n"
                   + _md_table(wide.reset_index(), ".2f"))
    out.append(_softmax_widths(tables, ceil["copy_gbps"]))
    out.append(_improvements(tables))
    att = summary.median(tables["attention/performance"], "throughput")
    if not att.empty:
        wide = att.pivot_table(index=["n_q", "d", "dtype"], columns="provider", values="value").reset_index()
        out.append("\n### The writeup's attention kernel vs flash_attention and SDPA, TFLOP/s (one head, where it runs)"
                   "\n\n" + _md_table(wide))
    w = summary.wall(tables["attention/wall"])
    out.append("\n### The wall\n\n" + _md_table(w))
    mem = summary.ok(tables["flash_attention/past_wall"], metric="peak_extra_memory")
    if not mem.empty:
        mem = mem.astype({"seq": int, "heads": int, "d": int})
        wide = mem.pivot_table(index=["seq", "heads", "d", "dtype"], columns="provider", values="value") / 2**20
        wide.columns.name = None
        out.append("\n### Peak memory beyond q, k, v for one forward, MiB\n\n" + _md_table(wide.reset_index(), ".6g"))
    perf = tables["flash_attention/performance"]
    f = summary.flash_vs_sdpa(perf, ceil["matmul_tflops"])
    if not f.empty:
        out.append(f"\n### flash_attention vs SDPA backends, median TFLOP/s (bf16, batch x seq = "
                   f"{int(f['batch'].mul(f['seq']).max())})\n\n" + FLOPS + " `best_sdpa` is the fastest SDPA backend at "
                   "each point, and `triton/best_sdpa` the ratio against it.\n\n" + _md_table(f))
        out.append(_call_cost(perf))
        tiles = summary.median(perf, "throughput", provider="triton_flash")
        cols = [c for c in tiles.columns if c.startswith("tile_")]
        if cols:
            used = tiles[["variant", "d", "causal", "seq", *cols]].sort_values(["variant", "d", "causal", "seq"])
            out.append("\nTiles chosen for flash_attention (each length is its own bucket here):\n\n" + _md_table(used))
        tuned = summary.tuning(perf)
        if not tuned.empty:
            out.append("\nWhat tuning bought, per kernel (each bucket's candidates timed on the caller's tensors, "
                       "median of a CUDA graph replay; the first candidate is what runs untuned):\n\n" + _md_table(tuned))
    return "\n".join(out)


def _call_cost(perf: pd.DataFrame) -> str:
    """The per-call host cost and the cost of a call at a new length, from the performance table."""
    floor = summary.launch_floor(perf)
    text = ("\nTime per call at B=1, H=1, S=16, D=64, calls back to back (the host's cost per call, which bounds "
            "short sequences): " + ", ".join(f"{p} {us:.0f} us" for p, us in sorted(floor.items())) + ". Each SDPA "
            "call here enters `sdpa_kernel(backend)` to pin its backend, and that context manager's own host cost "
            "is in SDPA's time: this row overstates what SDPA costs a model that calls it plainly "
            "(`workflow/scripts/call_cost.py` measures both ways).")
    first = summary.first_call(perf)
    if {"untuned_bucket", "tuned_bucket"} <= set(first):
        rows = summary.ok(perf, metric="first_call_ms")
        seq = dict(zip(rows["variant"], rows["seq"].astype(int)))
        text += (f"\n\nA length not seen before (B=1, H=1, D=64, forward, wall time to the result): "
                 f"{first['untuned_bucket']:.0f} ms at S={seq['untuned_bucket']}, whose bucket had to be tuned first "
                 f"(every candidate timed, and compiled if this process had not yet); {first['tuned_bucket']:.2f} ms at "
                 f"S={seq['tuned_bucket']}, in the bucket S={int(rows['bucket_tuned_at'].iloc[0])} had tuned.")
    if {"first_call_bytes", "later_call_bytes"} <= set(first):
        seq = int(summary.ok(perf, metric="peak_extra_memory")["seq"].iloc[0])
        text += (f" Peak memory beyond q, k, v at S={seq}: {first['first_call_bytes'] / 2**20:.3f} MiB for the first "
                 f"(tuning) call, {first['later_call_bytes'] / 2**20:.3f} MiB for a later one.")
    return text


def _softmax_widths(tables: dict[str, pd.DataFrame], copy_gbps: float) -> str:
    """The project's softmax against torch's at every row width, forward and backward; relu+dropout's
    backward beside its forward."""
    w = summary.softmax_widths(tables["softmax/performance"], copy_gbps)
    if w.empty:
        return ""
    out = ["\n### softmax at every row width, median GB/s (inputs of the same size; `torch/triton time` > 1: the "
           "project's kernel is faster)\n"]
    for (direction, dtype), g in w.groupby(["direction", "dtype"], sort=False):
        worst = g.loc[g["torch/triton time"].idxmin()]
        wide = g[g["n_cols"] >= 1024]
        low = wide.loc[wide["triton/copy"].idxmin()] if len(wide) else None
        out.append(f"- {direction}, {dtype}: against torch {g['torch/triton time'].min():.2f}x.."
                   f"{g['torch/triton time'].max():.2f}x (lowest at {int(worst['n_cols'])} columns)"
                   + (f"; from 1024 columns up at least {low['triton/copy']:.2f} of copy (at {int(low['n_cols'])})"
                      if low is not None else ""))
    cols = [c for c in ("direction", "dtype", "n_cols", "n_rows", "triton_fused", "torch_softmax", "triton_writeup",
                        "torch/triton time", "triton/copy") if c in w]
    out.append("\n" + _md_table(w[cols].astype({"n_cols": int, "n_rows": int})))
    dr = summary.median(tables["relu_dropout/performance"], "bandwidth", provider="triton_fused")
    if "direction" in dr and dr["direction"].nunique() > 1:
        big = dr[dr["size"] == dr["size"].max()].set_index("direction")["value"]
        out.append(f"\nrelu+dropout at {int(dr['size'].max())} elements: forward {big['forward'] / copy_gbps:.3f} of copy, "
                   f"backward (the mask drawn again from the seed; read x and dy, write dx) "
                   f"{big['backward'] / copy_gbps:.3f} of copy.")
    return "\n".join(out)


def _improvements(tables: dict[str, pd.DataFrame]) -> str:
    """The writeup's kernel against the project's, same job, same shapes: what each change bought."""
    lines = []
    dr = summary.median(summary.forward(tables["relu_dropout/performance"]), "time_ms")
    if {"triton_writeup", "triton_fused"} <= set(dr["provider"]):
        t = dr.pivot_table(index="size", columns="provider", values="value")
        ratio = t["triton_writeup"] / t["triton_fused"]
        lines.append(f"- relu+dropout, `tl.rand4x` instead of one `tl.rand` per element: the writeup's kernel takes "
                     f"{ratio.min():.2f}x..{ratio.max():.2f}x the time of the improved one ({ratio.iloc[-1]:.2f}x at "
                     f"{t.index[-1]} elements).")
    sm = summary.median(summary.forward(tables["softmax/performance"]), "time_ms")
    if {"triton_writeup", "triton_fused"} <= set(sm["provider"]):
        t = sm.pivot_table(index=["dtype", "n_cols"], columns="provider", values="value")
        ratio = (t["triton_writeup"] / t["triton_fused"]).dropna()
        worst, best = ratio.idxmax(), ratio.idxmin()
        lines.append(f"- softmax, several narrow rows per program and a split path for wide rows instead of one block "
                     f"per row: the writeup's kernel (block sized to the row) takes {ratio.min():.2f}x..{ratio.max():.2f}x "
                     f"the time of the improved one ({ratio.max():.2f}x at {worst[1]} columns, {worst[0]}; "
                     f"{ratio.min():.2f}x at {best[1]}, {best[0]}).")
    att = summary.median(tables["attention/performance"], "time_ms")
    if {"triton_writeup", "triton_flash"} <= set(att["provider"]):
        t = att.pivot_table(index="n_q", columns="provider", values="value")
        ratio = (t["triton_writeup"] / t["triton_flash"]).dropna()
        lines.append(f"- attention, tiles and online softmax instead of all of K/V at once (one head, "
                     f"d={int(att['d'].iloc[0])}, {att['dtype'].iloc[0]}): the writeup's kernel takes "
                     + ", ".join(f"{r:.2f}x at S={int(n)}" for n, r in ratio.items())
                     + " the time of flash_attention, and stops at its wall.")
    return ("\n### What each improvement bought (median time of the writeup's kernel / the project's)\n\n"
            + "\n".join(lines)) if lines else ""


def _schedule(run_dir: Path) -> str:
    groups = summary.invocations(run_dir)
    if not groups or any(g["start"].isna().any() for g in groups.values()):
        return "These tables do not record when their jobs started."
    lines, parts = [], []
    for commit, g in groups.items():
        t0 = g["start"].min()
        gpus = g.loc[g["gpu"] != "", "gpu"].nunique()
        lines.append(f"- commit `{commit}`: {len(g)} jobs {f'on {gpus} GPU(s)' if gpus else 'on the CPU'}, "
                     f"{runs.wall_seconds(g):.0f} s from its first job's start to its last table written")
        parts.append(pd.DataFrame({"commit": commit, "gpu": g["gpu"].str[-8:], "table": g["table"], "timing": g["timing"],
                                   "start_s": (g["start"] - t0).dt.total_seconds(),
                                   "seconds": (g["end"] - g["start"]).dt.total_seconds()}))
    table = pd.concat(parts).sort_values(["commit", "gpu", "start_s"])
    return ("Each experiment job, on the GPU it locked (last characters of its UUID), in seconds from the start of "
            "the pipeline invocation that ran it (one per commit that made tables here):\n\n" + "\n".join(lines)
            + "\n\n" + _md_table(table, ".1f"))


def build(tables: dict[str, pd.DataFrame], claims_path: str, figures: list[str], out_path: str,
          html_path: str | None = None) -> pd.DataFrame:
    with open(claims_path) as fh:
        claims = yaml.safe_load(fh)
    verdicts = claims_mod.settle(claims, tables)
    fig_dir = os.path.relpath(os.path.dirname(figures[0]), os.path.dirname(out_path)) if figures else "figures"
    table = verdicts.assign(
        figure=lambda d: d["figure"].map(lambda f: f"[{f}.png]({fig_dir}/{f}.png)" if f else ""),
        said=lambda d: "\"" + d["said"] + "\"")[["id", "claim", "said", "measured", "verdict", "figure"]]
    counts = verdicts["verdict"].value_counts()
    tally = ", ".join(f"{n} {v}" for v, n in counts.items())
    parts = [
        f"# Triton kernel lab: report for `{Path(out_path).parent.name}`",
        "Every claim of the writeup, settled by this run's tables. Verdicts: reproduced / reproduced with a nuance / "
        "not reproduced / needs a GPU (never guessed: a claim this run could not measure says so).",
        "## Provenance\n\n" + _provenance(tables),
        "## Claims\n\n" + tally + "\n\n" + _md_table(table),
        "## Schedule\n\n" + _schedule(Path(out_path).parent),
        "## Kernels\n\nThe provider names in the tables and below:\n\n"
        + "\n".join(f"- `{k}`: {v}" for k, v in PROVIDERS.items()),
        "## Performance\n\n" + _performance(tables),
        "## Figures\n\n" + "\n\n".join(f"### {Path(f).stem}\n\n![{Path(f).stem}]({fig_dir}/{Path(f).name})\n\n"
                                          f"{caption(Path(f).stem)}" for f in figures),
        "## Tables\n\n" + "\n".join(f"- `{k}.parquet`: {len(v)} rows" for k, v in sorted(tables.items())),
    ]
    with atomic_path(out_path) as tmp:
        tmp.write_text("\n\n".join(parts) + "\n")
    if html_path:
        device = ", ".join(sorted(pd.concat(tables.values())["device"].dropna().unique()))
        html = (f"<h2>Claims of the writeup on {device}: {tally}</h2>\n"
                + verdicts[["id", "claim", "said", "measured", "verdict"]].to_html(index=False, border=1))
        with atomic_path(html_path) as tmp:
            tmp.write_text(html)
    return verdicts
