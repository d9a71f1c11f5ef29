"""How FlashAttention chooses its tiles: per shape bucket, pinned, untuned, or from the cache file; and
flash_attention inside torch.compile. Runs anywhere (interpreter on a CPU)."""
import dataclasses
import json
import re

import pytest
import torch

from conftest import ON_GPU, randn
from kernels import _flash_tiles as ft
from kernels import flash_attention, flash_attention_ref, tiles_in_use
from kernels._flash_tiles import Tile

pytestmark = pytest.mark.usefixtures("fresh_tiles")  # each test: no choice made, no pin, its own empty cache


def qkv(sq=37, sk=70, d=32, dtype=torch.float32, grad=False):
    return [randn(1, 2, s, d, dtype=dtype, seed=i).requires_grad_(grad) for i, s in enumerate((sq, sk, sk))]


def test_tile_text_round_trips():
    assert Tile.parse("128x64/w8/s3") == Tile(128, 64, 8, 3)
    assert str(Tile(64, 32, 4, 2)) == "64x32/w4/s2"
    assert Tile(128, 64, 8, 3).kwargs == dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)


@pytest.mark.parametrize("text, words", [("128x64", "look like"), ("128x64/w8/s3 ", "look like"), (128, "look like"),
                                         ("96x64/w8/s3", "power of two"), ("128x64/w6/s3", "power of two"),
                                         ("8x64/w4/s3", ">= 16"), ("64x64/w4/s0", ">= 16")])
def test_bad_tile_text_is_refused(text, words):
    with pytest.raises(ValueError, match=words):
        Tile.parse(text, "fwd")


def test_lengths_share_a_bucket_up_to_the_next_power_of_two():
    assert [ft.bucket(n) for n in (1, 16, 17, 3000, 3001, 4096, 4097)] == [16, 16, 32, 4096, 4096, 4096, 8192]


def test_pinned_tile_runs_in_every_bucket_and_unpins():
    q, k, v = qkv()
    flash_attention.pin(fwd="16x16/w4/s1")
    out = flash_attention(q, k, v, causal=True)
    assert tiles_in_use()["fwd"] == "16x16/w4/s1"
    torch.testing.assert_close(out, flash_attention_ref(q, k, v, causal=True), atol=5e-3 if ON_GPU else 1e-4, rtol=0)
    flash_attention(*qkv(sq=300, sk=5), causal=True)  # another bucket: still pinned
    assert tiles_in_use()["fwd"] == "16x16/w4/s1"
    flash_attention.pin(fwd=None)
    flash_attention(q, k, v)
    assert tiles_in_use()["fwd"] != "16x16/w4/s1"


def test_pinned_backward_tiles_give_the_same_gradients():
    q, k, v = qkv(grad=True)
    do = randn(*q.shape, seed=5)
    expected = torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
    flash_attention.pin(bwd_dkdv="16x64/w4/s1", bwd_dq="64x16/w4/s1")
    got = torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
    assert tiles_in_use()["bwd_dkdv"] == "16x64/w4/s1" and tiles_in_use()["bwd_dq"] == "64x16/w4/s1"
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=5e-3 if ON_GPU else 1e-4, rtol=0)  # TF32 on the GPU


@pytest.mark.parametrize("kwargs, err, words", [(dict(bwd="64x64/w4/s2"), ValueError, "bwd_dkdv"),
                                                (dict(fwd="big"), ValueError, "fwd")])
def test_bad_pin_is_refused(kwargs, err, words):
    with pytest.raises(err, match=words):
        flash_attention.pin(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(fwd="64x64/w4/s1", bwd_dq="nonsense"), dict(fwd="64x64/w4/s1", bwd="64x64/w4/s1"),
                                    dict(fwd=None, bwd_dq="64x64/w3/s1")])
def test_a_refused_pin_pins_and_unpins_nothing(kwargs):
    flash_attention.pin(fwd="32x64/w4/s1")
    try:
        before = dict(ft._pinned)
        with pytest.raises(ValueError):
            flash_attention.pin(**kwargs)
        assert ft._pinned == before
    finally:
        flash_attention.pin()


