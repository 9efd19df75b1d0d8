"""`netsense bench`: methods x bandwidth profiles x seeds, compared fairly.

Fair means: every method runs to the SAME fixed target accuracy with the SAME
wall budget (a run that does not reach the target is reported as not reached,
never cut short when another method peaks), over several seeds, and the measure
that counts is time to accuracy (TTA). Regret = a method's mean TTA / the best
method's mean TTA in that scenario.

A grid file::

    name: ci
    base: {workers: 2, training: {...}}          # a NetSenseJob spec shared by all cells
    methods: {allreduce: {method: allreduce}, topk-0.01: {method: topk, density: 0.01}, ...}
    profiles: {static-50: {type: static, rate: 50Mbit}, ...}
    seeds: [0, 1]

A scenario is a bandwidth profile, or ``{network: {...}}``: a whole
spec.network (the shared topology, cross traffic) merged over the base's.
Each row reports, beside time to accuracy, what the method did to the
bottleneck: its worst link's p99 queueing delay and the drops there, and the
cross traffic's goodput while on.

Locally each cell is `netsense run`; with --cluster each cell is a NetSenseJob
submitted through the Kubernetes API (current kubeconfig), its result read back
from the job's status.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

from netsense.spec import SpecError, parse_job
from netsense.spec.job import read_yaml
from netsense.spec.schema import Issue


@dataclass(frozen=True)
class Cell:
    method: str
    scenario: str
    seed: int
    job: dict  # a full NetSenseJob document

    @property
    def name(self) -> str:
        return f"{self.method}--{self.scenario}--s{self.seed}"


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _dns(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:50]


def load_grid(path: str, only_seeds: list[int] | None = None) -> tuple[str, list[Cell], dict]:
    """The grid's cells; ``only_seeds``: just these of its seeds (a run to be completed later in the same --out)."""
    grid = read_yaml(path, "grid")
    if not isinstance(grid, dict):
        raise SpecError([Issue(path, "a grid is a mapping with base, methods, profiles, seeds")])
    for key in ("methods", "profiles"):
        if not isinstance(grid.get(key), dict) or not grid[key]:
            raise SpecError([Issue(key, "required: a non-empty mapping of name -> settings")])
    seeds = grid.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise SpecError([Issue("seeds", "must be a list of non-negative integers")])
    if only_seeds is not None:
        missing = sorted(set(only_seeds) - set(seeds))
        if missing:
            raise SpecError([Issue("--seeds", f"{missing} not among the grid's seeds {seeds}")])
        seeds = [s for s in seeds if s in only_seeds]
        grid = {**grid, "seeds": seeds}  # what the tables say was run
    base = grid.get("base") or {}
    t = base.get("training", {})
    if "targetAccuracy" not in t or not any(k in t for k in ("maxSeconds", "maxSteps", "epochs")):
        raise SpecError([Issue("base.training", "a fair benchmark needs targetAccuracy and a budget "
                                                "(maxSeconds, maxSteps or epochs) shared by every method")])
    cells = []
    for method, compression in grid["methods"].items():
        for scenario, setting in grid["profiles"].items():
            network = setting["network"] if isinstance(setting, dict) and "network" in setting else {"profile": setting}
            for seed in seeds:
                spec = _merge(base, {"compression": compression, "network": network, "training": {"seed": seed}})
                doc = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob",
                       "metadata": {"name": _dns(f"{method}-{scenario}-s{seed}")}, "spec": spec}
                try:
                    parse_job(doc)
                except SpecError as e:
                    raise SpecError([Issue(f"{method} x {scenario}: {i.path}", i.message) for i in e.issues]) from None
                cells.append(Cell(method, scenario, seed, doc))
    return grid.get("name", os.path.splitext(os.path.basename(path))[0]), cells, grid


# ---- running ------------------------------------------------------------------------

