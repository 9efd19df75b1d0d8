"""The operator under a real cluster's failures, against the real API server (the tests play kubelet): a rank
disrupted (evicted, preempted, deleted) is not a failure; a restarted gang never meets its predecessor; a full
quota is waited for; a spec change is judged by generation (a queue may set a suspended job's scheduling);
a large trace goes through `kubectl apply`; passes follow the pods' events, not the timer, and quiet jobs cost
no request. (The pure units: test_operator_units.py; the cost at scale: testbed/operator_cost.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import time

import yaml
from support.kube import quick_spec, wait_for

GROUP, VERSION, PLURAL = "netsense.dev", "v1alpha1", "netsensejobs"






def running(kube, ns: str, name: str, attempt: int) -> list:
    pods = wait_for(lambda: len(kube.pods(ns, name, attempt)) == 2 and kube.pods(ns, name, attempt),
                    what=f"attempt {attempt}'s pods")
    for p in pods:
        kube.set_pod_phase(ns, p.metadata.name, "Running")
    wait_for(lambda: kube.status(ns, name).get("phase") == "Running", what="Running")
    return pods


def test_an_evicted_rank_restarts_the_gang_without_counting_against_backoff_limit(kube, ns, operator):
    """backoffLimit 0: a failure would end the job; an eviction (the DisruptionTarget condition the Eviction API
    and a drain set) restarts the gang at once instead, and the next gang runs."""
    kube.create_job(ns, "evicted", quick_spec(runPolicy={"backoffLimit": 0}))
    pods = running(kube, ns, "evicted", 0)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.core.patch_namespaced_pod_status(pods[1].metadata.name, ns, {"status": {
        "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting", "lastTransitionTime": now}]}})
    st = wait_for(lambda: (s := kube.status(ns, "evicted")).get("attempt") == 1 and s, what="a new attempt")
    assert st["restarts"] == 0 and st["disruptions"] == 1 and st["phase"] == "Pending"
    restarting = next(c for c in st["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "Disrupted" and "EvictionByEvictionAPI" in restarting["message"]
    running(kube, ns, "evicted", 1)


def _evict(kube, ns: str, pod: str, message: str, condition_reason: str | None = None) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": condition_reason, "message": message,
                   "lastTransitionTime": now}] if condition_reason else []
    kube.core.patch_namespaced_pod_status(pod, ns, {"status": {"phase": "Failed", "reason": "Evicted",
                                                               "message": message, "conditions": conditions}})


def test_an_eviction_for_the_pods_own_storage_use_is_a_failure_counted_against_backoff_limit(kube, ns, operator):
    """Restarted as a disruption it would be evicted again, without end."""
    kube.create_job(ns, "greedy", quick_spec(runPolicy={"backoffLimit": 0}))
    pods = running(kube, ns, "greedy", 0)
    _evict(kube, ns, pods[1].metadata.name,
           "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ")
    st = wait_for(lambda: (s := kube.status(ns, "greedy")).get("phase") == "Failed" and s, what="Failed")
    assert st["reason"] == "BackoffLimitExceeded" and st["disruptions"] == 0
    assert "evicted for its own use" in st["message"] and "ephemeral local storage" in st["message"]


def test_disruptions_are_capped_by_max_disruptions(kube, ns, operator):
    """A job evicted again and again (a drained pool, a preempting tenant) ends, named, instead of restarting
    without end; each disruption before that is an event."""
    kube.create_job(ns, "bounced", quick_spec(runPolicy={"maxDisruptions": 1}))
    _evict(kube, ns, running(kube, ns, "bounced", 0)[0].metadata.name, "drain", "EvictionByEvictionAPI")
    wait_for(lambda: kube.status(ns, "bounced").get("attempt") == 1, what="a restart after the first disruption")
    _evict(kube, ns, running(kube, ns, "bounced", 1)[0].metadata.name, "drain", "EvictionByEvictionAPI")
    st = wait_for(lambda: (s := kube.status(ns, "bounced")).get("phase") == "Failed" and s, what="Failed")
    assert st["reason"] == "DisruptionLimitExceeded" and "maxDisruptions 1" in st["message"]
    assert st["disruptions"] == 1 and st["restarts"] == 0
    said = [e.reason for e in kube.core.list_namespaced_event(
        ns, field_selector="involvedObject.name=bounced").items]
    assert said.count("Disrupted") == 1 and "DisruptionLimitExceeded" in said


def test_a_rank_on_a_lost_node_restarts_the_gang_as_a_disruption_and_its_pods_go_at_once(kube, ns, operator):
    """The node dies: its pods keep phase Running (the node controller only marks them not Ready), and a pod deleted
    there would stay Terminating for good (no kubelet confirms). After lostNodeSeconds the gang restarts as a
    disruption, the old pods are deleted at once (grace 0), and the new gang is made; a node down for less is
    waited for."""
    name = f"lost-{ns}"
    kube.node(name)
    try:
        kube.create_job(ns, "stranded", quick_spec(runPolicy={"backoffLimit": 0, "lostNodeSeconds": 30}))
        pods = wait_for(lambda: len(kube.pods(ns, "stranded")) == 2 and kube.pods(ns, "stranded"), what="pods")
        for pod in pods:
            kube.bind(ns, pod.metadata.name, name)
        running(kube, ns, "stranded", 0)
        unreachable = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                       {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]
        kube.node(name, ready="Unknown", since_s_ago=5, taints=unreachable)  # down, less than lostNodeSeconds
        for pod in pods:
            kube.core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}})
        time.sleep(4)
        assert kube.status(ns, "stranded")["attempt"] == 0, "a node down for 5 s of 30 counted as lost"
        kube.node(name, ready="Unknown", since_s_ago=40, taints=unreachable)  # the same outage, 35 s later
        st = wait_for(lambda: (s := kube.status(ns, "stranded")).get("attempt") == 1 and s, timeout=30,
                      what="the gang restarted")
        assert st["disruptions"] == 1 and st["restarts"] == 0
        restarting = next(c for c in st["conditions"] if c["type"] == "Restarting")
        assert f"its node {name} has not been Ready for" in restarting["message"], restarting
        wait_for(lambda: not kube.pods(ns, "stranded", 0), what="the lost node's pods deleted at once")
        wait_for(lambda: len(kube.pods(ns, "stranded", 1)) == 2, what="the next gang")
    finally:
        kube.core.delete_node(name)


def test_a_running_ranks_pod_being_deleted_restarts_the_gang_at_once(kube, ns, operator):
    """A terminating pod is not alive: the gang restarts now, not after the collectives' 120 s timeout."""
    kube.create_job(ns, "drained", quick_spec(runPolicy={"backoffLimit": 0}))
    pods = running(kube, ns, "drained", 0)
    holder = pods[0].metadata.name  # a finalizer keeps it terminating, as a graceful shutdown would
    kube.core.patch_namespaced_pod(holder, ns, {"metadata": {"finalizers": ["netsense.dev/test-hold"]}})
    kube.core.delete_namespaced_pod(holder, ns)
    try:
        st = wait_for(lambda: (s := kube.status(ns, "drained")).get("attempt") == 1 and s, timeout=10,
                      what="a restart while the pod terminates")
        assert st["restarts"] == 0 and st["disruptions"] == 1
        # ... and the new gang waits for its predecessor to be gone (its rank 0 would answer the rendezvous).
        time.sleep(2)
        assert not kube.pods(ns, "drained", 1), "a new gang beside a pod of the old one"
        ready = next(c for c in kube.status(ns, "drained")["conditions"] if c["type"] == "PodsReady")
        assert ready["reason"] == "Predecessors" and "earlier attempt" in ready["message"]
    finally:
        kube.core.patch_namespaced_pod(holder, ns, {"metadata": {"finalizers": None}})
    wait_for(lambda: len(kube.pods(ns, "drained", 1)) == 2, what="the new gang once the old pod is gone")