@pytest.mark.parametrize("args, kwargs, err, words", [
    (("q",), {}, TypeError, "q must be a torch.Tensor"),
    ((), dict(backward="no"), TypeError, "backward must be a bool"),
    ((), dict(causal=1), TypeError, "causal must be a bool"),
])
def test_bad_tune_arguments_are_refused_naming_them(args, kwargs, err, words):
    q, k, v = qkv()
    with pytest.raises(err, match=words):
        flash_attention.tune(*(args or (q,)), k, v, **kwargs)
    ints = [t.detach().to(torch.int32) for t in (q, k, v)]
    with pytest.raises(TypeError, match="q has unsupported dtype"):
        flash_attention.tune(*ints)


CANDIDATES = [Tile(128, 64, 8, 3), Tile(64, 64, 4, 3), Tile(32, 32, 4, 1)]
KEY = ("fwd", torch.float16, 64, False, 4096, 4096)


@pytest.fixture
def gpu_free(monkeypatch):
    """choose()'s tuning path with the GPU parts replaced: a fixed device name, and a timer that reads
    each tile's time from a table, counting calls."""
    monkeypatch.setattr(ft, "_file_key", lambda: "a GPU | triton x")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    timed = []

    def fake_bench(fn, **kwargs):
        fn()
        return {"128x64/w8/s3": 2.0, "64x64/w4/s3": 1.0, "32x32/w4/s1": 3.0}[str(timed[-1])]

    monkeypatch.setattr(ft, "_graph_ms", fake_bench)
    return timed


def test_tuning_takes_the_fastest_tile_once_per_bucket_and_writes_it(gpu_free):
    tile = ft.choose(KEY, CANDIDATES, gpu_free.append)
    assert tile == Tile(64, 64, 4, 3) and len(gpu_free) == 3
    assert ft.choose(KEY, CANDIDATES, gpu_free.append) == tile and len(gpu_free) == 3  # remembered
    stored = json.loads(ft.cache_path().read_text())
    assert stored == {"a GPU | triton x": {"fwd|torch.float16|64|False|4096|4096": "64x64/w4/s3"}}
    assert ft.timings[KEY] == {"128x64/w8/s3": 2.0, "64x64/w4/s3": 1.0, "32x32/w4/s1": 3.0}


def test_a_new_process_reads_the_cache_file_instead_of_tuning(gpu_free):
    ft.choose(KEY, CANDIDATES, gpu_free.append)
    ft.forget()  # as a new process would start
    assert ft.choose(KEY, CANDIDATES, lambda tile: pytest.fail("tuned again")) == Tile(64, 64, 4, 3)


def test_a_cached_tile_no_longer_offered_is_tuned_again(gpu_free):
    ft.cache_path().write_text(json.dumps({"a GPU | triton x": {"fwd|torch.float16|64|False|4096|4096": "16x16/w1/s1"}}))
    assert ft.choose(KEY, CANDIDATES, gpu_free.append) == Tile(64, 64, 4, 3) and len(gpu_free) == 3


def test_tuning_first_waits_for_the_callers_stream(gpu_free, monkeypatch):
    """_graph_ms times on a new stream that does not wait for the caller's (the GPU test checks
    the effect): choose() synchronizes the caller's stream before the first timed run."""
    events = []

    class Stream:
        def synchronize(self):
            events.append("synchronize")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    ft.choose(KEY, CANDIDATES, lambda tile: (events.append("run"), gpu_free.append(tile)))
    assert events[:2] == ["synchronize", "run"] and events.count("run") == 3


