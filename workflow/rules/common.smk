# Config validation, the plan's facts (backend, software, run), and what each job depends on.
#
# Rerun decisions come from content. Each experiment job declares its settings, the software it runs
# on and a hash of the source files it runs as params, and those files as input; Snakemake's params,
# input and code triggers then rerun exactly what a change touches. Source files are `ancient`: a
# checkout's file dates say nothing about content. A clone has no .snakemake/ records (and records can
# be fooled: a restored old table whose checksum matches them), so the fingerprint every table stores is
# compared here as well: a table whose fingerprint no longer matches gets one more input, a marker named
# after the fingerprint it must have and the file it replaces, newer than the table: the plan makes it
# (under .snakemake/lab/stale/, never under results/), and markers are the only files planning writes.
# The workflow and its jobs import `kernels` and `lab` as installed (`pip install -e .`: this checkout).
import json
import os
import sys
import time
from pathlib import Path

import yaml

from snakemake.exceptions import WorkflowError

import kernels.backend  # no side effects: resolves, does not select
from lab import claims, job, plan, provenance, runs, settings, sources, units
from lab.compare import run_tables
from lab.table import input_name

ROOT = os.path.abspath(workflow.basedir)
if os.path.realpath(sources.ROOT) != os.path.realpath(ROOT):
    raise WorkflowError(f"this workflow is {ROOT}, but Python imports the lab from {sources.ROOT}: run "
                        "`pip install -e .` in this checkout (or put it first on PYTHONPATH) so that its jobs run its code")
settings.check_files(workflow.configfiles)  # YAML mappings, no key given twice
settings.from_command_line(config, dict(workflow.config_settings.config), units.schemas())
settings.validate(config, units.schemas())  # the schema, strictly typed: the top level's and each unit's section
settings.check(config, units.registry())  # what a JSON schema cannot say, before any job starts

BACKEND = kernels.backend.resolve(config["backend"])
SOFTWARE = provenance.software(BACKEND)
RUN = provenance.run_name(SOFTWARE) if config["run"] == "auto" else config["run"]
OUT = f"results/{RUN}"
job.export_environment(config["overwrite_foreign_run"])

# The experiments config.yaml asks for, each one job, and what determines each one's table.
EXPERIMENTS = plan.experiments(config, units.registry())
KERNELS = list(dict.fromkeys(exp.kernel for exp in EXPERIMENTS.values()))
_EXPECTED = plan.expected(config, units.registry())
SETTINGS = {key: e["settings"] for key, e in _EXPECTED.items()}
CODE = {key: e["code"] for key, e in _EXPECTED.items()}
CODE_HASH = {key: e["code_hash"] for key, e in _EXPECTED.items()}
FINGERPRINT = {key: provenance.fingerprint(SETTINGS[key], CODE_HASH[key], SOFTWARE) for key in EXPERIMENTS}


def table(key):
    """results/<run>/<kernel>/<experiment>.parquet for 'kernel/experiment'."""
    return f"{OUT}/{key}.parquet"


def figure(name):
    return f"{OUT}/figures/{name}.png"


# Whose run is this? Only the device and backend that made it may write into it. Another machine gets no
# experiment rules for it at all: a job that merely refused would still lose the table, since Snakemake
# deletes a job's old outputs before it runs and after it fails.
try:
    runs.check_owner(OUT, SOFTWARE["device"], BACKEND, config["overwrite_foreign_run"])
    OWN_RUN = True
except runs.ForeignRunError as refusal:
    OWN_RUN = False
    # A table of it asked for by name on the command line: no rule can make it here, so say why, rather
    # than Snakemake's "No rule to produce". (Read from argv: Snakemake learns its targets only after it has
    # read this file; a target given another way still meets "No rule", after the note below.)
    _run = os.path.realpath(OUT) + os.sep
    _asked = sorted(a for a in sys.argv[1:] if a.endswith(".parquet") and os.path.realpath(a).startswith(_run))
    if _asked:
        raise WorkflowError(f"{refusal} (asked for: {', '.join(_asked)})")
    print(f"Note: {refusal} No experiment is planned there from this machine: its tables are read as they are.",
          file=sys.stderr)
