"""Verdicts come from the data: each check, fed tables built to say one thing, gives every verdict it can
write (reproduced / with a nuance / not reproduced / needs a GPU), with its thresholds from claims.yaml."""
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lab import claims
from lab.claims import NEEDS_GPU, NOT_REPRODUCED, NUANCE, REPRODUCED
from lab.table import needs_gpu, row

CLAIMS = {c["id"]: c for c in yaml.safe_load((Path(claims.__file__).parents[1] / "claims.yaml").read_text())}
GPU = dict(device="NVIDIA H200", backend="gpu", triton="3.6.0")
CPU = dict(device="cpu (x86_64, Triton interpreter)", backend="interpreter", triton="3.9.0")


def frame(rows, origin=GPU) -> pd.DataFrame:
    return pd.DataFrame(rows).assign(**origin)


def verdict(claim_id: int, tables: dict, **settings) -> tuple[str, str]:
    check = claims.CHECKS[claim_id]
    assert set(tables) == set(check.tables)
    return check.fn(tables, {**CLAIMS[claim_id].get("settings", {}), **settings})


def timing(provider, ms, **params):
    return [row("time_ms", ms, "ms", quantile=0.5, provider=provider, **params)]


# --- claim 10: the wall -------------------------------------------------------------------------------------

def wall_rows(dtype, d, ran_to, fails_at):
    rows = [row("max_abs_diff", 1e-4, dtype=dtype, d=d, n_k=n, shared_limit=232448)
            for n in (64, 128, ran_to)]
    if fails_at:
        rows.append(row("shared_required", 327680, "bytes", status="out_of_resources", dtype=dtype, d=d, n_k=fails_at,
                        shared_limit=232448, error="out of resource: shared memory, Required: 327680"))
    return rows


@pytest.mark.parametrize("walls, expected", [
    ([("float16", 64, 1024, 1025), ("float32", 64, 512, 513)], REPRODUCED),
    ([("float16", 64, 1024, 1025), ("float16", 32, 131072, None)], NUANCE),
    ([("float16", 64, 131072, None)], NOT_REPRODUCED),
])
def test_wall_verdict_follows_where_launches_failed(walls, expected):
    t = {"attention/wall": frame([r for w in walls for r in wall_rows(*w)])}
    measured, got = verdict(10, t)
    assert got == expected, measured
    if expected == REPRODUCED:
        assert "n_k = 513..1025" in measured  # the wall moves: measured, not asserted in prose


def test_wall_compiled_only_needs_a_gpu():
    t = {"attention/wall": frame([row("shared_required", 81920, "bytes", status="compiled_only", dtype="float16",
                                      d=64, n_k=512)], CPU)}
    assert verdict(10, t)[1] == NEEDS_GPU


# --- claim 11: shared memory ---------------------------------------------------------------------------------

def ceilings(per_sm, per_block, device_memory):
    return frame([row("shared_memory_per_block", per_block, "bytes", provider="device"),
                  row("shared_memory_per_multiprocessor", per_sm, "bytes", provider="device"),
                  row("device_memory", device_memory, "bytes", provider="device"),
                  row("bandwidth", 4000, "GB/s", provider="device_copy", quantile=0.5),
                  row("throughput", 700, "TFLOP/s", provider="bf16_matmul", quantile=0.5)])


@pytest.mark.parametrize("per_sm, device_memory, expected", [
    (48 * 1024, 16 * 2**30, REPRODUCED),       # a GPU of the 'tens of kilobytes' kind
    (228 * 1024, 141 * 2**30, NUANCE),          # the H200: hundreds of KiB, still tiny next to HBM
    (228 * 1024, 64 * 2**20, NOT_REPRODUCED),   # 'not gigabytes' would not hold
])
def test_shared_memory_verdict_follows_the_measured_sizes(per_sm, device_memory, expected):
    measured, got = verdict(11, {"calibration/ceilings": ceilings(per_sm, per_sm - 1024, device_memory)})
    assert got == expected, measured
    assert f"{per_sm} B" in measured


