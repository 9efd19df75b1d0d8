"""The NetSenseJob operator's kopf handlers.

- create/resume: validate (InvalidSpec -> Failed, no pods), then create the
  rendezvous Service and the first gang of worker pods, idempotently (409s are
  fine: a restarted operator creates nothing twice);
- a pass reconciles a job, level-triggered from what the API says (pods as a
  label-selected watch keeps them in an in-memory index, so a quiet job costs
  no API call), whenever one of its pods or the job itself changes, and on a
  slow timer for what only time changes (deadlines, progress, the profile's step):
  pod phases -> job phase, a failed rank -> the whole gang restarts (up to
  backoffLimit), activeDeadlineSeconds, rank 0's result -> status.result,
  rank 0's progress lines -> status.progress, the profile's current step ->
  status.network, ttlSecondsAfterFinished;
- a spec change of a running job is refused with a condition, never half-applied:
  pods keep being built from the spec recorded at creation (status.appliedSpec).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import threading
import time
import warnings

import kopf
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from netsense import units
from netsense.gang import TRAINER, judge, rank_failure
from netsense.keys import camel_keys
from netsense.kubeclient import load_kube_config
from netsense.shaping.profiles import Profile, build_profile
from netsense.spec import GROUP, PLURAL, VERSION, Job, SpecError, check_cluster, fence, parse_spec
from netsense_operator import gate, leader, metrics, nodes, quota
from netsense_operator import resources as res
from netsense_operator import status as st
from netsense_operator.metrics import METRICS

# Passes run on every event of a job or of its pods; the timer only keeps time (activeDeadlineSeconds,
# pendingTimeoutSeconds, ttlSecondsAfterFinished, progress, the profile's step), so it can be slow.
RECONCILE_INTERVAL = float(os.environ.get("NETSENSE_RECONCILE_INTERVAL", "10"))
# Rank 0's log is read for status.progress at most this often (a GET a read): a running job's steady cost.
PROGRESS_INTERVAL = float(os.environ.get("NETSENSE_PROGRESS_INTERVAL", "5"))
# The shaping sidecar's image, chosen by whoever installs the operator (a digest pins it), not by each job.
SHAPER_IMAGE = os.environ.get("NETSENSE_SHAPER_IMAGE") or res.SHAPER_IMAGE
# The trainer's image of a job that names none, chosen by the install too (a CRD default no registry serves left
# such jobs' pods in ImagePullBackOff).
WORKER_IMAGE = os.environ.get("NETSENSE_WORKER_IMAGE") or res.DEFAULT_IMAGE

_core: client.CoreV1Api | None = None
_custom: client.CustomObjectsApi | None = None


def _api_client() -> client.ApiClient:
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 32  # one connection per handler thread (execution.max_workers)
    return client.ApiClient(cfg)


def core() -> client.CoreV1Api:
    global _core
    if _core is None:
        _core = client.CoreV1Api(_api_client())
    return _core


def custom() -> client.CustomObjectsApi:
    global _custom
    if _custom is None:
        _custom = client.CustomObjectsApi(_api_client())
    return _custom


class DigestDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled configuration with the spec as a digest: the whole spec in an annotation (a trace
    of 6,000 points is 211 KiB) beside kubectl's own copy passed the 256 KiB limit on annotations, and every
    patch of the job failed. No handler here diffs the spec (a change is refused by generation), so kopf needs
    only to see that it changed."""

    def build(self, *, body: kopf.Body, extra_fields=None):
        essence = dict(super().build(body=body, extra_fields=extra_fields))
        if "spec" in essence:
            text = json.dumps(essence["spec"], sort_keys=True, separators=(",", ":"))
            essence["spec"] = {"sha256": hashlib.sha256(text.encode()).hexdigest()}
        return essence


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    load_kube_config()
    settings.peering.standalone = True  # one replica (Deployment strategy Recreate)
    settings.scanning.disabled = True  # no cluster-wide CRD watching: fewer permissions
    settings.execution.max_workers = 32
    settings.persistence.diffbase_storage = DigestDiffBase()
    settings.posting.level = logging.WARNING  # kopf's own log lines as events; ours go through kopf.event
    # The timer deletes a job once its TTL passes, so the deletion arrives while that
    # timer still runs; kopf re-checks a running timer before dropping its finalizer
    # only every cancellation_polling seconds (default 60).
    settings.background.cancellation_polling = 1
    settings.watching.server_timeout = int(os.environ.get("NETSENSE_WATCH_TIMEOUT", "120"))
    # Only the jobs' pods reach the operator (filtered by the API server, not after the fact): on a busy
    # cluster the watch carries a few pods per job instead of every pod there is.
    settings.watching.label_selectors["v1", "pods"] = res.LABEL_JOB_UID
    addr = metrics.parse_addr(os.environ.get("NETSENSE_METRICS_ADDR") or metrics.DEFAULT_ADDR)
    if addr:
        metrics.serve(addr)


class AdmissionWait(Exception):
    """The API server cannot admit the object yet, for a reason that passes on its own: the job waits, it does
    not fail. QuotaExceeded: a ResourceQuota has no room now (a restart's predecessors may still hold it, or
    other jobs), or the quota controller has not counted a new quota yet. ServiceAccountMissing: the namespace
    is new and its controller has not made the `default` ServiceAccount yet (a namespace and a job applied from
    one file)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class GangRolledBack(AdmissionWait):
    """A create refused for a reason that passes (a quota) after part of the gang was made: what was made is
    deleted again, so that no rank holds a share of the quota while it waits for ranks that cannot come, and
    the next gang is a new attempt (not a restart: nothing ran)."""


class Refused(Exception):
    """The job's objects cannot be made, and retrying will not change that: a name taken by something that is
    not a NetSenseJob's (NameTaken), or the API server's admission refusing the pod (AdmissionRefused: Pod
    Security, quota, an unknown priority class, an invalid field of spec.podTemplate)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(e.reason)


def _calls(kind: str) -> tuple:
    """(create, read, delete) of the core API for the kinds a job owns."""
    c = core()
    return {"Service": (c.create_namespaced_service, c.read_namespaced_service, c.delete_namespaced_service),
            "ConfigMap": (c.create_namespaced_config_map, c.read_namespaced_config_map,
                          c.delete_namespaced_config_map),
            "Pod": (c.create_namespaced_pod, c.read_namespaced_pod, c.delete_namespaced_pod)}[kind]


