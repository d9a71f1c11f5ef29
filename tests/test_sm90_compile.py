"""Compile the kernels for Hopper (sm_90) on this machine, GPU or not: catches GPU-only compile errors
and tiles that do not fit in shared memory before any GPU run."""
import pytest
import torch

from kernels import _flash_attention as fa
from lab.sm90 import shared_memory_bytes

HOPPER_SHARED_PER_BLOCK = 232448  # max shared memory per block (opt-in) on H100/H200
ELT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def arg_types(kernel: str, n_ptr: int, elt: str) -> dict:
    """Pointers first (the softmax statistics are fp32), then the scales as fp32, the rest i32."""
    names = [n for n in getattr(fa, kernel).arg_names if not n.isupper()]
    return {n: ("*fp32" if n in ("lse_ptr", "delta_ptr") else f"*{elt}") if i < n_ptr
            else ("fp32" if "scale" in n else "i32") for i, n in enumerate(names)}


@pytest.mark.parametrize("dtype, head_dim", [(torch.bfloat16, 128), (torch.float16, 64), (torch.float32, 256)])
@pytest.mark.parametrize("kernel, n_ptr, kind", [("_flash_fwd_kernel", 5, "fwd"), ("_flash_bwd_dkdv_kernel", 8, "bwd"),
                                                 ("_flash_bwd_dq_kernel", 7, "bwd")])
def test_flash_first_fitting_tile_compiles_and_fits(kernel, n_ptr, kind, dtype, head_dim):
    elt_size = torch.empty(0, dtype=dtype).element_size()
    tile = next(c for c in fa.tiles(kind, interpreter=False) if fa.fits(c, head_dim, elt_size))
    shared = shared_memory_bytes("kernels._flash_attention", kernel, arg_types(kernel, n_ptr, ELT[dtype]),
                                 dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, CAUSAL=True, **tile.kwargs),
                                 tile.num_warps, tile.num_stages)
    assert 0 < shared <= HOPPER_SHARED_PER_BLOCK


def test_writeup_attention_needs_more_shared_memory_as_n_k_grows():
    from lab.experiments.attention import hopper_shared_bytes

    small, large = (hopper_shared_bytes(n, 64, "float16") for n in (128, 512))
    assert large >= 3 * small  # K and the score tile grow linearly with n_k
