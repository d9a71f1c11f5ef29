"""What determines each experiment's table: its settings from the config and the source files it runs.
One place for both the workflow (common.smk declares them as each job's params and input) and
``python -m lab status`` (which compares them with what a run's tables recorded)."""
from __future__ import annotations

from . import provenance, sources


def job_settings(config: dict, exp) -> dict:
    """Everything from the config that determines this experiment's table, and nothing else."""
    s = dict(config[exp.kernel][exp.name])
    if exp.seeded:
        s["seed"] = config["seed"]
    if exp.timing:
        s["bench"] = config["bench"]
    if exp.ceilings:
        s["ceilings"] = config["calibration"]["ceilings"]
    return s


def code_files(*modules: str) -> list[str]:
    """The project source files these modules run (relative to the project root)."""
    return sorted({f for m in modules for f in sources.closure(m)})


def code(declaration, *modules: str, files=()) -> tuple[list[str], str]:
    """What the output of a unit's declaration (an experiment, a figure) depends on, with the modules and
    further ``files`` that run it: the files (for the job's input) and the content hash of exactly that
    code (lab.sources)."""
    own_files, own = sources.declaration_code(declaration.__module__, declaration.__name__)
    runner = sorted({*code_files(*modules), *files})
    return sorted({*own_files, *runner}), provenance.digest({"declaration": own, "runner": sources.digest(runner)})


def experiments(config: dict, registry: dict) -> dict:
    """The experiments the config asks for: 'kernel/name' -> Experiment."""
    return {key: exp for key, exp in registry.items() if exp.name in (config.get(exp.kernel) or {})}


def expected(config: dict, registry: dict) -> dict[str, dict]:
    """Per configured experiment: its settings, code files, and the hashes a current table records."""
    out = {}
    for key, exp in experiments(config, registry).items():
        settings, (files, code_hash) = job_settings(config, exp), code(exp.fn, "lab.job")
        out[key] = {"settings": settings, "code": files, "config_hash": provenance.digest(settings),
                    "code_hash": code_hash}
    return out
