"""The writeup's attention kernel: correctness against SDPA (claim 9), at head dims that are not powers of
two (claim 18), the shared-memory wall (claims 10, 11) and its speed next to flash_attention and SDPA
where it runs."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F
import yaml

from .. import ahead, plots
from ..claims import FALSE_POINT_HOLDS, NEEDS_GPU, NOT_REPRODUCED, NUANCE, REPRODUCED, bools, by_provider, first_line, skipped
from ..measure import BF16_IN_INTERPRETER, bench, is_gpu, lengths, randn, runnable, sdpa_backend_of, timing_rows
from ..providers import FLASH, TRITON, WRITEUP
from ..report import md_table
from ..summary import median, needed, ok
from ..table import needs_gpu, row
from ..verify import attention_eps, max_abs_diff, within_fa_rule
from . import claim, experiment, figure, section

if TYPE_CHECKING:  # annotations only: pyplot is imported on first use (plots.libs)
    import matplotlib.pyplot as plt

RUNG = 4
SCHEMA = yaml.safe_load("""
correctness:
  shapes: {description: "[n_q, n_k, d]", type: array, items: {$ref: "#/$defs/triple"}, minItems: 1, uniqueItems: true}
  dtypes: {$ref: "#/$defs/dtypes"}
head_dims:
  n_q: {$ref: "#/$defs/size"}
  n_k: {$ref: "#/$defs/size"}
  head_dims: {type: array, items: {$ref: "#/$defs/head_dim"}, minItems: 1, uniqueItems: true}
  dtypes: {$ref: "#/$defs/dtypes"}
wall:
  n_q: {$ref: "#/$defs/size"}
  head_dims: {type: array, items: {$ref: "#/$defs/head_dim"}, minItems: 1, uniqueItems: true}
  dtypes: {$ref: "#/$defs/dtypes"}
  log2_n_k: {$ref: "#/$defs/log2_range"}
  compile_only:
    type: object
    additionalProperties: false
    required: [dtype, head_dim, n_k]
    properties:
      dtype: {$ref: "#/$defs/dtype"}
      head_dim: {$ref: "#/$defs/head_dim"}
      n_k: {$ref: "#/$defs/sizes"}
performance:
  lengths: {$ref: "#/$defs/sizes"}
  head_dim: {$ref: "#/$defs/head_dim"}
  dtype: {$ref: "#/$defs/dtype"}
""")
SDPA = "torch_sdpa"
PROVIDERS = {WRITEUP: "`kernels.attention_writeup`, the writeup's kernel as printed: all of K/V at once, row masks "
                      "only, BLOCK_Q=16, BLOCK_K=next_power_of_2(n_k), BLOCK_V=next_power_of_2(d). The writeup shows no "
                      "launcher: this one pads each tensor with BLOCK_V - d zeros so that reads past a row stay in "
                      "memory it owns",
             TRITON: "`kernels.attention`: the writeup's kernel, variant `head_dim_mask` (every load and store also "
                     "masked along d)",
             FLASH: "`kernels.flash_attention` (the flash_attention unit), timed beside it",
             SDPA: "`F.scaled_dot_product_attention`, default dispatch (column `sdpa_backend`: the kernels it ran)"}


def dot_precision(dtype_name: str) -> str:
    """What tl.dot computes in for these inputs on this backend."""
    if dtype_name == "float32":
        return "tf32 (Triton's GPU default)" if is_gpu() else "fp32 (interpreter)"
    return f"{dtype_name} inputs, fp32 accumulation"


def _kernels() -> dict:
    """provider -> kernel: the writeup's as printed, and with the head-dim mask."""
    from kernels import attention, attention_writeup

    return {WRITEUP: attention_writeup, TRITON: attention}


@experiment()
def correctness(s: dict) -> list[dict]:
    return _against_sdpa(s["shapes"], s["dtypes"], s["seed"])


@experiment()
def head_dims(s: dict) -> list[dict]:
    """The printed kernel masks rows only, and its head-dim block is next_power_of_2(d), at least 16: at
    every d it pads it reads the next row. Both kernels at each head dim, the same n_q and n_k."""
    return _against_sdpa([[s["n_q"], s["n_k"], d] for d in s["head_dims"]], s["dtypes"], s["seed"])


