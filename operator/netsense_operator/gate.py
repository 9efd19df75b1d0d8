"""Whether a whole gang fits the cluster's free room now (pure functions, unit-testable): the operator's gang
admission.

DDP cannot start with part of a gang: ranks scheduled one at a time wait at the rendezvous for ranks that
cannot be placed, and two jobs each holding one rank deadlock. So every worker pod is created behind a
scheduling gate (GATE), and the operator lifts a gang's gates together, one gang at a time, only once the whole
gang fits the free room: each Ready, schedulable node's allocatable less what the pods bound to it request, less
what gangs admitted a moment ago will take (their pods not bound yet). The placement is the scheduler's; this
check only says whether one exists: ranks are placed greedily, each on the node with the most free cpu that
holds it whole, honouring the node's NoSchedule/NoExecute taints (the pod's tolerations) and the pod's
nodeSelector. Affinity is not modelled: a gang the check admits and the scheduler cannot place shows the
scheduler's reason in the PodsReady condition, and pendingTimeoutSeconds bounds that wait as any other.
Pods that name a Kueue queue are left to Kueue (its own gate, and admission of the whole pod group).
"""

from __future__ import annotations

from decimal import Decimal

from netsense_operator.quota import describe, pod_use, quantity

GATE = "netsense.dev/gang"
Resources = dict[str, Decimal]


def _ready(node: dict) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def node_room(nodes: list[dict], pods: list[dict]) -> dict[str, Resources]:
    """Free room by Ready, schedulable node: allocatable (``pods`` too) less what the non-terminal pods bound to it
    request."""
    room = {n["metadata"]["name"]: {k: quantity(v) for k, v in ((n.get("status") or {}).get("allocatable")
                                                               or {}).items()}
            for n in nodes if _ready(n)}
    for p in pods:
        where = room.get((p.get("spec") or {}).get("nodeName"))
        if where is None or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for name, value in {**pod_use(p), "pods": Decimal(1)}.items():
            where[name] = where.get(name, Decimal(0)) - value
    return room


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    """The Kubernetes rule: a toleration matches a taint by key (an empty key with Exists: every key), by value
    (Equal, the default) or any (Exists), and by effect (an empty effect: every effect)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t["key"] != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _may_host(node: dict, pod: dict) -> bool:
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    return all(_tolerated(t, spec.get("tolerations") or []) for t in (node.get("spec") or {}).get("taints") or []
               if t.get("effect") in ("NoSchedule", "NoExecute"))


def _place(nodes: list[dict], free: dict[str, Resources], pods: list[dict]) -> str | None:
    """Place ``pods`` greedily into ``free`` (changed: what they take is taken); why one cannot be placed, or
    None."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    needs = [(pod, {**pod_use(pod), "pods": Decimal(1)}) for pod in pods]
    needs.sort(key=lambda pn: (pn[1].get("cpu", Decimal(0)), pn[1].get("memory", Decimal(0))), reverse=True)
    for pod, need in needs:
        hosts = [name for name, r in free.items() if name in by_name and _may_host(by_name[name], pod)
                 and all(r.get(k, Decimal(0)) >= v for k, v in need.items() if v)]
        if not hosts:
            best = max(free.values(), key=lambda r: r.get("cpu", Decimal(0)), default=None)
            return (f"a pod needs {describe(need)}, and no Ready node that may host it has that free (the most free: "
                    f"{describe({k: best.get(k, Decimal(0)) for k in need}) if best is not None else 'no Ready node'})")
        host = max(hosts, key=lambda name: free[name].get("cpu", Decimal(0)))
        for k, v in need.items():
            free[host][k] = free[host].get(k, Decimal(0)) - v
    return None


def shortfall(nodes: list[dict], room: dict[str, Resources], gang: list[dict]) -> str | None:
    """Why ``gang`` (its pods) does not fit ``room`` now, in one line (None: it fits)."""
    why = _place(nodes, {name: dict(r) for name, r in room.items()}, gang)
    return None if why is None else f"the gang of {len(gang)} pod(s) does not fit the free room now: {why}"


def reserve(nodes: list[dict], room: dict[str, Resources], pods: list[dict]) -> None:
    """Take ``pods`` (admitted, not bound yet) out of ``room`` where they would be placed: an estimate of where
    the scheduler puts them, only until they are bound."""
    _place(nodes, room, pods)


def gated(pod: dict) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])
