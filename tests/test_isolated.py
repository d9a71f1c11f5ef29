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
