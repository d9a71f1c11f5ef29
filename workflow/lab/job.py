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

from . import provenance, runner

CHILD = "LAB_JOB_CHILD"  # set in the child process that runs the experiment itself
PARENT = "LAB_JOB_PARENT"  # the job's own process id, in that child


def export_environment(overwrite_foreign: bool) -> None:
    """What the workflow passes to every job through the environment of its own process (not part of any
    job's params): the Python to run (LAB_PYTHON, the planner's) and the foreign-run override."""
    os.environ["LAB_PYTHON"] = sys.executable
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
    sent = []

    def pass_on(signum, frame):
        sent.append(signum)
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    status = child.wait()
    if sent:
        sys.exit(128 + sent[0])
    if status < 0:
        runner.record_death(args.experiment, args.settings, args.software, args.code, args.output, -status,
                            started, rerun_marker=args.rerun_marker)
    elif status > 0:
        sys.exit(status)


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
