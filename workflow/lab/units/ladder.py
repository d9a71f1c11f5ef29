"""The ladder as a whole: what the kernels' tables say side by side. What fusion buys (claim 12), the
memory-bound kernels against the copy ceiling, what each of the project's improvements bought over the
writeup's kernel, and sizes past 2**31 elements across kernels (claim 20). It runs no experiment: every
declaration here names the tables of other units it reads."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .. import plots
from ..claims import NEEDS_GPU, NOT_REPRODUCED, NUANCE, REPRODUCED, bools, first_line, weakest
from ..providers import FLASH, FUSED, WRITEUP
from ..report import md_table
from ..summary import forward, median, needed, ok
from . import claim, figure, section
from .calibration import own_ceiling
from .relu_dropout import UNFUSED
from .softmax import BACKWARD_SLACK, NAIVE

if TYPE_CHECKING:  # annotations only: pyplot is imported on first use (plots.libs)
    import matplotlib.pyplot as plt

RUNG = 9  # after every rung
# The memory-bound kernels and the column their performance tables sweep.
MEMORY_BOUND = {"vector_add": "size", "relu_dropout": "size", "softmax": "n_cols"}
PERFORMANCE = tuple(f"{k}/performance" for k in MEMORY_BOUND)


# --- claims it settles --------------------------------------------------------------------------------------

@claim(12, ['relu_dropout/performance', 'softmax/performance'])
def fused_wins(t, s):
    if all(ok(t[k]).empty for k in ("relu_dropout/performance", "softmax/performance")):
        return ("the bytes each version moves are counted in code (the performance tables' bytes column), but "
                "time needs a GPU", NEEDS_GPU)
    f = needed(fusion(t), "forward time_ms rows of a fused kernel and its unfused peer in the performance tables")
    parts, verdicts = [], []
    for name, g in f.groupby("comparison", sort=False):
        g = g.sort_values("size")
        big = g.iloc[-1]
        wins = g["time_ratio"] > s["min_time_ratio"]
        text = (f"{name}: at {int(big['size'])} the unfused version moves {big['bytes_ratio']:.2f}x the bytes and takes "
                f"{big['time_ratio']:.2f}x the time")
        if wins.all():
            verdicts.append(REPRODUCED)
            text += f", and the fused kernel is faster at every size ({int(g['size'].min())}..{int(big['size'])})"
        elif wins.iloc[-1]:
            verdicts.append(NUANCE)
            crossover = int(g["size"][wins.astype(int)[::-1].cummin()[::-1].astype(bool)].min())
            losing = g[~wins]
            points = ", ".join(f"{r.time_ratio:.2f}x at {int(r.size)} ({r.fused_ms * 1e3:.1f} vs {r.unfused_ms * 1e3:.1f} us)"
                               for r in losing.itertuples())
            if not wins.iloc[0]:  # a crossover: fused loses from the smallest size up to some size
                floor = g["fused_ms"].iloc[0]
                why = ("per-call cost: the fused kernel takes within "
                       f"{s['launch_bound_growth']:g}x of its smallest-size time there"
                       if (losing["fused_ms"] <= s["launch_bound_growth"] * floor).all() else
                       "more than per-call cost")
                text += f"; below {crossover} the unfused version is as fast or faster ({points}): {why}"
            else:  # losses between sizes where fused wins: no crossover
                text += (f"; the fused kernel wins at every size but {points}, between sizes where it wins: "
                         "no crossover (why it loses there, this run does not say)")
        else:
            verdicts.append(NOT_REPRODUCED)
            text += " - the fused kernel is slower at the largest size"
        # a win by round trips: the time ratio follows the bytes ratio (both versions near one bandwidth)
        follows = big["time_ratio"] / big["bytes_ratio"]
        if wins.iloc[-1] and not 1 / s["bytes_slack"] <= follows <= s["bytes_slack"]:
            verdicts[-1] = NUANCE
            text += (f"; at {int(big['size'])} the time ratio is {follows:.2f}x the bytes ratio: "
                     + ("the unfused version costs more than its round trips" if follows > 1 else
                        "the fused kernel runs below the bandwidth its bytes allow, so round trips are not all of it"))
        parts.append(text)
    same_bytes = median(forward(t["relu_dropout/performance"]), "time_ms")
    if {WRITEUP, FUSED} <= set(same_bytes["provider"]):
        times = same_bytes.pivot_table(index="size", columns="provider", values="value")
        ratio = times[WRITEUP].iloc[-1] / times[FUSED].iloc[-1]
        text = (f"relu+dropout, the writeup's kernel vs the improved one (same bytes moved): {ratio:.2f}x the time at "
                f"{int(times.index[-1])}")
        if ratio >= s["flops_matter_ratio"]:
            verdicts.append(NUANCE)
            text += (" - there the lever was fewer operations, not fewer round trips: the writeup's kernel is bound by "
                     "its random numbers (one Philox evaluation per element)")
        parts.append(text)
    return "; ".join(parts), weakest(verdicts)


LIMIT_TABLES = ['vector_add/limits', 'relu_dropout/limits', 'softmax/limits', 'flash_attention/limits']


def _limits_correct(key: str, d: pd.DataFrame, s: dict) -> bool:
    """Did a probe that ran (status ok) compute the right thing? Per table, its own criterion."""
    if key == "vector_add/limits":
        return bool(needed(bools(d, "exact_match"), f"exact_match rows in {key}").all())
    if key == "relu_dropout/limits":
        v = {m: g["value"].iloc[0] for m, g in ok(d).groupby("metric")}
        good = (abs(v["tail_drop_rate"] - d["p"].iloc[0]) <= s["rate_tolerance"] and v["tail_survivors_max_ulp"] <= s["max_ulp"]
                and abs(v["tail_head_mask_agreement"] - v["expected_agreement"]) <= s["rate_tolerance"])
        return bool(good and v.get("backward_same_mask_tail", 1))
    if key == "softmax/limits":
        v = ok(d)
        if "tolerance" in v:  # each case within its own, scaled to its values (softmax.scaled_atol)
            return bool((v["value"] <= v["tolerance"]).all())
        atol = v["atol"].iloc[0]  # tables made before it: one absolute tolerance, BACKWARD_SLACK x for the backward
        return bool((needed(v[v["metric"] == "max_abs_diff"], f"max_abs_diff rows in {key}")["value"] <= atol).all()
                    and (v[v["metric"] == "backward_max_abs_diff"]["value"] <= BACKWARD_SLACK * atol).all())
    nonfinite = ok(d, metric="nonfinite_heads")["value"]
    return bool(needed(bools(d, "matches"), f"matches rows in {key}").all() and (nonfinite == 0).all())


def _where_wrong(g) -> str:
    """', wrong: dk at head 70399, ...; not finite: dk at 4864 heads from head 65536, ...' for a table
    that judges each output at the heads it checked and counts the heads holding a NaN or an infinity."""
    if "variant" not in g or "bh" not in g:
        return ""
    bad = ok(g, metric="matches")
    bad = bad[(bad["value"] == 0) & bad["bh"].notna()]
    text = (", wrong: " + ", ".join(f"{v} at head {int(b)}" for v, b in zip(bad["variant"], bad["bh"]))
            if len(bad) else "")
    counts = ok(g, metric="nonfinite_heads")
    first = ok(g, metric="first_nonfinite_head").set_index("variant")["value"]
    nonfinite = [f"{v} at {int(n)} heads from head {int(first[v])}" for v, n in zip(counts["variant"], counts["value"])
                 if n > 0 and v in first]
    if nonfinite:
        text += "; not finite: " + ", ".join(nonfinite)
    elif len(counts):
        text += "; every head finite"
    tiles = [f"{c[5:]} {g[c].dropna().iloc[0]}" for c in g.columns if c.startswith("tile_") and g[c].notna().any()]
    if (len(bad) or nonfinite) and tiles:  # what ran, for whoever looks into it
        text += f" (tiles: {', '.join(tiles)})"
    return text


@claim(20, LIMIT_TABLES)
def past_int32(t, s):
    """Finding: past 2^31 elements the printed kernels' int32 offsets fault; the project's kernels (64-bit
    offsets where needed, one folded grid axis for flash_attention) are right there and past 65535
    batch x heads."""
    parts, writeup_broke, project_right, measured_any, writeup_measured = [], True, True, False, False
    # the kernels as printed, run or not (needs_gpu): a table without them is older than the check
    needed([k for k in LIMIT_TABLES if "provider" in t[k] and (t[k]["provider"] == WRITEUP).any()],
           f"rows of {WRITEUP!r} (the kernels as printed) in the limits tables")
    for key in LIMIT_TABLES:
        d = t[key]
        by = ["provider"] + (["n_cols"] if "n_cols" in d else [])
        for (provider, *_), g in d.groupby(by, sort=False):
            status = g["status"].iloc[0]
            if status == "needs_gpu":
                continue
            measured_any = True
            shape = (f"{int(g['elements'].iloc[0])} elements" if "elements" in g and g["elements"].notna().any()
                     else f"{int(g['size'].iloc[0])} elements")
            if "heads" in g and g["heads"].notna().any():
                shape += f", batch x heads {int(g['batch'].iloc[0] * g['heads'].iloc[0])}"
                if "bh" in g and g["bh"].notna().any():  # 65535: the first past a grid axis's limit
                    shape += f" (checked at heads {', '.join(str(int(b)) for b in sorted(g['bh'].dropna().unique()))})"
            if status == "ok":
                right = _limits_correct(key, g, s)
                worst = ok(g, metric="max_abs_diff")["value"]
                # skipna=False: a NaN gradient is the worst difference there is, not one to leave out
                outcome = ("correct" if right else "WRONG") + (f" (max |diff| {worst.max(skipna=False):.2g})"
                                                               if len(worst) else "") + _where_wrong(g)
            else:
                right = False
                outcome = f"{status}: {first_line(g['error'].iloc[0])}"
            if provider == WRITEUP:
                writeup_measured = True
                writeup_broke &= not right
            else:
                project_right &= right
            parts.append(f"{key.split('/')[0]} {provider} at {shape}: {outcome}")
    if not measured_any:
        return "sizes past 2^31 elements take gigabytes of GPU memory: not run in the interpreter", NEEDS_GPU
    measured = "; ".join(parts)
    if not writeup_measured:
        return measured + "; the kernels as printed were not run here", NEEDS_GPU
    return measured, REPRODUCED if writeup_broke and project_right else NOT_REPRODUCED


# --- numbers derived from its tables ------------------------------------------------------------------------

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
FUSION = (("relu_dropout", WRITEUP, UNFUSED, "size"),
          ("relu_dropout", FUSED, UNFUSED, "size"),
          ("softmax", FUSED, NAIVE, "n_cols"))


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


# --- figures ------------------------------------------------------------------------------------------------

@figure("bandwidth", ["calibration/ceilings", *PERFORMANCE], "Performance", caption="""
Achieved bandwidth (GB/s: the bytes the op must move, counted in code, over the median time; band: p20 to p80)
of the memory-bound kernels and their torch peers, timed in the same job. ``triton_writeup`` is the writeup's
kernel as written, ``triton_fused`` / ``triton`` the project's. Dashed: the device-to-device copy bandwidth
measured in the same run. A point above it means the op moved fewer bytes than the count assumes (e.g. data
still in L2 at small sizes, or torch writing a smaller mask), not that it beat the memory system.""")
def figure_bandwidth(t):
    memory_bound = {k: t[f"{k}/performance"] for k in MEMORY_BOUND}
    copy = {k: own_ceiling(d, "copy_gbps", t["calibration/ceilings"]) for k, d in memory_bound.items()}
    return plot_bandwidth(memory_bound, copy)


@figure("ceiling_fraction", ["calibration/ceilings", *PERFORMANCE, "flash_attention/performance"], "Performance", caption="""
Best median throughput of each kernel and peer as a fraction of the ceiling measured in the same run: device
copy bandwidth for the memory-bound kernels, bf16 matmul TFLOP/s for attention.""")
def figure_ceiling_fraction(t):
    return plot_ceiling_fraction(ceiling_fractions(t))


@figure("fusion", ["relu_dropout/performance", "softmax/performance"], "Performance", caption="""
What fusion buys at each size: the median time of the unfused torch version over the median time of the fused
Triton kernel (above 1: fused is faster), for relu+dropout (the writeup's kernel and the improved one, against
``dropout(relu(x))``) and softmax (against the five-op max / subtract / exp / sum / divide version), per
dtype. At small sizes every call costs a fixed host and launch overhead, so the kernel that launches fewer
times does not always win there. Claim 12.""")
def figure_fusion(t):
    return plot_fusion(fusion(t), plots.device_of(t["softmax/performance"]))


def plot_bandwidth(tables: dict[str, pd.DataFrame], copy: dict[str, float | None]) -> plt.Figure:
    """Memory-bound kernels: achieved GB/s per provider with p20-p80 bands, and the copy ceiling each
    kernel's job measured on its GPU."""
    plt, _ = plots.libs()
    measured = {k: forward(v) for k, v in tables.items()}
    if all(v.empty for v in measured.values()):
        return plots.placeholder("memory-bound kernels: bandwidth", pd.concat(tables.values()))
    fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4.2), squeeze=False)
    for ax, (kernel, d) in zip(axes[0], measured.items()):
        x = MEMORY_BOUND[kernel]
        if kernel == "softmax":
            d = d[d["dtype"] == d["dtype"].iloc[0]].assign(provider=lambda f: f["provider"] + " " + f["dtype"])
        plots.band(ax, d, x, "provider", "bandwidth")
        copy_gbps = copy.get(kernel)
        if copy_gbps:
            ax.axhline(copy_gbps, color="black", ls="--", lw=1)
            ax.text(ax.get_xlim()[0], copy_gbps, f" device copy, measured: {copy_gbps:.0f} GB/s", va="bottom",
                    fontsize=8)
        ax.set(xscale="log", xlabel=x, ylabel="GB/s (bytes the op must move / time)", title=kernel)
    fig.suptitle(f"bandwidth, median and p20-p80 ({plots.device_of(pd.concat(tables.values()))})")
    fig.tight_layout()
    return fig