def run_local(cell: Cell, out_dir: str) -> dict:
    from netsense.emulation.runner import RunFailed, run_job

    job = parse_job(cell.job)
    try:
        return run_job(job, out_dir, quiet=True)
    except RunFailed as e:
        return {"status": "Failed", "reason": str(e)}


def run_cluster(cell: Cell, namespace: str, timeout_s: float = 7200, poll_s: float = 2.0) -> dict:
    """Submit the cell as a NetSenseJob, wait for Succeeded/Failed, return status.result."""
    from kubernetes import client

    from netsense.kubeclient import load_kube_config

    load_kube_config()
    api = client.CustomObjectsApi()
    name = cell.job["metadata"]["name"]
    try:
        api.delete_namespaced_custom_object("netsense.dev", "v1alpha1", namespace, "netsensejobs", name)
        time.sleep(1)
    except client.ApiException as e:
        if e.status != 404:
            raise
    api.create_namespaced_custom_object("netsense.dev", "v1alpha1", namespace, "netsensejobs", cell.job)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = api.get_namespaced_custom_object("netsense.dev", "v1alpha1", namespace, "netsensejobs", name)
        status = obj.get("status") or {}
        if status.get("phase") == "Succeeded":
            return {**(status.get("result") or {}), "status": "Succeeded"}
        if status.get("phase") == "Failed":
            return {"status": "Failed", "reason": status.get("message", "")}
        time.sleep(poll_s)
    return {"status": "Failed", "reason": f"not finished after {timeout_s:.0f}s"}


# ---- summarizing --------------------------------------------------------------------

def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _spread(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)


def steps_to_target(result: dict) -> int | None:
    """The first evaluated step at the target accuracy: accuracy per step, apart from speed."""
    target = result.get("target_accuracy")
    for step, _, accuracy in result.get("accuracy_curve") or []:
        if target is not None and accuracy >= target:
            return step
    return None


def worst_queue_p99(result: dict) -> float | None:
    """The p99 queueing delay of the run's worst shaped link (ms)."""
    links = (result.get("bottleneck") or {}).get("links") or {}
    return max((link["queue_delay_p99_ms"] for link in links.values()), default=None)


def step_queue_delay(result: dict) -> float | None:
    """The median over steps of each step's worst queueing delay (ms): what a typical step does to the queue,
    where the p99 over the run also weighs the dense warm-up (from the cell's timeline.csv; local runs)."""
    path = result.get("timeline")
    if not path or not os.path.exists(path):
        return None
    with open(path) as fh:
        worst = [float(r["queue_delay_max_ms"]) for r in csv.DictReader(fh) if r.get("queue_delay_max_ms")]
    return statistics.median(worst) if worst else None


def bottleneck_drops(result: dict) -> int | None:
    links = (result.get("bottleneck") or {}).get("links") or {}
    return sum(link["drops"] for link in links.values()) if links else None


def cross_goodput(result: dict) -> float | None:
    """The cross traffic's total goodput while on (Mbit/s)."""
    flows = (result.get("bottleneck") or {}).get("cross_traffic") or {}
    return sum(f["mean_mbit_when_on"] for f in flows.values()) if flows else None


