# One job per kernel x experiment, each writing one tidy parquet table. One rule per kernel, so
#   snakemake --cores 1 --forcerun softmax results/<run>/softmax/bug.parquet
# reruns that experiment alone. Timing jobs claim `gpu=1` (declare the GPUs with --resources gpu=N or
# a profile) and, at run time, an exclusive lock on one GPU (lab/gpu.py): no other job shares it.
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
            gpu=lambda wc: int(BACKEND == "gpu" and wc.experiment in TIMING),
        script:
            "../scripts/experiment.py"