def _read_node(name: str) -> dict | None:
    try:
        return core().api_client.sanitize_for_serialization(core().read_node(name))
    except ApiException as e:
        if e.status == 404:
            return None
        if e.status == 403:
            logging.getLogger(__name__).warning(
                "cannot read nodes (RBAC: get on nodes): a lost node's pods are noticed only once the taint manager "
                "evicts them")
            raise PermissionError(name) from e
        raise kopf.TemporaryError(f"reading node {name}: {_api_message(e)}", delay=5) from e


NODES = nodes.NodeWatch(_read_node)


def _delete(kind: str, name: str, namespace: str, force: bool = False) -> None:
    """``force``: grace 0, for a pod on a lost node (no kubelet is left to end it gracefully)."""
    try:
        _calls(kind)[2](name, namespace, **({"grace_period_seconds": 0 if force else 5} if kind == "Pod" else {}))
    except ApiException as e:
        if e.status != 404:
            raise


def _create(kind: str, body: dict, namespace: str, uid: str) -> None:
    """Create, idempotently: an object of this job already there is fine. One left by an earlier job of the
    same name (deleted, its objects not yet collected) is deleted and created again on a later pass; one that
    is not a NetSenseJob's at all, or a refusal by admission, is Refused."""
    name = body["metadata"]["name"]
    create, read, _ = _calls(kind)
    try:
        # The answer is not read into the client's models: nothing here uses it, and at 10,000 pods parsing each
        # one costs more CPU than the request.
        answer = create(namespace, body, _preload_content=False)
        answer.drain_conn()  # read to its end, so that the connection goes back to the pool
        answer.release_conn()
        return
    except ValueError as e:  # the client's own type checks, before anything is sent
        raise Refused("InvalidPod", f"{kind} {name} cannot be built: {' '.join(str(e).split())}") from e
    except ApiException as e:
        message = _api_message(e)
        # A full quota, or one the quota controller has not counted yet (just created): wait, not fail.
        if e.status == 403 and ("exceeded quota" in message or "status unknown for quota" in message):
            raise AdmissionWait("QuotaExceeded", f"{kind} {name}: {message}") from e
        # A namespace made a moment ago: its `default` ServiceAccount comes from a controller, soon.
        if e.status == 403 and "error looking up service account" in message:
            raise AdmissionWait("ServiceAccountMissing", f"{kind} {name}: {message}") from e
        if e.status in (400, 422) or (e.status == 403 and "cannot create resource" not in message):
            raise Refused("AdmissionRefused", f"the API server refused {kind} {name}: {message}") from e
        if e.status != 409:  # our own permissions (403), a server in trouble: try again
            raise kopf.TemporaryError(f"creating {kind} {name}: {message}", delay=5) from e
    try:
        owner = res.controller_uid(core().api_client.sanitize_for_serialization(read(name, namespace)))
    except ApiException as e:
        if e.status == 404:  # gone meanwhile: create it on the next pass
            raise kopf.TemporaryError(f"{kind} {name} vanished while checking it", delay=1) from e
        raise
    if owner == uid:
        return
    if owner is None:
        raise Refused("NameTaken", f"{kind} {name} exists and does not belong to a NetSenseJob")
    _delete(kind, name, namespace)
    raise kopf.TemporaryError(f"{kind} {name} was left by an earlier job of the same name; replacing it", delay=2)


def _delete_pods(namespace: str, pods: list[dict], lost_after_s: float | None = None) -> None:
    """Each pod, at once (grace 0) where its node is lost (``lost_after_s``: the job's lostNodeSeconds), else
    gracefully; a pod already terminating is deleted again only to force it."""
    for pod in pods:
        force = lost_after_s is not None and NODES.lost(pod, lost_after_s) is not None
        if force or not pod["metadata"].get("deletionTimestamp"):
            _delete("Pod", pod["metadata"]["name"], namespace, force=force)


def _delete_gang(job: Job, namespace: str, attempt: int, uid: str) -> int:
    """Every pod of one attempt that this job owns, by name: right even before the watch has seen them. A pod
    under such a name that another owns (the reason for a NameTaken) is not the job's to delete. Returns how
    many of the job's pods of that attempt still exist (deleted now, or terminating)."""
    found = 0
    for rank in range(job.workers):
        name = res.pod_name(job.name, attempt, rank)
        try:
            pod = core().read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                continue
            raise
        pod = core().api_client.sanitize_for_serialization(pod)
        if res.controller_uid(pod) == uid:
            found += 1
            _delete_pods(namespace, [pod], job.run_policy["lostNodeSeconds"])
    return found


@kopf.index("v1", "pods", labels={res.LABEL_JOB_UID: kopf.PRESENT})
async def pods_by_job(body: kopf.Body, labels: kopf.Labels, **_) -> dict:
    """Every pod of every job (all attempts) by the job's UID, as the watch last saw it: what a pass reconciles
    from, instead of listing each job's pods. Async (pure, no I/O): indexing runs on kopf's event loop and
    never waits for one of the threads the passes hold."""
    meta = body["metadata"]
    return {labels[res.LABEL_JOB_UID]: {
        "metadata": {"name": meta["name"], "uid": meta.get("uid"), "labels": dict(labels),
                     "creationTimestamp": meta.get("creationTimestamp"),
                     "deletionTimestamp": meta.get("deletionTimestamp")},
        # Whether its node is lost (nodes.py), and whether it still waits behind the gang's gate (gate.py).
        "spec": {"nodeName": (body.get("spec") or {}).get("nodeName"),
                 "schedulingGates": copy.deepcopy(list((body.get("spec") or {}).get("schedulingGates") or []))},
        "status": copy.deepcopy(dict(body.get("status") or {}))}}


def _pods(index: kopf.Index, uid: str) -> list[dict]:
    """The job's pods as the watch last saw them, less those a resync found gone (_resync)."""
    pods = list(index.get(uid, ()))  # a copy first: the event loop may change the index meanwhile
    return [p for p in pods if p["metadata"].get("uid") not in _vanished]


# A watch that expires (410 Gone) is listed again by kopf without a DELETED for the pods that vanished
# meanwhile: they would stay in the index, their rank never re-created. Once a RESYNC_S, one LIST of every job's
# pods (cluster-wide, or per watched namespace: one request, however many jobs) names what the index still holds
# and the API server no longer has.
RESYNC_S = float(os.environ.get("NETSENSE_RESYNC_INTERVAL", "60"))
RESYNC_MARGIN_S = 60.0  # a pod created this close to the LIST may be missing from it without being gone
_vanished: set[str] = set()
_resync_lock = threading.Lock()
_last_resync = [0.0]