def summarize(results: list[dict]) -> list[dict]:
    """One row per (scenario, method): means and spreads over seeds, and regret."""
    rows: dict[tuple[str, str], dict] = {}
    for r in results:
        key = (r["scenario"], r["method_label"])
        rows.setdefault(key, {"scenario": key[0], "method": key[1], "runs": []})["runs"].append(r)
    out = []
    for row in rows.values():
        runs = [r for r in row["runs"] if r.get("status") == "Succeeded"]
        ttas = [r["time_to_accuracy_s"] for r in runs if r.get("time_to_accuracy_s") is not None]
        reached = len(ttas) == len(row["runs"]) and runs
        out.append({
            "scenario": row["scenario"], "method": row["method"], "seeds": len(row["runs"]),
            "reached": f"{len(ttas)}/{len(row['runs'])}",
            "tta_mean_s": _mean(ttas) if reached else None, "tta_std_s": _spread(ttas) if reached else None,
            "steps_to_target": _mean([x for x in map(steps_to_target, runs) if x is not None]) if reached else None,
            "samples_per_s": _mean([r["throughput_samples_per_s"] for r in runs]),
            "best_accuracy": _mean([r["best_accuracy"] for r in runs if r.get("best_accuracy") is not None]),
            "final_accuracy": _mean([r["final_accuracy"] for r in runs if r.get("final_accuracy") is not None]),
            "mean_density": _mean([r["mean_ratio"] for r in runs if r.get("mean_ratio") is not None]),
            "wire_mb_per_worker": _mean([r["bytes_sent_per_worker"] / 1e6 for r in runs
                                         if r.get("bytes_sent_per_worker") is not None]),
            "bytes_per_step": _mean([r["bytes_sent_per_worker"] / r["steps"] for r in runs if r.get("steps")]),
            "selection_ms": _mean([r["selection_ms_mean"] for r in runs if r.get("selection_ms_mean") is not None]),
            "queue_p99_ms": _mean([q for q in map(worst_queue_p99, runs) if q is not None]),
            "step_queue_ms": _mean([q for q in map(step_queue_delay, runs) if q is not None]),
            "drops": _mean([d for d in map(bottleneck_drops, runs) if d is not None]),
            "cross_mbit": _mean([x for x in map(cross_goodput, runs) if x is not None]),
            "failed": len(row["runs"]) - len(runs),
        })
    for scenario in {r["scenario"] for r in out}:
        in_scenario = [r for r in out if r["scenario"] == scenario]
        best = min((r["tta_mean_s"] for r in in_scenario if r["tta_mean_s"] is not None), default=None)
        for r in in_scenario:
            r["regret"] = (r["tta_mean_s"] / best) if best and r["tta_mean_s"] is not None else math.inf
    return sorted(out, key=lambda r: (r["scenario"], r["regret"]))


def _fmt(v, digits=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.{digits}f}"
    return str(v)


