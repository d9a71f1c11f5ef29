import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, ON_GPU, randn
from kernels import attention, attention_ref
from lab.verify import attention_eps, max_abs_diff, within_fa_rule



@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n_q, n_k, d", [(5, 15, 32), (1, 10, 64), (16, 16, 16), (97, 203, 64), (3, 1, 32),
                                         (33, 70, 48)])
def test_matches_sdpa(n_q, n_k, d, dtype):
    q, k, v = randn(n_q, d, dtype=dtype, seed=1), randn(n_k, d, dtype=dtype, seed=2), randn(n_k, d, dtype=dtype, seed=3)
    ref = attention_ref(q.double(), k.double(), v.double())
    err = max_abs_diff(attention(q, k, v), ref)
    err_torch = max_abs_diff(F.scaled_dot_product_attention(q[None], k[None], v[None])[0], ref)  # same precision
    assert within_fa_rule(err, err_torch, attention_eps(dtype, ON_GPU)), (err, err_torch)


@pytest.mark.parametrize("q, k, v, err", [
    (lambda: randn(4, 32), lambda: randn(5, 16), lambda: randn(5, 16), ValueError),
    (lambda: randn(4, 32), lambda: randn(5, 32), lambda: randn(6, 32), ValueError),
    (lambda: randn(1, 4, 32), lambda: randn(5, 32), lambda: randn(5, 32), ValueError),
    (lambda: randn(4, 32), lambda: randn(5, 32, dtype=torch.float16), lambda: randn(5, 32, dtype=torch.float16), TypeError),
    (lambda: randn(4, 32), lambda: randn(0, 32), lambda: randn(0, 32), ValueError),
])
def test_bad_input_is_refused(q, k, v, err):
    with pytest.raises(err):
        attention(q(), k(), v())
