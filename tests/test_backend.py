import pytest

from kernels import backend


@pytest.mark.parametrize("interpret", ["", "1"])
@pytest.mark.parametrize("cuda", [False, True])
def test_resolve_auto_matches_the_machine(monkeypatch, interpret, cuda):
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert backend.resolve("auto") == ("gpu" if cuda and not interpret else "interpreter")


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        backend.resolve("tpu")


def test_gpu_without_cuda_is_refused(monkeypatch):
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        backend.resolve("gpu")


def test_backend_cannot_change_after_kernels_loaded():
    import kernels

    kernels.softmax  # noqa: B018  (loads a kernel module, fixing the backend)
    other = "gpu" if backend.current() == "interpreter" else "interpreter"
    with pytest.raises(RuntimeError, match="already set up"):
        backend.select(other)


def test_aot_backend_refuses_to_launch_naming_itself():
    """KERNELS_BACKEND=aot compiles for a GPU target without one: a kernel call is refused before any
    launch, for CPU tensors as for any other, instead of crashing inside Triton."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KERNELS_BACKEND"] = "aot"
    code = ("import torch, kernels\n"
            "for call in (lambda: kernels.vector_add(torch.ones(4), torch.ones(4)),\n"
            "             lambda: kernels.softmax(torch.ones(2, 4)),\n"
            "             lambda: kernels.flash_attention(*[torch.ones(1, 1, 4, 16)] * 3)):\n"
            "    try:\n"
            "        call()\n"
            "    except RuntimeError as e:\n"
            "        print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all("'aot' backend" in line and "cannot launch" in line for line in lines), done.stdout


def test_triton_loaded_before_the_interpreter_is_chosen_is_refused_with_advice_that_works():
    """torch.use_deterministic_algorithms (like torch.compile) imports triton; after that Triton's interpreter
    can no longer be chosen (triton's own @jit helpers are built in compiled mode). The refusal names a step
    that works, and taking it does."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["KERNELS_BACKEND"] = "interpreter"
    call = "print(kernels.softmax(torch.zeros(2, 3)).sum().item())"
    loads_triton = "torch.use_deterministic_algorithms(True)\nimport triton"
    late = f"import torch, kernels\n{loads_triton}\n{call}"
    early = f"import torch, kernels\nkernels.backend.select()\n{loads_triton}\n{call}"
    refused, taken = (subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     timeout=300) for code in (late, early))
    assert refused.returncode != 0 and "call kernels.backend.select() before" in refused.stderr, refused.stderr
    assert taken.returncode == 0 and float(taken.stdout) == 2.0, taken.stderr
