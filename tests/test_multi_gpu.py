"""The committed two-GPU H200 run (results/nvidia-h200-x2) against the one-GPU run (results/nvidia-h200),
both made by the same code on one two-GPU machine: each table records which GPU ran its job and when."""
from pathlib import Path

import pytest

from lab import runs

ROOT = Path(__file__).resolve().parents[1]
TWO, ONE = ROOT / "results/nvidia-h200-x2", ROOT / "results/nvidia-h200"

if not TWO.is_dir():
    pytest.skip("no committed two-GPU run", allow_module_level=True)


def test_every_job_names_its_gpu_and_no_timing_job_shared_one():
    jobs = runs.schedule(TWO)
    assert jobs["start"].notna().all() and jobs["end"].notna().all() and jobs["gpu"].str.startswith("GPU-").all()
    assert jobs["gpu"].nunique() == 2
    assert runs.timing_overlaps(jobs) == []


def test_both_gpus_ran_timing_jobs():
    jobs = runs.schedule(TWO)
    assert jobs[jobs["timing"]]["gpu"].nunique() == 2


def test_the_two_gpus_worked_in_parallel():
    jobs = runs.schedule(TWO)
    a, b = sorted(jobs["gpu"].unique())
    parallel = [(x.table, y.table) for x in jobs[jobs["gpu"] == a].itertuples() for y in jobs[jobs["gpu"] == b].itertuples()
                if x.start < y.end and y.start < x.end]
    assert parallel


def test_two_gpus_take_at_most_0_6_of_the_one_gpu_wall_time():
    one, two = runs.wall_seconds(runs.schedule(ONE)), runs.wall_seconds(runs.schedule(TWO))
    assert two <= 0.6 * one, (two, one)


def test_the_one_gpu_run_used_one_gpu():
    assert runs.schedule(ONE)["gpu"].nunique() == 1
