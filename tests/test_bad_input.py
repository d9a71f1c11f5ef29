"""Bad calls to the public kernels are answered with ValueError or TypeError naming the argument: never a
wrong result, a crash inside Triton, or a hang."""
import math
import re

import pytest
import torch
from conftest import DEVICE, ON_GPU, randn

import kernels
from kernels import (attention, flash_attention, relu_dropout, relu_dropout_writeup, softmax, vector_add,
                     vector_add_unmasked)


def qkv(q=(1, 2, 8, 32), k=(1, 2, 8, 32), v=None, dtype=torch.float32):
    return randn(*q, dtype=dtype), randn(*k, dtype=dtype), randn(*(v or k), dtype=dtype)


# (call, exception, a word the message must contain: the argument's name)
BAD = [
    # vector_add
    (lambda: vector_add(randn(4), randn(5)), ValueError, "x and y have different shapes"),
    (lambda: vector_add(randn(4), randn(4, dtype=torch.float16)), TypeError, "x and y have different dtypes"),
    (lambda: vector_add(randn(4), [1.0, 2.0, 3.0, 4.0]), TypeError, "y"),
    (lambda: vector_add(randn(4).double(), randn(4).double()), TypeError, "x"),
    (lambda: vector_add(randn(4), randn(4).to("meta")), ValueError, "y"),
    (lambda: vector_add(randn(4), randn(4), block_size=1000), ValueError, "block_size"),
    (lambda: vector_add(randn(4), randn(4), block_size=0), ValueError, "block_size"),
    (lambda: vector_add(randn(4), randn(4), block_size=True), TypeError, "block_size"),
    # relu_dropout, the improved kernel and the writeup's
    (lambda: relu_dropout(randn(8), 1.0, 0), ValueError, "p"),
    (lambda: relu_dropout(randn(8), -0.1, 0), ValueError, "p"),
    (lambda: relu_dropout(randn(8), math.nan, 0), ValueError, "p"),
    (lambda: relu_dropout(randn(8), "0.5", 0), TypeError, "p must be a real number"),
    (lambda: relu_dropout(randn(8), 0.5, -1), ValueError, "seed"),
    (lambda: relu_dropout(randn(8), 0.5, 2**63), ValueError, "seed"),
    (lambda: relu_dropout(randn(8), 0.5, 1.5), TypeError, "seed must be an integer"),
    (lambda: relu_dropout(torch.arange(8, device=DEVICE), 0.5, 0), TypeError, "x"),
    (lambda: relu_dropout(randn(8), 0.5, 0, block_size=2), ValueError, "block_size"),
    (lambda: relu_dropout_writeup(randn(8), 0.5, True), TypeError, "seed"),
    # softmax
    (lambda: softmax(randn(10)), ValueError, "x"),
    (lambda: softmax(randn(2, 3, 4)), ValueError, "x"),
    (lambda: softmax(randn(2, 3), block_size=1000), ValueError, "block_size"),
    (lambda: softmax(randn(2, 3), block_size=True), TypeError, "block_size"),
    (lambda: softmax(randn(2, 3), block_size=0), ValueError, "block_size"),
    (lambda: softmax(randn(2, 3).double()), TypeError, "x"),
    (lambda: softmax(torch.tensor(1.0, device=DEVICE)), ValueError, "x"),  # 0-d
    (lambda: softmax(randn(2, 3), out=randn(2, 4)), ValueError, "out"),
    # the writeup's attention
    (lambda: attention(randn(5, 32), randn(15, 16), randn(15, 16)), ValueError, "head dimension"),
    (lambda: attention(randn(5, 32), randn(0, 32), randn(0, 32)), ValueError, "k (and v) must have at least one key"),
    (lambda: attention(randn(5, 32), randn(15, 32), randn(14, 32)), ValueError, "k and v have different shapes"),
    (lambda: kernels.launch_config(0, 32), ValueError, "n_k"),
    (lambda: kernels.launch_config(8, -3), ValueError, "head_dim"),
    (lambda: kernels.launch_config(8, 32, block_q=12), ValueError, "block_q"),
    # flash_attention
    (lambda: flash_attention(*qkv(k=(1, 2, 8, 16))), ValueError, "head_dim"),
    (lambda: flash_attention(*qkv(q=(1, 1, 8, 0), k=(1, 1, 8, 0))), ValueError, "head_dim"),
    (lambda: flash_attention(*qkv(q=(1, 1, 8, 300), k=(1, 1, 8, 300))), ValueError, "head_dim"),
    (lambda: flash_attention(*qkv(), causal="False"), TypeError, "causal"),
    (lambda: flash_attention(*qkv(), sm_scale=math.inf), ValueError, "sm_scale"),
    (lambda: flash_attention(*qkv(), sm_scale=-1.0), ValueError, "sm_scale"),
    (lambda: flash_attention(*qkv(), sm_scale=1e-46), ValueError, "sm_scale"),  # 0 in fp32: masked scores NaN
    (lambda: flash_attention(*qkv(), sm_scale=1e300), ValueError, "sm_scale"),  # inf in fp32
    (lambda: flash_attention(*qkv(), sm_scale=10**400), ValueError, "sm_scale"),  # past any float
    (lambda: flash_attention(*[t.to(torch.int32) for t in qkv()]), TypeError, "dtype"),
    # sparse inputs: every kernel wants dense (strided) tensors
    (lambda: vector_add(randn(4).to_sparse(), randn(4)), TypeError, "x must be a dense tensor"),
    (lambda: relu_dropout(randn(8).to_sparse(), 0.5, 0), TypeError, "x must be a dense tensor"),
    (lambda: softmax(randn(2, 3).to_sparse()), TypeError, "x must be a dense tensor"),
    (lambda: softmax(randn(2, 3), out=randn(2, 3).to_sparse()), TypeError, "out must be a dense tensor"),
    (lambda: attention(randn(5, 32), randn(15, 32).to_sparse(), randn(15, 32)), TypeError, "k must be a dense"),
    (lambda: flash_attention(qkv()[0].to_sparse(), *qkv()[1:]), TypeError, "q must be a dense tensor"),
    # nested: refused by the checks, not by the plan lookup before them
    (lambda: flash_attention(torch.nested.nested_tensor([t[0] for t in qkv()[:1]]), *qkv()[1:]), TypeError,
     "q must be a dense tensor"),
    (lambda: flash_attention(qkv()[0], torch.nested.nested_tensor([qkv()[1][0]]), qkv()[2]), TypeError,
     "k must be a dense tensor"),
    # a head dimension of 0 (the writeup's launcher would divide by sqrt(0))
    (lambda: attention(randn(5, 0), randn(3, 0), randn(3, 0)), ValueError, "head dimension"),
    (lambda: kernels.attention_writeup(randn(5, 0), randn(3, 0), randn(3, 0)), ValueError, "head dimension"),
]