def _full_quota(kube, ns: str, pods: int) -> None:
    """A ResourceQuota already full (no controller computes usage here, so its status is set as one would)."""
    kube.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gang"}, "spec": {"hard": {"pods": str(pods)}}})
    kube.core.patch_namespaced_resource_quota_status("gang", ns, {"status": {"hard": {"pods": str(pods)},
                                                                            "used": {"pods": str(pods)}}})


def test_a_full_quota_is_waited_for_not_a_failure(kube, ns, operator):
    _full_quota(kube, ns, 2)
    kube.create_job(ns, "queued", quick_spec())
    st = wait_for(lambda: (s := kube.status(ns, "queued")).get("phase") == "Pending" and any(
        c["type"] == "PodsReady" and c["reason"] == "QuotaExceeded" for c in s.get("conditions", [])) and s,
        what="a PodsReady condition naming the quota")
    assert "ResourceQuota gang: the gang needs 2 pods, 0 of 2 free" in _condition(st, "PodsReady")["message"]
    assert kube.pods(ns, "queued") == []
    time.sleep(2)
    assert kube.status(ns, "queued")["phase"] == "Pending", "a full quota failed the job"
    kube.core.patch_namespaced_resource_quota_status("gang", ns, {"status": {"hard": {"pods": "10"},
                                                                            "used": {"pods": "0"}}})
    kube.core.patch_namespaced_resource_quota("gang", ns, {"spec": {"hard": {"pods": "10"}}})
    wait_for(lambda: len(kube.pods(ns, "queued")) == 2, what="the gang once the quota has room")


