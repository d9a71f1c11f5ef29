"""The run comparison: ratios oriented so that > 1 is better, verdicts outside a stated noise threshold only,
numeric order, NaN parameters kept, launch-bound points apart, the claims' verdicts diffed; and on the
committed pair (same code, one GPU vs two), few points flagged."""
import copy
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from lab import compare, table

ROOT = Path(__file__).resolve().parents[1]
PROV = {key: f"<{key}>" for key in table.PROVENANCE}
CLAIMS = yaml.safe_load((ROOT / "workflow/claims.yaml").read_text())
# Two invocations of the same commit on two H200 machines (README: "Comparing runs").
COMMITTED = [ROOT / "results/nvidia-h200-cb2e4cd", ROOT / "results/nvidia-h200-repeat"]  # one commit, two machines


def timed(points, metric="bandwidth", unit="GB/s", spread=0.002, kernel="k", experiment="performance"):
    """A performance table: per point (params, median ms) the p20/p50/p80 rows of time_ms and, unless
    ``metric`` is None, of a rate that is its inverse (as the experiments write them)."""
    rows = []
    for params, ms in points:
        for q, f in ((0.2, 1 - spread), (0.5, 1.0), (0.8, 1 + spread)):
            rows.append(table.row("time_ms", ms * f, "ms", quantile=q, **params))
            if metric:
                rows.append(table.row(metric, 1 / (ms * f), unit, quantile=q, **params))
    return table.to_frame(rows, kernel, experiment, PROV)


def run(points, **kw):
    return {f"{kw.get('kernel', 'k')}/performance": timed(points, **kw)}


def section(page: str, heading: str) -> str:
    """The text of a page from ``heading`` up to the next heading of the same level."""
    level = heading.split(" ")[0] + " "
    rest = page.split(heading + "\n", 1)[1]
    return rest.split("\n" + level, 1)[0]


def md_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


BIG = [({"provider": p, "size": float(s)}, 0.1 * s / 4096) for p in ("triton", "torch") for s in (4096, 16384)]


def test_a_run_against_a_copy_of_itself_flags_nothing():
    a = run(BIG, spread=0.0)  # even with no spread at all the floor keeps it `same`
    j = compare.compare(a, copy.deepcopy(a))
    assert len(j) == len(BIG) and (j["verdict"] == "same").all()
    assert np.allclose(j["ratio"], 1.0) and np.allclose(j["log2_ratio"], 0.0)


@pytest.mark.parametrize("metric", ["bandwidth", "throughput", None])  # None: a table that times only
def test_2x_slowdown_is_worse_and_2x_speedup_better(metric):
    a = run(BIG, metric=metric)
    slower = run([(p, ms * 2) for p, ms in BIG], metric=metric)
    faster = run([(p, ms / 2) for p, ms in BIG], metric=metric)
    j = compare.compare(a, slower)
    assert (j["metric"] == (metric or "time_ms")).all()
    assert (j["verdict"] == "worse").all() and np.allclose(j["ratio"], 0.5) and np.allclose(j["log2_ratio"], -1)
    j = compare.compare(a, faster)
    assert (j["verdict"] == "better").all() and np.allclose(j["ratio"], 2.0) and np.allclose(j["log2_ratio"], 1)


def test_time_is_compared_only_where_a_point_has_no_rate():
    j = compare.compare(run(BIG), run(BIG))
    assert set(j["metric"]) == {"bandwidth"} and len(j) == len(BIG)
    assert np.allclose(j["time_ms_a"], [ms for _, ms in sorted(BIG, key=lambda x: (x[0]["provider"], x[0]["size"]))])


