"""When something fails, on a tiny-config run in a temporary copy of the project: an experiment that raises
or dies by a signal fails alone and is retried; an interrupted run (SIGINT, SIGKILL, SIGTERM) leaves no table
that reads as complete; a restored old table is rerun whatever Snakemake's records say; an unreadable table
is named and made again (or, in another machine's run, leaves its claims not settled); two runs at once
write only their own folders; a run from another folder is refused."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import runs_in
from pipeline import EXPERIMENT_RULES, ROOT, SNAKEMAKE, digests, job_stats, planned, report_rows, smk


def test_a_restored_old_table_is_rerun_even_where_snakemake_has_records_of_it(project, tmp_path):
    """Snakemake skips an input whose checksum matches its record; the fingerprint still catches the table."""
    bug = project / "results/tiny/softmax/bug.parquet"
    seed0 = tmp_path / "bug-seed0.parquet"
    seed0.write_bytes(bug.read_bytes())
    target = ["--", "results/tiny/softmax/bug.parquet"]
    smk(project, "--cores", "1", "--config", "seed=1", *target)
    bug.write_bytes(seed0.read_bytes())  # the seed-0 table back, under seed=1
    assert job_stats(smk(project, "-n", "--config", "seed=1", *target).stdout).get("softmax") == 1
    smk(project, "--cores", "1", "--config", "seed=1", *target)  # the stale table is rerun, once:
    assert "Nothing to be done" in smk(project, "-n", "--config", "seed=1", *target).stdout  # its marker recorded
    smk(project, "--cores", "1")  # back at seed 0: its records say seed=1, so it reruns, and then all is current
    assert planned(project) == {}


# --- failures cost nothing ------------------------------------------------------------------------------------

def assert_only_softmax_bug_ran(done):
    """The run's job stats name one softmax job and no other experiment's (a deterministic table rerun on the
    CPU keeps its digest, so the digests alone would not tell)."""
    ran = job_stats(done.stderr)
    assert ran.get("softmax") == 1 and not {rule for rule in ran if rule in EXPERIMENT_RULES} - {"softmax"}, ran


FAILING_BUG = b'''

@experiment()
def bug(s: dict) -> list[dict]:  # injected by a test: this experiment raises
    raise RuntimeError("injected failure")
'''


def test_a_failing_experiment_fails_only_its_own_claims(project):
    tiny = project / "results/tiny"
    experiments = project / "workflow/lab/units/softmax.py"
    original = experiments.read_bytes()
    others = {k: v for k, v in digests(tiny).items() if not k.startswith("softmax/")}
    experiments.write_bytes(original + FAILING_BUG)
    try:
        done = smk(project, "--cores", "2")
    finally:
        experiments.write_bytes(original)
    assert "1 experiment(s) failed: softmax/bug" in done.stderr
    assert_only_softmax_bug_ran(done)
    bug = pd.read_parquet(tiny / "softmax/bug.parquet")
    assert list(bug["status"]) == ["failed"] and "injected failure" in bug["error"].iloc[0]
    assert {k: v for k, v in digests(tiny).items() if not k.startswith("softmax/")} == others  # the rest stand
    rows = report_rows(project)
    for claim in (5, 6, 7, 8, 16, 19):  # the claims softmax/bug settles, and only those
        assert rows[claim][4].strip() == "not settled" and "softmax/bug job failed" in rows[claim][3]
    assert rows[1][4].strip() == "reproduced" and rows[4][4].strip() == "reproduced"
    assert (tiny / "figures/softmax_bug.png").exists()  # a placeholder that says why
    # The failed table is retried on the next run, and then all is as before.
    assert planned(project).get("softmax") == 1  # that table alone: only its experiment's code changed back
    smk(project, "--cores", "2")
    assert report_rows(project)[6][4].strip() == "reproduced"


def living_in_group(pgid: int, besides: int) -> list[int]:
    """The processes of process group ``pgid`` but ``besides`` that have not ended (zombies have)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
        except OSError:
            continue
        state, _, group = rest.rsplit(") ", 1)[1].split()[:3]
        if int(group) == pgid and int(pid) != besides and state not in "ZX":
            found.append(int(pid))
    return found


