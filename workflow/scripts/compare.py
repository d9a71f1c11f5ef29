# Snakemake entry point for the compare rule: two runs' tables side by side, the claims' verdicts of both,
# a markdown page, a tidy table of every compared point and a figure.
import sys

import yaml

from lab import compare
from lab.plots import save
from lab.table import atomic_path, write_parquet

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
runs = {side: compare.read_tables(named) for side, named in smk.params.paths.items()}
with open(smk.input.claims) as fh:
    claims = yaml.safe_load(fh)
a, b = smk.wildcards.a, smk.wildcards.b
joined = compare.compare(runs["a"], runs["b"])
with atomic_path(smk.output.markdown) as tmp:
    tmp.write_text(compare.markdown(a, b, runs["a"], runs["b"], joined, claims))
write_parquet(joined, smk.output.table)
save(compare.figure(a, b, joined), smk.output.figure)
print(joined.groupby(["table", "launch_bound"])["verdict"].value_counts().to_string() if not joined.empty
      else "no common timed points")
