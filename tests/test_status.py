"""python -m lab status: which tables of a run are out of date with this checkout, decided from content."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lab import plan, status
from lab.units import registry

ROOT = Path(__file__).resolve().parents[1]
CONFIG = status.config_of([str(ROOT / "config.yaml"), str(ROOT / "tests/tiny_config.yaml")])


# The machine the fixture's run was made on; status.this_machine() is made to say this is it.
HERE = {"device": "NVIDIA H200", "backend": "gpu", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0",
        "cudnn": "91300", "driver": "580.159.04", "kernel_env": ""}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run whose every table records exactly the hashes and software this checkout and machine expect."""
    monkeypatch.setattr(status, "this_machine", lambda config: HERE)
    for key, want in plan.expected(CONFIG, registry()).items():
        path = tmp_path / f"{key}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([{"metric": "x", "value": 1.0, "status": "ok", **HERE,
                       "fingerprint": "f" * 16, "config_hash": want["config_hash"], "code_hash": want["code_hash"],
                       "git_commit": "abc123"}]).to_parquet(path)
    return tmp_path


def test_other_software_on_the_same_device_is_stale_and_on_another_device_is_not_judged(run):
    t = run / "softmax/bug.parquet"
    pd.read_parquet(t).assign(torch="2.10.0", kernel_env="KERNELS_FLASH_WS=0").to_parquet(t)
    states = dict(status.check(run, CONFIG, HERE))
    assert states["softmax/bug"] == ("stale: software (torch 2.10.0 -> 2.11.0, kernel_env KERNELS_FLASH_WS=0 -> "
                                     "(none)) changed since commit abc123")
    assert states["softmax/correctness"] == "current"
    assert dict(status.check(run, CONFIG, {**HERE, "device": "NVIDIA H100"}))["softmax/bug"] == "current"


def test_a_current_run_exits_0(run, capsys):
    assert status.main([str(run), "--configfile", str(ROOT / "tests/tiny_config.yaml")]) == 0
    assert f"all {len(list(run.glob('*/*.parquet')))} tables current" in capsys.readouterr().out


def test_changed_settings_and_missing_tables_say_why_and_exit_1(run, tmp_path_factory, capsys):
    (run / "softmax/bug.parquet").unlink()
    other = tmp_path_factory.mktemp("cfg") / "seed.yaml"
    other.write_text("seed: 1\n")
    assert status.main([str(run), "--configfile", str(ROOT / "tests/tiny_config.yaml"), "--configfile", str(other)]) == 1
    out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[:-1])
    assert out["softmax/bug"].strip() == "missing"
    assert out["softmax/correctness"].strip() == "stale: settings changed since commit abc123"  # seeded
    assert out["calibration/ceilings"].strip() == "current"  # draws nothing: the seed does not touch it


def test_command_line_settings_count_as_snakemake_would_take_them(run, capsys):
    tiny = str(ROOT / "tests/tiny_config.yaml")
    assert status.main([str(run), "--configfile", tiny, "--config", "seed=1", "softmax={bug: {n_rows: 3}}"]) == 1
    out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[:-1])
    assert out["softmax/correctness"].strip() == "stale: settings changed since commit abc123"  # seeded
    assert out["calibration/ceilings"].strip() == "current"
    with pytest.raises(SystemExit):
        status.main([str(run), "--configfile", tiny, "--config", "seed=one"])
    assert "config key seed" in capsys.readouterr().err


@pytest.mark.parametrize("text, words", [("seed: -1\n", "seed"), ("sofmax: {}\n", "sofmax"),
                                         ("seed: 1\nseed: 2\n", "given twice")])
def test_a_bad_configfile_is_refused_as_the_workflow_refuses_it(run, tmp_path_factory, capsys, text, words):
    bad = tmp_path_factory.mktemp("cfg") / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SystemExit) as done:
        status.main([str(run), "--configfile", str(bad)])
    assert done.value.code == 2 and words in capsys.readouterr().err


def test_a_folder_of_runs_is_not_a_run(run, tmp_path_factory, capsys):
    results = tmp_path_factory.mktemp("results")
    shutil.copytree(run, results / "some-run")
    with pytest.raises(SystemExit) as done:
        status.main([str(results)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "holds runs, it is not one: name one of some-run" in err


def test_a_failed_table_is_stale(run):
    t = run / "vector_add/mask.parquet"
    pd.read_parquet(t).assign(fingerprint="failed").to_parquet(t)
    assert dict(status.check(run, CONFIG))["vector_add/mask"].startswith("stale: the experiment failed")


def damage_pages(path, columns=("metric", "value")):
    """Invert the bytes of these columns' pages, leaving the footer (and the provenance columns) readable."""
    import pyarrow.parquet as pq

    meta, data = pq.ParquetFile(path).metadata, bytearray(path.read_bytes())
    for group in range(meta.num_row_groups):
        for chunk in map(meta.row_group(group).column, range(meta.num_columns)):
            if chunk.path_in_schema in columns:
                start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
                data[start:start + chunk.total_compressed_size] = bytes(
                    b ^ 0xFF for b in data[start:start + chunk.total_compressed_size])
    path.write_bytes(bytes(data))


BROKEN = {  # what a table may be instead of parquet
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:100]),
    "damaged data pages": damage_pages,
    "empty": lambda path: path.write_bytes(b""),
    "not parquet": lambda path: path.write_text("a,b\n1,2\n"),
    "a directory": lambda path: (path.unlink(), path.mkdir()),
}