def test_shared_memory_needs_a_gpu():
    assert verdict(11, {"calibration/ceilings": frame([needs_gpu("x")], CPU)})[1] == NEEDS_GPU


# --- claim 12: fusion ----------------------------------------------------------------------------------------

def fusion_tables(fused_ms, unfused_ms):
    """Both kernels, every size, with the given time functions of the size."""
    dr, sm = [], []
    for size in (2**12, 2**16, 2**20, 2**24):
        for provider in ("triton_writeup", "triton_fused"):
            dr += timing(provider, fused_ms(size), size=size, dtype="float32", bytes=8 * size)
        dr += timing("torch_unfused", unfused_ms(size), size=size, dtype="float32", bytes=17 * size)
        n_cols = size // 4096
        sm += timing("triton_fused", fused_ms(size), n_cols=n_cols, dtype="float32", bytes=8 * size)
        sm += timing("torch_naive", unfused_ms(size), n_cols=n_cols, dtype="float32", bytes=32 * size)
    return {"relu_dropout/performance": frame(dr), "softmax/performance": frame(sm)}


def test_fusion_faster_at_every_size_is_reproduced():
    measured, got = verdict(12, fusion_tables(lambda n: 0.005 + n * 1e-9, lambda n: 0.010 + n * 2e-9))
    assert got == REPRODUCED, measured
    assert "faster at every size" in measured


def test_fusion_losing_at_small_sizes_is_a_nuance_with_its_crossover():
    # fused: 20 us per call plus bytes; unfused: 8 us plus twice the bytes -> equal at 1.2e7 elements
    measured, got = verdict(12, fusion_tables(lambda n: 0.020 + n * 1e-9, lambda n: 0.008 + n * 2e-9))
    assert got == NUANCE, measured
    assert f"below {2**24}" in measured and "per-call cost" in measured


def test_fusion_losing_at_one_middle_size_is_reported_as_no_crossover():
    measured, got = verdict(12, fusion_tables(lambda n: 0.005 + n * 1e-9 + (0.05 if n == 2**16 else 0),
                                              lambda n: 0.010 + n * 2e-9))
    assert got == NUANCE, measured
    assert "no crossover" in measured and f"at {2**16}" in measured


def test_fusion_slower_everywhere_is_not_reproduced():
    measured, got = verdict(12, fusion_tables(lambda n: 0.010 + n * 3e-9, lambda n: 0.005 + n * 2e-9))
    assert got == NOT_REPRODUCED, measured


def test_fusion_needs_a_gpu_without_timings():
    t = {"relu_dropout/performance": frame([needs_gpu("x")], CPU), "softmax/performance": frame([needs_gpu("x")], CPU)}
    assert verdict(12, t)[1] == NEEDS_GPU


# --- claims 2 and 15: dropout rates --------------------------------------------------------------------------

def statistics(rate_error=0.0005, ulp=0.0, size=100_000, providers=("triton_writeup", "triton_fused")):
    rows = []
    for provider in providers:
        for p in (0.1, 0.5, 0.9):
            params = dict(provider=provider, p=p, size=size, dtype="float32", variant=f"p={p}")
            sigma = (p * (1 - p) / size) ** 0.5
            rows += [row("drop_rate_single_seed", p + rate_error, seed=0, **params),
                     row("within_tolerance_single_seed", rate_error <= 0.01, "bool", tolerance=0.01, **params),
                     row("drop_rate", p + rate_error, seed=0, sigma=sigma, tolerance=0.01, **params),
                     row("max_abs_rate_error", rate_error, seeds=100, sigma=sigma, **params),
                     row("survivor_max_ulp_error", ulp, "ulp", seeds=100, **params)]
    return {"relu_dropout/statistics": frame(rows)}


@pytest.mark.parametrize("rate_error, ulp, expected", [
    (0.0005, 0.0, REPRODUCED), (0.0005, 5.0, NUANCE), (0.02, 0.0, NOT_REPRODUCED), (0.0005, 100.0, NOT_REPRODUCED)])
