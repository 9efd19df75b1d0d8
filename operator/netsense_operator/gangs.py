"""A job's gang: its shared objects (ConfigMap, rendezvous Service), its pods made whole or not at all (the fence's
rules, the namespace's quotas), admitted to the nodes together (gate.py), deleted by attempt (at once on a lost
node)."""

from __future__ import annotations

import logging
import os
import threading
import time

import kopf
from kubernetes.client.rest import ApiException

from netsense.spec import Job, fence
from netsense.spec.job import penalties_configmap
from netsense_operator import api, gate, nodes, quota
from netsense_operator import resources as res

# The shaping sidecar's image, chosen by whoever installs the operator (a digest pins it), not by each job.
SHAPER_IMAGE = os.environ.get("NETSENSE_SHAPER_IMAGE") or res.SHAPER_IMAGE
# The trainer's image of a job that names none, chosen by the install too (a CRD default no registry serves left
# such jobs' pods in ImagePullBackOff).
WORKER_IMAGE = os.environ.get("NETSENSE_WORKER_IMAGE") or res.DEFAULT_IMAGE


NODES = nodes.NodeWatch(api.read_node)


def delete_pods(namespace: str, pods: list[dict], lost_after_s: float | None = None) -> None:
    """Each pod, at once (grace 0) where its node is lost (``lost_after_s``: the job's lostNodeSeconds), else
    gracefully; a pod already terminating is deleted again only to force it."""
    for pod in pods:
        force = lost_after_s is not None and NODES.lost(pod, lost_after_s) is not None
        if force or not pod["metadata"].get("deletionTimestamp"):
            api.delete("Pod", pod["metadata"]["name"], namespace, force=force)


def delete_gang(job: Job, namespace: str, attempt: int, uid: str) -> int:
    """Every pod of one attempt that this job owns, by name: right even before the watch has seen them. A pod
    under such a name that another owns (the reason for a NameTaken) is not the job's to delete. Returns how
    many of the job's pods of that attempt still exist (deleted now, or terminating)."""
    found = 0
    for rank in range(job.pods):
        name = res.pod_name(job.name, attempt, rank)
        try:
            pod = api.core().read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                continue
            raise
        pod = api.core().api_client.sanitize_for_serialization(pod)
        if res.controller_uid(pod) == uid:
            found += 1
            delete_pods(namespace, [pod], job.run_policy["lostNodeSeconds"])
    return found


def create_shared(job: Job, namespace: str, uid: str) -> None:
    """What every pod of the job uses: the job's ConfigMap and the rendezvous Service (not for a calibrate job's
    one pod: its runs rendezvous on the pod's loopback)."""
    api.create("ConfigMap", res.config_map(job, namespace, uid), namespace, uid)
    if job.mode != "calibrate":
        api.create("Service", res.service(job, namespace, uid), namespace, uid)


# Waiting for a quota's room: the next look at the namespace's quotas after QUOTA_BACKOFF_S, doubling up to
# QUOTA_BACKOFF_MAX_S while the gang still does not fit (a pass in between says the last answer, at no request).
QUOTA_BACKOFF_S, QUOTA_BACKOFF_MAX_S = 2.0, 30.0
_quota_waits: dict[str, tuple[float, float, str]] = {}  # job uid -> (next look, delay, the last shortfall)


def _check_quota(namespace: str, uid: str, pods: list[dict]) -> None:
    """api.AdmissionWait("QuotaExceeded") unless every pod of ``pods`` fits the namespace's quotas now (quota.py)."""
    now = time.monotonic()
    waiting = _quota_waits.get(uid)
    if waiting and now < waiting[0]:
        raise api.AdmissionWait("QuotaExceeded", waiting[2])
    try:
        quotas = api.core().api_client.sanitize_for_serialization(api.core().list_namespaced_resource_quota(namespace).items)
    except ApiException as e:
        if e.status == 403:  # an install from before this check: the create's own refusal is the net
            return
        raise kopf.TemporaryError(f"listing the ResourceQuotas of {namespace}: {api.api_message(e)}", delay=5) from e
    short = quota.shortfall(quotas, quota.demand(pods))
    if short is None:
        _quota_waits.pop(uid, None)
        return
    delay = min(QUOTA_BACKOFF_MAX_S, 2 * waiting[1]) if waiting else QUOTA_BACKOFF_S
    _quota_waits[uid] = (now + delay, delay, short)
    raise api.AdmissionWait("QuotaExceeded", short)


# Gang admission (gate.py): one gang at a time, against the cluster's free room (cached ROOM_CACHE_S) less the
# gangs admitted whose pods are not bound yet.
ROOM_CACHE_S = 5.0
_admission = threading.Lock()
_room: list = []  # [(when, nodes, room by node)] while cached
reserved: dict[str, list[dict]] = {}  # job uid -> its admitted gang's pods, until they are bound
_room_unknown_said = [False]


