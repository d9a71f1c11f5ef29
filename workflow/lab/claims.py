"""Settle each claim of workflow/claims.yaml from the tables: (measured, verdict) per claim, by the check a
unit declares for it (``@claim`` in lab/units/), with the verdicts and helpers below.

A check reads only rows with status 'ok' (and the statuses that are results: 'raised', 'crashed', 'timed_out',
'out_of_resources'); what could not be measured here makes the verdict 'needs a GPU', never a guess, and
a claim whose table is missing or records a failed experiment, or whose measurements contradict each other
(a kernel against a reference that should match it), is 'not settled'. A statement that is
false as written but whose point the data bear out is 'false as stated; the point holds', never a
'nuance'. Probe points (n_cols=2000, the writeup's shapes) are settings in claims.yaml; ``probes`` names
the config list each must be in, checked before any job runs (check_probes).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from . import summary, units
from .providers import WRITEUP
from .summary import ok

REPRODUCED = "reproduced"
NUANCE = "reproduced with a nuance"
FALSE_POINT_HOLDS = "false as stated; the point holds"
NOT_REPRODUCED = "not reproduced"
NEEDS_GPU = "needs a GPU"
NOT_SETTLED = "not settled"  # a table it needs is missing or failed, or its measurements contradict each other
VERDICTS = (REPRODUCED, NUANCE, FALSE_POINT_HOLDS, NOT_REPRODUCED, NEEDS_GPU, NOT_SETTLED)
CLAIMS = Path(__file__).resolve().parents[1] / "claims.yaml"


def said(claim_id: int, key: str):
    """A value the writeup gave, as workflow/claims.yaml states it in the claim's settings (for figures)."""
    claims = yaml.safe_load(CLAIMS.read_text())
    return next(c for c in claims if c["id"] == claim_id)["settings"][key]


def bools(d: pd.DataFrame, metric: str, **where) -> pd.Series:
    return ok(d, metric=metric, **where)["value"].astype(bool)


def first_line(error: str) -> str:
    """The line of an error text that says what happened (CUDA and compiler errors carry hints and source
    lines around it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for mark in ("illegal memory", "exceeds", "out of resource", "Error"):
        for line in lines:
            if mark in line:
                return line[:200]
    return lines[0][:200] if lines else ""


def skipped(d: pd.DataFrame) -> str:
    n = int((d["status"] == "needs_gpu").sum())
    return f" ({n} bf16 cases need a GPU: not run in the interpreter)" if n else ""


def by_provider(d: pd.DataFrame):
    """A table per kernel (provider): the writeup's as printed first, then the others."""
    order = {WRITEUP: 0}
    for provider in sorted(d["provider"].unique(), key=lambda p: (order.get(p, 1), p)):
        yield provider, d[d["provider"] == provider]


def weakest(verdicts: list[str]) -> str:
    """One verdict for several cases: the least favourable of them (a case not settled leaves the claim
    open unless another is not reproduced, which settles it)."""
    return (max(verdicts, key=[REPRODUCED, NUANCE, FALSE_POINT_HOLDS, NEEDS_GPU, NOT_SETTLED, NOT_REPRODUCED].index)
            if verdicts else NEEDS_GPU)


def check_declarations(claims: list[dict], figures=None) -> None:
    """Every claim of claims.yaml has exactly one check, and every figure a claim links is drawn (when
    ``figures`` is given). The workflow calls this when it builds the DAG, so a gap fails before any job
    runs. (A table a check needs that this run does not produce leaves the claim 'not settled'.)"""
    ids = [c["id"] for c in claims]
    checks = units.checks()
    units.sections()  # like the checks and figures, refused here for a table no experiment makes
    if sorted(ids) != sorted(checks):
        raise ValueError(f"claims.yaml ids {sorted(ids)} and the units' checks {sorted(checks)} differ")
    for c in claims:
        if figures is not None and c.get("figure") and c["figure"] not in figures:
            raise ValueError(f"claim {c['id']} links figure {c['figure']!r}, which no unit declares")


def check_probes(claims: list[dict], config: dict) -> None:
    """Each probe point a claim reads (``probes: {setting: config.path}``) must be among the values the
    config runs there, or that claim could not be settled: refused before any job starts, naming it."""
    from .settings import ConfigError

    for c in claims:
        for setting, path in (c.get("probes") or {}).items():
            node = config
            for part in path.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is None:  # the experiment is not configured: the claim will say 'not settled'
                continue
            wanted = c["settings"][setting]  # one value, or a list of values, each a probe point
            for value in wanted if isinstance(wanted, list) else [wanted]:
                if value not in (node if isinstance(node, list) else [node]):
                    raise ConfigError(f"config key {path} must {'include' if isinstance(node, list) else 'be'} "
                                      f"{value!r}: claim {c['id']} (\"{c['claim']}\") is settled there")


def settle(claims: list[dict], tables: dict[str, pd.DataFrame], unreadable: dict[str, str] | None = None) -> pd.DataFrame:
    """Each claim's measured value and verdict from ``tables``; ``unreadable``: {table: why} for the run's
    tables that could not be read (a claim that needs one is not settled, and says why)."""
    check_declarations(claims)
    unreadable = unreadable or {}
    rows = []
    for c in claims:
        check = units.checks()[c["id"]]
        missing = [k for k in check.tables if k not in tables]
        failed = {k: tables[k] for k in check.tables if k in tables and summary.failed(tables[k])}
        if missing:
            measured = "; ".join(f"not settled: unreadable: {unreadable[k]}" if k in unreadable
                                 else f"not settled: {k} missing (not in this run)" for k in missing)
            verdict = NOT_SETTLED
        elif failed:
            measured = "; ".join(f"not settled: the {k} job failed ({first_line(d['error'].iloc[0])})"
                                 for k, d in failed.items())
            verdict = NOT_SETTLED
        else:
            try:
                measured, verdict = check.fn({k: tables[k] for k in check.tables}, c.get("settings", {}))
            except (KeyError, IndexError) as e:  # a table from an older version of the project lacks what it reads
                measured = f"not settled: these tables lack what the check reads ({type(e).__name__}: {e})"
                verdict = NOT_SETTLED
        if verdict not in VERDICTS:
            raise ValueError(f"claim {c['id']}: unknown verdict {verdict!r}")
        rows.append({"id": c["id"], "claim": c["claim"], "said": c["said"], "measured": measured,
                     "verdict": verdict, "figure": c.get("figure", "")})
    return pd.DataFrame(rows)