def _quota(kube, ns: str, name: str, pods: int, used: int = 0, scopes: list[str] | None = None) -> None:
    """A ResourceQuota of ``pods`` pods, ``used`` of them in use (no quota controller runs here: its status is set
    as the controller would; the API server's admission then counts each pod it admits)."""
    kube.core.create_namespaced_resource_quota(ns, {"metadata": {"name": name}, "spec": {
        "hard": {"pods": str(pods)}, **({"scopes": scopes} if scopes else {})}})
    kube.core.patch_namespaced_resource_quota_status(name, ns, {"status": {"hard": {"pods": str(pods)},
                                                                          "used": {"pods": str(used)}}})


def _condition(status: dict, type_: str) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def _finish(kube, ns: str, name: str) -> None:
    for pod in kube.pods(ns, name):
        kube.set_pod_phase(ns, pod.metadata.name, "Succeeded")
    wait_for(lambda: kube.status(ns, name).get("phase") == "Succeeded", what=f"{name} Succeeded")


def test_two_gangs_that_do_not_both_fit_a_quota_run_one_after_the_other_and_neither_fails(kube, ns, operator):
    """A quota of 6 pods, two 4-worker jobs: the second makes no pod while the first holds the quota (a part of
    it would hold quota, waiting at the rendezvous for ranks that cannot come), then runs; nothing is counted."""
    _quota(kube, ns, "team", 6)
    kube.create_job(ns, "first", quick_spec(workers=4))
    wait_for(lambda: len(kube.pods(ns, "first")) == 4, what="the first gang")
    kube.create_job(ns, "second", quick_spec(workers=4))
    st = wait_for(lambda: (s := kube.status(ns, "second")).get("phase") == "Pending" and
                  (_condition(s, "PodsReady") or {}).get("reason") == "QuotaExceeded" and s,
                  what="the second gang waiting for the quota")
    assert "ResourceQuota team: the gang needs 4 pods" in _condition(st, "PodsReady")["message"]
    time.sleep(3)
    assert kube.pods(ns, "second") == [], "a part of a gang that cannot fit was created"
    _finish(kube, ns, "first")
    # The quota controller's recount, which frees what the first gang used (a Succeeded pod uses no quota).
    kube.core.patch_namespaced_resource_quota_status("team", ns, {"status": {"used": {"pods": "0"}}})
    wait_for(lambda: len(kube.pods(ns, "second")) == 4, timeout=60, what="the second gang once the quota has room")
    for pod in kube.pods(ns, "second"):
        kube.set_pod_phase(ns, pod.metadata.name, "Running")
    st = wait_for(lambda: (s := kube.status(ns, "second")).get("phase") == "Running" and s, what="second Running")
    assert st["restarts"] == st["disruptions"] == st["attempt"] == 0


