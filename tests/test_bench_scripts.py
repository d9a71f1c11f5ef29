"""The GPU bench scripts that keep a CPU check (``--check``: their kernels' phases the interpreter can run,
against torch) still run with this Triton: a script broken by a Triton update would cost a GPU session."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"bench_softmax_staged.py": "interpreter check passed", "bench_softmax_ahead.py": "interpreter check passed",
           "bench_softmax_tma.py": "check: right", "bench_softmax_unaligned.py": "interpreter check passed",
           "bench_softmax_keep.py": "interpreter check passed",
           "bench_softmax_spread.py": "interpreter check passed", "bench_softmax_backoff.py": "interpreter check passed",
           "bench_softmax_trace.py": "interpreter check passed",
           "bench_softmax_ticket.py": "interpreter check passed"}  # what each prints


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_check_passes_in_the_interpreter(script):
    # The backend named too: on a GPU box this process has chosen "gpu", which its children would inherit.
    env = dict(os.environ, TRITON_INTERPRET="1", KERNELS_BACKEND="interpreter",
               PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'workflow'}")
    done = subprocess.run([sys.executable, str(ROOT / "workflow" / "scripts" / script), "--check"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert SCRIPTS[script] in done.stdout, done.stdout


def test_every_script_answers_help_with_its_usage_here():
    """A user reading a GPU script's options on a CPU machine gets its usage, not a CUDA error: each script run by
    hand (a ``__main__`` block; not Snakemake's own, nor the modules they share) parses its arguments first."""
    scripts = sorted(p for p in (ROOT / "workflow" / "scripts").glob("*.py") if "__main__" in p.read_text())
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'workflow'}")
    env.pop("TRITON_INTERPRET", None)  # as a user starts them: the scripts choose the backend themselves
    running = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True) for p in scripts}
    answers = {name: (proc.wait(timeout=300), proc.stdout.read()) for name, proc in running.items()}
    assert len(answers) >= 15
    wrong = {name: out[-500:] for name, (rc, out) in answers.items() if rc != 0 or "usage:" not in out}
    assert not wrong, wrong


def test_the_benches_rows_say_the_gpus_state(tmp_path, monkeypatch):
    """Each timed row carries the clocks, temperature and power nvidia-smi reads after its timing
    (a stand-in nvidia-smi here), and nothing where nvidia-smi is absent or fails."""
    monkeypatch.syspath_prepend(str(ROOT / "workflow" / "scripts"))
    import softmax_bench_rows as rows

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '1980, 2619, 45, 312.25'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert rows.gpu_state() == {"clocks.sm": "1980", "clocks.mem": "2619", "temperature.gpu": "45",
                                "power.draw": "312.25"}
    smi.write_text("#!/bin/sh\necho 'Field \"clocks.mem\" is not a valid field'\nexit 2\n")
    assert rows.gpu_state() == {}
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert rows.gpu_state() == {}
