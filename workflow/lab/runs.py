"""A run directory (results/<run>/) and what its tables recorded about their origin.

A run belongs to the device and backend that made it. The workflow reads the recorded fingerprints
to decide from content, not from file dates, whether a table is up to date; a job reads the owner to
refuse writing into another machine's run.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

RECORDED = ("device", "backend", "fingerprint", "config_hash", "code_hash", "git_commit")


def recorded(table: str | Path) -> dict | None:
    """The origin a table recorded (its first row; every row carries the same), or None if absent."""
    table = Path(table)
    if not table.is_file():
        return None
    names = set(pq.read_schema(table).names)
    first = pq.read_table(table, columns=[c for c in RECORDED if c in names]).slice(0, 1).to_pylist()
    return {c: (first[0].get(c) if first else None) for c in RECORDED}


def owners(run_dir: str | Path) -> set[tuple[str, str]]:
    """(device, backend) of every table already in the run."""
    found = set()
    for table in Path(run_dir).glob("*/*.parquet"):
        r = recorded(table)
        if r and r["device"]:
            found.add((r["device"], r["backend"]))
    return found


class ForeignRunError(RuntimeError):
    pass


def check_owner(run_dir: str | Path, device: str, backend: str, overwrite: bool = False) -> None:
    """Refuse to write into a run made on another device or backend, unless told to. The workflow asks
    this when it plans (a foreign run then gets no experiment rules), and each job asks again."""
    others = owners(run_dir) - {(device, backend)}
    if others and not overwrite:
        made_by = "; ".join(f"{d} ({b})" for d, b in sorted(others))
        raise ForeignRunError(
            f"{run_dir} was made on {made_by}; this machine is {device} ({backend}) and will not mix or "
            f"overwrite its results. Use another run name (--config run=NAME), or --config "
            f"overwrite_foreign_run=true to write there anyway.")
