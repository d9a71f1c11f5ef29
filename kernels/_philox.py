"""An exact, independent reference of Triton's random numbers (``tl.randint4x``, ``tl.rand``, ``tl.rand4x``).

Dropout has no single correct output, but given the seed it has exactly one: the kernels draw their mask
with Triton's Philox, a pure function of (seed, counter). Recomputing those numbers here, in numpy with
no Triton import, lets a test check a dropout kernel element by element (equality, not statistics).

What Triton does (triton/language/random.py; the same algorithm in triton 3.6 and 3.9):

* ``philox(seed, c0, c1, c2, c3)`` with 32-bit counters is Philox4x32-10 (Salmon et al. 2011, Random123):
  key (k0, k1) = (low 32 bits, high 32 bits) of ``seed`` taken as uint64 (a negative seed is
  sign-extended first), 10 rounds, round multipliers 0xD2511F53 / 0xCD9E8D57, key increments
  0x9E3779B9 / 0xBB67AE85. With 64-bit counters it is Philox4x64 instead (other constants, key
  (seed, 0)); nothing here reproduces that mode, and ``randint4x``/``rand`` never reach it.
* ``randint4x(seed, offset)`` calls the 32-bit philox with counter (lo, hi, 0, 0): lo = offset's low
  32 bits; hi = 0 for an int32 offset, ``offset >> 32`` (arithmetic) for an int64 offset. So int64
  offsets do not wrap at 2**32, and an int64 offset below 2**31 draws what the same int32 offset draws.
* ``rand`` is word 0 of ``randint4x``; ``rand4x`` is all four words; each word becomes a float by
  ``uint_to_uniform_float``: view as int32, fold negatives with ``~x``, then fp32(x) * fp32(4.6566127342e-10),
  which lies in [0, 1) (fp32(2**31 - 1) * scale rounds to 1 - 2**-24 at most).
"""
from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # round multipliers (Random123's PHILOX_M4x32_0 / _1)
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85  # key increments (Weyl sequence: golden ratio, sqrt(3) - 1)
SCALE = np.float32(4.6566127342e-10)  # Triton's uint32 -> [0, 1) factor, rounded to fp32 as Triton does


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    x = np.asarray(x)
    return x.astype(np.int64) if x.dtype == object else x  # Python ints: int64, as a Triton int64 tensor


def _word(x) -> np.ndarray:
    """The low 32 bits of each integer in x, held in uint64 so products of two words cannot overflow."""
    x = _as_numpy(x)
    return (x.astype(np.int64) if x.dtype.kind == "i" else x.astype(np.uint64)).view(np.uint64) & np.uint64(MASK32)


def split_counter(offsets) -> tuple[np.ndarray, np.ndarray]:
    """(c0, c1) = the two counter words tl.randint4x makes of its offsets: c0 = the low 32 bits; c1 = the
    high 32 bits of an int64 (or wider-typed, Python int) offset, 0 for an offset of 32 bits or fewer."""
    x = _as_numpy(offsets)
    hi = x.astype(np.int64) >> 32 if x.dtype.itemsize > 4 else np.zeros(x.shape, np.int64)
    return _word(x).astype(np.uint32), _word(hi).astype(np.uint32)


def philox4x32(seed: int, c0, c1=0, c2=0, c3=0, rounds: int = 10):
    """Philox4x32-`rounds` of counter (c0, c1, c2, c3) (broadcast against each other; integers of any
    dtype, taken mod 2**32) under key (seed mod 2**32, (seed mod 2**64) >> 32): four uint32 arrays, equal
    to tl.philox(seed, c0, c1, c2, c3) for 32-bit counters."""
    seed = int(seed) % 2**64  # Triton: seed.to(tl.uint64), a negative int32/int64 seed sign-extended
    k0, k1 = seed & MASK32, seed >> 32
    c0, c1, c2, c3 = np.broadcast_arrays(*(_word(c) for c in (c0, c1, c2, c3)))
    a, b, m = np.uint64(ROUND_A), np.uint64(ROUND_B), np.uint64(MASK32)
    for _ in range(rounds):
        pa, pb = a * c0, b * c2  # exact 64-bit products: hi word = umulhi, lo word = the 32-bit product
        c0, c1, c2, c3 = (pb >> 32) ^ c1 ^ np.uint64(k0), pb & m, (pa >> 32) ^ c3 ^ np.uint64(k1), pa & m
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def randint4x(seed: int, offsets, rounds: int = 10):
    """tl.randint4x(seed, offsets): four uint32 arrays from counter (split_counter(offsets), 0, 0)."""
    return philox4x32(seed, *split_counter(offsets), 0, 0, rounds=rounds)


def to_uniform(words: np.ndarray) -> np.ndarray:
    """Triton's uint_to_uniform_float for uint32 words: a float32 array in [0, 1)."""
    x = np.asarray(words).astype(np.uint32).view(np.int32)
    x = np.where(x < 0, ~x, x)  # 3.6 writes -x - 1: the same bits
    return x.astype(np.float32) * SCALE  # int32 -> fp32 rounds to nearest, then one fp32 multiply


def _tensor(a: np.ndarray, like) -> torch.Tensor:
    device = like.device if isinstance(like, torch.Tensor) else "cpu"
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def uniform(seed: int, offsets, rounds: int = 10) -> torch.Tensor:
    """tl.rand(seed, offsets), bit for bit: float32, shape of offsets, on offsets' device (CPU otherwise).
    Element i uses counter offsets[i]; int32 and int64 offsets as split_counter says."""
    return _tensor(to_uniform(randint4x(seed, offsets, rounds)[0]), offsets)


def uniform4x(seed: int, counters, rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """tl.rand4x(seed, counters), bit for bit: the four float32 tensors of Philox's four output words."""
    return tuple(_tensor(to_uniform(w), counters) for w in randint4x(seed, counters, rounds))


def uniform4x_elements(seed: int, n: int, device=None) -> torch.Tensor:
    """The uniforms of elements 0..n-1 as relu_dropout draws them: element 4c + k takes output k of
    uniform4x(seed, c). (The writeup's kernel draws uniform(seed, arange(n)) instead.)"""
    words = uniform4x(seed, np.arange((n + 3) // 4, dtype=np.int32))
    return torch.stack(words, dim=1).reshape(-1)[:n].to(device or "cpu")