def negated(*shape):
    """A real tensor with torch's negative bit set (a lazily negated view): memory holds minus its values."""
    return randn(*shape, 2).contiguous().view(torch.complex64)[..., 0].conj().imag


NEGATED = {
    "vector_add": lambda: vector_add(negated(4), randn(4)),
    "relu_dropout": lambda: relu_dropout(negated(8), 0.5, 0),
    "softmax": lambda: softmax(negated(2, 3)),
    "softmax out": lambda: softmax(randn(2, 3), out=negated(2, 3)),
    "softmax_backward": lambda: kernels.softmax_backward(randn(2, 3), negated(2, 3)),
    "attention": lambda: attention(randn(5, 32), negated(15, 32), randn(15, 32)),
    "flash_attention": lambda: flash_attention(negated(1, 2, 8, 32), *qkv()[1:]),
}


@pytest.mark.parametrize("name", NEGATED)
def test_a_lazily_negated_view_is_refused_not_read_as_its_memory(name):
    """The kernels read memory as it is: a tensor whose negative bit is set (e.g. z.conj().imag) would
    be computed on with the wrong sign. flash_attention is called plainly first, so that a plan for the
    same shapes and strides exists: its lookup must not skip the check."""
    assert negated(3).is_neg()
    flash_attention(randn(1, 2, 8, 32), *qkv()[1:])
    with pytest.raises(TypeError, match="negative bit"):
        NEGATED[name]()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("call, error, word", BAD, ids=[f"case{i}" for i in range(len(BAD))])
