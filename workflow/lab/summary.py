"""Numbers derived from several tables, computed in one place for the report and the figures."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import runs

# The memory-bound kernels and the column their performance tables sweep.
MEMORY_BOUND = {"vector_add": "size", "relu_dropout": "size", "softmax": "n_cols"}


def failed(df: pd.DataFrame) -> bool:
    """Does this table record an experiment that raised (lab.runner's one-row 'failed' table)?"""
    return bool((df["status"] == "failed").any())


def ok(df: pd.DataFrame, **where) -> pd.DataFrame:
    d = df[df["status"] == "ok"]
    for col, val in where.items():
        d = d[d[col] == val] if col in d else d.iloc[:0]  # a table without the column has no such rows
    return d


def median(df: pd.DataFrame, metric: str, **where) -> pd.DataFrame:
    return ok(df, metric=metric, quantile=0.5, **where)


def forward(df: pd.DataFrame) -> pd.DataFrame:
    """The forward rows of a performance table that also times backward passes (column `direction`)."""
    return ok(df, direction="forward") if "direction" in df else ok(df)


def softmax_widths(df: pd.DataFrame, copy_gbps: float | None) -> pd.DataFrame:
    """Per direction, dtype and row width: median GB/s of the project's softmax, torch's and the writeup's
    kernel, torch's time over the project's (> 1: the project's is faster), and the fraction of copy."""
    d = median(df, "bandwidth")
    if d.empty or "direction" not in d:  # no timings, or a table from before the backward was timed
        return d.iloc[:0]
    wide = d.pivot_table(index=["direction", "dtype", "n_cols", "n_rows"], columns="provider", values="value")
    wide.columns.name = None
    out = wide.reset_index()
    out["torch/triton time"] = out["triton_fused"] / out["torch_softmax"]  # same bytes: GB/s ratio = time ratio
    if copy_gbps:
        out["triton/copy"] = out["triton_fused"] / copy_gbps
    return out.sort_values(["direction", "dtype", "n_cols"], ascending=[False, True, True]).reset_index(drop=True)


def ceilings(cal: pd.DataFrame) -> dict:
    """copy GB/s and bf16 matmul TFLOP/s (medians) and the device's properties (shared memory per block,
    per SM, device memory, ... as recorded); {} without a GPU."""
    if ok(cal).empty:
        return {}
    return {
        "copy_gbps": median(cal, "bandwidth", provider="device_copy")["value"].iloc[0],
        "matmul_tflops": median(cal, "throughput", provider="bf16_matmul")["value"].iloc[0],
        "device": cal["device"].iloc[0],
        **{m: int(g["value"].iloc[0]) for m, g in ok(cal, provider="device").groupby("metric")},
    }


# The columns lab.measure.ceiling_columns writes on every row of a timing table: what its job measured of
# its GPU before it started (a property of the machine, not of the point measured).
CEILINGS = ("copy_gbps", "matmul_tflops")


def own_ceiling(df: pd.DataFrame, name: str, cal: pd.DataFrame | None = None) -> float | None:
    """The ceiling ('copy_gbps' or 'matmul_tflops') a timing table's job measured on its own GPU before it
    started (lab.runner); a table from before that was recorded falls back to the calibration table's."""
    d = ok(df)
    if name in d and d[name].notna().any():
        return float(d[name].dropna().iloc[0])
    return ceilings(cal).get(name) if cal is not None else None


def peak_bandwidth(df: pd.DataFrame, copy_gbps: float, x: str = "size") -> pd.DataFrame:
    """Best median bandwidth per provider (and direction, dtype), and its fraction of the measured copy
    bandwidth."""
    d = median(df, "bandwidth")
    keys = (["direction"] if "direction" in d else []) + ["provider"] + (["dtype"] if d["dtype"].nunique() > 1 else [])
    best = d.loc[d.groupby(keys)["value"].idxmax(), keys + [x, "value"]]
    return best.assign(fraction_of_copy=best["value"] / copy_gbps).rename(columns={"value": "GB/s", x: f"at {x}"})


def fused_vs_unfused(df: pd.DataFrame, fused: str, unfused: str, x: str, **where) -> pd.DataFrame:
    """Per size: median time of each, and the unfused version's time and bytes over the fused one's
    (> 1: the fused kernel is faster / moves fewer bytes)."""
    t = median(df, "time_ms", **where)
    wide = t.pivot_table(index=x, columns="provider", values=["value", "bytes"])
    out = pd.DataFrame({"fused_ms": wide["value"][fused], "unfused_ms": wide["value"][unfused],
                        "bytes_ratio": wide["bytes"][unfused] / wide["bytes"][fused]})
    return out.assign(time_ratio=out["unfused_ms"] / out["fused_ms"]).reset_index().sort_values(x)


# (kernel table, fused provider, unfused provider, size column): what claim 12 and its figure compare
FUSION = (("relu_dropout", "triton_writeup", "torch_unfused", "size"),
          ("relu_dropout", "triton_fused", "torch_unfused", "size"),
          ("softmax", "triton_fused", "torch_naive", "n_cols"))


def fusion(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every FUSION comparison, per dtype and size, in one long frame."""
    parts = []
    for kernel, fused, unfused, x in FUSION:
        d = forward(tables[f"{kernel}/performance"])
        for dtype in sorted(d["dtype"].unique()) if len(d) else ():
            r = fused_vs_unfused(d, fused, unfused, x, dtype=dtype).rename(columns={x: "size"})
            pair = f"{fused} vs {unfused} ({dtype})"
            parts.append(r.assign(kernel=kernel, fused=fused, unfused=unfused, dtype=dtype, pair=pair,
                                  comparison=f"{kernel}: {pair}"))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def flash_vs_sdpa(df: pd.DataFrame, matmul_tflops: float | None) -> pd.DataFrame:
    """Median TFLOP/s per provider for every (mode, d, causal, seq), with ratios to SDPA's flash backend
    and to the fastest SDPA backend at that point."""
    d = median(df, "throughput")
    if d.empty:
        return d
    wide = d.pivot_table(index=["variant", "d", "causal", "seq", "batch"], columns="provider",
                         values="value").reset_index()
    wide.columns.name = None
    sdpa = [c for c in wide.columns if str(c).startswith("sdpa_")]
    if "sdpa_flash" in wide:
        wide["triton/sdpa_flash"] = wide["triton_flash"] / wide["sdpa_flash"]
    if sdpa:  # the best peer at each point, not the easiest one
        wide["best_sdpa"] = wide[sdpa].idxmax(axis=1)
        wide["triton/best_sdpa"] = wide["triton_flash"] / wide[sdpa].max(axis=1)
    if matmul_tflops:
        wide["triton/matmul"] = wide["triton_flash"] / matmul_tflops
    return wide


def wall(attn: pd.DataFrame) -> pd.DataFrame:
    """Per (dtype, d): the longest n_k that ran and the first that did not, with the shared memory asked."""
    out = []
    for (dtype, d), g in attn.groupby(["dtype", "d"]):
        ran = g[g["status"] == "ok"]["n_k"]
        failed = g[g["status"] == "out_of_resources"]
        out.append({"dtype": dtype, "d": int(d), "longest n_k that ran": int(ran.max()) if len(ran) else None,
                    "first n_k that failed": int(failed["n_k"].min()) if len(failed) else None,
                    "shared memory required (B)": int(failed["value"].iloc[0]) if len(failed) else None,
                    "limit (B)": int(failed["shared_limit"].iloc[0]) if len(failed) else None})
    return pd.DataFrame(out)


def ceiling_fractions(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (kernel, provider): best median throughput over the ceiling that bounds it, each
    measured by the same job on the same GPU."""
    cal = tables["calibration/ceilings"]
    rows, devices = [], set()
    for kernel, x in MEMORY_BOUND.items():
        perf = tables[f"{kernel}/performance"]
        copy = own_ceiling(perf, "copy_gbps", cal)
        if not copy or ok(perf).empty:
            continue
        devices.add(perf["device"].iloc[0])
        for r in peak_bandwidth(perf, copy, x).itertuples():
            label = (f"{kernel}{' ' + r.direction if hasattr(r, 'direction') else ''} / {r.provider}"
                     + (f" {r.dtype}" if hasattr(r, "dtype") else ""))
            rows.append({"label": label, "fraction": r.fraction_of_copy, "ceiling": "device copy GB/s"})
    perf = tables["flash_attention/performance"]
    matmul = own_ceiling(perf, "matmul_tflops", cal)
    flash = median(perf, "throughput")
    for (provider, variant), g in flash.groupby(["provider", "variant"]) if matmul else ():
        devices.add(perf["device"].iloc[0])
        rows.append({"label": f"attention {variant} / {provider}", "fraction": g["value"].max() / matmul,
                     "ceiling": "bf16 matmul TFLOP/s"})
    return pd.DataFrame(rows).assign(device=", ".join(sorted(devices))) if rows else pd.DataFrame()


def tuning(df: pd.DataFrame) -> pd.DataFrame:
    """Per FlashAttention kernel, head dim and causal: what tuning each length bucket bought. The
    untuned choice is the first candidate (the rows keep the candidates' order)."""
    d = ok(df, metric="tuning_ms")
    out = []
    for (kernel, block_d, causal), g in d.groupby(["variant", "block_d", "causal"], sort=True):
        per_bucket = [(b["value"].iloc[0] / b["value"].min(), b.loc[b["value"].idxmin(), "tile"])
                      for _, b in g.groupby("bucket_q")]
        out.append({"kernel": kernel, "d": int(block_d), "causal": bool(causal), "buckets": len(per_bucket),
                    "candidates": g.groupby("bucket_q").size().max(),
                    "winners": ", ".join(sorted({tile for _, tile in per_bucket})),
                    "first candidate / best, worst bucket": max(r for r, _ in per_bucket)})
    return pd.DataFrame(out)


def first_call(df: pd.DataFrame) -> dict[str, float]:
    """The cost of a new length: first-call milliseconds per variant (untuned_bucket, tuned_bucket) and
    peak bytes beyond the inputs of the first (tuning) and a later call."""
    d = ok(df)
    return {**{r.variant: r.value for r in d[d["metric"] == "first_call_ms"].itertuples()},
            **{f"{r.variant}_bytes": r.value for r in d[d["metric"] == "peak_extra_memory"].itertuples()}}


def invocations(run_dir) -> dict[str, pd.DataFrame]:
    """A run's job schedule (lab.runs.schedule) split by the commit that made each table: tables made by
    one commit come from one pipeline invocation, and a later invocation reruns only the tables whose
    code or settings changed, maybe on another machine, so times compare within one invocation."""
    jobs = runs.schedule(run_dir)
    if jobs.empty:
        return {}
    jobs["commit"] = [runs.recorded(Path(run_dir) / f"{t}.parquet")["git_commit"] for t in jobs["table"]]
    return {commit: g for commit, g in jobs.groupby("commit", sort=False)}


def launch_floor(df: pd.DataFrame) -> dict[str, float]:
    """Median microseconds per call on a 16-token problem, per provider."""
    d = median(df, "time_ms", variant="launch_floor")
    return {r.provider: r.value * 1e3 for r in d.itertuples()}

