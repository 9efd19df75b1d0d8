"""The operator's failure paths against a real kube-apiserver + etcd (the session's operator, with exactly the RBAC
of manifests/base/rbac.yaml), and the hand-over of the leader's Lease to a second operator.

What each test guards, in the words of a user:
- a name already taken by something that is not a NetSenseJob's fails the job (NameTaken), never takes the object
  over and never deletes it;
- a pod the Kubernetes client refuses to build fails the job (InvalidPod) instead of retrying for ever;
- a job whose spec, recorded by an earlier operator, this one no longer accepts is ended (InvalidSpec), its pods
  deleted, once;
- a second operator waits while the first leads, and when the first stops it leads and reconciles;
- a pass that read an older version of a job neither writes its status over a newer one nor makes a gang from it.
"""

from __future__ import annotations

import json
import logging
import os
import time

import pytest
from kubernetes import client
from support.kube import OperatorProcess, quick_spec, wait_for

from netsense.spec import GROUP, PLURAL, VERSION

LEASE = ("netsense-operator", "netsense-system")  # name, namespace: what the operator's elector takes






def failed(kube, ns: str, name: str, timeout: float = 30) -> dict:
    return wait_for(lambda: (s := kube.status(ns, name)).get("phase") == "Failed" and s, timeout=timeout,
                    what=f"{name} Failed")


def events(kube, ns: str, name: str, reason: str) -> list:
    return [e for e in kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
            if e.reason == reason]


def exists(read, name: str, ns: str) -> bool:
    try:
        read(name, ns)
        return True
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise


# ---- NameTaken: a name the job needs belongs to something else ---------------------------------------------------