def test_two_threads_never_tune_at_once(gpu_free):
    """choose() holds the kernels' lock: a tuning's timed runs never overlap another thread's."""
    import threading
    import time

    running, most = [0], [0]

    def run(tile):
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.01)
        gpu_free.append(tile)
        running[0] -= 1

    threads = [threading.Thread(target=ft.choose, args=(KEY[:-1] + (n,), CANDIDATES, run)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and len(gpu_free) == 9


def test_without_autotune_the_first_candidate_runs(gpu_free, monkeypatch):
    monkeypatch.setenv(ft.AUTOTUNE_ENV, "0")
    assert ft.choose(KEY, CANDIDATES, gpu_free.append) == CANDIDATES[0] and not gpu_free
    assert not ft.cache_path().exists()


@pytest.mark.parametrize("autotune", ["1", "0"])
def test_untimed_launches_every_candidate_once_and_remembers_nothing(gpu_free, monkeypatch, autotune):
    """What a compile-ahead process does (lab/ahead.py): every candidate launched once (so compiled), none
    timed, the first that fits taken, nothing remembered in the process or the cache file; the next choice
    outside untimed() tunes as before."""
    monkeypatch.setenv(ft.AUTOTUNE_ENV, autotune)
    monkeypatch.setattr(ft, "_graph_ms", lambda fn, **kw: pytest.fail("timed inside untimed()"))
    launched = []

    def run(tile):
        launched.append(tile)
        if tile == CANDIDATES[0]:
            raise ft.triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")

    with ft.untimed():
        assert ft.choose(KEY, CANDIDATES, run) == CANDIDATES[1]
        assert ft.choose(KEY, CANDIDATES, run) == CANDIDATES[1]
    assert launched == CANDIDATES * 2 and not ft.timings and not ft.cache_path().exists()
    assert ft._chosen.get(KEY) is None and not ft._untimed


def test_untimed_gives_way_to_a_pinned_tile(gpu_free):
    ft.pin(("fwd",), fwd="32x32/w4/s1")
    with ft.untimed():
        assert ft.choose(KEY, CANDIDATES, lambda tile: pytest.fail("launched a candidate")) == Tile(32, 32, 4, 1)


def test_the_performance_experiments_compile_ahead_case_chooses_every_kernels_tile_untimed(monkeypatch):
    """flash_attention/performance's compile-ahead cases (lab/ahead.py runs them in other processes on a GPU):
    the forward alone, or forward and backward, at each length, every choice made inside untimed()."""
    from kernels._flash_attention import WS_ENV
    from lab.units import flash_attention as unit

    monkeypatch.setenv(WS_ENV, "1")  # the case sets it; restored afterwards
    chosen, choose = [], ft.choose

    def spy(key, candidates, run):
        chosen.append((key[0], ft._untimed))
        return choose(key, candidates, run)

    monkeypatch.setattr(ft, "choose", spy)
    s = dict(lengths=[40, 70], plain_lengths=[70], tokens=140, heads=1, dtype="float32", seed=0)
    unit._build_tiles(s, 16, True, True, False)
    assert chosen and {kind for kind, _ in chosen} == {"fwd"}  # no gradients: the forward alone
    unit._build_tiles(s, 16, True, True, True)
    kinds = {kind for kind, _ in chosen}
    assert "fwd" in kinds and kinds & {"bwd_dkdv", "bwd_dq", "bwd_one_pass"}
    assert all(untimed for _, untimed in chosen) and len(chosen) >= 3 * len(s["lengths"])


def test_compiled_with_fullgraph_matches_eager():
    """torch.compile sees flash_attention as one custom op with a registered backward: no graph break,
    same output and gradients. (aot_eager here; the GPU test compiles with Inductor.)"""
    q, k, v = qkv(grad=True)
    do = randn(*q.shape, seed=5)
    eager = flash_attention(q, k, v, causal=True)
    eager_grads = torch.autograd.grad(eager, (q, k, v), do)
    compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True) * 2, fullgraph=True,
                             backend="aot_eager")
    out = compiled(q, k, v)
    torch.testing.assert_close(out, 2 * eager, atol=1e-6, rtol=0)
    for g, e in zip(torch.autograd.grad(out, (q, k, v), do), eager_grads):
        torch.testing.assert_close(g, 2 * e, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's tile; a GPU tunes")
def test_tune_ahead_reports_the_tiles_it_will_use():
    assert flash_attention.tune(*qkv(), causal=True) == {"fwd": "32x32/w4/s1", "bwd_dkdv": "32x32/w4/s1",
                                                         "bwd_dq": "32x32/w4/s1"}


def test_warp_specialized_tiles_are_candidates_only_where_the_tuning_rounds_kept_them():
    from kernels import _flash_attention as fa

    def ws(block_d, tma, kind="fwd"):
        return [t for t in fa.candidates(kind, block_d, 2, interpreter=False, tma=tma) if t.ws]

    for kind in ("fwd", "bwd_dkdv", "bwd_dq"):  # first: the untuned choice
        assert ws(128, True, kind)[0] == fa.candidates(kind, 128, 2, False, tma=True)[0]
        assert not ws(128, False, kind) and not ws(32, True, kind) and not ws(256, True, kind)
    assert ws(64, True, "fwd") and not ws(64, True, "bwd_dkdv") and not ws(64, True, "bwd_dq")  # they lost at 64
    assert not ws(128, True, "bwd_one_pass")
    assert not fa.candidates("fwd", 128, 2, interpreter=True, tma=True)[0].ws


def test_a_ws_tile_parses_prints_and_pins_only_for_the_kernels_that_have_one():
    from kernels import _flash_attention as fa

    tile = Tile.parse("128x128/w4/s2/ws")
    assert tile.ws and str(tile) == "128x128/w4/s2/ws" and tile != Tile.parse("128x128/w4/s2")
    with pytest.raises(ValueError, match="bwd_one_pass"):
        fa.pin(bwd_one_pass="128x64/w8/s3/ws")
    fa.pin(fwd="128x128/w4/s2/ws", bwd_dkdv="64x128/w4/s2/ws", bwd_dq="128x64/w4/s2/ws")
    fa.pin()


def test_a_masked_ws_tile_is_offered_beside_its_split_form_under_a_causal_mask_only():
    from kernels import _flash_attention as fa

    tile = Tile.parse("128x128/w4/s2/ws/masked")
    assert tile.ws and tile.masked and str(tile) == "128x128/w4/s2/ws/masked" and tile != Tile.parse("128x128/w4/s2/ws")
    with pytest.raises(ValueError, match="'/ws' tile"):
        Tile(64, 64, 4, 2, masked=True)
    for text in ("128x128/w4/s2/masked", "128x128/w4/s2/ws/mask"):
        with pytest.raises(ValueError, match="must look like"):
            Tile.parse(text)
    for kind in ("bwd_dq", "bwd_one_pass"):
        with pytest.raises(ValueError, match=kind):
            fa.pin(**{kind: "128x64/w4/s2/ws/masked"})
    for kind in fa.MASKED_KINDS:
        plain = fa.candidates(kind, 128, 2, interpreter=False, tma=True)
        causal = fa.candidates(kind, 128, 2, interpreter=False, tma=True, causal=True)
        assert not any(t.masked for t in plain) and plain == [t for t in causal if not t.masked]
        split_first = [(t, dataclasses.replace(t, masked=True)) for t in plain if t.ws]
        assert split_first and all(causal.index(s) + 1 == causal.index(m) for s, m in split_first), causal
    assert not any(t.masked for t in fa.candidates("bwd_dq", 128, 2, interpreter=False, tma=True, causal=True))
    assert not any(t.masked for t in fa.candidates("fwd", 128, 2, interpreter=False, tma=False, causal=True))


def test_tma_needs_hopper_half_precision_and_aligned_strides(monkeypatch):
    from kernels import _flash_attention as fa

    monkeypatch.setattr(fa.backend, "current", lambda: "gpu")
    monkeypatch.setattr(fa, "_hopper", lambda device: True)
    monkeypatch.setattr(fa, "_HAS_TMA", True)
    x = torch.zeros(2, 3, 40, 64, dtype=torch.bfloat16)
    assert fa._tma_ready(x, x)
    assert not fa._tma_ready(x.float())  # fp32
    assert not fa._tma_ready(torch.zeros(2, 3, 40, 60, dtype=x.dtype))  # rows 120 bytes apart
    assert not fa._tma_ready(x.transpose(-1, -2))  # head_dim not the unit stride
    assert not fa._tma_ready(torch.zeros(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape))  # base 2 bytes off


GARBAGE = {  # what a cache file may hold instead of {GPU: {bucket: tile}}
    "a JSON list": lambda path: path.write_text("[1, 2]"),
    "a JSON number": lambda path: path.write_text("3"),
    "a GPU entry that is a list": lambda path: path.write_text(json.dumps({"a GPU | triton x": ["64x64/w4/s3"]})),
    "a bad tile": lambda path: path.write_text(json.dumps({"a GPU | triton x": {"|".join(map(str, KEY)): "64x64"}})),
    "binary bytes": lambda path: path.write_bytes(bytes(range(256))),
    "JSON cut short": lambda path: path.write_text('{"a GPU | triton x": {"fwd'),
}


@pytest.mark.parametrize("garbage", GARBAGE)
def test_a_garbage_cache_file_is_named_ignored_and_rewritten(gpu_free, garbage):
    path = ft.cache_path()
    GARBAGE[garbage](path)
    with pytest.warns(RuntimeWarning, match=f"ignoring the FlashAttention tile cache {re.escape(str(path))}"):
        tile = ft.choose(KEY, CANDIDATES, gpu_free.append)
    assert tile == Tile(64, 64, 4, 3) and len(gpu_free) == 3  # tuned, as without a cache
    assert json.loads(path.read_text()) == {"a GPU | triton x": {"|".join(map(str, KEY)): "64x64/w4/s3"}}


def test_a_directory_in_place_of_the_cache_file_is_named_and_left_alone(gpu_free):
    path = ft.cache_path()
    path.mkdir()
    (path / "keep").write_text("a user's file")
    with pytest.warns(RuntimeWarning, match=re.escape(str(path))) as caught:
        assert ft.choose(KEY, CANDIDATES, gpu_free.append) == Tile(64, 64, 4, 3)
    assert any("could not write" in str(w.message) for w in caught)
    assert (path / "keep").read_text() == "a user's file" and [p.name for p in path.parent.iterdir()] == [path.name]
    assert ft.choose(KEY, CANDIDATES, gpu_free.append) == Tile(64, 64, 4, 3) and len(gpu_free) == 3  # remembered


def test_a_call_shaped_like_an_earlier_one_is_still_refused_where_its_arguments_are_bad():
    """A repeated call shape skips the checks (its plan says they passed): any argument that differs
    from the planned call must be checked again."""
    q, k, v = qkv()
    flash_attention(q, k, v)
    for bad, err in (((q, k, v, 1), TypeError), ((q, k, v, "no"), TypeError), ((q, k, v, False, -1.0), ValueError),
                     ((q, k.half(), v), TypeError), ((q, k, v[..., :16]), ValueError), ((q, k, v[:, :1]), ValueError),
                     ((q.cpu().numpy(), k, v), TypeError), ((q, k, v, False, True), TypeError)):
        with pytest.raises(err):
            flash_attention(*bad)
    torch.testing.assert_close(flash_attention(q, k, v, False, 0.5), flash_attention_ref(q, k, v, sm_scale=0.5),
                               atol=5e-3 if ON_GPU else 1e-4, rtol=0)  # another scale: another plan


def test_plans_keep_no_tensor_alive():
    import gc
    import weakref
    q, k, v = qkv(grad=True)
    flash_attention(q, k, v).sum().backward()
    flash_attention(q.detach(), k.detach(), v.detach())
    alive = [weakref.ref(t) for t in (q, k, v)]
    del q, k, v
    gc.collect()
    assert not any(r() for r in alive)
