# The Triton kernel laboratory: correctness, statistics and performance experiments for every kernel
# of the writeup and beyond, then figures and a report that settles each of its claims.
#   snakemake --cores all                           everything, on a GPU or in Triton's interpreter
#   snakemake --cores 1 report --forcerun report    the report alone, from existing tables
#   snakemake --cores 1 results/compare/A_vs_B.md   two runs side by side
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/compare.smk"


rule all:
    default_target: True
    input:
        REPORT,