def described(pids: list[int]) -> list[str]:
    """Each process's pid, command line, state and signal masks (blocked, ignored, caught), for a failure's
    message: why a signal did not end it."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):  # it ended meanwhile
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt"))]
            found.append(f"{pid} {command[:160]} {' '.join(' '.join(status).split())}")
    return found


CORRECTNESS = "results/tiny/flash_attention/correctness.parquet"  # the table the signal tests interrupt
CORRECTNESS_LOG = "results/tiny/logs/flash_attention/correctness.log"


def start_correctness(project: Path, sink, **popen) -> subprocess.Popen:
    """Snakemake made to run flash_attention's correctness job again (tiny config), its output to ``sink``."""
    (project / CORRECTNESS_LOG).unlink(missing_ok=True)
    return subprocess.Popen([*SNAKEMAKE, "--configfile", "tests/tiny_config.yaml", "--cores", "1", "--forcerun",
                             "flash_attention", "--", CORRECTNESS], cwd=project, env=runs_in(project), stdout=sink,
                            stderr=subprocess.STDOUT, **popen)


def wait_until_computing(project: Path, proc: subprocess.Popen) -> None:
    """Until the correctness job's log says its backend: the job is computing (five minutes allowed)."""
    job_log = project / CORRECTNESS_LOG
    deadline = time.monotonic() + 300
    while not (job_log.exists() and "backend=" in job_log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)


def slow_correctness(seconds: int) -> bytes:
    """flash_attention's correctness experiment made to wait ``seconds`` before it computes (appended to its
    unit by a test), so that it is surely still running when the test's signal comes."""
    return f'''

_correctness = correctness


@experiment()
def correctness(s: dict) -> list[dict]:  # injected by a test: still computing when the signal comes
    import time
    time.sleep({seconds})
    return _correctness(s)
'''.encode()