def test_a_gang_refused_midway_by_a_quota_deletes_what_it_made_and_waits_whole(kube, ns, operator):
    """A scoped quota (not modelled by the check before creating) refuses the fourth pod of four: the three made
    are deleted again, and the gang waits whole as a new attempt, not a restart."""
    _quota(kube, ns, "long-running", 3, scopes=["NotTerminating"])
    kube.create_job(ns, "partial", quick_spec(workers=4))
    st = wait_for(lambda: (s := kube.status(ns, "partial")).get("attempt", 0) >= 1 and s,
                  what="the part of the gang rolled back")
    assert (_condition(st, "PodsReady") or {}).get("reason") in ("QuotaExceeded", "Predecessors")
    assert st["restarts"] == st["disruptions"] == 0 and st["phase"] == "Pending"
    wait_for(lambda: kube.pods(ns, "partial") == [], what="no pod of a partial gang left")
    kube.core.patch_namespaced_resource_quota("long-running", ns, {"spec": {"hard": {"pods": "10"}}})
    kube.core.patch_namespaced_resource_quota_status("long-running", ns, {"status": {"hard": {"pods": "10"},
                                                                                    "used": {"pods": "0"}}})
    wait_for(lambda: len(kube.pods(ns, "partial")) == 4, timeout=60, what="the whole gang once there is room")
    assert kube.status(ns, "partial")["restarts"] == 0


def _gated(kube, ns: str, name: str) -> list[bool]:
    return [bool(p.spec.scheduling_gates) for p in kube.pods(ns, name)]


def test_two_gangs_that_cannot_both_fit_the_nodes_start_one_after_the_other_and_nothing_is_counted(
        kube, ns, operator):
    """One node of 2.5 cpu for the jobs (their nodeSelector), gangs of 2 x 1.01 cpu: the second gang's pods wait
    behind their gate (no rank of it scheduled, none timing out at the rendezvous), then start once the first
    gang has ended."""
    pool = {"pool": f"small-{ns}"}
    node = f"small-{ns}"
    kube.node(node, {"cpu": "2500m", "memory": "16Gi", "pods": "110"}, labels=pool)
    spec = quick_spec(podTemplate={"spec": {"nodeSelector": pool}})
    try:
        kube.create_job(ns, "first", spec)
        wait_for(lambda: _gated(kube, ns, "first") == [False, False], what="the first gang's gates lifted")
        kube.create_job(ns, "second", spec)
        st = wait_for(lambda: (s := kube.status(ns, "second")).get("phase") == "Pending" and
                      (_condition(s, "PodsReady") or {}).get("reason") == "WaitingForRoom" and s,
                      what="the second gang waiting for room")
        assert "does not fit the free room" in _condition(st, "PodsReady")["message"]
        assert _gated(kube, ns, "second") == [True, True]
        for pod in kube.pods(ns, "first"):  # the scheduler places the first gang
            kube.bind(ns, pod.metadata.name, node)
        time.sleep(3)  # bound, counted on the node now: still no room for the second
        assert _gated(kube, ns, "second") == [True, True], "a gang that does not fit was let through"
        _finish(kube, ns, "first")
        wait_for(lambda: _gated(kube, ns, "second") == [False, False], timeout=30,
                 what="the second gang's gates lifted once the first ended")
        for pod in kube.pods(ns, "second"):
            kube.bind(ns, pod.metadata.name, node)
            kube.set_pod_phase(ns, pod.metadata.name, "Running")
        st = wait_for(lambda: (s := kube.status(ns, "second")).get("phase") == "Running" and s, what="second Running")
        assert st["restarts"] == st["disruptions"] == st["attempt"] == 0
        assert kube.status(ns, "first")["restarts"] == 0
    finally:
        kube.core.delete_node(node)


