# One job per kernel x experiment, each writing one tidy parquet table. One rule per kernel, so
#   snakemake --cores 1 results/<run>/softmax/bug.parquet --forcerun softmax
# reruns that experiment alone. On the GPU backend every job asks for `gpu=1` (so --resources gpu=N or a
# cluster executor can count and place them) and, at run time, locks one GPU (lab/gpu.py): timing jobs
# exclusively, so nothing shares a GPU that is being timed, and so do jobs that fill much of its memory.
# A run made on another machine gets no experiment rules here (common.smk says why).
for _kernel in KERNELS if OWN_RUN else []:

    rule:
        name:
            _kernel
        input:
            code=code_input(_kernel),
        output:
            table=f"{OUT}/{_kernel}/{{experiment}}.parquet",
        wildcard_constraints:
            experiment="|".join(e.name for e in EXPERIMENTS.values() if e.kernel == _kernel),
        log:
            f"{OUT}/logs/{_kernel}/{{experiment}}.log",
        params:
            experiment=experiment_key(_kernel),
            **experiment_params(_kernel),
        resources:
            gpu=int(BACKEND == "gpu"),
        shell:
            '"$LAB_PYTHON" -m lab.job {params.experiment} {output.table:q} --settings {params.settings:q}'
            " --software {params.software:q} --code {params.code} --rerun-marker={params.marker:q} > {log:q} 2>&1"
