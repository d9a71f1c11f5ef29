# Plotting, separate from measuring: one rule per figure family, captions for `snakemake --report`.


rule figure_softmax_bug:
    input:
        bug=table("softmax/bug"),
    output:
        report(figure("softmax_bug.png"), caption="../report/softmax_bug.rst", category="Softmax"),
    log:
        f"{OUT}/logs/figures/softmax_bug.log",
    params:
        family="softmax_bug",
    script:
        "../scripts/figures.py"


rule figure_dropout:
    input:
        statistics=table("relu_dropout/statistics"),
    output:
        report(figure("dropout_rates.png"), caption="../report/dropout_rates.rst", category="Dropout"),
    log:
        f"{OUT}/logs/figures/dropout.log",
    params:
        family="dropout",
    script:
        "../scripts/figures.py"


rule figure_wall:
    input:
        wall=table("attention/wall"),
        past_wall=table("flash_attention/past_wall"),
    output:
        wall=report(figure("wall.png"), caption="../report/wall.rst", category="Attention"),
        memory=report(figure("flash_memory.png"), caption="../report/flash_memory.rst", category="Attention"),
    log:
        f"{OUT}/logs/figures/wall.log",
    params:
        family="wall",
    script:
        "../scripts/figures.py"


rule figure_performance:
    input:
        **{key.replace("/", "__"): path for key, path in all_tables().items() if key.endswith(TIMING)},
    output:
        bandwidth=report(figure("bandwidth.png"), caption="../report/bandwidth.rst", category="Performance"),
        fractions=report(figure("ceiling_fraction.png"), caption="../report/ceiling_fraction.rst", category="Performance"),
        flash=report(figure("flash_performance.png"), caption="../report/flash_performance.rst", category="Performance"),
    log:
        f"{OUT}/logs/figures/performance.log",
    params:
        family="performance",
    script:
        "../scripts/figures.py"
