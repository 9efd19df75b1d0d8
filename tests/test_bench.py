"""`netsense bench`: grid loading, the fair summary, and the cluster mode against
the real API server (the test plays kubelet)."""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
import threading
import time

import pytest
import yaml
from support import unavailable

from netsense.bench import load_grid, run_bench, summarize
from netsense.bench.grid import families
from netsense.bench.stats import steps_to_target
from netsense.spec import SpecError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GRID = {
    "name": "t",
    "base": {"workers": 2, "training": {"model": "mlp", "dataset": "digits", "hiddenSize": 256,
                                        "targetAccuracy": 0.8, "maxSeconds": "20s", "evalEvery": 5}},
    "methods": {"allreduce": {"method": "allreduce"}, "topk-0.1": {"method": "topk", "density": 0.1}},
    "profiles": {"static-100": {"type": "static", "rate": "100Mbit"}},
    "seeds": [0],
}


def write(tmp_path, grid) -> str:
    p = tmp_path / "grid.yaml"
    p.write_text(yaml.safe_dump(grid))
    return str(p)


def _packaged_at() -> dict[str, set[str]]:
    """Each committed grid (repo-relative) -> the commits its results were packaged at (testbed/results/INDEX.jsonl)."""
    out: dict[str, set[str]] = {}
    with open(os.path.join(REPO, "testbed", "results", "INDEX.jsonl")) as fh:
        for entry in map(json.loads, fh):
            if entry.get("kind") == "results" and entry.get("grid"):
                out.setdefault(entry["grid"], set()).update(entry["commit"])
    return out


def test_shipped_grids_load():
    """Every committed grid, each at one wire format or saying mixedEncodings (those registered before one wire
    format, issue 62, pin the fp32 they ran with). A grid that ran with tta settings since removed (issue 62,
    item 4) says ranAt: the commit its committed results were packaged at (the grid's own commit where it has
    none); its cells' jobs, less those settings, still validate, and each of its cells names them."""
    paths = sorted(glob.glob(os.path.join(REPO, "testbed", "grids", "*.yaml"))
                   + glob.glob(os.path.join(REPO, "testbed", "grids", "dev", "*.yaml")))
    assert len(paths) > 50
    packaged = _packaged_at()
    ran_at = 0
    for path in paths:
        _, cells, grid = load_grid(path)
        assert cells and len({c.job["metadata"]["name"] for c in cells}) == len(cells), path
        if grid.get("ranAt"):
            ran_at += 1
            grid_file = os.path.relpath(path, REPO)
            assert grid["ranAt"] in packaged.get(grid_file, {grid["ranAt"]}), path
            assert packaged.get(grid_file, {grid["ranAt"]}) == {grid["ranAt"]}, path
            tta = {c.method: c for c in cells if c.removed}
            assert tta, path
            for method, cell in tta.items():
                named = grid["methods"].get(method) or {}
                assert set(cell.removed) <= set(named), (path, method)
                assert not set(cell.removed) & set(cell.job["spec"]["compression"]), (path, method)
    assert ran_at >= 50  # familyPilot's grids (and one each of learnKnee and convTopkPrior without it)
    _, cells, _ = load_grid(os.path.join(REPO, "testbed", "grids", "ci.yaml"))
    assert len(cells) == 7 * 6 * 6  # methods x profiles x seeds
    assert len({c.job["metadata"]["name"] for c in cells}) == len(cells)


def test_a_grid_without_a_shared_target_is_refused(tmp_path):
    grid = json.loads(json.dumps(GRID))
    del grid["base"]["training"]["targetAccuracy"]
    with pytest.raises(SpecError, match="base.training"):
        load_grid(write(tmp_path, grid))


def test_a_grid_mixing_wire_formats_is_refused_unless_it_says_so(tmp_path):
    grid = {**GRID, "methods": {**GRID["methods"], "powersgd-r2": {"method": "powersgd", "rank": 2, "values": "fp32"},
                                "tta": {"method": "tta"}, "fp16": {"method": "fp16"}, "netsense": {"method": "netsense"}}}
    with pytest.raises(SpecError) as e:
        load_grid(write(tmp_path, grid))
    said = str(e.value)
    assert "compression.values" in said and "mixedEncodings: true" in said
    assert "powersgd-r2 fp32" in said and "topk-0.1 fp16" in said and "tta fp16" in said
    assert "allreduce" not in said and "netsense" not in said  # fixed formats: never a mix
    _, cells, _ = load_grid(write(tmp_path, {**grid, "mixedEncodings": True}))
    assert {c.method for c in cells} == set(grid["methods"])
    with pytest.raises(SpecError, match="mixedEncodings: must be true or false"):
        load_grid(write(tmp_path, {**grid, "mixedEncodings": "yes please"}))
    # One encoding, whichever: loads; a sensitivity variant at another encoding mixes too.
    pinned = {k: {**v, "values": "fp32"} if k in ("topk-0.1", "tta") else v for k, v in grid["methods"].items()}
    assert load_grid(write(tmp_path, {**grid, "methods": pinned}))[1]
    varied = {**GRID, "sensitivity": {"topk": {"method": {"method": "topk"}, "vary": {"values": ["fp32"]}}}}
    with pytest.raises(SpecError, match=r"topk-0\.1 fp16, topk-values-fp32 fp32"):
        load_grid(write(tmp_path, varied))


def test_a_bad_cell_names_method_scenario_and_field(tmp_path):
    grid = json.loads(json.dumps(GRID))
    grid["methods"]["broken"] = {"method": "topk", "density": 7}
    with pytest.raises(SpecError, match=r"broken x static-100: spec.compression.density"):
        load_grid(write(tmp_path, grid))


def _r(method, scenario, seed, tta, sps=100.0):
    return {"status": "Succeeded", "method_label": method, "scenario": scenario, "seed": seed,
            "time_to_accuracy_s": tta, "throughput_samples_per_s": sps, "best_accuracy": 0.9,
            "final_accuracy": 0.9, "mean_density": 0.1, "bytes_sent_per_worker": 1e6, "steps": 10,
            "selection_ms_mean": 1.0, "target_accuracy": 0.9,
            "accuracy_curve": [[5, 1.0, 0.5], [10, 2.0, 0.9 if tta else 0.6], [15, 3.0, 0.95]]}