# The resync needs only UIDs: metadata alone (about a tenth of a pod's JSON), 500 pods a page. Measured
# (testbed/operator_cost.py, 10,400 pods): whole pods parsed into the client's models took the operator to 2 GiB.
METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}
RESYNC_PAGE = 500


def _listed_pod_uids() -> set[str]:
    namespaces = [n for n in os.environ.get("NETSENSE_NAMESPACES", "").split(",") if n]
    calls = [functools.partial(core().list_namespaced_pod, n) for n in namespaces] or \
        [core().list_pod_for_all_namespaces]
    uids: set[str] = set()
    for call in calls:
        token = None
        while True:
            raw = call(label_selector=res.LABEL_JOB_UID, limit=RESYNC_PAGE, _continue=token, _headers=METADATA_ONLY,
                       _preload_content=False)
            page = json.loads(raw.data)
            uids.update(item["metadata"]["uid"] for item in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
    return uids


def _resync(index: kopf.Index) -> None:
    with _resync_lock:
        if time.monotonic() - _last_resync[0] < RESYNC_S:
            return
        _last_resync[0] = time.monotonic()
    listed_at = time.time()
    try:
        present = _listed_pod_uids()
    except ApiException:
        return  # the next resync tries again
    for pods in list(index.values()):
        for pod in list(pods):
            meta = pod["metadata"]
            created = meta.get("creationTimestamp")
            if meta.get("uid") and meta["uid"] not in present and created and \
                    st.parse_iso(created) < listed_at - RESYNC_MARGIN_S:
                _vanished.add(meta["uid"])


def _create_shared(job: Job, namespace: str, uid: str) -> None:
    """What every pod of the job uses: the job's ConfigMap and the rendezvous Service."""
    _create("ConfigMap", res.config_map(job, namespace, uid), namespace, uid)
    _create("Service", res.service(job, namespace, uid), namespace, uid)


# Waiting for a quota's room: the next look at the namespace's quotas after QUOTA_BACKOFF_S, doubling up to
# QUOTA_BACKOFF_MAX_S while the gang still does not fit (a pass in between says the last answer, at no request).
QUOTA_BACKOFF_S, QUOTA_BACKOFF_MAX_S = 2.0, 30.0
_quota_waits: dict[str, tuple[float, float, str]] = {}  # job uid -> (next look, delay, the last shortfall)


def _check_quota(namespace: str, uid: str, pods: list[dict]) -> None:
    """AdmissionWait("QuotaExceeded") unless every pod of ``pods`` fits the namespace's quotas now (quota.py)."""
    now = time.monotonic()
    waiting = _quota_waits.get(uid)
    if waiting and now < waiting[0]:
        raise AdmissionWait("QuotaExceeded", waiting[2])
    try:
        quotas = core().api_client.sanitize_for_serialization(core().list_namespaced_resource_quota(namespace).items)
    except ApiException as e:
        if e.status == 403:  # an install from before this check: the create's own refusal is the net
            return
        raise kopf.TemporaryError(f"listing the ResourceQuotas of {namespace}: {_api_message(e)}", delay=5) from e
    short = quota.shortfall(quotas, quota.demand(pods))
    if short is None:
        _quota_waits.pop(uid, None)
        return
    delay = min(QUOTA_BACKOFF_MAX_S, 2 * waiting[1]) if waiting else QUOTA_BACKOFF_S
    _quota_waits[uid] = (now + delay, delay, short)
    raise AdmissionWait("QuotaExceeded", short)


# Gang admission (gate.py): one gang at a time, against the cluster's free room (cached ROOM_CACHE_S) less the
# gangs admitted whose pods are not bound yet.
ROOM_CACHE_S = 5.0
_admission = threading.Lock()
_room: list = []  # [(when, nodes, room by node)] while cached
_reserved: dict[str, list[dict]] = {}  # job uid -> its admitted gang's pods, until they are bound
_room_unknown_said = [False]


def _cluster_room() -> tuple[list[dict], dict] | None:
    """(Ready nodes, free room by node), or None where nodes cannot be listed (RBAC)."""
    if _room and time.monotonic() - _room[0][0] < ROOM_CACHE_S:
        return _room[0][1], {k: dict(v) for k, v in _room[0][2].items()}
    serialize = core().api_client.sanitize_for_serialization
    try:
        nodes = serialize(core().list_node().items)
    except ApiException as e:
        if e.status != 403:
            raise kopf.TemporaryError(f"listing nodes: {_api_message(e)}", delay=5) from e
        if not _room_unknown_said[0]:
            _room_unknown_said[0] = True
            logging.getLogger(__name__).warning("cannot list nodes (RBAC: list on nodes): gangs are started without "
                                                "checking that they fit")
        return None
    running = "status.phase!=Succeeded,status.phase!=Failed"
    try:
        pods = serialize(core().list_pod_for_all_namespaces(field_selector=running).items)
    except ApiException as e:  # a namespaced install: the pods it may see (other namespaces' are not counted)
        if e.status != 403:
            raise kopf.TemporaryError(f"listing pods: {_api_message(e)}", delay=5) from e
        pods = [p for n in os.environ.get("NETSENSE_NAMESPACES", "").split(",") if n
                for p in serialize(core().list_namespaced_pod(n, field_selector=running).items)]
    room = gate.node_room(nodes, pods)
    _room[:] = [(time.monotonic(), nodes, room)]
    return nodes, {k: dict(v) for k, v in room.items()}


def _admit(job: Job, namespace: str, uid: str, attempt: int, pods: list[dict]) -> tuple[str, str] | None:
    """Lift the gang's gates together if the whole gang fits now (None), else why it waits."""
    gang = [res.worker_pod(job, namespace, uid, rank, attempt, SHAPER_IMAGE, WORKER_IMAGE)
            for rank in range(job.workers)]
    with _admission:
        view = _cluster_room()
        if view is not None:
            nodes, room = view
            for other, admitted in _reserved.items():
                if other != uid:
                    gate.reserve(nodes, room, admitted)
            why = gate.shortfall(nodes, room, gang)
            if why:
                return "WaitingForRoom", why
        for pod in pods:
            if gate.gated(pod):
                _lift(pod["metadata"]["name"], namespace)
        _reserved[uid] = gang
    return None


def _lift(name: str, namespace: str) -> None:
    try:
        core().patch_namespaced_pod(name, namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
    except ApiException as e:
        if e.status not in (404, 422):  # gone, or lifted already
            raise kopf.TemporaryError(f"lifting the gate of {name}: {_api_message(e)}", delay=2) from e


def _release(uid: str) -> None:
    with _admission:
        if _reserved.pop(uid, None) is not None:
            _room.clear()  # the next admission lists again: what was reserved counts where it is bound


def _create_gang(job: Job, namespace: str, uid: str, attempt: int, ranks: list[int] | None = None) -> None:
    """The gang whole or not at all. Every pod is built and checked against the fence's rules
    (netsense.spec.fence) before the first is created: a pod no job may have is a defect of ours, said plainly,
    never half a gang or a 403 from the fence. Then the quotas (quota.py): a gang that does not fit waits with
    no pod made. A refusal that passes (a quota the check does not model) after part of the gang exists deletes
    that part again (GangRolledBack)."""
    pods = [res.worker_pod(job, namespace, uid, rank, attempt, SHAPER_IMAGE, WORKER_IMAGE)
            for rank in (range(job.workers) if ranks is None else ranks)]
    for pod in pods:
        if broken := fence.violations(pod):
            raise Refused("InvalidPod", f"Pod {pod['metadata']['name']} breaks the fence: {'; '.join(broken)}")
    _check_quota(namespace, uid, pods)
    made = 0
    try:
        for pod in pods:
            _create("Pod", pod, namespace, uid)
            made += 1
    except AdmissionWait as e:
        if not made and len(pods) == job.workers:
            raise
        _delete_gang(job, namespace, attempt, uid)
        raise GangRolledBack(e.reason, f"{e}; the part of the gang already made was deleted, to wait whole") from e


def _fail_early(patch: kopf.Patch, body: kopf.Body, reason: str, message: str) -> None:
    patch.status.update(phase=st.FAILED, reason=reason, message=message, completionTime=st.now_iso(),
                        conditions=st.set_condition(None, "Failed", "True", reason, message))
    kopf.event(body, type="Warning", reason=reason, message=message)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
def start(uid: str, status: dict, patch: kopf.Patch, **kwargs) -> None:
    if not leader.acting():
        raise kopf.TemporaryError("not leading (the Lease may be another's): leaving the job to the leader", delay=5)
    if status.get("phase"):
        METRICS.job_phase(uid, status["phase"])
        return  # already started: the timer carries on (operator restart)
    _start(uid=uid, status=status, patch=patch, **kwargs)
    phase = (patch.get("status") or {}).get("phase")
    METRICS.job_phase(uid, phase)
    if phase == st.FAILED:
        METRICS.ended(phase, patch["status"]["reason"])


def _start(name: str, namespace: str, uid: str, spec: dict, patch: kopf.Patch, body: kopf.Body,
           logger: logging.Logger, **_) -> None:
    try:
        with warnings.catch_warnings(record=True) as deprecated:
            warnings.simplefilter("always", FutureWarning)
            job = parse_spec(copy.deepcopy(dict(spec)), name)
        check_cluster(job)
    except SpecError as e:
        _fail_early(patch, body, "InvalidSpec", str(e))
        logger.warning(f"invalid spec: {e}")
        return
    for w in deprecated:  # on the job, where its owner looks, not only in the operator's log
        if issubclass(w.category, FutureWarning):
            kopf.event(body, type="Warning", reason="DeprecatedSpec", message=str(w.message))
    if job.spec["suspend"]:
        kopf.event(body, type="Normal", reason="Suspended", message="created suspended: no pods until resumed")
        patch.status.update(
            phase=st.SUSPENDED, attempt=0, restarts=0, disruptions=0, appliedSpec=job.spec,
            observedGeneration=body["metadata"].get("generation"),
            workers={"total": job.workers, "pending": 0, "running": 0, "succeeded": 0, "failed": 0},
            conditions=st.set_condition(None, "Suspended", "True", "Suspended", "spec.suspend is true"))
        return
    conditions = st.set_condition(None, "Created", "True", "PodsCreated",
                                  f"{job.workers} worker pod(s) and the rendezvous service created")
    try:
        _create_shared(job, namespace, uid)
        _shared_made[uid] = (0, time.monotonic())
        _create_gang(job, namespace, uid, 0)
        kopf.event(body, type="Normal", reason="GangCreated",
                   message=f"{job.workers} worker pod(s) and the rendezvous service")
    except Refused as e:
        _fail_early(patch, body, e.reason, str(e))
        _delete_gang(job, namespace, 0, uid)  # a partial gang holds resources for nothing
        return
    except AdmissionWait as e:  # the reconcile passes create the gang once it can be admitted
        conditions = st.set_condition(None, "PodsReady", "False", e.reason, str(e))
        attempt = 1 if isinstance(e, GangRolledBack) else 0
    else:
        attempt = 0
    patch.status.update(
        gangCreatedAt=st.now_iso(), pendingSince=st.now_iso(),
        phase=st.PENDING, attempt=attempt, restarts=0, disruptions=0, startTime=st.now_iso(),
        appliedSpec=job.spec, observedGeneration=body["metadata"].get("generation"),
        workers={"total": job.workers, "pending": job.workers, "running": 0, "succeeded": 0, "failed": 0},
        conditions=conditions)


def _update(patch: kopf.Patch, status: dict, **fields) -> None:
    """Patch only the status fields that changed: a quiet job causes no writes (and no
    watch events), which is what keeps 50 concurrent jobs cheap."""
    for key, value in fields.items():
        if status.get(key) != value:
            patch.status[key] = value


_parsed: dict[tuple[str, object, str], tuple[Job, Profile | None]] = {}  # (uid, generation, digest) -> both


def _applied(uid: str, name: str, status: dict) -> tuple[Job, Profile | None]:
    """The job as recorded (status.appliedSpec), parsed, and its profile built: once per job and recorded
    generation, not every pass (a 6,000-point trace took 79 ms of CPU a pass)."""
    # Keyed by the recorded spec's digest too: appliedSpec can change without a new generation (written by an
    # earlier operator, or by hand), and must never be read from a stale parse. A digest costs ~ms for a
    # 6,000-point trace; the parse and profile it saves took 79 ms.
    digest = hashlib.sha1(json.dumps(status["appliedSpec"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    key = (uid, status.get("observedGeneration"), digest)
    if key not in _parsed:
        for stale in [k for k in _parsed if k[0] == uid]:
            del _parsed[stale]
        job = parse_spec(copy.deepcopy(dict(status["appliedSpec"])), name)
        profile = job.network.get("profile")
        _parsed[key] = (job, build_profile(profile) if profile else None)
    return _parsed[key]


def _network_status(job: Job, profile: Profile | None, epoch: float | None) -> dict | None:
    """The profile step in force: the first until training starts (the shapers hold it),
    then by the clock the trainers started (known from rank 0's progress lines)."""
    if profile is None:
        return None
    t = 0.0 if epoch is None else max(0.0, time.time() - epoch)
    return {"rate": units.format_rate(profile.rate_at(t)), "step": profile.index_at(t), "profile": job.network["profile"]["type"]}


def _progress(namespace: str, pod: dict) -> dict | None:
    try:
        text = core().read_namespaced_pod_log(pod["metadata"]["name"], namespace, container=TRAINER, tail_lines=50)
    except (ApiException, ValueError):
        return None  # logs need a kubelet; progress is best effort
    return st.last_progress(text or "")


_shared_made: dict[str, tuple[int, float]] = {}  # job uid -> (attempt, when) its ConfigMap and Service were made
SHARED_RECHECK_S = 3 * RECONCILE_INTERVAL  # 30 s as installed
_progress_read: dict[str, float] = {}  # job uid -> when rank 0's log was last read (monotonic)
_swept: dict[str, int] = {}  # job uid -> the attempt whose predecessor's pods were looked up by name


def _shared_needed(uid: str, attempt: int, pods: list[dict]) -> bool:
    """Whether a pass should (re)make the job's ConfigMap and Service: once an attempt, and again every
    SHARED_RECHECK_S while a pod is on a node and not running yet (one deleted by someone leaves it waiting for
    its volume). Pods that wait for a node, the bulk of a queue, cost nothing."""
    made = _shared_made.get(uid)
    if made is None or made[0] != attempt:
        return True
    waiting = any((p.get("status") or {}).get("phase", "Pending") == "Pending" and any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])
        for p in pods)
    return waiting and time.monotonic() - made[1] > SHARED_RECHECK_S


def _ttl(status: dict) -> int | None:
    return (status.get("appliedSpec") or {}).get("runPolicy", {}).get("ttlSecondsAfterFinished")


def _needs_reconcile(status: dict, **_) -> bool:
    """Finished jobs need the timer only to expire after ttlSecondsAfterFinished."""
    return status.get("phase") not in st.FINISHED or _ttl(status) is not None


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


_again: set[str] = set()  # jobs a pass was asked for while one of theirs ran: that one goes again


def _pass(uid: str, name: str, namespace: str, status: dict, patch: kopf.Patch, **kwargs) -> None:
    """One reconcile of one job, whoever started it (its timer, its own event, a pod's event): one at a time a
    job, and its status written before the next pass starts (by this pass, not by kopf after the handler
    returns), never over a newer phase or attempt (_patch_status: a resourceVersion precondition, and on a
    conflict a look at what changed): an older view writes nothing, and the next pass decides again.

    No thread waits for a job's lock: a pass asked for while one runs is folded into it (the running one goes
    again, from the freshest view the watch has), so a 64-rank gang's burst of pod events holds one of kopf's
    threads, not 32 of them while other jobs wait. The cluster-wide resync LIST runs outside any job's lock."""
    if not leader.acting():
        return  # the Lease may be another's by now: this process is on its way out (leader.py)
    _resync(kwargs["pods_by_job"])
    lock = _lock(uid)
    while True:
        if not lock.acquire(blocking=False):
            _again.add(uid)
            if not lock.acquire(blocking=False):  # still held: its holder sees _again once it is done
                return
        try:
            _again.discard(uid)
            _one_pass(uid, name, namespace, status, patch, **kwargs)
        finally:
            lock.release()
        if uid not in _again:
            return
        job = next(iter((kwargs.get("jobs_by_uid") or {}).get(uid, [])), None)  # the freshest view
        if job is None or job["metadata"].get("deletionTimestamp") or not _needs_reconcile(job["status"]):
            return
        status, patch = job["status"], kopf.Patch()
        kwargs.update(spec=job["spec"], body=kopf.Body(job))


def _one_pass(uid: str, name: str, namespace: str, status: dict, patch: kopf.Patch, **kwargs) -> None:
    start = time.perf_counter()
    written = None
    try:
        _reconcile(uid=uid, name=name, namespace=namespace, status=status, patch=patch, **kwargs)
        written = patch.pop("status", None)
        if written:
            version = (kwargs["body"].get("metadata") or {}).get("resourceVersion")
            if _patch_status(name, namespace, {"status": dict(written)}, version, status) and \
                    ("phase" in written or "attempt" in written):
                _written[uid] = _phase_and_attempt({**status, **written})
    finally:
        METRICS.reconciled(time.perf_counter() - start)
        METRICS.job_phase(uid, (written or {}).get("phase") or status.get("phase"))


@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_INTERVAL, sharp=False, backoff=5, when=_needs_reconcile)
def reconcile(**kwargs) -> None:
    _pass(**kwargs)


@kopf.on.event(GROUP, VERSION, PLURAL)
def job_changed(type: str | None, status: dict, meta: kopf.Meta, uid: str, **kwargs) -> None:
    """The job changed (its spec: suspend; or a status this operator wrote, a restart's new attempt among them):
    the next step now, not at the timer. Nothing for a job being deleted (its objects go with it)."""
    if type == "DELETED":
        with _lock(uid):  # no pass of it is left running: its lock goes too
            _locks.pop(uid, None)
        return
    if not meta.get("deletionTimestamp") and _needs_reconcile(status):
        _pass(uid=uid, status=status, meta=meta, **kwargs)


@kopf.index(GROUP, VERSION, PLURAL)
async def jobs_by_uid(body: kopf.Body, uid: str, **_) -> dict:
    """Each job as its watch last showed it, for the pass a pod's event starts (kopf hands a pod's handler the
    pod, not its job). Without annotations or managedFields: kubectl's copy of a large trace stays out."""
    meta = body["metadata"]  # kopf replaces a body's dicts on each event, never mutates them: no deep copy
    return {uid: {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                  "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "generation", "deletionTimestamp",
                                                        "resourceVersion")},
                  "spec": dict(body.get("spec") or {}), "status": dict(body.get("status") or {})}}


