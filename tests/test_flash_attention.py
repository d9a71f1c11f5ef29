"""FlashAttention against an fp64 reference with the FlashAttention rule: error no more than twice
torch's own error at the same precision (plus eps). Small sizes: this runs in the interpreter."""
import contextlib

import pandas as pd
import pytest
import torch

from conftest import DEVICE, FLOAT_DTYPES, ON_GPU, randn
from kernels import flash_attention, flash_attention_ref
from kernels import _flash_attention as fa
from kernels._flash_attention import causal_mask
from kernels._triton import tl, triton
from lab.units.flash_attention import flash_errors_as_judged, torch_matmuls_as_the_kernels
from lab.verify import attention_eps, within_fa_rule


def qkv(b, h, sq, sk, d, dtype, strided=False):
    if strided:  # (B, S, H, D) storage seen as (B, H, S, D)
        t = [randn(b, s, h, d, dtype=dtype, seed=i).transpose(1, 2) for i, s in enumerate((sq, sk, sk))]
    else:
        t = [randn(b, h, s, d, dtype=dtype, seed=i) for i, s in enumerate((sq, sk, sk))]
    return [x.requires_grad_() for x in t]


TF32_ATOL = attention_eps(torch.float32, on_gpu=True)  # fp32 inputs multiply in TF32 on the GPU (10-bit mantissa)


def check(q, k, v, causal, dtype):
    out = flash_attention(q, k, v, causal=causal)
    assert out.dtype == dtype and out.shape == q.shape
    do = randn(*q.shape, dtype=dtype, seed=9)
    eps = attention_eps(dtype, ON_GPU)
    errors = flash_errors_as_judged(q, k, v, do, causal)
    for what, (err, err_torch) in errors.items():
        assert within_fa_rule(err, err_torch, eps), f"{what}: {err:.3g} vs torch {err_torch:.3g}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113), (1, 239), (239, 1), (64, 64), (257, 129)])
def test_odd_lengths(sq, sk, causal):
    check(*qkv(1, 2, sq, sk, 64, torch.float16), causal, torch.float16)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [1, 5, 8, 16, 40, 80, 111, 160])  # below 16: a masked head-dim block of 16
def test_odd_head_dims(d, causal):
    check(*qkv(1, 1, 37, 70, d, torch.float16), causal, torch.float16)


def test_torchs_error_is_taken_at_the_kernels_matmul_precision(monkeypatch):
    """fp32 tl.dot is TF32 on a GPU: torch's reference there multiplies in TF32 too; the caller's setting is
    restored after."""
    import kernels

    seen = {}

    def ref(q, k, v, causal, dtype):
        seen[dtype] = torch.get_float32_matmul_precision()
        return flash_attention_ref(q, k, v, causal, dtype=dtype)

    for on_gpu, inside in ((True, "high"), (False, "highest")):
        with torch_matmuls_as_the_kernels(on_gpu):
            assert torch.get_float32_matmul_precision() == inside
        assert torch.get_float32_matmul_precision() == "highest"
    monkeypatch.setattr(kernels, "flash_attention_ref", ref)
    q, k, v = qkv(1, 1, 8, 8, 16, torch.float32)
    flash_errors_as_judged(q, k, v, torch.ones_like(q.detach()), False)
    assert seen[torch.float32] == ("high" if q.is_cuda else "highest")
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_dtypes(dtype):
    check(*qkv(2, 2, 50, 90, 32, dtype), True, dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_views(causal):
    q, k, v = qkv(2, 3, 45, 77, 32, torch.float16, strided=True)
    assert not q.is_contiguous()
    check(q, k, v, causal, torch.float16)


def test_causal_is_bottom_right_aligned():
    """Query i sees key j iff j <= i + seq_k - seq_q: the last query sees every key, and with
    seq_q > seq_k the first seq_q - seq_k queries see none (output 0)."""
    q, k, v = qkv(1, 1, 6, 4, 16, torch.float32)
    out = flash_attention(q, k, v, causal=True)
    assert torch.equal(out[0, 0, :2], torch.zeros_like(out[0, 0, :2]))
    last = flash_attention(q[:, :, -1:], k, v, causal=False)
    torch.testing.assert_close(out[:, :, -1:], last, atol=1e-5, rtol=0)
    q2, k2, v2 = qkv(1, 1, 3, 8, 16, torch.float32)
    out2 = flash_attention(q2, k2, v2, causal=True)
    torch.testing.assert_close(out2[:, :, -1:], flash_attention(q2[:, :, -1:], k2, v2), atol=1e-5, rtol=0)
    first = flash_attention(q2[:, :, :1], k2[:, :, :6], v2[:, :, :6])  # row 0 sees keys 0..5
    torch.testing.assert_close(out2[:, :, :1], first, atol=1e-5, rtol=0)


def test_sm_scale():
    q, k, v = qkv(1, 1, 20, 30, 32, torch.float32)
    torch.testing.assert_close(flash_attention(q, k, v, sm_scale=0.3), flash_attention_ref(q, k, v, sm_scale=0.3),
                               atol=TF32_ATOL if ON_GPU else 1e-5, rtol=0)


@pytest.mark.parametrize("shapes, kwargs, err", [
    (((1, 2, 8, 32), (1, 2, 8, 16), (1, 2, 8, 16)), {}, ValueError),      # head dims differ
    (((1, 2, 8, 32), (1, 3, 8, 32), (1, 3, 8, 32)), {}, ValueError),      # heads differ
    (((1, 2, 8, 32), (1, 2, 9, 32), (1, 2, 8, 32)), {}, ValueError),      # k and v differ
    (((2, 8, 32),) * 3, {}, ValueError),                                  # rank 3
    (((1, 1, 8, 0),) * 3, {}, ValueError),                                # head_dim 0
    (((1, 1, 8, 300),) * 3, {}, ValueError),                              # head_dim > 256
    (((1, 1, 8, 32),) * 3, {"sm_scale": -1.0}, ValueError),
])
def test_bad_input_is_refused(shapes, kwargs, err):
    q, k, v = (randn(*s) for s in shapes)
    with pytest.raises(err, match=r"\b(q|k|v|causal|sm_scale|head_dim|seq_q|seq_k)\b"):  # naming the argument
        flash_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq, sk", [(0, 5), (5, 0), (0, 0)])
def test_an_empty_sequence_gives_what_sdpa_gives(sq, sk, causal):
    """No query: an empty output; no key: every row sees none, so 0 (SDPA's answer); gradients 0."""
    q, k, v = (randn(1, 2, n, 16, dtype=torch.float16, seed=i).requires_grad_() for i, n in enumerate((sq, sk, sk)))
    out = flash_attention(q, k, v, causal=causal)
    assert out.shape == (1, 2, sq, 16) and out.dtype == torch.float16
    assert not out.any()  # SDPA's answer too (checked on the CPU: some GPU backends refuse empty keys)
    if not ON_GPU:
        assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v).detach())
    grads = torch.autograd.grad(out.float().sum(), (q, k, v), allow_unused=True)
    for g, t in zip(grads, (q, k, v)):
        assert g is None or (g.shape == t.shape and not g.any())