def test_dropout_rate_verdicts(rate_error, ulp, expected):
    measured, got = verdict(2, statistics(rate_error, ulp))
    assert got == expected, measured
    assert "triton_writeup" in measured and "triton_fused" in measured  # both kernels, named


@pytest.mark.parametrize("rate_error, writeup_rates, expected", [
    (0.00005, {0.1: 0.10005, 0.5: 0.5, 0.9: 0.9}, REPRODUCED),   # literally within 0.0001
    (0.0005, None, NUANCE),                                      # within 0.01 only (the writeup's own numbers too)
    (0.02, None, NOT_REPRODUCED),
])
def test_hundredth_of_a_percent(rate_error, writeup_rates, expected):
    extra = {"writeup_rates": writeup_rates} if writeup_rates else {}
    measured, got = verdict(15, statistics(rate_error), **extra)
    assert got == expected, measured


# --- claim 14: the mask --------------------------------------------------------------------------------------

def mask_table(unmasked_written):
    rows = []
    for variant, written in (("masked", 0), ("unmasked", unmasked_written)):
        params = dict(variant=variant, size=1000, block_size=1024, expected_past_end=24, dtype="float32")
        rows += [row("elements_written_past_end", written, **params),
                 row("read_past_end", written > 0, "bool", **params),
                 row("in_bounds_exact", True, "bool", **params)]
    return {"vector_add/mask": frame(rows)}


@pytest.mark.parametrize("written, expected", [(24, REPRODUCED), (0, NOT_REPRODUCED), (5, NOT_REPRODUCED)])
def test_mask_verdict(written, expected):
    measured, got = verdict(14, mask_table(written))
    assert got == expected, measured


# --- claim 16: the buggy kernel's output ---------------------------------------------------------------------

@pytest.mark.parametrize("diff, expected", [(2e-9, REPRODUCED), (0.3, NOT_REPRODUCED)])
def test_buggy_softmax_is_softmax_of_first_block(diff, expected):
    params = dict(variant="hardcoded", n_rows=4, n_cols=2000, block_size=1024, expected_dropped=976, dtype="float32")
    t = {"softmax/bug": frame([row("diff_vs_softmax_of_written_columns", diff, written_columns=1024, atol=1e-6, **params),
                               row("columns_dropped", 976, **params)])}
    measured, got = verdict(16, t)
    assert got == expected, measured


# --- claim 17: passes of torch.softmax -----------------------------------------------------------------------

@pytest.mark.parametrize("torch_kernels, naive_kernels, expected", [
    (3, 5, REPRODUCED), (1, 5, NUANCE), (1, 1, NOT_REPRODUCED)])
def test_softmax_passes(torch_kernels, naive_kernels, expected):
    rows = [row("cuda_kernels", n, provider=p, dtype="float32", n_rows=4096, n_cols=4096, kernel_names="k",
                bytes=b, input_bytes=2**26)
            for p, n, b in (("torch_softmax", torch_kernels, 2**27), ("torch_naive", naive_kernels, 2**29),
                            ("triton_fused", 1, 2**27))]
    measured, got = verdict(17, {"softmax/passes": frame(rows)})
    assert got == expected, measured
    if expected == NUANCE:
        assert "already one fused kernel" in measured


def test_softmax_passes_needs_a_gpu():
    assert verdict(17, {"softmax/passes": frame([needs_gpu("x")], CPU)})[1] == NEEDS_GPU


# --- every verdict is reachable, and the registry matches claims.yaml ----------------------------------------

def test_every_claim_of_the_writeup_has_a_check_and_thresholds_live_in_claims_yaml():
    assert sorted(CLAIMS) == sorted(claims.CHECKS) and len(CLAIMS) >= 17
    source = Path(claims.__file__).read_text()
    for number in ("0.01", "0.0001", "1e-4", "10240", "0.00978"):  # thresholds and said values: claims.yaml only
        assert number not in source, number
