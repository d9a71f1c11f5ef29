import warnings

import pytest
import torch

from conftest import FLOAT_DTYPES, randn
from kernels import softmax, softmax_naive, softmax_ref
from lab.verify import softmax_atol

SHAPES = [(4, 5), (1, 1), (3, 97), (7, 1023), (2, 1024), (2, 1025), (5, 2000), (2, 4097)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fixed_softmax_any_width(shape, dtype):
    x = randn(*shape, dtype=dtype, seed=3)
    out = softmax(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), softmax_ref(x).float(), atol=softmax_atol(dtype), rtol=0)


def test_writeup_small_case_passes_with_the_bug():
    x = randn(4, 5)
    torch.testing.assert_close(softmax(x, block_size=1024), torch.softmax(x, -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_cols", [1025, 2000, 3000])
def test_hardcoded_block_silently_drops_columns(n_cols):
    """The writeup's bug: columns past 1024 are never written, no error, no warning."""
    x = randn(4, n_cols, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        out = softmax(x, block_size=1024, out=torch.full_like(x, float("nan")))
    untouched = out.isnan().all(dim=0)
    assert int(untouched.sum()) == n_cols - 1024
    assert untouched[1024:].all() and not untouched[:1024].any()
    # What was written is a softmax over the first 1024 columns only.
    torch.testing.assert_close(out[:, :1024], torch.softmax(x[:, :1024], -1), atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, :1024], torch.softmax(x, -1)[:, :1024], atol=1e-6)


def test_fix_at_2000():
    x = randn(4, 2000, seed=1)
    buggy = softmax(x, block_size=1024, out=torch.zeros_like(x))
    assert (buggy - torch.softmax(x, -1)).abs().max() > 1e-3
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1), atol=1e-6, rtol=0)


def test_max_subtraction_keeps_large_inputs_finite():
    x = randn(8, 1000, scale=1000.0)
    assert not softmax_naive(x).isfinite().all()  # exp overflows without the max subtraction
    out = softmax(x)
    assert out.isfinite().all()
    torch.testing.assert_close(out.double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=0)


def test_strided_rows():
    x = randn(6, 300)[::2]  # row stride 600
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("x, kwargs, err", [
    (lambda: randn(10), {}, ValueError),
    (lambda: randn(2, 3, 4), {}, ValueError),
    (lambda: randn(2, 3), {"block_size": 1000}, ValueError),
    (lambda: randn(2, 3).to(torch.float64), {}, TypeError),
])
def test_bad_input_is_refused(x, kwargs, err):
    with pytest.raises(err):
        softmax(x(), **kwargs)
