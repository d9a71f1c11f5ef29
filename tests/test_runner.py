"""lab.runner: an experiment whose rows cannot make a table (none, or a column of mixed types) fails alone: its
table records the error, as a raising experiment's does, instead of the job dying without one."""
import os
import types

import pandas as pd
import pytest

from conftest import ON_GPU
from lab import provenance, runner, units
from lab.table import row


@pytest.mark.skipif(ON_GPU, reason="runs a job in this process: on the interpreter backend, which a GPU process has not chosen")
@pytest.mark.parametrize("rows, error", [([], "produced no rows"),
                                         ([row("x", 1.0, size=1), row("x", 2.0, size="all")], "size")])
def test_rows_that_make_no_table_leave_a_failed_table(tmp_path, monkeypatch, rows, error):
    monkeypatch.setattr(os, "environ", os.environ.copy())  # the runner sets its job's defaults: not for other tests
    exp = types.SimpleNamespace(kernel="demo", name="broken", fn=lambda s: rows, timing=False, ceilings=False)
    monkeypatch.setattr(units, "registry", lambda: {"demo/broken": exp})
    out = tmp_path / "run/demo/broken.parquet"
    out.parent.mkdir(parents=True)
    runner.run("demo/broken", {"seed": 0}, provenance.software("interpreter"), "code", str(out))
    df = pd.read_parquet(out)
    assert list(df["status"]) == ["failed"] and error in df["error"].iloc[0]
    assert df["fingerprint"].iloc[0] == "failed"  # the next run retries it


class _Pinned(Exception):
    """Raised by the fake gpu.pin: the test needs only what the job asked for."""


@pytest.mark.parametrize("timing, alone, exclusive", [(False, False, False), (True, False, True), (False, True, True)])
def test_a_job_locks_its_gpu_as_its_experiment_declares(monkeypatch, timing, alone, exclusive):
    """A timing job, and one that takes much of the GPU's memory (``alone``), runs by itself on its GPU; only
    a timing job also keeps plotting off the host. (An 80 GB H100 ran flash_attention/past_wall out of memory
    beside the limits jobs while these shared it.)"""
    from lab import gpu

    asked = {}

    def pin(lock_dir, exclusive, timing=None):
        asked.update(exclusive=exclusive, timing=timing)
        raise _Pinned

    exp = units.Experiment("demo", "probe", lambda s: [], timing, True, timing, alone)
    monkeypatch.setattr(units, "registry", lambda: {"demo/probe": exp})
    monkeypatch.setattr(gpu, "pin", pin)
    with pytest.raises(_Pinned):
        runner.run("demo/probe", {"seed": 0}, {"backend": "gpu"}, "code", "unused.parquet")
    assert asked == {"exclusive": exclusive, "timing": timing}


def test_the_experiments_that_fill_a_gpu_run_alone():
    """Every past-2**31 probe and the peak-memory sweep against SDPA's math backend (tens of GB at S=16384)."""
    registry = units.registry()
    heavy = {k for k in registry if k.endswith("/limits")} | {"flash_attention/past_wall"}
    assert len(heavy) == 5
    assert {k for k, e in registry.items() if e.alone} == heavy
    assert all(registry[k].exclusive and not registry[k].timing for k in heavy)
