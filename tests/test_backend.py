import pytest

from kernels import backend


def test_resolve_auto_matches_the_machine():
    import torch

    expected = "gpu" if torch.cuda.is_available() else "interpreter"
    assert backend.resolve("auto") in (expected, "interpreter")  # interpreter if TRITON_INTERPRET is set


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
