"""lab.isolated: a probe's outcome comes back as a status, whatever the child process did."""
import os

from lab import isolated


def test_a_result_comes_back():
    assert isolated.call(divmod, 7, 2) == {"status": "ok", "result": (3, 1)}


def test_an_exception_is_a_result():
    out = isolated.call(int, "x")
    assert out["status"] == "raised" and "ValueError" in out["error"]


def test_a_child_that_dies_is_a_crash():
    out = isolated.call(os._exit, 3)
    assert out["status"] == "crashed" and "exit code 3" in out["error"]


def test_a_child_that_hangs_is_killed_and_said_to_have_timed_out():
    import time

    start = time.monotonic()
    out = isolated.call(time.sleep, 60, timeout_s=3)
    assert out["status"] == "timed_out" and "no result within 3 s" in out["error"]
    assert time.monotonic() - start < 30  # killed at the timeout, not after the sleep