def test_gradients_of_expanded_inputs_are_summed_over_the_repeats():
    """K/V shared across heads (stride 0) and q shared across the batch: one buffer must not collect every
    head's gradient (issue 21: the backward wrote each gradient with its input's strides)."""
    q1, k1, v1 = (randn(*shape, seed=i).requires_grad_() for i, shape in enumerate(([1, 2, 8, 32], [1, 1, 8, 32],
                                                                                    [1, 1, 8, 32])))
    do = randn(2, 2, 8, 32, seed=9)
    args = (q1.expand(2, 2, 8, 32), k1.expand(2, 2, 8, 32), v1.expand(2, 2, 8, 32))
    got = torch.autograd.grad(flash_attention(*args), (q1, k1, v1), do)
    want = torch.autograd.grad(flash_attention_ref(*args), (q1, k1, v1), do)
    tol = max(1e-4, attention_eps(torch.float32, ON_GPU))  # fp32 tl.dot is TF32 on the GPU; a gradient summed
    for g, w in zip(got, want):                            # over the wrong repeats is off by O(1)
        torch.testing.assert_close(g, w, atol=tol, rtol=1e-4)


@pytest.mark.parametrize("which", ["q", "k", "v", "all"])
def test_gradients_of_inputs_whose_rows_overlap_in_memory_are_summed_over_them(which):
    """An unfold view: row i of the sequence is elements [i, i + head_dim) of one buffer, so neighbouring rows
    share memory (strides (..., 1, 1)). The gradient must be the sum over every row that reads an element,
    as autograd gives through the view, not rows overwriting each other in one buffer."""
    bufs = {name: randn(1, 2, 16 + n - 1, seed=i).requires_grad_() for i, (name, n) in enumerate(
        (("q", 9), ("k", 13), ("v", 13)))}
    plain = {"q": randn(1, 2, 9, 16, seed=5), "k": randn(1, 2, 13, 16, seed=6), "v": randn(1, 2, 13, 16, seed=7)}
    args = [bufs[n].unfold(-1, 16, 1) if which in (n, "all") else plain[n] for n in "qkv"]
    assert any(a.stride(-2) == 1 for a in args)
    leaves = [bufs[n] for n in "qkv" if which in (n, "all")]
    do = randn(1, 2, 9, 16, seed=9)
    got = torch.autograd.grad(flash_attention(*args), leaves, do)
    want = torch.autograd.grad(flash_attention_ref(*args), leaves, do)
    tol = max(1e-4, attention_eps(torch.float32, ON_GPU))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=1e-4)


def rows_apart(seq, d, stride, seed):
    """A (1, 1, seq, d) fp16 view whose rows lie ``stride`` elements apart in one buffer (as a long
    (B, S, H, D) tensor's transpose(1, 2) has them), its rows filled and nothing else touched."""
    t = torch.empty(stride * (seq - 1) + d, dtype=torch.float16, device=DEVICE).as_strided(
        (1, 1, seq, d), (0, 0, stride, 1))
    return t.copy_(randn(1, 1, seq, d, dtype=torch.float16, seed=seed))


