"""What every figure shares: the style, placeholders for what could not be measured, the p20-p80 band,
and an atomic save. Each figure is drawn by the unit that declares it (lab/units/); every title names the
op, the metric and the device."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pandas as pd

from .table import atomic_path

if TYPE_CHECKING:  # annotations only: pyplot is imported on first use (plots.libs)
    import matplotlib.pyplot as plt


@functools.cache
def libs():
    """(matplotlib.pyplot, seaborn), imported and styled on first use: planning a run and running an
    experiment import every unit and draw nothing, and these two cost seconds per process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def device_of(df: pd.DataFrame) -> str:
    return ", ".join(sorted(df["device"].dropna().unique()))


def placeholder(title: str, df: pd.DataFrame) -> plt.Figure:
    """What a figure shows when its data could not be measured here (never an empty or fake plot)."""
    plt, _ = libs()
    fig, ax = plt.subplots(figsize=(7, 2.5))
    reasons = "; ".join(sorted(df["error"].dropna().unique()))[:160] or "no data"
    ax.text(0.5, 0.5, f"not measured on {device_of(df)}\n{reasons}", ha="center", va="center", wrap=True)
    ax.set_axis_off()
    ax.set_title(title)
    return fig


def needs_gpu(title: str, device: str = "no GPU") -> plt.Figure:
    """The placeholder for a figure of timings when the run has none (Triton's interpreter)."""
    return placeholder(title, pd.DataFrame({"device": [device], "error": ["needs a GPU"]}))


def measured(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def band(ax, df: pd.DataFrame, x: str, hue: str, metric: str):
    """Median line with a p20-p80 band per hue level."""
    _, sns = libs()
    d = df[df["metric"] == metric]
    wide = d.pivot_table(index=[hue, x], columns="quantile", values="value").reset_index()
    palette = dict(zip(sorted(wide[hue].unique()), sns.color_palette(n_colors=wide[hue].nunique())))
    for level, g in wide.groupby(hue):
        g = g.sort_values(x)
        ax.plot(g[x], g[0.5], marker="o", ms=3, label=level, color=palette[level])
        ax.fill_between(g[x], g[0.2], g[0.8], alpha=0.25, color=palette[level])
    ax.legend(fontsize=8)


def save(fig: plt.Figure, path: str) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    libs()[0].close(fig)
