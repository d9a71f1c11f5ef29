"""Compile the kernels for Hopper (sm_90) on this machine, GPU or not: catches GPU-only compile errors
and tiles that do not fit in shared memory before any GPU run."""
import pytest
import torch

from kernels import _flash_attention as fa
from kernels._flash_tiles import bucket
from lab.sm90 import shared_memory_each

HOPPER_SHARED_PER_BLOCK = 232448  # max shared memory per block (opt-in) on H100/H200
# the forward that a backward follows; the dk/dv kernel with and without the one-pass backward's dQ
CONSTS = {"fwd": {"STORE_LSE": True, "WS_N": 0, "WS_M": 0},
          "bwd_dkdv": {"ADD_DQ": False, "DIAGONAL": False, "LONGEST_FIRST": False},
          "bwd_dq": {"LONGEST_FIRST": False}, "bwd_one_pass": {"ADD_DQ": True, "DIAGONAL": False, "LONGEST_FIRST": False}}
ELT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def arg_types(kernel: str, n_ptr: int, elt: str) -> dict:
    """Pointers first (the softmax statistics are fp32), then the scales as fp32, the rest i32."""
    names = [n for n in getattr(fa, kernel).arg_names if not n.isupper()]
    return {n: ("*fp32" if n in ("lse_ptr", "part_ptr", "delta_ptr", "dq_acc_ptr") else f"*{elt}") if i < n_ptr
            else ("fp32" if "scale" in n else "i32") for i, n in enumerate(names)}


def fit_request(kernel: str, types: dict, tile, consts: dict) -> dict:
    """shared_memory_each's request for ``kernels._flash_attention.<kernel>`` at this tile, built as a launch on
    16-divisible pointers and strides builds it (Triton then stages the loops' loads in shared memory: the most
    a launch takes), with the head-dim strides constant 1."""
    ones = {n: 1 for n in types if n.startswith("stride") and n.endswith("d")}
    aligned = [n for n, t in types.items() if n not in ones and n not in ("seq_q", "seq_k", "lpt_group") and t != "fp32"]
    return dict(module="kernels._flash_attention", kernel=kernel, num_warps=tile.warps, num_stages=tile.stages,
                arg_types={n: t for n, t in types.items() if n not in ones}, aligned=aligned,
                constexprs=dict(consts, **ones, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n))


def assert_all_fit(requests: dict[str, dict]) -> None:
    """label -> request: each compiles for sm_90 within Hopper's shared memory (one child process for all)."""
    assert requests, "nothing to check"
    for label, shared in zip(requests, shared_memory_each(list(requests.values()))):
        assert 0 < shared <= HOPPER_SHARED_PER_BLOCK, f"{label}: {shared} B"


def assert_each_fits(kernel: str, types: dict, tiles, consts: dict) -> None:
    assert_all_fit({f"{kernel} {t}": fit_request(kernel, types, t, consts) for t in tiles})


@pytest.mark.parametrize("dtype, head_dim", [(torch.bfloat16, 128), (torch.float16, 64), (torch.float32, 256),
                                             (torch.bfloat16, 8), (torch.float32, 3), (torch.float16, 48)])
def test_flash_first_fitting_tile_compiles_and_fits(dtype, head_dim):
    """The first candidate that fits is what runs untuned (correctness jobs, CUDA graph capture); a head dim
    that is not a power of two, or below tl.dot's 16, runs in the block above it, masked."""
    requests, block_d = {}, bucket(head_dim)
    for kernel, n_ptr, kind in (("_flash_fwd_kernel", 6, "fwd"), ("_flash_bwd_dkdv_kernel", 9, "bwd_dkdv"),
                                ("_flash_bwd_dq_kernel", 7, "bwd_dq"), ("_flash_bwd_dkdv_kernel", 9, "bwd_one_pass")):
        tile = fa.candidates(kind, block_d, torch.empty(0, dtype=dtype).element_size(), interpreter=False)[0]
        requests[f"{kind} {tile}"] = fit_request(kernel, arg_types(kernel, n_ptr, ELT[dtype]), tile,
                                                 dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=True, **CONSTS[kind]))
    assert_all_fit(requests)


