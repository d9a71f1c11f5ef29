"""The kernels called from several threads at once, each with its own shapes (new tile buckets and new
specializations, so tuning state, launch caches and, in the interpreter, Triton's process-wide launch
state are all shared): every call finishes and every result is right."""
import threading

import torch
from conftest import ON_GPU, randn

import kernels


def work(seed: int):
    """(what, got, want) for one thread's calls: shapes differ from thread to thread."""
    n = 8 + 5 * seed
    q, k, v = (randn(1, 2, n + i, 16 + 8 * (seed % 2), seed=seed + i).requires_grad_() for i in (0, 1, 1))
    out = kernels.flash_attention(q, k, v, causal=seed % 2 == 1)
    dq, = torch.autograd.grad(out.sum(), q)
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    ref = kernels.flash_attention_ref(q2, k2, v2, causal=seed % 2 == 1)
    dq_ref, = torch.autograd.grad(ref.sum(), q2)
    x = randn(3 + seed, 30 + 17 * seed, seed=seed)
    y = randn(x.shape[1], seed=seed + 9)
    return [("flash_attention", out, ref), ("flash_attention dq", dq, dq_ref),
            ("softmax", kernels.softmax(x), torch.softmax(x, -1)),
            ("softmax_writeup", kernels.softmax_writeup(x), torch.softmax(x, -1)),
            ("vector_add", kernels.vector_add(x[0], y), x[0] + y),
            ("relu_dropout p=0", kernels.relu_dropout(x, 0.0, seed), torch.relu(x)),
            ("attention", kernels.attention(x[:, :16], x[:, :16], x[:, :16]),
             kernels.attention_ref(x[:, :16], x[:, :16], x[:, :16]))]


def test_four_threads_with_different_shapes_get_right_results(fresh_tiles):
    results, errors = {}, []

    def run(seed):
        try:
            for _ in range(2):  # the second round: cached tiles and launches, still racing
                results[seed] = work(seed)
        except Exception as e:  # noqa: BLE001  (reported below, with its thread)
            errors.append((seed, repr(e)))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(results) == [0, 1, 2, 3]
    for seed, checks in results.items():
        for what, got, want in checks:
            tf32 = ON_GPU and "attention" in what  # fp32 dots run in TF32 on the GPU (10-bit mantissa)
            tol = 1e-2 if tf32 else 1e-4
            torch.testing.assert_close(got, want.to(got.dtype), atol=tol, rtol=tol, msg=f"thread {seed}: {what}")
