"""The one table format every experiment writes: tidy rows plus provenance, written atomically.

A row is one measurement: ``metric``, ``value``, ``unit``, the parameters that produced it, and a
``status`` ('ok', or what the result *is* when it is not a number: 'out_of_resources', 'needs_gpu',
'unsupported', 'compiled_only', 'raised' (the call under test raised: the error is the result),
'crashed' (it killed its process), 'timed_out' (it hung past its time); 'failed' when the experiment itself
raised, in a one-row table). Provenance columns are added to every row so a table can always be traced to
the device, software and config that made it.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa

from .provenance import COLUMNS as PROVENANCE

COLUMNS = ["kernel", "experiment", "variant", "provider", "metric", "value", "unit", "status", "error"]
STATUSES = ("ok", "out_of_resources", "needs_gpu", "unsupported", "compiled_only", "raised", "crashed", "timed_out",
            "failed")


def row(metric: str, value, unit: str = "", *, status: str = "ok", error: str = "", **params) -> dict:
    """One measurement. ``params`` are the shape/dtype/settings columns (size, n_cols, dtype, ...)."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    value = float(value) if value is not None else float("nan")
    return {"metric": metric, "value": value, "unit": unit, "status": status, "error": error, **params}


def needs_gpu(what: str, **params) -> dict:
    """The honest row for a measurement that cannot be made in Triton's interpreter."""
    return row("not_measured", None, status="needs_gpu",
               error=f"{what} needs a CUDA GPU; this run used Triton's interpreter", **params)


def to_frame(rows: list[dict], kernel: str, experiment: str, origin: dict) -> pd.DataFrame:
    if not rows:
        raise ValueError(f"{kernel}/{experiment} produced no rows")
    df = pd.DataFrame(rows)
    df.insert(0, "kernel", kernel)
    df.insert(1, "experiment", experiment)
    for col in ("variant", "provider"):
        if col not in df:
            df[col] = ""
        df[col] = df[col].fillna("").astype(str)
    for key in PROVENANCE:
        df[key] = origin[key]
    ordered = COLUMNS + [c for c in df.columns if c not in COLUMNS + PROVENANCE] + PROVENANCE
    return df[ordered]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds,
    so a reader never sees a half-written file and a failure keeps the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def input_name(key: str, prefix: str = "") -> str:
    """'softmax/bug' -> 'softmax__bug': a table's name among a Snakemake rule's named inputs."""
    return prefix + key.replace("/", "__")


def key_of(input_name: str) -> str:
    return input_name.replace("__", "/")


# What reading a table that is not one raises: truncated, empty or not parquet (pyarrow's ArrowInvalid),
# a directory or a file that cannot be opened (OSError).
UNREADABLE = (pa.ArrowException, OSError)


def read(paths) -> pd.DataFrame:
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)


def read_each(named: dict) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """{key: path} -> ({key: table}, {key: why it cannot be read}): one bad file costs only itself."""
    tables, unreadable = {}, {}
    for key, path in named.items():
        try:
            tables[key] = read(path)
        except UNREADABLE as e:
            unreadable[key] = why_unreadable(path, e)
    return tables, unreadable


def why_unreadable(path, error: Exception) -> str:
    said = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{path} cannot be read as a table ({type(error).__name__}: {said})"
