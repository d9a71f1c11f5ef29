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
    with pytest.raises(err, match=r"\b(q|k|v)\b"):  # naming the argument
        attention(q(), k(), v())


# fp32 here; tl.dot on the GPU rounds its inputs to TF32 (the pipeline's tolerance for that), exact in the interpreter
FP32_TOL = attention_eps(torch.float32, ON_GPU) if ON_GPU else 1e-4


def _layouts(n, d, seed):
    """(what, tensor of shape (n, d)): layouts whose strides are not (d, 1) though their elements are the
    same, and some whose rows are not dense at all."""
    base = randn(n, d, seed=seed)
    fused = torch.cat([base, randn(n, 2 * d, seed=seed + 10)], dim=1)[:, :d]  # a slice of a fused qkv: (3d, 1)
    yield "contiguous", base
    yield "slice of a fused row", fused
    yield "column-major", base.t().contiguous().t()
    yield "as_strided one row", base[:1].as_strided((1, d), (3 * d, 1)) if n == 1 else base


@pytest.mark.parametrize("n_q", [1, 5])
@pytest.mark.parametrize("d", [1, 16, 24])
def test_any_layout_of_q_k_v_gives_the_reference(n_q, d):
    """The kernels take one (row, column) stride pair for q, k, v and out: whatever layout each comes in
    (one query row sliced from a fused qkv keeps a row stride of 3d through contiguous()), the result is
    the reference's, for attention and, where d is a power of two >= 16, the writeup's kernel as printed."""
    from kernels import attention_writeup

    for (wq, q), (wk, k), (wv, v) in zip(_layouts(n_q, d, 1), _layouts(7, d, 2), _layouts(7, d, 3)):
        ref = attention_ref(q.double(), k.double(), v.double())
        torch.testing.assert_close(attention(q, k, v).double(), ref, atol=FP32_TOL, rtol=FP32_TOL, msg=f"{wq}/{wk}/{wv}")
        if d >= 16 and d & (d - 1) == 0:
            torch.testing.assert_close(attention_writeup(q, k, v).double(), ref, atol=FP32_TOL, rtol=FP32_TOL)
    q1 = randn(1, 3 * d, seed=4)[:, :d]  # the fused slice alone, against dense k and v
    k, v = randn(7, d, seed=5), randn(7, d, seed=6)
    torch.testing.assert_close(attention(q1, k, v).double(), attention_ref(q1.double(), k.double(), v.double()),
                               atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.parametrize("d", [1, 4, 8, 12, 40, 100])
def test_the_printed_kernel_is_wrong_wherever_its_head_dim_block_is_wider_than_d(d):
    """The head-dim block is next_power_of_2(d), and at least tl.dot's 16: wherever it is wider than d (d not
    a power of two, or below 16) each row of the printed kernel (row masks only) takes in the next row's first
    elements. The head-dim mask (attention) is right at every one."""
    from kernels import attention_writeup, launch_config

    q, k, v = randn(8, d, seed=1), randn(20, d, seed=2), randn(20, d, seed=3)
    assert launch_config(20, d)["BLOCK_V"] > d
    ref = attention_ref(q.double(), k.double(), v.double())
    # not "> 0.05": on a GPU the last row's padding reads past q's end, whatever lies there (NaN compares False)
    assert not max_abs_diff(attention_writeup(q, k, v), ref) <= 0.05
    torch.testing.assert_close(attention(q, k, v).double(), ref, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.skipif(ON_GPU, reason="on a GPU it compiles for that GPU")
def test_shared_memory_required_says_it_needs_a_gpu():
    from kernels import shared_memory_required

    with pytest.raises(RuntimeError, match="compiles for the GPU it runs on"):
        shared_memory_required(randn(4, 32), randn(8, 32), randn(8, 32))