def _theirs(kind: str, name: str) -> dict:
    """An object nobody's NetSenseJob owns (no ownerReferences), as a user or another tool would make it."""
    meta = {"name": name, "labels": {"owner": "someone-else"}}
    if kind == "ConfigMap":
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"keep": "me"}}
    if kind == "Service":
        return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
                "spec": {"clusterIP": "None", "selector": {"app": "theirs"}, "ports": [{"port": 80}]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


@pytest.mark.parametrize("kind, object_name", [
    ("ConfigMap", "taken-job"),  # resources.config_name("taken"): created first, so nothing else is
    ("Service", "taken-rdzv"),  # resources.service_name("taken"): the job's ConfigMap exists by then
])
def test_a_name_taken_by_an_object_no_job_owns_fails_the_job_and_leaves_the_object_alone(
        kube, ns, operator, kind, object_name):
    from netsense_operator import resources as res

    assert object_name in (res.config_name("taken"), res.service_name("taken"))
    create = {"ConfigMap": kube.core.create_namespaced_config_map, "Service": kube.core.create_namespaced_service}
    read = {"ConfigMap": kube.core.read_namespaced_config_map, "Service": kube.core.read_namespaced_service}
    create[kind](ns, _theirs(kind, object_name))
    kube.create_job(ns, "taken", quick_spec())
    st = failed(kube, ns, "taken")
    assert st["reason"] == "NameTaken"
    assert f"{kind} {object_name} exists and does not belong to a NetSenseJob" in st["message"]
    assert any(c["type"] == "Failed" and c["status"] == "True" and c["reason"] == "NameTaken"
               for c in st["conditions"])
    warned = wait_for(lambda: events(kube, ns, "taken", "NameTaken"), what="a NameTaken event")
    assert warned[0].type == "Warning" and object_name in warned[0].message
    time.sleep(1)  # two reconcile intervals: a Failed job makes nothing later either
    assert not kube.pods(ns, "taken")
    theirs = read[kind](object_name, ns)
    assert not theirs.metadata.owner_references and theirs.metadata.labels == {"owner": "someone-else"}, \
        "the operator took over an object that is not its own"


def test_a_pod_name_taken_by_a_pod_no_job_owns_fails_the_job_and_that_pod_survives(kube, ns, operator):
    from netsense_operator import resources as res

    theirs = res.pod_name("podtaken", 0, 0)
    kube.core.create_namespaced_pod(ns, _theirs("Pod", theirs))
    kube.create_job(ns, "podtaken", quick_spec())
    st = failed(kube, ns, "podtaken")
    assert st["reason"] == "NameTaken" and f"Pod {theirs} exists and does not belong" in st["message"]
    time.sleep(1)
    assert not kube.pods(ns, "podtaken")  # the job's own (labelled) pods: none
    pod = kube.core.read_namespaced_pod(theirs, ns)  # 404 here: the operator deleted a pod it does not own
    assert pod.metadata.deletion_timestamp is None, "the operator deleted a pod it said was not its own"


# ---- InvalidPod: the Kubernetes client refuses to build the pod -----------------------------------------------

def test_a_pod_the_client_cannot_build_fails_the_job_as_invalid_pod_with_no_pods(kube, ns, operator):
    """spec.podTemplate's volume sources are passed through as the Kubernetes API has them (the CRD keeps them
    as opaque objects), so a wrongly typed field inside one reaches the client, whose pydantic models refuse
    it before anything is sent: a quoted octal mode is the usual way to get there."""
    template = {"spec": {"volumes": [{"name": "settings", "configMap": {"name": "settings", "defaultMode": "0644"}}]}}
    kube.create_job(ns, "unbuildable", quick_spec(podTemplate=template))
    st = failed(kube, ns, "unbuildable")
    assert st["reason"] == "InvalidPod", st
    assert st["message"].startswith("Pod unbuildable-a0-w0 cannot be built:")
    assert "configMap.defaultMode" in st["message"] and "\n" not in st["message"]
    time.sleep(1)
    assert not kube.pods(ns, "unbuildable")


def test_create_turns_the_clients_value_error_into_invalid_pod(monkeypatch):
    """api.create's ValueError branch on its own: whatever the client refuses to build (pydantic's
    ValidationError is a ValueError) is Refused as InvalidPod, with the message on one line, and never sent."""
    import kopf
    from netsense_operator import api

    def refuse(namespace, body, **_):
        raise ValueError("1 validation error for V1Pod\n  spec.volumes.0.configMap.defaultMode\n"
                         "    Input should be a valid integer")

    def unreachable(*a, **k):
        raise AssertionError("read after the client refused to build: nothing was sent, nothing can be there")

    monkeypatch.setattr(api, "_calls", lambda kind: (refuse, unreachable, unreachable))
    with pytest.raises(api.Refused) as e:
        api.create("Pod", {"metadata": {"name": "j-a0-w0"}}, "ns", "uid")
    assert not isinstance(e.value, kopf.TemporaryError)
    assert e.value.reason == "InvalidPod"
    assert str(e.value) == ("Pod j-a0-w0 cannot be built: 1 validation error for V1Pod "
                            "spec.volumes.0.configMap.defaultMode Input should be a valid integer")


# ---- a recorded spec this operator no longer accepts -------------------------------------------------------------

def test_a_recorded_spec_that_no_longer_validates_ends_the_job_deletes_its_pods_once(kube, ns, operator):
    """What an earlier operator recorded in status.appliedSpec (which the pods are built from) and this one refuses:
    here a hostNetwork pod template, which the allow-list refuses today."""
    kube.create_job(ns, "legacy", quick_spec())
    wait_for(lambda: len(kube.pods(ns, "legacy")) == 2, what="pods")
    wait_for(lambda: kube.status(ns, "legacy").get("phase") == "Pending", what="Pending, appliedSpec recorded")
    # Planted once kopf has closed its create handler (its annotation written, no progress of its own in status).
    wait_for(lambda: "kopf.zalando.org/last-handled-configuration"
             in (kube.job(ns, "legacy")["metadata"].get("annotations") or {})
             and not kube.status(ns, "legacy").get("kopf"), what="kopf's create handler closed")
    planted = {"status": {"appliedSpec": {"podTemplate": {"spec": {"hostNetwork": True}}}}}
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "legacy", planted)
    assert kube.status(ns, "legacy")["appliedSpec"]["podTemplate"] == {"spec": {"hostNetwork": True}}
    st = failed(kube, ns, "legacy")
    assert st["reason"] == "InvalidSpec"
    assert st["message"].startswith("the spec recorded at creation no longer validates:")
    assert "hostNetwork" in st["message"]
    wait_for(lambda: not kube.pods(ns, "legacy"), what="its pods deleted")
    # Ended once: the operator writes nothing more (kopf's own bookkeeping, status.kopf, is kopf's: it may touch
    # the job to wake a handler of its own) and announces it once.
    def ours(job: dict) -> dict:
        return {k: v for k, v in job["status"].items() if k != "kopf"}
    before = ours(kube.job(ns, "legacy"))
    time.sleep(2)  # four reconcile intervals
    job = kube.job(ns, "legacy")
    assert ours(job) == before, "the job's status is still being written"
    assert job["status"]["phase"] == "Failed"
    assert len(events(kube, ns, "legacy", "InvalidSpec")) == 1


