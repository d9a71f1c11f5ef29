"""Settle each claim of workflow/claims.yaml from the tables: (measured, verdict) per claim.

A check reads only rows with status 'ok'; what could not be measured here makes the verdict
'needs a GPU', never a guess, and a claim whose table records a failed experiment is 'not settled'.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from . import summary
from .summary import ok

REPRODUCED = "reproduced"
NUANCE = "reproduced with a nuance"
NOT_REPRODUCED = "not reproduced"
NEEDS_GPU = "needs a GPU"
NOT_SETTLED = "not settled"  # a table it needs records a failed experiment
VERDICTS = (REPRODUCED, NUANCE, NOT_REPRODUCED, NEEDS_GPU, NOT_SETTLED)


@dataclass(frozen=True)
class Check:
    id: int
    tables: tuple[str, ...]
    fn: Callable


CHECKS: dict[int, Check] = {}


def claim(id: int, tables: list[str]):
    """Register the check that settles claim ``id`` of workflow/claims.yaml from ``tables`` (and only those)."""
    def register(fn):
        if id in CHECKS:
            raise ValueError(f"claim {id} has two checks: {CHECKS[id].fn.__name__} and {fn.__name__}")
        CHECKS[id] = Check(id, tuple(tables), fn)
        return fn

    return register


def _bool(d: pd.DataFrame, metric: str, **where) -> pd.Series:
    return ok(d, metric=metric, **where)["value"].astype(bool)


def _skipped(d: pd.DataFrame) -> str:
    n = int((d["status"] == "needs_gpu").sum())
    return f" ({n} bf16 cases need a GPU: not run in the interpreter)" if n else ""


@claim(1, ['vector_add/correctness'])
def vector_add_exact(t, s):
    d = t["vector_add/correctness"]
    exact = _bool(d, "exact_match")
    sizes = sorted(ok(d, metric="exact_match")["size"].astype(int).unique())
    measured = (f"bit-exact in {int(exact.sum())}/{len(exact)} cases, sizes {sizes[0]}..{sizes[-1]} incl. "
                f"{', '.join(str(x) for x in sizes if x % 1024)} (not multiples of 1024), "
                f"dtypes {', '.join(sorted(ok(d)['dtype'].unique()))}{_skipped(d)}")
    return measured, REPRODUCED if len(exact) and exact.all() else NOT_REPRODUCED


def _by_provider(d: pd.DataFrame):
    """The statistics table per kernel: the writeup's as written first, then the improved one."""
    order = {"triton_writeup": 0}
    for provider in sorted(d["provider"].unique(), key=lambda p: (order.get(p, 1), p)):
        yield provider, d[d["provider"] == provider]


@claim(2, ['relu_dropout/statistics'])
def dropout_rates(t, s):
    parts, verdicts = [], []
    for provider, d in _by_provider(t["relu_dropout/statistics"]):
        single = ok(d, metric="drop_rate_single_seed").sort_values("p")
        within = _bool(d, "within_tolerance_single_seed")
        tolerance = ok(d, metric="within_tolerance_single_seed")["tolerance"].iloc[0]
        worst = ok(d, metric="max_abs_rate_error")["value"].max()
        ulp = ok(d, metric="survivor_max_ulp_error")["value"].max()
        seeds = int(ok(d, metric="max_abs_rate_error")["seeds"].iloc[0])
        rates = ", ".join(f"p={p:g}: {r:.4f}" for p, r in zip(single["p"], single["value"]))
        parts.append(f"{provider}: seed {int(single['seed'].iloc[0])}: {rates}; over {seeds} seeds the worst "
                     f"|rate - p| is {worst:.4f} (band {tolerance:g}); survivors equal relu(x)/(1-p) within {ulp:.0f} ulp")
        if not (within.all() and worst <= tolerance and ulp <= s["nuance_ulp"]):
            verdicts.append(NOT_REPRODUCED)
        elif ulp <= s["max_ulp"]:
            verdicts.append(REPRODUCED)
        else:
            verdicts.append(NUANCE)
            parts[-1] += (f" - not bit-exact (> {s['max_ulp']} ulp): the scaling is right to a few ulp; why "
                          "(the GPU's fp32 division, or rounding 1-p first) is not checked by this run")
    return "; ".join(parts), _weakest(verdicts)


