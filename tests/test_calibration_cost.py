"""Issue 66: a calibration's cost charged in full to every run its penalties profile served, an amortized column
beside it, and the paired comparison on the charged time (netsense.bench.stats, netsense.bench.report)."""

from __future__ import annotations

import json
import math

import pytest

from netsense.bench import report
from netsense.bench.grid import variant_name
from netsense.bench.stats import (
    AMORTIZED_OVER,
    at_targets,
    mean_tta,
    seed_times,
    sensitivity,
    summarize,
)

COST = {"wall_seconds": 212.4, "steps": 3880, "runs": 16, "train_seconds": 5.0, "clock": "simulated"}


def _run(method, seed, tta, cost=..., scenario="s"):
    """A finished run; ``cost``: the penalties profile's cost as the trainer records it (None: no profile)."""
    r = {"status": "Succeeded", "method_label": method, "scenario": scenario, "seed": seed,
         "time_to_accuracy_s": tta, "throughput_samples_per_s": 100.0, "best_accuracy": 0.95, "final_accuracy": 0.95,
         "mean_density": 0.1, "bytes_sent_per_worker": 1e6, "steps": 10, "selection_ms_mean": 1.0,
         "target_accuracy": 0.9, "accuracy_curve": [[5, tta / 2, 0.85], [10, tta, 0.95]]}
    if cost is not ...:
        r["penalties"] = {"file": "cal/penalties.json", "cost": cost, "topk": {"0.01": 1.3}, "powersgd": {"2": 1.1}}
    return r


def _grid(tta_cost=COST):
    """tta (one profile made once for every cell: the same cost on each seed) against topk without one, 5 seeds:
    uncharged tta is the faster (mean 12 s against 16 s), charged (5 s each) the slower (17 s)."""
    return ([_run("tta", s, 10.0 + s, tta_cost) for s in range(5)]
            + [_run("topk-0.01", s, 14.0 + s, ...) for s in range(5)])


def _rows(results):
    return {r["method"]: r for r in summarize(results)}


def test_a_calibrated_row_shows_its_own_time_the_charged_and_the_amortized_beside_it():
    tta = _rows(_grid())["tta"]
    assert tta["tta_mean_s"] == pytest.approx(12.0) and tta["tta_std_s"] == pytest.approx(math.sqrt(2.5))
    assert tta["calibration_s"] == 5.0 and tta["calibration_clock"] == "simulated"
    assert tta["tta_charged_mean_s"] == pytest.approx(17.0) and tta["tta_charged_std_s"] == pytest.approx(
        math.sqrt(2.5))
    assert AMORTIZED_OVER == 10 and tta["amortized_over"] == 10
    assert tta["tta_amortized_mean_s"] == pytest.approx(12.0 + 5.0 / 10)
    assert tta["calibration_files"] == ["cal/penalties.json"]
    # every seed's record keeps what it was charged, so that the committed table alone recomputes it
    assert [s["calibration"] for s in tta["per_seed"]] == [
        {"seconds": 5.0, "clock": "simulated", "file": "cal/penalties.json"}] * 5


