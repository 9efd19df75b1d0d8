"""How many cells of a grid fit side by side on a cluster now (`netsense bench --cluster` without --parallel).

A cell is one job: ``workers`` pods, each its trainer's requests plus its shaper's (a sidecar's requests add to
the pod's). The room is what the scheduler would see in total: every Ready, schedulable node's allocatable cpu
and memory, less what the pods on them that have not ended request. A total, not a packing: a cell whose pods
fit in the sum but on no single node still waits (and fails after the pending timeout with the scheduler's
reason), so this is an upper bound the campaign can meet, never more cells than there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from netsense.gang import SHAPER_RESOURCES, TRAINER_RESOURCES
from netsense.spec import Job


@dataclass(frozen=True)
class Room:
    cpu: Decimal
    memory: Decimal
    note: str  # how it was counted


def cell_requests(job: Job) -> tuple[Decimal, Decimal]:
    """(cpu, memory) one cell's pods request in all."""
    from kubernetes.utils import parse_quantity

    pod = [(job.spec.get("resources") or TRAINER_RESOURCES).get("requests") or {}]
    if job.network.get("profile"):
        pod.append(SHAPER_RESOURCES["requests"])
    cpu = sum((parse_quantity(r.get("cpu", 0)) for r in pod), Decimal(0))
    memory = sum((parse_quantity(r.get("memory", 0)) for r in pod), Decimal(0))
    return cpu * job.workers, memory * job.workers


def cluster_room(core=None) -> Room:
    """Free cpu and memory on the Ready, schedulable nodes (allocatable alone where pods cannot be listed);
    ``core``: a CoreV1Api (default: the current kubeconfig's)."""
    from kubernetes import client
    from kubernetes.utils import parse_quantity

    core = core or client.CoreV1Api()
    nodes = [n for n in core.list_node().items if not n.spec.unschedulable and any(
        c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
    names = {n.metadata.name for n in nodes}
    cpu = sum((parse_quantity(n.status.allocatable.get("cpu", 0)) for n in nodes), Decimal(0))
    memory = sum((parse_quantity(n.status.allocatable.get("memory", 0)) for n in nodes), Decimal(0))
    try:
        pods = core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    except client.ApiException as e:
        return Room(cpu, memory, f"{len(nodes)} Ready node(s)' allocatable (pods not listable: {e.status} {e.reason})")
    for p in pods:
        if p.spec.node_name not in names:
            continue
        # Sidecars (restartable init containers) hold their requests while the pod runs; plain init containers not.
        sidecars = [c for c in p.spec.init_containers or [] if c.restart_policy == "Always"]
        for c in [*(p.spec.containers or []), *sidecars]:
            requests = (c.resources.requests if c.resources else None) or {}
            cpu -= parse_quantity(requests.get("cpu", 0))
            memory -= parse_quantity(requests.get("memory", 0))
    return Room(max(cpu, Decimal(0)), max(memory, Decimal(0)), f"{len(nodes)} Ready node(s), less what their "
                                                                 f"{sum(p.spec.node_name in names for p in pods)} pods request")


def cells_that_fit(room: Room, cell: tuple[Decimal, Decimal], cells: int) -> int:
    """At least 1 (a cell that does not fit now may once others end), at most ``cells``."""
    fits = [room.cpu / cell[0] if cell[0] else None, room.memory / cell[1] if cell[1] else None]
    bound = min((int(f) for f in fits if f is not None), default=cells)
    return max(1, min(cells, bound))