def _weakest(verdicts: list[str]) -> str:
    """One verdict for several cases: the least favourable of them."""
    return max(verdicts, key=[REPRODUCED, NUANCE, NEEDS_GPU, NOT_REPRODUCED].index) if verdicts else NEEDS_GPU


@claim(3, ['relu_dropout/statistics'])
def dropout_distribution(t, s):
    parts, good = [], True
    for provider, d in _by_provider(t["relu_dropout/statistics"]):
        pooled = ok(d, metric="pooled_binomtest_pvalue")["value"]
        ks = ok(d, metric="per_seed_ks_pvalue")["value"]
        corr = ok(d, metric="neighbour_correlation")
        same = _bool(d, "same_seed_identical")
        agree = ok(d, metric="other_seed_mask_agreement")
        gap = (agree["value"] - agree["expected"]).abs().max()
        parts.append(f"{provider}: binomial test of pooled drop counts min p-value {pooled.min():.3g}; KS test of "
                     f"per-seed counts vs Binomial min p-value {ks.min():.3g}; neighbour correlation |r| <= "
                     f"{corr['value'].abs().max():.4f}; same seed -> identical output: {bool(same.all())}; another "
                     f"seed agrees on {agree['value'].min():.3f}..{agree['value'].max():.3f} of elements (independent "
                     f"masks: p^2+(1-p)^2 = {agree['expected'].min():.2f}..{agree['expected'].max():.2f})")
        good &= bool(pooled.min() > s["alpha"] and ks.min() > s["alpha"] and same.all()
                     and corr["value"].abs().max() <= s["max_neighbour_r"] and gap <= s["max_agreement_gap"])
    return "; ".join(parts), REPRODUCED if good else NOT_REPRODUCED


@claim(4, ['softmax/stability'])
def softmax_stability(t, s):
    d = ok(t["softmax/stability"])
    bad = d[d["metric"] == "nonfinite_fraction"].pivot_table(index="scale", columns="provider", values="value")
    top = bad.index.max()
    fused_diff = ok(d, metric="max_abs_diff", provider="triton_fused")["value"].max()
    measured = (f"inputs up to {d['max_input'].max():.0f}: fused kernel non-finite fraction "
                f"{bad['triton_fused'].max():.0%} at every scale (max |diff| vs fp64 {fused_diff:.2g}); "
                f"naive exp(x): {bad.loc[top, 'naive_exp']:.0%} non-finite at scale {top:g}, "
                f"first non-finite at scale {bad.index[bad['naive_exp'] > 0].min():g}")
    good = bad["triton_fused"].max() == 0 and bad["naive_exp"].max() > 0
    return measured, REPRODUCED if good else NOT_REPRODUCED


def _bug_at(t, n_cols, variant):
    d = ok(t["softmax/bug"], n_cols=n_cols, variant=variant)
    return {m: g["value"].iloc[0] for m, g in d.groupby("metric")}


@claim(5, ['softmax/bug'])
def softmax_small_input(t, s):
    r = _bug_at(t, 5, "hardcoded")
    return (f"(4, 5), BLOCK_SIZE=1024: matches torch {bool(r['matches_torch'])}, max |diff| {r['max_abs_diff']:.2g}",
            REPRODUCED if r["matches_torch"] else NOT_REPRODUCED)


@claim(6, ['softmax/bug'])
def softmax_bug_2000(t, s):
    r = _bug_at(t, 2000, "hardcoded")
    measured = (f"n_cols=2000, BLOCK_SIZE=1024: matches torch {bool(r['matches_torch'])}, max |diff| "
                f"{r['max_abs_diff']:.5f} (writeup {s['writeup_max_abs_diff']:g}; the value depends on the random input), "
                f"{int(r['columns_dropped'])} columns never written, {int(r['warnings_raised'])} warnings, no exception")
    silent_and_wrong = not r["matches_torch"] and r["warnings_raised"] == 0 and r["columns_dropped"] > 0
    return measured, REPRODUCED if silent_and_wrong else NOT_REPRODUCED


