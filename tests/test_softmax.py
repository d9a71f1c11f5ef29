import warnings

import pytest
import torch

from conftest import DEVICE, FLOAT_DTYPES, ON_GPU, randn
import kernels._softmax as sm
from kernels import softmax, softmax_backward, softmax_naive, softmax_ref, softmax_writeup
from kernels._triton import tl, triton
from lab.units.softmax import softmax_atol

SHAPES = [(4, 5), (1, 1), (3, 97), (7, 1023), (2, 1024), (2, 1025), (5, 2000), (2, 4097)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fixed_softmax_any_width(shape, dtype):
    x = randn(*shape, dtype=dtype, seed=3)
    out = softmax(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), softmax_ref(x).float(), atol=softmax_atol(dtype), rtol=0)


def test_writeup_small_case_passes_with_the_bug():
    x = randn(4, 5)
    torch.testing.assert_close(softmax(x, block_size=1024), torch.softmax(x, -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_cols", [1025, 2000, 3000])
def test_hardcoded_block_silently_drops_columns(n_cols):
    """The writeup's bug: columns past 1024 are never written, no error, no warning."""
    x = randn(4, n_cols, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        out = softmax(x, block_size=1024, out=torch.full_like(x, float("nan")))
    untouched = out.isnan().all(dim=0)
    assert int(untouched.sum()) == n_cols - 1024
    assert untouched[1024:].all() and not untouched[:1024].any()
    # What was written is a softmax over the first 1024 columns only.
    torch.testing.assert_close(out[:, :1024], torch.softmax(x[:, :1024], -1), atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, :1024], torch.softmax(x, -1)[:, :1024], atol=1e-6)


def test_the_writeup_kernel_writes_into_an_out_of_any_layout():
    """Its kernel takes a row stride only; an out whose columns are not adjacent gets the same result, the
    columns the kernel never writes keeping their old content."""
    x = randn(4, 2000, seed=1)
    for block_size in (None, 1024):
        want = softmax_writeup(x, block_size, out=torch.full_like(x, float("nan")))
        out = torch.full((2000, 4), float("nan"), device=x.device).t()  # column stride 4
        assert softmax_writeup(x, block_size, out=out) is out
        torch.testing.assert_close(out, want, equal_nan=True, atol=0, rtol=0)


def test_fix_at_2000():
    x = randn(4, 2000, seed=1)
    buggy = softmax(x, block_size=1024, out=torch.zeros_like(x))
    assert (buggy - torch.softmax(x, -1)).abs().max() > 1e-3
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1), atol=1e-6, rtol=0)


def test_max_subtraction_keeps_large_inputs_finite():
    x = randn(8, 1000, scale=1000.0)
    assert not softmax_naive(x).isfinite().all()  # exp overflows without the max subtraction
    out = softmax(x)
    assert out.isfinite().all()
    torch.testing.assert_close(out.double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=0)


def test_strided_rows():
    x = randn(6, 300)[::2]  # row stride 600
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("x, kwargs, err", [
    (lambda: randn(10), {}, ValueError),
    (lambda: randn(2, 3, 4), {}, ValueError),
    (lambda: randn(2, 3), {"block_size": 1000}, ValueError),
    (lambda: randn(2, 3).to(torch.float64), {}, TypeError),
])
def test_bad_input_is_refused(x, kwargs, err):
    with pytest.raises(err, match=r"\b(x|block_size|out)\b"):  # naming the argument
        softmax(x(), **kwargs)


# The improved softmax has three paths by row width; small tiles, chunks and segments force each one at widths
# the interpreter runs in seconds. On a GPU the split and two-pass paths with several programs per row are
# cooperative kernels (one launch, a barrier per row); in the interpreter each is the same kernel in two
# launches.
PATHS = {"rows": dict(tile=256, row_limit=1024, chunk=64),
         "split": dict(tile=256, row_limit=16, chunk=64, segment=0),
         # a chunk per row: the one-launch form (rows published a row ahead, counters) in the interpreter too
         "split, one chunk per row": dict(tile=256, row_limit=16, chunk=1024, segment=0),
         "two-pass": dict(row_limit=16, chunk=32, segment=64),  # several programs per row
         "two-pass, a program per row": dict(row_limit=16, chunk=32, segment=2**20),
         # walked from the rows' 16-byte boundaries in whole vectors, where the rows allow it (_alike)
         "two-pass, aligned walk": dict(row_limit=16, chunk=32, segment=64, align=True),
         "two-pass, a program per row, aligned walk": dict(row_limit=16, chunk=32, segment=2**20, align=True)}