def _against_sdpa(shapes, dtypes, seed: int) -> list[dict]:
    """Each kernel at each (n_q, n_k, d) and dtype, judged by the FlashAttention rule against SDPA's error."""
    from kernels import attention_ref

    rows = []
    for provider, kernel in _kernels().items():
        for dtype_name in dtypes:
            eps = attention_eps(dtype_name, is_gpu())
            for n_q, n_k, d in shapes:
                params = dict(provider=provider, dtype=dtype_name, n_q=n_q, n_k=n_k, d=d,
                              dot_precision=dot_precision(dtype_name), eps=eps)
                if not runnable(dtype_name):
                    rows.append(row("max_abs_diff", None, status="needs_gpu", error=BF16_IN_INTERPRETER, **params))
                    continue
                q, k, v = (randn(sh, dtype_name, seed + i) for i, sh in enumerate(([n_q, d], [n_k, d], [n_k, d])))
                ref = attention_ref(q.double(), k.double(), v.double())
                out = kernel(q, k, v)
                sdpa = F.scaled_dot_product_attention(q[None], k[None], v[None])[0]  # torch at the same precision
                err, err_torch = max_abs_diff(out, ref), max_abs_diff(sdpa, ref)
                rows += [row("max_abs_diff", err, **params),
                         row("sdpa_max_abs_diff", err_torch, **params),
                         row("diff_vs_sdpa", max_abs_diff(out, sdpa), **params),
                         row("matches", within_fa_rule(err, err_torch, eps), "bool", **params)]
    return rows


def hopper_shared_bytes(n_k: int, d: int, dtype_name: str) -> int:
    """Shared memory the writeup's kernel needs on sm_90, by compiling it here (no GPU needed)."""
    from kernels import launch_config

    from ..sm90 import shared_memory_bytes

    ptr = {"float16": "*fp16", "float32": "*fp32", "bfloat16": "*bf16"}[dtype_name]
    types = dict(q_ptr=ptr, k_ptr=ptr, v_ptr=ptr, out_ptr=ptr, row_stride="i32", col_stride="i32",
                 n_rows="i32", n_cols="i32", scale="fp32")
    return shared_memory_bytes("kernels._attention", "attention_kernel", types, launch_config(n_k, d))


@experiment()
def wall(s: dict) -> list[dict]:
    """Grow n_k until the kernel no longer launches. The failure is the result: a row, not a crash."""
    if not is_gpu():
        return _wall_compiled(s["compile_only"])
    import triton

    limit = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())["max_shared_mem"]
    sweeps = [(dtype_name, d, limit) for dtype_name in s["dtypes"] for d in s["head_dims"]]
    ahead.compile_ahead(functools.partial(_sweep_until_wall, s), sweeps)  # a kernel per n_k: compiling is its time
    return [r for sweep in sweeps for r in _sweep_until_wall(s, *sweep)]


def _sweep_until_wall(s: dict, dtype_name: str, d: int, limit: int) -> list[dict]:
    from triton.runtime.errors import OutOfResources

    from kernels import attention_ref, attention_writeup, launch_config, shared_memory_required

    rows, eps = [], attention_eps(dtype_name, True)
    for n_k in lengths(s["log2_n_k"]):
        params = dict(provider=WRITEUP, dtype=dtype_name, d=d, n_k=n_k, n_q=s["n_q"],
                      block_k=launch_config(n_k, d)["BLOCK_K"], shared_limit=limit, eps=eps)
        q, k, v = (randn(shape, dtype_name, s["seed"] + i) for i, shape in enumerate(([s["n_q"], d], [n_k, d], [n_k, d])))
        try:
            out = attention_writeup(q, k, v)
            torch.cuda.synchronize()
        except OutOfResources as e:
            rows.append(row("shared_required", e.required, "bytes", status="out_of_resources", error=str(e), **params))
            return rows  # the wall: longer sequences only need more
        ref = attention_ref(q.double(), k.double(), v.double())
        err = max_abs_diff(out, ref)
        err_torch = max_abs_diff(F.scaled_dot_product_attention(q[None], k[None], v[None])[0], ref)
        rows += [row("max_abs_diff", err, **params), row("sdpa_max_abs_diff", err_torch, **params),
                 row("matches", within_fa_rule(err, err_torch, eps), "bool", **params),
                 row("shared_required", shared_memory_required(q, k, v), "bytes", **params)]
    return rows