def test_rows_2_to_the_31_elements_apart_are_read_and_written_right():
    """The last row of q, and of the output gradient, lies 2^31 elements from the first: past the int32
    row offsets of the kernels (the process crashed, or read other memory). Each is computed on a dense copy."""
    seq, d = 17, 16
    q = rows_apart(seq, d, 2**31 // (seq - 1), seed=0).requires_grad_()
    k, v = (randn(1, 1, seq, d, dtype=torch.float16, seed=i).requires_grad_() for i in (1, 2))
    do = rows_apart(seq, d, 2**31 // (seq - 1), seed=3)
    assert q.stride(-2) * (seq - 1) == 2**31
    got = (flash_attention(q, k, v), *torch.autograd.grad(flash_attention(q, k, v), (q, k, v), do))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = flash_attention_ref(*ref)
    want = (out, *torch.autograd.grad(out, ref, do.double()))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert (g.double() - w).abs().max() < 4e-3, name


def test_a_head_too_long_for_int32_offsets_even_dense_is_refused():
    q = torch.empty(1, 1, 2**25 + 1, 64, dtype=torch.float16, device=DEVICE)  # 4 GiB, never touched
    k = v = randn(1, 1, 1, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="seq_q=33554433"):
        flash_attention(q, k, v)


NONFINITE = {  # (where, value): one element of q, k or v made non-finite
    "nan in q": ("q", (0, 0, 3, 1), float("nan")),
    "nan in k": ("k", (0, 1, 2, 5), float("nan")),
    "+inf in k": ("k", (0, 0, 4, 3), float("inf")),  # the last key: no row sees it alone (see below)
    "-inf in q": ("q", (0, 1, 4, 0), float("-inf")),
    "inf in v": ("v", (0, 0, 1, 0), float("inf")),
    "nan in v": ("v", (0, 1, 3, 2), float("nan")),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", NONFINITE)
def test_nan_and_inf_propagate_in_kernel_and_reference_as_in_sdpa(case, causal):
    """flash_attention_ref zeroes only the rows that see no key: NaN and inf elsewhere propagate, to the
    same elements as the kernel's; and where SDPA's convention is the same, to SDPA's."""
    where, index, value = NONFINITE[case]
    for sq in (5, 7):  # 7 > seq_k: causal rows 0 and 1 see no key
        q, k, v = (t.detach() for t in qkv(1, 2, sq, 5, 16, torch.float32))
        q = q.abs()  # so +inf in k is a score of +inf (NaN in softmax) whatever the device's random draws
        dict(q=q, k=k, v=v)[where][index] = value
        out, ref = flash_attention(q, k, v, causal=causal), flash_attention_ref(q, k, v, causal=causal)
        assert ref.isnan().any() or not ref.isfinite().all() or value == float("-inf")
        torch.testing.assert_close(out, ref, atol=TF32_ATOL if ON_GPU else 1e-5, rtol=1e-5, equal_nan=True)
        if not causal or (sq == 5 and where != "k"):  # SDPA's causal mask adds -inf, so NaN + -inf leaks
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("sq", [150, 120])  # 120 < seq_k: row i sees keys up to i + 30
def test_a_nan_in_v_under_a_causal_mask_reaches_the_rows_that_see_it_and_few_others(sq):
    """The module docstring's bound: P @ V carries a NaN of V to the rows of its key's tile that do not see
    the key (0 * NaN), but never to rows more than BLOCK_M + BLOCK_N before it."""
    sk, key = 150, 140
    q, k, v = (t.detach() for t in qkv(1, 1, sq, sk, 16, torch.float32))
    v[0, 0, key, 3] = float("nan")
    flash_attention.pin(fwd="32x32/w4/s1")
    try:
        out = flash_attention(q, k, v, causal=True)[0, 0]
    finally:
        flash_attention.pin()
    last_key_seen = torch.arange(sq, device=out.device) + sk - sq
    assert out[last_key_seen >= key, 3].isnan().all()
    assert out[last_key_seen < key - 64].isfinite().all()
    assert out[:, :3].isfinite().all()  # the NaN's own column alone


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("keys", ["a tile", "every key"])
@pytest.mark.parametrize("sq", [70, 90])  # 90 > seq_k: causal rows 0..19 see no key
def test_scores_of_minus_inf_count_as_in_sdpa(keys, sq, causal):
    """-inf in K makes a key's score -inf for every row (q's first feature is 1 in each): such keys get
    weight 0 where a row has other keys, however the key tiles fall (the first tile alone, here, in every
    tile size of the project), and a row whose every visible key is -inf is 0, as SDPA gives, like a row
    that sees no key at all (causal, seq_q > seq_k)."""
    q, k, v = (t.detach() for t in qkv(1, 2, sq, 70, 16, torch.float32))
    q[..., 0] = 1.0
    k[:, :, : 70 if keys == "every key" else 64, 0] = float("-inf")
    out, ref = flash_attention(q, k, v, causal=causal), flash_attention_ref(q, k, v, causal=causal)
    sees_finite = torch.ones(sq, 70, dtype=torch.bool) if not causal else causal_mask(sq, 70)
    sees_finite = (sees_finite & (torch.arange(70) >= (70 if keys == "every key" else 64))).any(-1)
    assert out[:, :, sees_finite].abs().gt(0).all() and out[:, :, ~sees_finite].eq(0).all()
    torch.testing.assert_close(out, ref, atol=TF32_ATOL if ON_GPU else 1e-5, rtol=1e-5)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        sdpa = torch.nn.functional.scaled_dot_product_attention(q[:, :, -70:], k, v, is_causal=causal)
    # SDPA's causal mask is top-left aligned: on the last 70 queries and the 70 keys (square) it is ours
    torch.testing.assert_close(out[:, :, -70:], sdpa, atol=TF32_ATOL if ON_GPU else 1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq, sk, d, strided", [(113, 203, 64, False), (203, 113, 40, False), (1, 70, 16, False),
                                                (45, 77, 32, True)])
def test_one_pass_backward_meets_the_rule_and_matches_the_two_pass_one(sq, sk, d, strided, causal, monkeypatch):
    """KERNELS_FLASH_BACKWARD=one_pass: dQ added by atomics from the dk/dv kernel. Same rule as the
    default backward, and the same gradients up to the order of fp32 additions."""
    q, k, v = qkv(1, 2, sq, sk, d, torch.float16, strided)
    do = randn(*q.shape, dtype=torch.float16, seed=9)
    monkeypatch.setenv("KERNELS_FLASH_BACKWARD", "two_pass")
    two_pass = torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
    monkeypatch.setenv("KERNELS_FLASH_BACKWARD", "one_pass")
    check(q, k, v, causal, torch.float16)
    one_pass = torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)
    from kernels import tiles_in_use
    assert tiles_in_use()["bwd_one_pass"] and not tiles_in_use()["bwd_dkdv"]  # it ran, and it alone
    for name, a, b in zip(("dq", "dk", "dv"), one_pass, two_pass):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=0, msg=name)


@pytest.mark.parametrize("block_d, seq_q, seq_k, causal, tma, deterministic, runs", [
    (64, 4096, 4096, False, True, False, "one_pass"),  # where the one-pass backward was measured faster
    (64, 2049, 3000, False, True, False, "one_pass"),  # the same buckets as 4096: the same choice
    (64, 2048, 2048, False, True, False, "two_pass"),  # a bucket where it was not measured faster
    (64, 1024, 1024, False, True, False, "two_pass"),  # measured slower there
    (64, 16, 4096, False, True, False, "two_pass"),  # few queries: every key block adds into one dQ tile
    (64, 4096, 2048, False, True, False, "two_pass"),
    (64, 4096, 4096, False, True, True, "two_pass"),  # torch's deterministic mode
    (64, 4096, 4096, True, True, False, "two_pass"), (128, 4096, 4096, False, True, False, "two_pass"),
    (32, 4096, 4096, False, True, False, "two_pass"),
    (64, 4096, 4096, False, False, False, "two_pass"),  # no TMA kernel for these inputs (or no GPU): atomics were slower
])
def test_the_default_backward_is_one_pass_only_where_it_was_measured_faster(block_d, seq_q, seq_k, causal, tma,
                                                                            deterministic, runs):
    assert fa.resolve_backward("auto", block_d, seq_q, seq_k, causal, tma, deterministic) == runs
    for kind in ("two_pass", "one_pass"):  # asked for by name: that one, whatever the shape
        assert fa.resolve_backward(kind, block_d, seq_q, seq_k, causal, tma, False) == kind


