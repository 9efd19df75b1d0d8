"""The API calls of the operator's handlers: the clients, creating and deleting a job's objects (idempotent,
refusals said plainly), reading nodes and jobs, and writing a job's status so that it never regresses a newer
phase or attempt."""

from __future__ import annotations

import json
import logging

import kopf
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from netsense.keys import camel_keys
from netsense.spec import GROUP, PLURAL, VERSION
from netsense_operator import resources as res

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


def api_message(e: ApiException) -> str:
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


def read_node(name: str) -> dict | None:
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
        raise kopf.TemporaryError(f"reading node {name}: {api_message(e)}", delay=5) from e


def delete(kind: str, name: str, namespace: str, force: bool = False) -> None:
    """``force``: grace 0, for a pod on a lost node (no kubelet is left to end it gracefully)."""
    try:
        _calls(kind)[2](name, namespace, **({"grace_period_seconds": 0 if force else 5} if kind == "Pod" else {}))
    except ApiException as e:
        if e.status != 404:
            raise


def create(kind: str, body: dict, namespace: str, uid: str) -> None:
    """Create, idempotently: an object of this job already there is fine. One left by an earlier job of the
    same name (deleted, its objects not yet collected) is deleted and created again on a later pass; one that
    is not a NetSenseJob's at all, or a refusal by admission, is Refused."""
    name = body["metadata"]["name"]
    make, read, _ = _calls(kind)
    try:
        # The answer is not read into the client's models: nothing here uses it, and at 10,000 pods parsing each
        # one costs more CPU than the request.
        answer = make(namespace, body, _preload_content=False)
        answer.drain_conn()  # read to its end, so that the connection goes back to the pool
        answer.release_conn()
        return
    except ValueError as e:  # the client's own type checks, before anything is sent
        raise Refused("InvalidPod", f"{kind} {name} cannot be built: {' '.join(str(e).split())}") from e
    except ApiException as e:
        message = api_message(e)
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
    delete(kind, name, namespace)
    raise kopf.TemporaryError(f"{kind} {name} was left by an earlier job of the same name; replacing it", delay=2)


def phase_and_attempt(status: dict) -> tuple[str | None, int]:
    return status.get("phase"), int(status.get("attempt", 0))


def patch_status(name: str, namespace: str, body: dict, resource_version: str | None = None,
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
                raise kopf.TemporaryError(f"writing the status of {name}: {api_message(e)}", delay=2) from e
        except urllib3.exceptions.HTTPError as e:  # the API server unreachable
            raise kopf.TemporaryError(f"writing the status of {name}: {e}", delay=2) from e
        fresh = read_job(name, namespace)
        if fresh is None or phase_and_attempt(fresh.get("status") or {}) != phase_and_attempt(seen):
            logging.getLogger(__name__).info(f"job {name}: its phase or attempt moved on since this pass read it; "
                                             "nothing written")
            return False
        resource_version = fresh["metadata"]["resourceVersion"]
    return False


def read_job(name: str, namespace: str) -> dict | None:
    try:
        return custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise kopf.TemporaryError(f"reading {name}: {api_message(e)}", delay=2) from e


def write_result(name: str, namespace: str, result: dict) -> None:
    """status.result: every key of rank 0's result.json, in camelCase as the rest of the status, nulls kept (a
    missed target is ``timeToAccuracyS: null``). A JSON patch, since the merge patch kopf writes status with
    deletes a key set to null."""
    body = [{"op": "add", "path": "/status/result", "value": camel_keys(result)}]
    try:
        custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body,
                                                       _content_type="application/json-patch+json")
    except ApiException as e:
        raise kopf.TemporaryError(f"writing the result: {api_message(e)}", delay=2) from e


def calibration_writing(configmap: str, namespace: str) -> str | None:
    """The calibrate job that will write ``configmap`` when it succeeds (a NetSenseJob NAME in ``namespace``
    with spec.mode calibrate, for the ConfigMap NAME-penalties, still running), or None."""
    suffix = "-penalties"
    if not configmap.endswith(suffix):
        return None
    job = read_job(configmap[:-len(suffix)], namespace)
    if job is None or (job.get("spec") or {}).get("mode") != "calibrate":
        return None
    phase = (job.get("status") or {}).get("phase")
    return None if phase in ("Succeeded", "Failed") else job["metadata"]["name"]


def check_penalties(name: str, namespace: str) -> str | None:
    """Why a tta job's penalties ConfigMap (spec.compression.penalties: configmap:NAME) cannot serve it (None: it
    can): missing, without penalties.json, or not a profile. Read once, when the job starts: a pod waiting for a
    ConfigMap that is not there would wait without saying why."""
    from netsense.control import penalties
    from netsense.spec.job import PENALTIES_KEY

    try:
        cm = core().read_namespaced_config_map(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return (f"ConfigMap {name} does not exist in namespace {namespace} (a NetSenseJob with spec.mode: "
                    f"calibrate writes <job>-penalties when it succeeds; or kubectl create configmap {name} "
                    f"--from-file={PENALTIES_KEY})")
        raise kopf.TemporaryError(f"reading ConfigMap {name}: {api_message(e)}", delay=5) from e
    text = (cm.data or {}).get(PENALTIES_KEY)
    if text is None:
        return f"ConfigMap {name} has no key {PENALTIES_KEY} (keys: {', '.join(sorted(cm.data or {})) or 'none'})"
    try:
        penalties.parse(json.loads(text), f"ConfigMap {name}")
    except ValueError as e:  # not JSON, or a PenaltiesError
        return f"ConfigMap {name}: {PENALTIES_KEY} is not a penalties profile: {e}"
    return None
