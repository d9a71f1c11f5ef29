"""Figures from the experiment tables. Each function takes tidy frames and returns a matplotlib Figure;
every title names the op, the metric and the device."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from .summary import MEMORY_BOUND, forward  # noqa: E402
from .table import atomic_path  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook")


def device_of(df: pd.DataFrame) -> str:
    return ", ".join(sorted(df["device"].dropna().unique()))


def placeholder(title: str, df: pd.DataFrame) -> plt.Figure:
    """What a figure shows when its data could not be measured here (never an empty or fake plot)."""
    fig, ax = plt.subplots(figsize=(7, 2.5))
    reasons = "; ".join(sorted(df["error"].dropna().unique()))[:160] or "no data"
    ax.text(0.5, 0.5, f"not measured on {device_of(df)}\n{reasons}", ha="center", va="center", wrap=True)
    ax.set_axis_off()
    ax.set_title(title)
    return fig


def needs_gpu(title: str, device: str = "no GPU") -> plt.Figure:
    """The placeholder for a figure of timings when the run has none (Triton's interpreter)."""
    return placeholder(title, pd.DataFrame({"device": [device], "error": ["needs a GPU"]}))


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def _band(ax, df: pd.DataFrame, x: str, hue: str, metric: str):
    """Median line with a p20-p80 band per hue level."""
    d = df[df["metric"] == metric]
    wide = d.pivot_table(index=[hue, x], columns="quantile", values="value").reset_index()
    palette = dict(zip(sorted(wide[hue].unique()), sns.color_palette(n_colors=wide[hue].nunique())))
    for level, g in wide.groupby(hue):
        g = g.sort_values(x)
        ax.plot(g[x], g[0.5], marker="o", ms=3, label=level, color=palette[level])
        ax.fill_between(g[x], g[0.2], g[0.8], alpha=0.25, color=palette[level])
    ax.legend(fontsize=8)


def softmax_bug(df: pd.DataFrame, writeup_diff: float, writeup_n_cols: int) -> plt.Figure:
    d = _measured(df)
    raised = df[df["status"] == "raised"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    block = int(d.loc[d["variant"] == "hardcoded", "block_size"].iloc[0])
    for ax, metric, label in ((axes[0], "columns_dropped", "columns never written (log)"),
                              (axes[1], "max_abs_diff", "max |triton - torch| (log)")):
        sns.lineplot(data=d[d["metric"] == metric], x="n_cols", y="value", hue="variant", style="variant",
                     markers=True, dashes=False, ax=ax)
        ax.axvline(block, color="red", ls="--", lw=1)
        for n in raised["n_cols"].unique():  # where a call raised instead of returning
            ax.axvline(n, color="black", ls=":", lw=1)
            ax.text(n, 0.5, f"{int(n)}: {', '.join(sorted(raised[raised['n_cols'] == n]['variant']))} raised",
                    rotation=90, fontsize=7, ha="right", va="center", transform=ax.get_xaxis_transform())
        ax.set(xlabel="n_cols (log)", ylabel=label, xscale="log")
        if metric == "columns_dropped":  # 0 and up to 2^20: linear below 1, log above
            ax.set_yscale("symlog", linthresh=1)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
    axes[1].axhline(writeup_diff, color="grey", ls=":", lw=1)
    axes[1].annotate(f"writeup at n_cols={writeup_n_cols}: {writeup_diff:g}", (writeup_n_cols, writeup_diff),
                     xytext=(-4, 4), ha="right", textcoords="offset points", fontsize=8, color="grey")
    for ax in axes:
        ax.text(block, 0.02, f" BLOCK_SIZE={block}", color="red", fontsize=9, transform=ax.get_xaxis_transform())
    fig.suptitle(f"softmax: the hard-coded BLOCK_SIZE bug vs the fix ({device_of(df)})")
    fig.tight_layout()
    return fig


def attention_head_dims(df: pd.DataFrame) -> plt.Figure:
    """Max error against fp64 per head dim: the writeup's kernel as printed and with the head-dim mask."""
    d = _measured(df)
    d = d[d["metric"] == "max_abs_diff"]
    if d.empty:
        return placeholder("attention: error vs head dim", df)
    d = d.assign(series=d["provider"].map({"triton_writeup": "as printed", "triton": "with the head-dim mask"})
                 .fillna(d["provider"]) + ", " + d["dtype"])
    fig, ax = plt.subplots(figsize=(8, 4.4))
    sns.lineplot(data=d, x="d", y="value", hue="series", style="series", markers=True, dashes=False, ax=ax)
    for dim in sorted(d["d"].unique()):
        if int(dim) & (int(dim) - 1) == 0:
            ax.axvline(dim, color="grey", lw=0.6, ls=":")
    ax.set(yscale="log", xlabel="head dim d (dotted: powers of two)", ylabel="max |out - fp64 reference| (log)",
           title=f"the writeup's attention kernel at every head dim, n_q={int(d['n_q'].iloc[0])}, "
                 f"n_k={int(d['n_k'].iloc[0])} ({device_of(df)})")
    ax.title.set_fontsize(9)
    sns.move_legend(ax, "best", fontsize=8, title=None)
    fig.tight_layout()
    return fig


def dropout_rates(df: pd.DataFrame) -> plt.Figure:
    """Each seed's drop rate minus p, in binomial standard deviations, with the writeup's band."""
    d = _measured(df)
    rates = d[d["metric"] == "drop_rate"].copy()
    rates["sigmas"] = (rates["value"] - rates["p"]) / rates["sigma"]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    sns.stripplot(data=rates, x="p", y="sigmas", hue="provider", dodge=True, ax=ax, alpha=0.5, size=3, jitter=0.2)
    for i, (p, g) in enumerate(rates.groupby("p")):
        band = g["tolerance"].iloc[0] / g["sigma"].iloc[0]
        ax.hlines([-band, band], i - 0.45, i + 0.45, colors="grey", linestyles=":")
        ax.text(i + 0.45, band, f"+/-{g['tolerance'].iloc[0]:g}", fontsize=7, color="grey", ha="right", va="bottom")
    ax.axhline(0, color="black", lw=1)
    n_seeds = rates.groupby(["p", "provider"]).size().iloc[0]
    ax.set(xlabel="p", ylabel="(drop rate - p) / binomial sigma",
           title=f"relu_dropout: drop rate over {n_seeds} seeds, size {int(rates['size'].iloc[0])}; dotted: the "
                 f"writeup's band ({device_of(df)})")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def bandwidth(tables: dict[str, pd.DataFrame], copy: dict[str, float | None]) -> plt.Figure:
    """Memory-bound kernels: achieved GB/s per provider with p20-p80 bands, and the copy ceiling each
    kernel's job measured on its GPU."""
    measured = {k: forward(v) for k, v in tables.items()}
    if all(v.empty for v in measured.values()):
        return placeholder("memory-bound kernels: bandwidth", pd.concat(tables.values()))
    fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4.2), squeeze=False)
    for ax, (kernel, d) in zip(axes[0], measured.items()):
        x = MEMORY_BOUND[kernel]
        if kernel == "softmax":
            d = d[d["dtype"] == d["dtype"].iloc[0]].assign(provider=lambda f: f["provider"] + " " + f["dtype"])
        _band(ax, d, x, "provider", "bandwidth")
        copy_gbps = copy.get(kernel)
        if copy_gbps:
            ax.axhline(copy_gbps, color="black", ls="--", lw=1)
            ax.text(ax.get_xlim()[0], copy_gbps, f" device copy, measured: {copy_gbps:.0f} GB/s", va="bottom",
                    fontsize=8)
        ax.set(xscale="log", xlabel=x, ylabel="GB/s (bytes the op must move / time)", title=kernel)
    fig.suptitle(f"bandwidth, median and p20-p80 ({device_of(pd.concat(tables.values()))})")
    fig.tight_layout()
    return fig


