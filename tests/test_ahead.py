"""lab.ahead: an experiment's cases run first in spawned processes, results discarded, whatever they do."""
import os
from pathlib import Path

from lab import ahead


def test_every_case_runs_once_in_another_process_and_a_raising_case_is_counted(tmp_path):
    cases = [(tmp_path / f"case{i}",) for i in range(5)] + [(tmp_path / "no such folder" / "case",)]
    done = ahead.compile_ahead(Path.touch, cases, processes=2, gpu_only=False)
    assert done["processes"] == 2 and done["cases"] == 6 and done["failed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"case{i}" for i in range(5)]


def test_a_process_that_dies_ends_nothing_here():
    done = ahead.compile_ahead(os._exit, [(3,), (4,), (5,)], processes=2, gpu_only=False)
    assert done["processes"] == 2 and done["failed"] == 3


def test_nothing_runs_off_the_gpu_or_without_two_cases_for_two_processes(tmp_path):
    assert ahead.compile_ahead(Path.touch, [(tmp_path / "a",), (tmp_path / "b",)], processes=2)["processes"] == 0
    assert ahead.compile_ahead(Path.touch, [(tmp_path / "c",)], processes=4, gpu_only=False)["processes"] == 0
    assert ahead.compile_ahead(Path.touch, [(tmp_path / "d",), (tmp_path / "e",)], processes=1,
                               gpu_only=False)["processes"] == 0
    assert not any(tmp_path.iterdir())


def test_workers_are_the_cpus_this_process_may_use_at_most_the_cap():
    assert 1 <= ahead.workers() <= ahead.MAX_WORKERS
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert ahead.workers() == min(cpus, ahead.MAX_WORKERS)