def _wall_compiled(s: dict) -> list[dict]:
    from kernels import launch_config

    rows = []
    for n_k in s["n_k"]:
        params = dict(dtype=s["dtype"], d=s["head_dim"], n_k=n_k, block_k=launch_config(n_k, s["head_dim"])["BLOCK_K"],
                      target="sm_90")
        rows.append(row("shared_required", hopper_shared_bytes(n_k, s["head_dim"], s["dtype"]), "bytes",
                        status="compiled_only",
                        error="compiled for sm_90 on a CPU machine; whether it launches needs a GPU", **params))
    return rows


@experiment(timing=True)
def performance(s: dict) -> list[dict]:
    if not is_gpu():
        return [needs_gpu("timing attention")]
    from kernels import attention_writeup, flash_attention

    rows, d = [], s["head_dim"]
    for n in s["lengths"]:
        q, k, v = (randn([n, d], s["dtype"], s["seed"] + i) for i in range(3))
        tflop = 4 * n * n * d / 1e12  # two matmuls of n x n x d, 2 flops per multiply-add
        peers = ((WRITEUP, lambda: attention_writeup(q, k, v)),
                 (FLASH, lambda: flash_attention(q[None, None], k[None, None], v[None, None])),
                 (SDPA, lambda: F.scaled_dot_product_attention(q[None, None], k[None, None], v[None, None])))
        for provider, fn in peers:
            which = {"sdpa_backend": sdpa_backend_of(fn)} if provider == SDPA else {}
            rows += timing_rows(bench(fn, **s["bench"]), tflop, "TFLOP", provider=provider, n_q=n, n_k=n, d=d,
                                dtype=s["dtype"], **which)
    return rows


# --- claims it settles --------------------------------------------------------------------------------------

@claim(9, ['attention/correctness'])
def attention_shapes(t, s):
    d = t["attention/correctness"]
    printed = d[d["provider"] == WRITEUP]
    parts, good = [], True
    for n_q, n_k, dim in s["shapes"]:
        m = needed(ok(printed, metric="matches", n_q=n_q, n_k=n_k, d=dim),
                   f"matches rows of {WRITEUP!r} at Q({n_q},{dim})/K,V({n_k},{dim})")
        e = ok(printed, metric="diff_vs_sdpa", n_q=n_q, n_k=n_k, d=dim).set_index("dtype")["value"]
        good &= m["value"].astype(bool).all()
        parts.append(f"Q({n_q},{dim})/K,V({n_k},{dim}): " + ", ".join(
            f"{dt} max|triton - SDPA| {e[dt]:.1g} ({m[m['dtype'] == dt]['dot_precision'].iloc[0]})" for dt in e.index))
    allm = bools(d, "matches")
    parts.append(f"the kernel as printed and with the head-dim mask, all {len(allm)} shape x dtype cases (head dims "
                 f"{', '.join(str(int(x)) for x in sorted(ok(d)['d'].unique()))}) within the FlashAttention error rule: "
                 f"{bool(allm.all())}")
    return "; ".join(parts) + skipped(d), REPRODUCED if good and allm.all() else NOT_REPRODUCED