def markdown(name: str, rows: list[dict], grid: dict, ceiling: float | None = None,
             ceilings: list[float] | None = None) -> str:
    t = grid.get("base", {}).get("training", {})
    lines = [f"# Benchmark: {name}", "",
             f"Target accuracy {t.get('targetAccuracy')} for every method; budget "
             f"{t.get('maxSeconds') or t.get('maxSteps') or t.get('epochs')} ; seeds {grid.get('seeds', [0])}. "
             "TTA = training seconds to the target (mean ± std over seeds; '-' = not reached by every seed "
             "within the budget). Regret = TTA / best TTA in the scenario. Steps = training steps to the "
             "target (accuracy per step, apart from speed). Queue p99 = the p99 queueing delay of the run's "
             "worst shaped link (time-weighted, so the dense warm-up step weighs in), step queue = the median "
             "over steps of each step's worst queueing delay, drops = packets the queues dropped, cross = the "
             "cross traffic's goodput while on (Mbit/s): what the method did to the bottleneck.", ""]
    if ceiling:
        each = f" (before and after the cells: {' and '.join(f'{c:.0f}' for c in ceilings)})" \
            if ceilings and len(ceilings) > 1 else ""
        lines += [f"No-communication ceiling, measured in the same run: {ceiling:.0f} samples/s{each}; "
                  "one worker alone, times the number of workers.", ""]
    for scenario in sorted({r["scenario"] for r in rows}):
        lines += [f"## {scenario}", "",
                  "| method | TTA s | ± | regret | reached | steps | samples/s | x ceiling | best acc | final acc "
                  "| density | MB/step | selection ms | queue p99 ms | step queue ms | drops | cross Mbit/s |",
                  "| --- | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                  "| ---: | ---: | ---: | ---: |"]
        for r in rows:
            if r["scenario"] == scenario:
                lines.append(f"| {r['method']} | {_fmt(r['tta_mean_s'])} | {_fmt(r['tta_std_s'])} | "
                             f"{_fmt(r['regret'])} | {r['reached']} | {_fmt(r.get('steps_to_target'), 0)} | "
                             f"{_fmt(r['samples_per_s'], 0)} | "
                             f"{_fmt(r['samples_per_s'] / ceiling if ceiling and r['samples_per_s'] else None)} | "
                             f"{_fmt(r['best_accuracy'], 3)} | {_fmt(r['final_accuracy'], 3)} | "
                             f"{_fmt(r['mean_density'], 4)} | "
                             f"{_fmt(r['bytes_per_step'] / 1e6 if r['bytes_per_step'] is not None else None, 3)} | "
                             f"{_fmt(r['selection_ms'], 1)} | {_fmt(r.get('queue_p99_ms'), 1)} | "
                             f"{_fmt(r.get('step_queue_ms'), 1)} | "
                             f"{_fmt(r.get('drops'), 0)} | {_fmt(r.get('cross_mbit'), 1)} |")
        lines.append("")
    return "\n".join(lines)


def plots(out_dir: str, rows: list[dict], results: list[dict]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    from netsense.train.results import read_timeline

    made = []
    scenarios = sorted({r["scenario"] for r in rows})
    methods = sorted({r["method"] for r in rows})
    fig, axes = plt.subplots(1, len(scenarios), figsize=(3.2 * len(scenarios), 3.6), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        vals = [next((r["tta_mean_s"] for r in rows if r["scenario"] == scenario and r["method"] == m), None)
                for m in methods]
        ax.bar(range(len(methods)), [v if v is not None else 0 for v in vals], color="tab:blue")
        for i, v in enumerate(vals):
            if v is None:
                ax.text(i, 0, "x", ha="center", color="red")
        ax.set_xticks(range(len(methods)), methods, rotation=60, fontsize=7)
        ax.set_title(scenario, fontsize=9)
    axes[0][0].set_ylabel("time to accuracy (s)")
    fig.tight_layout()
    path = os.path.join(out_dir, "tta.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append(path)
    # Density against link rate over time, first seed of each method, per scenario.
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(8, 2.4 * len(scenarios)), squeeze=False)
    for ax, scenario in zip(axes[:, 0], scenarios, strict=True):
        link_drawn = False
        twin = ax.twinx()
        for r in results:
            if r["scenario"] != scenario or r.get("timeline") is None or r["seed"] != min(
                    x["seed"] for x in results if x["scenario"] == scenario):
                continue
            rows_t = read_timeline(r["timeline"])
            ax.plot([x["time"] for x in rows_t], [x["ratio"] for x in rows_t], lw=0.8, label=r["method_label"])
            if not link_drawn:
                twin.plot([x["time"] for x in rows_t], [x["link_rate_mbit"] for x in rows_t], color="black", lw=1.5)
                link_drawn = True
        ax.set_yscale("log")
        ax.set_ylabel("density")
        twin.set_ylabel("link Mbit/s")
        ax.set_title(scenario, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, ncol=4)
    axes[-1, 0].set_xlabel("training time (s)")
    fig.tight_layout()
    path = os.path.join(out_dir, "density_vs_link.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append(path)
    return made


def measure_ceiling(grid: dict, out_dir: str, when: str = "before") -> float | None:
    """Samples/s with no communication: one worker alone (world size 1), times the workers.

    Each emulated host has a core of its own, so a lone worker computes as fast
    as each worker of the gang would if the network cost nothing. Measured
    before and after the grid (``when``): a shared machine drifts by +-10% over
    minutes, and bracketing the cells averages that out of the ratio.
    """
    base = grid.get("base") or {}
    workers = base.get("workers", 2)
    spec = _merge(base, {"workers": 1, "compression": {"method": "allreduce"}})
    spec.get("network", {}).pop("profile", None)
    doc = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "ceiling"},
           "spec": spec}
    print(f"[ceiling, {when}] one worker, no communication", file=sys.stderr, flush=True)
    cell_dir = os.path.join(out_dir, f"ceiling-{when}")
    r = _previous(cell_dir) or run_local(Cell("ceiling", "none", 0, doc), cell_dir)
    if r.get("status") != "Succeeded" or not r.get("throughput_samples_per_s"):
        return None
    return r["throughput_samples_per_s"] * workers


def _previous(cell_dir: str) -> dict | None:
    """A cell finished by an earlier, interrupted run into the same --out directory."""
    try:
        with open(os.path.join(cell_dir, "result.json")) as fh:
            r = json.load(fh)
    except (OSError, ValueError):
        return None
    return r if r.get("status") == "Succeeded" else None


def run_bench(grid_path: str, out_dir: str | None, cluster: bool = False, namespace: str = "default",
              seeds: list[int] | None = None) -> int:
    name, cells, grid = load_grid(grid_path, seeds)
    out_dir = out_dir or os.path.join("runs", f"bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out_dir, exist_ok=True)
    results = []
    ceilings: list[float | None] = []
    if grid.get("ceiling") and not cluster:
        ceilings.append(measure_ceiling(grid, out_dir, "before"))
    start = time.monotonic()
    for i, cell in enumerate(cells):
        elapsed = time.monotonic() - start
        eta = elapsed / i * (len(cells) - i) if i else 0
        print(f"[{i + 1}/{len(cells)}] {cell.method} x {cell.scenario} seed {cell.seed} "
              f"(elapsed {elapsed:.0f}s, eta {eta:.0f}s)", file=sys.stderr, flush=True)
        cell_dir = os.path.join(out_dir, cell.name)
        r = None if cluster else _previous(cell_dir)
        if r is not None:
            print("    (reusing the finished result in this output directory)", file=sys.stderr)
        else:
            r = run_cluster(cell, namespace) if cluster else run_local(cell, cell_dir)
        r.update(scenario=cell.scenario, method_label=cell.method, seed=cell.seed,
                 timeline=None if cluster else os.path.join(cell_dir, "timeline.csv"))
        if r.get("timeline") and not os.path.exists(r["timeline"]):
            r["timeline"] = None
        print(f"    -> {r.get('status')}: TTA {_fmt(r.get('time_to_accuracy_s'))} s, "
              f"{_fmt(r.get('throughput_samples_per_s'), 0)} samples/s, best acc {_fmt(r.get('best_accuracy'), 3)}"
              + (f" ({r.get('reason')})" if r.get("reason") else ""), file=sys.stderr, flush=True)
        results.append(r)
        with open(os.path.join(out_dir, "summary.json"), "w") as fh:  # partial results survive a Ctrl-C
            json.dump(results, fh, indent=1, default=str)
    if ceilings:
        ceilings.append(measure_ceiling(grid, out_dir, "after"))
    measured = [c for c in ceilings if c]
    ceiling = sum(measured) / len(measured) if measured else None
    rows = summarize(results)
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    if ceiling:
        for r in rows:
            r["ratio_to_ceiling"] = r["samples_per_s"] / ceiling if r["samples_per_s"] else None
    with open(os.path.join(out_dir, "table.json"), "w") as fh:
        json.dump(rows, fh, indent=1, default=str)
    md = markdown(name, rows, grid, ceiling, measured)
    with open(os.path.join(out_dir, "summary.md"), "w") as fh:
        fh.write(md + "\n")
    made = plots(out_dir, rows, results)
    print(md)
    print(f"netsense: wrote {out_dir}/summary.json, summary.md" + "".join(f", {os.path.basename(p)}" for p in made),
          file=sys.stderr)
    return 0 if all(r.get("status") == "Succeeded" for r in results) else 1
