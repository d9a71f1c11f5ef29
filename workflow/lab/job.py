"""Command line of one experiment job (the workflow's experiment rules call this):

    python -m lab.job softmax/bug results/<run>/softmax/bug.parquet --settings JSON --software JSON --code HASH
        [--rerun-marker NAME]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from . import provenance, runner

CHILD = "LAB_JOB_CHILD"  # set in the child process that runs the experiment itself
PARENT = "LAB_JOB_PARENT"  # the job's own process id, in that child
WORKFLOW = "LAB_WORKFLOW_PID"  # the Snakemake process that runs the jobs (it sets this when it reads the workflow)


def export_environment(overwrite_foreign: bool) -> None:
    """What the workflow passes to every job through the environment of its own process (not part of any
    job's params): the Python to run (LAB_PYTHON, the planner's), the process that runs the jobs (a job
    ends when it does: end_with_workflow) and the foreign-run override."""
    os.environ["LAB_PYTHON"] = sys.executable
    os.environ[WORKFLOW] = str(os.getpid())
    os.environ["LAB_OVERWRITE_FOREIGN_RUN"] = "1" if overwrite_foreign else "0"


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m lab.job", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", help="kernel/experiment, e.g. softmax/bug")
    ap.add_argument("output", help="the parquet table to write")
    ap.add_argument("--settings", type=json.loads, required=True, help="the experiment's settings (JSON)")
    ap.add_argument("--software", type=json.loads, required=True, help="the software it is planned for (JSON)")
    ap.add_argument("--code", required=True, help="content hash of the source files it runs")
    ap.add_argument("--rerun-marker", default="", help="the stale marker the job waited for, if any (recorded)")
    args = ap.parse_args(argv)
    if os.environ.get(CHILD) == "1":
        die_with_parent(int(os.environ.get(PARENT, "0")))
        runner.run(args.experiment, args.settings, args.software, args.code, args.output,
                   overwrite_foreign=os.environ.get("LAB_OVERWRITE_FOREIGN_RUN") == "1", rerun_marker=args.rerun_marker)
        return
    # The experiment runs in a child process: if a fault kills it (a segfault, a GPU error that aborts),
    # this process still records the death as the experiment's failed table, as runner.run records an
    # exception, and the other jobs go on. A refusal (exit status > 0, e.g. another machine's run) stays
    # the job's failure, with no table. A signal sent to the job is passed on and ends it unrecorded.
    started = provenance.now()
    child = subprocess.Popen([sys.executable, "-m", "lab.job", *argv],
                             env={**os.environ, CHILD: "1", PARENT: str(os.getpid())})
    sent, pass_on = pass_signals_on(child)
    end_with_workflow(os.environ.get(WORKFLOW), lambda: pass_on(signal.SIGTERM, None), child)
    status = child.wait()
    if sent:
        sys.exit(128 + sent[0])
    if status < 0:
        runner.record_death(args.experiment, args.settings, args.software, args.code, args.output, -status,
                            started, rerun_marker=args.rerun_marker)
    elif status > 0:
        sys.exit(status)


def pass_signals_on(child: subprocess.Popen) -> tuple[list[int], object]:
    """Pass SIGTERM and SIGINT on to ``child``; return the list of those sent (filled as they come) and the
    handler. A signal this process was started to ignore stays ignored, as it is in the child, which inherits
    that: a shell script's background job ignores SIGINT, and a Ctrl-C meant for the script must not end a
    job whose experiment goes on to finish (the job would fail and Snakemake delete the finished table)."""
    sent = []

    def pass_on(signum, frame):
        sent.append(signum)
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, pass_on)
    return sent, pass_on


def _started(pid: str) -> str | None:
    """When process ``pid`` started (Linux /proc), which tells it from a later process given its pid; None
    if there is no such process, it has ended (a zombie, not yet reaped), or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # from field 3, the state
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]  # field 22, starttime


def end_with_workflow(pid: str | None, stop, child: subprocess.Popen, every: float = 1.0) -> None:
    """Call ``stop`` (which ends ``child``) once Snakemake process ``pid`` has ended, polled from a daemon
    thread: killed outright (SIGKILL), Snakemake leaves its jobs running, orphaned, and a recovery run
    (`--unlock`, `--rerun-incomplete`) would run the same experiment beside them. Nothing to watch when
    the job was not started by the workflow (no pid) or there is no /proc."""
    started = _started(pid) if pid else None
    if started is None:
        return

    def watch():
        while child.returncode is None:
            if _started(pid) != started:
                print(f"lab.job: Snakemake (pid {pid}) has ended; this job ends too, recording nothing",
                      file=sys.stderr, flush=True)
                stop()
                return
            time.sleep(every)

    threading.Thread(target=watch, daemon=True).start()


def die_with_parent(parent: int) -> None:
    """End this process when its parent (the job, pid ``parent``) ends, however it ends (SIGKILL, an
    out-of-memory kill, a scheduler's): otherwise the experiment ran on, orphaned, and wrote its table after
    Snakemake had recorded the job as failed (a retried job could run beside it). Linux (prctl
    PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before that call
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main()