@kopf.on.event("v1", "pods", labels={res.LABEL_JOB_UID: kopf.PRESENT})
def pod_changed(labels: kopf.Labels, jobs_by_uid: kopf.Index, pods_by_job: kopf.Index, logger: logging.Logger,
                **_) -> None:
    """A pod of a job changed (scheduled, started, failed, evicted, gone): reconcile its job now. kopf applies a
    handler's patch to the object the handler is for, here the pod, so this pass writes the job's status itself."""
    for job in list(jobs_by_uid.get(labels.get(res.LABEL_JOB_UID), [])):
        meta = job["metadata"]
        if meta.get("deletionTimestamp") or not _needs_reconcile(job["status"]):
            continue
        try:
            _pass(uid=meta["uid"], name=meta["name"], namespace=meta["namespace"], spec=job["spec"],
                  status=job["status"], patch=kopf.Patch(), body=kopf.Body(job), logger=logger,
                  pods_by_job=pods_by_job, jobs_by_uid=jobs_by_uid)
        except kopf.TemporaryError as e:  # the job's own passes (its timer, its next event) try again
            logger.info(f"job {meta['name']}: {e}")


def _phase_and_attempt(status: dict) -> tuple[str | None, int]:
    return status.get("phase"), int(status.get("attempt", 0))


