"""Two runs side by side, the way A/B kernel benchmarks are read (TritonBench, PyTorch's regression dashboards).

Per timed point both runs measured: the ratio of medians, oriented so that > 1 means run b is better
(b/a for throughput and bandwidth; a/b for time_ms, used only where a point has no throughput or bandwidth),
its log2 (+1 = twice as fast, -1 = half as fast), and a verdict: `same` unless |log2 ratio| > log2(1 + threshold),
with threshold = max(FLOOR, K * hypot(spread_a, spread_b)), a run's spread being its p20..p80 width over its
median. Then `better` (ratio > 1) or `worse`. Launch-bound points (median time under LAUNCH_BOUND_MS in
either run) are summarised apart. First on the page: the claims' verdicts of both runs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from . import claims as claims_mod
from .provenance import COLUMNS as PROVENANCE
from .report import md_cell
from .summary import CEILINGS
from .table import read_each

# Run-to-run spread of GPU timings across processes and machines (boost clocks, temperature, which GPU,
# where memory lands) is typically a few percent, even where one run's own p20..p80 band is under 1%:
# a difference under 5% is never called a change.
FLOOR = 0.05
# A point's own noise counts too: the change must exceed K times both runs' relative p20..p80 widths
# added in quadrature (K = 1: wider than the two bands together), so a noisy point needs a larger change.
K = 1.0
# Under ~20 us a timing is mostly launch and host overhead (a few us per launch, more through Python
# wrappers and SDPA dispatch): it moves with the host, not the kernel.
LAUNCH_BOUND_MS = 0.020

TIMED = ("throughput", "bandwidth", "time_ms")  # time_ms only where a point has neither of the others
VERDICTS = ("same", "better", "worse")
# Columns that describe a measurement's outcome or the machine's choices, not the point measured.
NOT_PARAMETERS = set(PROVENANCE) | set(CEILINGS) | {"metric", "value", "unit", "status", "error", "quantile", "sdpa_backend"}
MEASURED = ("p20", "p50", "p80", "time_ms")
OUTCOME = [f"{m}_{s}" for m in MEASURED for s in "ab"] + ["ratio", "log2_ratio", "threshold", "launch_bound", "verdict"]


def _quantiles(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, metric): its parameters and the p20/p50/p80 of the value (NaN parameters kept)."""
    d = df[df["metric"].isin(TIMED)] if "metric" in df else df.iloc[:0]
    if "status" in d:
        d = d[d["status"] == "ok"]
    if d.empty:
        return pd.DataFrame()
    d = d.assign(quantile=d["quantile"].fillna(0.5) if "quantile" in d else 0.5)
    keys = [c for c in d.columns if c not in NOT_PARAMETERS and not c.startswith("tile") and d[c].notna().any()]
    q = d.groupby(keys + ["metric", "quantile"], dropna=False)["value"].median().unstack("quantile")
    q = q.reindex(columns=[0.2, 0.5, 0.8]).set_axis(["p20", "p50", "p80"], axis=1)
    q["p20"], q["p80"] = q["p20"].fillna(q["p50"]), q["p80"].fillna(q["p50"])  # a run without quantiles
    return q.reset_index()


def _points(df: pd.DataFrame) -> pd.DataFrame:
    """Each point once, by throughput or bandwidth where it has one, with its median time beside it."""
    q = _quantiles(df)
    if q.empty:
        return q
    params = [c for c in q.columns if c not in ("metric", *MEASURED)]
    rate = q["metric"] != "time_ms"
    has_rate = rate.groupby([q[c] for c in params], dropna=False).transform("any")
    time = q.loc[~rate, params + ["p50"]].rename(columns={"p50": "time_ms"})
    return q[rate | ~has_rate].merge(time, on=params, how="left")