@pytest.fixture
def deterministic_mode():
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield lambda warn_only=False: torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_the_one_pass_backward_in_deterministic_mode_is_refused_naming_the_variable(monkeypatch, deterministic_mode):
    q, k, v = qkv(1, 1, 8, 8, 16, torch.float32)
    q.requires_grad_()
    monkeypatch.setenv("KERNELS_FLASH_BACKWARD", "one_pass")
    deterministic_mode()
    with pytest.raises(RuntimeError, match="KERNELS_FLASH_BACKWARD=one_pass.*use_deterministic_algorithms"):
        flash_attention(q, k, v).sum().backward()
    deterministic_mode(warn_only=True)  # as torch's own operations: a warning, and it runs
    with pytest.warns(UserWarning, match="not deterministic"):
        flash_attention(q, k, v).sum().backward()
    assert torch.isfinite(q.grad).all()
    deterministic_mode()  # strict again: the plan the warn_only call made does not serve it
    with pytest.raises(RuntimeError, match="KERNELS_FLASH_BACKWARD=one_pass"):
        flash_attention(q, k, v).sum().backward()
    monkeypatch.delenv("KERNELS_FLASH_BACKWARD")
    deterministic_mode()  # the default backward is deterministic in this mode: no error
    q.grad = None
    flash_attention(q, k, v).sum().backward()
    assert fa.tiles_in_use()["bwd_dkdv"] and not fa.tiles_in_use()["bwd_one_pass"]


def test_an_unknown_backward_is_refused_naming_the_variable(monkeypatch):
    q, k, v = qkv(1, 1, 8, 8, 16, torch.float32)
    monkeypatch.setenv("KERNELS_FLASH_BACKWARD", "three_pass")
    with pytest.raises(ValueError, match="KERNELS_FLASH_BACKWARD"):
        flash_attention(q, k, v).sum().backward()


def test_the_flex_attention_peer_computes_the_same_attention():
    """The performance experiment's FlexAttention provider (compiled once, causal by a block mask)."""
    from lab.units.flash_attention import _flex

    q, k, v = [randn(1, 2, 128, 16, dtype=torch.float32, seed=i) for i in range(3)]
    out = _flex(q, k, v, True)()
    torch.testing.assert_close(out, flash_attention_ref(q, k, v, causal=True), atol=1e-5, rtol=0)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's rows; on a GPU the gpu_lengths run")
def test_the_correctness_grid_marks_its_gpu_lengths_as_needing_a_gpu_in_the_interpreter():
    """gpu_lengths (where Hopper's default backward takes its one-pass kernel) run on a GPU only: in the
    interpreter each is a needs_gpu row that says why, and the other cases still run and pass."""
    from lab.units.flash_attention import GPU_LENGTHS, correctness

    s = dict(batch=1, heads=1, base_head_dim=16, base_lengths=[5, 9], lengths=[[7, 3]], gpu_lengths=[[2100, 4100]],
             head_dims=[8], dtypes=["float16"], seed=0)
    df = pd.DataFrame(correctness(s))
    long = df[(df["seq_q"] == 2100) & (df["seq_k"] == 4100)]
    assert len(long) == 2 and (long["status"] == "needs_gpu").all() and (long["error"] == GPU_LENGTHS).all()
    ran = df[df["metric"] == "matches"]
    assert len(ran) == 3 * 2 * 4 and ran["value"].astype(bool).all()  # (7x3, d=8, strided) x causal x out/dq/dk/dv
    assert ran["tile_fwd"].notna().all() and ran["tile_bwd_dkdv"].notna().all()  # each row names its tiles
    s["gpu_lengths"] = [[7, 3]]  # a pair also in lengths runs once, there
    again = pd.DataFrame(correctness(s))
    assert (again["status"] == "ok").all() and len(again[again["metric"] == "matches"]) == len(ran)


def test_the_limits_probe_finds_every_head_that_is_not_finite():
    """Claim 20's scan of every head (the output and gradients past 2^31 elements are checked against the
    reference at three heads only): each batch x heads index with a NaN or an infinity, across the chunks."""
    from lab.units.flash_attention import _nonfinite_heads

    t = torch.zeros(5, 3, 4, 2)
    t[0, 0, 3, 1] = float("nan")
    t[2, 1, 0, 0] = float("inf")
    t[4, 2, 1, 1] = -float("inf")
    for batches in (1, 2, 256):
        assert _nonfinite_heads(t, batches) == [0, 7, 14]
    assert _nonfinite_heads(torch.zeros(2, 2, 3, 4)) == []


@contextlib.contextmanager
def tma_in_the_interpreter(monkeypatch, **tiles):
    """The TMA kernels run in the interpreter as on Hopper (descriptors, without warp specialization), with
    these tiles pinned and the warp-specialized kernels on (KERNELS_FLASH_WS=1). Yields the kernels
    launched, with their constexprs."""
    import triton

    from kernels import _flash_attention as fa

    monkeypatch.setattr(fa, "_tma_ready", lambda *tensors: True)
    monkeypatch.setenv(fa.WS_ENV, "1")
    monkeypatch.setattr(fa, "sm_count", lambda device: 3)  # a persistent grid of 3 loops over several tiles
    monkeypatch.setattr(fa, "_ensure_allocator", lambda: triton.set_allocator(
        lambda size, alignment, stream: torch.empty(size, dtype=torch.int8)))
    used = []
    real = fa._prepare
    monkeypatch.setattr(fa, "_prepare", lambda kernel, *a, **kw: used.append((kernel, a[2])) or real(kernel, *a, **kw))
    previous = fa._allocator.get()
    fa.pin(**tiles)
    try:
        yield used
    finally:
        fa.pin()
        triton.set_allocator(previous)


@pytest.fixture
def causal_ws(monkeypatch):
    """The interpreter runs the causal forward as on Hopper for a '/ws' tile: the TMA kernel over the key
    tiles no row's mask cuts, then the pointer kernel over the rest from the partial output and log-sum-exp
    it left. Yields the kernels launched, with constexprs."""
    from kernels import _flash_attention as fa

    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws") as used:
        yield used
    assert (fa._flash_fwd_tma_kernel, True) in [(kernel, consts.get("PARTIAL")) for kernel, consts in used]
    assert any(kernel is fa._flash_fwd_kernel and consts.get("WS_N") == 32 for kernel, consts in used)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk, strided, flat", [(128, 96, False, True), (100, 70, False, False),
                                                   (128, 96, True, False), (32, 1, False, False)])
