"""The committed two-GPU H200 run (results/nvidia-h200-x2) against the one-GPU run of the same commits on
the same machine (results/nvidia-h200-x1, which was results/nvidia-h200 until that was regenerated).

Each run was made by several pipeline invocations: a later one reruns only the tables whose code or
settings changed, possibly on another machine. Tables made by the same commit in a run come from one
invocation on one machine, and each invocation ran in both runs on the same machine (the one-GPU run
with CUDA_VISIBLE_DEVICES=0), so every check below holds per invocation."""
from pathlib import Path

import pytest

from lab import runs
from lab.summary import invocations

ROOT = Path(__file__).resolve().parents[1]
TWO, ONE = ROOT / "results/nvidia-h200-x2", ROOT / "results/nvidia-h200-x1"

if not TWO.is_dir():
    pytest.skip("no committed two-GPU run", allow_module_level=True)


def test_each_invocation_ran_the_same_jobs_in_both_runs():
    one, two = invocations(ONE), invocations(TWO)
    assert one.keys() == two.keys()
    for commit in two:
        assert set(one[commit]["table"]) == set(two[commit]["table"]), commit


@pytest.mark.parametrize("commit, jobs", invocations(TWO).items())
def test_every_job_names_its_gpu_and_no_timing_job_shared_one(commit, jobs):
    assert jobs["start"].notna().all() and jobs["end"].notna().all() and jobs["gpu"].str.startswith("GPU-").all()
    assert jobs["gpu"].nunique() == 2
    assert runs.timing_overlaps(jobs) == []


@pytest.mark.parametrize("commit, jobs", invocations(TWO).items())
def test_both_gpus_ran_timing_jobs(commit, jobs):
    assert jobs[jobs["timing"]]["gpu"].nunique() == 2


@pytest.mark.parametrize("commit, jobs", invocations(TWO).items())
def test_the_two_gpus_worked_in_parallel(commit, jobs):
    a, b = sorted(jobs["gpu"].unique())
    parallel = [(x.table, y.table) for x in jobs[jobs["gpu"] == a].itertuples() for y in jobs[jobs["gpu"] == b].itertuples()
                if x.start < y.end and y.start < x.end]
    assert parallel


@pytest.mark.parametrize("commit", sorted(invocations(TWO)))
def test_two_gpus_take_at_most_0_6_of_the_one_gpu_wall_time(commit):
    one, two = runs.wall_seconds(invocations(ONE)[commit]), runs.wall_seconds(invocations(TWO)[commit])
    assert two <= 0.6 * one, (two, one)


@pytest.mark.parametrize("commit, jobs", invocations(ONE).items())
def test_the_one_gpu_run_used_one_gpu(commit, jobs):
    assert jobs["gpu"].nunique() == 1
    assert runs.timing_overlaps(jobs) == []
