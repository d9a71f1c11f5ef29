"""Summaries as the report reads them. The softmax width sweep: ratios against torch and the copy fraction
come from the timings, forward and backward kept apart, and the fusion comparison reads forward rows only.
FlashAttention: what tuning bought per bucket, and the cost of a call at a new length."""
import pandas as pd

from lab import plots, report
from lab.units import flash_attention, ladder, softmax
from lab.table import row

GPU = dict(device="NVIDIA H200", backend="gpu", triton="3.6.0")
COPY = 4000.0


def bandwidth(provider, direction, n_cols, gbps, dtype="float32"):
    return [row("bandwidth", gbps, "GB/s", quantile=0.5, provider=provider, direction=direction, n_cols=n_cols,
                n_rows=2**26 // n_cols, dtype=dtype),
            row("time_ms", 1.0 / gbps, "ms", quantile=0.5, provider=provider, direction=direction, n_cols=n_cols,
                n_rows=2**26 // n_cols, dtype=dtype, bytes=1)]


def softmax_table():
    rows = []
    for n, ours, torch_, naive in ((128, 3900, 4000, 500), (4096, 3950, 2000, 500), (262144, 3000, 1500, 400)):
        rows += bandwidth("triton_fused", "forward", n, ours) + bandwidth("torch_softmax", "forward", n, torch_)
        rows += bandwidth("torch_naive", "forward", n, naive)
        rows += bandwidth("triton_fused", "backward", n, ours / 2) + bandwidth("torch_softmax", "backward", n, torch_)
    return pd.DataFrame(rows).assign(**GPU)


def test_softmax_widths_ratios_and_copy_fraction():
    w = softmax.softmax_widths(softmax_table(), COPY).set_index(["direction", "n_cols"])
    assert w.loc[("forward", 128), "torch/triton time"] == 3900 / 4000  # torch faster: below 1
    assert w.loc[("forward", 4096), "torch/triton time"] == 3950 / 2000
    assert w.loc[("backward", 4096), "torch/triton time"] == 3950 / 2 / 2000  # backward rows stay apart
    assert w.loc[("forward", 262144), "triton/copy"] == 3000 / COPY
    assert list(w.index.get_level_values("direction").unique()) == ["forward", "backward"]


def test_report_section_names_the_weakest_width(tmp_path):
    text = softmax.section_widths({"softmax/performance": softmax_table().assign(copy_gbps=COPY)})  # its job's ceiling
    assert "forward, float32: against torch 0.97x..2.00x (lowest at 128 columns)" in text
    assert "from 1024 columns up at least 0.75 of copy (at 262144)" in text
    plots.save(softmax.plot_softmax_widths(softmax.softmax_widths(softmax_table(), COPY), COPY, "NVIDIA H200"),
               tmp_path / "softmax_widths.png")
    assert (tmp_path / "softmax_widths.png").stat().st_size > 0


def test_compiled_softmax_gets_its_own_ratio_and_report_line():
    t = pd.concat([softmax_table(), pd.DataFrame(
        bandwidth("torch_compile", "forward", 128, 3000) + bandwidth("torch_compile", "forward", 4096, 4100)
        + bandwidth("torch_compile", "forward", 262144, 1500)).assign(**GPU)])
    w = softmax.softmax_widths(t, COPY).set_index(["direction", "n_cols"])
    assert w.loc[("forward", 4096), "compiled/triton time"] == 3950 / 4100  # compiled faster there: below 1
    assert pd.isna(w.loc[("backward", 4096), "compiled/triton time"])  # the compiled backward was not timed here
    text = softmax.section_widths({"softmax/performance": t.assign(copy_gbps=COPY)})
    assert "forward, float32: against torch 0.97x..2.00x (lowest at 128 columns), against torch.compile 0.96x..2.00x " \
           "(lowest at 4096 columns)" in text
    assert "backward, float32: against torch 0.49x..1.00x (lowest at 128 columns);" in text  # no compiled line


def test_fusion_compares_forward_times_only():
    t = softmax_table()
    f = ladder.fusion({"softmax/performance": t,
                        "relu_dropout/performance": t.iloc[:0].assign(size=[])})
    assert set(f["unfused"]) == {"torch_naive"}
    assert f.set_index("size").loc[128, "time_ratio"] == (1 / 500) / (1 / 3900)


def flash_rows():
    """Two buckets of fwd tuning (candidates in order), a first-call pair and a memory pair."""
    tune = [row("tuning_ms", ms, "ms", provider="triton_flash", variant="fwd", tile=tile, causal=False, block_d=64,
                bucket_q=bucket, bucket_k=bucket, dtype="bfloat16")
            for bucket, times in ((1024, {"a": 2.0, "b": 1.0}), (4096, {"a": 3.0, "b": 4.0}))
            for tile, ms in times.items()]
    first = [row("first_call_ms", 500.0, "ms", variant="untuned_bucket", seq=3000, bucket_tuned_at=3000),
             row("first_call_ms", 0.25, "ms", variant="tuned_bucket", seq=3001, bucket_tuned_at=3000),
             row("peak_extra_memory", 3 * 2**20, "bytes", variant="first_call", seq=65537),
             row("peak_extra_memory", 2 * 2**20, "bytes", variant="later_call", seq=65537)]
    return pd.DataFrame(tune + first).assign(status="ok")


def test_tuning_reports_winners_and_what_the_first_candidate_cost():
    t = flash_attention.tuning(flash_rows())
    assert t.to_dict("records") == [{"kernel": "fwd", "d": 64, "causal": False, "buckets": 2, "candidates": 2,
                                     "winners": "a, b", "first candidate / best, worst bucket": 2.0}]


def test_call_cost_text_quotes_the_first_call_and_memory():
    text = flash_attention._call_cost(flash_rows())
    assert "500 ms at S=3000" in text and "0.25 ms at S=3001, in the bucket S=3000 had tuned" in text
    assert "3.000 MiB for the first (tuning) call, 2.000 MiB for a later one" in text


def test_a_report_section_whose_table_is_missing_says_so():
    """A GPU run whose config left attention's timing out: its section says what is missing, never KeyError."""
    tables = {"softmax/performance": softmax_table().assign(copy_gbps=COPY)}
    text = report._sections(tables)
    assert "Not settled: `attention/performance` missing (not in this run)." in text
    assert "Not settled: `calibration/ceilings` missing" in text
    assert "softmax at every row width" in text  # what it has, it still reports
