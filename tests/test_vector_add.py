import pytest
import torch

from conftest import DEVICE, FLOAT_DTYPES, randn
from kernels import vector_add

ODD_SIZES = [1, 5, 97, 1023, 1024, 1025, 2000, 4097]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", ODD_SIZES)
def test_matches_torch_exactly(n, dtype):
    x, y = randn(n, dtype=dtype, seed=1), randn(n, dtype=dtype, seed=2)
    assert torch.equal(vector_add(x, y), x + y)


def test_int32_and_any_shape():
    x = torch.arange(3 * 5 * 7, device=DEVICE, dtype=torch.int32).reshape(3, 5, 7)
    out = vector_add(x, x * 3)
    assert out.shape == (3, 5, 7) and torch.equal(out, x * 4)


def test_non_contiguous_input():
    x = randn(64, 33)
    y = randn(33, 64).T  # a transposed view
    assert torch.equal(vector_add(x, y), x + y)


def test_empty():
    x = torch.empty(0, device=DEVICE)
    assert vector_add(x, x).numel() == 0


@pytest.mark.parametrize("a, b, err", [
    (lambda: randn(4), lambda: randn(5), ValueError),
    (lambda: randn(4), lambda: randn(4, dtype=torch.float16), TypeError),
    (lambda: randn(4), lambda: [1.0, 2.0, 3.0, 4.0], TypeError),
    (lambda: randn(4, dtype=torch.float64), lambda: randn(4, dtype=torch.float64), TypeError),
])
def test_bad_input_is_refused(a, b, err):
    with pytest.raises(err, match=r"\b(x|y|block_size)\b"):  # naming the argument
        vector_add(a(), b())
