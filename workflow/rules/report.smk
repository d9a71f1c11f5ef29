# The report: every claim of the writeup, said / measured / verdict, from the tables. report.md for
# reading in the repository, claims.html for `snakemake --report` (beside the figures).
REPORT = f"{OUT}/report.md"
# The report reads every unit (its checks, sections, providers and captions), all of each.
REPORT_CODE = plan.code_files("lab.report", *(m.__name__ for m in units.load())) + [
    "workflow/scripts/report.py", "workflow/report/claims.rst"]


rule report:
    localrule: True
    input:
        **{input_name(key): table(key) for key in READ},
        claims="workflow/claims.yaml",
        figures=[figure(name) for name in DRAWN],
        code=[ancient(f) for f in REPORT_CODE],
        marker=report_marker(REPORT),
    output:
        markdown=REPORT,
        html=report(f"{OUT}/claims.html", caption="../report/claims.rst", category="Claims"),
    log:
        f"{OUT}/logs/report.log",
    params:
        code=sources.digest(REPORT_CODE),
    script:
        "../scripts/report.py"
