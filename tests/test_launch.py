"""The host's launch paths, on any machine: the direct launch (kernels/_launch.py) with a stand-in kernel,
and softmax's one place for its sizes (launch_settings), with its cap."""
import dataclasses

import pytest
import torch

from kernels import _launch
from kernels import _softmax as sm


class FakeCompiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args, stream: self.log.append(("direct", grid, args, stream))


class FakeKernel:
    """Stands in for a @triton.jit function: kernel[grid](...) records the call and returns a 'compiled' one."""
    arg_names = ["x_ptr", "n", "BLOCK", "EVEN"]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeCompiled(self.log)
        return run


@pytest.fixture
def direct(monkeypatch):
    """The direct path as on a GPU with a tested Triton."""
    monkeypatch.setattr(_launch.backend, "current", lambda: "gpu")
    monkeypatch.setattr(_launch.triton, "__version__", _launch.TESTED[0] + ".0")
    monkeypatch.setattr(_launch, "_device", lambda: 0)
    monkeypatch.setattr(_launch, "_stream", lambda device: 1234)
    monkeypatch.delenv(_launch.ENV, raising=False)
    return FakeKernel()


def test_a_repeated_call_launches_the_compiled_kernel_with_constexprs_in_the_kernels_order(direct):
    launch = _launch.DirectLaunch(direct)
    x = torch.zeros(64)
    for _ in range(2):
        launch(4, (x,), (64,), dict(EVEN=True, BLOCK=16, num_warps=4))
    assert [e[0] for e in direct.log] == ["jit", "direct"]
    assert direct.log[1] == ("direct", (4, 1, 1), (x, 64, 16, True), 1234)  # BLOCK before EVEN: arg_names' order


def test_another_specialization_goes_through_triton_again(direct):
    launch = _launch.DirectLaunch(direct)
    x = torch.zeros(64)
    launch(4, (x,), (64,), dict(BLOCK=16, EVEN=True))
    launch(4, (x,), (65,), dict(BLOCK=16, EVEN=True))  # an integer's value is part of Triton's key
    launch(4, (x.half(),), (64,), dict(BLOCK=16, EVEN=True))  # so is a dtype
    launch(4, (x,), (64,), dict(BLOCK=16, EVEN=True, num_warps=8))  # and a launch option
    launch(4, (x[1:],), (63,), dict(BLOCK=16, EVEN=True))  # a pointer not 16-byte aligned: never cached
    launch(4, (x[1:],), (63,), dict(BLOCK=16, EVEN=True))
    assert [e[0] for e in direct.log] == ["jit"] * 6


def test_the_cache_is_bounded_least_recently_used_first(direct):
    launch = _launch.DirectLaunch(direct, maxsize=2)
    x = torch.zeros(64)
    for n in (1, 2, 1, 3):  # 2 is the least recently used when 3 arrives
        launch(1, (x,), (n,), dict(BLOCK=16, EVEN=True))
    assert len(launch) == 2
    direct.log.clear()
    for n in (1, 3, 2):
        launch(1, (x,), (n,), dict(BLOCK=16, EVEN=True))
    assert [e[0] for e in direct.log] == ["direct", "direct", "jit"]
    with pytest.raises(ValueError, match="maxsize"):
        _launch.DirectLaunch(direct, maxsize=0)


@pytest.mark.parametrize("off", ["switch", "version", "backend"])
def test_off_switch_untested_triton_or_no_gpu_always_go_through_triton(direct, monkeypatch, off):
    if off == "switch":
        monkeypatch.setenv(_launch.ENV, "0")
    elif off == "version":
        monkeypatch.setattr(_launch.triton, "__version__", "99.1.0")
    else:
        monkeypatch.setattr(_launch.backend, "current", lambda: "interpreter")
    launch = _launch.DirectLaunch(direct)
    for _ in range(3):
        launch(1, (torch.zeros(8),), (8,), dict(BLOCK=16, EVEN=True))
    assert [e[0] for e in direct.log] == ["jit"] * 3 and len(launch) == 0