def test_1_percent_change_with_a_tight_band_is_same():
    a = run(BIG, spread=0.001)
    b = run([(p, ms * 1.01) for p, ms in BIG], spread=0.001)
    j = compare.compare(a, b)
    assert (j["verdict"] == "same").all()
    assert np.allclose(j["threshold"], compare.FLOOR)  # tight bands: the floor decides
    # just outside the floor it is a change, and a noisy point needs a larger one
    b = run([(p, ms * 1.07) for p, ms in BIG], spread=0.001)
    assert (compare.compare(a, b)["verdict"] == "worse").all()
    noisy = run([(p, ms * 1.07) for p, ms in BIG], spread=0.1)
    j = compare.compare(run(BIG, spread=0.1), noisy)
    assert (j["threshold"] > 0.2).all() and (j["verdict"] == "same").all()


def test_parameters_sort_numerically_and_integers_print_as_integers():
    sizes = [1048576, 16384, 4096, 262144]
    pts = [({"provider": "triton", "size": float(s), "p": 0.5}, 1.0) for s in sizes]  # floats, as parquet gives
    a = run(pts)
    j = compare.compare(a, a)
    assert j["size"].tolist() == sorted(sizes)
    assert str(j["size"].dtype) == "Int64" and j["p"].dtype == float  # 0.5 is no integer
    page = compare.markdown("a", "b", a, a, j)
    every = section(page, "### k/performance")
    assert [r[1] for r in md_rows(every)[1:]] == [str(s) for s in sorted(sizes)]
    assert ".0 |" not in page


def test_rows_with_nan_parameters_are_kept():
    """Like calibration/ceilings: device_copy has bytes but no n, bf16_matmul n but no bytes."""
    pts = [({"variant": "device_copy", "bytes": 2.0**31, "n": np.nan}, 0.5),
           ({"variant": "bf16_matmul", "bytes": np.nan, "n": 8192.0}, 1.5)]
    a = {"calibration/ceilings": timed(pts, kernel="calibration", experiment="ceilings")}
    b = {"calibration/ceilings": timed([(p, ms * 2) for p, ms in pts], kernel="calibration", experiment="ceilings")}
    j = compare.compare(a, b).set_index("variant")
    assert sorted(j.index) == ["bf16_matmul", "device_copy"]
    assert pd.isna(j.loc["device_copy", "n"]) and j.loc["device_copy", "bytes"] == 2**31
    assert pd.isna(j.loc["bf16_matmul", "bytes"]) and j.loc["bf16_matmul", "n"] == 8192
    assert (j["verdict"] == "worse").all()


def test_launch_bound_points_are_apart():
    tiny = [({"provider": "triton", "size": 16.0}, 0.005)]  # 5 us
    a, b = run(BIG + tiny), run(BIG + [(p, ms * 3) for p, ms in tiny])  # only the tiny point changes
    j = compare.compare(a, b)
    assert j["launch_bound"].sum() == 1
    assert j.loc[j["launch_bound"], "verdict"].tolist() == ["worse"]
    assert (j.loc[~j["launch_bound"], "verdict"] == "same").all()
    page = compare.markdown("a", "b", a, b, j)
    main = md_rows(section(page, "## Summary (launch-bound points apart, below)"))
    head, row = main[0], main[1]
    assert row[0] == "k/performance" and row[head.index("points")] == str(len(BIG)) and row[head.index("worse")] == "0"
    bound = md_rows(section(page, f"## Launch-bound points (median under {compare.LAUNCH_BOUND_MS * 1e3:g} us)"))
    assert bound[1][bound[0].index("points")] == "1" and bound[1][bound[0].index("worse")] == "1"
    assert "3.00x slower" in section(page, f"## Launch-bound points (median under {compare.LAUNCH_BOUND_MS * 1e3:g} us)")