def plot_ceiling_fraction(fractions: pd.DataFrame) -> plt.Figure:
    """Best median throughput of every kernel and peer as a fraction of the ceiling that bounds it."""
    plt, sns = plots.libs()
    if fractions.empty:
        return plots.needs_gpu("fraction of the measured ceilings")
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(fractions) + 2))
    sns.barplot(data=fractions, y="label", x="fraction", hue="ceiling", dodge=False, ax=ax)
    ax.axvline(1.0, color="black", lw=1)
    sns.move_legend(ax, "upper center", bbox_to_anchor=(0.4, -0.12), ncol=2, title=None, frameon=False)
    ax.set(xlabel="fraction of the ceiling measured in the same run", ylabel="")
    ax.set_title(f"best median throughput / measured ceiling ({fractions['device'].iloc[0]})")
    fig.tight_layout()
    return fig


def plot_fusion(f: pd.DataFrame, device: str) -> plt.Figure:
    """Unfused time / fused time per size, one panel per kernel: above 1 the fused kernel is faster."""
    plt, sns = plots.libs()
    if f.empty:
        return plots.needs_gpu("fused vs unfused: time ratio", device)
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


# --- its report section -------------------------------------------------------------------------------------

@section([*PERFORMANCE])
def section_memory_bound(tables) -> str:
    out = ["\n### Memory-bound kernels: best median bandwidth and fraction of the copy ceiling\n"]
    for kernel, x in MEMORY_BOUND.items():
        copy = own_ceiling(tables[f"{kernel}/performance"], "copy_gbps")
        if copy:
            out.append(f"**{kernel}**\n\n" + md_table(peak_bandwidth(tables[f"{kernel}/performance"], copy, x)) + "\n")
    return "\n".join(out) if len(out) > 1 else ""


