# The markdown report: every claim of the writeup, said / measured / verdict, from the tables.
FIGURES = [figure(f) for f in ("softmax_bug.png", "dropout_rates.png", "wall.png", "flash_memory.png",
                               "bandwidth.png", "ceiling_fraction.png", "flash_performance.png")]


rule report:
    input:
        **{key.replace("/", "__"): path for key, path in all_tables().items()},
        claims="workflow/claims.yaml",
        figures=FIGURES,
    output:
        REPORT,
    log:
        f"{OUT}/logs/report.log",
    script:
        "../scripts/report.py"
