"""Vector add: exact equality with x + y (claim 1), what the mask prevents (claim 14), sizes past 2**31
elements (claim 20), and bandwidth against torch.add."""
from __future__ import annotations

import torch

from .. import isolated
from ..measure import BF16_IN_INTERPRETER, bench, device, is_gpu, probe_rows, randn, runnable, timing_rows
from ..table import needs_gpu, row
from . import experiment



def _kernels() -> dict:
    """provider -> kernel: the writeup's as printed, and the project's (64-bit offsets where a size needs them)."""
    from kernels import vector_add, vector_add_writeup

    return {"triton_writeup": vector_add_writeup, "triton": vector_add}


def _inputs(shape, dtype_name, seed):
    if dtype_name == "int32":
        x = randn(shape, "float32", seed, 1000).to(torch.int32)
        return x, randn(shape, "float32", seed + 1, 1000).to(torch.int32)
    return randn(shape, dtype_name, seed), randn(shape, dtype_name, seed + 1)


@experiment()
def correctness(s: dict) -> list[dict]:
    from kernels import vector_add_ref

    rows = []
    for provider, kernel in _kernels().items():
        for dtype_name in s["dtypes"]:
            for shape in [[n] for n in s["sizes"]] + s["shapes"]:
                params = dict(provider=provider, dtype=dtype_name, shape=str(tuple(shape)),
                              size=int(torch.Size(shape).numel()))
                if not runnable(dtype_name):
                    rows.append(row("exact_match", None, status="needs_gpu", error=BF16_IN_INTERPRETER, **params))
                    continue
                x, y = _inputs(shape, dtype_name, s["seed"])
                out = kernel(x, y)
                ref = vector_add_ref(x, y)
                rows.append(row("exact_match", torch.equal(out, ref), "bool", **params))
                rows.append(row("max_abs_diff", (out.double() - ref.double()).abs().max().item(), **params))
    return rows


@experiment()
def limits(s: dict) -> list[dict]:
    """Past 2**31 elements (GPU only): each kernel in its own process, since a fault poisons the CUDA
    context of the process that made it."""
    rows = []
    for provider in _kernels():
        params = dict(provider=provider, size=s["size"], dtype=s["dtype"])
        if not is_gpu():
            rows.append(needs_gpu(f"{s['size']} elements (GPU memory)", **params))
            continue
        rows += probe_rows(isolated.call(_probe, provider, s["size"], s["dtype"], s["seed"]), **params)
    return rows


def _probe(provider: str, n: int, dtype_name: str, seed: int) -> dict:
    x, y = _inputs([n], dtype_name, seed)
    out = _kernels()[provider](x, y)
    torch.cuda.synchronize()
    return {"exact_match": torch.equal(out, x + y)}


GUARD = {"x": 1.0, "y": 2.0, "out": -7.0}  # what lies past the end of each tensor


@experiment()
def mask(s: dict) -> list[dict]:
    """Each of x, y, out is a view of n elements into a longer buffer whose tail holds a known guard value.
    An element of out's tail that changed was written past the end; if it now holds x's guard + y's guard,
    the kernel also read past the end of x and y."""
    from kernels import vector_add, vector_add_unmasked

    rows, block = [], s["block_size"]
    for n in s["sizes"]:
        room = -(-n // block) * block
        for variant in ("masked", "unmasked"):
            buffers = {k: torch.full([room + block], v, device=device()) for k, v in GUARD.items()}
            x, y, out = (buffers[k][:n] for k in ("x", "y", "out"))
            x.copy_(randn([n], "float32", s["seed"]))
            y.copy_(randn([n], "float32", s["seed"] + 1))
            if variant == "masked":
                out.copy_(vector_add(x, y, block_size=block))
            else:
                vector_add_unmasked(x, y, out, block_size=block)
            tail = buffers["out"][n:]
            changed = tail != GUARD["out"]
            params = dict(variant=variant, size=n, block_size=block, dtype="float32", expected_past_end=room - n)
            rows += [row("elements_written_past_end", int(changed.sum()), "elements", **params),
                     row("read_past_end", bool(changed.any()) and bool((tail[changed] == GUARD["x"] + GUARD["y"]).all()),
                         "bool", **params),
                     row("in_bounds_exact", torch.equal(out, x + y), "bool", **params)]
    return rows


@experiment(timing=True)
def performance(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("timing vector_add")]
    rows = []
    for log2 in range(s["log2_sizes"][0], s["log2_sizes"][1] + 1, s["log2_step"]):
        n = 2**log2
        x, y = _inputs([n], s["dtype"], s["seed"])
        gbytes = 3 * n * x.element_size() / 1e9  # read x, read y, write out
        peers = {provider: (lambda f=kernel: f(x, y)) for provider, kernel in _kernels().items()}
        for provider, fn in {**peers, "torch": lambda: torch.add(x, y)}.items():
            rows += timing_rows(bench(fn, **s["bench"]), gbytes, "GB", provider=provider,
                                size=n, dtype=s["dtype"], bytes=gbytes * 1e9)
    return rows