def test_summary_means_spreads_and_regret():
    rows = summarize([_r("a", "s", 0, 10), _r("a", "s", 1, 12), _r("b", "s", 0, 20), _r("b", "s", 1, 24),
                      _r("c", "s", 0, 5), _r("c", "s", 1, None)])
    by = {r["method"]: r for r in rows}
    assert by["a"]["tta_mean_s"] == 11 and by["a"]["tta_std_s"] == pytest.approx(math.sqrt(2))
    assert by["a"]["regret"] == 1.0 and by["b"]["regret"] == pytest.approx(2.0)
    assert by["a"]["steps_to_target"] == 10  # first evaluation at or above the target
    # c reached the target with one seed only: not counted as reached, infinite regret
    assert by["c"]["tta_mean_s"] is None and by["c"]["reached"] == "1/2" and math.isinf(by["c"]["regret"])


def test_a_scenario_may_split_one_global_batch_over_its_workers_and_nothing_else_of_the_task(tmp_path):
    """Strong scaling (issue 65): each worker count with its share of one global batch; the seed stays each cell's."""
    grid = json.loads(json.dumps(GRID))
    grid["profiles"] = {f"p{p}": {"workers": p, "training": {"batchSize": 64 // p},
                                  "network": {"profile": {"type": "static", "rate": "100Mbit"}}} for p in (2, 8)}
    grid["seeds"] = [3]
    _, cells, _ = load_grid(write(tmp_path, grid))
    got = {(c.scenario, c.job["spec"]["workers"], c.job["spec"]["training"]["batchSize"],
            c.job["spec"]["training"]["seed"], c.job["spec"]["training"]["hiddenSize"]) for c in cells}
    assert got == {("p2", 2, 32, 3, 256), ("p8", 8, 8, 3, 256)}
    grid["profiles"]["p2"]["training"]["lr"] = 0.1
    with pytest.raises(SpecError, match=r"profiles\.p2\.training.*batchSize"):
        load_grid(write(tmp_path, grid))


def test_a_scenario_may_set_the_whole_network_and_rows_report_the_bottleneck(tmp_path):
    grid = json.loads(json.dumps(GRID))
    grid["profiles"]["cross"] = {"network": {"topology": "shared", "profile": {"type": "static", "rate": "50Mbit"},
                                             "crossTraffic": [{"type": "bulk"}]}}
    _, cells, _ = load_grid(write(tmp_path, grid))
    net = next(c for c in cells if c.scenario == "cross").job["spec"]["network"]
    assert net["topology"] == "shared" and net["crossTraffic"] == [{"type": "bulk"}]
    busy = {"links": {"up0": {"queue_delay_p99_ms": 30.0, "drops": 5}, "up1": {"queue_delay_p99_ms": 2.0, "drops": 1}},
            "cross_traffic": {"bulk0-0": {"mean_mbit_when_on": 20.0, "bytes": 1}}}
    rows = summarize([{**_r("a", "cross", 0, 10), "bottleneck": busy},
                      {**_r("a", "cross", 1, 12), "bottleneck": {**busy, "links": {"up0": {"queue_delay_p99_ms": 10.0,
                                                                                          "drops": 0}}}},
                      _r("b", "plain", 0, 10)])
    a, b = (next(r for r in rows if r["method"] == m) for m in "ab")
    assert a["queue_p99_ms"] == 20.0 and a["drops"] == 3 and a["cross_mbit"] == 20.0  # worst link, mean of seeds
    assert b["queue_p99_ms"] is None and b["cross_mbit"] is None


def test_the_ceiling_brackets_the_cells_and_their_mean_is_the_reference(tmp_path, monkeypatch):
    from netsense.bench import cells, report

    order, lone = [], iter([100.0, 140.0])  # the machine drifted between before and after

    def fake_run(cell, cell_dir, plot=False):
        order.append(cell.method)
        sps = next(lone) if cell.method == "ceiling" else 120.0
        return _r(cell.method, cell.scenario, cell.seed, 1.0, sps)

    monkeypatch.setattr(cells, "run_local", fake_run)
    monkeypatch.setattr(report, "plots", lambda *a: [])
    grid = {**GRID, "ceiling": True}
    assert run_bench(write(tmp_path, grid), str(tmp_path / "out")) == 0
    assert order[0] == "ceiling" and order[-1] == "ceiling" and "ceiling" not in order[1:-1]
    rows = json.loads((tmp_path / "out" / "table.json").read_text())
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "240 samples/s" in md and "200 and 280" in md  # (100 + 140) / 2 x 2 workers
    assert all(r["ratio_to_ceiling"] == pytest.approx(0.5) for r in rows)


def test_a_matched_ceiling_runs_each_cells_twin_without_the_wire_and_reports_the_exposed_network_time(
        tmp_path, monkeypatch):
    """ceiling: matched: each cell of a fixed method is followed by its twin, the same job with training.nullWire,
    a fixed number of steps and no stop at the target (no one-worker ceiling), never a method of the table; an
    adaptive method has no twin (without the wire it would sense a free link and choose other steps) and is read
    against the twins of the fixed TopK density nearest its own. Per method: samples/s over the twins', and the
    network time left exposed per step (64 samples a step: 64 x (1/1000 - 1/2000) s = 32 ms) against the wire
    time of its bytes (1 MB a step at 500 Mbit/s: 16 ms): 2.0."""
    from netsense.bench import cells, report

    grid = {**GRID, "ceiling": "matched", "ceilingSteps": 40, "accuracyAfterEpochs": 1, "order": "grid",
            "methods": {**GRID["methods"], "fp16": {"method": "fp16"}, "tta": {"method": "tta"}}}
    _, loaded, _ = load_grid(write(tmp_path, grid))
    assert [c.method for c in loaded] == ["allreduce", "allreduce@nowire", "fp16", "topk-0.1", "topk-0.1@nowire",
                                          "tta"]
    t = loaded[1].job["spec"]["training"]
    assert t["nullWire"] and t["stopAtTarget"] is False and t["maxSteps"] == 40 and "minEpochs" not in t

    def fake_run(cell, cell_dir, plot=False):
        r = _r(cell.method, cell.scenario, cell.seed, 1.0, 2000.0 if cell.method.endswith("@nowire") else 1000.0)
        return {**r, "bytes_sent_per_worker": 10e6, "steps": 10, "link_rate_mbit_median": 500.0, "workers": 2,
                "mean_density": 1.0 if cell.method == "fp16" else 0.1}

    monkeypatch.setattr(cells, "run_local", fake_run)
    monkeypatch.setattr(report, "plots", lambda *a: [])
    assert run_bench(write(tmp_path, grid), str(tmp_path / "out")) == 0
    rows = {r["method"]: r for r in json.loads((tmp_path / "out" / "table.json").read_text())}
    assert set(rows) == {"allreduce", "topk-0.1", "fp16", "tta"}
    topk = rows["topk-0.1"]
    assert topk["ceiling_samples_per_s"] == 2000 and topk["ratio_to_ceiling"] == pytest.approx(0.5)
    assert topk["exposed_ms"] == pytest.approx(32) and topk["wire_ms"] == pytest.approx(16)
    assert topk["exposed_over_wire"] == pytest.approx(2.0)
    assert rows["tta"]["ceiling_from"] == "topk-0.1" and rows["tta"]["exposed_over_wire"] == pytest.approx(2.0)
    assert rows["fp16"]["ratio_to_ceiling"] is None  # dense: no TopK's hook path stands in for it
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| topk-0.1 | topk-0.1 | 2000 | 0.50 | 32.0 | 16.0 | 2.00 |" in md


@pytest.mark.parametrize("bad, says", [({"ceiling": "yes"}, "ceiling: true .* or matched"),
                                       ({"ceiling": "matched", "ceilingSteps": 5}, "ceilingSteps: must be an "
                                                                                   "integer of at least 10"),
                                       ({"ceilingSteps": 50}, "ceilingSteps: only with ceiling: matched")])
def test_a_bad_ceiling_is_refused_naming_the_field(tmp_path, bad, says):
    with pytest.raises(SpecError, match=says):
        load_grid(write(tmp_path, {**GRID, **bad}))


def test_cells_run_interleaved_and_every_results_file_names_the_commit(tmp_path, monkeypatch):
    """The protocol: cells in a shuffled (seeded) order, so no method runs in one stretch of the machine's
    drift; every result, row and the summary carry the commit that ran and the grid file's commit."""
    import subprocess

    from netsense.bench import cells, report

    ran = []

    def fake_run(cell, cell_dir, plot=False):
        ran.append((cell.method, cell.scenario, cell.seed))
        return _r(cell.method, cell.scenario, cell.seed, 1.0 + cell.seed)

    monkeypatch.setattr(cells, "run_local", fake_run)
    monkeypatch.setattr(report, "plots", lambda *a: [])
    grid = {**GRID, "profiles": {"a": {"type": "static", "rate": "100Mbit"}, "b": {"type": "static", "rate": "50Mbit"}},
            "seeds": [0, 1, 2]}
    in_grid_order = [(m, p, s) for m in grid["methods"] for p in grid["profiles"] for s in grid["seeds"]]
    assert run_bench(write(tmp_path, grid), str(tmp_path / "out")) == 0
    assert sorted(ran) == sorted(in_grid_order) and ran != in_grid_order
    first_half = {m for m, _, _ in ran[:len(ran) // 2]}
    assert first_half == set(grid["methods"])  # interleaved: both methods early on
    again = []
    monkeypatch.setattr(cells, "run_local", lambda cell, d, plot=False: again.append((cell.method, cell.scenario, cell.seed))
                        or _r(cell.method, cell.scenario, cell.seed, 1.0))
    assert run_bench(write(tmp_path, grid), str(tmp_path / "again")) == 0
    assert again == ran  # seeded: the same order every time
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not head:
        unavailable("this is not a git checkout: no commit to record")
    results = json.loads((tmp_path / "out" / "summary.json").read_text())
    rows = json.loads((tmp_path / "out" / "table.json").read_text())
    assert {r["commit"] for r in results} == {r["commit"] for r in rows} == {head}
    md = (tmp_path / "out" / "summary.md").read_text()
    assert f"commit {head[:12]}" in md and "shuffled, interleaved" in md
    assert "the grid file is not in the repository" in md  # written under tmp: nothing proves it was frozen
    ran.clear()
    monkeypatch.setattr(cells, "run_local", fake_run)
    assert run_bench(write(tmp_path, {**grid, "order": "grid"}), str(tmp_path / "ordered")) == 0
    assert ran == in_grid_order


def test_a_scenario_may_change_the_worker_count_and_a_bad_one_is_named(tmp_path):
    grid = {**GRID, "profiles": {"three": {"workers": 3, "network": {"profile": {"type": "static", "rate": "50Mbit"}}},
                                 "plain": {"type": "static", "rate": "50Mbit"}}}
    _, cells, _ = load_grid(write(tmp_path, grid))
    workers = {c.scenario: c.job["spec"]["workers"] for c in cells}
    assert workers == {"three": 3, "plain": 2}
    with pytest.raises(SpecError, match="profiles.odd"):
        load_grid(write(tmp_path, {**GRID, "profiles": {"odd": {"worker": 3}}}))


def test_a_reused_cell_keeps_the_commit_that_ran_it_and_the_table_says_so(tmp_path, monkeypatch):
    from netsense.bench import cells, report

    monkeypatch.setattr(cells, "run_local", lambda cell, d, plot=False: _r(cell.method, cell.scenario, cell.seed, 1.0))
    monkeypatch.setattr(report, "plots", lambda *a: [])
    out = tmp_path / "out"
    assert run_bench(write(tmp_path, GRID), str(out)) == 0
    old = out / "allreduce--static-100--s0"
    (old / "result.json").write_text(json.dumps({**_r("allreduce", "static-100", 0, 2.0)}))
    (old / "provenance.json").write_text(json.dumps({"commit": "f" * 40, "dirty": False}))
    assert run_bench(write(tmp_path, GRID), str(out)) == 0
    results = {r["method_label"]: r for r in json.loads((out / "summary.json").read_text())}
    assert results["allreduce"]["commit"] == "f" * 40 and results["topk-0.1"]["commit"] != "f" * 40
    assert "reused from earlier runs of other commits (ffffffffffff)" in (out / "summary.md").read_text()


def test_cells_from_another_commit_of_the_same_package_code_are_told_apart_from_other_code():
    from netsense.bench.provenance import describe

    now = {"commit": "b" * 40, "dirty": False, "code_commit": "a" * 40, "grid_commit": "b" * 40}
    same_code = {"commit": "c" * 40, "dirty": False, "code_commit": "a" * 40}
    line = describe(now, [now, same_code])
    assert "the package as last changed in aaaaaaaaaaaa" in line
    assert "other commits of the same package code (cccccccccccc" in line and "other commits (" not in line
    other_code = {"commit": "d" * 40, "dirty": False, "code_commit": "e" * 40}
    assert "reused from earlier runs of other commits (eeeeeeeeeeee)" in describe(now, [now, other_code])
    assert "uncommitted changes" in describe(now, [now, {**same_code, "dirty": True}])


def test_provenance_flags_uncommitted_changes_to_the_package_only(tmp_path, monkeypatch):
    """A table from a tree whose package differs from its commit says so; results and scratch files in the
    checkout do not count."""
    import subprocess

    from netsense.bench import provenance

    repo = tmp_path / "repo"
    (repo / "netsense").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (repo / "netsense" / "a.py").write_text("x = 1\n")
    (repo / "grid.yaml").write_text("name: g\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    monkeypatch.setattr(provenance, "_PACKAGE", str(repo / "netsense"))
    p = provenance.provenance(str(repo / "grid.yaml"))
    assert p["commit"] and p["dirty"] is False and p["grid_commit"] == p["commit"] and p["grid_dirty"] is False
    (repo / "results.md").write_text("a table\n")
    assert provenance.provenance(str(repo / "grid.yaml"))["dirty"] is False
    (repo / "netsense" / "a.py").write_text("x = 2\n")
    assert provenance.provenance(str(repo / "grid.yaml"))["dirty"] is True
    assert "uncommitted changes to the package" in provenance.describe(provenance.provenance(str(repo / "grid.yaml")))


def test_a_bad_order_is_refused_naming_the_field(tmp_path):
    with pytest.raises(SpecError, match="order"):
        load_grid(write(tmp_path, {**GRID, "order": "random"}))


def test_accuracy_after_equal_epochs_makes_every_run_train_that_long(tmp_path):
    def min_epochs(grid):
        return {c.job["spec"]["training"].get("minEpochs") for c in load_grid(write(tmp_path, grid))[1]}

    assert min_epochs(GRID) == {None}
    assert min_epochs({**GRID, "accuracyAfterEpochs": 3}) == {3}
    explicit = json.loads(json.dumps(GRID))
    explicit["base"]["training"]["minEpochs"] = 5
    assert min_epochs({**explicit, "accuracyAfterEpochs": 3}) == {5}
    no_stop = json.loads(json.dumps(GRID))
    no_stop["base"]["training"].update(stopAtTarget=False, maxSteps=100)
    assert min_epochs({**no_stop, "accuracyAfterEpochs": 3}) == {None}  # every run trains its whole budget


@pytest.mark.root
def test_local_bench_writes_summary_table_and_plots(tmp_path):
    out = tmp_path / "out"
    assert run_bench(write(tmp_path, {**GRID, "accuracyAfterEpochs": 2}), str(out)) == 0
    results = json.loads((out / "summary.json").read_text())
    assert {r["scenario"] for r in results} == {"static-100"}
    assert {r["method_label"] for r in results} == {"allreduce", "topk-0.1"}
    for r in results:  # each trained on to 2 epochs, past its target (about an epoch in)
        assert r["epochs"] >= 2 and steps_to_target(r) < r["steps"]
    table = json.loads((out / "table.json").read_text())
    assert all(row["after_epochs"]["n"] == "1/1" for row in table)
    md = (out / "summary.md").read_text()
    assert "| allreduce |" in md and "regret" in md
    assert (out / "time_to_target.png").exists() and (out / "density_vs_link.png").exists()


@pytest.mark.apiserver
def test_cluster_bench_submits_jobs_and_reads_results_from_status(kube, operator, control_plane, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("KUBECONFIG", control_plane.kubeconfig)
    ns = kube.namespace("bench")
    stop = threading.Event()

    def kubelet():
        """Finish every worker pod; rank 0 reports a result like a trainer would."""
        done = set()
        while not stop.is_set():
            for pod in kube.core.list_namespaced_pod(ns, label_selector="netsense.dev/job").items:
                if pod.metadata.name in done:
                    continue
                rank = pod.metadata.labels["netsense.dev/rank"]
                job = pod.metadata.labels["netsense.dev/job"]
                msg = json.dumps({"job": job, "status": "Succeeded", "time_to_accuracy_s": 3.0 if "topk" in job else 6.0,
                                  "throughput_samples_per_s": 100.0, "best_accuracy": 0.85,
                                  "final_accuracy": 0.85, "mean_density": 0.1, "bytes_sent_per_worker": 1000,
                                  "steps": 10}) if rank == "0" else ""
                kube.set_pod_phase(ns, pod.metadata.name, "Succeeded", message=msg)
                done.add(pod.metadata.name)
            time.sleep(0.2)

    t = threading.Thread(target=kubelet, daemon=True)
    t.start()
    try:
        out = tmp_path / "out"
        assert run_bench(write(tmp_path, GRID), str(out), cluster=True, namespace=ns) == 0
    finally:
        stop.set()
    table = json.loads((out / "table.json").read_text())
    by = {r["method"]: r for r in table}
    assert by["topk-0.1"]["tta_mean_s"] == 3.0 and by["allreduce"]["regret"] == pytest.approx(2.0)


def test_each_method_is_compared_with_the_best_other_on_the_same_seeds_with_an_interval():
    # a is faster than b on every seed by 10-20%; c is the fastest on half the seeds and twice as slow on
    # the others: no lead either way.
    a = [10, 11, 12, 10, 9, 10]
    b = [12, 13, 14, 11.5, 10.5, 12]
    c = [20, 5, 8, 20, 5, 20]
    results = [_r(m, "s", seed, t) for m, ts in (("a", a), ("b", b), ("c", c)) for seed, t in enumerate(ts)]
    by = {r["method"]: r for r in summarize(results)}
    assert by["a"]["vs"] == "b" and by["b"]["vs"] == "a" and by["c"]["vs"] == "a"
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    assert by["a"]["paired_ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert by["a"]["ratio_lo"] <= by["a"]["paired_ratio"] <= by["a"]["ratio_hi"] < 1  # a leads: the CI excludes 1
    assert by["b"]["ratio_lo"] > 1 and by["a"]["pairs"] == 6
    assert by["c"]["ratio_lo"] < 1 < by["c"]["ratio_hi"]
    assert by["a"]["wins"] == by["c"]["wins"] == 0.5 and by["b"]["wins"] == 0
    # The interval: Student's t (5 degrees of freedom: 2.5705818) on the logs of the per-seed ratios.
    logs = [math.log(r) for r in ratios]
    mean, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    assert (by["a"]["ratio_lo"], by["a"]["ratio_hi"]) == pytest.approx(
        (math.exp(mean - 2.5705818 * se), math.exp(mean + 2.5705818 * se)))
    # Paired by seed: d and e took 10-55 s on seeds of very different difficulty, never in the same order (d's
    # ratios 0.48-1.82). Sorted apart, d's fastest over e's fastest and so on, every ratio would be 0.91-0.95 and
    # d would seem to lead.
    d, e = [10, 20, 30, 40, 50], [21, 11, 44, 33, 55]
    paired = summarize([_r(m, "t", seed, t) for m, ts in (("d", d), ("e", e)) for seed, t in enumerate(ts)])
    row = next(r for r in paired if r["method"] == "d")
    assert row["vs"] == "e" and row["pairs"] == 5 and row["ratio_lo"] < 1 < row["ratio_hi"], row


def test_a_method_is_never_paired_with_a_variant_of_its_own(tmp_path):
    # ours-plain (an ablation) is the runner-up; the question a reader asks is ours against the best peer
    ours, plain, peer = [10, 11, 12, 10, 11], [10.5, 10.8, 12.5, 10.2, 11.6], [12, 13, 14, 12, 12.5]
    results = [_r(m, "s", seed, t) for m, ts in (("ours", ours), ("ours-plain", plain), ("peer", peer))
               for seed, t in enumerate(ts)]
    assert {r["method"]: r["vs"] for r in summarize(results)}["ours"] == "ours-plain"
    family = {"ours": "ours", "ours-plain": "ours"}
    by = {r["method"]: r for r in summarize(results, family)}
    assert by["ours"]["vs"] == by["ours-plain"]["vs"] == "peer" and by["peer"]["vs"] == "ours"
    assert by["ours"]["ratio_hi"] < 1 and by["ours"]["wins"] == 0.8  # wins still count every method

    grid = {**GRID, "variants": {"allreduce": ["topk-0.1"]}}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    assert families(load_grid(str(tmp_path / "g.yaml"))[2]) == {"allreduce": "allreduce", "topk-0.1": "allreduce"}
    for variants, field in (({"allreduce": ["topk-0.5"]}, "'topk-0.5' is not a method"),
                            ({"allreduce": "topk-0.1"}, "must be a list"),
                            ({"allreduce": ["topk-0.1"], "topk-0.1": []}, "already in allreduce's family")):
        (tmp_path / "g.yaml").write_text(yaml.safe_dump({**GRID, "variants": variants}))
        with pytest.raises(SpecError, match=f"variants.*{field}"):
            load_grid(str(tmp_path / "g.yaml"))


def test_steps_to_target_is_the_first_of_target_hold_evaluations_in_a_row():
    curve = [[10, 1.0, 0.91], [20, 2.0, 0.85], [30, 3.0, 0.92], [40, 4.0, 0.93], [50, 5.0, 0.95]]
    result = {"target_accuracy": 0.9, "accuracy_curve": curve}
    assert steps_to_target({**result, "target_hold": 3}) == 30  # the lucky first crossing does not count
    assert steps_to_target({**result, "target_hold": 4}) is None  # right-censored: never held 4 in a row
    assert steps_to_target(result) == 10  # results from before the rule: the first crossing


def test_an_early_target_and_the_accuracy_after_equal_epochs_are_read_off_the_same_runs(tmp_path):
    """One run per cell serves both targets and the equal-epochs accuracy (the protocol's readings)."""
    from netsense.bench.report import markdown
    from netsense.bench.stats import at_targets

    def run(method, seed, curve, steps):
        return {**_r(method, "s", seed, curve[-1][1], sps=100.0), "target_hold": 2, "accuracy_curve": curve,
                "steps": steps, "epochs": steps / 10}  # 10 steps an epoch

    slow = [[10, 1.0, 0.85], [20, 2.0, 0.7], [30, 3.0, 0.86], [40, 4.0, 0.88], [50, 5.0, 0.91], [60, 6.0, 0.92]]
    fast = [[10, 0.5, 0.86], [20, 1.0, 0.87], [30, 1.5, 0.91], [40, 2.0, 0.93]]
    results = [run("a", 0, slow, 60), run("a", 1, slow, 60), run("b", 0, fast, 40), run("b", 1, fast, 40)]
    rows = summarize(results)
    at_targets(results, rows, [0.85], epochs=5)
    by = {r["method"]: r for r in rows}
    early = {m: by[m]["targets"]["0.85"] for m in by}
    # held twice in a row from step 30 on (a: the lucky step 10 does not count) and from step 10 (b)
    assert early["a"]["tta_mean_s"] == 3.0 and early["b"]["tta_mean_s"] == 0.5
    assert early["a"]["paired_ratio"] == pytest.approx(6.0) and early["a"]["vs"] == "b"
    # a trained 6 epochs: its accuracy after 5 is the evaluation at step 50; b stopped after 4: censored
    assert by["a"]["after_epochs"]["mean"] == 0.91 and by["a"]["after_epochs"]["n"] == "2/2"
    assert by["b"]["after_epochs"]["mean"] is None and by["b"]["after_epochs"]["n"] == "0/2"
    md = markdown("t", rows, {"targets": [0.85], "accuracyAfterEpochs": 5, "base": {"training": {}}})
    assert "time to 0.85 s" in md and "accuracy after 5 epochs" in md and "| a | 3.00 | 0.00 | 6.00" in md


def test_targets_above_the_one_every_run_stops_at_are_refused(tmp_path):
    grid = {**json.loads(json.dumps(GRID)), "targets": [0.7, 0.95]}  # the runs stop at 0.8
    with pytest.raises(SpecError, match="targets: above base.training.targetAccuracy"):
        load_grid(write(tmp_path, grid))
    with pytest.raises(SpecError, match="accuracyAfterEpochs"):
        load_grid(write(tmp_path, {**GRID, "accuracyAfterEpochs": -1}))
    assert load_grid(write(tmp_path, {**GRID, "targets": [0.7], "accuracyAfterEpochs": 3}))[1]


SENSITIVITY = {
    "netsense": {"method": {"method": "netsense", "errorFeedback": False},
                 "vary": {"alpha": [0.25, 1.0], "window": [5, 20]}},
}


def test_a_sensitivity_section_expands_one_constant_at_a_time(tmp_path):
    grid = {**json.loads(json.dumps(GRID)), "methods": {}, "sensitivity": SENSITIVITY}
    _, cells, _ = load_grid(write(tmp_path, grid))
    by = {c.method: c.job["spec"]["compression"] for c in cells}
    assert sorted(by) == ["netsense", "netsense-alpha-0.25", "netsense-alpha-1", "netsense-window-20",
                          "netsense-window-5"]
    assert by["netsense-alpha-0.25"] == {"method": "netsense", "errorFeedback": False, "alpha": 0.25}
    assert by["netsense"] == {"method": "netsense", "errorFeedback": False}
    # a variant that repeats the method's own value, or a name given twice, is refused naming the field
    own = {"netsense": {"method": {"method": "netsense", "alpha": 0.5}, "vary": {"alpha": [0.5, 1.0]}}}
    with pytest.raises(SpecError, match="sensitivity.netsense.vary.alpha"):
        load_grid(write(tmp_path, {**grid, "sensitivity": own}))
    with pytest.raises(SpecError, match="also named under methods"):
        load_grid(write(tmp_path, {**grid, "methods": {"netsense": {"method": "netsense"}}}))
    # a bad value is named with its variant, as any method's
    bad = {"netsense": {"method": {"method": "netsense"}, "vary": {"alpha": [2.0]}}}
    with pytest.raises(SpecError, match="netsense-alpha-2 x static-100: spec.compression.alpha"):
        load_grid(write(tmp_path, {**grid, "sensitivity": bad}))


def test_long_cell_names_stay_distinct_dns_names(tmp_path):
    grid = {**json.loads(json.dumps(GRID)), "methods": {}, "profiles": {
        "a-very-long-fluctuating-profile-name-10-300": {"type": "static", "rate": "100Mbit"}},
        "sensitivity": {"netsense": {"method": {"method": "netsense"},
                                     "vary": {"initialRatio": [0.005, 0.02], "bdpFraction": [0.45, 1.8]}}}}
    _, cells, _ = load_grid(write(tmp_path, grid))
    names = [c.job["metadata"]["name"] for c in cells]
    assert len(set(names)) == len(names) and all(len(n) <= 50 for n in names)


def test_each_variant_is_paired_with_its_method_on_the_same_seeds():
    from netsense.bench.report import markdown
    from netsense.bench.stats import sensitivity

    grid = {"sensitivity": SENSITIVITY, "base": {"training": {}}}
    own = [10, 12, 11, 9, 10]
    results = [_r("netsense", "s", seed, t) for seed, t in enumerate(own)]
    results += [_r("netsense-alpha-0.25", "s", seed, 2 * t) for seed, t in enumerate(own)]  # twice as slow
    results += [_r("netsense-alpha-1", "s", seed, t if seed else None) for seed, t in enumerate(own)]
    varied = {v["variant"]: v for v in sensitivity(results, grid)}
    assert varied["netsense-alpha-0.25"]["ratio"] == pytest.approx(2.0)
    assert varied["netsense-alpha-0.25"]["ratio_lo"] == pytest.approx(2.0) and varied["netsense-alpha-0.25"]["pairs"] == 5
    # seed 0 never reached the target: censored, out of the ratio, and the reached count says so; 4 pairs
    # give no interval (one would not cover)
    assert varied["netsense-alpha-1"]["ratio"] == pytest.approx(1.0) and varied["netsense-alpha-1"]["pairs"] == 4
    assert varied["netsense-alpha-1"]["ratio_lo"] is None
    assert varied["netsense-alpha-1"]["reached"] == "4/5" and varied["netsense-alpha-1"]["method_reached"] == "5/5"
    assert varied["netsense-window-5"]["ratio"] is None and varied["netsense-window-5"]["pairs"] == 0  # never ran
    md = markdown("t", summarize(results), grid, varied=list(varied.values()))
    assert "## Sensitivity" in md and "| s | netsense | alpha | 0.25 | 2.00 [2.00, 2.00] | yes | 5 | 5/5 | 5/5 |" in md


def test_every_row_says_its_throughput_over_allreduce_on_the_same_link():
    from netsense.bench.stats import x_allreduce

    rows = summarize([_r("allreduce", "a", 0, 10, sps=100.0), _r("topk", "a", 0, 5, sps=250.0),
                      _r("allreduce", "b", 0, 10, sps=50.0), _r("topk", "b", 0, 5, sps=400.0),
                      _r("topk", "c", 0, 5, sps=400.0)])
    x_allreduce(rows)
    by = {(r["scenario"], r["method"]): r["x_allreduce"] for r in rows}
    assert by[("a", "topk")] == pytest.approx(2.5) and by[("b", "topk")] == pytest.approx(8.0)
    assert by[("a", "allreduce")] == pytest.approx(1.0)
    assert by[("c", "topk")] is None  # no allreduce on that link: nothing to compare with


def _failed(method, scenario, seed, reason="rank 1 exited with 137"):
    """A cell that failed, as run_bench records it: the status and reason, no measurements."""
    return {"status": "Failed", "reason": reason, "method_label": method, "scenario": scenario, "seed": seed,
            "timeline": None}


def test_failed_runs_are_counted_and_never_averaged_as_zeros():
    """A seed that failed has no time, no throughput, no accuracy: the row counts it (failed, and not reached
    in 'reached'), takes no mean over the seeds as if it had reached (TTA, regret), averages the other
    measurements over the runs that have them (not zeros for the failed one), and the paired comparison uses
    only the seeds both methods finished."""
    results = [_r("a", "s", 0, 10, sps=100.0), _failed("a", "s", 1), _r("a", "s", 2, 12, sps=300.0),
               _r("b", "s", 0, 20), _r("b", "s", 1, 22), _r("b", "s", 2, 24),
               _failed("c", "s", 0), _failed("c", "s", 1), _failed("c", "s", 2)]
    by = {r["method"]: r for r in summarize(results)}
    a, b, c = by["a"], by["b"], by["c"]
    assert (a["seeds"], a["failed"], a["reached"]) == (3, 1, "2/3")
    assert a["tta_mean_s"] is None and a["tta_std_s"] is None and math.isinf(a["regret"])
    assert a["samples_per_s"] == pytest.approx(200.0)  # (100 + 300) / 2, not / 3
    assert a["best_accuracy"] == pytest.approx(0.9) and a["bytes_per_step"] == pytest.approx(1e5)
    assert (a["vs"], a["pairs"]) == ("b", 2)  # seeds 0 and 2: the failed seed 1 is no pair
    assert a["paired_ratio"] == pytest.approx(math.sqrt(10 / 20 * 12 / 24))
    assert a["wins"] == pytest.approx(2 / 3) and b["wins"] == pytest.approx(1 / 3)  # seed 1: only b finished
    assert (b["failed"], b["reached"], b["regret"]) == (0, "3/3", 1.0)
    assert (c["seeds"], c["failed"], c["reached"]) == (3, 3, "0/3")
    assert c["samples_per_s"] is None and c["tta_mean_s"] is None and math.isinf(c["regret"]) and c["wins"] == 0


def test_failed_runs_count_as_not_reached_at_further_targets_and_in_sensitivity():
    from netsense.bench.stats import at_targets, sensitivity

    results = [_r("netsense", "s", 0, 10), _r("netsense", "s", 1, 12),
               _r("netsense-alpha-0.25", "s", 0, 20), _failed("netsense-alpha-0.25", "s", 1)]
    rows = summarize(results)
    at_targets(results, rows, [0.85], epochs=None)
    early = {r["method"]: r["targets"]["0.85"] for r in rows}
    assert early["netsense-alpha-0.25"]["reached"] == "1/2" and early["netsense-alpha-0.25"]["tta_mean_s"] is None
    assert early["netsense"]["reached"] == "2/2"
    varied = {v["variant"]: v for v in sensitivity(results, {"sensitivity": SENSITIVITY})}
    alpha = varied["netsense-alpha-0.25"]
    assert (alpha["reached"], alpha["pairs"]) == ("1/2", 1) and alpha["ratio"] == pytest.approx(2.0)


def _bench_with_a_failed_cell(tmp_path, monkeypatch):
    """run_bench over 2 methods x 3 seeds on one link, topk-0.1's seed 1 failing."""
    from netsense.bench import cells, report

    def fake_run(cell, cell_dir, plot=False):
        if (cell.method, cell.seed) == ("topk-0.1", 1):
            return {"status": "Failed", "reason": "rank 1 exited with 137"}
        return _r(cell.method, cell.scenario, cell.seed, 1.0 + cell.seed, sps=100.0 * (1 + cell.seed))

    monkeypatch.setattr(cells, "run_local", fake_run)
    monkeypatch.setattr(report, "plots", lambda *a: [])
    out = tmp_path / "out"
    code = run_bench(write(tmp_path, {**GRID, "seeds": [0, 1, 2]}), str(out))
    return code, out


def test_a_bench_with_a_failed_cell_says_so_in_its_exit_code_results_and_table(tmp_path, monkeypatch):
    code, out = _bench_with_a_failed_cell(tmp_path, monkeypatch)
    assert code == 1
    failed = [r for r in json.loads((out / "summary.json").read_text()) if r["status"] != "Succeeded"]
    assert [(r["method_label"], r["seed"], r["reason"]) for r in failed] == [("topk-0.1", 1, "rank 1 exited with 137")]
    rows = {r["method"]: r for r in json.loads((out / "table.json").read_text())}
    assert (rows["topk-0.1"]["failed"], rows["topk-0.1"]["reached"]) == (1, "2/3")
    assert rows["topk-0.1"]["samples_per_s"] == pytest.approx(200.0)  # seeds 0 and 2: 100 and 300
    assert rows["topk-0.1"]["tta_mean_s"] is None and rows["allreduce"]["tta_mean_s"] == pytest.approx(2.0)


def test_the_summary_says_which_cells_failed(tmp_path, monkeypatch):
    """summary.md, what a reader of a benchmark sees, tells a failed run from one that ran out of budget."""
    _, out = _bench_with_a_failed_cell(tmp_path, monkeypatch)
    md = (out / "summary.md").read_text()
    assert "- topk-0.1, seed 1: rank 1 exited with 137" in md  # which run, and why
    row = next(line for line in md.splitlines() if line.startswith("| topk-0.1 |"))
    header = next(line for line in md.splitlines() if line.startswith("| method |"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")], strict=True))
    assert (cells["reached"], cells["failed"]) == ("2/3", "1")
    allreduce = next(line for line in md.splitlines() if line.startswith("| allreduce |"))
    assert dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in allreduce.split("|")],
                    strict=True))["failed"] == "0"


def test_intervals_are_t_intervals_on_log_ratios_from_five_pairs_and_many_comparisons_are_held_to_holm():
    """A percentile bootstrap at 3 seeds (or 1) printed intervals that could not cover; the paired interval is
    Student's t on the log ratios, printed from 5 pairs on; a table of many comparisons says which survive
    Holm's correction."""
    from netsense.bench.stats import holm, t_interval

    ratios = [0.9, 0.85, 0.88, 0.86, 0.92]
    lo, hi, p = t_interval(ratios)
    logs = [math.log(r) for r in ratios]
    mean, se = sum(logs) / 5, statistics.stdev(logs) / math.sqrt(5)
    assert lo == pytest.approx(math.exp(mean - 2.7764451 * se)) and hi == pytest.approx(math.exp(mean + 2.7764451 * se))
    assert 0 < p < 0.05 and hi < 1
    assert t_interval(ratios[:4]) == (None, None, None)
    # Holm: 0.01 survives among 3 (0.01 <= 0.05/3), 0.04 alone would, but not second of 3 (0.04 > 0.025)
    assert holm([0.01, 0.04, 0.3, None]) == [True, False, False, None]
    assert holm([0.001, 0.02, 0.03]) == [True, True, True]


def test_seeds_for_is_the_fewest_pairs_whose_t_interval_is_within_the_precision():
    """Set 2's candidate against PowerSGD rank 4: per-seed ratios 0.76-3.13 over 10 seeds (log sd ~0.4) need
    dozens of seeds for +-10%; a steady ratio needs the minimum."""
    from scipy import stats as st

    from netsense.bench.stats import seeds_for

    ratios = [1.25, 1.67, 0.76, 1.18, 1.47, 2.49, 1.16, 2.31, 1.98, 3.13]
    n = seeds_for(ratios)
    sd = statistics.stdev(math.log(r) for r in ratios)
    half = lambda k: st.t.ppf(0.975, k - 1) * sd / math.sqrt(k)  # noqa: E731
    assert half(n) <= math.log(1.1) < half(n - 1) and n > 40
    assert seeds_for([1.0, 1.01, 0.99, 1.0, 1.005]) == 5
    assert seeds_for(ratios[:4]) is None


def test_the_table_marks_the_hindsight_best_fixed_density():
    from netsense.bench.report import markdown

    results = [_r(m, "s", seed, t) for m, t in (("topk-0.01", 3.0), ("topk-0.03", 2.0), ("tta", 2.5))
               for seed in range(5)]
    md = markdown("t", summarize(results), {"base": {"training": {}}})
    assert "| topk-0.03 (best fixed) |" in md and "| topk-0.01 |" in md and "(best fixed)" not in md.split(
        "| tta |")[1].split("\n")[0]


def test_a_cluster_campaign_runs_cells_side_by_side_and_a_resumed_one_runs_only_what_is_missing(tmp_path,
                                                                                              monkeypatch):
    from netsense.bench import cells, report

    monkeypatch.setattr(report, "plots", lambda *a: [])
    lock, live, peak, ran = threading.Lock(), set(), [0], []

    def fake_cluster(cell, namespace, stop=None, output=None):
        with lock:
            live.add(cell.name)
            peak[0] = max(peak[0], len(live))
            ran.append(cell.name)
        time.sleep(0.3)
        with lock:
            live.discard(cell.name)
        if cell.seed == 2 and cell.method == "allreduce" and fail_once:
            fail_once.pop()
            return {"status": "Failed", "reason": "the gang was not all running 600s after its pods were created"}
        return _r(cell.method, cell.scenario, cell.seed, 1.0 + cell.seed)

    fail_once = [True]
    monkeypatch.setattr(cells, "run_cluster", fake_cluster)
    grid, out = {**GRID, "seeds": [0, 1, 2]}, tmp_path / "out"
    assert run_bench(write(tmp_path, grid), str(out), cluster=True, parallel=3) == 1  # one cell failed
    assert peak[0] == 3 and len(ran) == 6
    results = json.loads((out / "summary.json").read_text())
    assert len(results) == 6 and [r["status"] for r in results].count("Failed") == 1
    ran.clear()
    assert run_bench(write(tmp_path, grid), str(out), cluster=True, parallel=3) == 0
    assert ran == ["allreduce--static-100--s2"], "a resumed campaign runs only the cell that did not succeed"
    with pytest.raises(SpecError, match="--parallel"):
        run_bench(write(tmp_path, grid), str(tmp_path / "local"), parallel=2)  # locally: one cell at a time


def test_ctrl_c_in_a_cluster_campaign_deletes_every_running_cells_job_and_starts_no_other(tmp_path, monkeypatch):
    from kubernetes import client

    from netsense import kubeclient
    from netsense.bench import cells, report

    monkeypatch.setattr(report, "plots", lambda *a: [])
    monkeypatch.setattr(kubeclient, "load_kube_config", lambda: None)
    jobs: dict[str, str] = {}  # name -> "running" | "deleted"

    class FakeApi:
        def create_namespaced_custom_object(self, group, version, ns, plural, body):
            jobs[body["metadata"]["name"]] = "running"

        def get_namespaced_custom_object(self, group, version, ns, plural, name):
            if len(jobs) == 2 and all(v == "running" for v in jobs.values()):
                raise KeyboardInterrupt  # the user's Ctrl-C, once two cells are running
            return {"status": {"phase": "Running"}}

        def delete_namespaced_custom_object(self, group, version, ns, plural, name, **_):
            if name not in jobs:
                raise client.ApiException(status=404)
            jobs[name] = "deleted"

    monkeypatch.setattr(client, "CustomObjectsApi", FakeApi)
    real_sleep = time.sleep  # cells.time is the time module itself
    monkeypatch.setattr(cells.time, "sleep", lambda s: real_sleep(min(s, 0.05)))
    grid = {**GRID, "seeds": [0, 1, 2]}
    with pytest.raises(KeyboardInterrupt):
        run_bench(write(tmp_path, grid), str(tmp_path / "out"), cluster=True, parallel=2)
    assert len(jobs) == 2 and set(jobs.values()) == {"deleted"}, jobs


def test_a_grid_with_settings_since_removed_says_where_it_ran_and_bench_refuses_to_run_it(tmp_path):
    """familyPilot (issue 62, item 4): a grid naming it is refused by name unless it says ranAt; with ranAt its
    cells load (names and settings for the readers of its committed records) and netsense bench refuses to run
    it, naming the field, its methods and the commit to check out. ranAt on a grid with nothing removed is an
    error (it would stop the grid from running for no reason)."""
    commit = "a503be5910d4c0a71fd909f0d561394a4ce16ebe"
    grid = {**GRID, "methods": {**GRID["methods"], "tta-pilot": {"method": "tta", "lowRanks": [4],
                                                                  "familyPilot": True, "familyPilotExponent": 2.19}}}
    with pytest.raises(SpecError, match=r"methods\.tta-pilot\.familyPilot: removed from tta .* ranAt"):
        load_grid(write(tmp_path, grid))
    _, cells, _ = load_grid(write(tmp_path, {**grid, "ranAt": commit}))
    pilot = [c for c in cells if c.method == "tta-pilot"]
    assert pilot and all(c.removed == ("familyPilot", "familyPilotExponent") for c in pilot)
    assert pilot[0].job["spec"]["compression"] == {"method": "tta", "lowRanks": [4]}
    with pytest.raises(SpecError, match=rf"ranAt: .* ran at {commit} with settings since removed from tta \(issue "
                                        r"62\): compression\.familyPilot \(tta-pilot\); compression\."
                                        rf"familyPilotExponent \(tta-pilot\)\. .*git checkout {commit[:12]}"):
        run_bench(write(tmp_path, {**grid, "ranAt": commit}), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists(), "refused before anything ran"
    with pytest.raises(SpecError, match="ranAt: only for a grid whose methods ran with settings since removed"):
        load_grid(write(tmp_path, {**GRID, "ranAt": commit}))
    with pytest.raises(SpecError, match="ranAt: the full commit"):
        load_grid(write(tmp_path, {**grid, "ranAt": commit[:12]}))
    # at its old default a removed setting changed nothing: the grid runs as it is
    quiet = {**GRID, "methods": {**GRID["methods"], "tta": {"method": "tta", "familyPilot": False}}}
    assert all(not c.removed for c in load_grid(write(tmp_path, quiet))[1])
