# Config validation, backend and run resolution, and the path builders every rule uses.
import os
import sys
import tempfile

from snakemake.utils import validate

# Jobs import `kernels` and `lab` from this checkout, installed or not.
ROOT = os.path.abspath(workflow.basedir)
for _path in (ROOT, os.path.join(ROOT, "workflow")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [ROOT, os.path.join(ROOT, "workflow")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

from lab import settings  # noqa: E402

validate(config, "../schemas/config.schema.yaml")
settings.check(config)  # what a JSON schema cannot say (ordered ranges, ...), before any job starts

import kernels.backend  # noqa: E402  (no side effects: resolves, does not select)
from lab import provenance  # noqa: E402
from lab.runner import TIMING  # noqa: E402  (experiments that time: ceilings, performance)

BACKEND = kernels.backend.resolve(config["backend"])
config["backend"] = BACKEND  # every job runs on the backend resolved here, once
RUN = provenance.run_name(BACKEND) if config["run"] == "auto" else config["run"]
OUT = f"results/{RUN}"
GPU_LOCKS = os.path.join(tempfile.gettempdir(), "triton-lab-gpu-locks")

# kernel -> its experiments, straight from config.yaml: one job each.
KERNELS = ["calibration", "vector_add", "relu_dropout", "softmax", "attention", "flash_attention"]
EXPERIMENTS = {kernel: list(config[kernel]) for kernel in KERNELS}
REPORT = f"{OUT}/report.md"


def table(key):
    """results/<run>/<kernel>/<experiment>.parquet for 'kernel/experiment'."""
    return f"{OUT}/{key}.parquet"


def all_tables():
    return {f"{k}/{e}": table(f"{k}/{e}") for k, exps in EXPERIMENTS.items() for e in exps}


def figure(name):
    return f"{OUT}/figures/{name}"
