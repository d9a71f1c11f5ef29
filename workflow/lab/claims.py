"""Settle each claim of workflow/claims.yaml from the tables: (measured, verdict) per claim.

A check reads only rows with status 'ok' (and the statuses that are results: 'raised', 'crashed',
'out_of_resources'); what could not be measured here makes the verdict 'needs a GPU', never a guess, and
a claim whose table is missing or records a failed experiment is 'not settled'. A statement that is
false as written but whose point the data bear out is 'false as stated; the point holds', never a
'nuance'. Probe points (n_cols=2000, the writeup's shapes) are settings in claims.yaml; ``probes`` names
the config list each must be in, checked before any job runs (check_probes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from . import summary
from .summary import ok

REPRODUCED = "reproduced"
NUANCE = "reproduced with a nuance"
FALSE_POINT_HOLDS = "false as stated; the point holds"
NOT_REPRODUCED = "not reproduced"
NEEDS_GPU = "needs a GPU"
NOT_SETTLED = "not settled"  # a table it needs is missing or records a failed experiment
VERDICTS = (REPRODUCED, NUANCE, FALSE_POINT_HOLDS, NOT_REPRODUCED, NEEDS_GPU, NOT_SETTLED)


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


def _first_line(error: str) -> str:
    """The line of an error text that says what happened (CUDA and compiler errors carry hints and source
    lines around it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for mark in ("illegal memory", "exceeds", "out of resource", "Error"):
        for line in lines:
            if mark in line:
                return line[:200]
    return lines[0][:200] if lines else ""


def _skipped(d: pd.DataFrame) -> str:
    n = int((d["status"] == "needs_gpu").sum())
    return f" ({n} bf16 cases need a GPU: not run in the interpreter)" if n else ""


@claim(1, ['vector_add/correctness'])
def vector_add_exact(t, s):
    d = t["vector_add/correctness"]
    parts, good = [], True
    for provider, g in _by_provider(d):
        exact = _bool(g, "exact_match")
        sizes = sorted(ok(g, metric="exact_match")["size"].astype(int).unique())
        good &= bool(len(exact) and exact.all())
        parts.append(f"{provider}: bit-exact in {int(exact.sum())}/{len(exact)} cases"
                     + (f", sizes {sizes[0]}..{sizes[-1]} incl. {', '.join(str(x) for x in sizes if x % 1024)} "
                        f"(not multiples of 1024), dtypes {', '.join(sorted(ok(g)['dtype'].unique()))}" if sizes else ""))
    return "; ".join(parts) + _skipped(d), REPRODUCED if good and parts else NOT_REPRODUCED


def _by_provider(d: pd.DataFrame):
    """A table per kernel (provider): the writeup's as printed first, then the others."""
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
    return (max(verdicts, key=[REPRODUCED, NUANCE, FALSE_POINT_HOLDS, NEEDS_GPU, NOT_REPRODUCED].index)
            if verdicts else NEEDS_GPU)


@claim(3, ['relu_dropout/statistics'])
def dropout_distribution(t, s):
    """Said: allclose cannot check dropout, only its distribution can. Given the seed the output is
    determined, so a reference built from the seed (Philox recomputed without Triton) checks it element by
    element; the point, that the distribution must be tested too, stands when those tests pass."""
    parts, distribution, reference = [], True, True
    for provider, d in _by_provider(t["relu_dropout/statistics"]):
        pooled = ok(d, metric="pooled_binomtest_pvalue")["value"]
        ks = ok(d, metric="per_seed_ks_pvalue")["value"]
        corr = ok(d, metric="neighbour_correlation")
        same = _bool(d, "same_seed_identical")
        agree = ok(d, metric="other_seed_mask_agreement")
        gap = (agree["value"] - agree["expected"]).abs().max()
        mask_ref, close_ref = _bool(d, "mask_equals_seed_reference"), _bool(d, "allclose_seed_reference")
        parts.append(f"{provider}: binomial test of pooled drop counts min p-value {pooled.min():.3g}; KS test of "
                     f"per-seed counts vs Binomial min p-value {ks.min():.3g}; neighbour correlation |r| <= "
                     f"{corr['value'].abs().max():.4f}; same seed -> identical output: {bool(same.all())}; another "
                     f"seed agrees on {agree['value'].min():.3f}..{agree['value'].max():.3f} of elements (independent "
                     f"masks: p^2+(1-p)^2 = {agree['expected'].min():.2f}..{agree['expected'].max():.2f}); against a "
                     f"reference built from the seed alone: mask identical in {int(mask_ref.sum())}/{len(mask_ref)}, "
                     f"allclose in {int(close_ref.sum())}/{len(close_ref)} cases")
        distribution &= bool(pooled.min() > s["alpha"] and ks.min() > s["alpha"] and same.all()
                             and corr["value"].abs().max() <= s["max_neighbour_r"] and gap <= s["max_agreement_gap"])
        reference &= bool(len(close_ref) and close_ref.all() and mask_ref.all())
    if not distribution:
        return "; ".join(parts), NOT_REPRODUCED
    if reference:
        return ("; ".join(parts) + " - allclose can check dropout: against a same-seed reference, which exists "
                "because the output is a pure function of the seed; the distribution tests pass as well"), FALSE_POINT_HOLDS
    return "; ".join(parts), REPRODUCED


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
    good = bad["triton_fused"].max() == 0 and bad["naive_exp"].max() > 0 and fused_diff <= s["atol"]
    return measured + f" (atol {s['atol']:g})", REPRODUCED if good else NOT_REPRODUCED


def _bug_at(t, n_cols, variant):
    """The bug table's metrics at one point, and the error if the call raised there (None if it did not)."""
    d = t["softmax/bug"]
    d = d[(d["n_cols"] == n_cols) & (d["variant"] == variant)]
    raised = d[d["status"] == "raised"]["error"]
    return {m: g["value"].iloc[0] for m, g in ok(d).groupby("metric")}, (raised.iloc[0] if len(raised) else None)


@claim(5, ['softmax/bug'])
def softmax_small_input(t, s):
    r, raised = _bug_at(t, s["n_cols"], "hardcoded")
    if raised or not r:
        return f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: {raised or 'not measured'}", NOT_REPRODUCED
    measured = (f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: bit-exact {bool(r['exact_match'])}, "
                f"within atol {bool(r['matches_torch'])}, max |diff| {r['max_abs_diff']:.2g}")
    if r["exact_match"]:
        return measured, REPRODUCED
    if r["matches_torch"]:
        return measured + " - not exactly: it matches to rounding, which is what the test showed", FALSE_POINT_HOLDS
    return measured, NOT_REPRODUCED


@claim(6, ['softmax/bug'])
def softmax_bug_2000(t, s):
    r, raised = _bug_at(t, s["n_cols"], "hardcoded")
    if raised or not r:
        return f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: {raised or 'not measured'} - not silent", NOT_REPRODUCED
    measured = (f"n_cols={s['n_cols']}, BLOCK_SIZE=1024: matches torch {bool(r['matches_torch'])}, max |diff| "
                f"{r['max_abs_diff']:.5f} (writeup {s['writeup_max_abs_diff']:g}; the value depends on the random input), "
                f"{int(r['columns_dropped'])} columns never written, {int(r['warnings_raised'])} warnings, "
                "returned without an exception")
    silent_and_wrong = not r["matches_torch"] and r["warnings_raised"] == 0 and r["columns_dropped"] > 0
    return measured, REPRODUCED if silent_and_wrong else NOT_REPRODUCED


@claim(7, ['softmax/bug'])
def softmax_fix_2000(t, s):
    r, raised = _bug_at(t, s["n_cols"], "dynamic")
    if raised or not r:
        return f"n_cols={s['n_cols']}, BLOCK_SIZE=next_power_of_2: {raised or 'not measured'}", NOT_REPRODUCED
    return (f"n_cols={s['n_cols']}, BLOCK_SIZE=next_power_of_2({s['n_cols']}): matches torch {bool(r['matches_torch'])}, "
            f"max |diff| {r['max_abs_diff']:.2g}", REPRODUCED if r["matches_torch"] else NOT_REPRODUCED)


@claim(8, ['softmax/bug'])
def softmax_sweep(t, s):
    d = t["softmax/bug"]
    dropped = ok(d, metric="columns_dropped", variant="hardcoded")
    exact = bool(len(dropped)) and (dropped["value"] == dropped["expected_dropped"]).all()
    dyn = d[d["variant"] == "dynamic"]
    ran = ok(dyn, metric="matches_torch")
    dyn_ok = bool(len(ran)) and ran["value"].astype(bool).all() and (ok(dyn, metric="columns_dropped")["value"] == 0).all()
    broke = dyn[dyn["status"] == "raised"]
    n = sorted(int(x) for x in d["n_cols"].unique())
    measured = (f"n_cols in {n}: hard-coded drops exactly max(0, n_cols - 1024) columns in every case: {bool(exact)}; "
                f"dynamic matches torch with 0 columns dropped wherever it ran ({len(ran)} widths, up to "
                f"{int(ran['n_cols'].max()) if len(ran) else 0}): {bool(dyn_ok)}")
    if not (exact and dyn_ok):
        return measured, NOT_REPRODUCED
    if broke.empty:
        return measured, REPRODUCED
    max_block = int(broke["max_block"].iloc[0])
    past = (broke["n_cols"] > max_block).all()
    measured += (f"; dynamic raises at n_cols = {', '.join(str(int(x)) for x in sorted(broke['n_cols']))}, where "
                 f"next_power_of_2(n_cols) exceeds Triton's largest block ({max_block} elements): "
                 f"\"{_first_line(broke['error'].iloc[0])}\"")
    if past:
        return (measured + " - it does break, loudly, past 2^20 columns; below that it never does"), FALSE_POINT_HOLDS
    return measured, NOT_REPRODUCED


@claim(9, ['attention/correctness'])
def attention_shapes(t, s):
    d = t["attention/correctness"]
    printed = d[d["provider"] == "triton_writeup"]
    parts, good = [], True
    for n_q, n_k, dim in s["shapes"]:
        m = ok(printed, metric="matches", n_q=n_q, n_k=n_k, d=dim)
        e = ok(printed, metric="diff_vs_sdpa", n_q=n_q, n_k=n_k, d=dim).set_index("dtype")["value"]
        good &= len(m) > 0 and m["value"].astype(bool).all()
        parts.append(f"Q({n_q},{dim})/K,V({n_k},{dim}): " + ", ".join(
            f"{dt} max|triton - SDPA| {e[dt]:.1g} ({m[m['dtype'] == dt]['dot_precision'].iloc[0]})" for dt in e.index))
    allm = _bool(d, "matches")
    parts.append(f"the kernel as printed and with the head-dim mask, all {len(allm)} shape x dtype cases (head dims "
                 f"{', '.join(str(int(x)) for x in sorted(ok(d)['d'].unique()))}) within the FlashAttention error rule: "
                 f"{bool(allm.all())}")
    return "; ".join(parts) + _skipped(d), REPRODUCED if good and allm.all() else NOT_REPRODUCED


@claim(10, ['attention/wall'])
def attention_wall(t, s):
    """Said: past some length it breaks, 'not gracefully'. Graceful is an exception at launch with every
    output before it correct; not graceful would be a wrong output or a crash."""
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
    matches = _bool(d, "matches")
    wrong = ok(d, metric="matches")[~matches.values]
    measured = (f"on {d['device'].iloc[0]} with triton {d['triton'].iloc[0]}: " + "; ".join(parts)
                + f"; outputs before the wall within the FlashAttention rule: {int(matches.sum())}/{len(matches)}")
    if failed.empty:
        return measured, NOT_REPRODUCED
    walls = failed["first n_k that failed"]
    err = d[d["status"] == "out_of_resources"]["error"]
    measured += (f". The failure is an exception at launch (\"{_first_line(err.iloc[0])}\"); "
                 + (f"the wall moves with head dim and dtype (n_k = {walls.min()}..{walls.max()})"
                    if walls.nunique() > 1 else f"the wall is at n_k = {walls.iloc[0]} in every case"))
    if len(wrong):
        return (measured + f" - not gracefully: wrong output at n_k = "
                f"{', '.join(str(int(n)) for n in sorted(wrong['n_k'].unique()))}"), REPRODUCED
    return (measured + " - it breaks, but gracefully: a clean OutOfResources at launch and correct output up to the "
            "wall, never a wrong result"), FALSE_POINT_HOLDS


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
        return (measured + f" - not 'tens of kilobytes' ({low}..{high} B) on this GPU, but tiny next to device "
                "memory, the point of the sentence"), FALSE_POINT_HOLDS
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
    same_bytes = summary.median(summary.forward(t["relu_dropout/performance"]), "time_ms")
    if {"triton_writeup", "triton_fused"} <= set(same_bytes["provider"]):
        times = same_bytes.pivot_table(index="size", columns="provider", values="value")
        ratio = times["triton_writeup"].iloc[-1] / times["triton_fused"].iloc[-1]
        text = (f"relu+dropout, the writeup's kernel vs the improved one (same bytes moved): {ratio:.2f}x the time at "
                f"{int(times.index[-1])}")
        if ratio >= s["flops_matter_ratio"]:
            verdicts.append(NUANCE)
            text += (" - there the lever was fewer operations, not fewer round trips: the writeup's kernel is bound by "
                     "its random numbers (one Philox evaluation per element)")
        parts.append(text)
    return "; ".join(parts), _weakest(verdicts)


@claim(13, ['attention/wall', 'flash_attention/past_wall', 'flash_attention/correctness'])
def flash_past_wall(t, s):
    walls = t["attention/wall"]
    flash = t["flash_attention/past_wall"]
    runs = ok(flash, metric="max_abs_diff")
    right = _bool(flash, "matches")
    corr = _bool(t["flash_attention/correctness"], "matches")
    longest = int(runs["n_k"].max())
    base = (f"flash_attention ran every n_k up to {longest} ({runs['dtype'].iloc[0]}, d={int(runs['d'].iloc[0])}), "
            f"within the FlashAttention rule against fp64 at {int(right.sum())}/{len(right)} lengths (max |diff| "
            f"{runs['value'].max():.2g}); correctness grid (fwd + grads, odd lengths, odd head dims, causal, strided): "
            f"{int(corr.sum())}/{len(corr)} within the rule")
    if flash["backend"].iloc[0] != "gpu":
        return (base + "; the interpreter has no shared-memory limit, so running past the wall needs a GPU to mean anything",
                NEEDS_GPU)
    fail = walls[(walls["status"] == "out_of_resources") & (walls["dtype"] == runs["dtype"].iloc[0])
                 & (walls["d"] == runs["d"].iloc[0])]
    wall_at = int(fail["n_k"].min()) if len(fail) else None
    good = wall_at is not None and longest > wall_at and corr.all() and len(right) and right.all()
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
    said_err = max(abs(r - float(p)) for p, r in s["writeup_rates"].items())
    sigma = ok(t["relu_dropout/statistics"], metric="drop_rate", provider="triton_writeup")["sigma"]
    measured = (f"the writeup's kernel, seed {int(d['seed'].iloc[0])}: max |rate - p| = {err.max():.4f}; "
                f"'a hundredth of a percent' is {s['literal']:g}; one seed's rate has a binomial standard deviation of "
                f"{sigma.min():.4f}..{sigma.max():.4f} at size {int(d['size'].iloc[0])}, so no test at this size can "
                f"promise {s['literal']:g}; the writeup's own printed rates miss p by up to {said_err:.4f}")
    if err.max() <= s["literal"]:
        return measured, REPRODUCED
    if err.max() <= s["meant"]:
        return (measured + f" - literally false; within {s['meant']:g} absolute (a hundredth, not a hundredth of a "
                "percent), the band its test used"), FALSE_POINT_HOLDS
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


@claim(17, ['softmax/passes', 'softmax/performance'])
def torch_softmax_passes(t, s):
    """Several passes if torch.softmax launches several kernels. If it launches one, the statement's
    point (op by op, each step is a pass, and passes cost time) holds only if the five-op version is
    measured slower, by at least min_naive_slowdown at the counted width."""
    d = ok(t["softmax/passes"])
    if d.empty:
        return "counting the CUDA kernels torch.softmax launches needs a GPU", NEEDS_GPU
    times = summary.median(summary.forward(t["softmax/performance"]), "time_ms")
    if "dtype" not in times:  # only needs_gpu rows: nothing was timed
        times = times.assign(dtype=pd.Series(dtype=object), n_cols=pd.Series(dtype=float))
    parts, verdicts = [], []
    for dtype, g in d.groupby("dtype"):
        g = g.set_index("provider")
        n_cols = int(g["n_cols"].iloc[0])
        n_torch, n_naive = int(g.loc["torch_softmax", "value"]), int(g.loc["torch_naive", "value"])
        text = (f"{dtype} {int(g['n_rows'].iloc[0])}x{n_cols}: torch.softmax launches "
                f"{n_torch} CUDA kernel(s) ({_short(g.loc['torch_softmax', 'kernel_names'])}), moving "
                f"{g.loc['torch_softmax', 'bytes'] / g.loc['torch_softmax', 'input_bytes']:.0f}x the input's bytes; "
                f"the five-op version launches {n_naive}, moving "
                f"{g.loc['torch_naive', 'bytes'] / g.loc['torch_naive', 'input_bytes']:.0f}x; the Triton kernel "
                f"{int(g.loc['triton_fused', 'value'])}")
        at = times[(times["dtype"] == dtype) & (times["n_cols"] == n_cols)].set_index("provider")["value"]
        slowdown = at.get("torch_naive", float("nan")) / at.get("torch_softmax", float("nan"))
        if n_torch >= s["several"]:
            verdicts.append(REPRODUCED)
        elif slowdown != slowdown:  # NaN: the same width was not timed
            verdicts.append(NEEDS_GPU)
            text += f"; the five-op version's cost was not timed at {n_cols} columns"
        elif slowdown >= s["min_naive_slowdown"]:
            verdicts.append(NUANCE)
            text += (f"; done op by op it takes {slowdown:.2f}x torch.softmax's time - torch.softmax itself is one "
                     "fused kernel: the several passes are what the op-by-op ('naive execution model') version makes")
        else:
            verdicts.append(NOT_REPRODUCED)
            text += f"; the op-by-op version takes only {slowdown:.2f}x the time: its extra passes cost little here"
        parts.append(text)
    return "; ".join(parts) + " (bytes: the least each kernel must read and write, counted in code)", _weakest(verdicts)


# --- The writeup's lesson applied to its own kernels, at shapes it never tried ---------------------------------

def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


@claim(18, ['attention/head_dims'])
def attention_head_dims(t, s):
    """Finding: the printed kernel (row masks only, BLOCK_V = next_power_of_2(d)) is wrong wherever d is
    not a power of two, and the head-dim mask fixes it."""
    d = ok(t["attention/head_dims"], metric="matches")
    if d.empty:
        return "no head dim was run", NOT_REPRODUCED
    errors = ok(t["attention/head_dims"], metric="max_abs_diff")
    parts, printed_wrong, fixed = [], None, True
    for provider, g in _by_provider(d):
        worst = errors[errors["provider"] == provider].groupby("d")["value"].max()
        wrong = sorted(int(x) for x in g[~g["value"].astype(bool)]["d"].unique())
        parts.append(f"{provider}: wrong (outside the FlashAttention rule) at d = {wrong or 'none'}; max |diff| vs fp64 "
                     + ", ".join(f"d={int(k)}: {v:.2g}" for k, v in worst.items()))
        if provider == "triton_writeup":
            printed_wrong = set(wrong)
        else:
            fixed &= not wrong
    measured = "; ".join(parts) + _skipped(t["attention/head_dims"])
    dims = {int(x) for x in d["d"].unique()}
    odd = {x for x in dims if not _power_of_two(x)}
    if not odd or printed_wrong is None or not (odd & printed_wrong) or not fixed:
        return measured, NOT_REPRODUCED
    if printed_wrong == odd:
        return (measured + " - as printed, the kernel reads (and writes) the next row's first elements at every head "
                "dim that is not a power of two; the one-line fix (a head-dim mask) is right at every one"), REPRODUCED
    return (measured + f" - as printed it is wrong at d = {sorted(printed_wrong)}, while the head dims that are not "
            f"powers of two are {sorted(odd)}: the pattern holds only in part"), NUANCE


@claim(19, ['softmax/bug', 'softmax/wide'])
def softmax_past_largest_block(t, s):
    """Finding: the writeup's fix asks for a block of next_power_of_2(n_cols) elements, which Triton refuses
    past 2^20; the project's softmax (rows split over programs) is right there."""
    r, raised = _bug_at(t, s["n_cols"], "dynamic")
    wide = t["softmax/wide"]
    right = _bool(wide, "matches_torch")
    widths = sorted(int(x) for x in ok(wide, metric="matches_torch")["n_cols"].unique())
    gpu_only = sorted(int(x) for x in wide[wide["status"] == "needs_gpu"]["n_cols"].dropna().unique())
    text = (f"the writeup's fix at n_cols={s['n_cols']}: "
            + (f"raises \"{_first_line(raised)}\"" if raised else "ran, max |diff| "
               + (f"{r['max_abs_diff']:.2g}" if r else "(not measured)"))
            + f"; the project's softmax, forward and backward, within atol at {int(right.sum())}/{len(right)} cases, "
            f"widths {widths or 'none'}" + (f" (widths {gpu_only} need a GPU)" if gpu_only else ""))
    if not raised or not right.all():
        return text, NOT_REPRODUCED
    if not widths:
        return text, NEEDS_GPU
    return text, REPRODUCED


LIMIT_TABLES = ['vector_add/limits', 'relu_dropout/limits', 'softmax/limits', 'flash_attention/limits']


def _limits_correct(key: str, d: pd.DataFrame, s: dict) -> bool:
    """Did a probe that ran (status ok) compute the right thing? Per table, its own criterion."""
    if key == "vector_add/limits":
        return bool(_bool(d, "exact_match").all())
    if key == "relu_dropout/limits":
        v = {m: g["value"].iloc[0] for m, g in ok(d).groupby("metric")}
        good = (abs(v["tail_drop_rate"] - d["p"].iloc[0]) <= s["rate_tolerance"] and v["tail_survivors_max_ulp"] <= s["max_ulp"]
                and abs(v["tail_head_mask_agreement"] - v["expected_agreement"]) <= s["rate_tolerance"])
        return bool(good and v.get("backward_same_mask_tail", 1))
    if key == "softmax/limits":
        v = ok(d)
        atol = v["atol"].iloc[0]
        return bool((v[v["metric"] == "max_abs_diff"]["value"] <= atol).all()
                    and (v[v["metric"] == "backward_max_abs_diff"]["value"] <= 4 * atol).all())
    return bool(_bool(d, "matches").all())


@claim(20, LIMIT_TABLES)
def past_int32(t, s):
    """Finding: past 2^31 elements the printed kernels' int32 offsets fault; the project's kernels (64-bit
    offsets where needed, one folded grid axis for flash_attention) are right there and past 65535
    batch x heads."""
    parts, writeup_broke, project_right, measured_any, writeup_measured = [], True, True, False, False
    for key in LIMIT_TABLES:
        d = t[key]
        by = ["provider"] + (["n_cols"] if "n_cols" in d else [])
        for (provider, *_), g in d.groupby(by, sort=False):
            status = g["status"].iloc[0]
            if status == "needs_gpu":
                continue
            measured_any = True
            shape = (f"{int(g['elements'].iloc[0])} elements" if "elements" in g and g["elements"].notna().any()
                     else f"{int(g['size'].iloc[0])} elements")
            if "heads" in g and g["heads"].notna().any():
                shape += f", batch x heads {int(g['batch'].iloc[0] * g['heads'].iloc[0])}"
                if "bh" in g and g["bh"].notna().any():  # 65535: the first past a grid axis's limit
                    shape += f" (checked at heads {', '.join(str(int(b)) for b in sorted(g['bh'].dropna().unique()))})"
            if status == "ok":
                right = _limits_correct(key, g, s)
                worst = ok(g, metric="max_abs_diff")["value"]
                outcome = ("correct" if right else "WRONG") + (f" (max |diff| {worst.max():.2g})" if len(worst) else "")
            else:
                right = False
                outcome = f"{status}: {_first_line(g['error'].iloc[0])}"
            if provider == "triton_writeup":
                writeup_measured = True
                writeup_broke &= not right
            else:
                project_right &= right
            parts.append(f"{key.split('/')[0]} {provider} at {shape}: {outcome}")
    if not measured_any:
        return "sizes past 2^31 elements take gigabytes of GPU memory: not run in the interpreter", NEEDS_GPU
    measured = "; ".join(parts)
    if not writeup_measured:
        return measured + "; the kernels as printed were not run here", NEEDS_GPU
    return measured, REPRODUCED if writeup_broke and project_right else NOT_REPRODUCED


def check_declarations(claims: list[dict], figures=None) -> None:
    """Every claim of claims.yaml has exactly one check, and every figure a claim links is drawn (when
    ``figures`` is given). The workflow calls this when it builds the DAG, so a gap fails before any job
    runs. (A table a check needs that this run does not produce leaves the claim 'not settled'.)"""
    ids = [c["id"] for c in claims]
    if sorted(ids) != sorted(CHECKS):
        raise ValueError(f"claims.yaml ids {sorted(ids)} and registered checks {sorted(CHECKS)} differ")
    for c in claims:
        if figures is not None and c.get("figure") and c["figure"] not in figures:
            raise ValueError(f"claim {c['id']} links figure {c['figure']!r}, which lab/figures.py does not draw")


def check_probes(claims: list[dict], config: dict) -> None:
    """Each probe point a claim reads (``probes: {setting: config.path}``) must be among the values the
    config runs there, or that claim could not be settled: refused before any job starts, naming it."""
    from .settings import ConfigError

    for c in claims:
        for setting, path in (c.get("probes") or {}).items():
            node = config
            for part in path.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is None:  # the experiment is not configured: the claim will say 'not settled'
                continue
            wanted = c["settings"][setting]
            for value in wanted if setting == "shapes" else [wanted]:
                if value not in node:
                    raise ConfigError(f"config key {path} must include {value!r}: claim {c['id']} "
                                      f"(\"{c['claim']}\") is settled there")


def settle(claims: list[dict], tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    check_declarations(claims)
    rows = []
    for c in claims:
        check = CHECKS[c["id"]]
        missing = [k for k in check.tables if k not in tables]
        failed = {k: tables[k] for k in check.tables if k in tables and summary.failed(tables[k])}
        if missing:
            measured, verdict = "; ".join(f"not settled: {k} missing (not in this run)" for k in missing), NOT_SETTLED
        elif failed:
            measured = "; ".join(f"not settled: the {k} job failed ({_first_line(d['error'].iloc[0])})"
                                 for k, d in failed.items())
            verdict = NOT_SETTLED
        else:
            try:
                measured, verdict = check.fn({k: tables[k] for k in check.tables}, c.get("settings", {}))
            except (KeyError, IndexError) as e:  # a table from an older version of the project lacks what it reads
                measured = f"not settled: these tables lack what the check reads ({type(e).__name__}: {e})"
                verdict = NOT_SETTLED
        if verdict not in VERDICTS:
            raise ValueError(f"claim {c['id']}: unknown verdict {verdict!r}")
        rows.append({"id": c["id"], "claim": c["claim"], "said": c["said"], "measured": measured,
                     "verdict": verdict, "figure": c.get("figure", "")})
    return pd.DataFrame(rows)