# ---- leader election: a real hand-over -------------------------------------------------------------------------

class LogSince:
    """What a log file gained after this was made: OperatorProcess appends, so whatever an earlier process
    wrote to the same file is never read as this one's."""

    def __init__(self, path: str):
        self.path = path
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0

    def text(self) -> str:
        if not os.path.exists(self.path):
            return ""
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode(errors="replace")


def test_a_second_operator_waits_while_the_first_leads_then_leads_and_reconciles_once_it_stops(
        kube, ns, operator, operator_kubeconfig, tmp_path):
    leases = client.CoordinationV1Api(kube.api)

    def holder() -> str:
        try:
            return leases.read_namespaced_lease(*LEASE).spec.holder_identity or ""
        except client.ApiException as e:
            if e.status == 404:  # an operator that has only just started has not made it yet
                return ""
            raise

    # The session's operator leads now: this process holds the Lease (its log may hold "leading as" from an
    # earlier start of another process).
    operator.wait_leading(kube, timeout=20)
    path = str(tmp_path / "second.log")
    with open(path, "w") as fh:  # as a reused log would: a line from another process that the test must not read
        fh.write("netsense.leader leading as someone-earlier (lease netsense-system/netsense-operator)\n")
    log = LogSince(path)
    second = OperatorProcess(operator_kubeconfig, path).start()
    try:
        wait_for(lambda: "holds the lease" in log.text(), what="the second operator waiting for the Lease")
        assert "leading as" not in log.text(), "the second operator said it leads while the first held the Lease"
        assert holder() == operator.identity()
        operator.stop()
        assert operator.proc.poll() is not None
        # A clean stop hands the Lease back, so the second leads at its next try (every 2.5 s), well before a
        # Lease that is not handed back would lapse: 15 s after its last renewal, at most 5 s before the stop.
        wait_for(lambda: f"leading as {second.identity()}" in log.text(), timeout=8,
                 what="the second operator leading")
        assert holder() == second.identity()
        # Created after the hand-over, with no other operator running: the second builds and reconciles it.
        kube.create_job(ns, "successor", quick_spec())
        pods = wait_for(lambda: len(kube.pods(ns, "successor")) == 2 and kube.pods(ns, "successor"),
                        what="pods from the second operator")
        for pod in pods:
            kube.set_pod_phase(ns, pod.metadata.name, "Running")
        wait_for(lambda: kube.status(ns, "successor").get("phase") == "Running",
                 what="Running, reconciled by the second operator")
    finally:
        second.stop()
        operator.start()
    assert second.proc.returncode == 0
    operator.wait_leading(kube, timeout=20)  # the session's operator leading again