def _pairs(pa: pd.DataFrame, pb: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The points both runs measured, joined on the parameters both have, and those parameters. A parameter
    one run alone has (an older version's table) is left out where it has one value there; where it tells
    points apart, the other run's points cannot be told which they are: none are paired. Nor are points
    whose median is zero or missing (no ratio to take). coverage() lists what is left out."""
    on = [c for c in pa.columns if c in pb.columns and c not in MEASURED]
    if pa.empty or pb.empty:
        return pd.DataFrame(), on
    own = [(t, c) for t, other in ((pa, pb), (pb, pa)) for c in t.columns if c not in other.columns]
    if any(t[c].nunique(dropna=False) > 1 for t, c in own):
        return pd.DataFrame(), on
    j = pa.merge(pb, on=on, suffixes=("_a", "_b"))
    measured = np.isfinite(j[["p50_a", "p50_b"]]).all(axis=1) & (j[["p50_a", "p50_b"]] > 0).all(axis=1)
    return j[measured], on


def compare(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every timed point both runs measured ('kernel/experiment' -> table), one tidy row each, sorted."""
    out = []
    for key in sorted(set(a) & set(b)):
        j, on = _pairs(_points(a[key]), _points(b[key]))
        if not j.empty:
            out.append(j.assign(table=key).sort_values(on, key=_sort_key, na_position="last", kind="stable"))
    j = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    if j.empty:
        return pd.DataFrame(columns=["table", "metric", "ratio", "log2_ratio", "threshold", "launch_bound", "verdict"])
    j["ratio"] = np.where(j["metric"] == "time_ms", j["p50_a"] / j["p50_b"], j["p50_b"] / j["p50_a"])
    j["log2_ratio"] = np.log2(j["ratio"])
    spread = {s: (j[f"p80_{s}"] - j[f"p20_{s}"]).abs() / j[f"p50_{s}"] for s in "ab"}
    j["threshold"] = np.maximum(FLOOR, K * np.hypot(spread["a"], spread["b"]))
    j["launch_bound"] = np.fmin(j["time_ms_a"], j["time_ms_b"]) < LAUNCH_BOUND_MS
    changed = j["log2_ratio"].abs() > np.log2(1 + j["threshold"])
    j["verdict"] = np.select([~changed, j["ratio"] > 1], ["same", "better"], "worse")
    return _tidy(j)


def coverage(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """What `compare` could not join: per table, its timed points in a, in b and in both, where a table is
    in one run only, failed in one (``why``: its first failed row's error, or the reason it cannot be read), or
    has points the other run did not measure."""
    rows = []
    for key in sorted(set(a) | set(b)):
        states, points, why = {}, {}, []
        for side, tables in (("a", a), ("b", b)):
            t = tables.get(key)
            failed = t["status"].eq("failed") if t is not None and "status" in t else pd.Series(dtype=bool)
            states[side] = "absent" if t is None else "failed" if failed.any() else ""
            points[side] = _points(t) if not states[side] else pd.DataFrame()
            if failed.any() and "error" in t:
                why += [str(e).splitlines()[0][:200] for e in t.loc[failed, "error"].dropna()[:1]]
        pa, pb = points["a"], points["b"]
        both = len(_pairs(pa, pb)[0])
        if states["a"] or states["b"] or both != len(pa) or both != len(pb):
            rows.append(dict(table=key, a=states["a"] or len(pa), b=states["b"] or len(pb), both=both,
                             why=" / ".join(why)))
    return pd.DataFrame(rows, columns=["table", "a", "b", "both", "why"])


def _tidy(j: pd.DataFrame) -> pd.DataFrame:
    """Parameters first, integral ones as integers (their NaN kept as <NA>)."""
    params = [c for c in j.columns if c not in OUTCOME and c not in ("table", "metric")]
    for c in params:
        s = j[c]
        if pd.api.types.is_float_dtype(s) and s.notna().any() and (s.dropna() % 1 == 0).all():
            j[c] = s.astype("Int64")
        elif s.dtype == object and s.dropna().map(type).nunique() > 1:  # mixed types across tables: parquet can't
            j[c] = s.map(lambda v: v if pd.isna(v) else str(v))
    return j[["table", *params, "metric", *OUTCOME]].reset_index(drop=True)


def _sort_key(s: pd.Series) -> pd.Series:
    return s if pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s) else s.astype("string")


def claims_diff(claims: list[dict], a: dict, b: dict) -> tuple[pd.DataFrame, dict[str, str]]:
    """Both runs' verdicts per claim (changed first), and why a run could not be settled."""
    verdicts, errors = {}, {}
    for side, tables in (("a", a), ("b", b)):
        try:
            verdicts[side] = claims_mod.settle(claims, tables).set_index("id")[["claim", "verdict"]]
        except Exception as e:  # an old run missing a table, a check that no longer fits its rows, ...
            errors[side] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            verdicts[side] = pd.DataFrame({"claim": [c["claim"] for c in claims], "verdict": ""},
                                          index=pd.Index([c["id"] for c in claims], name="id"))
    d = verdicts["a"].merge(verdicts["b"], how="outer", left_index=True, right_index=True, suffixes=("_a", "_b"))
    d = d.assign(claim=d["claim_a"].fillna(d["claim_b"]), verdict_a=d["verdict_a"].fillna(""),
                 verdict_b=d["verdict_b"].fillna("")).reset_index()
    known = (d["verdict_a"] != "") & (d["verdict_b"] != "")
    d["changed"] = np.where(known, np.where(d["verdict_a"] != d["verdict_b"], "yes", "no"), "unknown")
    d = d.assign(order=d["changed"].map({"yes": 0, "unknown": 1, "no": 2})).sort_values(["order", "id"])
    return d[["id", "claim", "verdict_a", "verdict_b", "changed"]].reset_index(drop=True), errors


def _origin(tables: dict[str, pd.DataFrame]) -> str:
    if not tables:
        return "no tables"
    rows = pd.concat(tables.values(), ignore_index=True)
    keys = ["device", "backend", "torch", "triton", "cuda", "driver", "git_commit"]
    return ", ".join(f"{k} {'/'.join(sorted(map(str, rows[k].dropna().unique())))}" for k in keys if k in rows)


def _change(r: float) -> str:
    return f"{r:.2f}x faster" if r >= 1 else f"{1 / r:.2f}x slower"


def _summary(points: pd.DataFrame) -> pd.DataFrame:
    from scipy.stats import gmean  # here, not at the top: the workflow imports this module to plan every run

    def one(g):
        top = g.loc[g["log2_ratio"].abs().idxmax(), "ratio"]
        return pd.Series({"metric": ", ".join(sorted(g["metric"].unique())), "points": len(g),
                          "geomean ratio": gmean(g["ratio"]), **{v: int((g["verdict"] == v).sum()) for v in VERDICTS},
                          "largest change": _change(top)})
    rows = [one(g).rename(k) for k, g in points.groupby("table")] + [one(points).rename("all")]
    return pd.DataFrame(rows).rename_axis("table").reset_index()


def _shown(g: pd.DataFrame, name_a: str, name_b: str, extra=()) -> pd.DataFrame:
    """A table's points with the parameters that vary in it, sorted as compare() sorted them."""
    params = [c for c in g.columns if c not in {"table", "metric", "kernel", "experiment", *OUTCOME}
              and g[c].notna().any() and (c == "provider" or g[c].nunique(dropna=False) > 1)]
    metric = ["metric"] if g["metric"].nunique() > 1 else []
    show = g[params + metric + ["p50_a", "p50_b", "ratio", "log2_ratio", "threshold", "verdict", *extra]]
    return show.assign(threshold=show["threshold"].map("{:.0%}".format),
                       log2_ratio=show["log2_ratio"].map("{:+.2f}".format)).rename(
        columns={"p50_a": f"{name_a} p50", "p50_b": f"{name_b} p50", "log2_ratio": "log2 ratio"})


def _flagged(points: pd.DataFrame, name_a: str, name_b: str, level: str) -> list[str]:
    lines = []
    for key, g in points.groupby("table"):
        g = g[g["verdict"] != "same"]
        if not g.empty:
            g = g.iloc[g["log2_ratio"].abs().argsort()[::-1]]
            lines += [f"{level} {key} ({', '.join(sorted(g['metric'].unique()))})", "",
                      _md(_shown(g, name_a, name_b).assign(change=g["ratio"].map(_change))), ""]
    return lines or ["None.", ""]


def markdown(name_a: str, name_b: str, a: dict, b: dict, joined: pd.DataFrame, claims: list[dict] | None = None) -> str:
    lines = [f"# `{name_a}` vs `{name_b}`", "", f"- **{name_a}**: {_origin(a)}", f"- **{name_b}**: {_origin(b)}", ""]
    if claims is not None:
        diff, errors = claims_diff(claims, a, b)
        names = {"a": name_a, "b": name_b}
        lines += ["## Claims", "", *(f"- `{names[s]}`: could not settle: {e}" for s, e in errors.items())]
        lines += [""] if errors else []
        unknown = int((diff["changed"] == "unknown").sum())
        lines += [f"{int((diff['changed'] == 'yes').sum())} of {len(diff)} verdicts changed"
                  + (f"; {unknown} could not be compared." if unknown else "."), "",
                  _md(diff.rename(columns={"verdict_a": f"verdict in {name_a}", "verdict_b": f"verdict in {name_b}"})), ""]
    lines += ["## How to read it", "",
              f"Every timed point both runs measured (medians of `triton.testing.do_bench`). **ratio** = {name_b} / {name_a} "
              f"of the median throughput or bandwidth ({name_a} / {name_b} of the median time where a point has "
              f"neither), so **ratio > 1 means {name_b} is better**; log2 ratio +1 is twice as fast, -1 half as fast. "
              f"A point is `same` unless |log2 ratio| > log2(1 + threshold), threshold = max({FLOOR:.0%}, {K:g} x "
              "hypot(spread a, spread b)), a run's spread being its p20..p80 width over its median: a change must "
              f"exceed both the {FLOOR:.0%} run-to-run floor of GPU timings and the two runs' own bands together. "
              f"Points whose median time is under {LAUNCH_BOUND_MS * 1e3:g} us in either run are **launch-bound** "
              "(launch and host overhead, not the kernel) and are summarised on their own. geomean ratio: the "
              "geometric mean of the ratios. The same rows are in the .parquet file of the same name.", ""]
    gaps = coverage(a, b)
    if not gaps.empty:
        lines += ["## What only one run has", "",
                  "Tables in one run only, failed in one (not compared), or with timed points the other did not "
                  "measure (or measured by other parameters, or as zero or NaN): the timed points in each run and "
                  "those compared (untimed tables count 0), and why a failed table failed.", "",
                  _md(gaps.rename(columns={"a": name_a, "b": name_b})), ""]
    if joined.empty:
        return "\n".join(lines + ["No timed point was measured by both runs (a run without a GPU times nothing)."]) + "\n"
    main, bound = joined[~joined["launch_bound"]], joined[joined["launch_bound"]]
    sections = {"Summary (launch-bound points apart, below)": main,
                f"Launch-bound points (median under {LAUNCH_BOUND_MS * 1e3:g} us)": bound}
    for title, points in sections.items():
        if points.empty:
            continue
        lines += [f"## {title}", "", _md(_summary(points)), "", "Changed points, largest first:", ""]
        lines += _flagged(points, name_a, name_b, "###")
    lines += ["## Every point", ""]
    for key, g in joined.groupby("table"):
        lines += [f"### {key}", "", _md(_shown(g, name_a, name_b, extra=["launch_bound"])), ""]
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (float, np.floating)):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else format(v, ".4g")
    return md_cell(v)  # an error's text stays in its cell


def _md(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    return "\n".join([head, "|" + "---|" * len(df.columns)]
                     + ["| " + " | ".join(_fmt(v) for v in r) + " |" for r in df.itertuples(index=False)])


def figure(name_a: str, name_b: str, joined: pd.DataFrame):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    rows = joined["table"].nunique() + joined.loc[joined["launch_bound"], "table"].nunique() if not joined.empty else 1
    fig, ax = plt.subplots(figsize=(9, 2.5 + 0.45 * rows))
    if joined.empty:
        ax.text(0.5, 0.5, "no timed point measured by both runs", ha="center", va="center")
        ax.set_axis_off()
    else:
        np.random.seed(0)  # the strip plot's jitter draws from numpy's global state: the same bytes each time
        shown = joined.assign(row=joined["table"].where(~joined["launch_bound"], joined["table"] + " (launch-bound)"))
        sns.stripplot(data=shown.sort_values("row"), x="ratio", y="row", hue="verdict", hue_order=list(VERDICTS),
                      palette={"same": "tab:grey", "better": "tab:green", "worse": "tab:red"}, jitter=0.25, ax=ax)
        ax.axvspan(1 / (1 + FLOOR), 1 + FLOOR, color="grey", alpha=0.15, lw=0)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set(xlabel=f"ratio of medians (> 1: {name_b} better; shaded: the {FLOOR:.0%} floor)", ylabel="")
        sns.move_legend(ax, "upper center", bbox_to_anchor=(0.4, -0.02 - 0.8 / rows), ncol=3, frameon=False,
                        title=f"{name_b} is (threshold max({FLOOR:.0%}, {K:g} x both p20..p80 bands))",
                        fontsize=8, title_fontsize=8)
    ax.set_title(f"{name_b} vs {name_a}: every timed point")
    fig.tight_layout()
    return fig


def run_tables(run_dir: str | Path) -> dict[str, Path]:
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(Path(run_dir).glob("*/*.parquet"))}


def read_tables(named: dict) -> dict[str, pd.DataFrame]:
    """{key: path} -> {key: table} as compare() takes them; a table that cannot be read counts as failed,
    saying why (listed in the comparison, not compared)."""
    tables, unreadable = read_each(named)
    return {**tables, **{key: pd.DataFrame({"status": ["failed"], "error": [why]}) for key, why in unreadable.items()}}


def read_run(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """A run's tables as compare() takes them: 'kernel/experiment' -> DataFrame."""
    return read_tables(run_tables(run_dir))
