"""A run directory (results/<run>/) and what its tables recorded about their origin.

A run belongs to the device and backend that made it. The workflow reads the recorded fingerprints
to decide from content, not from file dates, whether a table is up to date; a job reads the owner to
refuse writing into another machine's run.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from .provenance import SOFTWARE
from .table import UNREADABLE, why_unreadable

RECORDED = (*SOFTWARE, "fingerprint", "config_hash", "code_hash", "git_commit", "rerun_marker")


def recorded(table: str | Path) -> dict | None:
    """The origin a table recorded (its first row; every row carries the same), or None if absent. A
    file that is there but cannot be read (truncated, empty, not parquet, a directory) records nothing:
    every field None, and ``unreadable`` says why (it is None for a readable table). The whole file is read,
    not its provenance columns alone: a table whose data pages are damaged would otherwise read as current
    and never be made again, while the report could not read it."""
    table = Path(table)
    if not table.exists():
        return None
    try:
        whole = pq.ParquetFile(table).read()
        first = whole.select([c for c in RECORDED if c in whole.column_names]).slice(0, 1).to_pylist()
    except UNREADABLE as e:
        return {**dict.fromkeys(RECORDED), "unreadable": why_unreadable(table, e)}
    return {**{c: (first[0].get(c) if first else None) for c in RECORDED}, "unreadable": None}


def made_on(run_dir: str | Path) -> dict[tuple[str, str], list[str]]:
    """(device, backend) -> the tables of the run ('softmax/bug') that recorded it."""
    found: dict[tuple[str, str], list[str]] = {}
    for table in sorted(Path(run_dir).glob("*/*.parquet")):
        r = recorded(table)
        if r and r["device"]:
            found.setdefault((r["device"], r["backend"]), []).append(f"{table.parent.name}/{table.stem}")
    return found


def owners(run_dir: str | Path) -> set[tuple[str, str]]:
    """(device, backend) of every table already in the run."""
    return set(made_on(run_dir))


class ForeignRunError(RuntimeError):
    pass


def check_owner(run_dir: str | Path, device: str, backend: str, overwrite: bool = False) -> None:
    """Refuse to write into a run made on another device or backend, unless told to. The workflow asks
    this when it plans (a foreign run then gets no experiment rules), and each job asks again."""
    made = made_on(run_dir)
    others = {owner: tables for owner, tables in made.items() if owner != (device, backend)}
    if others and not overwrite:
        total = sum(map(len, made.values()))
        made_by = "; ".join(f"{d} ({b})" + ("" if len(t) == total else f" ({len(t)} of its {total} tables: "
                                                                          f"{', '.join(t[:3])}{', ...' if len(t) > 3 else ''})")
                            for (d, b), t in sorted(others.items()))
        whose = "was made on" if len(made) == len(others) else "holds tables made on"
        raise ForeignRunError(
            f"{run_dir} {whose} {made_by}; this machine is {device} ({backend}) and will not mix or "
            f"overwrite its results. Use another run name (--config run=NAME), or --config "
            f"overwrite_foreign_run=true to write there anyway.")


def schedule(run_dir: str | Path) -> pd.DataFrame:
    """When and where each experiment job of a run ran, from its table's rows: one row per table with
    gpu_uuid, start (job_start), end (the table's timestamp) and whether it was a timing job."""
    from .units import registry

    timing = {key: exp.timing for key, exp in registry().items()}
    jobs = []
    for path in sorted(Path(run_dir).glob("*/*.parquet")):
        key = f"{path.parent.name}/{path.stem}"
        try:
            cols = [c for c in ("gpu_uuid", "job_start", "timestamp") if c in pq.read_schema(path).names]
            first = pq.read_table(path, columns=cols).slice(0, 1).to_pylist()[0]
        except UNREADABLE:  # named where the report lists its tables
            continue
        jobs.append({"table": key, "gpu": first.get("gpu_uuid", ""), "start": first.get("job_start"),
                     "end": first.get("timestamp"), "timing": timing.get(key, False)})
    df = pd.DataFrame(jobs, columns=["table", "gpu", "start", "end", "timing"])  # the columns even of no job
    for c in ("start", "end"):
        df[c] = pd.to_datetime(df[c], utc=True)
    return df


def timing_overlaps(jobs: pd.DataFrame) -> list[tuple[str, str]]:
    """Pairs of jobs that ran at the same time on the same GPU while one of them was timing."""
    clashes = []
    for _, g in jobs.groupby("gpu"):
        rows = list(g.itertuples())
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                if (a.timing or b.timing) and a.start < b.end and b.start < a.end:
                    clashes.append((a.table, b.table))
    return clashes


def wall_seconds(jobs: pd.DataFrame) -> float:
    """From the first job's start to the last table written."""
    return (jobs["end"].max() - jobs["start"].min()).total_seconds()