FORWARD_PATHS = {**PATHS, "rows, default tile": dict(row_limit=1024),
                 # one warp: lanes of 128 (fp32) or 256 (16-bit) columns, several columns each (_publish, and the
                 # two-pass first walk's per-thread partials)
                 "split, several columns a lane": dict(tile=256, row_limit=16, chunk=512, warps=1, segment=0,
                                                       packed=False),
                 "two-pass, several columns a lane": dict(row_limit=16, chunk=256, warps=1, segment=512),
                 # a few programs (3 in the interpreter) each walking many tiles, loading the next one early
                 "rows, prefetching": dict(tile=256, row_limit=1024, prefetch=True),
                 "rows, prefetching a row at a time": dict(tile=1, row_limit=1024, prefetch=True)}
BACKWARD_PATHS = {**PATHS, "rows, y and dy read twice": dict(tile=256, row_limit=1024, reload=True),
                  "rows, y and dy held": dict(tile=256, row_limit=1024, reload=False),
                  # the split backward's two forms whatever the dtype's default (fp32 runs a row ahead)
                  "split, a row ahead": dict(PATHS["split"], ahead=True),
                  "split, a row at a time": dict(PATHS["split"], ahead=False),
                  "split, one chunk per row, a row ahead": dict(PATHS["split, one chunk per row"], ahead=True),
                  "split, one chunk per row, a row at a time": dict(PATHS["split, one chunk per row"], ahead=False)}
# 16-bit rows held two to a 32-bit word (bf16 or fp16 pairs; bf16's rounding by integer arithmetic in the
# interpreter, whose own bf16 conversion is wrong)
PACKED_PATHS = {"split, packed, a row ahead": dict(PATHS["split"], ahead=True, packed=True),
                "split, packed, a row at a time": dict(PATHS["split"], ahead=False, packed=True),
                "split, packed, one chunk per row": dict(PATHS["split, one chunk per row"], ahead=True, packed=True)}
PACKED_FORWARD_PATHS = {"split, packed": dict(PATHS["split"], packed=True),
                        "split, packed, several words a lane": dict(PATHS["split"], chunk=512, warps=1, packed=True),
                        "split, packed, one chunk per row": dict(PATHS["split, one chunk per row"], packed=True)}


def forward(x, path):
    return sm._forward(x, torch.empty(x.shape, dtype=x.dtype, device=x.device), **FORWARD_PATHS[path])


@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (37, 64), (5, 65), (9, 200), (40, 129)])
def test_every_path_any_width(shape, dtype, path):
    """Narrow rows share a tile (37 x 64: 4 rows per program, the last program part-empty); the split
    and two-pass paths cover one chunk, a chunk and one column, and many rows per group of programs."""
    x = randn(*shape, dtype=dtype, seed=5)
    torch.testing.assert_close(forward(x, path).float(), softmax_ref(x).float(), atol=softmax_atol(dtype), rtol=0)


@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 8), (3, 17), (2, 100)])
def test_every_path_in_place(shape, dtype, path):
    """out is x: each path reads a column before it writes it (the aligned walk stores its end vectors after the
    walk, from x as it was: rows of one vector, rows whose ends are whole vectors, rows whose ends are not)."""
    x = randn(*shape, dtype=dtype, seed=11)
    want = softmax_ref(x).float()
    torch.testing.assert_close(sm._forward(x, x, **FORWARD_PATHS[path]).float(), want, atol=softmax_atol(dtype), rtol=0)


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_the_aligned_backward_with_chunks_smaller_than_a_vector(chunk):
    """A chunk of fewer columns than a 16-byte vector: the walk's vector is the chunk (as the forward's is)."""
    y = softmax_ref(randn(3, 37, dtype=torch.float16, seed=2))
    dy = randn(3, 37, dtype=torch.float16, seed=3)
    want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    got = sm._backward(y, dy, row_limit=1, segment=64, chunk=chunk, warps=1, align=True)
    torch.testing.assert_close(got.float(), want, atol=4 * softmax_atol(torch.float16), rtol=0)


