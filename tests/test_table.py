import pandas as pd
import pyarrow as pa
import pytest

from lab import table

PROV = {key: f"<{key}>" for key in table.PROVENANCE}  # every origin column a job records


def test_rows_get_schema_and_provenance(tmp_path):
    rows = [table.row("max_abs_diff", 0.5, n_cols=3), table.needs_gpu("timing")]
    df = table.to_frame(rows, "softmax", "bug", PROV)
    assert list(df.columns[:9]) == table.COLUMNS
    assert set(table.PROVENANCE) <= set(df.columns)
    assert df["status"].tolist() == ["ok", "needs_gpu"]
    path = tmp_path / "t.parquet"
    table.write_parquet(df, path)
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temporary file left behind


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "t.parquet"
    good = table.to_frame([table.row("m", 1.0)], "k", "e", PROV)
    table.write_parquet(good, path)
    bad = good.assign(value=[object()])  # pyarrow cannot write this
    with pytest.raises(pa.ArrowException):
        table.write_parquet(bad, path)
    pd.testing.assert_frame_equal(pd.read_parquet(path), good)
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_unknown_status_and_empty_tables_are_refused():
    with pytest.raises(ValueError):
        table.row("m", 1.0, status="fine")
    with pytest.raises(ValueError, match="no rows"):
        table.to_frame([], "k", "e", PROV)