@claim(7, ['softmax/bug'])
def softmax_fix_2000(t, s):
    r = _bug_at(t, 2000, "dynamic")
    return (f"n_cols=2000, BLOCK_SIZE=next_power_of_2(2000)=2048: matches torch {bool(r['matches_torch'])}, "
            f"max |diff| {r['max_abs_diff']:.2g}", REPRODUCED if r["matches_torch"] else NOT_REPRODUCED)


@claim(8, ['softmax/bug'])
def softmax_sweep(t, s):
    d = ok(t["softmax/bug"])
    dropped = d[d["metric"] == "columns_dropped"]
    exact = (dropped["value"] == dropped["expected_dropped"]).all()
    dyn = d[d["variant"] == "dynamic"]
    dyn_ok = _bool(dyn, "matches_torch").all() and (dyn[dyn["metric"] == "columns_dropped"]["value"] == 0).all()
    n = sorted(int(x) for x in dropped["n_cols"].unique())
    measured = (f"n_cols in {n}: hard-coded drops exactly max(0, n_cols - 1024) columns in every case: {bool(exact)}; "
                f"dynamic matches torch with 0 columns dropped in every case: {bool(dyn_ok)}")
    return measured, REPRODUCED if exact and dyn_ok else NOT_REPRODUCED


@claim(9, ['attention/correctness'])
def attention_shapes(t, s):
    d = t["attention/correctness"]
    parts, good = [], True
    for n_q, n_k, dim in s["shapes"]:
        m = ok(d, metric="matches", n_q=n_q, n_k=n_k, d=dim)
        e = ok(d, metric="diff_vs_sdpa", n_q=n_q, n_k=n_k, d=dim).set_index("dtype")["value"]
        good &= len(m) > 0 and m["value"].astype(bool).all()
        parts.append(f"Q({n_q},{dim})/K,V({n_k},{dim}): " + ", ".join(
            f"{dt} max|triton - SDPA| {e[dt]:.1g} ({m[m['dtype'] == dt]['dot_precision'].iloc[0]})" for dt in e.index))
    allm = _bool(d, "matches")
    parts.append(f"all {len(allm)} shape x dtype cases within the FlashAttention error rule: {bool(allm.all())}")
    return "; ".join(parts) + _skipped(d), REPRODUCED if good and allm.all() else NOT_REPRODUCED


@claim(10, ['attention/wall'])
def attention_wall(t, s):
    d = t["attention/wall"]
    if (d["status"] == "compiled_only").all():
        c = d.sort_values("n_k")
        bytes_at = ", ".join(f"n_k={int(r.n_k)}: {int(r.value)} B" for r in c.itertuples())
        return (f"compiled for sm_90 on this CPU machine (triton {d['triton'].iloc[0]}, {c['dtype'].iloc[0]}, "
                f"d={int(c['d'].iloc[0])}): shared memory grows with n_k - {bytes_at}; whether a launch fails needs a GPU",
                NEEDS_GPU)
    w = summary.wall(d)
    failed = w.dropna(subset=["first n_k that failed"])
    parts = [f"{r['dtype']} d={r['d']}: ran to n_k={r['longest n_k that ran']}, failed at n_k={r['first n_k that failed']} "
             f"(needs {r['shared memory required (B)']} B > {r['limit (B)']} B)" for _, r in failed.iterrows()]
    parts += [f"{r['dtype']} d={r['d']}: ran every n_k up to {r['longest n_k that ran']}, no wall in the sweep"
              for _, r in w[w["first n_k that failed"].isna()].iterrows()]
    err = d[d["status"] == "out_of_resources"]["error"]
    measured = f"on {d['device'].iloc[0]} with triton {d['triton'].iloc[0]}: " + "; ".join(parts)
    if len(failed):
        walls = failed["first n_k that failed"]
        measured += (f". The failure is an exception at launch (\"{err.iloc[0].splitlines()[0]}\"), no wrong output; "
                     + (f"the wall moves with head dim and dtype (n_k = {walls.min()}..{walls.max()})"
                        if walls.nunique() > 1 else f"the wall is at n_k = {walls.iloc[0]} in every case"))
    if len(failed) == len(w):
        return measured, REPRODUCED
    return measured, NUANCE if len(failed) else NOT_REPRODUCED


