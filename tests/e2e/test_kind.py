"""End to end on several nodes: the kind cluster of `make kind-e2e` (testbed/kind/e2e.sh), one control plane and
two workers, each a Docker container running systemd, containerd and the kubelet.

What the one real node (test_local_node.py) cannot show: a gang placed one rank a node, with its traffic between
the nodes; a node lost while the job runs (a worker's container frozen with `docker pause`) without the job wedging;
a campaign's cells spread over the workers. Tests of the real node that hold on any cluster run here too (imported
from test_local_node, with this cluster's kubectl): the quick sample to Succeeded, a rank's pod deleted and the
operator killed mid-job. Nothing here is kind-specific but the fixture that finds the cluster and the `docker pause`
that loses a node.

e2e.sh sets KUBECONFIG, PATH (this kind, kubectl, Debian's docker client), DOCKER_HOST and NETSENSE_KIND_CLUSTER;
without them every test here is skipped. `make e2e` leaves this file out (-m "not kind").
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time

import pytest
import yaml
from support import REPO
from test_local_node import (  # noqa: F401  (fixtures and tests that run here as they are)
    OPERATOR_NS,
    _apply_job,
    _explain_a_failure,
    _get,
    _job,
    _job_pods,
    _phase,
    _wait,
    campaign_grid,
    deploy_operator,
    kubectl_in,
    test_faults_while_running,
    test_quick_sample_runs_as_real_pods,
)

pytestmark = [pytest.mark.e2e, pytest.mark.kind, pytest.mark.root]

CLUSTER = os.environ.get("NETSENSE_KIND_CLUSTER")


@pytest.fixture(scope="module")
def kubectl():
    if not CLUSTER or not os.environ.get("KUBECONFIG"):
        pytest.skip("no kind cluster: make kind-e2e runs these (NETSENSE_KIND_CLUSTER and KUBECONFIG unset)")
    return kubectl_in(dict(os.environ))


@pytest.fixture(scope="module")
def operator(kubectl):
    """As on the real node: what the README tells a user to type (the images are on the workers already)."""
    deploy_operator(kubectl)
    return kubectl


def _workers(kubectl) -> dict[str, ipaddress.IPv4Network]:
    """The worker nodes (no control-plane role) and their pod CIDRs."""
    nodes = _get(kubectl, "nodes")["items"]
    return {n["metadata"]["name"]: ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes
            if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})}


def _node_ready(kubectl, name: str) -> bool:
    node = _get(kubectl, "node", name)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=60)


def test_cluster_has_two_workers(kubectl):
    workers = _workers(kubectl)
    assert len(workers) == 2 and all(_node_ready(kubectl, w) for w in workers), workers


def test_two_ranks_one_a_node_shaped_and_measured_between_the_nodes(operator, tmp_path):
    """The operator's pods prefer other nodes than their gang's (podAntiAffinity on the job's label): with two
    workers, one rank on each; their collectives cross kind's network between the nodes, through each pod's
    shaper, and rank 0 measures the shaped link."""
    kubectl = operator
    workers = _workers(kubectl)
    _apply_job(kubectl, tmp_path, "spread", **{"network.profile": {"type": "static", "rate": "100Mbit"}})
    placed: dict[str, tuple[str, str]] = {}

    def done():
        for pod in _job_pods(kubectl, "spread"):
            if pod["spec"].get("nodeName") and pod["status"].get("podIP"):
                rank = pod["metadata"]["labels"]["netsense.dev/rank"]
                placed[rank] = (pod["spec"]["nodeName"], pod["status"]["podIP"])
        return _phase(kubectl, "spread") in ("Succeeded", "Failed") and _phase(kubectl, "spread")

    assert _wait("spread to finish", done, 900, every=2) == "Succeeded", \
        json.dumps(_job(kubectl, "spread").get("status"), indent=1)[:3000]
    assert sorted(placed) == ["0", "1"], placed
    nodes = {node for node, _ in placed.values()}
    assert nodes == set(workers), f"ranks not one a worker: {placed}"
    for node, ip in placed.values():  # each pod's address is its own node's: the traffic went between nodes
        assert ipaddress.ip_address(ip) in workers[node], (node, ip, workers)
    result = _job(kubectl, "spread")["status"]["result"]
    assert result["workers"] == 2 and result["linkMeanRateMbit"] == pytest.approx(100, rel=0.02), result
    print(f"\nE2E kind: ranks on {sorted(nodes)}, link {result['linkMeanRateMbit']} Mbit/s, "
          f"best accuracy {result['bestAccuracy']}")
    kubectl("delete", "nsj", "spread", "--wait=true")


def test_a_worker_node_lost_mid_job_does_not_wedge_it(operator, tmp_path, request):
    """A worker's container frozen (`docker pause`): its kubelet stops reporting, the node goes NotReady, and after
    runPolicy.lostNodeSeconds the operator counts the rank lost: the gang restarts (a disruption, not a failure) on
    the worker that is left, and the job finishes. Then the node comes back (`docker unpause`) and is Ready.

    The node lost is the one without the operator: a node lost with the operator on it is another case. Its pod is
    then only replaced when the taint manager evicts it (the default tolerationSeconds for an unreachable node,
    300 s), and until then nothing restarts the gang (measured here: about 5 minutes of a job at a stand-still)."""
    kubectl = operator
    request.addfinalizer(lambda: kubectl("delete", "nsj", "lost", "--ignore-not-found", "--wait=false", check=False))
    _apply_job(kubectl, tmp_path, "lost", **{"training.epochs": 30, "runPolicy.backoffLimit": 2,
                                              "runPolicy.lostNodeSeconds": 20, "runPolicy.activeDeadlineSeconds": 1500})
    _wait("lost to run", lambda: _phase(kubectl, "lost") == "Running", 300)
    time.sleep(5)
    op_nodes = {p["spec"].get("nodeName") for p in _get(kubectl, "-n", OPERATOR_NS, "pods", "-l",
                                                          "app.kubernetes.io/component=operator")["items"]}
    ranks_at = {p["metadata"]["labels"]["netsense.dev/rank"]: p["spec"]["nodeName"] for p in _job_pods(kubectl, "lost")}
    # rank 0's node where it can be: the operator reads rank 0's log through its kubelet
    victim = next((ranks_at[r] for r in ("0", "1") if r in ranks_at and ranks_at[r] not in op_nodes), None)
    assert victim is not None, f"every rank's node runs the operator too: ranks on {ranks_at}, operator on {op_nodes}"
    survivor = next(w for w in _workers(kubectl) if w != victim)
    _docker("pause", victim)
    paused = True

    def unpause():
        nonlocal paused
        if paused:
            _docker("unpause", victim)
            paused = False

    request.addfinalizer(unpause)
    t0 = time.monotonic()
    _wait(f"{victim} NotReady", lambda: not _node_ready(kubectl, victim), 180, every=2)
    t_notready = time.monotonic() - t0

    def restarted_elsewhere():
        status = _job(kubectl, "lost").get("status") or {}
        live = [p for p in _job_pods(kubectl, "lost") if not p["metadata"].get("deletionTimestamp")]
        return (status.get("disruptions", 0) >= 1 and status.get("phase") == "Running" and len(live) == 2
                and all(p["spec"].get("nodeName") == survivor for p in live))

    _wait("the gang restarted on the worker that is left", restarted_elsewhere, 300, every=2)
    t_restart = time.monotonic() - t0
    print(f"\nE2E kind: {victim} (rank {sorted(r for r, n in ranks_at.items() if n == victim)}) paused; NotReady after {t_notready:.0f}s, gang running again on {survivor} "
          f"after {t_restart:.0f}s")
    unpause()
    _wait(f"{victim} Ready again", lambda: _node_ready(kubectl, victim), 180, every=2)
    assert _wait("lost to finish", lambda: _phase(kubectl, "lost") in ("Succeeded", "Failed") and _phase(
        kubectl, "lost"), 1200, every=2) == "Succeeded", json.dumps(_job(kubectl, "lost").get("status"), indent=1)[:3000]
    final = _job(kubectl, "lost")["status"]
    assert final["disruptions"] >= 1 and final["restarts"] == 0, final
    kubectl("delete", "nsj", "lost", "--wait=true")


def test_a_campaign_of_four_cells_across_the_two_workers(operator, tmp_path):
    """`netsense bench --cluster --parallel 2`: four cells (two methods x two seeds), two jobs at a time, their
    pods on both workers; every cell reaches its target."""
    kubectl = operator
    workers = set(_workers(kubectl))
    grid = campaign_grid("kind-campaign")
    path, out = tmp_path / "campaign.yaml", tmp_path / "campaign"
    path.write_text(yaml.safe_dump(grid))
    argv = [os.path.join(REPO, ".venv", "bin", "netsense"), "bench", str(path), "--cluster", "--parallel", "2",
            "--out", str(out)]
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen_nodes: set[str] = set()
    most_jobs = 0
    t0 = time.monotonic()
    try:
        while bench.poll() is None and time.monotonic() - t0 < 1200:
            jobs = _get(kubectl, "nsj")["items"]
            most_jobs = max(most_jobs, sum(1 for j in jobs if (j.get("status") or {}).get("phase") == "Running"
                                           and j["metadata"]["name"].startswith(("allreduce-", "topk-"))))
            seen_nodes |= {p["spec"]["nodeName"] for p in _get(kubectl, "pods", "-l", "netsense.dev/job")["items"]
                           if p["spec"].get("nodeName")}
            time.sleep(2)
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 0, err[-3000:]
    print(f"\nE2E kind campaign: 4 cells, up to {most_jobs} at once, on {sorted(seen_nodes)}, "
          f"in {time.monotonic() - t0:.0f}s")
    table = json.loads((out / "table.json").read_text())
    assert {r["method"] for r in table} == {"allreduce", "topk-0.1"} and all(r["reached"] == "2/2" for r in table), table
    assert seen_nodes == workers, seen_nodes
    assert most_jobs == 2, most_jobs
    _wait("every cell's job deleted", lambda: not _get(kubectl, "nsj")["items"], 120)


def test_the_operator_runs_on_a_worker(operator):
    """The control plane's NoSchedule taint holds: the operator (and every rank above) ran on a worker."""
    pods = _get(operator, "-n", OPERATOR_NS, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
    assert pods and all(p["spec"]["nodeName"] in _workers(operator) for p in pods), pods
