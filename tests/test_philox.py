"""kernels._philox reproduces Triton's random numbers bit for bit, so dropout is checked exactly from its seed.

Tiny kernels store what tl.rand / tl.rand4x / tl.randint4x / tl.philox draw; the reference must equal them
(torch.equal), for int32 and int64 counters. Then both dropout kernels must equal a reference built from
the reference's uniforms.
"""
import numpy as np
import pytest
import torch

from conftest import DEVICE, ON_GPU, randn
from kernels import relu_dropout, relu_dropout_backward, relu_dropout_writeup
from kernels._philox import philox4x32, randint4x, split_counter, uniform, uniform4x, uniform4x_elements
from kernels._triton import tl, triton

# Seeds of every width a kernel argument takes: 1 (specialised to a constant), int32, int64, uint64.
SEEDS = [0, 1, 12345, 2**31 - 1, 2**32 + 12345, 2**64 - 1]
OFFSETS32 = ([*range(48)] + [*range(2**31 - 5, 2**31)] + [-2**31, -2**31 + 1, -2, -1]
             + [7, 65535, 65536, 2**24 + 1, 1000003, 123456789, 2**30])
OFFSETS64 = [0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 3, 2**40 + 7,
             2**62 + 3, 2**63 - 1, -1, -2**31, -2**32, -2**63]
# Random123's known answers for Philox4x32-10 (kat_vectors): counter, key (k0, k1), output.
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@triton.jit
def _draws_kernel(off_ptr, f_ptr, i_ptr, seed, N: tl.constexpr):
    """f rows: rand, then rand4x's four; i rows: randint4x's four words (as int32 bits)."""
    i = tl.arange(0, N)
    off = tl.load(off_ptr + i)
    tl.store(f_ptr + i, tl.rand(seed, off))
    r0, r1, r2, r3 = tl.rand4x(seed, off)
    tl.store(f_ptr + N + i, r0)
    tl.store(f_ptr + 2 * N + i, r1)
    tl.store(f_ptr + 3 * N + i, r2)
    tl.store(f_ptr + 4 * N + i, r3)
    w0, w1, w2, w3 = tl.randint4x(seed, off)
    tl.store(i_ptr + i, w0.to(tl.int32, bitcast=True))
    tl.store(i_ptr + N + i, w1.to(tl.int32, bitcast=True))
    tl.store(i_ptr + 2 * N + i, w2.to(tl.int32, bitcast=True))
    tl.store(i_ptr + 3 * N + i, w3.to(tl.int32, bitcast=True))


@triton.jit
def _philox_kernel(c_ptr, out_ptr, seed, N: tl.constexpr):
    """tl.philox on four uint32 counter words (given as int32 bits, row k = word k)."""
    i = tl.arange(0, N)
    c0 = tl.load(c_ptr + i).to(tl.uint32, bitcast=True)
    c1 = tl.load(c_ptr + N + i).to(tl.uint32, bitcast=True)
    c2 = tl.load(c_ptr + 2 * N + i).to(tl.uint32, bitcast=True)
    c3 = tl.load(c_ptr + 3 * N + i).to(tl.uint32, bitcast=True)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, c2, c3)
    tl.store(out_ptr + i, w0.to(tl.int32, bitcast=True))
    tl.store(out_ptr + N + i, w1.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 2 * N + i, w2.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 3 * N + i, w3.to(tl.int32, bitcast=True))


def bits(words) -> torch.Tensor:
    """uint32 words as the int32 tensor a kernel stores them in."""
    return torch.from_numpy(np.stack(words).astype(np.uint32).view(np.int32))


def draws(seed, offsets):
    n = offsets.numel()
    f = torch.empty(5, n, dtype=torch.float32, device=DEVICE)
    i = torch.empty(4, n, dtype=torch.int32, device=DEVICE)
    _draws_kernel[(1,)](offsets, f, i, seed, N=n)
    return f.cpu(), i.cpu()


def philox_words(seed, counters):
    c = bits(counters).to(DEVICE)
    out = torch.empty_like(c)
    _philox_kernel[(1,)](c, out, seed, N=c.shape[1])
    return out.cpu()


def test_reference_is_philox4x32_10():
    for ctr, (k0, k1), want in KAT:
        assert [int(w) for w in philox4x32(k0 | k1 << 32, *ctr)] == list(want)