@claim(11, ['calibration/ceilings'])
def shared_memory(t, s):
    c = summary.ceilings(t["calibration/ceilings"])
    if not c:
        return "the shared-memory limits are properties of the GPU: not measurable in the interpreter", NEEDS_GPU
    per_sm = c.get("shared_memory_per_multiprocessor") or c["shared_memory_per_block"]
    low, high = s["said_bytes"]
    measured = (f"{c['device']}: {per_sm} B = {per_sm / 1024:.0f} KiB of shared memory per SM "
                f"({c['shared_memory_per_block']} B = {c['shared_memory_per_block'] / 1024:.0f} KiB usable by one "
                f"block, the kernels' limit); device memory {c['device_memory'] / 2**30:.0f} GiB, "
                f"{c['device_memory'] / per_sm:.1e}x one SM's shared memory")
    if low <= per_sm < high:
        return measured + f" - within 'tens of kilobytes' ({low}..{high} B)", REPRODUCED
    if per_sm * s["min_ratio_to_device_memory"] <= c["device_memory"]:
        return (measured + f" - not 'tens of kilobytes' ({low}..{high} B) on this GPU, but small next to device "
                "memory, the point of the sentence"), NUANCE
    return measured, NOT_REPRODUCED


@claim(12, ['relu_dropout/performance', 'softmax/performance'])
def fused_wins(t, s):
    f = summary.fusion(t)
    if f.empty:
        return ("bytes moved are counted in code (fused relu+dropout 2 passes vs 4 + a mask; fused softmax 2 passes "
                "vs 8 for the naive five-op version), but time needs a GPU", NEEDS_GPU)
    parts, verdicts = [], []
    for name, g in f.groupby("comparison", sort=False):
        g = g.sort_values("size")
        big = g.iloc[-1]
        wins = g["time_ratio"] > s["min_time_ratio"]
        text = (f"{name}: at {int(big['size'])} the unfused version moves {big['bytes_ratio']:.2f}x the bytes and takes "
                f"{big['time_ratio']:.2f}x the time")
        if wins.all():
            verdicts.append(REPRODUCED)
            text += f", and the fused kernel is faster at every size ({int(g['size'].min())}..{int(big['size'])})"
        elif wins.iloc[-1]:
            verdicts.append(NUANCE)
            crossover = int(g["size"][wins.astype(int)[::-1].cummin()[::-1].astype(bool)].min())
            losing = g[~wins]
            points = ", ".join(f"{r.time_ratio:.2f}x at {int(r.size)} ({r.fused_ms * 1e3:.1f} vs {r.unfused_ms * 1e3:.1f} us)"
                               for r in losing.itertuples())
            if not wins.iloc[0]:  # a crossover: fused loses from the smallest size up to some size
                floor = g["fused_ms"].iloc[0]
                why = ("per-call cost: the fused kernel takes within "
                       f"{s['launch_bound_growth']:g}x of its smallest-size time there"
                       if (losing["fused_ms"] <= s["launch_bound_growth"] * floor).all() else
                       "more than per-call cost")
                text += f"; below {crossover} the unfused version is as fast or faster ({points}): {why}"
            else:  # losses between sizes where fused wins: no crossover, single slow timings
                text += (f"; the fused kernel wins at every size but {points}, between sizes where it wins: "
                         "no crossover, a slow timing at those sizes in this run")
        else:
            verdicts.append(NOT_REPRODUCED)
            text += " - the fused kernel is slower at the largest size"
        parts.append(text)
    return "; ".join(parts), _weakest(verdicts)