def test_bad_call_is_refused_naming_the_argument(call, error, word):
    with pytest.raises(error) as err:
        call()
    # the name as a word of its own: "x" must not pass for the x in "expected"
    assert re.search(rf"(?<!\w){re.escape(word)}(?!\w)", str(err.value)), str(err.value)


def test_at_least_twenty_bad_calls_are_covered():
    assert len(BAD) >= 20


@pytest.mark.skipif(ON_GPU, reason="on a GPU bf16 works")
def test_bf16_in_the_interpreter_is_refused_not_garbage():
    x = randn(8).to(torch.bfloat16)
    for call in (lambda: vector_add(x, x), lambda: relu_dropout(x, 0.5, 0), lambda: softmax(x.view(2, 4))):
        with pytest.raises(TypeError, match="bf16"):
            call()


def test_relu_keeps_nan_like_torch():
    x = torch.tensor([math.nan, -1.0, 2.0, math.nan], device=DEVICE)
    out = relu_dropout(x, 0.0, 0)  # p = 0 keeps everything: exactly torch.relu
    torch.testing.assert_close(out, torch.relu(x), equal_nan=True)


# ---------------------------------------------------------------------------------------------------------
# out=: validated as torch validates it. Every public function that takes an `out` is listed here.
def softmax_split(monkeypatch):
    """softmax on its split path (rows cut into chunks) at a small width."""
    from kernels import _softmax

    monkeypatch.setattr(_softmax, "ROW_LIMIT", 4)
    monkeypatch.setattr(_softmax, "WIDE", tuple(("forward", size, None, (0, 2, 4)) for size in (2, 4)))
    return softmax


WITH_OUT = {
    "softmax": lambda mp: softmax,
    "softmax split path": softmax_split,
    "softmax_writeup": lambda mp: kernels.softmax_writeup,
    "softmax with a block_size": lambda mp: lambda x, out: softmax(x, block_size=8, out=out),
}


def test_every_function_taking_out_is_covered():
    import inspect

    taking = {n for n in kernels.__all__ if callable(f := getattr(kernels, n))
              and "out" in inspect.signature(f).parameters}
    assert taking == {"softmax", "softmax_writeup", "vector_add_unmasked"}  # vector_add_unmasked: below


def overlapping_outs(x):
    """(what, out) pairs torch refuses for x of shape (5, 5): outs whose elements share memory with each
    other, or with x's in another layout."""
    buf = torch.empty(40, device=DEVICE)
    yield "expanded row", torch.empty(1, 5, device=DEVICE).expand(5, 5)
    yield "strides (1, 1)", buf.as_strided((5, 5), (1, 1))
    yield "strides (2, 1)", buf.as_strided((5, 5), (2, 1))
    yield "x transposed", x.t()
    yield "x shifted by a row", x.view(-1)[5:].as_strided((5, 5), (5, 1))


@pytest.mark.parametrize("name", WITH_OUT)
def test_out_with_overlap_is_refused(name, monkeypatch):
    fn = WITH_OUT[name](monkeypatch)
    storage = randn(40)
    x = storage[:25].view(5, 5)
    before = storage.clone()
    for what, out in overlapping_outs(x):
        with pytest.raises(ValueError, match="out (has internal overlap|overlaps x)"):
            fn(x, out=out)
        assert torch.equal(storage, before), f"{what}: memory written before the refusal"


