"""The public kernel functions inside torch.compile, here in Triton's interpreter (on a GPU the same
tests run compiled). Those with a custom op (vector_add, relu_dropout, softmax, their backwards,
flash_attention) compile with fullgraph=True and their gradients flow; the others run eagerly at a graph
break, as their docstrings say, so fullgraph=True refuses them."""
import pytest
import torch
from conftest import randn

import kernels

P, SEED = 0.25, 11
# name -> (a call of it on fresh inputs, its arguments' factory)
IN_GRAPH = {
    "vector_add": (kernels.vector_add, lambda: (randn(4, 40), randn(4, 40, seed=1))),
    "relu_dropout": (lambda x: kernels.relu_dropout(x, P, SEED), lambda: (randn(4, 40),)),
    "relu_dropout_backward": (lambda dy, x: kernels.relu_dropout_backward(dy, x, P, SEED),
                              lambda: (randn(4, 40), randn(4, 40, seed=1))),
    "softmax": (kernels.softmax, lambda: (randn(4, 40),)),
    "softmax_backward": (kernels.softmax_backward, lambda: (torch.softmax(randn(4, 40), -1), randn(4, 40, seed=1))),
    "flash_attention": (kernels.flash_attention, lambda: tuple(randn(1, 2, 8, 16, seed=i) for i in range(3))),
}
EAGER = {  # run at a graph break
    "vector_add_writeup": (kernels.vector_add_writeup, lambda: (randn(4, 40), randn(4, 40, seed=1))),
    "vector_add_unmasked": (lambda x, y: kernels.vector_add_unmasked(x, y, out := torch.empty_like(x),
                                                                     block_size=16) or out,
                            lambda: (randn(64), randn(64, seed=1))),
    "relu_dropout_writeup": (lambda x: kernels.relu_dropout_writeup(x, P, SEED), lambda: (randn(4, 40),)),
    "softmax_writeup": (kernels.softmax_writeup, lambda: (randn(4, 40),)),
    "softmax with a block_size": (lambda x: kernels.softmax(x, block_size=64), lambda: (randn(4, 40),)),
    "softmax with out=": (lambda x: kernels.softmax(x, out=torch.empty_like(x)), lambda: (randn(4, 40),)),
    "attention": (kernels.attention, lambda: (randn(8, 16), randn(8, 16, seed=1), randn(8, 16, seed=2))),
    "attention_writeup": (kernels.attention_writeup,
                          lambda: (randn(8, 16), randn(8, 16, seed=1), randn(8, 16, seed=2))),
}
TORCH_ONLY = {"attention_ref", "flash_attention_ref", "relu_dropout_ref", "softmax_ref", "softmax_naive",
              "softmax_unfused", "vector_add_ref", "launch_config", "tiles_in_use",
              "shared_memory_required"}  # torch code, or no tensor result (shared_memory_required: GPU only)


def test_every_public_function_is_covered():
    named = {n.split()[0] for n in (*IN_GRAPH, *EAGER)} | TORCH_ONLY
    assert set(kernels.__all__) <= named, set(kernels.__all__) - named


def compiled(call, fullgraph):
    torch._dynamo.reset()
    return torch.compile(lambda *args: call(*args) * 2, fullgraph=fullgraph, backend="aot_eager")


@pytest.mark.parametrize("fullgraph", [False, True], ids=["default", "fullgraph"])
@pytest.mark.parametrize("name", IN_GRAPH)
def test_functions_with_a_custom_op_compile_and_their_gradients_flow(name, fullgraph):
    call, args = IN_GRAPH[name]
    inputs = [t.requires_grad_() for t in args()]
    out = compiled(call, fullgraph)(*inputs)
    want = call(*inputs) * 2
    torch.testing.assert_close(out, want)
    do = randn(*out.shape, seed=5)
    grads = [torch.autograd.grad(o, inputs, do, allow_unused=True, materialize_grads=True) for o in (out, want)]
    for g, w in zip(*grads):  # (relu_dropout_backward's gradient in x is zero)
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", EAGER)
def test_the_others_run_eagerly_at_a_graph_break_and_fullgraph_refuses_them(name):
    call, args = EAGER[name]
    inputs = args()
    torch.testing.assert_close(compiled(call, fullgraph=False)(*inputs), call(*inputs) * 2)
    with pytest.raises(Exception, match="(?i)skip|disable"):
        compiled(call, fullgraph=True)(*inputs)


@pytest.mark.parametrize("name", IN_GRAPH)
def test_functions_with_a_custom_op_compile_with_symbolic_shapes(name):
    """dynamic=True, fullgraph: the checks before the custom op trace with symbolic sizes (no sorting of
    them, for one), and one graph serves a second shape (the rows, or the sequence, one shorter)."""
    call, args = IN_GRAPH[name]
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: call(*a) * 2, fullgraph=True, dynamic=True, backend="aot_eager")
    for shorter in (False, True):
        inputs = [(t.narrow(-2, 0, t.shape[-2] - 1) if shorter else t).detach().requires_grad_() for t in args()]
        out = fn(*inputs)
        want = call(*inputs) * 2
        torch.testing.assert_close(out, want)
        grads = [torch.autograd.grad(o, inputs, torch.ones_like(o), allow_unused=True, materialize_grads=True)
                 for o in (out, want)]
        for g, w in zip(*grads):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