def test_tl_philox_gives_the_known_answers():
    for ctr, (k0, k1), want in KAT:
        got = philox_words(k0 | k1 << 32, [np.full(4, c) for c in ctr])
        assert torch.equal(got, bits([np.full(4, w) for w in want]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_rand_rand4x_randint4x_bit_exact(seed, dtype):
    offsets = torch.tensor(OFFSETS32 if dtype == torch.int32 else OFFSETS64, dtype=dtype, device=DEVICE)
    f, i = draws(seed, offsets)
    assert torch.equal(f[0], uniform(seed, offsets).cpu())
    for got, want in zip(f[1:], uniform4x(seed, offsets)):
        assert torch.equal(got, want.cpu())
    assert torch.equal(i, bits(randint4x(seed, offsets)))
    assert float(f.min()) >= 0.0 and float(f.max()) < 1.0


@pytest.mark.parametrize("seed", [0, 2**31 - 1, 2**64 - 1])
def test_int64_offsets_are_two_counter_words(seed):
    """tl.rand4x on an int64 offset == tl.philox(seed, low word, high word, 0, 0): no wrap at 2**32."""
    offsets = torch.tensor(OFFSETS64, dtype=torch.int64, device=DEVICE)
    c0, c1 = split_counter(offsets)
    zero = np.zeros_like(c0)
    _, i = draws(seed, offsets)
    assert torch.equal(philox_words(seed, [c0, c1, zero, zero]), i)
    assert len(set(uniform(seed, torch.tensor([5, 2**32 + 5])).tolist())) == 2
    small = torch.arange(100)
    assert torch.equal(uniform(seed, small), uniform(seed, small.int()))  # int64 below 2**31 == int32


def dropout_reference(x: torch.Tensor, p: float, u: torch.Tensor, writeup: bool = False) -> torch.Tensor:
    """The kernels' fp32 arithmetic: the writeup's where(u > p, relu(x) / (1 - p), 0) with p and 1 - p in fp32;
    the improved kernel's where(u >= p, relu(x) / (1 - p), 0) with p in fp32 and 1 - p from float64."""
    p32 = np.float32(p)
    u = u.to(x.device)
    keep = u > torch.tensor(p32, device=x.device) if writeup else u >= torch.tensor(p32, device=x.device)
    scaled = torch.relu(x) / torch.tensor(np.float32(1) - p32 if writeup else np.float32(1 - p), device=x.device)
    return torch.where(keep, scaled, torch.zeros_like(scaled))


def assert_matches(out: torch.Tensor, ref: torch.Tensor):
    """Bit-exact in the interpreter. Compiled, fp32 x / y is div.full.f32 (at most 2 ulp from IEEE): the
    mask must still agree exactly, the survivors within 2 ulp (all values are >= 0, so ulps = int32 bits)."""
    if not ON_GPU:
        assert torch.equal(out, ref)
        return
    assert torch.equal(out != 0, ref != 0)
    assert int((out.view(torch.int32) - ref.view(torch.int32)).abs().max()) <= 2


SIZES = [(4, 37), (64, 1001), (1024, 3001)]  # (block_size, n): few programs, as the interpreter is slow


@pytest.mark.parametrize("block_size, n", SIZES[1:])
@pytest.mark.parametrize("p, seed", [(0.1, 0), (0.5, 12345), (0.7, 2**31 - 1)])
def test_writeup_kernel_equals_reference(p, seed, block_size, n):
    x = randn(n, seed=seed % 1000)
    u = uniform(seed, torch.arange(n, dtype=torch.int32))  # element i: counter i, word 0
    assert_matches(relu_dropout_writeup(x, p, seed, block_size=block_size), dropout_reference(x, p, u, writeup=True))


@pytest.mark.parametrize("block_size, n", SIZES)
@pytest.mark.parametrize("p, seed", [(0.1, 0), (0.5, 12345), (0.7, 2**31 - 1)])
def test_improved_kernel_equals_reference(p, seed, block_size, n):
    x = randn(n, seed=seed % 1000)
    u = uniform4x_elements(seed, n)  # element 4c + k: counter c, word k
    assert_matches(relu_dropout(x, p, seed, block_size=block_size), dropout_reference(x, p, u))


def test_improved_kernel_takes_word_k_for_element_4c_plus_k():
    x, p, seed = torch.ones(64, device=DEVICE), 0.5, 3
    u = uniform4x_elements(seed, 64)
    assert torch.equal(relu_dropout(x, p, seed, block_size=64), dropout_reference(x, p, u))


def test_improved_backward_equals_reference():
    n, p, seed = 1000, 0.3, 77
    x, dy = randn(n, seed=1), randn(n, seed=2)
    u = uniform4x_elements(seed, n).to(DEVICE)
    keep = (u >= torch.tensor(np.float32(p), device=DEVICE)) & (x > 0)
    ref = torch.where(keep, dy / torch.tensor(np.float32(1 - p), device=DEVICE), 0.0)
    out = relu_dropout_backward(dy, x, p, seed, block_size=256)
    if ON_GPU:  # dy may be negative: compare the mask, then the values to 2 ulp
        assert torch.equal(out != 0, ref != 0)
        torch.testing.assert_close(out, ref, rtol=2.5e-7, atol=0)
    else:
        assert torch.equal(out, ref)
