"""`netsense bench --cluster` without --parallel: as many cells as the cluster's free resources hold."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from netsense.bench.capacity import Room, cell_requests, cells_that_fit, cluster_room
from netsense.spec import parse_spec

GI = 2**30


def test_a_cell_asks_for_its_workers_trainers_and_shapers():
    shaped = {"workers": 3, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
              "network": {"profile": {"type": "static", "rate": "50Mbit"}}}
    assert cell_requests(parse_spec(shaped)) == (Decimal("1.530"), 3 * GI + 3 * 64 * 2**20)
    assert cell_requests(parse_spec({})) == (Decimal(2), 2 * GI)  # the operator's default trainer and workers


@pytest.mark.parametrize("room, want", [
    (Room(Decimal(8), Decimal(64 * GI), ""), 4),  # cpu binds: 8 / 2
    (Room(Decimal(64), Decimal(3 * GI), ""), 1),  # memory binds: 3 / 2
    (Room(Decimal(64), Decimal(64 * GI), ""), 5),  # never more than the cells
    (Room(Decimal(0), Decimal(0), ""), 1),  # a full cluster: one at a time, waiting
])
def test_cells_that_fit(room, want):
    assert cells_that_fit(room, (Decimal(2), Decimal(2 * GI)), 5) == want


@pytest.mark.apiserver
def test_the_room_is_the_ready_nodes_allocatable_less_what_their_pods_request(kube, ns):
    """Against the API server: two nodes (one cordoned, not counted), pods bound to the Ready one by nodeName."""
    names = [f"cap-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    try:
        for name, cordoned in zip(names, (False, True), strict=True):
            kube.core.create_node({"metadata": {"name": name}, "spec": {"unschedulable": cordoned}})
            kube.core.patch_node_status(name, {"status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]}})
        before = cluster_room(kube.core)
        kube.core.create_namespaced_pod(ns, {"metadata": {"name": "busy"}, "spec": {
            "nodeName": names[0], "containers": [{"name": "c", "image": "x", "resources": {
                "requests": {"cpu": "1500m", "memory": "1Gi"}}}],
            "initContainers": [{"name": "sidecar", "image": "x", "restartPolicy": "Always", "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi"}}},
                               {"name": "once", "image": "x", "resources": {"requests": {"cpu": "3"}}}]}})
        after = cluster_room(kube.core)
        # Other tests' nodes may exist (none Ready here but ours); ours adds 4 cpu / 8Gi, its pod takes 2 / 2Gi.
        assert before.cpu - after.cpu == Decimal(2) and before.memory - after.memory == 2 * GI, (before, after)
        assert before.cpu >= 4 and "pods request" in after.note
    finally:
        for name in names:
            kube.core.delete_node(name)