@claim(10, ['attention/wall'])
def attention_wall(t, s):
    """Said: past some length it breaks, 'not gracefully'. Graceful is an exception at launch with every
    output before it correct; not graceful, a wrong output before it (a crash fails the job, so the claim is
    not settled and names the error). Wrong outputs at a head dim the kernel pads (claim 18's bug, at every
    length) are said apart: they are not the wall's doing."""
    d = t["attention/wall"]
    if (d["status"] == "compiled_only").all():
        c = d.sort_values("n_k")
        bytes_at = ", ".join(f"n_k={int(r.n_k)}: {int(r.value)} B" for r in c.itertuples())
        return (f"compiled for sm_90 on this CPU machine (triton {d['triton'].iloc[0]}, {c['dtype'].iloc[0]}, "
                f"d={int(c['d'].iloc[0])}): shared memory grows with n_k - {bytes_at}; whether a launch fails needs a GPU",
                NEEDS_GPU)
    w = wall_summary(d)
    failed = w.dropna(subset=["first n_k that failed"])
    parts = [f"{r['dtype']} d={r['d']}: ran to n_k={r['longest n_k that ran']}, failed at n_k={r['first n_k that failed']} "
             f"(needs {r['shared memory required (B)']} B > {r['limit (B)']} B)" for _, r in failed.iterrows()]
    parts += [f"{r['dtype']} d={r['d']}: ran every n_k up to {r['longest n_k that ran']}, no wall in the sweep"
              for _, r in w[w["first n_k that failed"].isna()].iterrows()]
    matches = needed(bools(d, "matches"), "matches rows in attention/wall (outputs before the wall)")
    wrong = ok(d, metric="matches")[~matches.values]
    measured = (f"on {d['device'].iloc[0]} with triton {d['triton'].iloc[0]}: " + "; ".join(parts)
                + f"; outputs before the wall within the FlashAttention rule: {int(matches.sum())}/{len(matches)}")
    padded = _padded_dims(int(x) for x in d["d"].dropna().unique())
    if wrong["d"].isin(padded).any():
        measured += (f" (wrong at the padded head dims {sorted(padded & set(wrong['d'].astype(int)))}: claim 18's bug, "
                     "not the wall)")
        wrong = wrong[~wrong["d"].isin(padded)]
    if failed.empty:
        return measured, NOT_REPRODUCED
    walls = failed["first n_k that failed"]
    err = d[d["status"] == "out_of_resources"]["error"]
    measured += (f". The failure is an exception at launch (\"{first_line(err.iloc[0])}\"); "
                 + (f"the wall moves with head dim and dtype (n_k = {walls.min()}..{walls.max()})"
                    if walls.nunique() > 1 else f"the wall is at n_k = {walls.iloc[0]} in every case"))
    if len(wrong):
        return (measured + f" - not gracefully: wrong output at n_k = "
                f"{', '.join(str(int(n)) for n in sorted(wrong['n_k'].unique()))}"), REPRODUCED
    return (measured + " - it breaks, but gracefully: a clean OutOfResources at launch and correct output up to the "
            "wall, never a wrong result"), FALSE_POINT_HOLDS


def _padded_dims(dims) -> set[int]:
    """The head dims at which the kernels' head-dim block is wider than d: not a power of two, or below
    tl.dot's minimum block (kernels.launch_config)."""
    from kernels import launch_config

    return {d for d in dims if launch_config(1, d)["BLOCK_V"] != d}


@claim(18, ['attention/head_dims'])
def attention_head_dims(t, s):
    """Finding: the printed kernel (row masks only, a head-dim block of next_power_of_2(d), at least 16 for
    tl.dot) is wrong wherever that block is wider than d, and the head-dim mask fixes it."""
    gpu_only = int((t["attention/head_dims"]["status"] == "needs_gpu").sum())
    if ok(t["attention/head_dims"]).empty and gpu_only:
        return f"no head dim was run here: {gpu_only} cases need a GPU", NEEDS_GPU
    d = needed(ok(t["attention/head_dims"], metric="matches"), "matches rows in attention/head_dims")
    needed(d[d["provider"] == WRITEUP], f"matches rows of {WRITEUP!r} (the kernel as printed)")
    needed(d[d["provider"] != WRITEUP], f"matches rows of a kernel besides {WRITEUP!r} (the fix)")
    errors = ok(t["attention/head_dims"], metric="max_abs_diff")
    parts, printed_wrong, fixed = [], None, True
    for provider, g in by_provider(d):
        worst = errors[errors["provider"] == provider].groupby("d")["value"].max()
        wrong = sorted(int(x) for x in g[~g["value"].astype(bool)]["d"].unique())
        parts.append(f"{provider}: wrong (outside the FlashAttention rule) at d = {wrong or 'none'}; max |diff| vs fp64 "
                     + ", ".join(f"d={int(k)}: {v:.2g}" for k, v in worst.items()))
        if provider == WRITEUP:
            printed_wrong = set(wrong)
        else:
            fixed &= not wrong
    measured = "; ".join(parts) + skipped(t["attention/head_dims"])
    padded = _padded_dims(int(x) for x in d["d"].unique())
    if not padded or printed_wrong is None or not (padded & printed_wrong) or not fixed:
        return measured, NOT_REPRODUCED
    if printed_wrong == padded:
        small = {x for x in padded if x & (x - 1) == 0}  # padded though a power of two: below tl.dot's minimum
        missing = "no head dim below 16" if not small else \
            "no head dim of 16 or more that is not a power of two" if small == padded else None
        if missing:  # the pattern holds where it was measured, but one half of the claim was not
            return (measured + f" - wrong exactly where its block pads d, but the sweep had {missing}: the "
                    "claim holds only as far as it was measured"), NUANCE
        return (measured + " - as printed, the kernel reads (and writes) the next row's first elements at every head "
                "dim its block pads (not a power of two, or below 16); the one-line fix (a head-dim mask) is right "
                "at every one"), REPRODUCED
    return (measured + f" - as printed it is wrong at d = {sorted(printed_wrong)}, while its block pads the head dims "
            f"{sorted(padded)}: the pattern holds only in part"), NUANCE