@pytest.mark.parametrize("message, reason", [
    # What kube-apiserver's ServiceAccount admission says in a namespace made a moment ago (a namespace and a job
    # applied from one file): the controller-manager makes `default` within seconds.
    ('pods "j-a0-w0" is forbidden: error looking up service account fresh/default: serviceaccount "default" not '
     'found', "ServiceAccountMissing"),
    ('pods "j-a0-w0" is forbidden: exceeded quota: one-gang, requested: pods=1, used: pods=2, limited: pods=2',
     "QuotaExceeded"),
    ('pods "j-a0-w0" is forbidden: status unknown for quota: one-gang, resource: pods', "QuotaExceeded"),
])
def test_create_waits_on_refusals_that_pass_on_their_own(monkeypatch, message, reason):
    """A 403 that time resolves is a wait with the reason (the job stays Pending, PodsReady says why), never the
    AdmissionRefused failure a Pod Security refusal is."""
    from kubernetes.client import ApiException
    from netsense_operator import api

    def forbidden(namespace, body, **_):
        e = ApiException(status=403, reason="Forbidden")
        e.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": message})
        raise e

    def unreachable(*a, **k):
        raise AssertionError("nothing was created, so there is nothing to read or delete")

    monkeypatch.setattr(api, "_calls", lambda kind: (forbidden, unreachable, unreachable))
    with pytest.raises(api.AdmissionWait) as e:
        api.create("Pod", {"metadata": {"name": "j-a0-w0"}}, "fresh", "uid")
    assert e.value.reason == reason and message in str(e.value)


def _log_time(line: str) -> float:
    """The time a log line was written (logging's "[YYYY-MM-DD HH:MM:SS,mmm]" prefix), as unix time."""
    stamp = line[1:line.index("]")]
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:23]) / 1000


def _first_line(text: str, words: str) -> str:
    return next(line for line in text.splitlines() if words in line)


@pytest.mark.timeout(180)
def test_a_leader_whose_api_calls_stall_stops_before_a_second_operator_leads(kube, ns, operator, operator_kubeconfig,
                                                                            control_plane, tmp_path):
    """Two replicas; the leader's link to the API server stalls (its calls hang, the server never hears it): it
    stops acting at its renew deadline, counted from the last renewal it sent, before the other, which counts the
    Lease's duration from the last change it saw, takes over. Never both."""
    import yaml
    from support.proxy import StallingProxy

    with open(operator_kubeconfig) as fh:
        config = yaml.safe_load(fh)
    server = config["clusters"][0]["cluster"]["server"]
    host, port = server.split("//")[1].rsplit(":", 1)
    proxy = StallingProxy((host, int(port)))
    config["clusters"][0]["cluster"]["server"] = f"https://{host}:{proxy.port}"
    stalled_config = tmp_path / "through-proxy.kubeconfig"
    stalled_config.write_text(yaml.safe_dump(config))
    operator.stop()  # hands the Lease back
    first = OperatorProcess(str(stalled_config), str(tmp_path / "first.log")).start()
    second = None
    try:
        wait_for(lambda: "leading as" in open(first.log_path).read(), timeout=20, what="the first leading")
        second = OperatorProcess(operator_kubeconfig, str(tmp_path / "second.log")).start()
        wait_for(lambda: "holds the lease" in open(second.log_path).read(), timeout=20, what="the second waiting")
        kube.create_job(ns, "led", quick_spec())
        wait_for(lambda: len(kube.pods(ns, "led")) == 2, what="the first operator's gang")
        proxy.stalled.set()
        wait_for(lambda: "leading as" in open(second.log_path).read(), timeout=60, what="the second leading")
        first_said, second_said = open(first.log_path).read(), open(second.log_path).read()
        stopped = _log_time(_first_line(first_said, "stopping"))
        took_over = _log_time(_first_line(second_said, "leading as"))
        assert stopped < took_over, f"the first stopped at {stopped}, the second led at {took_over}"
        assert first.proc.wait(timeout=30) is not None, "the first operator did not exit"
        # The second runs the job on.
        for pod in kube.pods(ns, "led"):
            kube.set_pod_phase(ns, pod.metadata.name, "Running")
        wait_for(lambda: kube.status(ns, "led").get("phase") == "Running", what="Running, by the second")
    finally:
        proxy.close()
        first.stop()
        if second is not None:
            second.stop()
        operator.start()