@claim(13, ['attention/wall', 'flash_attention/past_wall', 'flash_attention/correctness'])
def flash_past_wall(t, s):
    walls = t["attention/wall"]
    flash = t["flash_attention/past_wall"]
    runs = ok(flash, metric="max_abs_diff")
    corr = _bool(t["flash_attention/correctness"], "matches")
    longest = int(runs["n_k"].max())
    base = (f"flash_attention ran every n_k up to {longest} ({runs['dtype'].iloc[0]}, d={int(runs['d'].iloc[0])}, "
            f"max |diff| vs fp32 reference {runs['value'].max():.2g}); correctness grid (fwd + grads, odd lengths, "
            f"odd head dims, causal, strided): {int(corr.sum())}/{len(corr)} within the FlashAttention rule")
    if flash["backend"].iloc[0] != "gpu":
        return (base + "; the interpreter has no shared-memory limit, so running past the wall needs a GPU to mean anything",
                NEEDS_GPU)
    fail = walls[(walls["status"] == "out_of_resources") & (walls["dtype"] == runs["dtype"].iloc[0])
                 & (walls["d"] == runs["d"].iloc[0])]
    wall_at = int(fail["n_k"].min()) if len(fail) else None
    good = wall_at is not None and longest > wall_at and corr.all()
    return base + f"; the writeup's kernel fails at n_k={wall_at} on the same device", REPRODUCED if good else NOT_REPRODUCED


@claim(14, ['vector_add/mask'])
def mask_needed(t, s):
    d = ok(t["vector_add/mask"])
    past = d[d["metric"] == "elements_written_past_end"].set_index(["variant", "size"])
    read = d[d["metric"] == "read_past_end"].set_index(["variant", "size"])["value"].astype(bool)
    inside = _bool(d, "in_bounds_exact")
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


@claim(15, ['relu_dropout/statistics'])
def hundredth_of_a_percent(t, s):
    d = ok(t["relu_dropout/statistics"], metric="drop_rate_single_seed", provider="triton_writeup")
    err = (d["value"] - d["p"]).abs()
    said = s["writeup_rates"]
    said_err = max(abs(r - float(p)) for p, r in said.items())
    sigma = ok(t["relu_dropout/statistics"], metric="drop_rate", provider="triton_writeup")["sigma"]
    measured = (f"the writeup's kernel, seed {int(d['seed'].iloc[0])}: max |rate - p| = {err.max():.4f}; "
                f"'a hundredth of a percent' is {s['literal']:g}; one seed's rate has a binomial standard deviation of "
                f"{sigma.min():.4f}..{sigma.max():.4f} at size {int(d['size'].iloc[0])}; the writeup's own rates miss "
                f"p by up to {said_err:.4f}")
    if err.max() <= s["literal"] and said_err <= s["literal"]:
        return measured, REPRODUCED
    if err.max() <= s["meant"]:
        return (measured + f" - literally false (for the writeup's numbers too); true as {s['meant']:g} absolute, "
                "the band its test used"), NUANCE
    return measured, NOT_REPRODUCED


@claim(16, ['softmax/bug'])
def first_block_softmax(t, s):
    d = ok(t["softmax/bug"], variant="hardcoded")
    wide = d[d["n_cols"] > d["block_size"]]
    diff = wide[wide["metric"] == "diff_vs_softmax_of_written_columns"]
    dropped = wide[wide["metric"] == "columns_dropped"]
    if diff.empty:
        return "no n_cols wider than the block in this run's sweep", NOT_REPRODUCED
    measured = (f"n_cols in {sorted(int(n) for n in diff['n_cols'])}, BLOCK_SIZE={int(diff['block_size'].iloc[0])}: "
                f"columns [0, {int(diff['written_columns'].iloc[0])}) hold softmax(x[:, :{int(diff['block_size'].iloc[0])}]) "
                f"to max |diff| {diff['value'].max():.2g} (atol {diff['atol'].iloc[0]:g}); the other "
                f"{int(dropped['value'].min())}..{int(dropped['value'].max())} columns are never written")
    good = (diff["value"] <= diff["atol"]).all() and (dropped["value"] == dropped["expected_dropped"]).all()
    return measured, REPRODUCED if good else NOT_REPRODUCED