@pytest.mark.parametrize("dtype, head_dim", [(torch.bfloat16, 128), (torch.bfloat16, 256), (torch.float32, 256)])
@pytest.mark.parametrize("kernel, n_ptr, kind", [("_flash_fwd_kernel", 6, "fwd"),
                                                 ("_flash_bwd_dkdv_kernel", 9, "bwd_dkdv"),
                                                 ("_flash_bwd_dq_kernel", 7, "bwd_dq"),
                                                 ("_flash_bwd_dkdv_kernel", 9, "bwd_one_pass")])
def test_every_candidate_tile_that_fits_by_estimate_really_fits(kernel, n_ptr, kind, dtype, head_dim):
    """fits() is an estimate; each pointer-kernel tile it admits must compile within Hopper's limit, at head
    dims 128 and 256 (the largest: a candidate that does not fit there runs untuned, first in the list, and
    fails at its launch)."""
    tiles = [t for t in fa.candidates(kind, head_dim, torch.empty(0, dtype=dtype).element_size(), interpreter=False)
             if not t.ws]
    assert_each_fits(kernel, arg_types(kernel, n_ptr, ELT[dtype]), tiles,
                     dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, CAUSAL=False, **CONSTS[kind]))


def test_writeup_attention_needs_more_shared_memory_as_n_k_grows():
    from lab.units.attention import hopper_shared_bytes

    small, large = (hopper_shared_bytes(n, 64, "float16") for n in (128, 512))
    assert large >= 3 * small  # K and the score tile grow linearly with n_k


@pytest.mark.parametrize("head_dim", fa.WS_HEAD_DIMS["fwd"])
@pytest.mark.parametrize("store_lse, even_k, causal, split", [(True, False, False, False), (False, True, False, False),
                                                            (False, True, True, True), (True, True, True, False)])
def test_the_warp_specialized_forward_compiles_within_hopper_shared_memory(store_lse, even_k, causal, split, head_dim):
    """Every '/ws' candidate at the head dims where they are offered, with and without the log-sum-exp
    and the tail mask, with descriptors over every head (FLAT) and per head; causal, the TMA kernel's
    part (PARTIAL) and the pointer kernel's at the diagonal, or ('/ws/masked') the TMA kernel alone, masked throughout."""
    tiles = [t for t in fa.candidates("fwd", head_dim, 2, interpreter=False, tma=True) if t.ws]
    assert tiles
    consts = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, CAUSAL=causal, STORE_LSE=store_lse)
    types = arg_types("_flash_fwd_tma_kernel", 5, "bf16")
    assert_all_fit({f"{t} FLAT={flat}": fit_request(
        "_flash_fwd_tma_kernel", types, t, dict(consts, EVEN_K=even_k, PARTIAL=split, FLAT=flat,
                                                TILE_STAGES=fa.tile_stages(head_dim, causal)))
        for t in tiles for flat in (True, False)})
    if split:
        for t in tiles:
            assert_each_fits("_flash_fwd_kernel", arg_types("_flash_fwd_kernel", 6, "bf16"), [fa.diagonal_fwd(t)],
                             dict(consts, WS_N=t.block_n, WS_M=t.block_m))


@pytest.mark.parametrize("dtype, head_dim", [(torch.bfloat16, 128), (torch.bfloat16, 256),  # 256: the estimate's edge
                                             (torch.bfloat16, 8)])  # 16-byte rows: TMA-ready, in a block of 16
