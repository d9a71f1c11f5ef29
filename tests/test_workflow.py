"""End to end: the Snakemake workflow on a tiny config in a temporary copy of the project.

Checks the report's verdicts; that a plan reruns exactly what a change touches (settings, seed, a
kernel, a plotting function) and nothing when nothing changed; that one experiment can be rerun
alone and the report rebuilt alone; that bad config is refused before any job runs; and, in a fresh
clone, that the committed GPU run is up to date and cannot be overwritten from this machine."""
import contextlib
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import runs_in
from lab import units
from pipeline import EXPERIMENT_RULES, ROOT, digests, job_stats, planned, report_rows, smk

def test_report_settles_every_claim(project):
    rows = report_rows(project)
    assert sorted(rows) == list(range(1, 21))
    verdict = {i: r[4].strip() for i, r in rows.items()}
    for claim in (1, 2, 4, 6, 7, 9, 14, 16, 18):
        assert verdict[claim] == "reproduced", (claim, rows[claim])
    for claim in (3, 5, 8, 15):  # e.g. 'a hundredth of a percent' is literally false; within 0.01 is what holds
        assert verdict[claim] == "false as stated; the point holds", (claim, rows[claim])
    for claim in (10, 11, 12, 13, 17, 19, 20):  # honest about what the interpreter cannot show
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
    assert hard.to_dict() == {5: 0, 512: 0, 1024: 0, 1025: 1, 2000: 976, 1048577: 1047553}
    raised = df[df.status == "raised"]  # the fix, past Triton's largest block
    assert list(raised["n_cols"]) == [1048577] and "exceeds triton maximum tensor numel" in raised["error"].iloc[0]


SEEDED = {"vector_add": 4, "relu_dropout": 4, "softmax": 7, "attention": 4, "flash_attention": 4}  # jobs per rule
FIGURES = {f"figure_{name}" for name in units.figures()}


@contextlib.contextmanager
def edited(path):
    """Append a statement to a source file (a change of code, not of behaviour), then restore it."""
    original = path.read_bytes()
    path.write_bytes(original + b"\n_edited_by_a_test = 1\n")
    try:
        yield
    finally:
        path.write_bytes(original)


def test_nothing_changed_plans_nothing(project):
    assert planned(project) == {}


