# Snakemake entry point for a figure rule: draw the figure named in params from the tables in input.
import sys

import pandas as pd

from lab import summary
from lab.figures import FIGURES
from lab.gpu import quiet_host
from lab.plots import placeholder, save
from lab.table import input_name, read

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
lock = quiet_host()  # not while a kernel is being timed on this machine (lab/gpu.py says why)
fig = FIGURES[smk.params.name]
tables = {key: read(smk.input[input_name(key)]) for key in fig.tables}
failed = [t for t in tables.values() if summary.failed(t)]  # an experiment that raised
save(placeholder(fig.name, pd.concat(failed)) if failed else fig.draw(tables), smk.output[0])