def _short(kernel_names: str) -> str:
    """'void at::native::(anonymous namespace)::cunn_SoftMaxForward<float, ...>(...)' -> 'cunn_SoftMaxForward'."""
    names = (n.replace("(anonymous namespace)::", "").split("<")[0].split("(")[0] for n in kernel_names.split("; "))
    return "; ".join(n.split("::")[-1].split()[-1] for n in names if n.strip())


@claim(17, ['softmax/passes'])
def torch_softmax_passes(t, s):
    d = ok(t["softmax/passes"])
    if d.empty:
        return "counting the CUDA kernels torch.softmax launches needs a GPU", NEEDS_GPU
    parts, verdicts = [], []
    for dtype, g in d.groupby("dtype"):
        g = g.set_index("provider")
        n_torch, n_naive = int(g.loc["torch_softmax", "value"]), int(g.loc["torch_naive", "value"])
        parts.append(f"{dtype} {int(g['n_rows'].iloc[0])}x{int(g['n_cols'].iloc[0])}: torch.softmax launches "
                     f"{n_torch} CUDA kernel(s) ({_short(g.loc['torch_softmax', 'kernel_names'])}), moving "
                     f"{g.loc['torch_softmax', 'bytes'] / g.loc['torch_softmax', 'input_bytes']:.0f}x the input's bytes; "
                     f"the five-op version launches {n_naive}, moving "
                     f"{g.loc['torch_naive', 'bytes'] / g.loc['torch_naive', 'input_bytes']:.0f}x; the Triton kernel "
                     f"{int(g.loc['triton_fused', 'value'])}")
        if n_torch >= s["several"]:
            verdicts.append(REPRODUCED)
        elif n_naive >= s["several"]:
            verdicts.append(NUANCE)
        else:
            verdicts.append(NOT_REPRODUCED)
    measured = "; ".join(parts) + " (bytes: the least each kernel must read and write, counted in code)"
    if NUANCE in verdicts and REPRODUCED not in verdicts:
        measured += (" - PyTorch's CUDA softmax is already one fused kernel; the several passes the writeup describes "
                     "are what the op-by-op ('naive execution model') version does")
    return measured, _weakest(verdicts)


def check_declarations(claims: list[dict], available, figures=None) -> None:
    """Every claim of claims.yaml has exactly one check, every table a check needs is produced, and
    every figure a claim links is drawn (when ``figures`` is given). The workflow calls this when it
    builds the DAG, so a gap fails before any job runs."""
    ids = [c["id"] for c in claims]
    if sorted(ids) != sorted(CHECKS):
        raise ValueError(f"claims.yaml ids {sorted(ids)} and registered checks {sorted(CHECKS)} differ")
    for c in CHECKS.values():
        missing = [k for k in c.tables if k not in available]
        if missing:
            raise ValueError(f"claim {c.id} ({c.fn.__name__}) needs tables no experiment produces: {missing}")
    for c in claims:
        if figures is not None and c.get("figure") and c["figure"] not in figures:
            raise ValueError(f"claim {c['id']} links figure {c['figure']!r}, which lab/figures.py does not draw")


def settle(claims: list[dict], tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    check_declarations(claims, tables)
    rows = []
    for c in claims:
        check = CHECKS[c["id"]]
        failed = {k: tables[k] for k in check.tables if summary.failed(tables[k])}
        if failed:
            measured = "; ".join(f"not settled: the {k} job failed ({d['error'].iloc[0].splitlines()[0][:200]})"
                                 for k, d in failed.items())
            verdict = NOT_SETTLED
        else:
            measured, verdict = check.fn({k: tables[k] for k in check.tables}, c.get("settings", {}))
        if verdict not in VERDICTS:
            raise ValueError(f"claim {c['id']}: unknown verdict {verdict!r}")
        rows.append({"id": c["id"], "claim": c["claim"], "said": c["said"], "measured": measured,
                     "verdict": verdict, "figure": c.get("figure", "")})
    return pd.DataFrame(rows)
