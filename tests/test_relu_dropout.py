import pytest
import torch
from scipy import stats

from conftest import DEVICE, FLOAT_DTYPES, ON_GPU, randn
from kernels import relu_dropout, relu_dropout_backward, relu_dropout_ref, relu_dropout_writeup
from kernels._philox import uniform4x_elements
from kernels._triton import tl, triton


def positive(n, seed=0):
    """Inputs relu keeps, so an output zero means 'dropped'."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.rand(n, generator=g, device=DEVICE) + 0.5


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_is_binomial(p):
    """The writeup's check, done as a test: the drop count of 100000 elements ~ Binomial(100000, p)."""
    n = 100_000
    dropped = int((relu_dropout(positive(n), p, seed=123) == 0).sum())
    assert abs(dropped / n - p) < 0.01  # the writeup's band
    assert stats.binomtest(dropped, n, p).pvalue > 1e-4


def test_rates_across_seeds_are_binomial():
    n, p = 20_000, 0.3
    counts = [int((relu_dropout(positive(n), p, seed=s) == 0).sum()) for s in range(20)]
    assert stats.binomtest(sum(counts), n * 20, p).pvalue > 1e-4
    z = [(c - n * p) / (n * p * (1 - p)) ** 0.5 for c in counts]
    assert stats.kstest(z, "norm").pvalue > 1e-4  # the spread matches too, not only the mean


def test_neighbours_are_independent():
    keep = (relu_dropout(positive(50_000), 0.5, seed=9) != 0).float().cpu().numpy()
    assert stats.pearsonr(keep[:-1], keep[1:]).pvalue > 1e-4


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 97, 1025, 3001])
def test_survivors_scaled_by_one_over_keep(n, dtype):
    p = 0.25
    x = randn(n, dtype=dtype, seed=4)
    out = relu_dropout(x, p, seed=5)
    # the mask rebuilt from the seed alone (kernels._philox), not read off the output under test
    keep = uniform4x_elements(5, n, device=x.device) >= torch.tensor(p, dtype=torch.float32)
    ref = relu_dropout_ref(x, p, keep)
    # Both round the fp32 quotient to dtype; allow one ulp for 1/(1-p) computed in fp32 vs double.
    assert torch.allclose(out.float(), ref.float(), rtol=2 * torch.finfo(dtype).eps, atol=0)
    assert (out[x <= 0] == 0).all()


@pytest.mark.parametrize("seed", [2**31, 2**32 + 5, 2**63 - 1])
def test_a_64_bit_seed_keys_philox_with_all_its_bits(seed):
    """Seeds past int32 (torch.initial_seed() is one) draw the mask Philox draws keyed on the whole seed:
    as the reference rebuilt from it without Triton, and another than its low 32 bits alone draw."""
    x = positive(4099)
    keep = relu_dropout(x, 0.3, seed) != 0
    assert torch.equal(keep, uniform4x_elements(seed, x.numel(), device=x.device) >= torch.tensor(0.3))
    assert torch.equal(relu_dropout_backward(torch.ones_like(x), x, 0.3, seed) != 0, keep)
    if seed >= 2**32:
        assert not torch.equal(keep, relu_dropout(x, 0.3, seed % 2**32) != 0)


def test_same_seed_same_output_other_seed_differs():
    x = positive(10_000)
    a, b, c = relu_dropout(x, 0.5, 7), relu_dropout(x, 0.5, 7), relu_dropout(x, 0.5, 8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_p_zero_is_relu():
    x = randn(1000)
    assert torch.equal(relu_dropout(x, 0.0, 1), torch.relu(x))


def test_p_zero_keeps_an_element_whose_uniform_is_zero():
    """tl.rand draws exactly 0.0 with probability 2**-31 (from the words 0 and 2**32 - 1): at this seed element 3
    does. Kept, as p = 0 asks (the writeup's u > p drops it); its gradient too."""
    seed = 1343428
    assert uniform4x_elements(seed, 8)[3] == 0  # the case this test is about
    x = torch.ones(8, device=DEVICE)
    assert torch.equal(relu_dropout(x, 0.0, seed), x)
    assert torch.equal(relu_dropout_backward(x, x, 0.0, seed), x)


@pytest.mark.parametrize("p", [0.99, 0.999])
def test_survivors_are_scaled_by_one_over_one_minus_p_near_one(p):
    """1 - p from p in fp32 would be off by p's rounding error relative to 1 - p (p = 0.999: a scale of 1000.013;
    on a GPU, where the kernels compute in fp32): the scale is 1 / (1 - p) to fp32's rounding, both ways."""
    x = positive(65536)
    out = relu_dropout(x, p, 11, block_size=2**14)
    dx = relu_dropout_backward(torch.ones_like(x), x, p, 11, block_size=2**14)
    kept = out != 0
    assert kept.sum() > 10  # survivors to check
    torch.testing.assert_close(out[kept], x[kept] / (1 - p), rtol=3e-7, atol=0)
    torch.testing.assert_close(dx[kept], torch.full_like(dx[kept], 1 / (1 - p)), rtol=3e-7, atol=0)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_nan_input_gets_torchs_forward_and_gradient(p):
    """A NaN survives relu and passes the gradient, as in torch's relu; dropout then keeps or zeroes both."""
    x = torch.tensor([float("nan"), 2.0, -1.0, 0.0] * 256, device=DEVICE, requires_grad=True)
    out = relu_dropout(x, p, seed=3)
    (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    kept = out.detach().ne(0) | out.detach().isnan()  # at x = 2.0: kept iff nonzero
    nan = torch.isnan(x.detach())
    assert out.detach()[nan].isnan().eq(kept[nan]).all()  # NaN if kept, 0 if dropped
    want = torch.where(x.detach().gt(0) | nan, 1 / (1 - p), 0.0) * kept
    torch.testing.assert_close(dx, want)
    if p == 0.0:
        xt = x.detach().clone().requires_grad_()
        torch.relu(xt).backward(torch.ones_like(xt))
        torch.testing.assert_close(dx, xt.grad)


@triton.jit
def _maximum_with_zero(x_ptr, out_ptr):
    tl.store(out_ptr, tl.maximum(tl.load(x_ptr), 0.0))


def _maximum_keeps_nan() -> bool:
    """Does this backend's tl.maximum(NaN, 0) give NaN? The GPU's max.f32 gives 0, as Triton 3.9's interpreter
    does; 3.6's (numpy's maximum) gives NaN."""
    x = torch.tensor([float("nan")], device=DEVICE)
    out = torch.empty_like(x)
    _maximum_with_zero[(1,)](x, out)
    return bool(out.isnan().item())


def test_the_printed_kernel_turns_nan_into_zero():
    """The writeup's relu is tl.maximum(x, 0.0), which returns 0 for NaN (torch.relu keeps it): a case the
    writeup did not test. relu_dropout keeps it."""
    if _maximum_keeps_nan():
        pytest.skip("tl.maximum(NaN, 0) is NaN here (Triton 3.6's interpreter), where the GPU gives 0")
    x = torch.tensor([float("nan"), 2.0, -1.0, 0.0] * 256, device=DEVICE)
    nan = x.isnan()
    assert relu_dropout_writeup(x, 0.0, seed=3)[nan].eq(0).all()
    assert relu_dropout(x, 0.0, seed=3)[nan].isnan().all() and torch.relu(x)[nan].isnan().all()


@pytest.mark.parametrize("p, error", [(-0.1, ValueError), (1.0, ValueError), (1.5, ValueError),
                                      (float("nan"), ValueError), (10**400, ValueError), ("0.5", TypeError),
                                      (True, TypeError)])
def test_bad_p_is_refused(p, error):  # a value out of range: ValueError; not a number at all: TypeError
    with pytest.raises(error, match="p must be"):
        relu_dropout(randn(10), p, 0)


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (2**63, ValueError), (1.5, TypeError)])
def test_bad_seed_is_refused(seed, error):
    with pytest.raises(error, match="seed"):
        relu_dropout(randn(10), 0.5, seed)