@pytest.mark.parametrize("name", WITH_OUT)
def test_out_whose_dimensions_interleave_without_overlap_is_taken(name, monkeypatch):
    """Strides (2, 5) for (5, 5): the columns step past a row's span but no element repeats (offsets 2i + 5j
    are distinct for i, j < 5). torch takes it as out=; so do the kernels, and write where it points."""
    fn = WITH_OUT[name](monkeypatch)
    x = randn(5, 5)
    out = torch.full((40,), 7.0, device=DEVICE).as_strided((5, 5), (2, 5))
    assert fn(x, out=out) is out
    torch.testing.assert_close(out, torch.softmax(x, dim=-1))


def test_internal_overlap_is_exact_on_small_layouts():
    """Against the offsets themselves, for every layout of up to 3 dimensions of sizes 1..3 and strides 0..4;
    overlaps_itself (the quick test) may say True where there is none, never False where there is."""
    import itertools

    from kernels import _checks

    base = torch.empty(64)
    for ndim in (1, 2, 3):
        for shape in itertools.product(range(1, 4), repeat=ndim):
            for strides in itertools.product(range(5), repeat=ndim):
                t = base.as_strided(shape, strides)
                offsets = sum(torch.arange(n).view([-1 if d == i else 1 for d in range(ndim)]) * s
                              for i, (s, n) in enumerate(zip(strides, shape)))
                shared = offsets.flatten().unique().numel() < t.numel()
                assert _checks.internal_overlap(t) == shared, (shape, strides)
                assert _checks.overlaps_itself(t) or not shared, (shape, strides)


@pytest.mark.parametrize("name", WITH_OUT)
def test_out_in_place_or_beside_x_in_one_buffer_is_computed_right(name, monkeypatch):
    fn = WITH_OUT[name](monkeypatch)
    storage = randn(50)
    x, beside = storage[:25].view(5, 5), storage[25:].view(5, 5)
    want = torch.softmax(x, dim=-1)
    assert fn(x, out=beside) is beside
    torch.testing.assert_close(beside, want)
    assert fn(x, out=x) is x  # in place: each row is read before it is written
    torch.testing.assert_close(x, want)