@pytest.mark.parametrize("sig, group", [(signal.SIGINT, True), (signal.SIGKILL, True), (signal.SIGKILL, False)])
def test_an_interrupted_run_leaves_no_table_that_reads_as_complete(project, tmp_path, sig, group):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it), a kill of everything, and a kill of
    Snakemake alone: its jobs end with it (lab.job.end_with_workflow) rather than run on beside a recovery.
    The job is made to compute for ten minutes, so that it is surely still running when the signal comes (the
    tiny job itself can finish within end_with_workflow's poll of a second), and that one left running is seen
    (a minute and a half allowed for the ending, on a loaded machine). Whatever fails, nothing of the run
    outlives the test (the next test's run would find it holding the directory)."""
    target, job_log = project / CORRECTNESS, project / CORRECTNESS_LOG
    out = tmp_path / "snakemake.out"
    experiments = project / "workflow/lab/units/flash_attention.py"
    original = experiments.read_bytes()
    experiments.write_bytes(original + slow_correctness(600))
    proc = None
    try:
        with out.open("w") as sink:
            # as from a terminal, whose Ctrl-C reaches a Snakemake that has not been told to ignore it (a
            # pytest started in the background by a shell without job control ignores SIGINT, and its children too)
            proc = start_correctness(project, sink, start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            wait_until_computing(project, proc)
            (os.killpg if group else os.kill)(proc.pid, sig)
            deadline = time.monotonic() + 90
            while alive := living_in_group(proc.pid, besides=proc.pid):  # Snakemake not yet reaped: a zombie
                assert time.monotonic() < deadline, (f"the run's jobs outlived it: {described(alive)}; Snakemake "
                                                     f"{described([proc.pid])}, its output {out.read_text()[-1500:]}")
                time.sleep(0.2)
            proc.wait(timeout=120)
    finally:
        experiments.write_bytes(original)
        if proc and (proc.poll() is None or living_in_group(proc.pid, besides=proc.pid)):  # failed: end it all,
            with contextlib.suppress(ProcessLookupError):  # and make the table again for the tests after this
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            smk(project, "--unlock")
            smk(project, "--cores", "1", "--rerun-incomplete")
    assert not target.exists()  # Snakemake removed the old table before the job; no new one was finished
    if sig == signal.SIGINT:
        assert "the run was interrupted (Ctrl-C)" in out.read_text() and "A job failed" not in out.read_text()
    else:  # nothing could clean up: the directory lock stays until --unlock
        smk(project, "--unlock")
    if not group:
        assert "Snakemake (pid" in job_log.read_text() and "this job ends too" in job_log.read_text()
    smk(project, "--cores", "1", "--rerun-incomplete")
    assert pd.read_parquet(target)["status"].eq("ok").all()
    assert planned(project) == {}


def test_ctrl_c_to_a_script_that_runs_snakemake_in_the_background_leaves_its_jobs_running(project, tmp_path):
    """A shell script's background job (`snakemake ... &`) is started with SIGINT ignored; a Ctrl-C meant for
    the script reaches its whole process group. The jobs must ignore it as Snakemake does: the job that is
    computing finishes and its table stands (a job that passed the signal on failed after its experiment
    had finished, and Snakemake deleted the finished table)."""
    experiments = project / "workflow/lab/units/flash_attention.py"
    original = experiments.read_bytes()
    experiments.write_bytes(original + slow_correctness(5))
    try:
        with (tmp_path / "snakemake.out").open("w") as sink:
            proc = start_correctness(project, sink, start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            wait_until_computing(project, proc)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=300)
    finally:
        experiments.write_bytes(original)
    assert proc.returncode == 0, (tmp_path / "snakemake.out").read_text()[-3000:]
    assert pd.read_parquet(project / CORRECTNESS)["status"].eq("ok").all()
    smk(project, "--cores", "1")  # the table of the slowed code is out of date with the original: made again
    assert planned(project) == {}


def test_a_job_leaves_a_signal_it_was_started_to_ignore_ignored():
    """lab.job.pass_signals_on, in a process started with SIGINT ignored: SIGINT stays ignored, SIGTERM is
    passed on to the child."""
    code = """
import signal, subprocess, sys
from lab import job
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
sent, pass_on = job.pass_signals_on(child)
print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is pass_on)
signal.raise_signal(signal.SIGTERM)
print(sent, child.wait())
"""
    done = subprocess.run([sys.executable, "-c", code], env=runs_in(ROOT), capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["True True", f"[{int(signal.SIGTERM)}] {-int(signal.SIGTERM)}"]


def test_sigterm_to_snakemake_lets_the_running_job_finish_and_says_that_none_failed(project, tmp_path):
    """Snakemake stops gracefully on SIGTERM: the running job completes its table, and Snakemake still ends
    with 'At least one job did not complete successfully'; the workflow says no job failed."""
    out = tmp_path / "snakemake.out"
    with out.open("w") as sink:
        proc = start_correctness(project, sink)
        wait_until_computing(project, proc)
        proc.send_signal(signal.SIGTERM)  # to Snakemake alone, as a scheduler or `kill` sends it
        proc.wait(timeout=300)
    text = out.read_text()
    assert proc.returncode != 0 and "did not complete successfully" in text
    assert "No job failed: Snakemake was stopped" in text and "A job failed" not in text
    assert pd.read_parquet(project / CORRECTNESS)["status"].eq("ok").all()
    assert not set(planned(project)) & EXPERIMENT_RULES  # the table stands: no experiment to run again


def test_two_runs_at_once_write_only_their_own_results(project):
    procs = [subprocess.Popen([*SNAKEMAKE, "--configfile", "tests/tiny_config.yaml", "--config", f"run={name}",
                               "--cores", "1", "--", f"results/{name}/softmax/bug.parquet"],
                              cwd=project, env=runs_in(project), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name in ("left", "right")]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for name in ("left", "right"):
        assert sorted(p.name for p in (project / "results" / name).rglob("*.parquet")) == ["bug.parquet"]


def test_an_unreadable_table_is_named_and_made_again_and_blocks_no_plan(project):
    """A truncated table in this machine's run: the plan names it and reruns it (and only it, with what
    reads it); afterwards everything is current again."""
    bug = project / "results/tiny/softmax/bug.parquet"
    bug.write_bytes(bug.read_bytes()[:100])
    done = smk(project, "-n")
    assert f"{bug.relative_to(project)} cannot be read as a table" in done.stderr and "it is made again" in done.stderr
    assert {r: n for r, n in job_stats(done.stdout).items() if r in EXPERIMENT_RULES} == {"softmax": 1}
    smk(project, "--cores", "2")
    assert planned(project) == {}


def test_an_unreadable_table_of_another_machine_leaves_its_claims_not_settled(project, tmp_path):
    """A copy of the committed GPU run with one table cut short: this machine cannot remake it, so the
    plan says so, draws none of its figures, and still builds the report."""
    run = project / "results/h200copy"
    for table in (ROOT / "results/nvidia-h200").glob("*/*.parquet"):
        (run / table.parent.name).mkdir(parents=True, exist_ok=True)
        (run / table.parent.name / table.name).write_bytes(table.read_bytes())
    bug = run / "softmax/bug.parquet"
    bug.write_bytes(bug.read_bytes()[:100])
    done = smk(project, "-n", "--config", "run=h200copy")
    assert "softmax/bug.parquet cannot be read as a table" in done.stderr and "not settled" in done.stderr
    plan = job_stats(done.stdout)
    assert plan.get("report") == 1 and "figure_softmax_bug" not in plan and not set(plan) & EXPERIMENT_RULES


def test_a_table_missing_from_another_machines_run_leaves_its_claims_not_settled(project):
    """A copy of the committed GPU run without one table (as a run made before a new experiment lacks its
    table): the plan names it, draws none of its figures, runs no experiment, and builds the report."""
    run = project / "results/h200gap"
    for table in (ROOT / "results/nvidia-h200").glob("*/*.parquet"):
        if table.parent.name != "softmax" or table.name != "bug.parquet":
            (run / table.parent.name).mkdir(parents=True, exist_ok=True)
            (run / table.parent.name / table.name).write_bytes(table.read_bytes())
    done = smk(project, "-n", "--config", "run=h200gap")
    assert "has no table softmax/bug" in done.stderr and "not settled" in done.stderr
    plan = job_stats(done.stdout)
    assert plan.get("report") == 1 and "figure_softmax_bug" not in plan and not set(plan) & EXPERIMENT_RULES


DYING_BUG = b'''

@experiment()
def bug(s: dict) -> list[dict]:  # injected by a test: this experiment's process dies by a fault
    import os, signal
    os.kill(os.getpid(), signal.SIGSEGV)
'''


def test_an_experiment_that_dies_by_a_signal_leaves_a_failed_table_and_the_run_goes_on(project):
    tiny = project / "results/tiny"
    unit = project / "workflow/lab/units/softmax.py"
    original = unit.read_bytes()
    unit.write_bytes(original + DYING_BUG)
    try:
        done = smk(project, "--cores", "2", "results/tiny/report.md")
    finally:
        unit.write_bytes(original)
    assert "1 experiment(s) failed: softmax/bug" in done.stderr
    assert_only_softmax_bug_ran(done)
    bug = pd.read_parquet(tiny / "softmax/bug.parquet")
    assert list(bug["status"]) == ["failed"] and "died by SIGSEGV" in bug["error"].iloc[0]
    assert "DIED by SIGSEGV" in (tiny / "logs/softmax/bug.log").read_text()
    assert report_rows(project)[6][4].strip() == "not settled"
    smk(project, "--cores", "2")  # retried, and then all is as before
    assert report_rows(project)[6][4].strip() == "reproduced"


def test_a_run_from_another_folder_is_refused_saying_where_to_run(project, tmp_path):
    done = subprocess.run([*SNAKEMAKE, "-n", "-s", str(project / "Snakefile")], cwd=tmp_path,
                          env=runs_in(project), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and f"run snakemake in the project's folder ({project})" in done.stdout + done.stderr


def test_the_experiments_process_ends_when_its_job_is_killed(tmp_path):
    """A job killed outright (SIGKILL: no signal to pass on) must not leave its experiment running to write
    the table later: the child process dies with it (lab.job.die_with_parent)."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, time
from lab import job
job.die_with_parent(int(os.environ["LAB_JOB_PARENT"]))
open({str(pid_file)!r}, "w").write(str(os.getpid()))
time.sleep(60)
'''], env={{**os.environ, "LAB_JOB_PARENT": str(os.getpid())}})
child.wait()
"""], env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "workflow")])})
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the experiment's process outlived its job"
        time.sleep(0.1)


@pytest.mark.parametrize("failed", ["attention/wall", "flash_attention/performance"])
def test_a_failed_table_leaves_its_sections_not_settled_and_the_report_whole(tmp_path, failed):
    """The committed run's tables with one replaced by a failed experiment's table: the report is written,
    naming the failure where that table was needed (every other section built as before)."""
    from lab import report, units

    tables = {f"{p.parent.name}/{p.stem}": pd.read_parquet(p) for p in (ROOT / "results/nvidia-h200").glob("*/*.parquet")}
    tables[failed] = pd.DataFrame({"metric": ["not_measured"], "value": [None], "status": ["failed"],
                                   "error": ["RuntimeError: injected failure"]})
    verdicts = report.build(tables, str(ROOT / "workflow/claims.yaml"), [], str(tmp_path / "report.md"))
    page = (tmp_path / "report.md").read_text()
    assert f"Not settled: the `{failed}` job failed (RuntimeError: injected failure)." in page
    needs = {i for i, check in units.checks().items() if failed in check.tables}
    unsettled = set(verdicts.loc[verdicts["verdict"] == "not settled", "id"])
    assert unsettled == needs and len(unsettled) < len(verdicts)  # its claims only (flash_attention's: none)
