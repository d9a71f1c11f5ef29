# Snakemake entry point for a figure rule: draw the figure named in params from the tables in input, and
# write the caption its unit declares beside it.
import sys

from lab.gpu import quiet_host

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
# Not while a kernel is being timed on this machine (lab/gpu.py says why), and before the imports below:
# loading pandas, torch and triton is seconds of CPU, as much a load on the timed host as drawing.
lock = quiet_host()

import pandas as pd  # noqa: E402

from lab import summary, units  # noqa: E402
from lab.plots import placeholder, save  # noqa: E402
from lab.table import atomic_path, input_name, read  # noqa: E402

import numpy as np  # noqa: E402

np.random.seed(0)  # seaborn's strip-plot jitter draws from numpy's global state: a redraw gives the same bytes
fig = units.figures()[smk.params.name]
tables = {key: read(smk.input[input_name(key)]) for key in fig.tables}
failed = [t for t in tables.values() if summary.failed(t)]  # an experiment that raised
save(placeholder(fig.name, pd.concat(failed)) if failed else fig.draw(tables), smk.output.png)
with atomic_path(smk.output.caption) as tmp:
    tmp.write_text(fig.caption + "\n")
