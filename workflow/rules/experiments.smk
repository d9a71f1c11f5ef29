# One job per kernel x experiment, each writing one tidy parquet table. One rule per kernel, so
#   snakemake --cores 1 results/<run>/softmax/bug.parquet --forcerun softmax
# reruns that experiment alone. On the GPU backend every job asks for `gpu=1` (so --resources gpu=N or a
# cluster executor can count and place them) and, at run time, locks one GPU (lab/gpu.py): timing jobs
# exclusively, so nothing shares a GPU that is being timed.
for _kernel, _experiments in EXPERIMENTS.items():

    rule:
        name:
            _kernel
        output:
            table=f"{OUT}/{_kernel}/{{experiment}}.parquet",
        wildcard_constraints:
            experiment="|".join(_experiments),
        log:
            f"{OUT}/logs/{_kernel}/{{experiment}}.log",
        params:
            kernel=_kernel,
            lock_dir=GPU_LOCKS,
        resources:
            gpu=int(BACKEND == "gpu"),
        script:
            "../scripts/experiment.py"