def _outcome(df: pd.DataFrame) -> pd.Series:
    """Per launch: 'ran, correct' only where its 'matches' row says so (FlashAttention rule), else why not."""
    judged = df[df["metric"] == "matches"].set_index(["series", "n_k"])["value"].astype(bool)
    out = df["status"].map({"out_of_resources": "failed: out of shared memory",
                            "compiled_only": "compiled for sm_90 only"})
    ran = df["status"] == "ok"
    right = [judged.get((s, n)) for s, n in zip(df["series"], df["n_k"])]
    out[ran] = ["ran, correct" if r else "ran, WRONG" if r is not None else "ran, not judged"
                for r, is_ran in zip(right, ran) if is_ran]
    return out.fillna(df["status"])


def wall(attn: pd.DataFrame, flash: pd.DataFrame) -> plt.Figure:
    """Top: which n_k each kernel handles (the writeup's fails at its wall, flash runs on), each length its
    own column so that 2^i and 2^i + 1 never hide each other. Bottom: the shared memory the writeup's
    kernel asks for against the per-block limit."""
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 7.5), height_ratios=[1.1, 1])
    attn, flash = attn[attn["n_k"].notna()], flash[flash["n_k"].notna()]  # not the memory rows
    a = attn.assign(series="writeup attention, " + attn["dtype"] + " d=" + attn["d"].astype(int).astype(str))
    f = flash.assign(series="flash_attention, " + flash["dtype"] + " d=" + flash["d"].astype(int).astype(str))
    both = pd.concat([a, f], ignore_index=True)
    both["outcome"] = _outcome(both)
    points = both[(both["metric"] == "max_abs_diff") | (both["status"] != "ok")]  # one point per launch
    order = sorted(int(n) for n in points["n_k"].unique())
    points = points.assign(column=points["n_k"].astype(int).map({n: i for i, n in enumerate(order)}))
    styles = {"ran, correct": ("o", "tab:green"), "ran, WRONG": ("D", "tab:orange"), "ran, not judged": ("o", "tab:olive"),
              "failed: out of shared memory": ("X", "tab:red"), "compiled for sm_90 only": ("s", "tab:grey")}
    present = [o for o in styles if o in set(points["outcome"])]
    sns.scatterplot(data=points, x="column", y="series", hue="outcome", style="outcome", s=60, ax=ax, hue_order=present,
                    style_order=present, markers={o: styles[o][0] for o in present},
                    palette={o: styles[o][1] for o in present})
    ax.set_xticks(range(len(order)), [str(n) for n in order], rotation=60, fontsize=7)
    ax.set(xlabel="n_k (keys; powers of two and one past each, one column each)", ylabel="")
    ax.set_title(f"attention: the shared-memory wall ({device_of(both)})")
    need = attn[attn["metric"] == "shared_required"].copy()
    need["series"] = need["dtype"] + " d=" + need["d"].astype(int).astype(str)
    sns.lineplot(data=need.assign(KiB=need["value"] / 1024), x="n_k", y="KiB", hue="series", marker="o", ax=ax2)
    limit = attn["shared_limit"].dropna() if "shared_limit" in attn else pd.Series(dtype=float)
    if len(limit):
        ax2.axhline(limit.iloc[0] / 1024, color="red", ls="--", lw=1)
        ax2.text(need["n_k"].min(), limit.iloc[0] / 1024, f" limit per block: {limit.iloc[0] / 1024:.0f} KiB",
                 color="red", va="bottom", fontsize=8)
    ax2.set(xscale="log", yscale="log", xlabel="n_k", ylabel="shared memory asked for (KiB)",
            title="shared memory the writeup's kernel needs (compiled for sm_90)")
    fig.tight_layout()
    return fig


