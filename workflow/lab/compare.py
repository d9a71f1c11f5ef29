"""Two runs side by side: every timed point both measured, the ratio of medians, and whether the
difference lies outside both runs' p20..p80 bands (otherwise it is within run-to-run spread)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .provenance import COLUMNS as PROVENANCE

# Columns that describe a measurement's outcome or the machine's choices, not the point measured.
NOT_PARAMETERS = set(PROVENANCE) | {"value", "unit", "status", "error", "quantile", "sdpa_backend"}
HIGHER_IS_BETTER = {"bandwidth": True, "throughput": True, "time_ms": False}


def _points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per timed point: its parameters and the p20/p50/p80 of the value."""
    d = df[(df["status"] == "ok") & df["metric"].isin(list(HIGHER_IS_BETTER))]
    if d.empty:
        return pd.DataFrame()
    params = [c for c in d.columns if c not in NOT_PARAMETERS and not c.startswith("tile_")
              and d[c].notna().any()]
    d = d.assign(**{c: d[c].astype(str) for c in params})
    wide = d.pivot_table(index=params, columns="quantile", values="value").reset_index()
    return wide.rename(columns={0.2: "p20", 0.5: "p50", 0.8: "p80"})


def compare(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Join the timed points of two runs ('kernel/experiment' -> table) on their parameters."""
    out = []
    for key in sorted(set(a) & set(b)):
        pa, pb = _points(a[key]), _points(b[key])
        if pa.empty or pb.empty:
            continue
        on = [c for c in pa.columns if c in pb.columns and c not in ("p20", "p50", "p80")]
        j = pa.merge(pb, on=on, suffixes=("_a", "_b"))
        j["table"] = key
        j["ratio"] = j["p50_b"] / j["p50_a"]
        j["outside_both_bands"] = (((j["p50_b"] < j["p20_a"]) | (j["p50_b"] > j["p80_a"]))
                                   & ((j["p50_a"] < j["p20_b"]) | (j["p50_a"] > j["p80_b"])))
        better = j["metric"].map(HIGHER_IS_BETTER)
        j["b_is"] = "same"
        j.loc[j["outside_both_bands"], "b_is"] = ((j["ratio"] > 1) == better).map({True: "better", False: "worse"})
        out.append(j)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _origin(tables: dict[str, pd.DataFrame]) -> str:
    rows = pd.concat(tables.values(), ignore_index=True)
    keys = ["device", "backend", "torch", "triton", "cuda", "driver", "git_commit"]
    return ", ".join(f"{k} {'/'.join(sorted(map(str, rows[k].dropna().unique())))}" for k in keys if k in rows)


def markdown(name_a: str, name_b: str, a: dict, b: dict, joined: pd.DataFrame) -> str:
    lines = [f"# `{name_a}` vs `{name_b}`", "",
             f"- **{name_a}**: {_origin(a)}", f"- **{name_b}**: {_origin(b)}", "",
             f"Every timed point both runs measured (medians of `triton.testing.do_bench`). ratio = {name_b} / "
             f"{name_a}. A point is marked only where the difference lies outside **both** runs' p20..p80 bands; "
             "anything else is within the spread of a single run. A single run's bands are narrow (GPU timings repeat "
             "closely within a run), so small run-to-run shifts (clocks, placement) are marked too: read the ratio, "
             "not only the mark.", ""]
    if joined.empty:
        return "\n".join(lines + ["No timed point was measured by both runs (a run without a GPU times nothing)."]) + "\n"
    main = joined[joined["metric"] != "time_ms"]  # bandwidth / throughput; time_ms says the same inverted
    summary = main.groupby("table").agg(points=("ratio", "size"), median_ratio=("ratio", "median"),
                                        better=("b_is", lambda s: int((s == "better").sum())),
                                        worse=("b_is", lambda s: int((s == "worse").sum())),
                                        largest_change=("ratio", lambda r: (r - 1).abs().max())).reset_index()
    lines += ["## Summary", "", _md(summary), ""]
    for key, g in main.groupby("table"):
        skip = {"table", "ratio", "outside_both_bands", "b_is", "metric", "unit"}
        params = [c for c in g.columns if c not in skip and not c.startswith(("p20", "p50", "p80"))
                  and (c == "provider" or g[c].nunique() > 1)]
        show = g[params + ["p50_a", "p50_b", "ratio", "b_is"]].rename(
            columns={"p50_a": f"{name_a} p50", "p50_b": f"{name_b} p50", "b_is": f"{name_b} is"})
        lines += [f"## {key} ({g['metric'].iloc[0]})", "", _md(show), ""]
    return "\n".join(lines)


def _md(df: pd.DataFrame) -> str:
    def fmt(v):
        return format(v, ".3g") if isinstance(v, float) else str(v)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    return "\n".join([head, "|" + "---|" * len(df.columns)]
                     + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False)])


def figure(name_a: str, name_b: str, joined: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(9, 4.5))
    main = joined[joined["metric"] != "time_ms"] if not joined.empty else joined
    if main.empty:
        ax.text(0.5, 0.5, "no timed point measured by both runs", ha="center", va="center")
        ax.set_axis_off()
    else:
        sns.stripplot(data=main, x="ratio", y="table", hue="b_is", hue_order=["same", "better", "worse"],
                      palette={"same": "tab:grey", "better": "tab:green", "worse": "tab:red"}, jitter=0.25, ax=ax)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xscale("log")
        ax.set(xlabel=f"{name_b} / {name_a}, median throughput (GB/s or TFLOP/s)", ylabel="")
        ax.legend(title=f"{name_b} is (outside both p20..p80 bands)", fontsize=8, title_fontsize=8)
    ax.set_title(f"{name_b} vs {name_a}: every timed point")
    fig.tight_layout()
    return fig


def run_tables(run_dir: str | Path) -> dict[str, Path]:
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(Path(run_dir).glob("*/*.parquet"))}
