"""The operator under a real cluster's failures, against the real API server (the tests play kubelet): a rank
disrupted (evicted, preempted, deleted) is not a failure; a restarted gang never meets its predecessor; a full
quota is waited for; a spec change is judged by generation (a queue may set a suspended job's scheduling);
a large trace goes through `kubectl apply`. (The pure units: test_operator_units.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml
from support.kube import quick_spec, wait_for

pytestmark = pytest.mark.apiserver
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
    assert "exceeded quota" in next(c for c in st["conditions"] if c["type"] == "PodsReady")["message"]
    time.sleep(2)
    assert kube.status(ns, "queued")["phase"] == "Pending", "a full quota failed the job"
    kube.core.patch_namespaced_resource_quota_status("gang", ns, {"status": {"hard": {"pods": "10"},
                                                                            "used": {"pods": "0"}}})
    kube.core.patch_namespaced_resource_quota("gang", ns, {"spec": {"hard": {"pods": "10"}}})
    wait_for(lambda: len(kube.pods(ns, "queued")) == 2, what="the gang once the quota has room")


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