@section(["relu_dropout/performance", "softmax/performance"])
def section_fusion(tables) -> str:
    out = []
    f = fusion(tables)
    for kernel, g in f.groupby("kernel", sort=False) if not f.empty else ():
        wide = g.pivot_table(index="size", columns="pair", values="time_ratio")
        wide.columns.name = None
        wide.index.name = dict((k, x) for k, _, _, x in FUSION)[kernel]
        out.append(f"\n### What fusion buys, {kernel}: unfused time / fused time (median; > 1: fused is faster)\n\n"
                   + md_table(wide.reset_index(), ".2f"))
    return "\n".join(out)


@section(["relu_dropout/performance", "softmax/performance", "attention/performance"])
def section_improvements(tables: dict[str, pd.DataFrame]) -> str:
    """The writeup's kernel against the project's, same job, same shapes: what each change bought."""
    lines = []
    dr = median(forward(tables["relu_dropout/performance"]), "time_ms")
    if {WRITEUP, FUSED} <= set(dr["provider"]):
        t = dr.pivot_table(index="size", columns="provider", values="value")
        ratio = t[WRITEUP] / t[FUSED]
        lines.append(f"- relu+dropout, `tl.rand4x` instead of one `tl.rand` per element: the writeup's kernel takes "
                     f"{ratio.min():.2f}x..{ratio.max():.2f}x the time of the improved one ({ratio.iloc[-1]:.2f}x at "
                     f"{t.index[-1]} elements).")
    sm = median(forward(tables["softmax/performance"]), "time_ms")
    if {WRITEUP, FUSED} <= set(sm["provider"]):
        t = sm.pivot_table(index=["dtype", "n_cols"], columns="provider", values="value")
        ratio = (t[WRITEUP] / t[FUSED]).dropna()
        worst, best = ratio.idxmax(), ratio.idxmin()
        lines.append(f"- softmax, several narrow rows per program and split or two-pass paths for wide rows instead of one block "
                     f"per row: the writeup's kernel (block sized to the row) takes {ratio.min():.2f}x..{ratio.max():.2f}x "
                     f"the time of the improved one ({ratio.max():.2f}x at {worst[1]} columns, {worst[0]}; "
                     f"{ratio.min():.2f}x at {best[1]}, {best[0]}).")
    att = median(tables["attention/performance"], "time_ms")
    if {WRITEUP, FLASH} <= set(att["provider"]):
        t = att.pivot_table(index="n_q", columns="provider", values="value")
        ratio = (t[WRITEUP] / t[FLASH]).dropna()
        lines.append(f"- attention, tiles and online softmax instead of all of K/V at once (one head, "
                     f"d={int(att['d'].iloc[0])}, {att['dtype'].iloc[0]}): the writeup's kernel takes "
                     + ", ".join(f"{r:.2f}x at S={int(n)}" for n, r in ratio.items())
                     + " the time of flash_attention, and stops at its wall.")
    return ("\n### What each improvement bought (median time of the writeup's kernel / the project's)\n\n"
            + "\n".join(lines)) if lines else ""