@pytest.mark.parametrize("how", BROKEN)
def test_an_unreadable_table_is_named_and_nothing_else_breaks(run, how, capsys):
    from lab import runs

    path = run / "softmax/bug.parquet"
    BROKEN[how](path)
    rec = runs.recorded(path)
    assert rec["fingerprint"] is None and str(path) in rec["unreadable"] and "cannot be read" in rec["unreadable"]
    assert runs.recorded(run / "softmax/wide.parquet")["unreadable"] is None
    assert runs.owners(run) == {("NVIDIA H200", "gpu")}  # the readable tables still say whose run it is
    assert status.main([str(run), "--configfile", str(ROOT / "tests/tiny_config.yaml")]) == 1
    out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[:-1])
    assert out["softmax/bug"].startswith("unreadable: ") and out["softmax/wide"].strip() == "current"


def test_a_folder_of_runs_beside_comparisons_or_the_comparisons_are_not_a_run(run, tmp_path_factory, capsys):
    """results/ holds runs and compare/ (whose tables lie one level down, like a run's): neither is a run."""
    results = tmp_path_factory.mktemp("results")
    shutil.copytree(run, results / "some-run")
    (results / "compare").mkdir()
    (results / "compare/a_vs_b.parquet").write_bytes(b"")
    for folder, words in ((results, "holds runs, it is not one: name one of some-run"),
                          (results / "compare", "holds tables of its own")):
        with pytest.raises(SystemExit) as done:
            status.main([str(folder)])
        assert done.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, b"\xff\xfe\x00binary", b"a: [unclosed"], ids=["missing", "binary", "not yaml"])
def test_a_config_file_that_cannot_be_read_is_a_usage_error_naming_it(run, tmp_path, capsys, content):
    path = tmp_path / "more.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as done:
        status.main([str(run), "--configfile", str(path)])
    assert done.value.code == 2 and "cannot be read" in capsys.readouterr().err


def test_a_run_holding_tables_of_two_machines_is_not_called_current(run, capsys):
    """The workflow builds no report from such a folder: status says so, and exits 1."""
    path = run / "vector_add/mask.parquet"
    pd.read_parquet(path).assign(device="NVIDIA H100").to_parquet(path)
    assert status.main([str(run), "--configfile", str(ROOT / "tests/tiny_config.yaml")]) == 1
    assert "holds tables of 2 machines" in capsys.readouterr().out


def test_run_in_another_checkout_than_python_imports_it_refuses_naming_both(run, tmp_path, monkeypatch, capsys):
    other = tmp_path / "other-checkout"
    (other / "workflow/lab").mkdir(parents=True)
    (other / "workflow/lab/status.py").write_text("")
    monkeypatch.chdir(other / "workflow")
    with pytest.raises(SystemExit) as done:
        status.main([str(run)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and str(other) in err and str(ROOT) in err


def test_the_owner_check_names_whose_tables_a_run_holds(run):
    from lab import runs

    n = len(list(run.glob("*/*.parquet")))
    with pytest.raises(runs.ForeignRunError, match=rf"{run} was made on NVIDIA H200 \(gpu\); this machine is cpu"):
        runs.check_owner(run, "cpu", "interpreter")
    runs.check_owner(run, "NVIDIA H200", "gpu")  # its own run
    t = run / "softmax/bug.parquet"  # one table copied in from another machine
    pd.read_parquet(t).assign(device="NVIDIA H100", backend="gpu").to_parquet(t)
    with pytest.raises(runs.ForeignRunError, match=rf"{run} holds tables made on NVIDIA H100 \(gpu\) \(1 of its {n} "
                                                   r"tables: softmax/bug\); this machine is NVIDIA H200"):
        runs.check_owner(run, "NVIDIA H200", "gpu")
    runs.check_owner(run, "NVIDIA H200", "gpu", overwrite=True)


@pytest.mark.parametrize("args, code, words", [(["--help"], 0, "status"), ([], 2, "no command"),
                                                (["stat", "results/x"], 2, "unknown command 'stat'")])
def test_the_command_line_says_what_it_takes(args, code, words):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True,
                          cwd=Path(status.__file__).parents[1])
    assert done.returncode == code and words in done.stdout + done.stderr