def _patch_status(name: str, namespace: str, body: dict, resource_version: str | None = None,
                  seen: dict | None = None) -> bool:
    """The status as kopf would write it (a merge patch of the status subresource: a null deletes a key, a list is
    replaced). With ``resource_version`` (the version the pass decided on) and ``seen`` (the status it read), a
    write that cannot regress a newer phase or attempt: while the job is at that version it is written; when it
    changed meanwhile but is at the same phase and attempt (kopf's annotations, a user's spec change, another
    field of ours) it is written over the new version; when its phase or attempt moved on, nothing is written
    (False), and the next pass decides again from what it is now."""
    for _ in range(3):
        sent = {**body, "metadata": {"resourceVersion": resource_version}} if resource_version else body
        try:
            custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, sent,
                                                           _content_type="application/merge-patch+json")
            return True
        except ApiException as e:
            if e.status == 404:  # gone meanwhile: nothing to write to
                return False
            if e.status != 409 or seen is None:
                raise kopf.TemporaryError(f"writing the status of {name}: {_api_message(e)}", delay=2) from e
        except urllib3.exceptions.HTTPError as e:  # the API server unreachable
            raise kopf.TemporaryError(f"writing the status of {name}: {e}", delay=2) from e
        fresh = _read_job(name, namespace)
        if fresh is None or _phase_and_attempt(fresh.get("status") or {}) != _phase_and_attempt(seen):
            logging.getLogger(__name__).info(f"job {name}: its phase or attempt moved on since this pass read it; "
                                             "nothing written")
            return False
        resource_version = fresh["metadata"]["resourceVersion"]
    return False