@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # 16-bit outputs: the two-pass path's FAST form
def test_every_path_strided_and_minus_inf(path, dtype):
    x = randn(12, 900, dtype=dtype)[::3, ::4]  # row stride 2700, column stride 4
    x[1, :100] = -float("inf")  # a whole chunk of -inf: its partial sum is 0, not NaN
    x[2, 7] = -float("inf")
    x[3] = -float("inf")  # every score -inf: NaN, as torch gives
    x[0, :100] = -float("inf")  # a chunk of -inf beside scores far below 0, where exp(0 - row max) overflows
    x[0, 100:] -= 300
    torch.testing.assert_close(forward(x, path).float(), torch.softmax(x.float(), -1), atol=softmax_atol(dtype),
                               rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_two_pass_partials_per_thread_across_chunks(dtype):
    """The two-pass forward's first walk keeps a (max, sum) per thread over its chunks (one warp of 32 threads,
    a 16-byte vector each: lanes of 128 fp32 or 256 fp16 columns; chunks of two lanes): columns -inf in the first
    chunks and finite later, a max that grows chunk after chunk, a thread's columns -inf over a whole row, a
    segment all -inf (its partial (-inf, 0))."""
    vector = 16 // dtype.itemsize
    lanes = 32 * vector
    chunk = 2 * lanes
    x = randn(5, 6 * chunk + 37, dtype=dtype, seed=4)  # segments of 4 chunks, then 2 and one of 37 columns
    x[0, : 3 * chunk] = -float("inf")
    x[1] += torch.linspace(0, 20, x.shape[1], device=DEVICE).to(dtype)
    cols = torch.arange(x.shape[1], device=DEVICE)
    x[2, (cols % lanes) // vector == 1] = -float("inf")  # thread 1's columns, every chunk
    x[3, : 4 * chunk] = -float("inf")
    out = sm._forward(x, torch.empty_like(x), row_limit=16, chunk=chunk, warps=1, segment=4 * chunk)
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=softmax_atol(dtype), rtol=0)


@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("shape", [(4, 128), (1, 128), (3, 130), (2, 96)])
def test_no_path_reads_or_writes_outside_its_rows(shape, path):
    """x and the output are windows of larger buffers: NaN in x's buffer past each row, a sentinel in the
    output's. Shapes whose chunks cover the rows exactly (the split and two-pass paths drop their masks
    there, EVEN) and shapes they do not."""
    n_rows, n_cols = shape
    x_buffer = torch.full((n_rows + 2, n_cols + 40), float("nan"), device=DEVICE)
    x = x_buffer[:n_rows, :n_cols]
    x.copy_(randn(*shape, seed=3))
    out_buffer = torch.full((n_rows + 2, n_cols + 40), 7.0, device=DEVICE)
    out = out_buffer[:n_rows, :n_cols]
    sm._forward(x, out, **FORWARD_PATHS[path])
    torch.testing.assert_close(out, softmax_ref(x), atol=softmax_atol(torch.float32), rtol=0)
    outside = torch.ones_like(out_buffer, dtype=torch.bool)
    outside[:n_rows, :n_cols] = False
    assert out_buffer[outside].eq(7.0).all()


def test_the_aligned_walk_is_taken_where_the_rows_allow_it():
    """The tests above run the aligned walk: rows of 17 or 129 columns, contiguous or windows of wider rows,
    meet 16-byte boundaries at the same column in x and the output. Not where a start is off a boundary, the
    tensors' rows meet them at different columns, or columns are apart."""
    def empty(*shape):
        return torch.empty(*shape, device=DEVICE)

    wide = empty(4, 140)
    for x, out, aligned in [(empty(3, 17), empty(3, 17), True),
                            (wide[:, :129], wide[:, 4:133], True),  # 16 bytes on: the same columns
                            (wide[:, :129], wide[:, 1:130], False),  # 4 bytes on
                            (empty(3, 17), empty(3, 20)[:, :17], False),  # rows 17 and 20 apart
                            (empty(17, 3).t(), empty(3, 17), False)]:
        assert sm._settings(x.shape[1], (x, out), False, PATHS["two-pass, aligned walk"]).align == aligned


@pytest.mark.parametrize(("n_cols", "backward", "aligned"), [
    (4001, True, True), (4000, True, False), (1001, True, False), (20001, False, True), (16001, False, False)])
def test_rows_no_vector_divides_take_the_aligned_walk_by_default(n_cols, backward, aligned):
    """fp16 rows of 4001 columns (backward) or 20001 (forward) walk from their 16-byte boundaries (UNALIGNED);
    4000 columns (a multiple of the vector) and narrower rows keep the defaults. Through the public API, right."""
    x = randn(3, n_cols, dtype=torch.float16, seed=7)
    y = softmax(x)
    torch.testing.assert_close(y.float(), softmax_ref(x).float(), atol=softmax_atol(torch.float16), rtol=0)
    dy = randn(3, n_cols, dtype=torch.float16, seed=8)
    want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    torch.testing.assert_close(softmax_backward(y, dy).float(), want, atol=4 * softmax_atol(torch.float16), rtol=0)
    assert sm._settings(n_cols, (x, y, y) if backward else (x, y), backward, {}).align == aligned


@pytest.mark.parametrize(("n_cols", "plain"), [(3001, True), (24001, True), (2001, False), (6001, False)])
def test_fp32_rows_no_vector_divides_take_the_plain_two_pass_backward_where_reloading_rows_is_slow(n_cols, plain):
    """fp32 rows of 3001 or 24001 columns, whose default rows path would read y and dy twice, one row a program,
    take the two-pass path walked a column at a time (UNALIGNED's "plain" entries), 2001 and 6001 columns the
    rows path; right through the public API either way."""
    y = torch.softmax(randn(3, n_cols, seed=7, scale=4.0), -1)
    dy = randn(3, n_cols, seed=8)
    cfg = sm._settings(n_cols, (y, dy, torch.empty_like(y)), True, {})
    assert (cfg.split and cfg.segment > 0 and not cfg.align) == plain
    want = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
    torch.testing.assert_close(softmax_backward(y, dy).double(), want, atol=1e-6, rtol=0)


def test_the_unmasked_forms_are_taken_where_the_chunks_cover_the_rows():
    """The test above is about something: EVEN holds for 128 columns in every split and two-pass form
    there, and not for 130; so too for the packed forward's words at 128 and 256 columns, not at 150."""
    for path in ("split", "two-pass", "two-pass, a program per row"):
        assert sm._covers(128, sm.launch_settings(128, 4, **FORWARD_PATHS[path])), path
        assert not sm._covers(130, sm.launch_settings(130, 4, **FORWARD_PATHS[path])), path
    for n_cols, even in ((128, True), (256, True), (150, False)):
        x = torch.empty(3, n_cols, dtype=torch.bfloat16)
        cfg, (words,) = sm._words(sm._settings(n_cols, (x, x), False, PACKED_FORWARD_PATHS["split, packed"]), x)
        assert cfg.packed and sm._covers(words.shape[1], cfg) == even, n_cols


@triton.jit
def _chunk_of(out_ptr, x_ptr, row, x_row, n_cols, n_rows, CHUNK: tl.constexpr, EVEN: tl.constexpr):
    cols = tl.arange(0, CHUNK)
    tl.store(out_ptr + cols, sm._load_chunk(x_ptr, row, x_row, cols, 1, n_cols, n_rows, EVEN, False))


def test_a_load_ahead_of_the_last_row_stays_in_the_tensor():
    """The split path loads two rows ahead. Past the last row, a masked load gives -inf; an unmasked one
    (EVEN) must read the last row again, not the memory after the tensor (here, more rows of the buffer
    the tensor is a view of)."""
    buffer = torch.arange(6 * 64, dtype=torch.float32, device=DEVICE).reshape(6, 64)
    x = buffer[:3]
    for even, want in ((True, x[2]), (False, torch.full((64,), -float("inf"), device=DEVICE))):
        out = torch.empty(64, device=DEVICE)
        _chunk_of[(1,)](out, x, 5, x.stride(0), 64, 3, CHUNK=64, EVEN=even)
        assert torch.equal(out, want), even


# an odd width is not packed: for bf16 that is bf16 arithmetic, which the interpreter gets wrong
# many rows: 300 on a GPU; in the interpreter, which runs the split path as 3 programs at about 0.2 s a row
# (packed forward), 30: 10 a program, well past the two rows that path loads ahead
MANY_ROWS = 300 if ON_GPU else 30
PACKED_SHAPES = [(6, 150), (8, 128), (3, 256), (MANY_ROWS, 40), (4, 151)]
PACKED_DTYPES = [torch.bfloat16, torch.float16]


def _runs_here(dtype, shape):
    if shape[1] % 2 and dtype == torch.bfloat16 and not ON_GPU:
        pytest.skip("bf16 arithmetic on odd widths: the interpreter's is wrong")


@pytest.mark.parametrize("path", PACKED_FORWARD_PATHS)
@pytest.mark.parametrize("dtype", PACKED_DTYPES)
@pytest.mark.parametrize("shape", PACKED_SHAPES)
def test_packed_forward(path, dtype, shape):
    """16-bit rows held as words of two columns (bf16 or fp16 pairs): within a rounding of torch's fp32
    softmax, in windows of larger buffers (nothing outside written), with chunks and rows of -inf (0 and NaN
    as torch gives), and in place."""
    _runs_here(dtype, shape)
    n_rows, n_cols = shape
    x_buffer = torch.full((n_rows + 2, n_cols + 40), float("nan"), dtype=dtype, device=DEVICE)
    x = x_buffer[:n_rows, :n_cols]
    x.copy_(randn(*shape, seed=3) * 4)
    x[1, :64] = -float("inf")
    x[2] = -float("inf")
    out_buffer = torch.full_like(x_buffer, 7.0)
    out = out_buffer[:n_rows, :n_cols]
    assert sm._forward(x, out, **PACKED_FORWARD_PATHS[path]) is out
    want = torch.softmax(x.float(), -1)
    torch.testing.assert_close(out.float(), want, atol=2**-9, rtol=2**-8, equal_nan=True)
    outside = torch.ones_like(out_buffer, dtype=torch.bool)
    outside[:n_rows, :n_cols] = False
    assert out_buffer[outside].float().eq(7.0).all()
    sm._forward(x, x, **PACKED_FORWARD_PATHS[path])  # in place: each chunk is read before it is written
    assert torch.equal(x.view(torch.int16), out.view(torch.int16))


@pytest.mark.parametrize("path", FORWARD_PATHS)
def test_large_inputs_lose_no_precision_in_16_bit(path):
    """Inputs near fp16's largest (|x| ~ 3e4): y from x - max, never from x * log2(e) minus a shift of the
    same size, which would cost the output a few ulp."""
    x = torch.full((4, 300), 30000.0, dtype=torch.float16, device=DEVICE)
    x[:, ::3] = 29999.0
    x[1, 5] = -30000.0
    want = torch.softmax(x.double(), -1)
    torch.testing.assert_close(forward(x, path).double(), want, atol=0, rtol=2**-11)  # fp16 rounding, half an ulp


@pytest.mark.parametrize("path", BACKWARD_PATHS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(6, 150), (8, 128), (3, 256)])  # ragged; tiles that cover the rows exactly
def test_backward_matches_autograd(path, dtype, shape):
    x = randn(*shape, dtype=dtype, seed=8).requires_grad_()
    dy = randn(*shape, dtype=dtype, seed=9)
    torch.softmax(x.float(), -1).backward(dy.float())
    y = softmax_ref(x.detach())
    dx = sm._backward(y, dy, **BACKWARD_PATHS[path])
    assert dx.dtype == dtype
    torch.testing.assert_close(dx.float(), x.grad.float(), atol=4 * softmax_atol(dtype), rtol=0)


