# Plotting, separate from measuring: one rule per figure of workflow/lab/figures.py, with its tables and
# the plotting code as input, and a caption (workflow/report/<name>.rst) for `snakemake --report`.
FIGURE_CODE = plan.code_files("lab.figures") + ["workflow/scripts/figure.py", "workflow/claims.yaml"]  # what was said

for _name, _fig in DRAWN.items():

    rule:
        name:
            f"figure_{_name}"
        localrule: True  # aggregation: on the submitting machine, never a cluster job
        input:
            **{input_name(key): table(key) for key in _fig.tables},
            code=[ancient(f) for f in FIGURE_CODE],
        output:
            report(figure(_name), caption=f"../report/{_name}.rst", category=_fig.category),
        log:
            f"{OUT}/logs/figures/{_name}.log",
        params:
            name=_name,
            code=sources.digest(FIGURE_CODE),
        script:
            "../scripts/figure.py"
