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

# Which kernel each provider name in the tables is, and how the project's kernels deviate from the writeup's.
PROVIDERS = {
    "triton_writeup": "the writeup's kernel as printed: `kernels.vector_add_writeup` (int32 offsets), "
                      "`kernels.relu_dropout_writeup` (one `tl.rand` per element, int32 offsets), "
                      "`kernels.softmax_writeup` (one block per row sized to the row: the writeup's fix; "
                      "`softmax_writeup(x, 1024)` is its bug; for fp16/bf16 inputs it computes in fp32, the one "
                      "change, which fp32 inputs - every claim's - do not see), `kernels.attention_writeup` "
                      "(all of K/V at once, row masks only, BLOCK_Q=16, BLOCK_K=next_power_of_2(n_k), "
                      "BLOCK_V=next_power_of_2(d); the writeup shows no launcher: this one pads each tensor with "
                      "BLOCK_V - d zeros so that reads past a row stay in memory it owns)",
    "triton": "`kernels.vector_add`: the writeup's add kernel, variant `int64_offsets` (64-bit offsets where a size "
              "needs them); `kernels.attention`: the writeup's attention kernel, variant `head_dim_mask` (every load "
              "and store also masked along d)",
    "triton_fused": "the project's improved kernel: `kernels.relu_dropout` (`tl.rand4x`, four draws per Philox call; "
                    "64-bit offsets and two-word counters past 2^31; backward `kernels.relu_dropout_backward`, the mask "
                    "drawn again from the seed) or `kernels.softmax` (narrow rows share a program, wide rows are split "
                    "over a group of programs: any width; backward `kernels.softmax_backward`)",
    "triton_flash": "`kernels.flash_attention`, the rung the writeup did not climb (tiled online softmax, fwd + bwd; "
                    "one grid axis, so any batch x heads)",
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
            if pd.isna(v):
                return ""
            return str(int(v)) if v.is_integer() and abs(v) < 2**53 else format(v, floatfmt)  # 16384, not 1.64e+04
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


def _needs(tables: dict[str, pd.DataFrame], keys, build) -> str:
    """build(tables) when this run has every table in ``keys``; otherwise says which are missing."""
    missing = [k for k in keys if k not in tables]
    if missing:
        return "\n" + "; ".join(f"Not settled: `{k}` missing (not in this run)." for k in missing) + "\n"
    return build(tables)


def _performance(tables: dict[str, pd.DataFrame]) -> str:
    if not any(not summary.ok(d).empty for k, d in tables.items() if k.endswith("/performance")):
        return ("Not measured: this run used Triton's interpreter (or timed nothing), and timing needs a GPU. The "
                "committed GPU run is under `results/nvidia-h200/`.")
    out = ["Medians of `triton.testing.do_bench`; p20/p80 are in the tables. Every fraction of a ceiling divides by "
           "the copy bandwidth or bf16 matmul rate that the same job measured on its own GPU before it started "
           "(columns `copy_gbps`, `matmul_tflops` of each table)."]
    out.append(_needs(tables, ["calibration/ceilings"], _calibration))
    out.append(_needs(tables, [f"{k}/performance" for k in summary.MEMORY_BOUND], _memory_bound))
    out.append(_needs(tables, ["relu_dropout/performance", "softmax/performance"], _fusion))
    out.append(_needs(tables, ["softmax/performance"], _softmax_widths))
    out.append(_needs(tables, ["relu_dropout/performance", "softmax/performance", "attention/performance"],
                      _improvements))
    out.append(_needs(tables, ["attention/performance", "attention/wall"], _attention))
    out.append(_needs(tables, ["flash_attention/past_wall"], _flash_memory))
    out.append(_needs(tables, ["flash_attention/performance"], _flash))
    return "\n".join(out)


def _calibration(tables) -> str:
    ceil = summary.ceilings(tables["calibration/ceilings"])
    if not ceil:
        return ""
    return (f"\nThe calibration job on {ceil['device']}: device-to-device copy **{ceil['copy_gbps']:.0f} GB/s**, "
            f"bf16 matmul **{ceil['matmul_tflops']:.0f} TFLOP/s**, shared memory per block "
            f"**{ceil['shared_memory_per_block']} B**. Each timing job's own ceilings:\n\n" + _md_table(pd.DataFrame(
                [{"table": f"`{k}`", "copy GB/s": summary.own_ceiling(d, "copy_gbps"),
                  "bf16 matmul TFLOP/s": summary.own_ceiling(d, "matmul_tflops")}
                 for k, d in sorted(tables.items()) if k.endswith("/performance") and not summary.ok(d).empty]), ".4g"))


def _copy(tables, kernel: str) -> float | None:
    return summary.own_ceiling(tables[f"{kernel}/performance"], "copy_gbps", tables.get("calibration/ceilings"))


def _memory_bound(tables) -> str:
    out = ["\n### Memory-bound kernels: best median bandwidth and fraction of the copy ceiling\n"]
    for kernel, x in summary.MEMORY_BOUND.items():
        copy = _copy(tables, kernel)
        if copy:
            out.append(f"**{kernel}**\n\n" + _md_table(summary.peak_bandwidth(tables[f"{kernel}/performance"], copy, x)) + "\n")
    return "\n".join(out)


def _fusion(tables) -> str:
    out = []
    f = summary.fusion(tables)
    for kernel, g in f.groupby("kernel", sort=False) if not f.empty else ():
        wide = g.pivot_table(index="size", columns="pair", values="time_ratio")
        wide.columns.name = None
        wide.index.name = dict((k, x) for k, _, _, x in summary.FUSION)[kernel]
        out.append(f"\n### What fusion buys, {kernel}: unfused time / fused time (median; > 1: fused is faster)\n\n"
                   + _md_table(wide.reset_index(), ".2f"))
    return "\n".join(out)


def _attention(tables) -> str:
    out = []
    att = summary.median(tables["attention/performance"], "throughput")
    if not att.empty:
        wide = att.pivot_table(index=["n_q", "d", "dtype"], columns="provider", values="value").reset_index()
        out.append("\n### The writeup's attention kernel vs flash_attention and SDPA, TFLOP/s (one head, where it runs)"
                   "\n\n" + _md_table(wide))
    out.append("\n### The wall\n\n" + _md_table(summary.wall(tables["attention/wall"])))
    return "\n".join(out)


def _flash_memory(tables) -> str:
    mem = summary.ok(tables["flash_attention/past_wall"], metric="peak_extra_memory")
    if mem.empty:
        return ""
    mem = mem.astype({"seq": int, "heads": int, "d": int})
    wide = mem.pivot_table(index=["seq", "heads", "d", "dtype"], columns="provider", values="value") / 2**20
    wide.columns.name = None
    return "\n### Peak memory beyond q, k, v for one forward, MiB\n\n" + _md_table(wide.reset_index(), ".6g")


def _flash(tables) -> str:
    perf = tables["flash_attention/performance"]
    f = summary.flash_vs_sdpa(perf, summary.own_ceiling(perf, "matmul_tflops", tables.get("calibration/ceilings")))
    if f.empty:
        return ""
    out = [f"\n### flash_attention vs SDPA backends, median TFLOP/s (bf16, batch x seq = "
           f"{int(f['batch'].mul(f['seq']).max())}, causal and not)\n\n" + FLOPS + " `best_sdpa` is the fastest SDPA "
           "backend at each point, and `triton/best_sdpa` the ratio against it.\n\n" + _md_table(f)]
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


def _softmax_widths(tables: dict[str, pd.DataFrame]) -> str:
    """The project's softmax against torch's at every row width, forward and backward; relu+dropout's
    backward beside its forward."""
    w = summary.softmax_widths(tables["softmax/performance"], _copy(tables, "softmax"))
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
    if "relu_dropout/performance" not in tables:
        return "\n".join(out)
    dr = summary.median(tables["relu_dropout/performance"], "bandwidth", provider="triton_fused")
    copy_gbps = _copy(tables, "relu_dropout")
    if "direction" in dr and dr["direction"].nunique() > 1 and copy_gbps:
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
    drawn = {Path(f).stem for f in figures}
    table = verdicts.assign(
        figure=lambda d: d["figure"].map(lambda f: f"[{f}.png]({fig_dir}/{f}.png)" if f in drawn else ""),
        said=lambda d: "\"" + d["said"] + "\"")[["id", "claim", "said", "measured", "verdict", "figure"]]
    counts = verdicts["verdict"].value_counts()
    tally = ", ".join(f"{n} {v}" for v, n in counts.items())
    parts = [
        f"# Triton kernel lab: report for `{Path(out_path).parent.name}`",
        "Every claim of the writeup, settled by this run's tables, then three findings (18-20): the writeup's lesson, "
        "\"test the case you didn't think to test\", applied to its own kernels. Verdicts: reproduced / reproduced "
        "with a nuance / false as stated; the point holds / not reproduced / needs a GPU / not settled (never guessed: "
        "a claim this run could not measure says so).",
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