# --- numbers derived from its tables ------------------------------------------------------------------------

def wall_summary(attn: pd.DataFrame) -> pd.DataFrame:
    """Per (dtype, d): the longest n_k that ran and the first that did not, with the shared memory asked."""
    out = []
    for (dtype, d), g in attn.groupby(["dtype", "d"]):
        ran = g[g["status"] == "ok"]["n_k"]
        failed = g[g["status"] == "out_of_resources"]
        out.append({"dtype": dtype, "d": int(d), "longest n_k that ran": int(ran.max()) if len(ran) else None,
                    "first n_k that failed": int(failed["n_k"].min()) if len(failed) else None,
                    "shared memory required (B)": int(failed["value"].iloc[0]) if len(failed) else None,
                    "limit (B)": int(failed["shared_limit"].iloc[0]) if len(failed) else None})
    return pd.DataFrame(out)


# --- figures ------------------------------------------------------------------------------------------------

@figure("attention_head_dims", ["attention/head_dims"], "Attention", caption="""
The writeup's attention kernel at every head dimension d of the sweep (n_q and n_k fixed): max absolute
difference from an fp64 reference, on a log axis, for the kernel as printed (its loads and stores are masked
along rows only, and its head-dim block is ``next_power_of_2(d)``, at least tl.dot's 16) and for the same
kernel with a head-dim mask (``kernels.attention``). Dotted: head dims whose block is d itself. Where the
block is wider (d not a power of two, or below 16) the printed kernel reads the next row's first elements
(and writes into them): the softmax bug's shape of mistake, along the other axis. Claim 18.""")
def figure_attention_head_dims(t):
    return plot_attention_head_dims(t["attention/head_dims"])


@figure("wall", ["attention/wall", "flash_attention/past_wall"], "Attention", caption="""
Top: for each number of keys n_k (powers of two and one past each, so neighbouring lengths that need different
blocks each get their own column), did the kernel run and match the reference by the FlashAttention rule
(green circle; an orange diamond if it ran and was wrong), fail at launch for lack of shared memory (red
cross), or was it only compiled for sm_90 on a machine without a GPU (grey square)? The writeup's attention
kernel holds all of K/V on chip and hits a wall; flash_attention streams K/V in tiles and runs on. Bottom: the
shared memory the writeup's kernel asks for (KiB, from the compiled kernel) against the per-block limit of the
GPU (dashed). Claims 10 and 13.""")
def figure_wall(t):
    return plot_wall(t["attention/wall"], t["flash_attention/past_wall"])


def plot_attention_head_dims(df: pd.DataFrame) -> plt.Figure:
    """Max error against fp64 per head dim: the writeup's kernel as printed and with the head-dim mask."""
    plt, sns = plots.libs()
    d = plots.measured(df)
    d = d[d["metric"] == "max_abs_diff"]
    if d.empty:
        return plots.placeholder("attention: error vs head dim", df)
    d = d.assign(series=d["provider"].map({WRITEUP: "as printed", TRITON: "with the head-dim mask"})
                 .fillna(d["provider"]) + ", " + d["dtype"])
    fig, ax = plt.subplots(figsize=(8, 4.4))
    sns.lineplot(data=d, x="d", y="value", hue="series", style="series", markers=True, dashes=False, ax=ax)
    padded = _padded_dims(int(x) for x in d["d"].unique())
    for dim in sorted(d["d"].unique()):
        if int(dim) not in padded:
            ax.axvline(dim, color="grey", lw=0.6, ls=":")
    ax.set(yscale="log", xlabel="head dim d (dotted: the head-dim block is d itself)", ylabel="max |out - fp64 reference| (log)",
           title=f"the writeup's attention kernel at every head dim, n_q={int(d['n_q'].iloc[0])}, "
                 f"n_k={int(d['n_k'].iloc[0])} ({plots.device_of(df)})")
    ax.title.set_fontsize(9)
    sns.move_legend(ax, "best", fontsize=8, title=None)
    fig.tight_layout()
    return fig


