"""End to end: the Snakemake workflow on a tiny config in a temporary copy of the project.

Checks the report's verdicts, that one experiment can be rerun alone, that the report can be rebuilt
alone, and that bad config is refused before any job runs."""
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def smk(workdir, *args, check=True):
    done = subprocess.run([*SNAKEMAKE, "--configfile", "tests/tiny_config.yaml", *args], cwd=workdir,
                          capture_output=True, text=True, timeout=900)
    if check and done.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return done


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    work = tmp_path_factory.mktemp("lab")
    for item in ("Snakefile", "config.yaml", "workflow", "kernels", "tests"):
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    smk(work, "--cores", "2")
    return work


def report_rows(project):
    text = (project / "results/tiny/report.md").read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    return {int(r[0].strip("| ")): r for r in rows}


def test_report_settles_every_claim(project):
    rows = report_rows(project)
    assert sorted(rows) == list(range(1, 14))
    verdict = {i: r[4].strip() for i, r in rows.items()}
    for claim in (1, 2, 3, 5, 6, 7, 8, 9):
        assert verdict[claim] == "reproduced", (claim, rows[claim])
    for claim in (10, 11, 12, 13):  # honest about what the interpreter cannot show
        assert verdict[claim] == "needs a GPU", (claim, rows[claim])
    assert "max \\|diff\\| 0.0" in rows[6][3] and "columns never written" in rows[6][3]
    assert (project / "results/tiny/figures/softmax_bug.png").stat().st_size > 10_000


def test_tables_are_tidy_with_provenance(project):
    df = pd.read_parquet(project / "results/tiny/softmax/bug.parquet")
    for col in ("kernel", "metric", "value", "unit", "status", "device", "backend", "triton", "git_commit",
                "config_hash"):
        assert col in df
    assert set(df["backend"]) == {"interpreter"}
    hard = df[(df.metric == "columns_dropped") & (df.variant == "hardcoded")].set_index("n_cols")["value"]
    assert hard.to_dict() == {5: 0, 512: 0, 1024: 0, 1025: 1, 2000: 976}


def job_stats(dry_run_output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    lines = dry_run_output.split("Job stats:")[1].splitlines()[3:]
    stats = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        stats[parts[0]] = int(parts[1])
    return stats


def test_forcerun_reruns_only_that_experiment_and_its_dependents(project):
    alone = smk(project, "-n", "--forcerun", "softmax", "--", "results/tiny/softmax/bug.parquet").stdout
    assert job_stats(alone) == {"softmax": 1}
    smk(project, "--cores", "1", "--forcerun", "softmax", "--", "results/tiny/softmax/bug.parquet")
    # The next full run redoes only what depends on the new table.
    downstream = smk(project, "-n").stdout
    assert job_stats(downstream) == {"figure_softmax_bug": 1, "report": 1, "all": 1}


def test_report_regenerates_alone(project):
    report = project / "results/tiny/report.md"
    report.unlink()
    out = smk(project, "--cores", "1", "report").stdout + smk(project, "-n", "all").stdout
    assert report.exists()
    assert "Nothing to be done" in out


@pytest.mark.parametrize("override, key", [("seed=-1", "seed"), ("backend=tpu", "backend"),
                                           ("run=../escape", "run")])
def test_bad_config_is_refused_naming_the_key(project, override, key):
    done = smk(project, "-n", "--config", override, check=False)
    assert done.returncode != 0
    assert key in (done.stdout + done.stderr)


def test_empty_range_is_refused(tmp_path, project):
    bad = tmp_path / "bad.yaml"
    bad.write_text("vector_add:\n  performance: {log2_sizes: [20, 12], log2_step: 2, dtype: float32}\n")
    done = smk(project, "-n", "--configfile", str(bad), check=False)
    assert done.returncode != 0
    assert "vector_add.performance.log2_sizes" in done.stdout + done.stderr