@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_whose_stride_divides_by_less_than_their_width(path, dtype):
    """Width 200 divides by 8 (fp16's 16-byte vector), the row stride 204 by 4 only: the kernels take both in
    units of 4 (_unit), not 8."""
    x = randn(6, 204, dtype=dtype, seed=3)[:, :200]
    torch.testing.assert_close(forward(x, path).float(), torch.softmax(x.float(), -1), atol=softmax_atol(dtype), rtol=0)


@pytest.mark.parametrize("path", BACKWARD_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backward_of_rows_whose_stride_divides_by_less_than_their_width(path, dtype):
    y = torch.empty(6, 204, dtype=dtype, device=DEVICE)[:, :200]  # y and dy: rows 204 apart, as above
    y.copy_(softmax_ref(randn(6, 200, dtype=dtype, seed=3)))
    dy = randn(6, 204, dtype=dtype, seed=4)[:, :200]
    want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    torch.testing.assert_close(sm._backward(y, dy, **BACKWARD_PATHS[path]).float(), want,
                               atol=4 * softmax_atol(dtype), rtol=0)


@pytest.mark.parametrize("path", PACKED_PATHS)
@pytest.mark.parametrize("dtype", PACKED_DTYPES)
@pytest.mark.parametrize("shape", PACKED_SHAPES)
def test_packed_backward_matches_autograd(path, dtype, shape):
    """dx in bf16 or fp16: within an ulp of its format of autograd's fp32 gradient, of the dx's largest value
    (test_packed_outputs_round_as_torch_does checks the rounding itself); NaN where y or dy is NaN, inf in and
    NaN out as torch gives."""
    _runs_here(dtype, shape)
    x = randn(*shape, seed=8) * 4
    y = torch.softmax(x, -1).to(dtype)
    dy = randn(*shape, seed=9).to(dtype)
    want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    dx = sm._backward(y, dy, **PACKED_PATHS[path])
    assert dx.dtype == dtype
    ulp = 2**-8 if dtype == torch.bfloat16 else 2**-11
    torch.testing.assert_close(dx.float(), want, atol=ulp * want.abs().max().item(), rtol=ulp)
    dy[1, 3] = float("nan")
    dy[2, 0] = float("inf")
    want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(dtype)
    got = sm._backward(y, dy, **PACKED_PATHS[path])
    assert torch.equal(got[1:3].isnan(), want[1:3].isnan()) and got[1:3].isnan().any()


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
def test_packed_outputs_round_as_torch_does(dtype):
    """_pack (the GPU's cvt; in the interpreter integer arithmetic for bf16, numpy's conversion for fp16): ties
    to even, subnormals, the largest values, overflow and infinities exact; NaN stays NaN; the even column in
    the low half of its word."""
    x = torch.tensor([1.0, 1.00390625, 1.01171875, -1.00390625, 1.00048828125, 1.000732421875, -2.5e-39, 1e-45,
                      3e-8, 6.1e-5, 65504.0, 65520.0, 3.4e38, -3.4e38, float("inf"), -float("inf"), -0.0,
                      float("nan")] + randn(2000, seed=1).mul(1e3).tolist(), device=DEVICE)
    words = torch.empty(x.numel() // 2, dtype=torch.int32, device=DEVICE)
    pairs = sm._pair_format(dtype)
    _packed[(1,)](x, words, words.numel(), BLOCK=triton.next_power_of_2(words.numel()), PACKED=pairs)
    got = words.view(dtype)  # little-endian: word i holds columns 2i (low half) and 2i + 1
    want = x.to(dtype)
    finite = ~x.isnan()
    assert torch.equal(got[finite].view(torch.int16), want[finite].view(torch.int16))
    assert got[~finite].isnan().all()


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
@pytest.mark.parametrize("lanes", [1, 8, 64])
def test_packed_partials_lane_by_lane(lanes, dtype):
    """The packed forward's partials of a chunk, its max and its sum of exp(x - max), taken per lane and then
    combined (on a GPU a lane is a thread's columns; the forward's chunks there hold several a lane): as torch
    has them, with lanes and whole chunks of -inf (max -inf, sum 0)."""
    x = randn(8, 128, seed=6).mul(8).to(dtype)
    x[1, 0::16] = x[1, 1::16] = -float("inf")  # a lane's words (j, j + 8, ...) all -inf at 8 lanes, 8 lanes at 64
    x[3, 16:32] = -float("inf")  # a word in each of 8 lanes at 8 lanes, whole lanes at 64
    x[2] = -float("inf")
    part = torch.empty(8, 2, device=DEVICE)
    pairs = sm._pair_format(dtype)
    _chunk_partials[(8,)](x.view(torch.int32), part, CHUNK=64, LANES=lanes, PACKED=pairs)
    xf = x.float()
    m = xf.max(-1).values
    total = torch.exp(xf - torch.where(m.isinf(), 0, m)[:, None]).sum(-1)
    torch.testing.assert_close(part, torch.stack([m, total], -1), rtol=1e-5, atol=0)


@triton.jit
def _chunk_partials(x_ptr, part_ptr, CHUNK: tl.constexpr, LANES: tl.constexpr, PACKED: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * CHUNK + tl.arange(0, CHUNK))
    sm._publish(x, part_ptr + row * 2, part_ptr, 0, 1, 1, PACKED, LANES)  # one chunk a row, PHASE 1: no arrival


@triton.jit
def _packed(x_ptr, out_ptr, n, BLOCK: tl.constexpr, PACKED: tl.constexpr):
    i = tl.arange(0, BLOCK)
    even = tl.load(x_ptr + 2 * i, mask=i < n)
    odd = tl.load(x_ptr + 2 * i + 1, mask=i < n)
    tl.store(out_ptr + i, sm._pack(even, odd, PACKED), mask=i < n)


def test_autograd_gradcheck_style():
    """softmax(x) is differentiable: its gradient against torch's, and against finite differences."""
    x = randn(4, 33, seed=2).requires_grad_()
    dy = randn(4, 33, seed=3)
    softmax(x).backward(dy)
    ref = x.detach().clone().requires_grad_()
    torch.softmax(ref, -1).backward(dy)
    torch.testing.assert_close(x.grad, ref.grad, atol=1e-6, rtol=0)
    # central differences along a random direction v: (L(x + hv) - L(x - hv)) / 2h = <grad, v>
    v, h = randn(4, 33, seed=4), 1e-2
    with torch.no_grad():
        xd, vd, dyd = x.detach().double(), v.double(), dy.double()
        numeric = ((torch.softmax(xd + h * vd, -1) - torch.softmax(xd - h * vd, -1)) * dyd).sum() / (2 * h)
    assert abs(numeric.item() - (x.grad.double() * vd).sum().item()) < 1e-4
    # the public backward on plain tensors is the gradient autograd gave, bit for bit
    assert torch.equal(softmax_backward(softmax(x.detach()), dy), x.grad)


def test_column_offsets_past_int32_are_made_to_fit(monkeypatch):
    """The kernels compute column index x column stride in 32 bits: a tensor whose last column lies 2**31
    elements or more past its first runs contiguous, and an out= like that is written through a buffer (in
    place too). Forced here on small strided tensors by counting every strided one as too wide."""
    def meta(shape, stride):
        return torch.empty_strided(shape, stride, device="meta")

    assert not sm._columns_fit(meta((2, 2**27 + 4), (1, 16)))
    assert sm._columns_fit(meta((2, 2**27), (1, 16))) and sm._columns_fit(meta((2, 2**27 + 4), (2**31 + 5, 1)))
    monkeypatch.setattr(sm, "_columns_fit", lambda t: t.stride(1) == 1)
    strides = []  # the column strides of the tensors each kernel is handed

    def spy(kernel, tensors):
        class Launch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    strides.extend(a.stride(1) for a in args[:tensors])
                    return kernel[grid](*args, **kwargs)
                return launch
        return Launch()

    monkeypatch.setattr(sm, "_rows_forward", spy(sm._rows_forward, 2))
    monkeypatch.setattr(sm, "_rows_backward", spy(sm._rows_backward, 3))
    x = randn(6, 80, seed=11)[:, ::2]
    want = torch.softmax(x, -1)
    out = torch.empty(6, 80, device=x.device)[:, ::2]
    assert sm._forward(x, out) is out
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    inplace = x.clone().t().contiguous().t()  # column stride 6
    torch.testing.assert_close(sm._forward(inplace, inplace), want, atol=1e-6, rtol=0)
    dy = randn(6, 80, seed=12)[:, ::2]
    torch.testing.assert_close(sm._backward(want.t().contiguous().t(), dy),
                               torch._softmax_backward_data(dy, want, -1, torch.float32), atol=1e-6, rtol=0)
    assert strides == [1] * 7  # out and x twice, then dx, y and dy


def test_writeup_kernel_beside_the_improved_one():
    x = randn(3, 1500, seed=6)
    torch.testing.assert_close(softmax_writeup(x), softmax(x), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="grad"):
        softmax(x.requires_grad_(), out=torch.empty_like(x))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(5, 40000), (300, 131072), (7, 262144 + 3), (2, 2**20)] if ON_GPU else
                         [(3, 40000), (2, 262144 + 3), (1, 2**20)])  # the interpreter: seconds each
def test_wide_rows(shape, dtype):
    """The default configuration on rows that do not fit in one program: more rows than groups, odd widths
    (on the GPU one cooperative launch, in the interpreter the same kernels in two launches).
    Relative tolerances: each y of a row this wide is ~1e-5 or less, under any absolute one (zeros would pass);
    fp16's y there are subnormal (below 6.1e-5), so it is also allowed its subnormal spacing, 2^-24."""
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    x = randn(*shape, dtype=dtype, seed=7)
    torch.testing.assert_close(softmax(x).float(), torch.softmax(x.float(), -1), rtol=tol,
                               atol=2**-24 if dtype == torch.float16 else 0)
    dy = randn(*shape, dtype=dtype, seed=8)
    y = softmax_ref(x)
    ref = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
    torch.testing.assert_close(softmax_backward(y, dy).float(), ref, atol=10 * tol * ref.abs().max().item(), rtol=0)
