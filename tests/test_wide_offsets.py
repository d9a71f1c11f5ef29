"""The 64-bit paths, exercised at small sizes by lowering the int32 limit (kernels._offsets.INT32_MAX), and
the folded FlashAttention grid; on CPU in the interpreter. The sizes past 2**31 themselves run on the GPU
(tests/test_limits_gpu.py)."""
import pytest
import torch

from conftest import randn
from kernels import _offsets, _relu_dropout, _vector_add, relu_dropout, relu_dropout_backward, vector_add, vector_add_writeup


@pytest.fixture
def int64_everywhere(monkeypatch):
    """Every launch takes the 64-bit path; returns the WIDE value of each launch (each must be True)."""
    monkeypatch.setattr(_offsets, "INT32_MAX", 0)
    chosen = []

    def recorded(n, block_size):
        chosen.append(_offsets.wide(n, block_size))
        return chosen[-1]

    for module in (_vector_add, _relu_dropout):
        monkeypatch.setattr(module, "wide", recorded)
    return chosen


def test_wide_is_decided_by_the_last_blocks_end(monkeypatch):
    assert not _offsets.wide(2**31 - 1 - 1024, 1024) and _offsets.wide(2**31 - 1024, 1024)
    monkeypatch.setattr(_offsets, "INT32_MAX", 0)
    assert _offsets.wide(1, 1)


@pytest.mark.parametrize("n", [1, 1000, 4099])
def test_vector_add_64_bit_path_is_exact(int64_everywhere, n):
    x, y = randn(n, seed=1), randn(n, seed=2)
    assert torch.equal(vector_add(x, y), x + y) and torch.equal(vector_add_writeup(x, y), x + y)
    assert int64_everywhere == [True]  # vector_add launched with 64-bit offsets (the writeup's has none)


@pytest.mark.parametrize("n, block_size", [(4099, 1024), (37, 4)])
def test_relu_dropout_64_bit_path_draws_the_same_mask(request, n, block_size):
    """Two-word Philox counters whose high word is 0 are what tl.rand4x draws: the mask never depends on
    whether the tensor needed 64-bit offsets."""
    x, dy = randn(n, seed=3), randn(n, seed=4)
    narrow = relu_dropout(x, 0.3, 11, block_size=block_size)
    narrow_dx = relu_dropout_backward(dy, x, 0.3, 11, block_size=block_size)
    chosen = request.getfixturevalue("int64_everywhere")
    assert torch.equal(relu_dropout(x, 0.3, 11, block_size=block_size), narrow)
    assert torch.equal(relu_dropout_backward(dy, x, 0.3, 11, block_size=block_size), narrow_dx)
    assert chosen == [True, True]  # both launches took the 64-bit path