def test_regret_and_the_paired_comparison_use_the_charged_time():
    rows = _rows(_grid())
    tta, topk = rows["tta"], rows["topk-0.01"]
    # charged, topk is the fastest: tta's regret is its charged mean over topk's
    assert topk["regret"] == 1.0 and tta["regret"] == pytest.approx(17.0 / 16.0)
    ratios = [(15.0 + s) / (14.0 + s) for s in range(5)]
    assert tta["vs"] == "topk-0.01" and tta["pairs"] == 5
    assert tta["paired_ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 5))
    assert tta["ratio_lo"] > 1 and tta["ratio_hi"] > tta["paired_ratio"]  # charged, tta is slower on every seed
    assert topk["paired_ratio"] == pytest.approx(1 / tta["paired_ratio"]) and topk["wins"] == 1.0
    assert tta["wins"] == 0.0
    # the same runs with their cost left out: tta would lead; that is the comparison no table may make quietly
    free = _rows([{k: v for k, v in r.items() if k != "penalties"} for r in _grid()])
    assert free["tta"]["regret"] == 1.0 and free["tta"]["paired_ratio"] < 1


def test_a_row_without_a_profile_is_unchanged():
    rows = _rows(_grid())
    topk = rows["topk-0.01"]
    assert not {k for k in topk if k.startswith(("calibration", "tta_charged", "tta_amortized", "amortized"))}
    assert all("calibration" not in s for s in topk["per_seed"])
    assert topk["tta_mean_s"] == pytest.approx(16.0) and topk["tta_std_s"] == pytest.approx(math.sqrt(2.5))
    # a table of rows without a profile: the numbers the rows had before any profile existed
    plain = _rows([r for r in _grid() if r["method_label"] == "topk-0.01"]
                  + [_run("allreduce", s, 20.0 + s, ...) for s in range(5)])
    assert plain["topk-0.01"]["regret"] == 1.0 and plain["allreduce"]["regret"] == pytest.approx(22.0 / 16.0)
    assert plain["allreduce"]["paired_ratio"] == pytest.approx(
        math.exp(sum(math.log((20.0 + s) / (14.0 + s)) for s in range(5)) / 5))


def test_an_older_profile_is_charged_its_wall_seconds_and_a_profile_without_a_cost_nothing_each_named():
    old = _rows(_grid({"wall_seconds": 30.0, "steps": 3880, "runs": 16}))["tta"]  # before train_seconds
    assert old["calibration_s"] == 30.0 and old["calibration_clock"] == "wall"
    assert old["tta_charged_mean_s"] == pytest.approx(42.0) and old["tta_amortized_mean_s"] == pytest.approx(15.0)
    none = _rows(_grid(None))["tta"]  # a profile that recorded no cost: nothing to charge, and said so
    assert none["calibration_s"] is None and none["calibration_clock"] == "unrecorded"
    assert none["tta_charged_mean_s"] == pytest.approx(12.0) and none["regret"] == 1.0


def test_a_row_that_missed_the_target_on_a_seed_has_no_charged_mean():
    results = _grid()
    results[0] = {**results[0], "time_to_accuracy_s": None, "accuracy_curve": [[10, 10.0, 0.5]]}
    tta = _rows(results)["tta"]
    assert tta["reached"] == "4/5" and tta["tta_charged_mean_s"] is None and tta["tta_amortized_mean_s"] is None
    assert math.isinf(tta["regret"]) and tta["calibration_s"] == 5.0


def test_the_committed_tables_seed_times_the_further_targets_and_the_sensitivity_charge_it_too():
    results = _grid()
    rows = summarize(results)
    table = {r["method"]: r for r in json.loads(json.dumps(rows))}  # as table.json keeps it
    assert seed_times(table["tta"]) == {s: 15.0 + s for s in range(5)}
    assert seed_times(table["tta"], charge=False) == {s: 10.0 + s for s in range(5)}
    assert mean_tta(table["tta"]) == pytest.approx(17.0) and mean_tta(table["topk-0.01"]) == pytest.approx(16.0)
    at_targets(results, rows, [0.8], None)
    early = {r["method"]: r["targets"]["0.8"] for r in rows}
    # an earlier target: half the time (the curves' first evaluation), the same cost in full
    assert early["tta"]["tta_mean_s"] == pytest.approx(6.0) and early["tta"]["tta_charged_mean_s"] == pytest.approx(
        11.0)
    assert early["tta"]["vs"] == "topk-0.01" and early["tta"]["paired_ratio"] > 1
    assert "tta_charged_mean_s" not in early["topk-0.01"]
    grid = {"sensitivity": {"tta": {"method": {"method": "tta"}, "vary": {"lowRanks": [[2]]}}}}
    label = variant_name("tta", "lowRanks", [2])
    variant = [_run(label, s, 10.0 + s, ...) for s in range(5)]  # the variant ran with the priors: no charge
    varied = sensitivity(results + variant, grid)
    assert len(varied) == 1 and varied[0]["ratio"] == pytest.approx(
        math.exp(sum(math.log((10.0 + s) / (15.0 + s)) for s in range(5)) / 5))


def test_the_summary_shows_both_columns_where_a_row_was_calibrated_and_none_where_no_row_was():
    rows = summarize(_grid())
    md = report.markdown("g", rows, {"base": {"training": {"targetAccuracy": 0.9}}})
    head = next(line for line in md.splitlines() if line.startswith("| method |"))
    assert "| time to target s | ± | with calibration s | ± | amortized s | calibration s | regret |" in head
    tta = next(line for line in md.splitlines() if line.startswith("| tta |"))
    assert tta.startswith(f"| tta | 12.00 | {math.sqrt(2.5):.2f} | 17.00 | {math.sqrt(2.5):.2f} | 12.50 | "
                          "5.0 (simulated) | 1.06 |")
    topk = next(line for line in md.splitlines() if line.startswith("| topk-0.01 |"))
    assert topk.startswith("| topk-0.01 | 16.00 | 1.58 | 16.00 | 1.58 | 16.00 | none | 1.00 |")
    assert f"cost / {AMORTIZED_OVER}" in md and "in full to each seed's cell" in md
    # the columns line up with the rule under the header
    rule = next(line for line in md.splitlines() if line.startswith("| --- |"))
    assert head.count("|") == rule.count("|") == tta.count("|")
    plain = report.markdown("g", summarize([r for r in _grid() if r["method_label"] != "tta"]),
                            {"base": {"training": {"targetAccuracy": 0.9}}})
    assert "with calibration" not in plain and "amortized" not in plain and "Calibration (issue 66)" not in plain