@pytest.mark.parametrize("name", WITH_OUT)
def test_out_that_autograd_tracks_is_refused_or_marked_written(name, monkeypatch):
    """As torch's out=: an out that requires grad is refused in grad mode (before anything is written), and
    an out that a graph saved (a detached alias, or x itself in place) is marked as written, so that the
    backward raises instead of using the overwritten values."""
    fn = WITH_OUT[name](monkeypatch)
    x = randn(5, 5)
    w = randn(5, 5).requires_grad_()
    y = w.exp()  # exp saves its output for the backward
    before = y.detach().clone()
    with pytest.raises(ValueError, match="out requires grad"):
        fn(x, out=y)
    assert torch.equal(y.detach(), before)
    fn(x, out=y.detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    z = w.exp()
    with torch.no_grad():
        fn(z, out=z)  # in place, on a tensor the graph saved
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    with torch.no_grad():
        leaf = torch.zeros(5, 5, device=DEVICE, requires_grad=True)
        assert fn(x, out=leaf) is leaf  # outside grad mode a leaf that requires grad may be written, as torch allows
    torch.testing.assert_close(leaf.detach(), torch.softmax(x, dim=-1))


def test_vector_add_unmasked_refuses_an_out_overlapping_its_inputs():
    buf = randn(64)
    x, y = buf[:8], randn(16)[:8]
    with pytest.raises(ValueError, match="out overlaps x"):
        vector_add_unmasked(x, y, buf[4:12], block_size=8)
    want = x + y
    vector_add_unmasked(x, y, x, block_size=8)  # in place
    torch.testing.assert_close(x, want)


def test_vector_add_unmasked_refuses_an_out_whose_last_block_runs_onto_an_input():
    """out's elements miss x, but the 3 its last block writes past them would land on x (a block of 8 for 5)."""
    buf = randn(64)
    out, x, y = buf[:5], buf[5:10], randn(16)[:5]
    before = x.clone()
    with pytest.raises(ValueError, match="past its end, onto x"):
        vector_add_unmasked(x, y, out, block_size=8)
    torch.testing.assert_close(x, before)
    vector_add_unmasked(x, y, buf[16:21], block_size=8)  # room of its own after it
    torch.testing.assert_close(buf[16:21], x + y)


# ---------------------------------------------------------------------------------------------------------
# Scalars from NumPy and torch: a valid value of a NumPy number type is accepted (as its Python value);
# a tensor, a bool or a string is refused for its type (TypeError), never as "out of range".
np = pytest.importorskip("numpy")
SCALARS = {
    "p": lambda value: relu_dropout(randn(64), value, 3),
    "seed": lambda value: relu_dropout(randn(64), 0.5, value),
    "sm_scale": lambda value: flash_attention(*qkv(), sm_scale=value),
    "block_size": lambda value: vector_add(randn(64), randn(64, seed=1), block_size=value)
    + relu_dropout(randn(64), 0.5, 3, block_size=value) + softmax(randn(2, 32), block_size=value).flatten(),
}
VALID = {"p": [np.float32(0.5), np.float64(0.5), np.float16(0.25)],
         "seed": [np.int32(3), np.int64(2**31 - 1), np.uint8(3)],
         "sm_scale": [np.float32(0.25), np.float64(0.25), np.int64(1)],
         "block_size": [np.int64(64), np.int32(32), np.uint16(128)]}
WRONG_TYPE = [torch.tensor(0.5), torch.tensor(3), torch.tensor([0.5]), np.bool_(True), True, "0.5", None, [0.5]]


@pytest.mark.parametrize("name", SCALARS)
def test_numpy_scalars_with_a_valid_value_give_the_python_value_result(name):
    for value in VALID[name]:
        torch.testing.assert_close(SCALARS[name](value), SCALARS[name](value.item()),
                                   msg=f"{name}={value!r} ({type(value).__name__})")


@pytest.mark.parametrize("name", SCALARS)
@pytest.mark.parametrize("value", WRONG_TYPE, ids=lambda v: f"{type(v).__name__}-{v!r}")
def test_scalars_of_the_wrong_type_are_refused_for_their_type(name, value):
    if name == "sm_scale" and value is None:  # None is sm_scale's default: taken as no value given
        torch.testing.assert_close(SCALARS[name](None), flash_attention(*qkv()))
        return
    with pytest.raises(TypeError, match=f"{name} must be an? (real number|integer).*got {type(value).__name__}"):
        SCALARS[name](value)
    if name == "p" or name == "seed":
        with pytest.raises(TypeError, match=name):  # the backward checks them the same way
            kernels.relu_dropout_backward(randn(64), randn(64), *((value, 3) if name == "p" else (0.5, value)))


@pytest.mark.parametrize("name", WITH_OUT)
def test_an_out_of_one_column_is_taken_whatever_its_column_stride(name, monkeypatch):
    """torch counts a (5, 1) tensor of strides (1, 5) as contiguous (a size-1 dimension's stride is never
    used), so an out= of that layout is a valid one."""
    fn = WITH_OUT[name](monkeypatch)
    x = randn(5, 1)
    out = torch.empty(1, 5, device=DEVICE).t()
    assert out.stride() == (1, 5) and out.is_contiguous()
    fn(x, out=out)
    torch.testing.assert_close(out, torch.softmax(x, dim=1))


SWITCHES = ("KERNELS_AUTOTUNE", "KERNELS_DIRECT_LAUNCH", "KERNELS_FLASH_WS")


@pytest.mark.parametrize("name", SWITCHES)
def test_an_on_off_switch_takes_0_or_1_and_refuses_anything_else_naming_it(name, monkeypatch):
    from kernels import _flash_attention, _flash_tiles, _launch
    read = {"KERNELS_AUTOTUNE": _flash_tiles.autotune, "KERNELS_DIRECT_LAUNCH": _launch.enabled,
            "KERNELS_FLASH_WS": _flash_attention.warp_specialized}[name]
    monkeypatch.setenv(name, "0")
    assert read() is False
    monkeypatch.setenv(name, "1")
    read()  # on where the machine allows it (the direct launcher and the '/ws' kernels need a GPU)
    for value in ("off", "false", "no", "", "2"):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            read()
