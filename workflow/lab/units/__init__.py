"""The lab's units, discovered: one module per kernel (lab/units/<kernel>.py) declares everything the lab
does with it, with the decorators and names below. Nothing else lists kernels; adding a unit module is
adding a kernel to the lab.

A unit module defines:

- ``RUNG``: its place on the writeup's ladder (the report's order);
- ``SCHEMA``: its config section ``<kernel>:``, {experiment: {setting: JSON schema}} (every setting
  required, no other allowed; lab.settings builds the schema), or an experiment's whole schema by ``$ref``;
- ``PROVIDERS``: {provider value: what it is}, the values its tables' ``provider`` column takes
  (lab.providers holds the ones several kernels share);
- ``@experiment(...)`` functions: one job and one table ``<kernel>/<function name>`` each;
- ``@figure(name, tables, category, caption)`` functions: draw a figure from those tables;
- ``@claim(id, tables)`` functions: settle claim ``id`` of workflow/claims.yaml from those tables;
- ``@section(tables)`` functions: its part of the report (section "By kernel"), from those tables;
- ``check_settings(section)`` (optional): what its section's JSON schema cannot say (a product of two
  settings, say), raising ValueError that names the setting; lab.settings.check calls it before any job;
- its tolerances, beside the experiments that use them.

A declaration reads only the tables it names, so one that spans kernels (fusion) says so. What a
declaration's output depends on is its own code (lab.sources), never this module or the discovery.

    @experiment(timing=True)
    def performance(s: dict) -> list[dict]: ...

- ``timing``: it measures time, so it runs alone on its GPU, autotunes, and receives the ``bench``
  settings (which then are part of what determines its table);
- ``alone``: it takes a large share of its GPU's memory (tensors past 2^31 elements, SDPA's math backend at
  long lengths), so it runs alone on its GPU, as a timing job does: jobs beside it could run out of memory
  (on an 80 GB H100, flash_attention/past_wall did beside the limits jobs);
- ``seeded``: its inputs derive from ``seed`` (so ``--config seed=1`` reruns it, and only it);
- ``ceilings`` (timing experiments): the job measures the copy bandwidth and the bf16 matmul rate on its
  own GPU before it starts and records them on every row (columns copy_gbps, matmul_tflops), so every
  fraction of a ceiling divides by a ceiling of the same GPU and job. It receives ``ceilings`` settings.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import Callable


@dataclass(frozen=True)
class Experiment:
    kernel: str
    name: str
    fn: Callable[[dict], list[dict]]
    timing: bool
    seeded: bool
    ceilings: bool
    alone: bool = False

    @property
    def exclusive(self) -> bool:
        """It locks its GPU exclusively: nothing runs beside it."""
        return self.timing or self.alone

    @property
    def key(self) -> str:
        return f"{self.kernel}/{self.name}"

    @property
    def module(self) -> str:
        return self.fn.__module__


@dataclass(frozen=True)
class Figure:
    """results/<run>/figures/<name>.png, drawn by ``draw`` from ``tables`` (and only those)."""
    name: str
    tables: tuple[str, ...]
    category: str
    caption: str
    draw: Callable


@dataclass(frozen=True)
class Check:
    """Settles claim ``id`` of workflow/claims.yaml: fn(tables, claim settings) -> (measured, verdict)."""
    id: int
    tables: tuple[str, ...]
    fn: Callable


@dataclass(frozen=True)
class Section:
    """A unit's part of the report's performance section: build(tables) -> markdown."""
    kernel: str
    tables: tuple[str, ...]
    build: Callable


EXPERIMENTS: dict[str, Experiment] = {}
FIGURES: dict[str, Figure] = {}
CHECKS: dict[int, Check] = {}
SECTIONS: dict[str, Section] = {}


def _unit_of(fn) -> str:
    return fn.__module__.rsplit(".", 1)[-1]


def experiment(*, timing: bool = False, seeded: bool = True, ceilings: bool | None = None, alone: bool = False):
    def register(fn):
        exp = Experiment(_unit_of(fn), fn.__name__, fn, timing, seeded, timing if ceilings is None else ceilings, alone)
        EXPERIMENTS[exp.key] = exp
        return fn

    return register


def drawable(available) -> dict[str, Figure]:
    """The figures whose tables are all in ``available`` (a config may leave experiments out)."""
    return {name: fig for name, fig in figures().items() if all(k in available for k in fig.tables)}


def figure(name: str, tables, category: str, caption: str):
    def register(fn):
        if name in FIGURES and FIGURES[name].draw.__qualname__ != fn.__qualname__:
            raise ValueError(f"figure {name!r} is declared twice: {FIGURES[name].draw.__module__} and {fn.__module__}")
        FIGURES[name] = Figure(name, tuple(tables), category, " ".join(caption.split()), fn)
        return fn

    return register


def claim(id: int, tables):
    def register(fn):
        if id in CHECKS and CHECKS[id].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"claim {id} has two checks: {CHECKS[id].fn.__name__} and {fn.__name__}")
        CHECKS[id] = Check(id, tuple(tables), fn)
        return fn

    return register


def section(tables):
    def register(fn):
        SECTIONS[f"{fn.__module__}.{fn.__name__}"] = Section(_unit_of(fn), tuple(tables), fn)
        return fn

    return register


def load() -> list[ModuleType]:
    """Every unit module of this package, imported, in ladder order (RUNG, then name)."""
    modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
               if not m.name.startswith("_")]
    for module in modules:
        if not isinstance(getattr(module, "RUNG", None), int):
            raise TypeError(f"{module.__name__} declares no RUNG (its place on the ladder, an int)")
    return sorted(modules, key=lambda m: (m.RUNG, m.__name__))


def _in_ladder_order(declared: dict, module_of) -> dict:
    """``declared`` sorted by the ladder order of the unit that declares each (stable within a unit)."""
    order = {m.__name__: i for i, m in enumerate(load())}
    return dict(sorted(declared.items(), key=lambda kv: order[module_of(kv[1])]))


def registry() -> dict[str, Experiment]:
    """'kernel/experiment' -> Experiment, in ladder order, each unit's in the order of definition."""
    return _in_ladder_order(EXPERIMENTS, lambda e: e.module)