@pytest.mark.parametrize("kernel", [relu_dropout, relu_dropout_writeup], ids=["fused", "writeup"])
def test_the_output_is_the_same_at_any_block_size(kernel):
    """Each element's random number comes from its index alone, so the block size changes how the work is
    split, never the output (block_size=None, in the interpreter, is one block of up to 2**17 elements)."""
    x = randn(5001, seed=5)
    outs = [kernel(x, 0.3, 21, block_size=b) for b in (64, 1024, 8192, None)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert not torch.equal(outs[0], kernel(x, 0.3, 22, block_size=64))  # and the seed does change it


def test_the_default_block_spans_several_blocks_alike_forward_and_backward():
    """relu_dropout's default block (2**17 elements in the interpreter, 1024 on a GPU) over an input of several
    such blocks and a ragged end: the same output, and gradient, as blocks of 1024 give."""
    from kernels import _relu_dropout

    n = 2**18 + 3
    assert _relu_dropout._default_block(n) == (1024 if ON_GPU else 2**17)
    assert _relu_dropout._default_block(5) == 1024
    x, dy = randn(n, seed=6), randn(n, seed=7)
    assert torch.equal(relu_dropout(x, 0.6, 4), relu_dropout(x, 0.6, 4, block_size=1024))
    assert torch.equal(relu_dropout_backward(dy, x, 0.6, 4), relu_dropout_backward(dy, x, 0.6, 4, block_size=1024))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("block_size", [64, 1024])
def test_backward_draws_the_forwards_mask_again(dtype, block_size):
    """No mask is saved: the backward draws it again from the seed, whatever its block size, and passes
    the gradient exactly where the forward kept a positive x (scaled by 1/(1-p)), 0 elsewhere."""
    p, n = 0.4, 3001
    x = randn(n, dtype=dtype, seed=11).requires_grad_()
    out = relu_dropout(x, p, seed=12)
    dy = randn(n, dtype=dtype, seed=13)
    out.backward(dy)
    passed = (x.detach() > 0) & (out.detach() != 0)
    want = torch.where(passed, (dy.float() / (1 - p)).to(dtype), torch.zeros_like(dy))
    torch.testing.assert_close(x.grad, want, rtol=2 * torch.finfo(dtype).eps, atol=0)
    again = relu_dropout_backward(dy, x.detach(), p, 12, block_size=block_size)
    assert torch.equal(again, x.grad)
    assert not torch.equal(relu_dropout_backward(dy, x.detach(), p, 13), x.grad)  # another seed, another mask
    assert x.grad[x.detach() <= 0].eq(0).all()


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_a_gradient_taken_with_create_graph_is_differentiable_in_x_and_dy(p):
    """As torch's relu: with create_graph=True the gradient has a graph in x (its derivative there is zero)
    even for a constant output gradient, and in dy it is the same masked scale again."""
    x = randn(1000).requires_grad_()
    out = relu_dropout(x, p, 5)
    (g,) = torch.autograd.grad(out, x, torch.ones_like(out), create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    assert gg.eq(0).all()
    dy = randn(1000, seed=7).requires_grad_()
    (g2,) = torch.autograd.grad(relu_dropout(x, p, 5), x, dy, create_graph=True)
    (gdy,) = torch.autograd.grad((g2 * g2).sum(), dy)
    scale = out.detach().ne(0).to(x.dtype) / (1 - p)  # where kept and x > 0
    torch.testing.assert_close(gdy, 2 * dy.detach() * scale * scale)