def test_flagged_points_rank_by_size_of_change_slowdowns_included():
    pts = [({"provider": n}, 1.0) for n in ("slow", "fast", "flat")]
    a = run(pts)
    b = run([({"provider": "slow"}, 7.8), ({"provider": "fast"}, 1 / 1.2), ({"provider": "flat"}, 1.0)])
    j = compare.compare(a, b)
    page = compare.markdown("a", "b", a, b, j)
    flagged = md_rows(section(page, "### k/performance (bandwidth)"))
    assert [r[0] for r in flagged[1:]] == ["slow", "fast"]  # a 7.8x slowdown above a 1.2x speedup; flat not flagged
    assert flagged[1][-1] == "7.80x slower" and flagged[2][-1] == "1.20x faster"
    summary = md_rows(section(page, "## Summary (launch-bound points apart, below)"))
    assert summary[1][summary[0].index("largest change")] == "7.80x slower"
    geomean = float(summary[1][summary[0].index("geomean ratio")])
    assert geomean == pytest.approx((1 / 7.8 * 1.2 * 1.0) ** (1 / 3), rel=1e-3)


def test_the_tidy_table_has_a_verdict_of_three_values(tmp_path):
    a = run(BIG)
    b = run([(p, ms * f) for (p, ms), f in zip(BIG, (2, 0.5, 1.0, 1.01))])
    path = tmp_path / "a_vs_b.parquet"
    table.write_parquet(compare.compare(a, b), path)
    t = pd.read_parquet(path)
    assert set(t["verdict"]) == set(compare.VERDICTS)
    assert {"table", "metric", "provider", "size", "p20_a", "p50_a", "p80_a", "p20_b", "p50_b", "p80_b",
            "ratio", "log2_ratio", "threshold", "launch_bound"} <= set(t.columns)
    assert len(t) == len(BIG) and [p.name for p in tmp_path.iterdir()] == ["a_vs_b.parquet"]


def test_runs_of_earlier_versions_compare():
    """No quantile column (one value per point), a column the code does not know, one missing status."""
    a = run(BIG)
    old = timed([(p, ms * 2) for p, ms in BIG])
    old = old[old["quantile"] == 0.5].drop(columns=["quantile", "status", "fingerprint"]).assign(mystery="x")
    j = compare.compare(a, {"k/performance": old})
    assert len(j) == len(BIG) and (j["verdict"] == "worse").all()


def test_a_parameter_that_tells_points_apart_in_one_run_only_pairs_nothing():
    """Run a times forward and backward; run b (an older table) has no direction: which of a's points is
    b's cannot be told, so none is compared, and coverage says so."""
    a = run([({"provider": "t", "size": 4096.0, "direction": d}, ms) for d, ms in (("forward", 1.0), ("backward", 2.0))])
    b = run([({"provider": "t", "size": 4096.0}, 1.0)])
    assert compare.compare(a, b).empty
    assert compare.coverage(a, b).to_dict("records") == [{"table": "k/performance", "a": 2, "b": 1, "both": 0,
                                                           "why": ""}]


@pytest.mark.parametrize("ms_b", [0.0, float("nan")])
def test_a_point_measured_as_zero_or_nan_is_not_compared_and_coverage_says_so(ms_b):
    a = run(BIG, metric=None)
    b = run([(p, ms_b if p["size"] == 4096 else ms) for p, ms in BIG], metric=None)
    j = compare.compare(a, b)
    assert len(j) == 2 and set(j["size"]) == {16384}
    assert compare.coverage(a, b).to_dict("records") == [{"table": "k/performance", "a": 4, "b": 4, "both": 2,
                                                           "why": ""}]


def test_claims_diff_changed_first_and_survives_a_run_it_cannot_settle(monkeypatch):
    claims = [{"id": 1, "claim": "one"}, {"id": 2, "claim": "two"}]

    def settle(claims, tables):
        if not tables:
            raise KeyError("softmax/bug")
        verdict = tables["verdict"]
        return pd.DataFrame({"id": [1, 2], "claim": ["one", "two"], "said": "", "measured": "",
                             "verdict": ["reproduced", verdict], "figure": ""})

    monkeypatch.setattr(compare.claims_mod, "settle", settle)
    diff, errors = compare.claims_diff(claims, {"verdict": "reproduced"}, {"verdict": "not reproduced"})
    assert not errors
    assert diff["id"].tolist() == [2, 1] and diff["changed"].tolist() == ["yes", "no"]
    assert diff.loc[0, "verdict_b"] == "not reproduced"
    page = compare.markdown("a", "b", {"x": timed(BIG)}, {}, pd.DataFrame(columns=["table"]), claims)
    assert "- `b`: could not settle: KeyError" in page
    assert page.index("## Claims") < page.index("## How to read it")