def test_the_persistent_tma_forward_meets_the_rule(sq, sk, strided, flat, monkeypatch):
    """Without a causal mask the '/ws' forward is persistent: fewer programs than query tiles (3 in the
    interpreter), each running several, with descriptors over every head's rows where those are one
    matrix in whole tiles (FLAT) and per head elsewhere (odd lengths, strided views)."""
    from kernels import _flash_attention as fa

    grids = []
    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws") as used:
        pinned = fa._prepare
        monkeypatch.setattr(fa, "_prepare", lambda kernel, programs, *a, **kw:
                            grids.append((kernel, programs)) or pinned(kernel, programs, *a, **kw))
        check(*qkv(2, 3, sq, sk, 16, torch.float16, strided), False, torch.float16)
    ws = [consts for kernel, consts in used if kernel is fa._flash_fwd_tma_kernel]
    assert ws and all(c["FLAT"] == flat and not c["PARTIAL"] for c in ws)
    tiles = 2 * 3 * -(-sq // 32)
    assert tiles > 3 and [p for kernel, p in grids if kernel is fa._flash_fwd_tma_kernel] == [3] * len(ws)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk, d", [(100, 100, 64), (70, 130, 40), (130, 70, 64), (33, 1, 16), (1, 97, 16)])
def test_the_causal_forward_split_between_the_tma_and_pointer_kernels_meets_the_rule(sq, sk, d, causal_ws):
    """Forward, log-sum-exp (the backward reads it) and gradients, at lengths that leave rows with no key,
    rows whose keys all lie in the TMA kernel's part or all in the pointer kernel's, and one query row."""
    check(*qkv(1, 2, sq, sk, d, torch.float16), True, torch.float16)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk", [(100, 100), (70, 130), (130, 70), (17, 1)])
def test_the_causal_split_with_a_smaller_diagonal_tile_meets_the_rule(sq, sk, monkeypatch):
    """The pointer kernel at the diagonal in tiles of 16 query rows (DIAGONAL_FWD), two to each of the TMA
    kernel's 32: both start from the key tile where that kernel stopped for the first row of its tile."""
    from kernels import _flash_attention as fa

    monkeypatch.setattr(fa, "DIAGONAL_FWD", (16, 16, 4, 1))
    diagonal, chosen = [], fa.diagonal_fwd
    monkeypatch.setattr(fa, "diagonal_fwd", lambda tile: diagonal.append(chosen(tile)) or diagonal[-1])
    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws") as used:  # fp32: no rounding to blur a wrong key
        check(*qkv(1, 2, sq, sk, 16, torch.float32), True, torch.float32)
    assert any(kernel is fa._flash_fwd_kernel and c["WS_N"] == 32 and c["WS_M"] == 32 for kernel, c in used)
    assert diagonal and all(t.block_m == 16 for t in diagonal)
    with pytest.raises(ValueError, match="does not divide"):
        monkeypatch.setattr(fa, "DIAGONAL_FWD", (24, 16, 4, 1))
        fa.diagonal_fwd(fa.Tile(32, 32, 4, 1, True))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk, d, strided, causal", [(100, 70, 16, False, False), (64, 64, 16, True, False),
                                                        (4, 1, 16, False, False), (36, 50, 24, False, False),
                                                        (99, 70, 16, False, False), (100, 70, 16, False, True),
                                                        (64, 100, 16, True, True), (36, 50, 24, False, True),
                                                        (64, 64, 16, False, True), (4, 97, 16, False, True),
                                                        (99, 70, 16, False, True)])
def test_the_tma_dq_kernel_meets_the_rule_where_it_runs_and_is_not_used_elsewhere(sq, sk, d, strided, causal,
                                                                                  monkeypatch):
    """The '/ws' dQ kernel reads lse and delta through 1-D descriptors over every head's rows, whose starts
    must be 16-byte aligned: it runs where seq_q % 4 == 0, causal or not (the last query tile's rows past
    seq_q read the next head's values, and are not written; causal: rows that see no key, the mask on every
    key tile, the longest tiles first), at lengths that leave keys past a tile, one key, and a head dim below
    its block; elsewhere (seq_q % 4 != 0) the pointer kernel runs."""
    from kernels import _flash_attention as fa

    with tma_in_the_interpreter(monkeypatch, bwd_dq="32x32/w4/s1/ws") as used:
        check(*qkv(2, 3, sq, sk, d, torch.float16, strided), causal, torch.float16)
    dq = {kernel for kernel, _ in used if kernel in (fa._flash_bwd_dq_tma_kernel, fa._flash_bwd_dq_kernel)}
    assert dq == {fa._flash_bwd_dq_tma_kernel if sq % 4 == 0 else fa._flash_bwd_dq_kernel}


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
def test_lengths_of_one_bucket_share_the_dq_tuning_whether_or_not_its_tma_kernel_can_run(monkeypatch):
    """Whether the '/ws' dQ kernel can run depends on seq_q % 4; which tiles are offered (the tuning key)
    must not, or a length of a tuned bucket would tune again (and inside a CUDA graph capture run untuned)."""
    from kernels import _flash_tiles

    keys = []
    real = _flash_tiles.choose
    monkeypatch.setattr(_flash_tiles, "choose", lambda key, *a, **kw: keys.append(key) or real(key, *a, **kw))
    with tma_in_the_interpreter(monkeypatch):
        for s in (40, 41):
            q, k, v = qkv(1, 2, s, s, 16, torch.float16)
            flash_attention(q, k, v).backward(torch.ones_like(q))
    dq = [key for key in keys if key[0] == "bwd_dq"]
    assert len(dq) == 2 and dq[0] == dq[1] and "tma" in dq[0]


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_tma_forwards_finite_start_gives_what_the_pointer_kernel_gives(causal, monkeypatch):
    """The TMA forward's running max starts at -FLT_MAX, with no guard against -inf in its loop. Rows that
    see no key (causal, seq_q > seq_k) or only keys of -inf, and a finite score near -FLT_MAX, come out as
    from the pointer kernel's start at -inf: the same output and log-sum-exp, 0 and +inf where no key counts."""
    from kernels import _flash_attention as fa

    q, k, v = (t.detach() for t in qkv(2, 3, 100, 70, 16, torch.float32))
    q[..., 0] = 1.0
    k[:, :, :40, 0] = float("-inf")  # the first 32-key tile all -inf: from -inf, the guard is needed there
    k[:, :, 45, :] = 0.0
    k[:, :, 45, 0] = -3.4028234663852886e38  # a score of -FLT_MAX / 4: weight 0 beside any other key
    got = {}
    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws") as used:
        for tile in ("32x32/w4/s1", "32x32/w4/s1/ws"):  # the pointer kernel alone, then the TMA one (and causal, both)
            fa.pin(fwd=tile)
            got[tile.endswith("/ws")] = fa._Forward(q, k, v, causal, 0.25, True, True)(q, k, v)
    assert any(kernel is fa._flash_fwd_tma_kernel for kernel, _ in used)
    for a, b in zip(got[False], got[True]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, equal_nan=True)
    want = flash_attention_ref(q.double(), k.double(), v.double(), causal=causal, sm_scale=0.25, dtype=torch.float64)
    torch.testing.assert_close(got[True][0].double(), want, atol=1e-4, rtol=0)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk", [(200, 200), (130, 70), (70, 200)])