def _read_job(name: str, namespace: str) -> dict | None:
    try:
        return custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise kopf.TemporaryError(f"reading {name}: {_api_message(e)}", delay=2) from e


_written: dict[str, tuple[str | None, int]] = {}  # job uid -> the (phase, attempt) this operator last wrote


def _behind(uid: str, name: str, namespace: str, status: dict) -> bool:
    """Whether a pass's view of the job is older than this operator's last write of its phase or attempt (the
    watch lags the write): deciding on it would repeat what was just done (an event, a deletion). Only the
    operator writes phase and attempt, and a write is remembered only once the API server took it, so the watch
    shows it soon; until then a view that differs from it is asked of the API server (one GET), which also lets
    go of the memory should anyone else have written since."""
    mine = _written.get(uid)
    if mine is None:
        return False
    if _phase_and_attempt(status) == mine:
        del _written[uid]  # caught up
        return False
    if _current(name, namespace, status):
        _written.pop(uid, None)  # the view is what the API server has: another writer came after ours
        return False
    return True


def _current(name: str, namespace: str, status: dict) -> bool:
    """Whether the job's status is still at the phase and attempt this pass read: asked of the API server (one
    GET) before a pass makes a gang, since the watch can lag the operator's own last write, and a gang made
    from an older view (say, one that was just finished) would run for nothing."""
    fresh = _read_job(name, namespace)
    return fresh is not None and _phase_and_attempt(fresh.get("status") or {}) == _phase_and_attempt(status)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(uid: str, **_) -> None:
    METRICS.job_phase(uid, None)
    for memo in (_written, _shared_made, _progress_read, _swept, _quota_waits):
        memo.pop(uid, None)
    _release(uid)
    for key in [k for k in _parsed if k[0] == uid]:
        _parsed.pop(key, None)


