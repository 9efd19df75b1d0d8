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
import hashlib
import json
import logging
import os
import threading
import time
import warnings

import kopf

from netsense.kubeclient import load_kube_config
from netsense.spec import GROUP, PLURAL, VERSION, SpecError, check_cluster, parse_spec
from netsense_operator import api, gangs, leader, metrics, podindex, reconciler
from netsense_operator import resources as res
from netsense_operator import status as st
from netsense_operator.metrics import METRICS


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
        check_cluster(job)  # a penalties ConfigMap is read when the gang is made (gangs.create_gang)
    except SpecError as e:
        reconciler.fail_early(patch, body, "InvalidSpec", str(e))
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
            workers={"total": job.pods, "pending": 0, "running": 0, "succeeded": 0, "failed": 0},
            conditions=st.set_condition(None, "Suspended", "True", "Suspended", "spec.suspend is true"))
        return
    made = "the calibration pod" if job.mode == "calibrate" else f"{job.workers} worker pod(s) and the rendezvous service"
    conditions = st.set_condition(None, "Created", "True", "PodsCreated", f"{made} created")
    try:
        gangs.create_shared(job, namespace, uid)
        reconciler.made_shared(uid, 0)
        gangs.create_gang(job, namespace, uid, 0)
        kopf.event(body, type="Normal", reason="GangCreated",
                   message=made)
    except api.Refused as e:
        reconciler.fail_early(patch, body, e.reason, str(e))
        gangs.delete_gang(job, namespace, 0, uid)  # a partial gang holds resources for nothing
        return
    except api.AdmissionWait as e:  # the reconcile passes create the gang once it can be admitted
        conditions = st.set_condition(None, "PodsReady", "False", e.reason, str(e))
        attempt = 1 if isinstance(e, api.GangRolledBack) else 0
    else:
        attempt = 0
    patch.status.update(
        gangCreatedAt=st.now_iso(), pendingSince=st.now_iso(),
        phase=st.PENDING, attempt=attempt, restarts=0, disruptions=0, startTime=st.now_iso(),
        appliedSpec=job.spec, observedGeneration=body["metadata"].get("generation"),
        workers={"total": job.pods, "pending": job.pods, "running": 0, "succeeded": 0, "failed": 0},
        conditions=conditions)


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


_again: set[str] = set()  # jobs a pass was asked for while one of theirs ran: that one goes again


def _pass(uid: str, name: str, namespace: str, status: dict, patch: kopf.Patch, **kwargs) -> None:
    """One reconcile of one job, whoever started it (its timer, its own event, a pod's event): one at a time a
    job, and its status written before the next pass starts (by this pass, not by kopf after the handler
    returns), never over a newer phase or attempt (api.patch_status: a resourceVersion precondition, and on a
    conflict a look at what changed): an older view writes nothing, and the next pass decides again.

    No thread waits for a job's lock: a pass asked for while one runs is folded into it (the running one goes
    again, from the freshest view the watch has), so a 64-rank gang's burst of pod events holds one of kopf's
    threads, not 32 of them while other jobs wait. The cluster-wide resync LIST runs outside any job's lock."""
    if not leader.acting():
        return  # the Lease may be another's by now: this process is on its way out (leader.py)
    podindex.resync(kwargs["pods_by_job"])
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
        if job is None or job["metadata"].get("deletionTimestamp") or not reconciler.needs_reconcile(job["status"]):
            return
        status, patch = job["status"], kopf.Patch()
        kwargs.update(spec=job["spec"], body=kopf.Body(job))


def _one_pass(uid: str, name: str, namespace: str, status: dict, patch: kopf.Patch, **kwargs) -> None:
    start = time.perf_counter()
    written = None
    try:
        with reconciler.holding_events() as events:
            reconciler.reconcile(uid=uid, name=name, namespace=namespace, status=status, patch=patch, **kwargs)
            written = patch.pop("status", None)
            landed = True
            if written:
                version = (kwargs["body"].get("metadata") or {}).get("resourceVersion")
                landed = api.patch_status(name, namespace, {"status": dict(written)}, version, status)
                if landed and ("phase" in written or "attempt" in written):
                    reconciler.wrote(uid, {**status, **written})
        for body, type_, reason, message in events if landed else ():  # once, for a transition that happened
            kopf.event(body, type=type_, reason=reason, message=message)
    finally:
        METRICS.reconciled(time.perf_counter() - start)
        METRICS.job_phase(uid, (written or {}).get("phase") or status.get("phase"))


@kopf.timer(GROUP, VERSION, PLURAL, interval=reconciler.RECONCILE_INTERVAL, sharp=False, backoff=5,
            when=reconciler.needs_reconcile)
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
    if not meta.get("deletionTimestamp") and reconciler.needs_reconcile(status):
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
        if meta.get("deletionTimestamp") or not reconciler.needs_reconcile(job["status"]):
            continue
        try:
            _pass(uid=meta["uid"], name=meta["name"], namespace=meta["namespace"], spec=job["spec"],
                  status=job["status"], patch=kopf.Patch(), body=kopf.Body(job), logger=logger,
                  pods_by_job=pods_by_job, jobs_by_uid=jobs_by_uid)
        except kopf.TemporaryError as e:  # the job's own passes (its timer, its next event) try again
            logger.info(f"job {meta['name']}: {e}")


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(uid: str, **_) -> None:
    METRICS.job_phase(uid, None)
    reconciler.forget(uid)
    gangs.forget(uid)
