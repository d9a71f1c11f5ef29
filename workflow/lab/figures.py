"""Every figure, declared once: its name (the file results/<run>/figures/<name>.png and the caption
workflow/report/<name>.rst), the tables it is drawn from, its report category, and how it is drawn.
Each drawing function receives only its declared tables."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from . import plots, summary


@dataclass(frozen=True)
class Figure:
    name: str
    tables: tuple[str, ...]
    category: str
    draw: Callable


FIGURES: dict[str, Figure] = {}
PERFORMANCE = tuple(f"{k}/performance" for k in summary.MEMORY_BOUND)
CLAIMS = Path(__file__).resolve().parents[1] / "claims.yaml"  # what the writeup said, marked on figures


def said(claim_id: int, key: str):
    """A value the writeup gave, as workflow/claims.yaml states it in the claim's settings."""
    claims = yaml.safe_load(CLAIMS.read_text())
    return next(c for c in claims if c["id"] == claim_id)["settings"][key]


def drawable(available) -> dict[str, Figure]:
    """The figures whose tables are all produced (a config may leave experiments out)."""
    return {name: fig for name, fig in FIGURES.items() if all(k in available for k in fig.tables)}


def figure(name: str, tables, category: str):
    def register(fn):
        FIGURES[name] = Figure(name, tuple(tables), category, fn)
        return fn

    return register


@figure("softmax_bug", ["softmax/bug"], "Softmax")
def _softmax_bug(t):
    return plots.softmax_bug(t["softmax/bug"], said(6, "writeup_max_abs_diff"), said(6, "n_cols"))


@figure("attention_head_dims", ["attention/head_dims"], "Attention")
def _attention_head_dims(t):
    return plots.attention_head_dims(t["attention/head_dims"])


@figure("dropout_rates", ["relu_dropout/statistics"], "Dropout")
def _dropout_rates(t):
    return plots.dropout_rates(t["relu_dropout/statistics"])


@figure("wall", ["attention/wall", "flash_attention/past_wall"], "Attention")
def _wall(t):
    return plots.wall(t["attention/wall"], t["flash_attention/past_wall"])


@figure("flash_memory", ["flash_attention/past_wall"], "Attention")
def _flash_memory(t):
    return plots.flash_memory(t["flash_attention/past_wall"])


@figure("bandwidth", ["calibration/ceilings", *PERFORMANCE], "Performance")
def _bandwidth(t):
    memory_bound = {k: t[f"{k}/performance"] for k in summary.MEMORY_BOUND}
    copy = {k: summary.own_ceiling(d, "copy_gbps", t["calibration/ceilings"]) for k, d in memory_bound.items()}
    return plots.bandwidth(memory_bound, copy)


@figure("ceiling_fraction", ["calibration/ceilings", *PERFORMANCE, "flash_attention/performance"], "Performance")
def _ceiling_fraction(t):
    return plots.ceiling_fraction(summary.ceiling_fractions(t))


@figure("flash_performance", ["calibration/ceilings", "flash_attention/performance"], "Performance")
def _flash_performance(t):
    perf = t["flash_attention/performance"]
    return plots.flash_performance(perf, summary.own_ceiling(perf, "matmul_tflops", t["calibration/ceilings"]))


@figure("fusion", ["relu_dropout/performance", "softmax/performance"], "Performance")
def _fusion(t):
    return plots.fusion(summary.fusion(t), plots.device_of(t["softmax/performance"]))


@figure("softmax_widths", ["calibration/ceilings", "softmax/performance"], "Performance")
def _softmax_widths(t):
    perf = t["softmax/performance"]
    copy = summary.own_ceiling(perf, "copy_gbps", t["calibration/ceilings"])
    return plots.softmax_widths(summary.softmax_widths(perf, copy), copy, plots.device_of(perf))


@figure("flash_vs_best_sdpa", ["flash_attention/performance"], "Performance")
def _flash_vs_best_sdpa(t):
    perf = t["flash_attention/performance"]
    return plots.flash_vs_best_sdpa(summary.flash_vs_sdpa(perf, None), plots.device_of(perf))


@figure("call_latency", ["flash_attention/performance"], "Performance")
def _call_latency(t):
    perf = t["flash_attention/performance"]
    return plots.call_latency(summary.launch_floor(perf), plots.device_of(perf))
