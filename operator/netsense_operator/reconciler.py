"""One pass over one job: from its recorded spec, its status and its pods as the watch shows them to what comes
next (make the gang, restart it, finish the job, suspend or resume it, keep its status), never on a view older
than the operator's own last write."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import kopf
import urllib3
from kubernetes.client.rest import ApiException

from netsense import units
from netsense.gang import TRAINER, judge, rank_failure
from netsense.shaping.profiles import Profile, build_profile
from netsense.spec import GROUP, PLURAL, VERSION, Job, SpecError, parse_spec
from netsense_operator import api, gangs, gate, podindex
from netsense_operator import resources as res
from netsense_operator import status as st
from netsense_operator.metrics import METRICS

# Passes run on every event of a job or of its pods; the timer only keeps time (activeDeadlineSeconds,
# pendingTimeoutSeconds, ttlSecondsAfterFinished, progress, the profile's step), so it can be slow.
RECONCILE_INTERVAL = float(os.environ.get("NETSENSE_RECONCILE_INTERVAL", "10"))
# Rank 0's log is read for status.progress at most this often (a GET a read): a running job's steady cost.
PROGRESS_INTERVAL = float(os.environ.get("NETSENSE_PROGRESS_INTERVAL", "5"))


_held = threading.local()  # the events of the pass this thread runs, until its status write lands


def announce(body: kopf.Body, type: str, reason: str, message: str) -> None:
    """An event on the job. Inside a pass it waits for the pass's status write: a write that does not land
    (refused, or the job's phase moved on meanwhile) is decided again by the next pass, which would announce the
    same transition a second time. Outside one (the create handler) it is posted now."""
    held = getattr(_held, "events", None)
    if held is None:
        kopf.event(body, type=type, reason=reason, message=message)
    else:
        held.append((body, type, reason, message))


@contextmanager
def holding_events() -> Iterator[list[tuple]]:
    """Hold the events announced in this block: the caller posts them once the pass's write has landed."""
    _held.events = []
    try:
        yield _held.events
    finally:
        _held.events = None


def fail_early(patch: kopf.Patch, body: kopf.Body, reason: str, message: str) -> None:
    patch.status.update(phase=st.FAILED, reason=reason, message=message, completionTime=st.now_iso(),
                        conditions=st.set_condition(None, "Failed", "True", reason, message))
    announce(body, type="Warning", reason=reason, message=message)


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
        profile = job.network.get("profile") if job.mode != "calibrate" else None  # a calibration's link is its own
        _parsed[key] = (job, build_profile(profile) if profile else None)
    return _parsed[key]


def _network_status(job: Job, profile: Profile | None, epoch: float | None) -> dict | None:
    """The profile step in force: the first until training starts (the shapers hold it),
    then by the clock the trainers started (known from rank 0's progress lines)."""
    if profile is None:
        return None
    t = 0.0 if epoch is None else max(0.0, time.time() - epoch)
    return {"rate": units.format_rate(profile.rate_at(t)), "step": profile.index_at(t), "profile": job.network["profile"]["type"]}


# Rank 0's log comes through the API server from its node's kubelet. A node that stops answering without closing
# the connection (frozen, or cut off half-open) would hold the read, and with it this reconcile pass and the
# lost-node check behind it, for minutes (seen on kind: a paused node stalled a job ~5 minutes): so a timeout.
PROGRESS_TIMEOUT_S = (3.0, 5.0)  # (connect, read)


def _progress(namespace: str, pod: dict) -> dict | None:
    try:
        text = api.core().read_namespaced_pod_log(pod["metadata"]["name"], namespace, container=TRAINER, tail_lines=50,
                                                  _request_timeout=PROGRESS_TIMEOUT_S)
    except (ApiException, ValueError, urllib3.exceptions.HTTPError):
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


def needs_reconcile(status: dict, **_) -> bool:
    """Finished jobs need the timer only to expire after ttlSecondsAfterFinished."""
    return status.get("phase") not in st.FINISHED or _ttl(status) is not None


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
    if api.phase_and_attempt(status) == mine:
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
    fresh = api.read_job(name, namespace)
    return fresh is not None and api.phase_and_attempt(fresh.get("status") or {}) == api.phase_and_attempt(status)


def reconcile(name: str, namespace: str, uid: str, spec: dict, status: dict, patch: kopf.Patch, body: kopf.Body,
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
        gangs.delete_pods(namespace, podindex.pods(pods_by_job, uid))
        fail_early(patch, body, "InvalidSpec", f"the spec recorded at creation no longer validates: {e}")
        METRICS.ended(st.FAILED, "InvalidSpec")
        return
    conditions = list(status.get("conditions") or [])
    conditions = _spec_change(name, body, spec, status, job, patch, conditions)
    attempt = int(status.get("attempt", 0))
    known = podindex.pods(pods_by_job, uid)
    if _suspension(job, namespace, uid, known, spec, status, patch, body, conditions, attempt):
        return
    pods, predecessors = [], []
    for pod in known:
        # A pod of another attempt is a leftover of a restart (or of one cut short by an operator crash).
        if pod["metadata"]["labels"].get(res.LABEL_ATTEMPT) == str(attempt):
            pods.append(pod)
        else:
            predecessors.append(pod)
    gangs.delete_pods(namespace, predecessors, job.run_policy["lostNodeSeconds"])
    by_rank = {int(p["metadata"]["labels"][res.LABEL_RANK]): p for p in pods}
    phases = {r: (p.get("status") or {}).get("phase", "Pending") for r, p in by_rank.items()}
    counts = {k.lower(): sum(1 for v in phases.values() if v == k) for k in ("Pending", "Running", "Succeeded", "Failed")}
    _update(patch, status, workers={"total": job.pods, **counts})
    started = status.get("trainingStartTime")
    net = _network_status(job, profile, None if started is None else st.parse_iso(started))
    if net:
        _update(patch, status, network=net)

    def finish(final_phase: str, reason: str, message: str, leftover: list[dict]) -> None:
        if final_phase == st.SUCCEEDED or not job.run_policy["keepFailedPods"]:
            gangs.delete_pods(namespace, leftover)
        patch.status.update(phase=final_phase, reason=reason, message=message, completionTime=st.now_iso(),
                            conditions=st.set_condition(
                                st.set_condition(conditions, "Running", "False", reason, message),
                                final_phase, "True", reason, message))
        announce(body, type="Normal" if final_phase == st.SUCCEEDED else "Warning", reason=reason, message=message)
        METRICS.ended(final_phase, reason)

    missing = [r for r in range(job.pods) if r not in by_rank]
    # A rank evicted, preempted, drained or deleted is a disruption, not its failure: the gang restarts at once
    # (its collectives would wait for the lost rank until their timeout), and backoffLimit does not count it.
    disrupted = {r: why for r, p in by_rank.items()
                 if (why := st.disruption(p) or gangs.NODES.lost(p, job.run_policy["lostNodeSeconds"]))}
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
        announce(body, type="Warning", reason="Disrupted", message=msg)
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
            announce(body, type="Warning", reason="Restarting", message=msg)
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
        left = gangs.delete_gang(job, namespace, attempt - 1, uid)
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
                gangs.create_shared(job, namespace, uid)
                _shared_made[uid] = (attempt, time.monotonic())
            if missing:
                gangs.create_gang(job, namespace, uid, attempt, missing)
                if len(missing) == job.pods and not status.get("gangCreatedAt"):  # a new gang (restart, resume)
                    _update(patch, status, gangCreatedAt=st.now_iso())
        except api.Refused as e:
            gangs.delete_gang(job, namespace, attempt, uid)  # partial: nothing ran, so nothing to keep for inspection
            finish(st.FAILED, e.reason, str(e), [])
            return
        except api.AdmissionWait as e:
            blocked = (e.reason, str(e))
            if isinstance(e, api.GangRolledBack):  # the next gang is a new attempt: not a restart, nothing ran
                _update(patch, status, attempt=attempt + 1, gangCreatedAt=None)
    if phase == st.PENDING and not blocked and not missing and any(gate.gated(p) for p in pods):
        blocked = gangs.admit(job, namespace, uid, attempt, pods)
    if uid in gangs.reserved and (phase != st.PENDING or all((p.get("spec") or {}).get("nodeName") for p in pods)):
        gangs.release(uid)  # bound: the pods count on their nodes now
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
    if phases.get(0) == "Succeeded" and counts["succeeded"] == job.pods:
        if job.mode == "calibrate":
            _calibrated(job, name, namespace, uid, by_rank[0], status, patch, finish)
            return
        result = st.result_of(by_rank[0])
        message = "training finished"
        if result:
            api.write_result(name, namespace, result)
            reached, why, said = st.target_condition(result)
            conditions = st.set_condition(conditions, "TargetReached", reached, why, said)
            best = result.get("best_accuracy")
            _update(patch, status, bestAccuracy=None if best is None else round(best, 3),
                    target=st.target_summary(result), progress=st.final_progress(status.get("progress"), result))
            message += f": {said}" if reached != "Unknown" else (
                f": best accuracy {best:.3f}" if best is not None else "")
        finish(st.SUCCEEDED, "Completed", message, [])
        return
    if counts["running"] + counts["succeeded"] == job.pods and counts["running"] > 0:
        if phase != st.RUNNING:
            running = "the calibration pod running" if job.mode == "calibrate" else f"{job.pods} worker(s) running"
            conditions = st.set_condition(conditions, "Running", "True", "AllWorkersRunning", running)
            conditions = st.set_condition(conditions, "PodsReady", "True", "AllRunning", running)
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


def _calibrated(job: Job, name: str, namespace: str, uid: str, pod: dict, status: dict, patch: kopf.Patch,
                finish) -> None:
    """A calibrate job's pod succeeded: its termination message (the profile, one JSON line) into the ConfigMap
    <job>-penalties, owned by the job, and a summary (each option's steps factor, the cost) into status.calibration.
    A message that is not a profile fails the job (it would fail every tta job that used it)."""
    from netsense.control import penalties

    text = (st.trainer_terminated(pod) or {}).get("message") or ""
    try:
        profile = json.loads(text)
        penalties.parse(profile, "the calibration pod's termination message")
    except ValueError as e:  # not JSON, or a PenaltiesError
        finish(st.FAILED, "CalibrationUnreadable", f"the calibration pod's termination message is not a penalties "
               f"profile ({' '.join(str(e).split())[:200]}): {' '.join(text.split())[:200]!r}", [pod])
        return
    try:
        api.create("ConfigMap", res.penalties_config_map(name, namespace, uid, json.dumps(profile, indent=1) + "\n"),
                   namespace, uid)
    except api.Refused as e:
        finish(st.FAILED, e.reason, f"writing the profile: {e}", [pod])
        return
    summary = st.calibration_summary(profile, res.penalties_name(name))
    _update(patch, status, calibration=summary)
    finish(st.SUCCEEDED, "Calibrated", f"profile in ConfigMap {summary['configMap']} (use it: "
           f"spec.compression.penalties: configmap:{summary['configMap']}): {summary['summary']}", [])


def _spec_change(name: str, body: kopf.Body, spec: dict, status: dict, job: Job, patch: kopf.Patch,
                 conditions: list[dict]) -> list[dict]:
    """A started job keeps running as created (status.appliedSpec). metadata.generation says whether its spec
    was _written since (the API server's own defaults, a new CRD's included, do not count); a new generation that
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
            announce(body, type="Normal", reason="PodTemplateUpdated",
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
            gangs.delete_pods(namespace, [p for p in pods if not p["metadata"].get("deletionTimestamp")])
            return True
        fresh = status.get("gangCreatedAt") is not None or bool(pods)
        announce(body, type="Normal", reason="Resumed", message="spec.suspend is false: starting a gang")
        patch.status.update(phase=st.PENDING, attempt=attempt + 1 if fresh else attempt, startTime=st.now_iso(),
                            trainingStartTime=None, gangCreatedAt=None, pendingSince=st.now_iso(),
                            conditions=st.set_condition(conditions, "Suspended", "False", "Resumed",
                                                        "spec.suspend is false"))
        return True
    if not suspend:
        return False
    # Earlier attempts' leftovers as the watch shows them; the current gang by name, even pods created a moment
    # ago that the watch has not shown yet (each pod deleted once).
    gangs.delete_pods(namespace, [p for p in pods if p["metadata"]["labels"].get(res.LABEL_ATTEMPT) != str(attempt)])
    gangs.delete_gang(job, namespace, attempt, uid)
    announce(body, type="Normal", reason="Suspended", message="spec.suspend is true: the gang is deleted")
    patch.status.update(phase=st.SUSPENDED, trainingStartTime=None,
                        workers={"total": job.pods, "pending": 0, "running": 0, "succeeded": 0, "failed": 0},
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
        api.custom().delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status != 404:
            raise


def forget(uid: str) -> None:
    """A deleted job's memories."""
    for memo in (_written, _shared_made, _progress_read, _swept):
        memo.pop(uid, None)
    for key in [k for k in _parsed if k[0] == uid]:
        _parsed.pop(key, None)


def made_shared(uid: str, attempt: int) -> None:
    """The job's ConfigMap and Service were made for ``attempt`` just now (by the create handler)."""
    _shared_made[uid] = (attempt, time.monotonic())


def wrote(uid: str, status: dict) -> None:
    """The API server took this operator's write of the job's phase or attempt (``status``: as written): until
    the watch shows it, no pass decides on an older view (_behind)."""
    _written[uid] = api.phase_and_attempt(status)
