"""Vector add: exact equality with x + y (claim 1), what the mask prevents (claim 14), sizes past 2**31
elements (claim 20), and bandwidth against torch.add."""
from __future__ import annotations

import torch
import yaml

from .. import isolated
from ..claims import NOT_REPRODUCED, NOT_SETTLED, REPRODUCED, bools, by_provider, skipped
from ..measure import BF16_IN_INTERPRETER, bench, device, is_gpu, probe_rows, randn, runnable, timing_rows
from ..providers import TORCH, TRITON, WRITEUP
from ..summary import needed, ok
from ..table import needs_gpu, row
from . import claim, experiment

RUNG = 1
SCHEMA = yaml.safe_load("""
correctness:
  sizes: {$ref: "#/$defs/sizes"}
  shapes: {type: array, items: {$ref: "#/$defs/shape"}, minItems: 1, uniqueItems: true}
  dtypes: {type: array, items: {type: string, enum: [float32, float16, bfloat16, int32]}, minItems: 1, uniqueItems: true}
mask:
  sizes: {$ref: "#/$defs/sizes"}
  block_size: {$ref: "#/$defs/block_size"}
limits:
  size: {$ref: "#/$defs/past_int32"}
  dtype: {$ref: "#/$defs/dtype"}
performance:  # 2**first .. 2**last elements
  log2_sizes: {$ref: "#/$defs/log2_range"}
  log2_step: {type: integer, minimum: 1, maximum: 30}
  dtype: {$ref: "#/$defs/dtype"}
""")
PROVIDERS = {WRITEUP: "`kernels.vector_add_writeup`, the writeup's add kernel as printed (int32 offsets)",
             TRITON: "`kernels.vector_add`: the writeup's kernel, variant `int64_offsets` (64-bit offsets where a size "
                     "needs them)",
             TORCH: "`torch.add`"}


def _kernels() -> dict:
    """provider -> kernel: the writeup's as printed, and the project's (64-bit offsets where a size needs them)."""
    from kernels import vector_add, vector_add_writeup

    return {WRITEUP: vector_add_writeup, TRITON: vector_add}


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


@experiment(alone=True)
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
        for provider, fn in {**peers, TORCH: lambda: torch.add(x, y)}.items():
            rows += timing_rows(bench(fn, **s["bench"]), gbytes, "GB", provider=provider,
                                size=n, dtype=s["dtype"], bytes=gbytes * 1e9)
    return rows


# --- claims it settles --------------------------------------------------------------------------------------

@claim(1, ['vector_add/correctness'])
def vector_add_exact(t, s):
    from kernels._vector_add import BLOCK_SIZE  # the block both kernels ran with

    d = t["vector_add/correctness"]
    parts, good, ragged = [], True, True
    for provider, g in by_provider(needed(d, "rows in vector_add/correctness")):
        exact = needed(bools(g, "exact_match"), f"exact_match rows of provider {provider!r}")
        sizes = sorted(ok(g, metric="exact_match")["size"].astype(int).unique())
        odd = [x for x in sizes if x % BLOCK_SIZE]
        good &= bool(exact.all())
        ragged &= bool(odd)
        parts.append(f"{provider}: bit-exact in {int(exact.sum())}/{len(exact)} cases, sizes {sizes[0]}..{sizes[-1]} "
                     f"incl. {', '.join(map(str, odd)) or 'none'} (not multiples of {BLOCK_SIZE}), "
                     f"dtypes {', '.join(sorted(ok(g)['dtype'].unique()))}")
    text = "; ".join(parts) + skipped(d)
    if not good:
        return text, NOT_REPRODUCED
    if not ragged:  # the claim is about the sizes a last, partial block must mask
        return text + f" - a kernel ran no size that is not a multiple of {BLOCK_SIZE}", NOT_SETTLED
    return text, REPRODUCED


@claim(14, ['vector_add/mask'])
def mask_needed(t, s):
    d = ok(t["vector_add/mask"])
    past = d[d["metric"] == "elements_written_past_end"].set_index(["variant", "size"])
    read = d[d["metric"] == "read_past_end"].set_index(["variant", "size"])["value"].astype(bool)
    inside = bools(d, "in_bounds_exact")
    un = past.loc["unmasked"]
    measured = (f"{d['backend'].iloc[0]}, block {int(d['block_size'].iloc[0])}: without the mask the last block wrote "
                + ", ".join(f"{int(r.value)} of {int(r.expected_past_end)} elements past the end at size {n}"
                            for n, r in un.iterrows())
                + f", and read past the end of x and y: {bool(read.loc['unmasked'].all())}; with the mask: "
                f"{int(past.loc['masked']['value'].sum())} written, read past the end: {bool(read.loc['masked'].any())}; "
                f"in-bounds results exact in both: {bool(inside.all())}")
    good = ((un["value"] == un["expected_past_end"]).all() and (un["expected_past_end"] > 0).any()
            and read.loc["unmasked"].all() and (past.loc["masked"]["value"] == 0).all() and not read.loc["masked"].any())
    return measured, REPRODUCED if good else NOT_REPRODUCED
