"""How many cells of a grid fit side by side on a cluster now (`netsense bench --cluster` without --parallel).

A cell is one job: the pods the operator would build for it (``worker_pod``: the trainer, the template's
resources, the shaper sidecar, whose requests add to the pod's), each resource counted as the scheduler counts
it (a request, or the limit where only a limit is set: a GPU asked for as ``limits: {nvidia.com/gpu: 1}``). The
room is what the scheduler would see in total: every Ready, schedulable node's allocatable of every resource,
less what the pods on them that have not ended request. A total, not a packing: a cell whose pods fit in the sum
but on no single node still waits (and fails after the pending timeout with the scheduler's reason), so this is
an upper bound the campaign can meet, never more cells than there are. Resources the cells ask for alone count
(cpu, memory, nvidia.com/gpu, ...); a resource no node offers fits no cell.

Building the pods needs the operator's distribution (``pip install . ./operator``), as `netsense operator` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from netsense.spec import Job

Resources = dict[str, Decimal]


@dataclass(frozen=True)
class Room:
    free: Resources  # by resource name: cpu, memory, nvidia.com/gpu, ...
    note: str  # how it was counted


def _operator():
    try:
        from netsense_operator import gate, quota, resources
    except ImportError as e:
        raise SystemExit(f"netsense bench --cluster: sizing cells needs the operator's distribution "
                         f"(pip install . ./operator): {e}") from e
    return gate, quota, resources


def cell_requests(job: Job) -> Resources:
    """What one cell's pods request in all, by resource, as the operator would build them."""
    _, quota, resources = _operator()
    total: Resources = {}
    for rank in range(job.workers):
        for name, value in quota.pod_use(resources.worker_pod(job, "bench", "cell", rank, 0)).items():
            total[name] = total.get(name, Decimal(0)) + value
    return {name: v for name, v in total.items() if v}


def largest(cells: list[Resources]) -> Resources:
    """Resource by resource, the most any one cell asks for (the campaign sizes for its largest cell)."""
    out: Resources = {}
    for cell in cells:
        for name, value in cell.items():
            out[name] = max(out.get(name, Decimal(0)), value)
    return out


def cluster_room(core=None) -> Room:
    """Free allocatable of every resource on the Ready, schedulable nodes (allocatable alone where pods cannot be
    listed): the operator's gang admission's room by node (gate.node_room), summed; ``core``: a CoreV1Api
    (default: the current kubeconfig's)."""
    from kubernetes import client

    gate, _, _ = _operator()
    core = core or client.CoreV1Api()
    serialize = core.api_client.sanitize_for_serialization
    nodes = serialize(core.list_node().items)
    try:
        pods = serialize(core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed").items)
        note = None
    except client.ApiException as e:
        pods, note = [], f"pods not listable: {e.status} {e.reason}"
    room = gate.node_room(nodes, pods)
    free: Resources = {}
    for node in room.values():
        for name, value in node.items():
            free[name] = free.get(name, Decimal(0)) + value
    free = {k: max(v, Decimal(0)) for k, v in free.items()} if note is None else free
    on_nodes = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName") in room)
    return Room(free, f"{len(room)} Ready node(s)' allocatable ({note})" if note else
                f"{len(room)} Ready node(s), less what their {on_nodes} pods request")


def cells_that_fit(room: Room, cell: Resources, cells: int) -> int:
    """At least 1 (a cell that does not fit now may once others end), at most ``cells``."""
    bound = min((int(room.free.get(name, Decimal(0)) / need) for name, need in cell.items() if need > 0),
                default=cells)
    return max(1, min(cells, bound))


def describe(resources: Resources) -> str:
    """'2.02 cpu, 2.12 GiB memory, 1 nvidia.com/gpu' (the operator's wording: quota.describe)."""
    _, quota, _ = _operator()
    return quota.describe(resources)
