# Plotting, separate from measuring: one rule per figure its unit declares (lab/units/), with its tables
# and exactly the code that draws it as input, and its caption written beside it for `snakemake --report`.
for _name, _fig in DRAWN.items():
    _files, _hash = plan.code(_fig.draw, "lab.plots", "lab.gpu", "lab.table", "lab.summary",
                              files=["workflow/scripts/figure.py", "workflow/claims.yaml"])  # claims.yaml: what was said

    rule:
        name:
            f"figure_{_name}"
        localrule: True  # aggregation: on the submitting machine, never a cluster job
        input:
            **{input_name(key): table(key) for key in _fig.tables},
            code=[ancient(f) for f in _files],
        output:
            png=report(figure(_name), caption=os.path.abspath(f"{OUT}/figures/{_name}.rst"), category=_fig.category),
            caption=f"{OUT}/figures/{_name}.rst",
        log:
            f"{OUT}/logs/figures/{_name}.log",
        params:
            name=_name,
            code=_hash,
        script:
            "../scripts/figure.py"
