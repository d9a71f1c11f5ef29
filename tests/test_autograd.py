"""Autograd through the public kernels: every kernel function either has gradients that match torch's, for
any input strides (transposed, expanded with stride 0) and to second order where it claims so, or refuses
an input that requires grad. Nothing returns a result silently detached from the graph."""
import pytest
import torch
from conftest import DEVICE, randn

import kernels
from kernels import (attention, attention_ref, attention_writeup, flash_attention, flash_attention_ref, relu_dropout,
                     relu_dropout_backward, relu_dropout_ref, relu_dropout_writeup, softmax, softmax_backward,
                     softmax_writeup, vector_add, vector_add_unmasked, vector_add_writeup)

P, SEED = 0.3, 7


def dropout_ref(x):
    keep = relu_dropout(torch.ones(x.shape, device=DEVICE), P, SEED) != 0  # the mask the kernel draws
    return relu_dropout_ref(x, P, keep)


# name -> (kernel, torch reference, shapes of its inputs)
DIFFERENTIABLE = {
    "vector_add": (vector_add, torch.add, [(6, 5), (6, 5)]),
    "vector_add_writeup": (vector_add_writeup, torch.add, [(6, 5), (6, 5)]),
    "relu_dropout": (lambda x: relu_dropout(x, P, SEED), dropout_ref, [(6, 5)]),
    "softmax": (softmax, lambda x: torch.softmax(x, dim=-1), [(6, 5)]),
    "attention": (attention, attention_ref, [(6, 16), (5, 16), (5, 16)]),
    "flash_attention": (flash_attention, flash_attention_ref, [(1, 2, 6, 16), (1, 2, 5, 16), (1, 2, 5, 16)]),
}
TF32 = {"attention", "flash_attention"}  # their fp32 dots run in TF32 on the GPU (10-bit mantissa)
# name -> a call of it on tensors that require grad (it must refuse them)
FORWARD_ONLY = {
    "vector_add_unmasked": lambda x: vector_add_unmasked(x, x, torch.empty(4, device=DEVICE), block_size=4),
    "relu_dropout_writeup": lambda x: relu_dropout_writeup(x, P, SEED),
    "softmax_writeup": lambda x: softmax_writeup(x.view(2, 2)),
    "softmax with a block_size": lambda x: softmax(x.view(2, 2), block_size=4),
    "attention_writeup": lambda x: attention_writeup(*(x.repeat(4).view(1, 16),) * 3),
}
NOT_KERNELS = {"attention_ref", "flash_attention_ref", "relu_dropout_ref", "softmax_ref", "softmax_naive",
               "softmax_unfused", "vector_add_ref",  # torch code, differentiable by torch
               "launch_config", "shared_memory_required", "tiles_in_use"}  # no tensor result
BACKWARDS = {"relu_dropout_backward", "softmax_backward"}  # tested below against torch's double backward


def test_every_public_function_is_classified():
    """A new export must say which kind it is, and so get these tests."""
    named = set(DIFFERENTIABLE) | set(FORWARD_ONLY) | NOT_KERNELS | BACKWARDS
    assert set(kernels.__all__) <= named, set(kernels.__all__) - named


def leaf_and_view(shape, seed, layout):
    """A leaf that requires grad, and the input of that shape made from it: the leaf itself, a transposed
    view (last two dims swapped in memory), or a view expanded from one row (stride 0: every row is one
    memory location, so its gradient is the sum over rows)."""
    if layout == "transposed":
        leaf = randn(*shape[:-2], shape[-1], shape[-2], seed=seed).requires_grad_()
        return leaf, leaf.transpose(-1, -2)
    if layout == "expanded":
        leaf = randn(*shape[:-2], 1, shape[-1], seed=seed).requires_grad_()
        return leaf, leaf.expand(shape)
    leaf = randn(*shape, seed=seed).requires_grad_()
    return leaf, leaf


@pytest.mark.parametrize("name", DIFFERENTIABLE)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded"])
def test_gradients_match_torch_for_any_strides(name, layout):
    kernel, ref, shapes = DIFFERENTIABLE[name]
    leaves, inputs = zip(*(leaf_and_view(s, i, layout) for i, s in enumerate(shapes)))
    out = kernel(*inputs)
    do = randn(*out.shape, seed=9)
    # The output takes part in a larger graph: its gradient adds to the inputs' other uses.
    got = torch.autograd.grad((out * do).sum() + sum(t.sum() for t in inputs), leaves)
    want = torch.autograd.grad((ref(*inputs) * do).sum() + sum(t.sum() for t in inputs), leaves)
    tol = 1e-2 if name in TF32 and DEVICE == "cuda" else 1e-4
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.to(g.dtype), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", [n for n in DIFFERENTIABLE if n != "flash_attention"])
def test_second_order_gradients_match_torch(name):
    """create_graph=True: the gradient has a graph, and differentiating it gives torch's second order."""
    kernel, ref, shapes = DIFFERENTIABLE[name]
    inputs = [randn(*s, seed=i).requires_grad_() for i, s in enumerate(shapes)]
    do = randn(*kernel(*inputs).shape, seed=9)

    def second(f):
        first = torch.autograd.grad((f(*inputs) * do).sum(), inputs, create_graph=True)
        # a gradient penalty (plus a term in the inputs themselves: a linear kernel's gradient is constant)
        penalty = sum((g * g).sum() + (t * t).sum() for g, t in zip(first, inputs))
        return torch.autograd.grad(penalty, inputs, allow_unused=True, materialize_grads=True)

    tol = 1e-2 if name in TF32 and DEVICE == "cuda" else 1e-4
    for g, w in zip(second(kernel), second(ref)):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


def test_flash_attention_refuses_double_backward():
    q, k, v = (randn(1, 2, 6, 16, seed=i).requires_grad_() for i in range(3))
    out = flash_attention(q, k, v)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)
    dq, = torch.autograd.grad(flash_attention(q, k, v).sum(), q)  # first order still works
    assert dq.grad_fn is None and dq.abs().sum() > 0


def test_the_backward_functions_differentiate_like_torch():
    """softmax_backward and relu_dropout_backward on tensors that require grad: torch's double backward."""
    y = torch.softmax(randn(6, 5), dim=-1).requires_grad_()
    dy = randn(6, 5, seed=1).requires_grad_()
    got = torch.autograd.grad(softmax_backward(y, dy).pow(2).sum(), (y, dy))
    want = torch.autograd.grad(torch._softmax_backward_data(dy, y, -1, y.dtype).pow(2).sum(), (y, dy))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    x = randn(6, 5, seed=2)
    keep = relu_dropout(torch.ones_like(x), P, SEED) != 0
    (ddy,) = torch.autograd.grad(relu_dropout_backward(dy, x, P, SEED).pow(2).sum(), dy)
    torch.testing.assert_close(ddy, 2 * dy.detach() * (keep & (x > 0)) / (1 - P) ** 2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FORWARD_ONLY)
def test_forward_only_kernels_refuse_inputs_that_require_grad(name):
    call = FORWARD_ONLY[name]
    x = randn(4).requires_grad_()
    with pytest.raises(RuntimeError, match="not differentiable"):
        call(x)
    with torch.no_grad():
        call(x)  # no gradient wanted: it runs
    call(x.detach())
