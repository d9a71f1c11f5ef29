"""GPU pinning and exclusivity (lab/gpu.py), tested on CPU with lock files: timing jobs lock a GPU
exclusively, correctness jobs share one, and no timing job ever runs beside another job."""
import multiprocessing as mp
import os

import pytest

from lab import gpu


def _hold(lock_dir, gpus, exclusive, ready, release, result):
    got, _handle = gpu.claim(gpus, lock_dir, exclusive)
    result.put(got)
    ready.set()
    release.wait(10)


@pytest.fixture
def holder(tmp_path):
    """Start a process that holds a lock until the test ends."""
    ctx = mp.get_context("spawn")
    procs = []

    def start(gpus, exclusive):
        ready, release, result = ctx.Event(), ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_hold, args=(tmp_path, gpus, exclusive, ready, release, result))
        p.start()
        assert ready.wait(30)
        procs.append((p, release))
        return result.get(timeout=5)

    yield start
    for p, release in procs:
        release.set()
        p.join(10)


def test_exclusive_jobs_get_different_gpus(tmp_path, holder):
    first = holder(["0", "1"], exclusive=True)
    second, _ = gpu.claim(["0", "1"], tmp_path, exclusive=True, timeout_s=2)
    assert {first, second} == {"0", "1"}


def test_exclusive_job_waits_while_gpu_is_taken(tmp_path, holder):
    holder(["0"], exclusive=True)
    with pytest.raises(TimeoutError):
        gpu.claim(["0"], tmp_path, exclusive=True, poll_s=0.05, timeout_s=0.5)
    with pytest.raises(TimeoutError):
        gpu.claim(["0"], tmp_path, exclusive=False, poll_s=0.05, timeout_s=0.5)


def test_shared_jobs_run_together_but_not_beside_a_timing_job(tmp_path, holder):
    holder(["0"], exclusive=False)
    got, _ = gpu.claim(["0"], tmp_path, exclusive=False, timeout_s=2)
    assert got == "0"
    with pytest.raises(TimeoutError):
        gpu.claim(["0"], tmp_path, exclusive=True, poll_s=0.05, timeout_s=0.5)


def test_pin_narrows_visible_devices_to_one_it_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    handles = gpu.pin(tmp_path, exclusive=True, timing=True)
    assert os.environ["CUDA_VISIBLE_DEVICES"] in ("3", "5")
    for handle in handles:
        handle.close()


def test_plotting_waits_while_a_kernel_is_timed(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    timing = gpu.pin(tmp_path, exclusive=True, timing=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what the next job sees (pin narrowed it for this one)
    other_gpu = gpu.pin(tmp_path, exclusive=True, timing=True)  # a second timing job, on the other GPU, still runs
    assert {h.name for h in other_gpu} != {h.name for h in timing}
    with pytest.raises(TimeoutError):
        gpu.claim(["host"], tmp_path, exclusive=True, poll_s=0.05, timeout_s=0.5)  # what quiet_host asks
    for handle in (*timing, *other_gpu):
        handle.close()
    gpu.quiet_host(tmp_path).close()
    correctness = gpu.pin(tmp_path, exclusive=False, timing=False)  # shares its GPU, does not hold the host
    gpu.quiet_host(tmp_path).close()
    correctness[0].close()


def test_a_job_alone_for_its_memory_locks_its_gpu_but_not_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    alone = gpu.pin(tmp_path, exclusive=True, timing=False)
    assert alone[1] is None  # no host lock: figures may be drawn meanwhile
    gpu.quiet_host(tmp_path).close()
    with pytest.raises(TimeoutError):  # but no other job shares its GPU
        gpu.claim(["0"], tmp_path, exclusive=False, poll_s=0.05, timeout_s=0.5)
    alone[0].close()


def test_no_gpu_means_no_pinning(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "visible_gpus", lambda: [])
    assert gpu.pin(tmp_path, exclusive=True, timing=True) is None


def test_locks_are_open_to_every_users_jobs(tmp_path):
    """A second user's jobs on the same machine lock the same files: the folder is world-writable and
    sticky, each lock file readable and writable by all, whatever the umask of whoever made them."""
    old = os.umask(0o077)
    try:
        _, handle = gpu.claim(["0"], tmp_path / "locks", exclusive=False, timeout_s=2)
    finally:
        os.umask(old)
    handle.close()
    assert (tmp_path / "locks").stat().st_mode & 0o7777 == 0o1777
    assert (tmp_path / "locks/gpu-0.lock").stat().st_mode & 0o777 == 0o666