def stamps(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``folder``: its modification time (ns) and content hash."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_planning_changes_no_file_under_results(project):
    before = stamps(project / "results")
    plan = planned(project, "--config", "seed=1")
    assert sum(plan.get(r, 0) for r in EXPERIMENT_RULES) == sum(SEEDED.values())  # every seeded table is out of date ...
    assert stamps(project / "results") == before  # ... and not one file was touched to say so


def test_new_seed_reruns_the_seeded_tables_only(project):
    plan = planned(project, "--config", "seed=1")
    assert {r: n for r, n in plan.items() if r in EXPERIMENT_RULES} == SEEDED  # not calibration: it draws nothing
    assert {"report", "all"} <= set(plan)
    assert planned(project) == {}  # back at seed 0, the tables are current again


def test_one_setting_reruns_that_table_its_figure_and_the_report(project, tmp_path):
    changed = tmp_path / "bug.yaml"
    changed.write_text("softmax:\n  bug: {n_rows: 3, n_cols: [5, 2000, 1048577], block_size: 1024}\n")
    assert planned(project, "--configfile", "tests/tiny_config.yaml", str(changed)) == {
        "softmax": 1, "figure_softmax_bug": 1, "report": 1, "all": 1}


def test_editing_a_kernel_reruns_its_tables_only(project):
    with edited(project / "kernels/_softmax.py"):
        plan = planned(project)
    assert {r: n for r, n in plan.items() if r in EXPERIMENT_RULES} == {"softmax": 7}
    assert set(plan) - EXPERIMENT_RULES == {"figure_softmax_bug", "figure_bandwidth",
                                            "figure_ceiling_fraction", "figure_fusion", "figure_softmax_widths",
                                            "report", "all"}


def test_editing_a_comment_or_a_docstring_plans_nothing(project):
    path = project / "kernels/_softmax.py"
    original = path.read_text()
    assert original.startswith('"""Kernel 3 of the writeup')
    path.write_text("# a comment\n" + original.replace('"""Kernel 3 of the writeup', '"""Kernel three of the writeup', 1))
    try:
        assert planned(project) == {}
    finally:
        path.write_text(original)


def test_editing_a_plot_reruns_figures_and_report_only(project):
    with edited(project / "workflow/lab/plots.py"):
        plan = planned(project)
    assert set(plan) == FIGURES | {"report", "all"}


@pytest.mark.parametrize("path", ["kernels/__init__.py", "workflow/lab/units/__init__.py", "workflow/lab/units/attention.py"])
def test_a_registry_or_another_unit_reruns_no_vector_add_table(project, path):
    """Registries and discovery decide which experiments exist, not what one computes; another kernel's unit
    is not vector_add's code. (A unit feeds the report: editing one rebuilds it.)"""
    target = project / path
    original = target.read_bytes()
    target.write_bytes(original + b"\n_unused_by_any_experiment = 1\n")
    try:
        plan = planned(project)
    finally:
        target.write_bytes(original)
    assert not set(plan) & EXPERIMENT_RULES and not any(r.startswith("figure_") for r in plan), plan
    assert set(plan) <= {"report", "all"}


def test_editing_a_units_figure_reruns_that_figure_and_the_report_only(project):
    unit = project / "workflow/lab/units/softmax.py"
    original = unit.read_text()
    unit.write_text(original.replace('"softmax: the hard-coded BLOCK_SIZE bug vs the fix',
                                     '"softmax: the hard-coded BLOCK_SIZE bug against the fix', 1))
    try:
        assert unit.read_text() != original
        plan = planned(project)
    finally:
        unit.write_text(original)
    assert plan == {"figure_softmax_bug": 1, "report": 1, "all": 1}


ADDED_KERNEL = re.compile(r"^`([^`]+)`( \(append\))?:\n\n```\w+\n(.*?)^```", re.M | re.S)


def readme_kernel_steps() -> list[tuple[str, bool, str]]:
    """The README's "Add a kernel" files: (path, append?, content), in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Add a kernel\n", 1)[1].split("\n## ", 1)[0]
    return [(path, bool(append), code) for path, append, code in ADDED_KERNEL.findall(section)]


def sources_of(root: Path) -> dict[str, bytes]:
    skip = ("results", ".snakemake", "__pycache__", ".pytest_cache")
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not set(p.relative_to(root).parts) & set(skip)}


def test_adding_a_kernel_as_the_readme_says_runs_its_jobs_only(project, tmp_path):
    work = tmp_path / "lab"
    shutil.copytree(project, work)  # the tiny run done: its tables and Snakemake's records come along
    before = sources_of(work)
    steps = readme_kernel_steps()
    for path, append, code in steps:
        target = work / path
        target.write_text((target.read_text() if append else "") + code)
    changed = {f for f, content in sources_of(work).items() if before.get(f) != content}
    assert changed == {path for path, _, _ in steps} and len(changed) <= 5, changed
    assert planned(work) == {"scale": 1, "figure_scale_error": 1, "report": 1, "all": 1}
    smk(work, "--cores", "2")
    table = pd.read_parquet(work / "results/tiny/scale/correctness.parquet")
    assert set(table["status"]) == {"ok"} and (table["value"] == 0).all() and sorted(table["size"]) == [1, 1000, 4097]
    assert (work / "results/tiny/figures/scale_error.png").stat().st_size > 5_000
    report = (work / "results/tiny/report.md").read_text()
    assert "### scale against torch, max |diff|" in report and "`kernels.scale`: y = a * x" in report
    assert "![scale_error](figures/scale_error.png)" in report
    assert planned(work) == {}
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_scale.py"],
                          cwd=work, env=runs_in(work), capture_output=True, text=True, timeout=600)
    assert test.returncode == 0 and "1 passed" in test.stdout, test.stdout[-2000:]


def test_a_clone_without_snakemakes_records_reruns_exactly_the_stale_tables(project, tmp_path):
    """A clone has no .snakemake/ records, so Snakemake's own triggers see no change: the tables'
    fingerprints must (a GPU run committed, then a kernel edited). Unchanged, it plans no experiment;
    with a kernel edited, that kernel's tables; run, nothing more, in it or in a clone of it."""
    clone = tmp_path / "clone"
    shutil.copytree(project, clone, symlinks=True, ignore=shutil.ignore_patterns(".snakemake"))
    assert not set(planned(clone)) & EXPERIMENT_RULES
    with edited(clone / "kernels/_vector_add.py"):
        plan = planned(clone)
        tables = len(list((clone / "results/tiny/vector_add").glob("*.parquet")))
        assert {r: n for r, n in plan.items() if r in EXPERIMENT_RULES} == {"vector_add": tables}
        smk(clone, "--cores", "2")
        assert not set(planned(clone)) & EXPERIMENT_RULES
        # its tables now record the markers they waited for: gone in a clone of it, or deleted, they are
        # made again as old ones, and nothing reruns
        again = tmp_path / "clone of the clone"
        shutil.copytree(clone, again, symlinks=True, ignore=shutil.ignore_patterns(".snakemake"))
        assert not set(planned(again)) & EXPERIMENT_RULES
        shutil.rmtree(clone / ".snakemake/lab/stale")
        assert not set(planned(clone)) & EXPERIMENT_RULES


def test_a_deleted_table_or_figure_is_made_again_and_then_nothing(project):
    """Snakemake plans no job for a missing file whose consumers' outputs exist (as for a temp file): the
    report's marker makes it out of date, so a table and a figure deleted after the report are made again,
    with what depends on them, and then nothing is planned; `lab status` agrees with the plan."""
    (project / "results/tiny/softmax/bug.parquet").unlink()
    (project / "results/tiny/figures/wall.png").unlink()
    plan = planned(project)
    assert {r: n for r, n in plan.items() if r in EXPERIMENT_RULES} == {"softmax": 1}
    assert {"figure_softmax_bug", "figure_wall", "report"} <= set(plan)
    smk(project, "--cores", "2")
    assert (project / "results/tiny/softmax/bug.parquet").exists() and (project / "results/tiny/figures/wall.png").exists()
    assert planned(project) == {}


def test_a_table_away_during_a_dry_run_and_back_plans_nothing(project, tmp_path):
    table = project / "results/tiny/vector_add/mask.parquet"
    away = tmp_path / table.name
    shutil.move(table, away)
    assert "vector_add" in planned(project)
    shutil.move(away, table)
    assert planned(project) == {}


def test_a_figure_drawn_again_from_the_same_tables_has_the_same_bytes(project):
    """Reproducible down to the file: the dropout figure's strip-plot jitter is random, so a redraw
    changed the committed PNG until the figure script seeded it."""
    png = project / "results/tiny/figures/dropout_rates.png"
    before = png.read_bytes()
    smk(project, "--cores", "1", "--forcerun", "figure_dropout_rates", "--", str(png.relative_to(project)))
    assert png.read_bytes() == before


def test_a_comparison_is_made_again_when_a_table_of_either_run_changes(project):
    """Compared tables are read as they are (`ancient`: their dates do not count), but their content does:
    a table that appears in a run (a failed experiment made again, say) makes the comparison again."""
    copy = project / "results/tinycopy"
    shutil.copytree(project / "results/tiny", copy)
    (copy / "softmax/bug.parquet").unlink()
    smk(project, "--cores", "1", "results/compare/tiny_vs_tinycopy.md")
    assert planned(project, "results/compare/tiny_vs_tinycopy.md") == {}
    shutil.copy2(project / "results/tiny/softmax/bug.parquet", copy / "softmax/bug.parquet")
    assert planned(project, "results/compare/tiny_vs_tinycopy.md") == {"compare": 1}
    shutil.rmtree(copy)


def test_touching_sources_reruns_nothing(project):
    """A checkout's file dates say nothing about content: only content decides."""
    for f in [*project.glob("kernels/*.py"), *project.glob("workflow/lab/**/*.py")]:
        f.touch()
    assert not set(planned(project)) & EXPERIMENT_RULES


def test_forcerun_reruns_only_that_experiment_and_its_dependents(project):
    alone = smk(project, "-n", "--forcerun", "softmax", "--", "results/tiny/softmax/bug.parquet").stdout
    assert job_stats(alone) == {"softmax": 1}
    smk(project, "--cores", "1", "--forcerun", "softmax", "--", "results/tiny/softmax/bug.parquet")
    assert not (project / "results/tiny/report.md").exists()  # built from the old table: gone with it
    # The next full run redoes only what depends on the new table.
    downstream = smk(project, "-n").stdout
    assert job_stats(downstream) == {"figure_softmax_bug": 1, "report": 1, "all": 1}


def test_report_regenerates_alone(project):
    report = project / "results/tiny/report.md"
    report.unlink(missing_ok=True)
    out = smk(project, "--cores", "1", "report").stdout + smk(project, "-n", "all").stdout
    assert report.exists()
    assert "Nothing to be done" in out


@pytest.mark.parametrize("override, key", [("seed=-1", "seed"), ("backend=tpu", "backend"),
                                           ("run=../escape", "run"), ("seed=1.0", "seed"), ("run=a_vs_b", "run")])
def test_bad_config_is_refused_naming_the_key(project, override, key):
    done = smk(project, "-n", "--config", override, check=False)
    assert done.returncode != 0
    assert "ConfigError" in done.stdout + done.stderr and f"config key {key}: " in done.stdout + done.stderr


def test_command_line_values_as_the_readme_writes_them(project, tmp_path):
    """`overwrite_foreign_run=true` is the README's escape hatch; a nested section is a YAML mapping, whose
    values Snakemake leaves as strings; a key given twice in a config file is refused naming the file."""
    assert planned(project, "--config", "overwrite_foreign_run=true") == {}
    nested = planned(project, "--config", "softmax={bug: {n_rows: 3}}")  # merged into the section: one setting
    assert {r: n for r, n in nested.items() if r in EXPERIMENT_RULES} == {"softmax": 1}
    twice = tmp_path / "twice.yaml"
    twice.write_text("seed: 1\nseed: 2\n")
    done = smk(project, "-n", "--configfile", "tests/tiny_config.yaml", str(twice), check=False)
    assert done.returncode != 0 and f"{twice}: key 'seed' given twice (lines 1 and 2)" in done.stdout + done.stderr


def test_a_table_of_another_machine_in_a_run_stops_the_plan_naming_both(project):
    """No report mixes machines: an H200 table copied into this (interpreter) run stops planning."""
    mask = project / "results/tiny/vector_add/mask.parquet"
    original = mask.read_bytes()
    mask.write_bytes((ROOT / "results/nvidia-h200/vector_add/mask.parquet").read_bytes())
    try:
        done = smk(project, "-n", check=False)
    finally:
        mask.write_bytes(original)
    message = done.stdout + done.stderr
    assert done.returncode != 0 and "holds tables made on 2 machines" in message, message[-2000:]
    assert "NVIDIA H200 (gpu): vector_add/mask.parquet" in message and "(interpreter): attention/" in message


def test_a_config_without_a_claims_probe_point_is_refused_naming_the_claim(tmp_path, project):
    dropped = tmp_path / "no2000.yaml"
    dropped.write_text("softmax:\n  bug: {n_rows: 2, n_cols: [5, 1048577], block_size: 1024}\n")
    done = smk(project, "-n", "--configfile", "tests/tiny_config.yaml", str(dropped), check=False)
    assert done.returncode != 0
    assert "softmax.bug.n_cols must include 2000" in done.stdout + done.stderr and "claim 6" in done.stdout + done.stderr


def test_empty_range_is_refused(tmp_path, project):
    bad = tmp_path / "bad.yaml"
    bad.write_text("vector_add:\n  performance: {log2_sizes: [20, 12], log2_step: 2, dtype: float32}\n")
    done = smk(project, "-n", "--configfile", str(bad), check=False)
    assert done.returncode != 0
    assert "vector_add.performance.log2_sizes" in done.stdout + done.stderr


def test_fresh_clone_keeps_the_committed_gpu_run(tmp_path):
    """The README's command rebuilds the committed GPU report without running an experiment, and a machine
    in Triton's interpreter (this one on a GPU box too: on an H200 the run would be its own) refuses to write
    into the GPU's run, naming both devices; the tables stay byte-identical."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    run = clone / "results/nvidia-h200"
    device = pd.read_parquet(run / "softmax/bug.parquet")["device"].iloc[0]
    before = digests(run)
    rebuild = ["--cores", "1", "report", "--forcerun", "report", "--config", "run=nvidia-h200", "backend=interpreter"]
    plan = job_stats(smk(clone, "-n", *rebuild[2:], config=None).stdout)
    assert plan.get("report") == 1 and not set(plan) & EXPERIMENT_RULES, plan
    smk(clone, *rebuild, config=None)
    forced = smk(clone, "--cores", "1", "results/nvidia-h200/softmax/bug.parquet", "--forcerun", "softmax",
                 "--config", "run=nvidia-h200", "backend=interpreter", config=None, check=False)
    assert forced.returncode != 0
    message = forced.stdout + forced.stderr
    assert device in message and "cpu (" in message and "overwrite_foreign_run" in message
    assert "asked for: results/nvidia-h200/softmax/bug.parquet" in message and "No rule to produce" not in message
    assert digests(run) == before