def _outcome(df: pd.DataFrame) -> pd.Series:
    """Per launch: 'ran, correct' only where its 'matches' row says so (FlashAttention rule), else why not."""
    judged = df[df["metric"] == "matches"].set_index(["series", "n_k"])["value"].astype(bool)
    out = df["status"].map({"out_of_resources": "failed: out of shared memory",
                            "compiled_only": "compiled for sm_90 only"})
    ran = df["status"] == "ok"
    right = [judged.get((s, n)) for s, n in zip(df["series"], df["n_k"])]
    out[ran] = ["ran, correct" if r else "ran, WRONG" if r is not None else "ran, not judged"
                for r, is_ran in zip(right, ran) if is_ran]
    return out.fillna(df["status"])


def plot_wall(attn: pd.DataFrame, flash: pd.DataFrame) -> plt.Figure:
    """Top: which n_k each kernel handles (the writeup's fails at its wall, flash runs on), each length its
    own column so that 2^i and 2^i + 1 never hide each other. Bottom: the shared memory the writeup's
    kernel asks for against the per-block limit."""
    plt, sns = plots.libs()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 7.5), height_ratios=[1.1, 1])
    attn, flash = attn[attn["n_k"].notna()], flash[flash["n_k"].notna()]  # not the memory rows
    a = attn.assign(series="writeup attention, " + attn["dtype"] + " d=" + attn["d"].astype(int).astype(str))
    f = flash.assign(series="flash_attention, " + flash["dtype"] + " d=" + flash["d"].astype(int).astype(str))
    both = pd.concat([a, f], ignore_index=True)
    both["outcome"] = _outcome(both)
    points = both[(both["metric"] == "max_abs_diff") | (both["status"] != "ok")]  # one point per launch
    order = sorted(int(n) for n in points["n_k"].unique())
    points = points.assign(column=points["n_k"].astype(int).map({n: i for i, n in enumerate(order)}))
    styles = {"ran, correct": ("o", "tab:green"), "ran, WRONG": ("D", "tab:orange"), "ran, not judged": ("o", "tab:olive"),
              "failed: out of shared memory": ("X", "tab:red"), "compiled for sm_90 only": ("s", "tab:grey")}
    present = [o for o in styles if o in set(points["outcome"])]
    sns.scatterplot(data=points, x="column", y="series", hue="outcome", style="outcome", s=60, ax=ax, hue_order=present,
                    style_order=present, markers={o: styles[o][0] for o in present},
                    palette={o: styles[o][1] for o in present})
    ax.set_xticks(range(len(order)), [str(n) for n in order], rotation=60, fontsize=7)
    ax.set(xlabel="n_k (keys; powers of two and one past each, one column each)", ylabel="")
    ax.set_title(f"attention: the shared-memory wall ({plots.device_of(both)})")
    need = attn[attn["metric"] == "shared_required"].copy()
    need["series"] = need["dtype"] + " d=" + need["d"].astype(int).astype(str)
    sns.lineplot(data=need.assign(KiB=need["value"] / 1024), x="n_k", y="KiB", hue="series", marker="o", ax=ax2)
    limit = attn["shared_limit"].dropna() if "shared_limit" in attn else pd.Series(dtype=float)
    if len(limit):
        ax2.axhline(limit.iloc[0] / 1024, color="red", ls="--", lw=1)
        ax2.text(need["n_k"].min(), limit.iloc[0] / 1024, f" limit per block: {limit.iloc[0] / 1024:.0f} KiB",
                 color="red", va="bottom", fontsize=8)
    ax2.set(xscale="log", yscale="log", xlabel="n_k", ylabel="shared memory asked for (KiB)",
            title="shared memory the writeup's kernel needs (compiled for sm_90)")
    fig.tight_layout()
    return fig


# --- its report section -------------------------------------------------------------------------------------

@section(["attention/performance", "attention/wall"])
def section_attention(tables) -> str:
    out = []
    att = median(tables["attention/performance"], "throughput")
    if not att.empty:
        wide = att.pivot_table(index=["n_q", "d", "dtype"], columns="provider", values="value").reset_index()
        out.append("\n### The writeup's attention kernel vs flash_attention and SDPA, TFLOP/s (one head, where it runs)"
                   "\n\n" + md_table(wide))
    out.append("\n### The wall\n\n" + md_table(wall_summary(tables["attention/wall"])))
    return "\n".join(out)
