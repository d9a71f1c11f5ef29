# Snakemake entry point for every experiment job: the work is lab.runner.run (importable, testable).
from lab.runner import main_from_snakemake

main_from_snakemake(snakemake)  # noqa: F821  (injected by Snakemake)
