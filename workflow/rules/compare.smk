# Two runs side by side (before/after a change, two GPUs, two Triton versions):
#   snakemake --cores 1 results/compare/nvidia-h200_vs_nvidia-h200-seed1.md
# Both runs must exist under results/; neither is rerun (their tables are read as they are). The claims'
# verdicts are settled again from each run's tables, with the checks and claims.yaml of this checkout.
COMPARE_CODE = plan.code_files("lab.compare", "lab.plots", *(m.__name__ for m in units.load())) + [
    "workflow/scripts/compare.py"]  # the units: their claim checks settle both runs' verdicts


rule compare:
    localrule: True
    input:
        claims="workflow/claims.yaml",
        code=[ancient(f) for f in COMPARE_CODE],
    output:
        markdown="results/compare/{a}_vs_{b}.md",
        table="results/compare/{a}_vs_{b}.parquet",
        figure=report("results/compare/{a}_vs_{b}.png", caption="../report/compare.rst", category="Comparison"),
    wildcard_constraints:
        a=r"[A-Za-z0-9](?:(?!_vs_)[A-Za-z0-9._-])*",  # a run name as config's `run` allows it (not '.')
        b=r"[A-Za-z0-9](?:(?!_vs_)[A-Za-z0-9._-])*",
    log:
        "results/compare/logs/{a}_vs_{b}.log",
    params:
        code=sources.digest(COMPARE_CODE),
        tables=compared_contents,
        paths=compared_tables,
    script:
        "../scripts/compare.py"
