import pytest
import torch
import torch.nn.functional as F

from conftest import FLOAT_DTYPES, ON_GPU, randn
from kernels import attention, attention_ref

# fp32 tl.dot is TF32 on the GPU, full fp32 in the interpreter.
ATOL = {torch.float32: 5e-3 if ON_GPU else 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n_q, n_k, d", [(5, 15, 32), (1, 10, 64), (16, 16, 16), (97, 203, 64), (3, 1, 32),
                                         (33, 70, 48)])
def test_matches_sdpa(n_q, n_k, d, dtype):
    q, k, v = randn(n_q, d, dtype=dtype, seed=1), randn(n_k, d, dtype=dtype, seed=2), randn(n_k, d, dtype=dtype, seed=3)
    out = attention(q, k, v)
    ref = attention_ref(q, k, v)
    sdpa = F.scaled_dot_product_attention(q[None].float(), k[None].float(), v[None].float())[0]
    torch.testing.assert_close(out.float(), ref, atol=ATOL[dtype], rtol=0)
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=0)


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
