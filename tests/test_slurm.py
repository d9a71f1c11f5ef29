"""The SLURM profile on a real SLURM cluster: tests/slurm/start.sh brings up a one-node cluster on this
machine (slurmctld, slurmd, slurmdbd for sacct), then the tiny-config workflow runs through
`--workflow-profile workflow/profiles/slurm`, for one experiment of each kernel and a figure drawn from
one of them (the whole tiny run, 24 jobs, took five minutes on a CI machine; tests/test_workflow.py runs
it whole, locally). Experiment jobs must go through sbatch and complete (sacct says so); figures must run
on the submitting machine.

Needs root (it installs and starts daemons). In CI it must run: there a missing cluster is a failure."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_project

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI") == "true"

if not IN_CI and (os.geteuid() != 0 or not shutil.which("apt-get")):
    pytest.skip("needs root and apt-get to start a SLURM cluster (CI runs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster():
    done = subprocess.run(["bash", str(ROOT / "tests/slurm/start.sh")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"SLURM did not start:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


# One short experiment per kernel, and a figure that reads one of them.
TABLES = ["calibration/ceilings", "vector_add/mask", "relu_dropout/correctness", "softmax/bug", "attention/head_dims",
          "flash_attention/past_wall"]
FIGURE = "figures/softmax_bug.png"


def test_experiments_run_as_slurm_jobs_and_aggregation_locally(cluster, tmp_path, capsys):
    env = copy_project(tmp_path)
    # What a user sets for their cluster: the partition, memory and runtime (see README, "On a cluster").
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--workflow-profile", "workflow/profiles/slurm",
         "--configfile", "tests/tiny_config.yaml", "--default-resources", "slurm_partition=debug", "mem_mb=1500",
         "runtime=20", "--slurm-init-seconds-before-status-checks", "5", "--",
         *(f"results/tiny/{t}.parquet" for t in TABLES), f"results/tiny/{FIGURE}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]

    submitted = {job: f"{rule}/{exp}" for job, rule, exp in
                 re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_(\w+)/(\w+)/", log)}
    rules = {key.split("/")[0] for key in submitted.values()}
    assert rules == {"calibration", "vector_add", "relu_dropout", "softmax", "attention", "flash_attention"}, rules
    assert sorted(submitted.values()) == sorted(TABLES)  # every table: one job
    assert sorted(str(p.relative_to(tmp_path / "results/tiny"))[:-8] for p in
                  (tmp_path / "results/tiny").glob("*/*.parquet")) == sorted(TABLES)
    assert not any(r.startswith("figure") for r in rules)  # aggregation stays local...
    assert (tmp_path / "results/tiny" / FIGURE).stat().st_size > 5_000  # ...and ran

    sacct = subprocess.run(["sacct", "-X", "--parsable2", "--noheader", "--format=JobIDRaw,State",
                            "-j", ",".join(submitted)], capture_output=True, text=True, check=True).stdout
    states = dict(line.split("|") for line in sacct.split())
    with capsys.disabled():  # into the test log, passing or not: which job went where, and how it ended
        print("\nSLURM jobs (sbatch id, experiment, sacct state):")
        for job_id, key in sorted(submitted.items(), key=lambda kv: int(kv[0])):
            print(f"  {job_id:>5}  {key:<28} {states.get(job_id)}")
    assert set(states) == set(submitted) and set(states.values()) == {"COMPLETED"}, states
