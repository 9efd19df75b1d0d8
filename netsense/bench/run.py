"""`netsense bench`: the loop over the cells, progress on stderr, and what lands in --out."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from netsense.bench import cells, report
from netsense.bench.grid import NO_WIRE, families, load_grid
from netsense.bench.provenance import describe, provenance
from netsense.bench.stats import at_targets, matched_ceiling, sensitivity, summarize, x_allreduce
from netsense.clock import devices


def run_bench(grid_path: str, out_dir: str | None, cluster: bool = False, namespace: str = "default",
              seeds: list[int] | None = None, cell_plots: bool = False, parallel: int | None = None,
              output_claim: str | None = None, reader_image: str | None = None) -> int:
    """``parallel``: cells at once (a cluster's jobs side by side, by default as many as its free resources
    hold: netsense.bench.capacity; locally always 1, the cells share this machine's cores). ``output_claim``: a PersistentVolumeClaim every cluster cell writes its artifacts to, read
    back into the cell's directory (netsense.bench.artifacts)."""
    from netsense.spec import SpecError
    from netsense.spec.schema import Issue

    if output_claim and not cluster:
        raise SpecError([Issue("--output-claim", "a volume for cluster cells (--cluster); a local cell writes its "
                               "own directory")])
    name, todo, grid = load_grid(grid_path, seeds)
    removed = sorted({(k, c.method) for c in todo for k in c.removed})
    if removed:
        from netsense.spec.job import REMOVED_AT

        named = "; ".join(f"compression.{k} ({', '.join(m for key, m in removed if key == k)})"
                          for k in dict.fromkeys(k for k, _ in removed))
        raise SpecError([Issue("ranAt", f"{grid_path} ran at {grid['ranAt']} with settings since removed from tta "
                                        f"(issue 62): {named}. Its committed results are read as they are; to "
                                        f"re-run it, check out that commit (git checkout {grid['ranAt'][:12]}; "
                                        f"{REMOVED_AT[:12]} is the last commit with them)")])
    # On the simulated clock a cell's time is the model's, whatever else runs: cells may share the cores.
    simulated = all((c.job["spec"].get("network") or {}).get("clock") == "simulated" for c in todo)
    if parallel is not None and (parallel < 1 or (parallel > 1 and not (cluster or simulated))):
        raise SpecError([Issue("--parallel", f"{parallel}: cells run side by side on a cluster (--cluster) or on "
                               "the simulated clock (every cell's spec.network.clock: simulated); at least 1")])
    if not cluster:
        _measure_simulation_inputs(todo)
    if parallel is None:
        parallel = _parallel_that_fits(todo) if cluster else 1
    if grid.get("order", "shuffled") == "shuffled":
        # Interleaved: the machine drifts over an hour (10-17% here), and a method whose cells ran in
        # one stretch would carry that stretch's speed. Seeded, so a rerun into the same --out agrees.
        random.Random(grid.get("orderSeed", 0)).shuffle(todo)
    source = provenance(grid_path)
    out_dir = out_dir or os.path.join("runs", f"bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out_dir, exist_ok=True)
    results = []
    ceilings: list[float | None] = []
    if grid.get("ceiling") is True and not cluster:
        ceilings.append(cells.measure_ceiling(grid, out_dir, "before"))
    start = time.monotonic()
    stop = threading.Event()  # Ctrl-C: a cluster cell deletes its job and returns
    volume = Volume(namespace, output_claim, reader_image, grid, name) if output_claim else None
    done: dict[int, dict] = {}
    lock = threading.Lock()

    def one(i: int, cell) -> None:
        if stop.is_set():  # interrupted: no cell starts after a Ctrl-C
            return
        try:
            run_one(i, cell)
        except BaseException:
            stop.set()  # before this thread can take the next cell
            raise

    def run_one(i: int, cell) -> None:
        with lock:
            elapsed = time.monotonic() - start
            # no estimate before a cell has finished: "eta -", not a 0 that reads as "done soon"
            eta = f"{elapsed / len(done) * (len(todo) - len(done)):.0f}s" if done else "-"
            print(f"[{i + 1}/{len(todo)}] {cell.method} x {cell.scenario} seed {cell.seed} "
                  f"(elapsed {elapsed:.0f}s, eta {eta})", file=sys.stderr, flush=True)
        cell_dir = os.path.join(out_dir, cell.name)
        r = cells.previous_result(cell_dir)
        if r is not None:
            r.update(cells.previous_provenance(cell_dir))  # the commit that ran it, not this one
            said = "    (reusing the finished result in this output directory)"
        else:
            if cluster:
                r = cells.run_cluster(cell, namespace, stop=stop, output=volume.output if volume else None)
                if volume and not stop.is_set():
                    volume.collect(cell, cell_dir, r, cell_plots)
            else:
                r = cells.run_local(cell, cell_dir, cell_plots)
            r.update(source)
            if cluster and r.get("status") == "Succeeded":  # kept, so that a resumed campaign skips it
                cells.record_result(cell_dir, r)
            cells.record_provenance(cell_dir, source)
            said = ""
        r.update(scenario=cell.scenario, method_label=cell.method, seed=cell.seed,
                 timeline=os.path.join(cell_dir, "timeline.csv"))
        if r.get("timeline") and not os.path.exists(r["timeline"]):
            r["timeline"] = None
        with lock:
            done[i] = r
            print((said + "\n" if said else "") + f"    -> {cell.name}: {r.get('status')}: time to target "
                  f"{report.fmt(r.get('time_to_accuracy_s'))} s, {report.fmt(r.get('throughput_samples_per_s'), 0)} "
                  f"samples/s, best acc {report.fmt(r.get('best_accuracy'), 3)}"
                  + (f" ({r.get('reason')})" if r.get("reason") else ""), file=sys.stderr, flush=True)
            results[:] = [done[k] for k in sorted(done)]
            with open(os.path.join(out_dir, "summary.json"), "w") as fh:  # partial results survive a Ctrl-C
                json.dump(results, fh, indent=1, default=str)

    try:
        _run_cells(todo, one, parallel, stop)
    finally:
        if volume:
            volume.close()
    if ceilings:
        ceilings.append(cells.measure_ceiling(grid, out_dir, "after"))
    measured = [c for c in ceilings if c]
    ceiling = sum(measured) / len(measured) if measured else None
    family = families(grid)
    trained = [r for r in results if not r["method_label"].endswith(NO_WIRE)]  # the twins are no methods
    rows = summarize(trained, family)
    at_targets(trained, rows, grid.get("targets", []), grid.get("accuracyAfterEpochs"), family)
    if grid.get("ceiling") == "matched":
        matched_ceiling(rows, results, ((grid.get("base") or {}).get("training") or {}).get("batchSize", 32))
    x_allreduce(rows)
    varied = sensitivity(trained, grid)
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    for r in rows:
        r.update(source)
        if ceiling:
            r["ratio_to_ceiling"] = r["samples_per_s"] / ceiling if r["samples_per_s"] else None
    with open(os.path.join(out_dir, "table.json"), "w") as fh:
        json.dump(rows, fh, indent=1, default=str)
    if varied:
        with open(os.path.join(out_dir, "sensitivity.json"), "w") as fh:
            json.dump(varied, fh, indent=1, default=str)
    unread = [r for r in results if r.get("artifacts_error")]
    if unread:
        print(f"netsense: the artifacts of {len(unread)} cell(s) could not be read (their results stand): "
              + ", ".join(f"{r['scenario']}/{r['method_label']}/s{r['seed']}" for r in unread), file=sys.stderr)
    md = report.markdown(name, rows, grid, ceiling, measured, describe(source, results), varied)
    with open(os.path.join(out_dir, "summary.md"), "w") as fh:
        fh.write(md + "\n")
    made = report.plots(out_dir, rows, trained) + report.sensitivity_plot(out_dir, varied)
    print(md)
    print(f"netsense: wrote {out_dir}/summary.json, summary.md" + "".join(f", {os.path.basename(p)}" for p in made),
          file=sys.stderr)
    return 0 if all(r.get("status") == "Succeeded" for r in results) else 1


def _measure_simulation_inputs(todo: list) -> None:
    """Each simulated cell's compute and compression inputs (spec.network.simulation), where the grid does not give
    them: the compute measured once a task (model, data, batch), the compression's paths once a task, path
    settings and workers, here, before any cell runs, and given to every cell of the task. Measured by each cell,
    they would vary with what ran beside it: 3.4-7.4 ms of compute between cells of one task two at a time
    (testbed/results/sim-training.md)."""
    from netsense.spec import parse_job

    computes: dict[tuple, float] = {}  # a task's compute: one measurement for all its cells, whatever they compress
    measured: dict[tuple, tuple[float, float, float]] = {}
    for cell in todo:
        network = cell.job["spec"].get("network") or {}
        sim = network.get("simulation") or {}
        if network.get("clock") != "simulated" or None not in devices.given_inputs(sim):
            continue
        from netsense.train import calibrate

        job = parse_job(cell.job)
        t, settings = job.training, calibrate.path_settings(job.compression)
        task = (t["model"], t["dataset"], t.get("dataPath"), t["hiddenSize"], t["batchSize"])
        paths = (*task, *sorted(settings.items()), job.workers)
        if paths not in measured:
            compute, sparse, lowrank = calibrate.inputs_for(t, job.compression, job.workers,
                                                            compute=computes.get(task))
            computes[task] = compute
            measured[paths] = compute, sparse, lowrank
            print(f"netsense: simulated clock: {t['model']} on {t['dataset']}, batch {t['batchSize']}, "
                  f"{job.workers} workers: a step's compute {compute * 1e3:.2f} ms; per million elements TopK's "
                  f"path {sparse * 1e3:.2f} ms (density {settings['density']:g}), PowerSGD's {lowrank * 1e3:.2f} ms "
                  f"(rank {settings['rank']}) (measured once, given to every cell of the task)",
                  file=sys.stderr, flush=True)
        inputs = (g if g is not None else m for g, m in zip(devices.given_inputs(sim), measured[paths], strict=True))
        network["simulation"] = {**sim, **dict(zip(devices.INPUTS, inputs, strict=True))}


def _run_cells(todo: list, one, parallel: int, stop: threading.Event) -> None:
    """``one(i, cell)`` for every cell, ``parallel`` at once; on Ctrl-C every running cell deletes its job and
    none starts."""
    if parallel == 1:
        for i, cell in enumerate(todo):
            one(i, cell)
        return
    pool = ThreadPoolExecutor(max_workers=parallel)
    futures = [pool.submit(one, i, cell) for i, cell in enumerate(todo)]
    try:
        for f in futures:
            f.result()
    except BaseException:
        stop.set()
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
        raise
    pool.shutdown()


class Volume:
    """--output-claim: where each cluster cell writes (a path of this run's own on the claim, so that a cell run
    again never mixes with what an earlier run left) and how its files come back (one reader pod, started at the
    first cell that needs it)."""

    def __init__(self, namespace: str, claim: str, image: str | None, grid: dict, campaign: str):
        self.namespace, self.claim, self.image, self.grid, self.campaign = namespace, claim, image, grid, campaign
        self.path = f"netsense-bench/{campaign}/{time.strftime('%Y%m%d-%H%M%S')}"
        self.output = {"claimName": claim, "path": self.path}  # every cell's spec.output
        self.reader = None
        self.lock = threading.Lock()

    def _reader(self, fresh: bool = False):
        """The campaign's reader pod, started at the first cell that needs it; ``fresh``: a new one (the last
        was deleted, or its stream broke)."""
        from netsense.bench import artifacts

        with self.lock:
            if fresh and self.reader is not None:
                self.reader.close()
                self.reader = None
            if self.reader is None:
                image = self.image or artifacts.reader_image(self.namespace, self.grid.get("base") or {})
                reader = artifacts.VolumeReader(self.namespace, self.claim, image, self.campaign)
                reader.start()
                self.reader = reader
            return self.reader

    def collect(self, cell, cell_dir: str, result: dict, plot: bool) -> None:
        """The cell's files into cell_dir (netsense.bench.artifacts.lay_out). A fetch that fails (the reader pod
        deleted, a dropped stream, a truncated archive) is tried once more with a fresh reader; a cell whose files
        still cannot be read keeps its result, marked (artifacts_error, and the campaign's last lines), and the
        campaign goes on."""
        from netsense.bench import artifacts

        job = cell.job["metadata"]["name"]
        dest = os.path.join(cell_dir, "artifacts")
        files = None
        for attempt in (1, 2):
            try:
                files = self._reader(fresh=attempt == 2).fetch(f"{self.path}/{job}", dest)
                break
            except artifacts.ArtifactsError as e:
                shutil.rmtree(dest, ignore_errors=True)  # nothing half-extracted is taken for the cell's files
                print(f"    netsense: {cell.name}: {e}" + ("; trying once more with a fresh reader pod"
                                                          if attempt == 1 else ""), file=sys.stderr, flush=True)
                result["artifacts_error"] = str(e)
        if files is None:
            return
        result.pop("artifacts_error", None)
        result["artifacts"] = f"pvc://{self.claim}/{self.path}/{job}"
        timeline = artifacts.lay_out(cell_dir)
        if plot and timeline:
            from netsense.emulation.bottleneck import queue_samples
            from netsense.train.results import plot as plot_timeline

            with self.lock:  # matplotlib is not thread-safe (its parsers share state): one cell's plot at a time
                plot_timeline(timeline, os.path.join(cell_dir, "timeline.png"), cell.name,
                              queue=queue_samples(cell_dir), result=result)
        print(f"    {cell.name}: {len(files)} files from {result['artifacts']}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def _parallel_that_fits(todo: list) -> int:
    """As many cells as the cluster's free resources hold now (the largest cell counted), said on stderr."""
    from netsense.bench import capacity
    from netsense.kubeclient import load_kube_config
    from netsense.spec import parse_job

    load_kube_config()
    room = capacity.cluster_room()
    cell = capacity.largest([capacity.cell_requests(parse_job(c.job)) for c in todo])
    n = capacity.cells_that_fit(room, cell, len(todo))
    free = {name: room.free.get(name, 0) for name in cell}
    print(f"netsense: --parallel {n}: a cell asks for {capacity.describe(cell)}; free: {capacity.describe(free)} "
          f"({room.note})", file=sys.stderr, flush=True)
    return n
