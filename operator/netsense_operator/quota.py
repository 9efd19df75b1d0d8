"""Whether a whole gang fits a namespace's ResourceQuotas now (pure functions, unit-testable).

A gang is created whole or not at all: created one pod at a time, it would stop at the first pod a quota refuses,
and the ranks already made would hold their share of the quota while they wait at the rendezvous for ranks that
never come (two jobs can deadlock so, each holding part of the quota). So before the first pod the operator adds
up what the gang would use, in each quota's terms, and waits (condition QuotaExceeded, naming the quota and the
resource) while any quota lacks room. A quota with scopes (Terminating, BestEffort, PriorityClass, ...) is not
modelled here: a refusal by one is caught at creation, and what was made of the gang is deleted again.

A pod's use, as the quota admission and the scheduler count it: each resource's request (its limit where only a
limit is set), summed over the app containers and the sidecars (restartable init containers), or a plain init
container's with the sidecars started before it, if that is more; ``pods`` and ``count/pods`` count it once.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal


def quantity(value) -> Decimal:
    from kubernetes.utils import parse_quantity

    return parse_quantity(value)


def _container(c: dict, kind: str) -> dict[str, Decimal]:
    resources = c.get("resources") or {}
    values = dict(resources.get("limits") or {}) if kind == "requests" else {}
    values.update(resources.get(kind) or {})  # a request defaults to the limit where only the limit is set
    return {name: quantity(v) for name, v in values.items()}


def _add(total: dict[str, Decimal], more: dict[str, Decimal]) -> None:
    for name, v in more.items():
        total[name] = total.get(name, Decimal(0)) + v


def pod_use(pod: dict, kind: str = "requests") -> dict[str, Decimal]:
    """A pod's effective ``kind`` ("requests" or "limits") by resource name, as the scheduler and the quota
    count it: the app containers and the sidecars together, or, if more, a plain init container with the
    sidecars started before it."""
    spec = pod.get("spec") or {}
    running: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    peaks: list[dict[str, Decimal]] = []
    for c in spec.get("containers") or []:
        _add(running, _container(c, kind))
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            _add(sidecars, _container(c, kind))
        else:
            peak = dict(sidecars)
            _add(peak, _container(c, kind))
            peaks.append(peak)
    _add(running, sidecars)
    for peak in peaks:
        for name, v in peak.items():
            running[name] = max(running.get(name, Decimal(0)), v)
    return running


def demand(pods: Iterable[dict]) -> dict[str, Decimal]:
    """What ``pods`` would add to a quota's usage, keyed as quotas name resources (requests.cpu and cpu alike,
    limits.memory, requests.nvidia.com/gpu, pods, count/pods)."""
    out: dict[str, Decimal] = {}
    n = 0
    for pod in pods:
        n += 1
        for name, v in pod_use(pod, "requests").items():
            _add(out, {f"requests.{name}": v})
            if "/" not in name and not name.startswith("hugepages-"):
                _add(out, {name: v})  # a native resource's bare name in a quota is its request
        for name, v in pod_use(pod, "limits").items():
            _add(out, {f"limits.{name}": v})
    out["pods"] = out["count/pods"] = Decimal(n)
    return out


def shortfall(quotas: list[dict], needed: dict[str, Decimal]) -> str | None:
    """Why the gang does not fit now, naming the quota and the resource (None: it fits every unscoped quota).
    ``quotas``: ResourceQuota objects as dicts; one whose status the quota controller has not written yet is
    waited for too (the API server would refuse with "status unknown for quota")."""
    for quota in quotas:
        spec, status = quota.get("spec") or {}, quota.get("status") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue
        name = (quota.get("metadata") or {}).get("name")
        hard, used = status.get("hard"), status.get("used") or {}
        if hard is None:
            if spec.get("hard"):
                return f"ResourceQuota {name}: its usage is not counted yet (new)"
            continue
        for resource, limit in sorted(hard.items()):
            if resource not in needed:
                continue
            free = quantity(limit) - quantity(used.get(resource, 0))
            if needed[resource] > free:
                return (f"ResourceQuota {name}: the gang needs {_text(needed[resource])} {resource}, "
                        f"{_text(max(free, Decimal(0)))} of {limit} free")
    return None


def _text(value: Decimal) -> str:
    return format(value.normalize(), "f")


def describe(resources: dict[str, Decimal]) -> str:
    """'2.02 cpu, 2.12 GiB memory, 1 nvidia.com/gpu': cpu and memory first, memory-like resources in GiB."""
    parts = []
    for name in sorted(resources, key=lambda n: (n not in ("cpu", "memory"), n)):
        value = Decimal(resources[name])
        if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
            parts.append(f"{value / 2**30:.2f} GiB {name}")
        else:
            parts.append(f"{_text(value)} {name}" if value == value.to_integral() else f"{value:.2f} {name}")
    return ", ".join(parts) or "nothing"
