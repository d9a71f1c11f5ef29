# Snakemake entry point for the compare rule: two runs' tables side by side, markdown and a figure.
import sys

from lab import compare
from lab.plots import save
from lab.table import atomic_path, key_of, read

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
runs = {"a": {}, "b": {}}
for name, path in smk.input.items():
    side, _, key = name.partition("__")
    if side in runs:
        runs[side][key_of(key)] = read(path)
a, b = smk.wildcards.a, smk.wildcards.b
joined = compare.compare(runs["a"], runs["b"])
with atomic_path(smk.output.markdown) as tmp:
    tmp.write_text(compare.markdown(a, b, runs["a"], runs["b"], joined))
save(compare.figure(a, b, joined), smk.output.figure)
print(joined.groupby("table")["b_is"].value_counts().to_string() if not joined.empty else "no common timed points")
