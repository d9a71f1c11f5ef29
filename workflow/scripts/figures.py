# Snakemake entry point for the figure rules: read the tables named in the inputs, draw, save.
import sys

from lab import plots, summary
from lab.table import read

smk = snakemake  # noqa: F821  (injected by Snakemake)
sys.stdout = sys.stderr = open(smk.log[0], "w")
tables = {name.replace("__", "/"): read(path) for name, path in smk.input.items()}
family = smk.params.family

if family == "softmax_bug":
    plots.save(plots.softmax_bug(tables["bug"]), smk.output[0])
elif family == "dropout":
    plots.save(plots.dropout_rates(tables["statistics"]), smk.output[0])
elif family == "wall":
    plots.save(plots.wall(tables["wall"], tables["past_wall"]), smk.output.wall)
    plots.save(plots.flash_memory(tables["past_wall"]), smk.output.memory)
elif family == "performance":
    ceil = summary.ceilings(tables["calibration/ceilings"])
    memory_bound = {k: tables[f"{k}/performance"] for k in summary.MEMORY_BOUND}
    plots.save(plots.bandwidth(memory_bound, ceil.get("copy_gbps")), smk.output.bandwidth)
    plots.save(plots.ceiling_fraction(summary.ceiling_fractions(tables)), smk.output.fractions)
    plots.save(plots.flash_performance(tables["flash_attention/performance"], ceil.get("matmul_tflops")),
               smk.output.flash)
else:
    raise ValueError(f"unknown figure family {family!r}")