def _declared_tables(what: str, tables) -> None:
    """Refuse a figure, claim or report section that reads a table no unit declares (a typo would
    otherwise pass for an experiment the config leaves out, and the figure or verdict silently vanish)."""
    unknown = [t for t in tables if t not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"{what} reads {', '.join(map(repr, unknown))}, which no experiment makes; the "
                         f"tables are {', '.join(EXPERIMENTS)}")


def figures() -> dict[str, Figure]:
    """Figure name -> Figure, in ladder order."""
    found = _in_ladder_order(FIGURES, lambda f: f.draw.__module__)
    for fig in found.values():
        _declared_tables(f"figure {fig.name!r} ({fig.draw.__module__})", fig.tables)
    return found


def checks() -> dict[int, Check]:
    load()
    for check in CHECKS.values():
        _declared_tables(f"the check of claim {check.id} ({check.fn.__module__}.{check.fn.__name__})", check.tables)
    return dict(sorted(CHECKS.items()))


def sections() -> list[Section]:
    found = list(_in_ladder_order(SECTIONS, lambda sec: sec.build.__module__).values())
    for sec in found:
        _declared_tables(f"report section {sec.build.__module__}.{sec.build.__name__}", sec.tables)
    return found


def schemas() -> dict[str, dict]:
    """Each unit's config section schema, by kernel: one entry per experiment it declares, and no other."""
    out = {}
    for module in load():
        declared = {e.name for e in EXPERIMENTS.values() if e.module == module.__name__}
        schema = getattr(module, "SCHEMA", {})
        if set(schema) != declared:
            raise TypeError(f"{module.__name__}: SCHEMA has settings for {sorted(schema)}, but its experiments are "
                            f"{sorted(declared)}")
        if schema:
            out[module.__name__.rsplit(".", 1)[-1]] = schema
    return out


def setting_checks() -> dict[str, Callable[[dict], None]]:
    """Each unit's check_settings, by kernel, for the units that declare one."""
    return {m.__name__.rsplit(".", 1)[-1]: m.check_settings for m in load() if hasattr(m, "check_settings")}


def providers() -> dict[str, dict[str, str]]:
    """Each unit's provider values and what they are, by kernel, in ladder order."""
    return {m.__name__.rsplit(".", 1)[-1]: m.PROVIDERS for m in load() if getattr(m, "PROVIDERS", None)}