def flash_performance(df: pd.DataFrame, matmul_tflops: float | None) -> plt.Figure:
    d = _measured(df)
    d = d[d["metric"] == "throughput"]
    if d.empty:
        return placeholder("flash_attention: TFLOP/s vs SDPA", df)
    d = d.assign(case=lambda f: f["variant"] + ", d=" + f["d"].astype(int).astype(str)
                 + f["causal"].astype(bool).map({True: ", causal", False: ", not causal"}))
    cases = sorted(d["case"].unique())
    cols = 4
    rows = -(-len(cases) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        _band(ax, d[d["case"] == case], "seq", "provider", "throughput")
        if matmul_tflops:
            ax.axhline(matmul_tflops, color="black", ls="--", lw=1)
        ax.set(xscale="log", xlabel="sequence length", ylabel="TFLOP/s", title=case)
    for ax in axes.flat[len(cases):]:
        ax.set_axis_off()
    tokens = int((d["batch"] * d["seq"]).max())
    fig.suptitle(f"flash_attention vs SDPA backends, {d['dtype'].iloc[0]}, batch x seq = {tokens} (batch = {tokens} / seq), "
                 f"H={int(d['heads'].iloc[0])} (dashed: bf16 matmul measured by the same job) ({device_of(df)})")
    fig.tight_layout()
    return fig


def flash_memory(df: pd.DataFrame) -> plt.Figure:
    d = _measured(df)
    d = d[d["metric"] == "peak_extra_memory"]
    if d.empty:
        return placeholder("attention: peak memory vs sequence length", df)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=d.assign(MiB=d["value"] / 2**20), x="seq", y="MiB", hue="provider", marker="o", ax=ax)
    ax.set(xscale="log", yscale="log", xlabel="sequence length",
           ylabel="peak memory beyond q, k, v (MiB)",
           title=f"attention memory: O(N) flash vs O(N^2) math ({device_of(df)})")
    fig.tight_layout()
    return fig