def test_the_causal_tma_forward_schedule_leaves_no_tile_out(sq, sk, causal_ws):
    """The causal split's TMA part takes its tiles longest first, every head's of one length together, in
    a grid of 3 programs (the interpreter's), rounds alternately forwards and backwards, the last partial:
    every output row right means no tile was left out."""
    check(*qkv(2, 3, sq, sk, 16, torch.float16), True, torch.float16)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("first", [32, 96])
def test_the_causal_split_passes_on_keys_of_minus_inf(first, causal_ws):
    """-inf scores for the first keys: rows that see only those get 0 (their partial sum is 0 and its
    log-sum-exp -inf), other rows weight them 0, whichever kernel ran them."""
    q, k, v = (t.detach() for t in qkv(1, 2, 130, 130, 16, torch.float16))
    q[..., 0] = 1.0
    k[:, :, :first, 0] = float("-inf")
    out = flash_attention(q, k, v, causal=True)
    ref = flash_attention_ref(q.float(), k.float(), v.float(), causal=True)
    assert out[:, :, :first].eq(0).all() and out[:, :, first:].abs().gt(0).all()
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=0)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernel; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk, keys", [(130, 70, "finite"), (33, 64, "-inf"), (100, 100, "finite")])
def test_the_causal_split_stores_the_pointer_kernels_log_sum_exp(sq, sk, keys, causal_ws):
    """What the backward reads: the same log-sum-exp as the pointer kernel alone, +inf for rows that see no
    key (causal, seq_q > seq_k) or only keys of -inf (which at 33 x 64 lie in the TMA kernel's part)."""
    from kernels import _flash_attention as fa

    q, k, v = (t.detach() for t in qkv(1, 2, sq, sk, 16, torch.float16))
    if keys == "-inf":
        q[..., 0] = 1.0
        k[..., 0] = float("-inf")
    o, lse = fa._Forward(q, k, v, True, 0.25, True, True)(q, k, v)
    fa.pin(fwd="32x32/w4/s1")  # the pointer kernel alone
    o_alone, lse_alone = fa._Forward(q, k, v, True, 0.25, True, True)(q, k, v)
    fa.pin(fwd="32x32/w4/s1/ws")
    assert torch.equal(lse.isinf(), lse_alone.isinf()) and torch.equal(lse[lse.isinf()], lse_alone[lse_alone.isinf()])
    no_key = max(sq - sk, 0) if keys == "finite" else sq  # rows that see no finite score
    assert lse[..., :no_key].eq(float("inf")).all() and lse[..., no_key:].isfinite().all()
    torch.testing.assert_close(lse, lse_alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(o, o_alone, atol=2e-3, rtol=0)


@pytest.fixture
def ws_masked(monkeypatch):
    """'/ws/masked' tiles as on Hopper, in the interpreter: the causal forward in one launch of the TMA kernel
    (no split), the two-pass backward's dK/dV by the TMA kernel alone, both masks counting rows (keys) from
    the tile's start. Yields the kernels launched, with constexprs."""
    from kernels import _flash_attention as fa

    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws/masked", bwd_dkdv="32x32/w4/s1/ws/masked") as used:
        yield used
    kernels = [(kernel, consts.get("CAUSAL"), consts.get("PARTIAL"), consts.get("WS")) for kernel, consts in used]
    assert (fa._flash_fwd_tma_kernel, True, False, None) in kernels  # one launch, masked throughout
    assert (fa._flash_bwd_tma_kernel, True, False, True) in kernels  # likewise
    assert not any(kernel is fa._flash_fwd_kernel for kernel, _ in used)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk, d", [(100, 100, 64), (70, 130, 40), (130, 70, 64), (33, 1, 16), (1, 97, 16),
                                       (64, 64, 16), (96, 160, 40), (160, 96, 16), (70, 128, 16), (100, 64, 16),
                                       (96, 100, 16)])
def test_the_masked_tma_kernels_meet_the_rule(sq, sk, d, ws_masked):
    """Forward, log-sum-exp and gradients on '/ws/masked' tiles under a causal mask: rows with no key, tiles the diagonal cuts at
    every offset from their start, one query row, one key; key lengths in whole key tiles (the forward's
    causal mask alone, no key test), with query lengths in whole tiles or not, and whole query tiles with
    key lengths that are not (the dK/dV kernel's causal mask alone, no row test)."""
    check(*qkv(1, 2, sq, sk, d, torch.float16), True, torch.float16)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("group_bytes", [1, 102400], ids=["a-head-a-group", "four-heads-a-group"])
def test_the_masked_tma_kernels_longest_first_in_groups_of_heads_meet_the_rule(group_bytes, ws_masked, monkeypatch):
    """The persistent TMA forward (longest first, one group of every head) and the TMA dK/dV kernel, causal,
    its longest-first order in groups of heads (LPT_GROUP_BYTES; 102400 bytes: four heads of 100 fp16 rows of
    64, so groups of 4 and 2 of the 6 heads)."""
    monkeypatch.setattr(fa, "LPT_GROUP_BYTES", group_bytes)
    check(*qkv(2, 3, 100, 100, 64, torch.float16), True, torch.float16)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("sq, sk, d, tile", [(100, 100, 64, "32x32"), (70, 130, 40, "32x32"), (130, 70, 64, "32x32"),
                                             (64, 64, 16, "32x32"), (33, 1, 16, "32x32"), (1, 97, 16, "32x32"),
                                             (96, 160, 16, "32x32"), (96, 100, 16, "32x32"), (100, 100, 64, "16x32"),
                                             (96, 75, 16, "16x32"), (33, 97, 16, "16x32")])
