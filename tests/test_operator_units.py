"""The operator's decisions that need no API server: no decision on a status older than its own write, and a
pod that vanished while the watch was away."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest


def _pod(uid: str, created_s_ago: float) -> dict:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - created_s_ago))
    return {"metadata": {"name": uid, "uid": uid, "labels": {}, "creationTimestamp": created}, "status": {}}


def test_a_pod_that_vanished_while_the_watch_was_away_is_dropped_once_a_resync_lists_without_it(monkeypatch):
    """After a 410 kopf lists again without a DELETED for pods gone meanwhile; they would stay in the index and
    their rank would never come back. A resync (one LIST for every job) drops what the API server no longer
    has; a pod created too close to the LIST to tell is kept; and one LIST a RESYNC_S, however many jobs."""
    from netsense_operator import api, podindex

    lists = []

    def list_pods(**kwargs):
        """Two pages of metadata only, as the API server answers a PartialObjectMetadataList with a limit."""
        lists.append(kwargs)
        assert "PartialObjectMetadataList" in kwargs["_headers"]["Accept"] and not kwargs["_preload_content"]
        page = {"items": [{"metadata": {"uid": "kept"}}], "metadata": {"continue": "next"}} if not kwargs["_continue"] \
            else {"items": [{"metadata": {"uid": "also-kept"}}], "metadata": {}}
        return SimpleNamespace(data=json.dumps(page).encode())

    monkeypatch.delenv("NETSENSE_NAMESPACES", raising=False)
    monkeypatch.setattr(api, "core", lambda: SimpleNamespace(list_pod_for_all_namespaces=list_pods))
    monkeypatch.setattr(podindex, "_last_resync", [0.0])
    monkeypatch.setattr(podindex, "_vanished", set())
    index = {"job-a": [_pod("kept", 600), _pod("gone", 600), _pod("also-kept", 600)], "job-b": [_pod("new", 5)]}
    podindex.resync(index)
    assert [p["metadata"]["uid"] for p in podindex.pods(index, "job-a")] == ["kept", "also-kept"]
    assert [p["metadata"]["uid"] for p in podindex.pods(index, "job-b")] == ["new"], "too recent to tell"
    for _ in range(5):
        podindex.resync(index)
    assert len(lists) == 2, "a LIST (two pages) every pass, not one a RESYNC_S"


# The kubelet's own messages (pkg/kubelet/eviction/helpers.go), as a pod's status carries them.
_SELF_EVICTIONS = [
    "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
    'Container trainer exceeded its local ephemeral storage limit "1Gi". ',
    'Usage of EmptyDir volume "netsense-run" exceeds the limit "1Mi". ',
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi. Container trainer was using "
    "3Gi, request is 1Gi, has larger consumption of memory. ",
]


def _evicted(message: str, condition: bool) -> dict:
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                   "message": message}] if condition else []
    return {"metadata": {"name": "p"}, "status": {"phase": "Failed", "reason": "Evicted", "message": message,
                                                  "conditions": conditions}}


@pytest.mark.parametrize("message", _SELF_EVICTIONS)
@pytest.mark.parametrize("condition", [False, True], ids=["limit", "pressure"])
def test_an_eviction_for_the_pods_own_use_is_its_failure_not_a_disruption(message, condition):
    """Restarted as a disruption, the same job would be evicted again, without end: it counts against
    backoffLimit, and its message says why."""
    from netsense_operator import status as st

    pod = _evicted(message, condition)
    assert st.disruption(pod) is None
    assert st.failure_reason(pod).startswith("evicted for its own use: ") and message.split()[0] in st.failure_reason(pod)


def test_an_eviction_for_another_pods_use_or_a_drain_stays_a_disruption():
    from netsense_operator import status as st

    pressure = _evicted("The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi. ", True)
    assert "TerminationByKubelet" in st.disruption(pressure)
    drained = {"status": {"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "True",
                                                              "reason": "EvictionByEvictionAPI", "message": "drain"}]}}
    assert "EvictionByEvictionAPI" in st.disruption(drained)


def _quota(name: str, hard: dict, used: dict | None = None, **spec) -> dict:
    return {"metadata": {"name": name}, "spec": {"hard": hard, **spec},
            "status": {"hard": hard, "used": used or {}} if used is not None else {}}


def test_a_gangs_demand_is_what_the_quota_admission_would_count_for_the_pods_the_operator_builds():
    """Trainer and shaper (a sidecar: its requests add to the pod's), a GPU given as a limit alone (its request
    defaults to it), the template's resources."""
    from netsense_operator import quota
    from netsense_operator import resources as res

    from netsense.spec import parse_spec

    job = parse_spec({"workers": 4, "network": {"profile": {"type": "static", "rate": "100Mbit"}},
                      "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                    "limits": {"memory": "2Gi", "nvidia.com/gpu": 1}}}, "gpu")
    pods = [res.worker_pod(job, "ns", "uid", r, 0) for r in range(job.workers)]
    need = quota.demand(pods)
    assert need["pods"] == need["count/pods"] == 4
    assert need["requests.cpu"] == need["cpu"] == 4 * (1 + quota.quantity("10m"))
    assert need["requests.nvidia.com/gpu"] == need["limits.nvidia.com/gpu"] == 4
    assert need["limits.memory"] == 4 * (2 * 2**30 + 256 * 2**20)
    assert "nvidia.com/gpu" not in need  # an extended resource is quota'd by requests.<name> only


def test_a_gang_that_does_not_fit_a_quota_says_which_and_what():
    from decimal import Decimal

    from netsense_operator import quota

    need = {"pods": Decimal(4), "count/pods": Decimal(4), "requests.cpu": Decimal(2), "cpu": Decimal(2)}
    assert quota.shortfall([_quota("team", {"pods": "6"}, {"pods": "2"})], need) is None
    said = quota.shortfall([_quota("team", {"pods": "6"}, {"pods": "3"})], need)
    assert said == "ResourceQuota team: the gang needs 4 pods, 3 of 6 free"
    assert "requests.cpu" in quota.shortfall([_quota("cpu", {"requests.cpu": "1500m"}, {})], need)
    assert quota.shortfall([_quota("gpus", {"requests.nvidia.com/gpu": "0"}, {})], need) is None  # not asked for
    scoped = _quota("best-effort", {"pods": "0"}, {}, scopes=["BestEffort"])
    assert quota.shortfall([scoped], need) is None  # scopes: left to the create's own refusal
    assert "not counted yet" in quota.shortfall([_quota("new", {"pods": "10"})], need)


def _node(name: str, cpu: str, gpus: int = 0, labels: dict | None = None, taints: list | None = None) -> dict:
    alloc = {"cpu": cpu, "memory": "16Gi", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def _gang(workers: int, cpu: str = "1", gpus: int = 0, **template) -> list[dict]:
    from netsense_operator import resources as res

    from netsense.spec import parse_spec

    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    job = parse_spec({"workers": workers, "resources": {"requests": {"cpu": cpu}, "limits": limits},
                      **({"podTemplate": {"spec": template}} if template else {})}, "g")
    return [res.worker_pod(job, "ns", "uid", r, 0) for r in range(workers)]


def test_a_gang_fits_only_where_every_rank_finds_a_node_that_may_host_it():
    from netsense_operator import gate

    nodes = [_node("a", "2"), _node("b", "1500m")]
    room = gate.node_room(nodes, [])
    assert gate.shortfall(nodes, room, _gang(3, "1")) is None  # a: 2 ranks, b: 1
    assert "does not fit" in gate.shortfall(nodes, room, _gang(4, "1"))
    busy = {"spec": {"nodeName": "a", "containers": [{"resources": {"requests": {"cpu": "1500m"}}}]},
            "status": {"phase": "Running"}}
    assert "does not fit" in gate.shortfall(nodes, gate.node_room(nodes, [busy]), _gang(3, "1"))
    done = {**busy, "status": {"phase": "Succeeded"}}  # an ended pod holds nothing
    assert gate.shortfall(nodes, gate.node_room(nodes, [done]), _gang(3, "1")) is None
    # Room by cpu but not by GPU; a taint not tolerated; a nodeSelector no node matches.
    gpu_nodes = [_node("g", "64", gpus=1), _node("h", "64")]
    assert "nvidia.com/gpu" in gate.shortfall(gpu_nodes, gate.node_room(gpu_nodes, []), _gang(2, "1", gpus=1))
    tainted = [_node("t", "64", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])]
    assert gate.shortfall(tainted, gate.node_room(tainted, []), _gang(1)) is not None
    assert gate.shortfall(tainted, gate.node_room(tainted, []), _gang(1, tolerations=[
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])) is None
    assert gate.shortfall(nodes, room, _gang(1, nodeSelector={"pool": "gpu"})) is not None
    cordoned = [{**_node("c", "64"), "spec": {"unschedulable": True}}]
    assert "no Ready node" in gate.shortfall(cordoned, gate.node_room(cordoned, []), _gang(1))


def test_an_admitted_gang_not_bound_yet_holds_its_room():
    from netsense_operator import gate

    nodes = [_node("a", "2500m")]
    room = gate.node_room(nodes, [])
    first = _gang(2, "1")
    assert gate.shortfall(nodes, room, first) is None
    gate.reserve(nodes, room, first)
    assert gate.shortfall(nodes, room, _gang(2, "1")) is not None


def test_every_worker_pod_waits_behind_the_gangs_gate_unless_kueue_admits_it():
    from netsense_operator import gate
    from netsense_operator import resources as res

    from netsense.spec import parse_spec

    assert all(gate.gated(p) for p in _gang(2))
    # A template label naming a Kueue queue: Kueue gates and admits the pod group itself.
    job = parse_spec({"workers": 2, "podTemplate": {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}}, "k")
    kueue = [res.worker_pod(job, "ns", "uid", r, 0) for r in range(2)]
    assert not any(gate.gated(p) for p in kueue)


def test_a_calibrations_progress_is_its_last_rung():
    """A calibrate pod prints no JSON progress lines: `kubectl get nsj`'s PROGRESS says the rung it runs."""
    from netsense_operator.status import last_progress

    log = ("[calibrate] rung 0: 12 runs of 200 steps (dense fp16, topk 0.01, topk 0.003, powersgd rank 2)\n"
           "[calibrate] milestone: loss 0.6481 (dense fp16's 20-step mean at step 160, the highest over the seeds)\n"
           "[calibrate] rung 1: 4 runs of 400 steps (topk 0.003, powersgd rank 2)\n"
           "[calibrate]   topk 0.003: steps to the milestone seed 0 212, seed 1 > 400\n")
    assert last_progress(log) == {"summary": "rung 1: 4 runs of 400 steps"}
    assert last_progress("[calibrate] milestone: loss 0.6\n") is None


def test_rank_0s_log_on_a_node_that_stopped_answering_times_out_instead_of_holding_the_reconciler(monkeypatch):
    """The progress read goes through the API server to rank 0's kubelet: it has a timeout, and a timeout is no
    progress, not an error (found on kind: a paused node held it ~5 minutes, and the lost-node check with it)."""
    import urllib3
    from netsense_operator import api, reconciler

    calls = []

    def read_log(name, namespace, **kwargs):
        calls.append(kwargs)
        raise urllib3.exceptions.ReadTimeoutError(None, "/logs", "Read timed out.")

    monkeypatch.setattr(api, "core", lambda: SimpleNamespace(read_namespaced_pod_log=read_log))
    assert reconciler._progress("default", {"metadata": {"name": "job-a0-w0"}}) is None
    assert calls and calls[0]["_request_timeout"] == reconciler.PROGRESS_TIMEOUT_S
