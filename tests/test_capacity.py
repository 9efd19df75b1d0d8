"""`netsense bench --cluster` without --parallel: as many cells as the cluster's free resources hold."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from netsense.bench.capacity import Room, cell_requests, cells_that_fit, cluster_room
from netsense.spec import parse_spec

GI = 2**30


def test_a_cell_asks_for_what_the_operators_pods_request():
    """Trainer and shaper (a sidecar: its requests add to the pod's) of every worker; a GPU asked for as a limit
    alone counts (its request defaults to it); the template's resources replace the trainer's."""
    shaped = {"workers": 3, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
              "network": {"profile": {"type": "static", "rate": "50Mbit"}}}
    assert cell_requests(parse_spec(shaped)) == {"cpu": Decimal("1.530"), "memory": 3 * GI + 3 * 64 * 2**20}
    assert cell_requests(parse_spec({})) == {"cpu": 2, "memory": 2 * GI}  # the operator's default trainer and workers
    gpu = {"workers": 2, "podTemplate": {"spec": {"containers": [{"name": "trainer", "resources": {
        "requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": 1}}}]}}}
    assert cell_requests(parse_spec(gpu)) == {"cpu": 8, "nvidia.com/gpu": 2}


CELL = {"cpu": Decimal(2), "memory": Decimal(2 * GI)}


@pytest.mark.parametrize("free, cell, want", [
    ({"cpu": 8, "memory": 64 * GI}, CELL, 4),  # cpu binds: 8 / 2
    ({"cpu": 64, "memory": 3 * GI}, CELL, 1),  # memory binds: 3 / 2
    ({"cpu": 64, "memory": 64 * GI}, CELL, 5),  # never more than the cells
    ({"cpu": 0, "memory": 0}, CELL, 1),  # a full cluster: one at a time, waiting
    ({"cpu": 64, "memory": 64 * GI, "nvidia.com/gpu": 3}, {**CELL, "nvidia.com/gpu": Decimal(2)}, 1),  # GPUs bind
    ({"cpu": 64, "memory": 64 * GI}, {**CELL, "nvidia.com/gpu": Decimal(1)}, 1),  # no node has one
])
def test_cells_that_fit(free, cell, want):
    assert cells_that_fit(Room({k: Decimal(v) for k, v in free.items()}, ""), cell, 5) == want


@pytest.mark.apiserver
def test_the_room_is_the_ready_nodes_allocatable_less_what_their_pods_request(kube, ns):
    """Against the API server: two nodes (one cordoned, not counted), pods bound to the Ready one by nodeName."""
    names = [f"cap-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    try:
        for name, cordoned in zip(names, (False, True), strict=True):
            kube.core.create_node({"metadata": {"name": name}, "spec": {"unschedulable": cordoned}})
            kube.core.patch_node_status(name, {"status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "1"},
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "1"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]}})
        before = cluster_room(kube.core)
        kube.core.create_namespaced_pod(ns, {"metadata": {"name": "busy"}, "spec": {
            "nodeName": names[0], "containers": [{"name": "c", "image": "x", "resources": {
                "requests": {"cpu": "1500m", "memory": "1Gi"}}}],
            "initContainers": [{"name": "sidecar", "image": "x", "restartPolicy": "Always", "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi"}}},
                               {"name": "once", "image": "x", "resources": {"requests": {"cpu": "3"}}}]}})
        after = cluster_room(kube.core)
        # Other tests' nodes may exist (none Ready here but ours); ours adds 4 cpu / 8Gi / 1 GPU. Its pod takes
        # what the scheduler reserves: the plain init container with the sidecar started before it (3 + 0.5 cpu)
        # outweighs the app container and the sidecar (1.5 + 0.5); memory 1Gi + 1Gi.
        assert before.free["cpu"] - after.free["cpu"] == Decimal("3.5"), (before, after)
        assert before.free["memory"] - after.free["memory"] == 2 * GI, (before, after)
        assert before.free["cpu"] >= 4 and "pods request" in after.note
        # Room by cpu for two cells of half the free cpu, but GPUs for one cell of as many GPUs as there are free.
        half, gpus = after.free["cpu"] / 2, after.free.get("nvidia.com/gpu", 0)
        assert gpus >= 1 and cells_that_fit(after, {"cpu": half}, 4) == 2
        assert cells_that_fit(after, {"cpu": half, "nvidia.com/gpu": gpus}, 4) == 1
    finally:
        for name in names:
            kube.core.delete_node(name)
