"""kernels/_dead_barriers.py: Triton's IR without the barriers it initializes and never uses, and nothing
else changed; compiled for sm_90, the warp-specialized kernels keep no such barrier."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernels._dead_barriers import without_dead_barriers

ROOT = Path(__file__).resolve().parents[1]

IR = """\
    %0 = ttg.local_alloc : () -> !ttg.memdesc<2x1xi64, #shared, #smem, mutable> loc(#loc)
    %1 = ttg.memdesc_index %0[%c0_i32] : !ttg.memdesc<2x1xi64, #shared, #smem, mutable> -> !ttg.memdesc<1xi64> loc(#loc)
    ttng.init_barrier %1, 1 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    %2 = ttg.local_alloc : () -> !ttg.memdesc<2x1xi64, #shared, #smem, mutable> loc(#loc)
    %3 = ttg.memdesc_index %2[%c0_i32] : !ttg.memdesc<2x1xi64, #shared, #smem, mutable> -> !ttg.memdesc<1xi64> loc(#loc)
    ttng.init_barrier %3, 1 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    %4 = ttg.local_alloc : () -> !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    ttng.init_barrier %4, 128 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    %5 = ttg.local_alloc : () -> !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    ttng.init_barrier %5, 1 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    ttng.inval_barrier %5 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    %6 = ttg.local_alloc : () -> !ttg.memdesc<3x128x64xbf16, #shared1, #smem, mutable> loc(#loc)
    %7 = ttg.local_alloc : () -> !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    ttng.init_barrier %7, 1 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    ttg.warp_specialize(%2, %4, %6)
    %8 = ttg.memdesc_index %0[%c1_i32] : !ttg.memdesc<2x1xi64, #shared, #smem, mutable> -> !ttg.memdesc<1xi64> loc(#loc)
    ttng.init_barrier %8, 1 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
    %70 = ttg.memdesc_index %7[%c0_i32] : !ttg.memdesc<1xi64, #shared, #smem, mutable> -> !ttg.memdesc<1xi64> loc(#loc)
    ttng.wait_barrier %70, %c0_i32 : !ttg.memdesc<1xi64, #shared, #smem, mutable> loc(#loc)
"""


def test_only_the_barriers_nothing_waits_on_or_arrives_at_are_deleted():
    """%0 (an array, both elements only initialized) and %5 (initialized and invalidated) are dead: deleted
    with every line that touches them. %2 and %4 go to the partitions, %7 is waited on (through %70, whose
    name %7 is a prefix of), %6 holds data: kept, as is every other line."""
    lines = IR.splitlines(keepends=True)
    dead = {0, 1, 2, 8, 9, 10, 15, 16}
    assert without_dead_barriers(IR) == "".join(line for i, line in enumerate(lines) if i not in dead)
    kept = "".join(line for i, line in enumerate(lines) if i not in dead)
    assert without_dead_barriers(kept) == kept  # nothing left to delete
    assert without_dead_barriers("") == ""


SNIPPET = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import _flash_attention as fa
from kernels._dead_barriers import override, without_dead_barriers
from test_sm90_compile import arg_types  # the kernels' argument types, as the sm_90 compile tests give them

def compiled(kernel, n_ptr, tile, consts, **options):
    fn = getattr(fa, kernel)
    types = arg_types(kernel, n_ptr, "bf16")
    src = ASTSource(fn, {n: types.get(n, "constexpr") for n in fn.arg_names},
                    constexprs=dict(consts, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=tile.warps, num_stages=tile.stages, **options))

out = []
cases = [("_flash_fwd_tma_kernel", 5, t, dict(HEAD_DIM=128, BLOCK_D=128, CAUSAL=False, STORE_LSE=True, EVEN_K=True,
                                              PARTIAL=False, FLAT=True, TILE_STAGES=fa.tile_stages(128, False)))
         for t in fa.candidates("fwd", 128, 2, interpreter=False, tma=True) if t.ws]
cases += [("_flash_bwd_tma_kernel", 9, t, dict(HEAD_DIM=128, BLOCK_D=128, CAUSAL=False, EVEN_Q=True, ADD_DQ=False,
                                               WS=True, PARTIAL=False, LONGEST_FIRST=False))
          for t in fa.candidates("bwd_dkdv", 128, 2, interpreter=False, tma=True) if t.ws]
cases += [("_flash_bwd_dq_tma_kernel", 7, t, dict(HEAD_DIM=128, BLOCK_D=128, EVEN_K=True, CAUSAL=causal,
                                                  LONGEST_FIRST=True))
          for t in fa.candidates("bwd_dq", 128, 2, interpreter=False, tma=True) if t.ws for causal in (False, True)]
for kernel, n_ptr, tile, consts in cases:
    first = compiled(kernel, n_ptr, tile, consts)
    path = override(first)
    final = compiled(kernel, n_ptr, tile, consts, ir_override=path) if path else first
    ttgir = final.asm["ttgir"]
    out.append(dict(kernel=f"{kernel} {tile}", overridden=bool(path), clean=without_dead_barriers(ttgir) == ttgir,
                    shared=[first.metadata.shared, final.metadata.shared],
                    inits=[first.asm["ptx"].count("mbarrier.init"), final.asm["ptx"].count("mbarrier.init")]))
print(json.dumps(out))
"""


