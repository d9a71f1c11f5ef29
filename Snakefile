# The Triton kernel laboratory: correctness, statistics and performance experiments for every kernel
# of the writeup and beyond, then figures and a report that settles each of its claims.
#   snakemake --cores all                           everything, on a GPU or in Triton's interpreter
#   snakemake --cores 1 report --forcerun report    the report alone, from existing tables
#   snakemake --cores 1 results/compare/A_vs_B.md   two runs side by side
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.0")

# Every path of the pipeline (config.yaml, kernels/, workflow/, results/) is relative to this folder.
if os.path.realpath(workflow.basedir) != os.path.realpath(os.getcwd()):
    raise WorkflowError(f"run snakemake in the project's folder ({workflow.basedir}), not in {os.getcwd()}: "
                        "its paths are relative to it, so -s/-d pointing elsewhere are not supported "
                        "(use --config run=NAME for a run of your own)")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/compare.smk"


rule all:
    localrule: True
    default_target: True
    input:
        REPORT,


onsuccess:
    _failed = [k for k in EXPERIMENTS if (runs.recorded(table(k)) or {}).get("fingerprint") == "failed"]
    if _failed:
        print(f"WARNING: {len(_failed)} experiment(s) failed: {', '.join(_failed)}. Each is recorded as a failed "
              f"table (its log under {OUT}/logs/ has the traceback) and retried on the next run; the report marks "
              "the claims they settle 'not settled'.", file=sys.stderr)


onerror:
    # Snakemake ends here when a job fails, and also when it is asked to stop: SIGTERM lets the running
    # jobs finish, then reports "At least one job did not complete successfully" even if none failed; Ctrl-C
    # stops the jobs too, which it then reports as errors in their rules.
    _logs = [Path(p) for p in ([log] if isinstance(log, str) else log or [])]  # Snakemake's own log(s)
    _text = "".join(p.read_text(errors="replace") for p in _logs if p.exists())
    if "Terminating processes on user request" in _text:
        _what = "No experiment failed: the run was interrupted (Ctrl-C) and the jobs it stopped recorded nothing"
    elif not _logs or not all(p.exists() for p in _logs) or "Error in rule" in _text:
        _what = f"A job failed (above, and its log under {OUT}/logs/)"
    else:
        _what = "No job failed: Snakemake was stopped (SIGTERM waits for the running jobs) before the run was complete"
    print(f"{_what}. Every table written is complete (tables are written atomically); `snakemake -n` lists what "
          "is left and `snakemake --cores all` goes on from there (with this command's --configfile and --config, "
          "if it had any: they name the run and its settings).", file=sys.stderr)