@pytest.fixture(scope="module")
def committed():
    if not all(p.is_dir() for p in COMMITTED):
        pytest.skip("the committed H200 runs are not in this checkout")
    a, b = (compare.read_run(p) for p in COMMITTED)
    return a, b, compare.compare(a, b)


def test_committed_pair_same_code_flags_under_10_percent(committed):
    a, b, j = committed
    assert len(j) > 400  # every timed point of both runs, not a few survivors of the join
    assert (j["verdict"] != "same").mean() < 0.10
    assert {"calibration/ceilings", "flash_attention/performance", "softmax/performance"} <= set(j["table"])
    assert len(j[j["table"] == "calibration/ceilings"]) == 2
    assert j["launch_bound"].any() and not j["launch_bound"].all()
    # and a run against itself flags nothing, with every claim's verdict unchanged
    self = compare.compare(a, a)
    assert len(self) == len(j) and (self["verdict"] == "same").all()


def test_committed_pair_claims_do_not_change(committed):
    a, b, j = committed
    diff, errors = compare.claims_diff(CLAIMS, a, b)
    assert not errors and len(diff) == len(CLAIMS) and (diff["changed"] == "no").all()
    page = compare.markdown("nvidia-h200-cb2e4cd", "nvidia-h200-repeat", a, b, j, CLAIMS)
    assert page.index("## Claims") < page.index("## Summary")


def test_what_only_one_run_has_is_listed():
    """A table in one run only, a failed table, and points one run did not measure: named, with counts, and
    nothing listed for two runs that measured the same."""
    same = [({"n": n}, 1.0) for n in (1, 2, 3)]
    a = {**run(same), **run([({"n": 1}, 1.0)], kernel="gone")}
    b = {**run(same[:2]), "k/bug": table.to_frame([table.row("x", None, status="failed", error="boom")], "k", "bug",
                                                  PROV)}
    gaps = compare.coverage(a, b).set_index("table")
    assert gaps.loc["gone/performance"].tolist() == [1, "absent", 0, ""]
    assert gaps.loc["k/bug"].tolist() == ["absent", "failed", 0, "boom"]
    assert gaps.loc["k/performance"].tolist() == [3, 2, 2, ""]
    page = compare.markdown("a", "b", a, b, compare.compare(a, b))
    assert "## What only one run has" in page and "gone/performance" in page and "boom" in page
    assert compare.coverage(a, a).empty and "What only one run has" not in compare.markdown("a", "a", a, a,
                                                                                           compare.compare(a, a))


def test_an_unreadable_table_is_listed_as_failed_not_a_crash(tmp_path):
    """A table cut short in one run: the comparison names it (failed, with why) and compares the rest."""
    run = tmp_path / "cut"
    shutil.copytree(ROOT / "results/nvidia-h200", run, ignore=shutil.ignore_patterns("*.png", "logs"))
    bug = run / "softmax/performance.parquet"
    bug.write_bytes(bug.read_bytes()[:100])
    a, b = compare.read_run(ROOT / "results/nvidia-h200"), compare.read_run(run)
    assert "cannot be read" in b["softmax/performance"]["error"].iloc[0]
    listed = compare.coverage(a, b).set_index("table")
    assert listed.loc["softmax/performance", "b"] == "failed"
    assert "cannot be read" in listed.loc["softmax/performance", "why"]
    assert "cannot be read" in compare.markdown("a", "b", a, b, compare.compare(a, b))
    joined = compare.compare(a, b)
    assert not joined.empty and "softmax/performance" not in set(joined["table"])