def test_a_spec_change_is_refused_by_generation_but_a_suspended_jobs_pod_template_is_taken(kube, ns, operator):
    patch = kube.custom.patch_namespaced_custom_object
    kube.create_job(ns, "queued", quick_spec(suspend=True))
    wait_for(lambda: kube.status(ns, "queued").get("phase") == "Suspended", what="Suspended")
    # A queue (Kueue) admits the job to some nodes: it sets their selector and tolerations while suspended.
    patch(GROUP, VERSION, ns, PLURAL, "queued", {"spec": {"podTemplate": {"spec": {
        "nodeSelector": {"pool": "gpu-a"}, "tolerations": [{"key": "pool", "operator": "Exists"}]}}}})
    wait_for(lambda: kube.status(ns, "queued").get("observedGeneration") == kube.job(ns, "queued")["metadata"][
        "generation"], what="the new generation observed")
    assert not any(c["type"] == "SpecChangeRefused" and c["status"] == "True"
                   for c in kube.status(ns, "queued").get("conditions", []))
    patch(GROUP, VERSION, ns, PLURAL, "queued", {"spec": {"suspend": False}})
    pods = wait_for(lambda: len(kube.pods(ns, "queued")) == 2 and kube.pods(ns, "queued"), what="the gang")
    assert all(p.spec.node_selector == {"pool": "gpu-a"} for p in pods), "the admitted nodes were not used"
    # Started: a change of anything but suspend is refused, named, and the job keeps running as created.
    patch(GROUP, VERSION, ns, PLURAL, "queued", {"spec": {"training": {"lr": 0.5}}})
    refused = wait_for(lambda: next((c for c in kube.status(ns, "queued").get("conditions", [])
                                     if c["type"] == "SpecChangeRefused" and c["status"] == "True"), None),
                       what="SpecChangeRefused")
    assert "training" in refused["message"]
    assert kube.status(ns, "queued")["appliedSpec"]["training"]["lr"] == 0.05