@pytest.mark.parametrize("n_cols, split", [(1, False), (2000, False), (32768, False), (32769, True), (2**20, True)])
def test_softmax_sizes_come_from_one_place(n_cols, split):
    cfg = sm.launch_settings(n_cols, 4)
    assert cfg.split == split
    if not split:
        assert cfg.block_n == 1 << (n_cols - 1).bit_length() and cfg.block_m * cfg.block_n >= cfg.block_n
        assert cfg.block_m == max(1, sm.TILE_BYTES // 4 // cfg.block_n)
    else:  # past the rows path, the first entry of the WIDE table that matches
        expected = (65536, 32768, 32) if n_cols <= 65536 else (0, 4096, 4)  # fp32 rows to 256 KiB: two-pass
        assert (cfg.segment, cfg.chunk, cfg.num_warps) == expected
    back = sm.launch_settings(n_cols, 4, backward=True)
    assert back.split == (n_cols > sm.BACKWARD_ROW_LIMIT)
    assert sm.launch_settings(n_cols, 4, warps=2).num_warps == 2  # an override wins
    forced = sm.launch_settings(n_cols + 1, 2, row_limit=1, segment=0)  # past a row limit of 1: the split path
    assert forced.split and forced.segment == 0


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("element_size", [2, 4])
@pytest.mark.parametrize("n_cols", [1001, 2049, 4001, 20001, 32767, 50257, 100003, 1000003])
def test_unaligned_rows_take_their_entry_in_the_one_place(n_cols, element_size, backward):
    """Rows that no 16-byte vector divides (unaligned=True: the caller saw the tensors) get the first UNALIGNED
    entry that matches: its sizes on the two-pass path (one segment a row where it says None), walked from the
    rows' 16-byte boundaries unless it says "plain", or, where it has none, the aligned rows' defaults; an
    override still replaces one default."""
    direction = "backward" if backward else "forward"
    sizes = next(sizes for d, es, widest, sizes in sm.UNALIGNED
                 if d == direction and es == element_size and (widest is None or n_cols <= widest))
    cfg = sm.launch_settings(n_cols, element_size, backward, unaligned=True)
    if sizes is None:
        assert cfg == sm.launch_settings(n_cols, element_size, backward)
        return
    segment, chunk, warps, *form = sizes
    assert cfg.split and cfg.align == (form != ["plain"]) and not cfg.packed
    one_segment = max(sm.ONE_SEGMENT, 1 << (n_cols - 1).bit_length())  # at least the row
    assert (cfg.segment, cfg.chunk, cfg.num_warps) == (segment or one_segment, chunk, warps)
    assert sm.launch_settings(n_cols, element_size, backward, unaligned=True, warps=2) == dataclasses.replace(
        cfg, num_warps=2)


def test_softmax_rows_path_sizes():
    """The forward's rows path ends at ROW_LIMIT for fp32 and bf16 (its rows past PREFETCH_FROM columns
    prefetching: no other rows, and never the backward), at PREFETCH_FROM for fp16; the backward's warps
    and reload come from BACKWARD_ROWS, whose widths rise to the backward's rows limit; an override wins."""
    for element_size, bf16, limit in ((4, False, sm.ROW_LIMIT), (2, True, sm.ROW_LIMIT), (2, False, sm.PREFETCH_FROM)):
        assert not sm.launch_settings(limit, element_size, bf16=bf16).split
        assert sm.launch_settings(limit + 1, element_size, bf16=bf16).split
        for n_cols in (sm.PREFETCH_FROM, sm.PREFETCH_FROM + 1, sm.ROW_LIMIT):
            cfg = sm.launch_settings(n_cols, element_size, bf16=bf16)
            assert cfg.prefetch == (bf16 and n_cols > sm.PREFETCH_FROM)
            assert cfg.num_warps == (sm.PREFETCH_WARPS if cfg.prefetch else 16) or cfg.split
            assert not sm.launch_settings(n_cols, element_size, backward=True, bf16=bf16).prefetch
    assert sm.launch_settings(128, 4, prefetch=True).prefetch
    assert not sm.launch_settings(sm.ROW_LIMIT, 2, bf16=True, prefetch=False).prefetch
    widths = [w for w, *_ in sm.BACKWARD_ROWS]
    assert widths == sorted(widths) and widths[-1] == sm.BACKWARD_ROW_LIMIT
    for widest, fp32, half in sm.BACKWARD_ROWS:
        for element_size, (warps, reload) in ((4, fp32), (2, half)):
            cfg = sm.launch_settings(widest, element_size, backward=True)
            assert (cfg.num_warps, cfg.reload) == (warps, reload)
            assert sm.launch_settings(widest, element_size, backward=True, reload=not reload).reload == (not reload)
    assert not sm.launch_settings(4096, 4, reload=True).reload  # the forward never reloads


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("element_size, packed", [(2, None), (2, False), (4, None)])
def test_every_width_past_the_rows_path_has_an_entry_of_the_wide_table(element_size, packed, backward):
    """The WIDE table ends, for each direction and element size, in an entry for any width (16-bit rows: those
    that pack and those that do not); wider rows never go back to an earlier entry; a two-pass segment is
    never narrower than its chunk."""
    direction = "backward" if backward else "forward"
    entries = [sizes for d, size, _, sizes in sm.WIDE if (d, size) == (direction, element_size)]
    assert entries and [w for d, size, w, _ in sm.WIDE if (d, size) == (direction, element_size)][-1] is None
    chosen = []
    for n_cols in (32769, 65536, 65537, 131072, 262147, 2**20, sm.MAX_COLS):
        cfg = sm.launch_settings(n_cols, element_size, backward, packed=packed)
        assert cfg.split and cfg.segment >= 0 and (cfg.segment == 0 or cfg.segment >= cfg.chunk)
        form = ("packed",) if cfg.packed else ("ahead",) if cfg.ahead else ()
        chosen.append(entries.index((cfg.segment, cfg.chunk, cfg.num_warps, *form)))
    assert chosen == sorted(chosen)


def test_the_split_path_takes_its_form_from_the_wide_table_and_an_override_wins():
    """Each entry at its widest row gives its sizes and form: packed where it says "packed" (16-bit rows, bf16
    and fp16 alike, held in pairs; an entry after a packed one for the same widths is for rows told not to pack,
    or that cannot), a row ahead for the backward where it says "ahead" or packs; overrides win, packing only
    16-bit rows on the split path, and the forward never runs a row ahead by request (its split kernel always
    does)."""
    for i, (direction, size, widest, (segment, chunk, warps, *form)) in enumerate(sm.WIDE):
        backward = direction == "backward"
        n_cols = widest // size if widest else 2**20
        after_packed = any(e[:3] == (direction, size, widest) and e[3][3:] == ("packed",) for e in sm.WIDE[:i])
        for bf16 in (False, True) if size == 2 else (False,):
            cfg = sm.launch_settings(n_cols, size, backward, bf16=bf16, packed=False if after_packed else None)
            assert (cfg.segment, cfg.chunk, cfg.num_warps) == (segment, chunk, warps), (i, bf16)
            assert cfg.packed == (form == ["packed"])
            assert cfg.ahead == (backward and not segment and form in (["ahead"], ["packed"]))
            forced = sm.launch_settings(n_cols, size, backward, bf16=bf16, segment=0, ahead=not cfg.ahead,
                                        packed=True)
            assert forced.ahead == (backward and not cfg.ahead) and forced.packed == (size == 2)
            two_pass = sm.launch_settings(n_cols, size, backward, bf16=bf16, segment=1024, ahead=True, packed=True)
            assert not two_pass.packed and not two_pass.ahead
    for backward in (False, True):
        assert not sm.launch_settings(4096, 2, backward, bf16=True, packed=True).packed  # the rows path
        assert not sm.launch_settings(2**20, 4, backward, segment=0, packed=True).packed  # 4-byte rows
        # at 2^20 columns 16-bit rows pack, bf16 and fp16 alike; told not to, or given a segment, they take the
        # entry after
        packed = sm.launch_settings(2**20, 2, backward, bf16=True)
        assert packed.packed and packed == sm.launch_settings(2**20, 2, backward)
        unpacked = sm.launch_settings(2**20, 2, backward, packed=False)
        assert not unpacked.packed and not unpacked.ahead
        assert sm.launch_settings(2**20, 2, backward, bf16=True, packed=False) == unpacked
        assert sm.launch_settings(2**20, 2, backward, bf16=True, segment=65536) == sm.launch_settings(
            2**20, 2, backward, segment=65536)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backward", [False, True])
def test_rows_that_cannot_be_seen_as_words_take_the_unpacked_entry(backward, dtype):
    """16-bit rows pack where every tensor's rows are whole 32-bit words: not at an odd width, an odd row
    stride, a column stride or an address off 4 bytes; there they get the entry for rows that do not pack, or,
    rows of unit column strides that no 16-byte vector divides, the aligned walk (UNALIGNED)."""
    n = 2**20
    buffer = torch.empty(2 * n + 4, dtype=dtype)
    words = buffer[: 2 * n].view(2, n)
    assert sm._settings(n, (words, words), backward, {}).packed
    for rows in (buffer[: 2 * n + 2].view(2, n + 1), buffer[: 2 * n].view(n, 2).t(),
                 buffer[: 2 * n + 2].as_strided((2, n), (n + 1, 1))):
        cfg = sm._settings(rows.shape[1], (rows, rows), backward, {})
        assert not cfg.packed and cfg.align == (rows.stride(1) == 1)
        assert cfg.align or cfg == sm.launch_settings(rows.shape[1], 2, backward, packed=False)
    off = buffer[1: 2 * n + 1].view(2, n)  # 2 bytes past a word: one such tensor is enough
    assert sm._settings(n, (words, off), backward, {}) == sm.launch_settings(n, 2, backward, packed=False)
    # an odd storage offset on a word-aligned address (storage 2 bytes off): torch refuses its int32 view
    shifted = torch.frombuffer(bytearray(4 * n + 8), dtype=dtype, offset=2)[1: 2 * n + 1].view(2, n)
    assert shifted.data_ptr() % 4 == 0 and shifted.storage_offset() % 2 == 1
    assert not sm._settings(n, (shifted, shifted), backward, {}).packed


@pytest.mark.parametrize(("rows", "unit"), [
    (lambda: torch.empty(4, 1000), 4),  # a 16-byte vector of fp32: no larger unit
    (lambda: torch.empty(4, 1000, dtype=torch.bfloat16), 8),
    (lambda: torch.empty(4, 3000, dtype=torch.float16), 8),
    (lambda: torch.empty(4, 2048), 4),
    (lambda: torch.empty(4, 1002), 2),
    (lambda: torch.empty(4, 1001), 1),
    (lambda: torch.empty(4001)[1:].view(4, 1000), 1),  # a start 4 bytes past a 16-byte boundary
    (lambda: torch.empty(8008, dtype=torch.bfloat16)[8:].view(4, 2000), 8),  # 16 bytes past: aligned
    (lambda: torch.empty(4, 1010)[:, :1000], 2),  # the row stride divides by less than the width
    (lambda: torch.empty(4, 2000)[:, ::2], 1),  # columns apart: no vector loads at all
    (lambda: torch.empty(1000, 4).t(), 1),
    (lambda: torch.empty_strided((2, 1000), (2**31 + 8, 1), device="meta"), 1),  # the stride goes as int64
    (lambda: torch.empty_strided((2, 1000), (2**31, 1), device="meta"), 1),  # from 2^31 on, not past it
])
def test_the_kernels_take_width_and_strides_in_the_largest_unit_dividing_them(rows, unit):
    """Rows of 1000, 3000 or 65000 columns load in vectors only if the kernel knows their starts are 16-byte
    aligned: Triton knows an argument divisible by 16, so the width and row strides go divided by a unit (_unit)."""
    x = rows()
    assert sm._unit(x.shape[1], x, torch.empty(x.shape, dtype=x.dtype)) == unit


@pytest.mark.parametrize(("n_cols", "offset", "vector"), [
    (65536, 0, 8), (50257, 0, 1), (65002, 0, 2), (65536, 1, 1),  # bf16: 8 columns in 16 bytes
])
def test_a_thread_holds_no_more_adjacent_columns_than_triton_loads_at_once(n_cols, offset, vector, monkeypatch):
    """Where Triton loads a row a column (or a pair) at a time, a thread of the split and two-pass forwards holds
    that many columns, not a 16-byte vector: a warp's load then reads adjacent columns rather than one column of
    each thread's 16 bytes."""
    launches = []
    monkeypatch.setattr(sm, "_split_launch", lambda kernel, arguments, n_rows, n_cols, cfg, width, **flags:
                        launches.append((cfg, flags)))
    x = torch.empty(2 * n_cols + offset, dtype=torch.bfloat16)[offset:].view(2, n_cols)
    for segment in (0, 32768):  # the split forward (unpacked), then the two-pass forward
        sm._forward(x, torch.empty_like(x), segment=segment, packed=False, chunk=4096, warps=4)
    (_, split), (_, two_pass) = launches
    assert split["LANES"] == two_pass["LANES"] == vector * 32 * 4 and two_pass["VEC"] == vector
    assert split["UNIT"] == two_pass["UNIT"] == vector


@pytest.mark.parametrize("n_cols", [0, sm.MAX_COLS + 1])
def test_softmax_refuses_a_width_past_its_cap_naming_it(n_cols):
    with pytest.raises(ValueError, match=rf"n_cols must be 1\.\.{sm.MAX_COLS} .* got {n_cols}"):
        sm.launch_settings(n_cols, 4)


def test_a_prepared_launch_makes_its_grids_launcher_once_and_reuses_it(direct, monkeypatch):
    made = []
    monkeypatch.setattr(FakeCompiled, "__getitem__", lambda self, grid: made.append(grid) or (
        lambda *args, stream: self.log.append(("direct", grid, args, stream))))
    prepared = _launch.DirectLaunch(direct).prepare(4, (64,), dict(EVEN=True, BLOCK=16, num_warps=4))
    x = torch.zeros(64)
    for _ in range(3):
        prepared(x)
    assert [e[0] for e in direct.log] == ["jit", "direct", "direct"] and made == [(4, 1, 1)]
    assert direct.log[2] == ("direct", (4, 1, 1), (x, 64, 16, True), 1234)
    prepared(x[1:])  # a pointer not 16-byte aligned: Triton specializes it otherwise
    monkeypatch.setenv(_launch.ENV, "0")
    prepared(x)  # switched off: Triton every time
    monkeypatch.delenv(_launch.ENV)
    monkeypatch.setattr(_launch, "_device", lambda: 1)
    prepared(x)  # another current device: Triton (its compiled kernel is per device)
    assert [e[0] for e in direct.log[3:]] == ["jit", "jit", "jit"]


class FakeLauncher:
    """Stands in for triton 3.6's CudaLauncher: its compiled launch function records its arguments."""
    launch_cooperative_grid, launch_pdl, profile_scratch_size = False, True, 0

    def __init__(self, log, scratch):
        self.global_scratch_size = scratch
        self.launch = lambda *args: log.append(("launcher", args))


@pytest.mark.parametrize("scratch", [0, 128])
def test_a_prepared_launch_calls_the_compiled_launcher_itself_unless_a_hook_or_scratch_needs_triton(
        direct, monkeypatch, scratch):
    monkeypatch.setattr(FakeCompiled, "run", property(lambda self: FakeLauncher(self.log, scratch)), raising=False)
    monkeypatch.setattr(FakeCompiled, "function", 77, raising=False)
    monkeypatch.setattr(FakeCompiled, "packed_metadata", (4, 1, 0), raising=False)
    prepared = _launch.DirectLaunch(direct).prepare(4, (64,), dict(EVEN=True, BLOCK=16, num_warps=4))
    x = torch.zeros(64)
    prepared(x)
    prepared(x)
    if scratch:  # Triton's runner allocates the scratch memory
        assert direct.log[1] == ("direct", (4, 1, 1), (x, 64, 16, True), 1234)
        return
    assert direct.log[1] == ("launcher", (4, 1, 1, 1234, 77, False, True, None, None, (4, 1, 0), None, None, None,
                                          x, 64, 16, True))
    hook = lambda metadata: None  # noqa: E731
    _launch.triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        prepared(x)  # a profiler's hook registered: through Triton's runner, which calls it
    finally:
        _launch.triton.knobs.runtime.launch_enter_hook.remove(hook)
    prepared(x)
    assert [e[0] for e in direct.log[2:]] == ["direct", "launcher"]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_every_kernel_runs_on_the_gpu_of_its_tensors_not_the_current_one():
    """Triton launches on the current device: tensors on cuda:1 while cuda:0 is current must still be
    computed on cuda:1 (kernels._launch.serialized switches), forward and backward."""
    import kernels
    from kernels import flash_attention_ref

    torch.cuda.set_device(0)
    x, y = (torch.randn(1000, 300, device="cuda:1") for _ in range(2))
    torch.testing.assert_close(kernels.vector_add(x, y), x + y)
    torch.testing.assert_close(kernels.softmax(x), torch.softmax(x, dim=1))
    torch.testing.assert_close(kernels.relu_dropout(x, 0.0, 0), torch.relu(x))
    q, k, v = (torch.randn(2, 3, 200, 64, device="cuda:1", dtype=torch.float16, requires_grad=True) for _ in range(3))
    out = kernels.flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    ref = flash_attention_ref(q, k, v, causal=True)
    want = torch.autograd.grad(ref, (q, k, v), torch.ones_like(ref))
    assert out.device == q.device and torch.cuda.current_device() == 0
    for got, exp in zip((out, *grads), (ref, *want)):
        torch.testing.assert_close(got.float(), exp.float(), atol=2e-2, rtol=0)
