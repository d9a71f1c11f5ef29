"""The markdown report: provenance, one row per claim (said / measured / verdict), each unit's own
section, the figures with their captions. What is particular to a kernel comes from its unit (lab/units/)."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import yaml

from . import claims as claims_mod
from . import provenance, runs, summary, units
from .table import PROVENANCE, atomic_path

def md_cell(v) -> str:
    """Text as one markdown table cell: its '|' escaped, its newlines spaces."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    def fmt(v):
        if isinstance(v, float):
            if pd.isna(v):
                return ""
            return str(int(v)) if v.is_integer() and abs(v) < 2**53 else format(v, floatfmt)  # 16384, not 1.64e+04
        return md_cell(v)

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
            + md_table(origin))


def _needs(tables: dict[str, pd.DataFrame], keys, build) -> str:
    """build(tables) when this run has every table in ``keys`` and none records a failed experiment;
    otherwise says which are missing or failed (a failure stays in its own table's section)."""
    missing = [f"`{k}` missing (not in this run)" for k in keys if k not in tables]
    failed = [f"the `{k}` job failed ({claims_mod.first_line(tables[k]['error'].iloc[0])})" for k in keys
              if k in tables and summary.failed(tables[k])]
    if missing or failed:
        return "\n" + "; ".join(f"Not settled: {why}." for why in missing + failed) + "\n"
    try:
        return build(tables)
    except (KeyError, IndexError) as e:  # a table from an older version of the project lacks what it reads
        return f"\nNot built: these tables lack what this section reads ({type(e).__name__}: {e}).\n"


def caption(name: str) -> str:
    """The caption its unit declares for figure ``name`` (`snakemake --report` shows the same text)."""
    fig = units.figures().get(name)
    return fig.caption.replace("``", "`") if fig else ""


def _kernels() -> str:
    """What each provider value in the tables is, per unit."""
    return "The provider names in the tables and below, per kernel:\n\n" + "\n\n".join(
        f"**{kernel}**\n\n" + "\n".join(f"- `{name}`: {what}" for name, what in providers.items())
        for kernel, providers in units.providers().items())


def _own_ceilings(tables: dict[str, pd.DataFrame]) -> str:
    from .units.calibration import own_ceiling

    timed = {k: d for k, d in sorted(tables.items()) if k.endswith("/performance") and not summary.ok(d).empty}
    return "Each timing job's own ceilings:\n\n" + md_table(pd.DataFrame(
        [{"table": f"`{k}`", **{what: own_ceiling(d, name) or "not recorded (an older table)"
                                 for what, name in (("copy GB/s", "copy_gbps"), ("bf16 matmul TFLOP/s", "matmul_tflops"))}}
         for k, d in timed.items()]), ".4g")


def _sections(tables: dict[str, pd.DataFrame]) -> str:
    """Each unit's section, in ladder order, from the tables it declares (a missing one is named)."""
    timed = any(not summary.ok(d).empty for k, d in tables.items() if k.endswith("/performance"))
    out = [("Timings are medians of `triton.testing.do_bench`; p20/p80 are in the tables. Every fraction of a ceiling "
            "divides by the copy bandwidth or bf16 matmul rate that the same job measured on its own GPU before it "
            "started (columns `copy_gbps`, `matmul_tflops` of each table). " + _own_ceilings(tables)) if timed else
           ("No timings: this run used Triton's interpreter (or timed nothing), and timing needs a GPU. The committed "
            "GPU run is under `results/nvidia-h200/`.")]
    for sec in units.sections():
        out.append(_needs(tables, sec.tables, lambda t, sec=sec: sec.build({k: t[k] for k in sec.tables})))
    return "\n".join(part for part in out if part)


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
    return ("Each experiment job, in seconds from the first start among the jobs of its commit (one pipeline "
            "invocation where the tables of a commit were made at once; a rerun at the same commit joins it), and "
            "on a GPU the one it locked (last characters of its UUID):\n\n" + "\n".join(lines)
            + "\n\n" + md_table(table, ".1f"))


def build(tables: dict[str, pd.DataFrame], claims_path: str, figures: list[str], out_path: str,
          html_path: str | None = None, unreadable: dict[str, str] | None = None) -> pd.DataFrame:
    """The report from ``tables``; ``unreadable`` names the run's tables that could not be read, and why
    (the claims and sections that need one say so)."""
    unreadable = unreadable or {}
    with open(claims_path) as fh:
        claims = yaml.safe_load(fh)
    verdicts = claims_mod.settle(claims, tables, unreadable)
    fig_dir = os.path.relpath(os.path.dirname(figures[0]), os.path.dirname(out_path)) if figures else "figures"
    drawn = {Path(f).stem for f in figures}
    settings = {c["id"]: c.get("settings") or {} for c in claims}
    table = verdicts.assign(
        figure=lambda d: d["figure"].map(lambda f: f"[{f}.png]({fig_dir}/{f}.png)" if f in drawn else ""),
        said=lambda d: "\"" + d["said"] + "\"",
        **{"judged with": lambda d: d["id"].map(lambda i: ", ".join(f"{k}={v}" for k, v in settings[i].items()))},
    )[["id", "claim", "said", "measured", "verdict", "judged with", "figure"]]
    counts = verdicts["verdict"].value_counts()
    tally = ", ".join(f"{n} {v}" for v, n in counts.items())
    parts = [
        f"# Triton kernel lab: report for `{Path(out_path).parent.name}`",
        "Every claim of the writeup, settled by this run's tables, then three findings (18-20): the writeup's lesson, "
        "\"test the case you didn't think to test\", applied to its own kernels. Verdicts: reproduced / reproduced "
        "with a nuance / false as stated; the point holds / not reproduced / needs a GPU / not settled (never guessed: "
        "a claim this run could not measure says so). \"Judged with\": the claim's thresholds and probe points, "
        "from workflow/claims.yaml, which says what each means.",
        "## Provenance\n\n" + _provenance(tables),
        "## Claims\n\n" + tally + "\n\n" + md_table(table),
        "## Schedule\n\n" + _schedule(Path(out_path).parent),
        "## Kernels\n\n" + _kernels(),
        "## By kernel\n\n" + _sections(tables),
        "## Figures\n\n" + "\n\n".join(f"### {Path(f).stem}\n\n![{Path(f).stem}]({fig_dir}/{Path(f).name})\n\n"
                                          f"{caption(Path(f).stem)}" for f in figures),
        "## Tables\n\n" + "\n".join(f"- `{k}.parquet`: {len(v)} rows" for k, v in sorted(tables.items()))
        + "".join(f"\n- `{k}.parquet`: not read: {why}" for k, why in sorted(unreadable.items())),
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