def test_the_causal_dkdv_split_meets_the_rule(sq, sk, d, tile, monkeypatch):
    """A causal backward on a '/ws' dK/dV tile runs the pointer kernel over the query
    tiles the diagonal cuts (DIAGONAL), then the TMA kernel over the rest, unmasked (PARTIAL), going on
    from the first one's sums: gradients at lengths whose diagonal cuts tiles at every offset, rows with
    no key, whole query tiles (no row mask) with whole and ragged key tiles, one query row, one key; square
    tiles and, as the H200's 64x128, fewer queries than keys per tile."""
    from kernels import _flash_attention as fa

    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws", bwd_dkdv=f"{tile}/w4/s1/ws") as used:
        check(*qkv(1, 2, sq, sk, d, torch.float16), True, torch.float16)
    assert any(kernel is fa._flash_bwd_tma_kernel and c["PARTIAL"] and c["WS"] for kernel, c in used)
    assert any(kernel is fa._flash_bwd_dkdv_kernel and c["DIAGONAL"] for kernel, c in used)
    assert any(kernel is fa._flash_fwd_kernel and c["WS_N"] for kernel, c in used)  # the forward kept its split


@pytest.mark.parametrize("sq, sk, b, h", [(100, 100, 2, 3), (70, 130, 1, 2), (130, 70, 3, 1), (33, 1, 1, 2)])
@pytest.mark.parametrize("group_bytes", [0, 1, 51200], ids=["one-group", "a-head-a-group", "two-heads-a-group"])
def test_the_causal_backward_longest_first_meets_the_rule(sq, sk, b, h, group_bytes, monkeypatch):
    """BWD_LONGEST_FIRST: the causal pointer dK/dV and dQ kernels take their programs longest first, in
    groups of heads (LPT_GROUP_BYTES; 51200 bytes: two heads of 100 fp32 rows of 32, so a smaller last group
    at 3 heads), every tile of every head once: gradients over several heads and batches, lengths unequal
    both ways."""
    from kernels import _flash_attention as fa

    monkeypatch.setattr(fa, "BWD_LONGEST_FIRST", True)
    monkeypatch.setattr(fa, "LPT_GROUP_BYTES", group_bytes)
    fa.pin(bwd_dkdv="32x32/w4/s1", bwd_dq="32x32/w4/s1")
    try:
        check(*qkv(b, h, sq, sk, 32, torch.float32), True, torch.float32)
    finally:
        fa.pin()


def test_no_flash_kernel_is_specialized_on_a_length_or_its_lpt_group():
    """Triton specializes an integer argument that is 1 or a multiple of 16; the lengths, and lpt_group
    (which lengths decide), must not be, so that a new length of a tuned bucket compiles nothing."""
    kernels = [getattr(fa, name) for name in dir(fa) if name.startswith(("_flash_", "_bwd_")) and name.endswith("_kernel")]
    assert len(kernels) >= 7
    for kernel in kernels:  # a JITFunction on a GPU, an InterpretedFunction (its jit arguments kept) on the CPU
        unspecialized = ({p.name for p in kernel.params if p.do_not_specialize} if hasattr(kernel, "params")
                         else set(kernel.kwargs.get("do_not_specialize") or ()))
        lengths = {"seq_q", "seq_k", "lpt_group"} & set(kernel.arg_names)
        assert lengths and lengths <= unspecialized, (kernel.fn.__name__, lengths - unspecialized)


@triton.jit
def _orders(out_ptr, persistent_ptr, tiles, n_bh, group, N: tl.constexpr):
    """Where _by_length and _longest_first put work items 0..tiles * n_bh - 1: (head, rank) pairs."""
    t = tl.arange(0, N)
    inside = t < tiles * n_bh
    bh, rank = fa._by_length(t, tiles, n_bh, group)
    tl.store(out_ptr + 2 * t, bh, mask=inside)
    tl.store(out_ptr + 2 * t + 1, rank, mask=inside)
    bh, rank = fa._longest_first(t, tiles, n_bh, group)
    tl.store(persistent_ptr + 2 * t, bh, mask=inside)
    tl.store(persistent_ptr + 2 * t + 1, rank, mask=inside)


@pytest.mark.parametrize("tiles, n_bh, group, programs", [(4, 6, 6, 5), (4, 6, 4, 5), (3, 7, 2, 4), (5, 3, 1, 2),
                                                          (1, 5, 3, 7), (6, 1, 1, 3)])
