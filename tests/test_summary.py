"""The softmax width sweep as the report reads it: ratios against torch and the copy fraction come from
the timings, forward and backward kept apart, and the fusion comparison reads forward rows only."""
import pandas as pd

from lab import plots, report, summary
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
    w = summary.softmax_widths(softmax_table(), COPY).set_index(["direction", "n_cols"])
    assert w.loc[("forward", 128), "torch/triton time"] == 3900 / 4000  # torch faster: below 1
    assert w.loc[("forward", 4096), "torch/triton time"] == 3950 / 2000
    assert w.loc[("backward", 4096), "torch/triton time"] == 3950 / 2 / 2000  # backward rows stay apart
    assert w.loc[("forward", 262144), "triton/copy"] == 3000 / COPY
    assert list(w.index.get_level_values("direction").unique()) == ["forward", "backward"]


def test_report_section_names_the_weakest_width(tmp_path):
    text = report._softmax_widths({"softmax/performance": softmax_table(),
                                   "relu_dropout/performance": pd.DataFrame(columns=["status"])}, COPY)
    assert "forward, float32: against torch 0.97x..2.00x (lowest at 128 columns)" in text
    assert "from 1024 columns up at least 0.75 of copy (at 262144)" in text
    plots.save(plots.softmax_widths(summary.softmax_widths(softmax_table(), COPY), COPY, "NVIDIA H200"),
               tmp_path / "softmax_widths.png")
    assert (tmp_path / "softmax_widths.png").stat().st_size > 0


def test_fusion_compares_forward_times_only():
    t = softmax_table()
    f = summary.fusion({"softmax/performance": t,
                        "relu_dropout/performance": t.iloc[:0].assign(size=[])})
    assert set(f["unfused"]) == {"torch_naive"}
    assert f.set_index("size").loc[128, "time_ratio"] == (1 / 500) / (1 / 3900)
