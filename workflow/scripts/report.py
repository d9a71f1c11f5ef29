# Snakemake entry point for the report rule: settle every claim from the tables, write report.md and claims.html.
import sys

from lab import report
from lab.table import key_of, read_each

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
tables, unreadable = read_each({key_of(name): path for name, path in smk.input.items() if "__" in name})
verdicts = report.build(tables, smk.input.claims, list(smk.input.figures), smk.output.markdown, smk.output.html,
                        unreadable)
print(verdicts[["id", "verdict"]].to_string(index=False))