def _reconcile(name: str, namespace: str, uid: str, spec: dict, status: dict, patch: kopf.Patch, body: kopf.Body,
               logger: logging.Logger, pods_by_job: kopf.Index, **_) -> None:
    phase = status.get("phase")
    if phase in st.FINISHED:
        _expire(name, namespace, status)
        return
    if phase is None or "appliedSpec" not in status:
        return  # the create handler has not finished yet
    if _behind(uid, name, namespace, status):
        return  # the watch has not shown this operator's last write yet: decide nothing on an older view
    try:
        job, profile = _applied(uid, name, status)
    except SpecError as e:  # recorded by an operator whose spec this one no longer reads: end, never loop
        _delete_pods(namespace, _pods(pods_by_job, uid))
        _fail_early(patch, body, "InvalidSpec", f"the spec recorded at creation no longer validates: {e}")
        METRICS.ended(st.FAILED, "InvalidSpec")
        return
    conditions = list(status.get("conditions") or [])
    conditions = _spec_change(name, body, spec, status, job, patch, conditions)
    attempt = int(status.get("attempt", 0))
    known = _pods(pods_by_job, uid)
    if _suspension(job, namespace, uid, known, spec, status, patch, body, conditions, attempt):
        return
    pods, predecessors = [], []
    for pod in known:
        # A pod of another attempt is a leftover of a restart (or of one cut short by an operator crash).
        if pod["metadata"]["labels"].get(res.LABEL_ATTEMPT) == str(attempt):
            pods.append(pod)
        else:
            predecessors.append(pod)
    _delete_pods(namespace, predecessors, job.run_policy["lostNodeSeconds"])
    by_rank = {int(p["metadata"]["labels"][res.LABEL_RANK]): p for p in pods}
    phases = {r: (p.get("status") or {}).get("phase", "Pending") for r, p in by_rank.items()}
    counts = {k.lower(): sum(1 for v in phases.values() if v == k) for k in ("Pending", "Running", "Succeeded", "Failed")}
    _update(patch, status, workers={"total": job.workers, **counts})
    started = status.get("trainingStartTime")
    net = _network_status(job, profile, None if started is None else st.parse_iso(started))
    if net:
        _update(patch, status, network=net)

    def finish(final_phase: str, reason: str, message: str, leftover: list[dict]) -> None:
        if final_phase == st.SUCCEEDED or not job.run_policy["keepFailedPods"]:
            _delete_pods(namespace, leftover)
        patch.status.update(phase=final_phase, reason=reason, message=message, completionTime=st.now_iso(),
                            conditions=st.set_condition(
                                st.set_condition(conditions, "Running", "False", reason, message),
                                final_phase, "True", reason, message))
        kopf.event(body, type="Normal" if final_phase == st.SUCCEEDED else "Warning", reason=reason, message=message)
        METRICS.ended(final_phase, reason)

    missing = [r for r in range(job.workers) if r not in by_rank]
    # A rank evicted, preempted, drained or deleted is a disruption, not its failure: the gang restarts at once
    # (its collectives would wait for the lost rank until their timeout), and backoffLimit does not count it.
    disrupted = {r: why for r, p in by_rank.items()
                 if (why := st.disruption(p) or NODES.lost(p, job.run_policy["lostNodeSeconds"]))}
    if missing and phase == st.RUNNING:
        disrupted.update({r: "its pod disappeared" for r in missing})
    failed = [r for r, p in phases.items() if p == "Failed" and r not in disrupted]
    failure = rank_failure({r: st.failure_reason(by_rank[r]) for r in failed},
                           {r: t for r in failed if (t := st.finished_at(by_rank[r])) is not None})
    restarts = int(status.get("restarts", 0))
    verdict = judge(failure, restarts, job.run_policy, time.time() - st.parse_iso(status["startTime"]))
    if verdict is None and disrupted and phase in (st.PENDING, st.RUNNING):
        rank = min(disrupted)
        disruptions, most = int(status.get("disruptions", 0)), job.run_policy["maxDisruptions"]
        if disruptions >= most:
            finish(st.FAILED, "DisruptionLimitExceeded", f"rank {rank} was disrupted: {disrupted[rank]} "
                   f"(maxDisruptions {most} reached)", pods)
            return
        msg = (f"rank {rank} was disrupted: {disrupted[rank]}; restarting the gang (not counted against "
               f"backoffLimit; disruption {disruptions + 1}/{most})")
        logger.warning(msg)
        kopf.event(body, type="Warning", reason="Disrupted", message=msg)
        METRICS.restarted()
        patch.status.update(attempt=attempt + 1, disruptions=disruptions + 1, phase=st.PENDING,
                            trainingStartTime=None, gangCreatedAt=None, pendingSince=st.now_iso(),
                            conditions=st.set_condition(st.set_condition(conditions, "Running", "False", "Disrupted",
                                                                         msg), "Restarting", "True", "Disrupted", msg))
        return
    if verdict:
        if verdict.restart:
            # Only the next attempt goes to status now; the next pass deletes this attempt's pods (they are
            # no longer current) and creates the new gang. An operator that dies in between finds the same
            # state again: no gang is ever created that status does not name.
            msg, why = verdict.message, verdict.reason
            logger.warning(msg)
            kopf.event(body, type="Warning", reason="Restarting", message=msg)
            METRICS.restarted()
            patch.status.update(attempt=attempt + 1, restarts=restarts + 1, phase=st.PENDING, trainingStartTime=None,
                                gangCreatedAt=None, pendingSince=st.now_iso(),
                                conditions=st.set_condition(st.set_condition(conditions, "Running", "False", why, msg),
                                                            "Restarting", "True", why, msg))
        else:
            finish(st.FAILED, verdict.reason, verdict.message, pods)
        return
    blocked = None  # why the gang's missing pods are not created this pass
    left = len(predecessors) if missing else 0  # earlier attempts' pods still there
    if missing and not left and attempt > 0 and _swept.get(uid) != attempt:
        # The previous attempt's pods by name, once: some may be too new for the watch to have shown them.
        left = _delete_gang(job, namespace, attempt - 1, uid)
        if not left:
            _swept[uid] = attempt
    if left:
        # The earlier attempt's pods must be gone first: its rank 0 would still answer the rendezvous Service
        # (published before it is ready), and a quota sized for one gang has no room for two.
        blocked = ("Predecessors", f"waiting for {left} pod(s) of an earlier attempt to terminate")
    else:
        try:
            if (missing or (phase == st.PENDING and _shared_needed(uid, attempt, pods))) and \
                    not _current(name, namespace, status):
                return  # the watch has not shown this operator's last write yet: make nothing from an older view
            # What the gang needs to start, made once an attempt (a pass costs no request once it is there).
            if phase == st.PENDING and _shared_needed(uid, attempt, pods):
                _create_shared(job, namespace, uid)
                _shared_made[uid] = (attempt, time.monotonic())
            if missing:
                _create_gang(job, namespace, uid, attempt, missing)
                if len(missing) == job.workers and not status.get("gangCreatedAt"):  # a new gang (restart, resume)
                    _update(patch, status, gangCreatedAt=st.now_iso())
        except Refused as e:
            _delete_gang(job, namespace, attempt, uid)  # partial: nothing ran, so nothing to keep for inspection
            finish(st.FAILED, e.reason, str(e), [])
            return
        except AdmissionWait as e:
            blocked = (e.reason, str(e))
            if isinstance(e, GangRolledBack):  # the next gang is a new attempt: not a restart, nothing ran
                _update(patch, status, attempt=attempt + 1, gangCreatedAt=None)
    if phase == st.PENDING and not blocked and not missing and any(gate.gated(p) for p in pods):
        blocked = _admit(job, namespace, uid, attempt, pods)
    if uid in _reserved and (phase != st.PENDING or all((p.get("spec") or {}).get("nodeName") for p in pods)):
        _release(uid)  # bound: the pods count on their nodes now
    waiting = ""
    if blocked:
        waiting = blocked[1]
        conditions = st.set_condition(conditions, "PodsReady", "False", *blocked)
    elif phase == st.PENDING:
        waiting = "; ".join(f"rank {r}: {w}" for r, p in sorted(by_rank.items())
                            if phases[r] == "Pending" and (w := st.waiting_reason(p)))
        if waiting:
            conditions = st.set_condition(conditions, "PodsReady", "False", "Waiting", waiting)
    if phase == st.PENDING:
        limit = job.run_policy.get("pendingTimeoutSeconds")
        # Since the job last became Pending (created, restarted, resumed): a wait for quota or room counts too.
        since = status.get("pendingSince") or status.get("gangCreatedAt")
        if limit and since and time.time() - st.parse_iso(since) > limit:
            finish(st.FAILED, "PendingTimeout", f"the gang was not all running {limit}s after the job became "
                   "Pending" + (f": {waiting}" if waiting else ""), pods)
            return
    if phases.get(0) == "Succeeded" and counts["succeeded"] == job.workers:
        result = st.result_of(by_rank[0])
        message = "training finished"
        if result:
            _write_result(name, namespace, result)
            reached, why, said = st.target_condition(result)
            conditions = st.set_condition(conditions, "TargetReached", reached, why, said)
            best = result.get("best_accuracy")
            _update(patch, status, bestAccuracy=None if best is None else round(best, 3))
            message += f": {said}" if reached != "Unknown" else (
                f": best accuracy {best:.3f}" if best is not None else "")
        finish(st.SUCCEEDED, "Completed", message, [])
        return
    if counts["running"] + counts["succeeded"] == job.workers and counts["running"] > 0:
        if phase != st.RUNNING:
            conditions = st.set_condition(conditions, "Running", "True", "AllWorkersRunning",
                                          f"{job.workers} worker(s) running")
            conditions = st.set_condition(conditions, "PodsReady", "True", "AllRunning",
                                          f"{job.workers} worker(s) running")
            if int(status.get("restarts", 0)):
                conditions = st.set_condition(conditions, "Restarting", "False", "GangRunning",
                                              f"attempt {attempt} running")
        _update(patch, status, phase=st.RUNNING)
        progress = None
        if phases.get(0) == "Running" and time.monotonic() - _progress_read.get(uid, -PROGRESS_INTERVAL) >= PROGRESS_INTERVAL:
            _progress_read[uid] = time.monotonic()
            progress = _progress(namespace, by_rank[0])
        if progress:
            epoch = progress.pop("profileEpoch", None)
            if epoch is not None:  # when the trainers' (and the profile's) clock started, for people too
                _update(patch, status, trainingStartTime=st.iso(float(epoch)))
            _update(patch, status, progress=progress)
    _update(patch, status, conditions=conditions)


