"""Bad calls to the public kernels are answered with ValueError or TypeError naming the argument: never a
wrong result, a crash inside Triton, or a hang."""
import math

import pytest
import torch
from conftest import DEVICE, ON_GPU, randn

from kernels import attention, flash_attention, relu_dropout, relu_dropout_writeup, softmax, vector_add


def qkv(q=(1, 2, 8, 32), k=(1, 2, 8, 32), v=None, dtype=torch.float32):
    return randn(*q, dtype=dtype), randn(*k, dtype=dtype), randn(*(v or k), dtype=dtype)


# (call, exception, a word the message must contain: the argument's name)
BAD = [
    # vector_add
    (lambda: vector_add(randn(4), randn(5)), ValueError, "shape"),
    (lambda: vector_add(randn(4), randn(4, dtype=torch.float16)), TypeError, "dtype"),
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
    (lambda: relu_dropout(randn(8), "0.5", 0), ValueError, "p"),
    (lambda: relu_dropout(randn(8), 0.5, -1), ValueError, "seed"),
    (lambda: relu_dropout(randn(8), 0.5, 2**31), ValueError, "seed"),
    (lambda: relu_dropout(randn(8), 0.5, 1.5), ValueError, "seed"),
    (lambda: relu_dropout(torch.arange(8, device=DEVICE), 0.5, 0), TypeError, "x"),
    (lambda: relu_dropout(randn(8), 0.5, 0, block_size=2), ValueError, "block_size"),
    (lambda: relu_dropout_writeup(randn(8), 0.5, True), ValueError, "seed"),
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
    (lambda: attention(randn(5, 32), randn(0, 32), randn(0, 32)), ValueError, "key"),
    (lambda: attention(randn(5, 32), randn(15, 32), randn(14, 32)), ValueError, "shape"),
    # flash_attention
    (lambda: flash_attention(*qkv(k=(1, 2, 8, 16))), ValueError, "head_dim"),
    (lambda: flash_attention(*qkv(q=(1, 1, 8, 8), k=(1, 1, 8, 8))), ValueError, "head_dim"),
    (lambda: flash_attention(*qkv(q=(1, 1, 8, 300), k=(1, 1, 8, 300))), ValueError, "head_dim"),
    (lambda: flash_attention(*qkv(q=(1, 1, 0, 32), k=(1, 1, 8, 32))), ValueError, "seq"),
    (lambda: flash_attention(*qkv(), causal="False"), TypeError, "causal"),
    (lambda: flash_attention(*qkv(), sm_scale=math.inf), ValueError, "sm_scale"),
    (lambda: flash_attention(*qkv(), sm_scale=-1.0), ValueError, "sm_scale"),
    (lambda: flash_attention(*[t.to(torch.int32) for t in qkv()]), TypeError, "dtype"),
]


@pytest.mark.parametrize("call, error, word", BAD, ids=[f"case{i}" for i in range(len(BAD))])
def test_bad_call_is_refused_naming_the_argument(call, error, word):
    with pytest.raises(error) as err:
        call()
    assert word in str(err.value), str(err.value)


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
