# Snakemake entry point for the report rule: settle every claim from the tables and write report.md.
import sys

from lab import report
from lab.table import read

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
tables = {name.replace("__", "/"): read(path) for name, path in smk.input.items() if "__" in name}
verdicts = report.build(tables, smk.input.claims, list(smk.input.figures), smk.output[0])
print(verdicts[["id", "verdict"]].to_string(index=False))
