"""What every unit reads its tables with (rows that are results, medians, forward rows), and the job
schedule of a run. Numbers a unit derives from its own tables live in its unit."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import runs


def failed(df: pd.DataFrame) -> bool:
    """Does this table record an experiment that raised (lab.runner's one-row 'failed' table)?"""
    return bool((df["status"] == "failed").any())


def ok(df: pd.DataFrame, **where) -> pd.DataFrame:
    d = df[df["status"] == "ok"]
    for col, val in where.items():
        d = d[d[col] == val] if col in d else d.iloc[:0]  # a table without the column has no such rows
    return d


def needed(selection, what: str):
    """``selection`` (rows a check selected, or values read from them) if it holds any, else a KeyError naming
    ``what``, which claims.settle turns into 'not settled'. A table from an older version may lack a provider,
    metric, variant, column or probe point a check selects; read as a result, the empty selection would settle
    the claim ("0/0 cases"; ``.all()`` of nothing is True). Rows that could not run here (status 'needs_gpu') are
    for the check to judge before it asks for these. ``ok`` itself stays empty-tolerant: some callers want that."""
    if len(selection) == 0:
        raise KeyError(f"no {what}")
    return selection


def median(df: pd.DataFrame, metric: str, **where) -> pd.DataFrame:
    return ok(df, metric=metric, quantile=0.5, **where)


def forward(df: pd.DataFrame) -> pd.DataFrame:
    """The forward rows of a performance table that also times backward passes (column `direction`)."""
    return ok(df, direction="forward") if "direction" in df else ok(df)


# The columns lab.measure.ceiling_columns writes on every row of a timing table: what its job measured of
# its GPU before it started (a property of the machine, not of the point measured).
CEILINGS = ("copy_gbps", "matmul_tflops")


def invocations(run_dir) -> dict[str, pd.DataFrame]:
    """A run's job schedule (lab.runs.schedule) split by the commit that made each table: tables made by
    one commit come from one pipeline invocation, and a later invocation reruns only the tables whose
    code or settings changed, maybe on another machine, so times compare within one invocation."""
    jobs = runs.schedule(run_dir)
    if jobs.empty:
        return {}
    jobs["commit"] = [runs.recorded(Path(run_dir) / f"{t}.parquet")["git_commit"] for t in jobs["table"]]
    return {commit: g for commit, g in jobs.groupby("commit", sort=False)}