def test_a_large_trace_goes_through_kubectl_apply_and_kopf_keeps_only_its_digest(kube, ns, operator,
                                                                                  control_plane, tmp_path):
    """kubectl apply keeps the whole object in an annotation; kopf's own copy beside it passed the 256 KiB limit
    on a 6,000-point trace, and every later patch of the job failed."""
    points = [{"at": f"{i}s", "rate": f"{100 + i % 50}Mbit"} for i in range(6000)]
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NetSenseJob", "metadata": {"name": "trace", "namespace": ns},
           "spec": quick_spec(network={"profile": {"type": "trace", "points": points}})}
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert path.stat().st_size > 200 * 1024
    kubectl = os.path.join(control_plane.bin_dir, "kubectl")
    out = subprocess.run([kubectl, "--kubeconfig", control_plane.kubeconfig, "apply", "-f", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    running(kube, ns, "trace", 0)  # every status patch on the way went through
    annotations = kube.job(ns, "trace")["metadata"]["annotations"]
    kopf_copy = annotations.get("kopf.zalando.org/last-handled-configuration", "")
    assert kopf_copy and len(kopf_copy) < 2048 and "sha256" in json.loads(kopf_copy)["spec"]


def test_pod_events_drive_the_job_not_the_timer(kube, ns, operator, operator_kubeconfig, tmp_path):
    """With the timer at 60 s, a gang that starts is Running, and a failed rank restarts the gang, within
    seconds: a pass follows each pod's event (and each of the job's own), the timer only keeps time."""
    from support.kube import OperatorProcess

    operator.stop()  # one operator leads at a time: this one's timer is slow
    slow = OperatorProcess(operator_kubeconfig, str(tmp_path / "slow.log"),
                           env={"NETSENSE_RECONCILE_INTERVAL": "60"}).start()
    try:
        kube.create_job(ns, "eventful", quick_spec())
        pods = wait_for(lambda: len(kube.pods(ns, "eventful", 0)) == 2 and kube.pods(ns, "eventful", 0), timeout=40,
                        what="the first gang (the create handler)")
        started = time.monotonic()
        for p in pods:
            kube.set_pod_phase(ns, p.metadata.name, "Running")
        wait_for(lambda: kube.status(ns, "eventful").get("phase") == "Running", timeout=10,
                 what="Running after the pods' events, long before the 60 s timer")
        kube.set_pod_phase(ns, pods[1].metadata.name, "Failed", message="boom", exit_code=1)
        wait_for(lambda: len(kube.pods(ns, "eventful", 1)) == 2, timeout=10,
                 what="the restarted gang after rank 1's failure")
        assert kube.status(ns, "eventful")["restarts"] == 1
        assert time.monotonic() - started < 30, "the passes waited for the timer"
        assert "Traceback" not in slow.log(), slow.log()
    finally:
        slow.stop()
        operator.start()


def _rates(kube, seconds: float) -> dict[tuple[str, str, str], float]:
    """Requests a second the API server answered over a window, by (verb, resource, subresource), less the
    watches (long-lived) and the Lease's renewals (leader election, fixed per operator)."""
    before = kube.request_counts()
    time.sleep(seconds)
    after = kube.request_counts()
    return {k: (n - before.get(k, 0)) / seconds for k, n in after.items()
            if n > before.get(k, 0) and k[0] != "WATCH" and k[1] != "leases"}


def test_quiet_jobs_cost_no_requests_and_a_running_job_under_one_a_second(kube, ns, operator):
    """20 Pending jobs whose pods never schedule and 3 Running jobs, reconciled every 0.5 s (the tests' timer):
    the quiet ones cost nothing (no re-creating of their ConfigMap and Service: 4 requests a pass each before),
    a running one a log read and a status write at most every NETSENSE_PROGRESS_INTERVAL (5 s)."""
    for i in range(20):
        kube.create_job(ns, f"quiet-{i}", quick_spec(workers=1))
    for i in range(3):
        kube.create_job(ns, f"busy-{i}", quick_spec())
    for i in range(3):
        running(kube, ns, f"busy-{i}", 0)
    wait_for(lambda: all(kube.status(ns, f"quiet-{i}").get("phase") == "Pending" for i in range(20)),
             what="20 Pending jobs")
    time.sleep(3)  # the last creations' echoes (the watch's events of their own writes)
    rates = _rates(kube, 10)
    total = sum(rates.values())
    shown = ", ".join(f"{v} {r}{'/' + s if s else ''} {n:.2f}/s" for (v, r, s), n in sorted(rates.items()))
    assert not any(r in ("configmaps", "services") for _, r, _ in rates), f"quiet jobs re-create: {shown}"
    assert total < 3 * 1.0, f"{total:.2f} requests/s for 3 running and 20 quiet jobs: {shown}"


def test_a_config_map_deleted_while_the_gang_waits_on_its_node_comes_back(kube, ns, operator):
    """The job's objects are made once an attempt (a pass costs no request once they are there); one deleted by
    someone while the pods sit on a node waiting for their volume is made again (every 3 timer periods)."""
    kube.create_job(ns, "lost-config", quick_spec())
    pods = wait_for(lambda: len(kube.pods(ns, "lost-config", 0)) == 2 and kube.pods(ns, "lost-config", 0),
                    what="the gang")
    config = kube.core.list_namespaced_config_map(ns, label_selector="netsense.dev/job=lost-config").items[0]
    kube.core.delete_namespaced_config_map(config.metadata.name, ns)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for p in pods:  # bound to a node, waiting (as a kubelet reports while a volume cannot mount)
        kube.core.patch_namespaced_pod_status(p.metadata.name, ns, {"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]}})
    wait_for(lambda: kube.core.list_namespaced_config_map(ns, label_selector="netsense.dev/job=lost-config").items,
             timeout=20, what="the ConfigMap made again")
