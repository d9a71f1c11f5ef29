"""What the pipeline tests share: Snakemake on a temporary copy of the project, run on the tiny config
(built once per session and copied for each test module: the module-scoped ``project`` fixture), and
readers of its output."""
import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_project, runs_in

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def smk(workdir, *args, check=True, config="tests/tiny_config.yaml"):
    done = subprocess.run([*SNAKEMAKE, *(["--configfile", config] if config else []), *args], cwd=workdir,
                          env=runs_in(Path(workdir)), capture_output=True, text=True, timeout=900)
    if check and done.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return done


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, worker_id):
    """The project with its tiny-config run made, once for the whole session: pytest-xdist's workers share
    the parent of their temporary folders, and the first to take the lock builds it there."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    built = shared / "tiny-run"
    with open(shared / "tiny-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not built.exists():
            building = shared / "tiny-run.building"
            shutil.rmtree(building, ignore_errors=True)  # a build a dead worker left half done
            building.mkdir()
            copy_project(building)
            smk(building, "--cores", "2")
            building.rename(built)
    return built


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_run):
    """A module's own copy of the built project (file times kept, so Snakemake sees it up to date)."""
    work = tmp_path_factory.mktemp("lab")
    shutil.copytree(tiny_run, work, symlinks=True, dirs_exist_ok=True)
    return work


def report_rows(project):
    text = (project / "results/tiny/report.md").read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    return {int(r[0].strip("| ")): r for r in rows}


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


EXPERIMENT_RULES = {"calibration", "vector_add", "relu_dropout", "softmax", "attention", "flash_attention"}


def planned(project, *args) -> dict[str, int]:
    out = smk(project, "-n", *args).stdout
    return {} if "Nothing to be done" in out else job_stats(out)


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*.parquet"))}