# ---- a pass on an older view of the job ------------------------------------------------------------------------

@pytest.fixture
def as_operator(kube, monkeypatch):
    """The operator's modules (api, reconciler), talking to this API server as the test's admin."""
    from types import SimpleNamespace

    from netsense_operator import api, reconciler

    monkeypatch.setattr(api, "_core", kube.core)
    monkeypatch.setattr(api, "_custom", kube.custom)
    return SimpleNamespace(api=api, reconciler=reconciler)


def _finished_behind_the_watch(kube, ns: str, name: str) -> tuple[dict, dict]:
    """A job the operator suspended, then a newer write (Failed) that a lagging watch has not shown: (the job as
    the pass read it, its status then)."""
    kube.create_job(ns, name, quick_spec(suspend=True))
    wait_for(lambda: kube.status(ns, name).get("phase") == "Suspended", what="Suspended")
    seen = kube.job(ns, name)
    # What a pass saw a moment before the newer write: the job resumed, Pending, its gang not made yet.
    status = dict(seen["status"], phase="Pending", startTime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, {"status": {
        "phase": "Failed", "reason": "Test", "completionTime": "2026-01-01T00:00:00Z"}})
    return seen, status


def test_a_status_write_never_regresses_a_newer_phase_but_survives_other_changes(kube, ns, operator, as_operator):
    """The write carries the version the pass read: when the job's phase moved on since, nothing is written; when
    only something else changed (kopf's annotations, a user's spec, another field), it is written over it."""
    seen, status = _finished_behind_the_watch(kube, ns, "older")
    written = as_operator.api.patch_status("older", ns, {"status": {"phase": "Running"}},
                                        seen["metadata"]["resourceVersion"], status)
    assert written is False and kube.status(ns, "older")["phase"] == "Failed"
    now = kube.job(ns, "older")
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "older",
                                                      {"status": {"message": "someone else's field"}})
    assert as_operator.api.patch_status("older", ns, {"status": {"reason": "Ours"}}, now["metadata"]["resourceVersion"],
                                     now["status"]) is True
    assert kube.status(ns, "older")["reason"] == "Ours"


def test_a_pass_whose_write_does_not_land_announces_nothing(kube, ns, operator, as_operator, monkeypatch):
    """An event says a transition happened: a pass that decided one on an older view (here Resumed, on a job
    finished meanwhile) writes nothing, so it posts nothing; the next pass decides again, from what is."""
    import kopf
    from netsense_operator import handlers

    posted = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: posted.append(event))
    seen, _ = _finished_behind_the_watch(kube, ns, "moved-on")
    meta = seen["metadata"]
    handlers._one_pass(meta["uid"], "moved-on", ns, dict(seen["status"]), kopf.Patch(),
                       spec=dict(seen["spec"], suspend=False), body=kopf.Body(seen), logger=logging.getLogger("t"),
                       pods_by_job={})
    assert kube.status(ns, "moved-on")["phase"] == "Failed"
    assert posted == [], f"announced a transition that was never written: {posted}"


def test_a_pass_on_an_older_view_makes_no_gang(kube, ns, operator, as_operator):
    """The watch can lag the operator's own last write: a pass that still sees the job Pending after it was
    finished must not make its pods (they would run for nothing)."""
    import kopf

    seen, status = _finished_behind_the_watch(kube, ns, "lagging")
    meta = seen["metadata"]
    as_operator.reconciler.reconcile(name="lagging", namespace=ns, uid=meta["uid"], spec=dict(seen["spec"], suspend=False),
                           status=status,
                           patch=kopf.Patch(), body=kopf.Body(seen), logger=logging.getLogger("t"),
                           pods_by_job={})
    assert kube.pods(ns, "lagging") == [], "a gang was made from an older view of a finished job"