def _cluster_room() -> tuple[list[dict], dict] | None:
    """(Ready nodes, free room by node), or None where nodes cannot be listed (RBAC)."""
    if _room and time.monotonic() - _room[0][0] < ROOM_CACHE_S:
        return _room[0][1], {k: dict(v) for k, v in _room[0][2].items()}
    serialize = api.core().api_client.sanitize_for_serialization
    try:
        nodes = serialize(api.core().list_node().items)
    except ApiException as e:
        if e.status != 403:
            raise kopf.TemporaryError(f"listing nodes: {api.api_message(e)}", delay=5) from e
        if not _room_unknown_said[0]:
            _room_unknown_said[0] = True
            logging.getLogger(__name__).warning("cannot list nodes (RBAC: list on nodes): gangs are started without "
                                                "checking that they fit")
        return None
    running = "status.phase!=Succeeded,status.phase!=Failed"
    try:
        pods = serialize(api.core().list_pod_for_all_namespaces(field_selector=running).items)
    except ApiException as e:  # a namespaced install: the pods it may see (other namespaces' are not counted)
        if e.status != 403:
            raise kopf.TemporaryError(f"listing pods: {api.api_message(e)}", delay=5) from e
        pods = [p for n in os.environ.get("NETSENSE_NAMESPACES", "").split(",") if n
                for p in serialize(api.core().list_namespaced_pod(n, field_selector=running).items)]
    room = gate.node_room(nodes, pods)
    _room[:] = [(time.monotonic(), nodes, room)]
    return nodes, {k: dict(v) for k, v in room.items()}


def admit(job: Job, namespace: str, uid: str, attempt: int, pods: list[dict]) -> tuple[str, str] | None:
    """Lift the gang's gates together if the whole gang fits now (None), else why it waits."""
    gang = [res.worker_pod(job, namespace, uid, rank, attempt, SHAPER_IMAGE, WORKER_IMAGE)
            for rank in range(job.pods)]
    with _admission:
        view = _cluster_room()
        if view is not None:
            nodes, room = view
            for other, admitted in reserved.items():
                if other != uid:
                    gate.reserve(nodes, room, admitted)
            why = gate.shortfall(nodes, room, gang)
            if why:
                return "WaitingForRoom", why
        for pod in pods:
            if gate.gated(pod):
                _lift(pod["metadata"]["name"], namespace)
        reserved[uid] = gang
    return None


def _lift(name: str, namespace: str) -> None:
    try:
        api.core().patch_namespaced_pod(name, namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
    except ApiException as e:
        if e.status not in (404, 422):  # gone, or lifted already
            raise kopf.TemporaryError(f"lifting the gate of {name}: {api.api_message(e)}", delay=2) from e


def release(uid: str) -> None:
    with _admission:
        if reserved.pop(uid, None) is not None:
            _room.clear()  # the next admission lists again: what was reserved counts where it is bound


def _check_penalties(job: Job, namespace: str) -> None:
    """A tta job's penalties ConfigMap (spec.compression.penalties: configmap:NAME), read before its pods are made:
    one that cannot serve it fails the job naming the field (a pod waiting for a ConfigMap that is not there would
    wait without saying why), unless it is missing because the calibrate job that writes it is still running (a
    calibrate job and a tta job applied together): then the gang waits for it (api.AdmissionWait), and fails
    should that calibration fail."""
    name = penalties_configmap(job.compression) if job.mode != "calibrate" else None
    if name is None or (why := api.check_penalties(name, namespace)) is None:
        return
    if (calibration := api.calibration_writing(name, namespace)) is not None:
        raise api.AdmissionWait("WaitingForCalibration", f"ConfigMap {name} is written by the calibrate job "
                                f"{calibration} when it succeeds: waiting for it")
    raise api.Refused("InvalidSpec", f"spec.compression.penalties: {why}")


def create_gang(job: Job, namespace: str, uid: str, attempt: int, ranks: list[int] | None = None) -> None:
    """The gang whole or not at all. Every pod is built and checked against the fence's rules
    (netsense.spec.fence) before the first is created: a pod no job may have is a defect of ours, said plainly,
    never half a gang or a 403 from the fence. Then the quotas (quota.py): a gang that does not fit waits with
    no pod made. A refusal that passes (a quota the check does not model) after part of the gang exists deletes
    that part again (api.GangRolledBack)."""
    pods = [res.worker_pod(job, namespace, uid, rank, attempt, SHAPER_IMAGE, WORKER_IMAGE)
            for rank in (range(job.pods) if ranks is None else ranks)]
    for pod in pods:
        if broken := fence.violations(pod):
            raise api.Refused("InvalidPod", f"Pod {pod['metadata']['name']} breaks the fence: {'; '.join(broken)}")
    _check_penalties(job, namespace)
    _check_quota(namespace, uid, pods)
    made = 0
    try:
        for pod in pods:
            api.create("Pod", pod, namespace, uid)
            made += 1
    except api.AdmissionWait as e:
        if not made and len(pods) == job.pods:
            raise
        delete_gang(job, namespace, attempt, uid)
        raise api.GangRolledBack(e.reason, f"{e}; the part of the gang already made was deleted, to wait whole") from e


def forget(uid: str) -> None:
    """A deleted job's memories: its quota wait, its reserved room."""
    _quota_waits.pop(uid, None)
    release(uid)