def test_longest_first_orders_visit_every_tile_of_every_head_once_longest_first_in_each_group(tiles, n_bh, group,
                                                                                             programs):
    """_by_length (a program per tile) and _longest_first (a persistent grid's rounds, alternating
    direction): a permutation of (head, rank) pairs; within a group of heads, ranks in order."""
    n = tiles * n_bh
    out, persistent = (torch.full((n, 2), -1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    _orders[(programs,)](out, persistent, tiles, n_bh, group, N=triton.next_power_of_2(n))
    pairs = sorted((h, r) for h in range(n_bh) for r in range(tiles))
    for got in (out, persistent):
        assert sorted(map(tuple, got.tolist())) == pairs
    groups = [bh // group for bh, _ in out.tolist()]
    assert groups == sorted(groups)  # each group's tiles one after another, the groups in order
    by_group = {}
    for bh, rank in out.tolist():
        by_group.setdefault(bh // group, []).append(rank)
    assert all(ranks == sorted(ranks) for ranks in by_group.values())  # longest first within a group


@pytest.fixture(params=[("two_pass", False), ("two_pass", True), ("one_pass", False)],
                ids=lambda p: f"{p[0]}-{'tma' if p[1] else 'pointer'}")
def every_backward(request, monkeypatch):
    """Each backward kernel in turn: two_pass or one_pass by the pointer kernels, or two_pass with (as on
    Hopper) the '/ws' TMA dK/dV kernel. (The one-pass TMA kernel's dQ reduce-add has no interpreter
    form: test_flash_attention_gpu runs it.)"""
    from kernels import _flash_attention as fa

    kind, tma = request.param
    monkeypatch.setenv(fa.BACKWARD_ENV, kind)
    if tma:
        with tma_in_the_interpreter(monkeypatch, bwd_dkdv="32x32/w4/s1/ws"):
            yield
    else:
        yield


def _grads(q, k, v, do, causal, fn=flash_attention, **kw):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(fn(q, k, v, causal=causal, **kw), (q, k, v), do)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_key_of_minus_inf_gives_nan_gradients_only_where_the_reference_does(causal, every_backward):
    """A key whose score is -inf for every query, at lengths that leave padding rows in the last query tile
    (zeros there score NaN against it): every backward kernel gives the fp64 reference's gradients, with
    NaN only in dQ's column that holds the -inf (0 * -inf, as the reference has it), none in dK or dV."""
    q, k, v = (t.detach() for t in qkv(1, 2, 45, 37, 16, torch.float32))
    q[..., 0] = 1.0
    k[:, :, 3, 0] = float("-inf")
    do = randn(*q.shape, dtype=torch.float32, seed=9)
    got = _grads(q, k, v, do, causal)
    want = _grads(q.double(), k.double(), v.double(), do.double(), causal, flash_attention_ref, dtype=torch.float64)
    assert want[0][..., 0].isnan().all() and not want[0][..., 1:].isnan().any()
    assert not want[1].isnan().any() and not want[2].isnan().any()
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4, equal_nan=True, msg=name)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
def test_a_query_of_minus_inf_gets_zero_output_and_gradient_and_leaves_the_others_as_without_it(every_backward):
    """A query whose scores are all -inf, at a key length that leaves padding keys in the last tile (zeros
    there score NaN against it): its output and dQ are 0 (SDPA's convention), and every other gradient is
    the one without that query (dK but for the column of the -inf: 0 * -inf)."""
    q, k, v = (t.detach() for t in qkv(1, 2, 45, 37, 16, torch.float32))
    k[..., 1] = 1.0
    q[:, :, 40, 1] = float("-inf")
    do = randn(*q.shape, dtype=torch.float32, seed=9)
    out = flash_attention(q, k, v)
    dq, dk, dv = _grads(q, k, v, do, False)
    keep = [i for i in range(45) if i != 40]
    rq, rdo = q[:, :, keep].double(), do[:, :, keep].double()
    want_out = flash_attention_ref(rq, k.double(), v.double(), dtype=torch.float64)
    wq, wk, wv = _grads(rq, k.double(), v.double(), rdo, False, flash_attention_ref, dtype=torch.float64)
    assert out[:, :, 40].eq(0).all() and dq[:, :, 40].eq(0).all()
    torch.testing.assert_close(out[:, :, keep].double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dq[:, :, keep].double(), wq, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dv.double(), wv, atol=1e-4, rtol=1e-4)
    columns = [c for c in range(16) if c != 1]
    torch.testing.assert_close(dk[..., columns].double(), wk[..., columns], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_the_reference_gives_sdpas_gradients_for_a_row_of_minus_inf(causal):
    """flash_attention_ref, float64, beside SDPA's math: a query whose every score is -inf gets output 0 and
    gradient 0 (not the NaN softmax's backward gives such a row), dK NaN only in the -inf's column (0 * -inf)."""
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    k = k.abs() + 0.1
    q[0, 0, 2, 0] = float("-inf")  # row 2 of head 0: -inf against every key
    do = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    got, want = [], []
    for fn, into in ((lambda *a: flash_attention_ref(*a, causal=causal, dtype=torch.float64), got),
                     (lambda *a: F.scaled_dot_product_attention(*a, is_causal=causal), want)):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*inputs)
        into.extend([out, *torch.autograd.grad(out, inputs, do)])
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, equal_nan=True, msg=name)
    assert got[1][0, 0, 2].eq(0).all() and got[2][0, 0, :, 1:].isfinite().all()


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the TMA kernels; on a GPU, test_flash_attention_gpu")
def test_the_warp_specialized_kernels_run_unless_turned_off(monkeypatch):
    """KERNELS_FLASH_WS: by default (1) the forward's, the dK/dV and the dQ kernel's TMA forms run for '/ws' tiles
    where the inputs allow them; with 0 the tiles run their sizes in the pointer kernels, with the same
    result; another value is refused, naming the variable."""
    from kernels import _flash_attention as fa
    from kernels._dead_barriers import WithoutDeadBarriers

    q, k, v = qkv(1, 2, 40, 40, 16, torch.float32)
    do = randn(*q.shape, dtype=torch.float32, seed=9)
    got = {}
    with tma_in_the_interpreter(monkeypatch, fwd="32x32/w4/s1/ws", bwd_dkdv="32x32/w4/s1/ws",
                                bwd_dq="32x32/w4/s1/ws") as used:
        for ws in (None, "0", "1"):
            if ws is None:
                monkeypatch.delenv(fa.WS_ENV)
            else:
                monkeypatch.setenv(fa.WS_ENV, ws)
            used.clear()
            fa._plans.clear()  # each setting prepares its launches anew (None and "1" would share a plan)
            got[ws] = _grads(q, k, v, do, False)
            launched = {kernel for kernel, _ in used}
            assert (fa._flash_fwd_tma_kernel in launched) == (ws != "0"), ws
            assert (fa._flash_bwd_tma_kernel in launched) == (ws != "0"), ws
            assert (fa._flash_bwd_dq_tma_kernel in launched) == (ws != "0"), ws
        monkeypatch.setenv(fa.WS_ENV, "yes")
        with pytest.raises(ValueError, match=fa.WS_ENV):
            flash_attention(q, k, v)
    for a, b in zip(got[None], got["0"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the TMA kernels go through the launcher that compiles them without dead barriers (on the GPU)
    assert isinstance(fa._direct[fa._flash_fwd_tma_kernel], WithoutDeadBarriers)
    assert isinstance(fa._direct[fa._flash_bwd_tma_kernel], WithoutDeadBarriers)
    assert isinstance(fa._direct[fa._flash_bwd_dq_tma_kernel], WithoutDeadBarriers)
    assert not isinstance(fa._direct[fa._flash_fwd_kernel], WithoutDeadBarriers)
