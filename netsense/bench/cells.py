"""Running one cell: locally (`netsense run`), or as a NetSenseJob through the Kubernetes API; and the
no-communication ceiling the cells are compared with."""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
import time

from netsense.bench.grid import Cell, merge
from netsense.bench.provenance import UNKNOWN
from netsense.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION, parse_job


def run_local(cell: Cell, out_dir: str, plot: bool = False) -> dict:
    from netsense.emulation.runner import RunFailed, run_job

    job = parse_job(cell.job)
    try:
        return run_job(job, out_dir, quiet=True, plot_timeline=plot)
    except RunFailed as e:
        return {"status": "Failed", "reason": str(e)}


PENDING_TIMEOUT_S = 600  # a cell whose pods cannot start fails with their reason instead of waiting


def run_cluster(cell: Cell, namespace: str, timeout_s: float = 7200, poll_s: float = 2.0,
                pending_timeout_s: int = PENDING_TIMEOUT_S, stop: threading.Event | None = None,
                output: dict | None = None) -> dict:
    """Submit the cell as a NetSenseJob, wait for Succeeded/Failed, return status.result. A gang not all
    running ``pending_timeout_s`` after its pods were created (an image no node has, no room) fails the cell
    with the pods' own reason (the job's runPolicy.pendingTimeoutSeconds, unless the grid sets one). The job is
    deleted once it ends, and when interrupted (Ctrl-C here, or ``stop`` set by the bench's main thread).
    ``output``: the job's spec.output (where its ranks leave their artifacts)."""
    from kubernetes import client

    from netsense.keys import snake_keys
    from netsense.kubeclient import load_kube_config

    load_kube_config()
    api = client.CustomObjectsApi()
    name = cell.job["metadata"]["name"]
    try:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        time.sleep(1)
    except client.ApiException as e:
        if e.status != 404:
            raise
    body = copy.deepcopy(cell.job)
    body["spec"].setdefault("runPolicy", {}).setdefault("pendingTimeoutSeconds", pending_timeout_s)
    if output:
        body["spec"]["output"] = output
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    deadline = time.monotonic() + timeout_s
    result = {"status": "Failed", "reason": f"not finished after {timeout_s:.0f}s"}
    try:
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            status = obj.get("status") or {}
            if status.get("phase") == "Succeeded":
                result = {**snake_keys(status.get("result") or {}), "status": "Succeeded"}  # result.json's names
                break
            if status.get("phase") == "Failed":
                result = {"status": "Failed", "reason": status.get("message", "")}
                break
            time.sleep(poll_s)
    finally:  # done, failed or interrupted: the cell's job goes (its pods with it); the table keeps its result
        try:
            api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except client.ApiException as e:
            if e.status != 404:
                print(f"netsense: could not delete NetSenseJob {namespace}/{name}: {e.reason}", file=sys.stderr)
    return result


def measure_ceiling(grid: dict, out_dir: str, when: str = "before") -> float | None:
    """Samples/s with no communication: one worker alone (world size 1), times the workers.

    Each emulated host has a core of its own, so a lone worker computes as fast
    as each worker of the gang would if the network cost nothing. Measured
    before and after the grid (``when``): a shared machine drifts by +-10% over
    minutes, and bracketing the cells averages that out of the ratio.
    """
    base = grid.get("base") or {}
    workers = base.get("workers", 2)
    spec = merge(base, {"workers": 1})
    spec["compression"] = {"method": "allreduce"}
    spec.get("network", {}).pop("profile", None)
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "ceiling"},
           "spec": spec}
    print(f"[ceiling, {when}] one worker, no communication", file=sys.stderr, flush=True)
    cell_dir = os.path.join(out_dir, f"ceiling-{when}")
    r = previous_result(cell_dir) or run_local(Cell("ceiling", "none", 0, doc), cell_dir)
    if r.get("status") != "Succeeded" or not r.get("throughput_samples_per_s"):
        return None
    return r["throughput_samples_per_s"] * workers


def previous_result(cell_dir: str) -> dict | None:
    """A cell finished by an earlier, interrupted run into the same --out directory."""
    try:
        with open(os.path.join(cell_dir, "result.json")) as fh:
            r = json.load(fh)
    except (OSError, ValueError):
        return None
    return r if r.get("status") == "Succeeded" else None


def record_result(cell_dir: str, result: dict) -> None:
    """A cluster cell's result (its job's status.result) where a local cell's run writes its own."""
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, "result.json"), "w") as fh:
        json.dump(result, fh, indent=1, default=str)


PROVENANCE = "provenance.json"


def record_provenance(cell_dir: str, source: dict) -> None:
    """Which commit ran this cell (kept beside its result: a later run into the same --out may reuse it)."""
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, PROVENANCE), "w") as fh:
        json.dump(source, fh)


def previous_provenance(cell_dir: str) -> dict:
    """The commit that ran a reused cell; unknown (None) for cells from before provenance was recorded."""
    try:
        with open(os.path.join(cell_dir, PROVENANCE)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return dict(UNKNOWN)