def test_every_tile_of_the_tma_one_pass_backward_fits(dtype, head_dim):
    """The one-pass backward's TMA kernel buffers every stage and stages each fp32 dQ tile: fits(tma=True)
    must admit only tiles that compile within Hopper's limit."""
    block_d = bucket(head_dim)
    tiles = fa.candidates("bwd_one_pass", block_d, torch.empty(0, dtype=dtype).element_size(), interpreter=False, tma=True)
    assert_each_fits("_flash_bwd_tma_kernel", arg_types("_flash_bwd_tma_kernel", 9, ELT[dtype]), tiles,
                     dict(HEAD_DIM=head_dim, BLOCK_D=block_d, CAUSAL=True, EVEN_Q=False, ADD_DQ=True, WS=False,
                          PARTIAL=False, LONGEST_FIRST=True))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_warp_specialized_dkdv_tiles_compile_within_hopper_shared_memory(causal):
    """Every '/ws' dK/dV candidate at head_dim 128: the TMA kernel without the dQ reduce-add, its query
    loop warp-specialized, with and without the row mask (EVEN_Q); under a causal mask masked throughout
    ('/ws/masked') or over the tiles no mask cuts (PARTIAL: '/ws'), and then the pointer kernel over the
    others (DIAGONAL)."""
    tiles = [t for t in fa.candidates("bwd_dkdv", 128, 2, interpreter=False, tma=True) if t.ws]
    types = arg_types("_flash_bwd_tma_kernel", 9, "bf16")
    assert_all_fit({f"{t} EVEN_Q={even_q} PARTIAL={partial}": fit_request(
        "_flash_bwd_tma_kernel", types, t, dict(HEAD_DIM=128, BLOCK_D=128, CAUSAL=causal, EVEN_Q=even_q, ADD_DQ=False,
                                                WS=True, PARTIAL=partial, LONGEST_FIRST=True))
        for t in tiles for even_q in (False, True) for partial in ((False, True) if causal else (False,))})
    if causal:
        diagonal = [fa.Tile(t.block_m, t.block_n, *fa.DIAGONAL_DKDV) for t in tiles]
        assert_each_fits("_flash_bwd_dkdv_kernel", arg_types("_flash_bwd_dkdv_kernel", 9, "bf16"), diagonal,
                         dict(HEAD_DIM=128, BLOCK_D=128, CAUSAL=True, ADD_DQ=False, DIAGONAL=True, LONGEST_FIRST=False))


def test_the_warp_specialized_dq_tiles_compile_within_hopper_shared_memory():
    """Every '/ws' dQ candidate at head_dim 128, with and without the keys' mask (EVEN_K), and under a
    causal mask."""
    tiles = [t for t in fa.candidates("bwd_dq", 128, 2, interpreter=False, tma=True) if t.ws]
    types = arg_types("_flash_bwd_dq_tma_kernel", 7, "bf16")
    assert_all_fit({f"{t} EVEN_K={even_k} CAUSAL={causal}": fit_request(
        "_flash_bwd_dq_tma_kernel", types, t, dict(HEAD_DIM=128, BLOCK_D=128, EVEN_K=even_k, CAUSAL=causal,
                                                   LONGEST_FIRST=True))
        for t in tiles for even_k in (False, True) for causal in (False, True)})


def test_the_wide_softmax_kernels_compile_in_every_form():
    """Each entry of softmax's WIDE table, at its widest row (2^20 columns where it has no limit), compiles for
    sm_90 as it runs: forwards with the column masks (EVEN off) and without them (EVEN: chunks that cover the
    rows); split backwards a row at a time and a row ahead; a "packed" entry's split kernels packed in 32-bit
    words of bf16 or of fp16 pairs (rows that cannot be seen as words take the next entry)."""
    import triton

    from kernels import _softmax as sm

    requests = {}
    for entry, (direction, size, widest, (_, _, _, *entry_form)) in enumerate(sm.WIDE):
        n_cols = widest // size if widest else 2**20
        backward = direction == "backward"
        packs = entry_form == ["packed"]
        cfg = sm.launch_settings(n_cols, size, backward, bf16=size == 2, packed=None if packs else False)
        assert cfg.packed == packs, entry
        kernel = ("_two_pass_" if cfg.segment else "_split_") + direction
        launched, _ = sm._words(cfg)  # packed: two 16-bit columns a word, half the chunk
        elt = "fp32" if size == 4 else "bf16"
        tensors = ("dx_ptr", "y_ptr", "dy_ptr") if backward else ("out_ptr", "x_ptr")
        strides = ("y_row", "y_col", "dy_row", "dy_col", "dx_row", "dx_col") if backward else (
            "x_row", "x_col", "out_row", "out_col")
        pairs = [sm._pair_format(torch.bfloat16), sm._pair_format(torch.float16)] if cfg.packed else [0]
        vector = sm._vector(launched, size, 16)  # rows 16-byte aligned: a thread's whole 16-byte vector
        if backward and not cfg.segment:
            forms = [dict(AHEAD=ahead, PACKED=p) for ahead in (False, True) for p in pairs]
        elif backward:  # rows walked from their 16-byte boundaries too (ALIGN: a width of units of 1, say)
            forms = [dict(ALIGN=align, VEC=vector, UNIT=1 if align else vector) for align in (False, True)]
        elif cfg.segment:
            forms = [dict(EVEN=even, FAST=size == 2, LANES=sm._lanes(launched, size, vector), VEC=vector, ALIGN=False)
                     for even in (False, True)] + [dict(EVEN=False, FAST=size == 2, LANES=sm._lanes(launched, size, 16),
                                                        VEC=vector, ALIGN=True, UNIT=1)]
        else:
            forms = [dict(EVEN=even, PACKED=p, KEEP=False, LANES=sm._lanes(launched, size, vector))
                     for even in (False, True) for p in pairs]
        splits = triton.cdiv(n_cols, cfg.segment or cfg.chunk)
        types = dict(**dict.fromkeys(tensors, "*i32" if cfg.packed else f"*{elt}"), part_ptr="*fp32",
                     counter_ptr="*i32", **dict.fromkeys(("n_rows", "n_cols", *strides, "n_groups"), "i32"))
        consts = dict(CHUNK=launched.chunk, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), PHASE=0,
                      UNIT=vector,  # widths and strides in vectors
                      **(dict(SEGMENT=cfg.segment) if cfg.segment else {}))
        for form in forms:
            requests[f"entry {entry}: {kernel} {elt} {n_cols} {form}"] = dict(
                module="kernels._softmax", kernel=kernel, arg_types=types, constexprs=dict(consts, **form),
                num_warps=cfg.num_warps, num_stages=3)  # Triton's default, as _split_launch leaves it
    forms_of = {("forward", "split"): 2, ("forward", "two-pass"): 3, ("backward", "split"): 2, ("backward", "two-pass"): 2}
    assert len(requests) == sum(forms_of[d, "two-pass" if sizes[0] else "split"] * (2 if sizes[3:] == ("packed",) else 1)
                                for d, _, _, sizes in sm.WIDE)
    assert_all_fit(requests)