# One run, one machine: a folder holding tables of two (one copied in, say) gets no report mixing them.
_MADE_ON = {}  # "device (backend)" -> its tables here
for _path in sorted(Path(OUT).glob("*/*.parquet")):
    _rec = runs.recorded(_path)
    if _rec and _rec["device"]:
        _MADE_ON.setdefault(f"{_rec['device']} ({_rec['backend']})", []).append(str(_path.relative_to(OUT)))
if len(_MADE_ON) > 1 and not config["overwrite_foreign_run"]:
    raise WorkflowError(f"{OUT} holds tables made on {len(_MADE_ON)} machines, and a report is built from one "
                        "machine's tables only: " + "; ".join(f"{m}: {', '.join(t)}" for m, t in _MADE_ON.items())
                        + ". Move the tables that do not belong there out of the folder.")


def _mark(marker, table_path, newer, content=None):
    """Make a missing marker, or one whose content is not ``content`` (default: its name), dated a second
    after the table (newer: its consumer reruns) or before it (not); with no table, now. Content as well as
    date: Snakemake compares a small input's checksum with the one it recorded before it reruns for a date."""
    named = content is None
    content = (content or os.path.basename(marker)) + "\n"
    if os.path.exists(marker) and (named or Path(marker).read_text() == content):
        return
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    Path(marker).write_text(content)
    if table_path is not None:
        dated = os.stat(table_path).st_mtime_ns + (1 if newer else -1) * 10**9
        os.utime(marker, ns=(max(dated, time.time_ns()) if newer else dated,) * 2)


STALE, OUTDATED_FOREIGN = {}, []  # STALE: key -> the marker its job waits for
UNREADABLE = {}  # key -> why its table cannot be read: rerun in this machine's run, not settled in another's
for _key in EXPERIMENTS:
    _rec = runs.recorded(table(_key))
    if _rec is None:
        continue
    if _rec["unreadable"]:
        UNREADABLE[_key] = _rec["unreadable"]
        print(f"Note: {_rec['unreadable']}: " + ("it is made again." if OWN_RUN else "only the machine that made "
              "this run can make it again; the claims and figures that need it are not settled."), file=sys.stderr)
        if not OWN_RUN:
            continue
    if OWN_RUN and _rec["fingerprint"] != FINGERPRINT[_key]:
        # Named after the fingerprint wanted and this very file (its date, read, not changed), so that no
        # earlier marker can stand for it, and dated after the table. Made by the plan, not by a rule:
        # Snakemake runs no job for a missing input whose consumer's output exists, so in a clone (no
        # .snakemake/ records, so no params trigger) a marker still to be made reran nothing.
        _version = os.stat(table(_key)).st_mtime_ns
        STALE[_key] = f".snakemake/lab/stale/{RUN}/{_key}/{FINGERPRINT[_key]}-{_version}"
        _mark(STALE[_key], table(_key), newer=True)
    elif OWN_RUN and _rec.get("rerun_marker"):
        # A current table made by a job that waited for a marker: planned with that marker again, its input
        # set and params as recorded; made again, dated before the table, where it is gone (a clone).
        STALE[_key] = _rec["rerun_marker"]
        _mark(STALE[_key], table(_key), newer=False)
    elif not OWN_RUN and (_rec["config_hash"], _rec["code_hash"]) != (provenance.digest(SETTINGS[_key]), CODE_HASH[_key]):
        OUTDATED_FOREIGN.append(_key)
# Another machine's run that lacks a table this config asks for (made before its experiment existed, say):
# nothing here can make it, so its claims are not settled and its figures are not drawn.
MISSING_FOREIGN = [] if OWN_RUN else [key for key in EXPERIMENTS if not os.path.exists(table(key))]
if MISSING_FOREIGN:
    print(f"Note: {OUT} has no table {', '.join(MISSING_FOREIGN)}, and only its own machine can make one: the "
          "claims and figures that need it are not settled.", file=sys.stderr)
