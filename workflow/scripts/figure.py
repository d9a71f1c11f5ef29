# Snakemake entry point for a figure rule: draw the figure named in params from the tables in input.
import sys

from lab.figures import FIGURES
from lab.gpu import quiet_host
from lab.plots import save
from lab.table import input_name, read

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
lock = quiet_host()  # not while a kernel is being timed on this machine (lab/gpu.py says why)
fig = FIGURES[smk.params.name]
save(fig.draw({key: read(smk.input[input_name(key)]) for key in fig.tables}), smk.output[0])