def test_the_aligned_walks_softmax_takes_by_default_compile():
    """Each sized entry of softmax's UNALIGNED table compiles for sm_90 as it runs: the two-pass kernel walking
    rows from their 16-byte boundaries (ALIGN; or a column at a time where the entry says "plain"), widths and
    strides in units of 1, in fp32 and bf16."""
    import triton

    from kernels import _softmax as sm

    requests = {}
    for direction, size, widest, sizes in sm.UNALIGNED:
        if not sizes:
            continue
        n_cols = (widest or 2**20) - 1
        cfg = sm._settings(n_cols, (torch.empty(2, n_cols, dtype=torch.float32 if size == 4 else torch.bfloat16),) * 3,
                           direction == "backward", {})
        plain = sizes[3:] == ("plain",)
        assert cfg.align != plain and (cfg.chunk, cfg.num_warps) == sizes[1:3], (direction, size, widest)
        backward, elt, vector = direction == "backward", "fp32" if size == 4 else "bf16", 1 if plain else 16 // size
        tensors = ("dx_ptr", "y_ptr", "dy_ptr") if backward else ("out_ptr", "x_ptr")
        rows = ("y_row", "dy_row", "dx_row") if backward else ("x_row", "out_row")
        splits = triton.cdiv(n_cols, cfg.segment)
        form = {} if backward else dict(EVEN=False, FAST=size == 2, LANES=sm._lanes(cfg, size, 16 if cfg.align else 1))
        requests[f"{direction} {elt} {n_cols}"] = dict(
            module="kernels._softmax", kernel=f"_two_pass_{direction}", num_warps=cfg.num_warps, num_stages=3,
            arg_types=dict(**dict.fromkeys(tensors, f"*{elt}"), part_ptr="*fp32", counter_ptr="*i32",
                           **dict.fromkeys(("n_rows", "n_cols", *rows, "n_groups"), "i32")),
            aligned=tensors,  # every start at a 16-byte boundary (_alike), the width and strides not
            constexprs=dict(SEGMENT=cfg.segment, CHUNK=cfg.chunk, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
                            PHASE=0, UNIT=1, VEC=vector, ALIGN=cfg.align, **{r.replace("row", "col"): 1 for r in rows},
                            **form))
    assert len(requests) == sum(1 for *_, sizes in sm.UNALIGNED if sizes)
    assert_all_fit(requests)