READ = [key for key in EXPERIMENTS if key not in MISSING_FOREIGN]  # the tables the report reads
if OUTDATED_FOREIGN:
    print(f"Note: these tables of {OUT} were made by other settings or code than this checkout's, and only their "
          f"own machine can rerun them: {', '.join(OUTDATED_FOREIGN)}", file=sys.stderr)


def report_marker(report):
    """The report's one more input, always the same file: dated after the report where a table or figure
    it reads is gone (deleted after it was made), before it otherwise. Snakemake plans no job for a
    missing file whose consumers' outputs exist (as for a temp file), so without it a deleted table was
    never made again; with it the report is out of date, and its missing inputs are made first."""
    marker = f".snakemake/lab/report/{RUN}"
    wanted = [table(key) for key in EXPERIMENTS if OWN_RUN] + [figure(name) for name in DRAWN]
    gone = [f for f in wanted if not os.path.exists(f)]
    if not os.path.exists(report):
        _mark(marker, None, newer=False)
    elif gone:  # named in the content with the report's date: a later deletion changes it again
        _mark(marker, report, newer=True, content=f"{os.stat(report).st_mtime_ns} gone: {' '.join(gone)}")
    else:  # its plain content again (a dry run may have planned while a table was away), dated before
        _mark(marker, report, newer=False, content=os.path.basename(marker))
    return marker


def experiment_key(kernel):
    return lambda wildcards: f"{kernel}/{wildcards.experiment}"


def code_input(kernel):
    """The job's source files (`ancient`: dates do not count), and the stale marker if its table is stale."""
    key = experiment_key(kernel)

    def files(wildcards):
        k = key(wildcards)
        return [ancient(f) for f in CODE[k]] + ([STALE[k]] if k in STALE else [])

    return files


def experiment_params(kernel):
    key = experiment_key(kernel)
    return dict(
        settings=lambda wildcards: json.dumps(SETTINGS[key(wildcards)], sort_keys=True),
        software=json.dumps(SOFTWARE, sort_keys=True),
        code=lambda wildcards: CODE_HASH[key(wildcards)],
        marker=lambda wildcards: STALE.get(key(wildcards), ""),
    )


# Claims name their checks, figures and probe points: a gap fails here, before any job runs. A figure is
# drawn when this config produces its tables; a claim whose table it does not produce is 'not settled'.
with open(os.path.join(ROOT, "workflow/claims.yaml")) as _fh:
    CLAIMS = yaml.safe_load(_fh)
claims.check_declarations(CLAIMS, units.figures())
claims.check_probes(CLAIMS, config)
DRAWN = {name: fig for name, fig in units.drawable(EXPERIMENTS).items()  # a foreign run's unreadable or
         if OWN_RUN or not set(fig.tables) & {*UNREADABLE, *MISSING_FOREIGN}}  # missing table draws nothing


def compared_contents(wildcards):
    """A hash of both runs' table files, a compare rule param: what makes a comparison again when a table
    it reads changes, appears or goes."""
    return sources.digest(path for tables in compared_tables(wildcards).values() for path in tables.values())


def compared_tables(wildcards):
    """Every table of both runs, {side: {key: path}}: a compare rule param, not its input, since they are
    read as they are and never rebuilt (as inputs, a table of this checkout's own run that is out of date
    would be remade first, and the comparison then left out of the plan)."""
    sides = {"a": run_tables(f"results/{wildcards.a}"), "b": run_tables(f"results/{wildcards.b}")}
    for side, tables in sides.items():
        if not tables:
            run = wildcards.get(side)
            raise ValueError(f"results/{run}/ holds no tables: there is no run named {run!r} to compare")
    return {side: {key: str(path) for key, path in tables.items()} for side, tables in sides.items()}