def _write_result(name: str, namespace: str, result: dict) -> None:
    """status.result: every key of rank 0's result.json, in camelCase as the rest of the status, nulls kept (a
    missed target is ``timeToAccuracyS: null``). A JSON patch, since the merge patch kopf writes status with
    deletes a key set to null."""
    body = [{"op": "add", "path": "/status/result", "value": camel_keys(result)}]
    try:
        custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body,
                                                       _content_type="application/json-patch+json")
    except ApiException as e:
        raise kopf.TemporaryError(f"writing the result: {_api_message(e)}", delay=2) from e


def _spec_change(name: str, body: kopf.Body, spec: dict, status: dict, job: Job, patch: kopf.Patch,
                 conditions: list[dict]) -> list[dict]:
    """A started job keeps running as created (status.appliedSpec). metadata.generation says whether its spec
    was written since (the API server's own defaults, a new CRD's included, do not count); a new generation that
    changes only spec.suspend, or, while suspended, only spec.podTemplate (a queue such as Kueue setting the
    nodeSelector and tolerations of the nodes it admits the job to), is taken; anything else is refused with a
    condition."""
    generation = body["metadata"].get("generation")
    if generation is None or generation == status.get("observedGeneration"):
        return conditions
    try:
        now = parse_spec(copy.deepcopy(dict(spec)), name).spec
    except SpecError:
        now = None
    changed = {k for k in set(job.spec) | set(now or {}) if k not in st.MUTABLE and job.spec.get(k) != (now or {}).get(k)}
    suspended = status.get("phase") == st.SUSPENDED
    if now is not None and (not changed or (suspended and changed == {"podTemplate"})):
        if changed:
            patch.status["appliedSpec"] = now
            kopf.event(body, type="Normal", reason="PodTemplateUpdated",
                       message="spec.podTemplate changed while suspended: the next gang uses it")
        patch.status["observedGeneration"] = generation
        return st.set_condition(conditions, "SpecChangeRefused", "False", "Unchanged", "the spec runs as written") \
            if any(c["type"] == "SpecChangeRefused" for c in conditions) else conditions
    return st.set_condition(conditions, "SpecChangeRefused", "True", "Immutable",
                            "the spec of a started job cannot change (but spec.suspend, and spec.podTemplate while "
                            "suspended); it keeps running as created (delete and re-create the job to apply the "
                            f"change; changed: {', '.join(sorted(changed)) or 'an invalid spec'})")


def _suspension(job: Job, namespace: str, uid: str, pods: list[dict], spec: dict, status: dict,
                patch: kopf.Patch, body: kopf.Body, conditions: list[dict], attempt: int) -> bool:
    """spec.suspend, the one field a started job may change: true deletes the gang (phase Suspended); false
    again resumes with a new attempt (not a restart) and a fresh activeDeadlineSeconds. True when this pass is
    done (the job is, or just became, suspended or resumed)."""
    suspend = bool(spec.get("suspend"))
    if status.get("phase") == st.SUSPENDED:
        if suspend:
            _delete_pods(namespace, [p for p in pods if not p["metadata"].get("deletionTimestamp")])
            return True
        fresh = status.get("gangCreatedAt") is not None or bool(pods)
        kopf.event(body, type="Normal", reason="Resumed", message="spec.suspend is false: starting a gang")
        patch.status.update(phase=st.PENDING, attempt=attempt + 1 if fresh else attempt, startTime=st.now_iso(),
                            trainingStartTime=None, gangCreatedAt=None, pendingSince=st.now_iso(),
                            conditions=st.set_condition(conditions, "Suspended", "False", "Resumed",
                                                        "spec.suspend is false"))
        return True
    if not suspend:
        return False
    # Earlier attempts' leftovers as the watch shows them; the current gang by name, even pods created a moment
    # ago that the watch has not shown yet (each pod deleted once).
    _delete_pods(namespace, [p for p in pods if p["metadata"]["labels"].get(res.LABEL_ATTEMPT) != str(attempt)])
    _delete_gang(job, namespace, attempt, uid)
    kopf.event(body, type="Normal", reason="Suspended", message="spec.suspend is true: the gang is deleted")
    patch.status.update(phase=st.SUSPENDED, trainingStartTime=None,
                        workers={"total": job.workers, "pending": 0, "running": 0, "succeeded": 0, "failed": 0},
                        conditions=st.set_condition(
                            st.set_condition(conditions, "Running", "False", "Suspended", "spec.suspend is true"),
                            "Suspended", "True", "Suspended", "spec.suspend is true"))
    return True


def _expire(name: str, namespace: str, status: dict) -> None:
    """ttlSecondsAfterFinished: delete the finished job (its pods go with it)."""
    ttl = _ttl(status)
    done = status.get("completionTime")
    if ttl is None or not done or time.time() - st.parse_iso(done) < ttl:
        return
    try:
        custom().delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status != 404:
            raise
