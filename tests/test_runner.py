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
