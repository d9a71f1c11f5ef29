"""Which tables of a run are out of date with this checkout's code or settings, and why.

    python -m lab status results/nvidia-h200 [--configfile more.yaml ...] [--config KEY=VALUE ...]

Decided from content, as the workflow decides it: each table recorded the hash of the settings and of
the source files that made it; this checkout's config and code give the hashes a current table must
have. Works on a run from any machine; the software a table was made with (torch, triton, CUDA, driver,
the KERNELS_* environment) is judged only where this machine is the device that made it, as the
workflow would rerun it here (a GPU run's software cannot be checked from a CPU). Exit status 0 when
every configured table is current and all were made on one machine, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from . import plan, provenance, runs, settings
from .units import registry, schemas


def _merge(base: dict, more: dict) -> dict:
    out = dict(base)
    for k, v in more.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config_of(paths: list[str], given: dict | None = None) -> dict:
    """config.yaml, updated by each further file, the way Snakemake merges --configfile, then by ``given``
    ({key: value} as --config gives them), each value the type its key asks for (settings.from_command_line)."""
    config: dict = {}
    for path in paths:
        config = _merge(config, yaml.safe_load(Path(path).read_text()) or {})
    if given:
        config = _merge(config, given)
        settings.from_command_line(config, given, schemas())
    return config


def this_machine(config: dict) -> dict | None:
    """provenance.software() of the backend the workflow would plan with here (config's, resolved as the
    workflow resolves it), or None where that backend cannot run here (gpu without a GPU)."""
    from kernels import backend

    try:
        return provenance.software(backend.resolve(config["backend"]))
    except RuntimeError:
        return None


def check(run_dir: Path, config: dict, here: dict | None = None) -> list[tuple[str, str]]:
    """(table, state) for every table the config asks for: 'current', or why it is not; the software of
    a table made on ``here``'s device and backend (this_machine()) counts too. The config is checked as
    the workflow checks it first (settings.ConfigError naming the key)."""
    settings.validate(config, schemas())
    settings.check(config, registry())
    found = []
    for key, want in plan.expected(config, registry()).items():
        rec = runs.recorded(run_dir / f"{key}.parquet")
        if rec is None:
            state = "missing"
        elif rec["unreadable"]:
            state = f"unreadable: {rec['unreadable']}"
        elif rec["fingerprint"] == "failed":
            state = "stale: the experiment failed (its table records the error)"
        else:
            why = [what for what, field in (("settings", "config_hash"), ("code", "code_hash"))
                   if rec[field] != want[field]]
            if here and (rec["device"], rec["backend"]) == (here["device"], here["backend"]):
                changed = [f"{k} {rec[k] or '(none)'} -> {here[k] or '(none)'}" for k in provenance.SOFTWARE
                           if (rec[k] or "") != (here[k] or "")]
                why += [f"software ({', '.join(changed)})"] if changed else []
            state = "current" if not why else f"stale: {' and '.join(why)} changed since commit {rec['git_commit']}"
        found.append((key, state))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab status", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder, e.g. results/nvidia-h200")
    ap.add_argument("--configfile", action="append", default=[], help="config files on top of config.yaml")
    ap.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                    help="settings on top of those, as snakemake --config takes them (e.g. seed=1)")
    args = ap.parse_args(argv)
    if not args.run.is_dir():
        ap.error(f"{args.run} is not a run folder")
    runs_in = {p.parent.parent.name for p in args.run.glob("*/*/*.parquet")}  # a run's own are one level down
    if runs_in:
        ap.error(f"{args.run} holds runs, it is not one: name one of {', '.join(sorted(runs_in))}")
    if any(args.run.glob("*.parquet")) and not any(args.run.glob("*/*.parquet")):
        ap.error(f"{args.run} holds tables of its own (as results/compare holds comparisons), not a run's "
                 "<kernel>/<experiment>.parquet tables")
    root = Path(__file__).resolve().parents[2]
    here = next((d for d in (Path.cwd(), *Path.cwd().parents) if (d / "workflow/lab/status.py").is_file()), None)
    if here is not None and here.resolve() != root:  # as the workflow refuses it: judged by other code than here
        ap.error(f"this is the checkout {here}, but Python imports the lab from {root}, whose code and config.yaml "
                 "it would judge by: run `pip install -e .` here (or put it first on PYTHONPATH)")
    files = [str(root / "config.yaml"), *args.configfile]
    try:
        settings.check_files(files)
        given = {}
        for item in args.config:
            key, sep, value = item.partition("=")
            if not (sep and key):
                raise settings.ConfigError(f"--config takes KEY=VALUE, got {item!r}")
            given[key] = yaml.safe_load(value)
        config = config_of(files, given)
        states = check(args.run, config, this_machine(config))
    except settings.ConfigError as refusal:
        ap.error(str(refusal))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as unreadable:  # a config file missing, binary, not YAML
        ap.error(f"a config file cannot be read: {unreadable}")
    width = max(len(k) for k, _ in states)
    for key, state in states:
        print(f"{key:<{width}}  {state}")
    devices = sorted({f"{o[0]} ({o[1]})" for o in runs.owners(args.run)})
    stale = [k for k, s in states if s != "current"]
    print(f"{args.run}: made on {', '.join(devices) or 'no device yet'}; "
          + (f"{len(stale)} of {len(states)} tables out of date" if stale else f"all {len(states)} tables current"))
    if len(devices) > 1:  # the workflow builds no report from it either
        print(f"{args.run} holds tables of {len(devices)} machines, and a run is one machine's: move the tables "
              "that do not belong there out of it")
    return 1 if stale or len(devices) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