def test_the_warp_specialized_kernels_compile_for_sm90_without_dead_barriers():
    """Each '/ws' kernel at head_dim 128, as its launcher compiles it: Triton's IR has dead barriers here
    (3.6 and 3.9 both); the kernel compiled from the edited IR has none, fewer barrier inits in its PTX and
    no more shared memory."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KERNELS_BACKEND="aot", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "workflow"), str(ROOT / "tests")]))
    done = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 4  # fwd, dK/dV, dQ, causal dQ
    for r in results:
        assert r["overridden"] and r["clean"], r
        assert r["shared"][1] <= r["shared"][0] and r["inits"][1] < r["inits"][0], r


class FakeKernel:
    """Stands in for a JIT kernel: warmup 'compiles' to the IR given, a launch records its options."""
    arg_names = ["x", "n", "BLOCK"]

    def __init__(self, ir: str):
        self.ir, self.warmups, self.launches = ir, 0, []

    def warmup(self, *args, grid, **consts):
        self.warmups += 1
        return SimpleNamespace(asm={"ttgir": self.ir})

    def __getitem__(self, grid):
        return lambda *args, **consts: self.launches.append(consts)


KEPT = without_dead_barriers(IR)


@pytest.mark.parametrize("ir, edited", [(IR, True), (KEPT, False), ("", False)], ids=["dead", "nothing-dead", "no-ir"])
def test_the_launcher_compiles_once_and_launches_with_the_edited_ir(ir, edited, monkeypatch, tmp_path):
    """On the GPU backend, each specialization is compiled once to read its IR; where it has dead barriers,
    every launch passes ir_override naming a file that holds the edited IR, else no override at all; a
    tensor of another dtype is another specialization, compiled (and read) once more."""
    import kernels._dead_barriers as db
    from kernels import _launch

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(db.backend, "current", lambda: "gpu")
    monkeypatch.setattr(db, "_device", lambda: 0)
    monkeypatch.setattr(db, "_written", {})
    monkeypatch.setattr(_launch, "enabled", lambda: False)  # through kernel[grid] each time
    kernel = FakeKernel(ir)
    launch = db.WithoutDeadBarriers(kernel).prepare(4, (7,), {"BLOCK": 16, "num_warps": 4})
    x = torch.zeros(8)
    launch(x)
    launch(x)
    assert kernel.warmups == 1 and len(kernel.launches) == 2
    launch(x.half())
    assert kernel.warmups == 2 and len(kernel.launches) == 3
    for consts in kernel.launches:
        assert consts["BLOCK"] == 16 and consts["num_warps"] == 4
        assert ("ir_override" in consts) == edited
        if edited:
            path = Path(consts["ir_override"])
            assert path.suffix == ".ttgir" and tmp_path in path.parents
            assert path.read_text() == KEPT != IR


def test_the_edit_and_so_the_warp_specialized_kernels_are_off_where_triton_would_not_use_it(monkeypatch):
    """TRITON_STORE_BINARY_ONLY (no IR kept) and TRITON_KERNEL_OVERRIDE (ir_override ignored) leave the
    dead barriers in: then flash_attention runs no warp-specialized kernel, whatever KERNELS_FLASH_WS says."""
    from kernels import _dead_barriers as db
    from kernels import _flash_attention as fa

    monkeypatch.setenv(fa.WS_ENV, "1")
    assert db.applies() and fa.warp_specialized()
    for name in ("TRITON_STORE_BINARY_ONLY", "TRITON_KERNEL_OVERRIDE"):
        monkeypatch.setenv(name, "1")
        assert not db.applies() and not fa.warp_specialized(), name
        monkeypatch.delenv(name)
    assert fa.warp_specialized()