def softmax_widths(w, copy_gbps: float | None, device: str) -> plt.Figure:
    """softmax GB/s against row width, forward and backward: the project's kernel, torch, the writeup's."""
    if w.empty:
        return needs_gpu("softmax at every row width", device)
    providers = [p for p in ("triton_fused", "torch_softmax", "triton_writeup") if p in w]
    long = w.melt(id_vars=["direction", "dtype", "n_cols"], value_vars=providers, var_name="provider",
                  value_name="GB/s").dropna()
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 4.4), sharey=True)
    for ax, direction in zip(axes, ("forward", "backward")):
        sns.lineplot(data=long[long["direction"] == direction], x="n_cols", y="GB/s", hue="provider", style="dtype",
                     marker="o", ax=ax)
        if copy_gbps:
            ax.axhline(copy_gbps, color="black", ls="--", lw=1)
            ax.axhline(0.9 * copy_gbps, color="grey", ls=":", lw=1)
            ax.text(w["n_cols"].min(), copy_gbps, f" device copy {copy_gbps:.0f} GB/s; dotted: 0.9 of it",
                    va="bottom", fontsize=8)
        ax.set(xscale="log", xlabel="n_cols (every input the same size)", ylabel="GB/s (bytes the op must move / time)",
               title=direction)
    handles, labels = axes[0].get_legend_handles_labels()  # the forward panel has every provider
    for ax in axes:
        ax.get_legend().remove()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle(f"softmax at every row width, median ({device})")
    fig.tight_layout(rect=(0, 0, 0.89, 1))
    return fig


def save(fig: plt.Figure, path: str) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def ceiling_fraction(fractions: pd.DataFrame) -> plt.Figure:
    """Best median throughput of every kernel and peer as a fraction of the ceiling that bounds it."""
    if fractions.empty:
        return needs_gpu("fraction of the measured ceilings")
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(fractions) + 2))
    sns.barplot(data=fractions, y="label", x="fraction", hue="ceiling", dodge=False, ax=ax)
    ax.axvline(1.0, color="black", lw=1)
    sns.move_legend(ax, "upper center", bbox_to_anchor=(0.4, -0.12), ncol=2, title=None, frameon=False)
    ax.set(xlabel="fraction of the ceiling measured in the same run", ylabel="")
    ax.set_title(f"best median throughput / measured ceiling ({fractions['device'].iloc[0]})")
    fig.tight_layout()
    return fig


def fusion(f: pd.DataFrame, device: str) -> plt.Figure:
    """Unfused time / fused time per size, one panel per kernel: above 1 the fused kernel is faster."""
    if f.empty:
        return needs_gpu("fused vs unfused: time ratio", device)
    kernels = list(dict.fromkeys(f["kernel"]))
    fig, axes = plt.subplots(1, len(kernels), figsize=(6 * len(kernels), 4.4), squeeze=False)
    xlabel = {"relu_dropout": "elements", "softmax": "n_cols (inputs of the same size)"}
    for ax, kernel in zip(axes[0], kernels):
        g = f[f["kernel"] == kernel]
        sns.lineplot(data=g, x="size", y="time_ratio", hue="pair", marker="o", ax=ax)
        ax.axhline(1.0, color="black", lw=1)
        ax.set(xscale="log", yscale="log", xlabel=xlabel.get(kernel, "size"), ylabel="unfused time / fused time (median)",
               title=kernel)
        sns.move_legend(ax, "best", fontsize=7, title=None)
    fig.suptitle(f"what fusion buys, by size: above 1 the fused kernel is faster ({device})")
    fig.tight_layout()
    return fig


def flash_vs_best_sdpa(wide: pd.DataFrame, device: str) -> plt.Figure:
    """flash_attention's TFLOP/s over the fastest SDPA backend's at each point."""
    if wide.empty or "triton/best_sdpa" not in wide:
        return needs_gpu("flash_attention / best SDPA", device)
    d = wide.assign(case=lambda w: w["variant"] + ", d=" + w["d"].astype(int).astype(str)
                    + w["causal"].astype(bool).map({True: ", causal", False: ", not causal"}))
    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    sns.lineplot(data=d, x="seq", y="triton/best_sdpa", hue="case", style="variant", marker="o", ax=ax)
    ax.axhline(1.0, color="black", lw=1)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title=None)
    best = ", ".join(sorted(d["best_sdpa"].unique()))
    ax.set(xscale="log", xlabel="sequence length (batch x seq constant)",
           ylabel="flash_attention / best SDPA (TFLOP/s)",
           title=f"flash_attention against the fastest SDPA backend ({best}) ({device})")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def call_latency(floor: dict[str, float], device: str) -> plt.Figure:
    """Microseconds per call on a problem too small to keep the GPU busy."""
    if not floor:
        return needs_gpu("per-call latency", device)
    d = pd.DataFrame({"provider": list(floor), "us": list(floor.values())}).sort_values("us")
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.barplot(data=d, y="provider", x="us", ax=ax, color="tab:blue")
    for i, us in enumerate(d["us"]):
        ax.text(us, i, f" {us:.0f}", va="center", fontsize=8)
    ax.set(xlabel="median time per call (us), B=1 H=1 S=16 D=64", ylabel="",
           title=f"attention: per-call latency ({device})")
    fig.tight_layout()
    return fig
