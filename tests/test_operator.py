"""The operator against a real kube-apiserver + etcd, running with exactly the RBAC
of manifests/base/rbac.yaml; the tests play kubelet by patching pod status."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid

import pytest
import yaml
from kubernetes import client
from support.kube import REPO, OperatorProcess, quick_spec, wait_for
from support.procs import Watched, alive


def env_of(container) -> dict:
    return {e.name: e.value for e in container.env or []}


# ---- the API server and the CRD (envtest smoke) -----------------------------------

def test_a_job_round_trips_with_schema_defaults(kube, ns):
    kube.create_job(ns, "roundtrip", {"training": {"model": "mlp"}})
    job = kube.job(ns, "roundtrip")
    assert job["spec"]["workers"] == 2  # default from the generated schema
    assert job["spec"]["compression"] == {"method": "allreduce"}  # no other method's defaults
    assert job["spec"]["training"]["batchSize"] == 32


@pytest.mark.parametrize("spec, message", [
    ({"workers": -1}, "spec.workers"),
    ({"compression": {"method": "zip"}}, 'Unsupported value: "zip"'),
    ({"network": {"profile": {"type": "static", "rate": "fast"}}}, "spec.network.profile.rate"),
    ({"network": {"profile": {"type": "static"}}}, "a static profile needs rate"),
    ({"training": {"optimizer": "lion"}}, "spec.training.optimizer"),
    ({"compression": {"method": "topk", "density": 1.5}}, "spec.compression.density"),
    ({"compression": {"method": "tta", "density": 0.01}}, "density applies to method topk"),
    ({"compression": {"density": 0.01}}, "density applies to method topk"),  # method defaults to allreduce
    # Readable without `netsense validate`: no raw pattern, the unit to write.
    ({"network": {"profile": {"type": "static", "rate": "50Mbit", "delay": 10}}}, "a duration needs its unit"),
    ({"network": {"profile": {"type": "static", "rate": "50Mbit", "loss": 1}}}, "a percentage is written like"),
    ({"network": {"profile": {"type": "static", "rate": "fast"}}}, "a rate is written like '200Mbit'"),
    ({"network": {"profile": {"type": "static", "rate": "-5Mbit"}}}, "a rate must be positive"),
])
def test_the_server_rejects_bad_jobs_with_its_message(kube, ns, spec, message):
    with pytest.raises(client.ApiException) as e:
        kube.create_job(ns, "bad", spec)
    assert e.value.status == 422
    assert message in json.loads(e.value.body)["message"]


def test_samples_validate_against_the_crd(kube, ns):
    for folder in ("samples", os.path.join("manifests", "samples")):
        for name in sorted(os.listdir(os.path.join(REPO, folder))):
            with open(os.path.join(REPO, folder, name)) as fh:
                doc = yaml.safe_load(fh)
            kube.custom.create_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", doc,
                                                        dry_run="All")


# ---- the operator ------------------------------------------------------------------

def test_a_job_becomes_a_service_and_a_gang_of_pods(kube, ns, operator):
    job = kube.create_job(ns, "gang", quick_spec(workers=3))
    pods = wait_for(lambda: len(kube.pods(ns, "gang")) == 3 and kube.pods(ns, "gang"), what="3 pods")
    svc = kube.core.read_namespaced_service("gang-rdzv", ns)
    uid = job["metadata"]["uid"]
    assert svc.spec.cluster_ip == "None" and svc.spec.selector == {"netsense.dev/job-uid": uid,
                                                                   "netsense.dev/rank": "0"}
    for rank, pod in enumerate(pods):
        assert pod.metadata.name == f"gang-a0-w{rank}"
        assert pod.metadata.owner_references[0].uid == job["metadata"]["uid"]
        assert pod.metadata.owner_references[0].controller
        assert pod.spec.automount_service_account_token is False
        assert pod.spec.restart_policy == "Never"
        trainer = pod.spec.containers[0]
        env = env_of(trainer)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3" and env["MASTER_PORT"] == "29500"
        assert env["MASTER_ADDR"] == f"gang-rdzv.{ns}.svc"
        assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["NETSENSE_JOB_FILE"] == "/etc/netsense/job.json"
        assert trainer.termination_message_path == "/dev/termination-log"
        sidecar = pod.spec.init_containers[0]
        assert sidecar.restart_policy == "Always"  # a native sidecar
        assert sidecar.security_context.capabilities.add == ["NET_ADMIN"]
        assert sidecar.security_context.capabilities.drop == ["ALL"]
        assert sidecar.command[:4] == ["netsense", "shape", "--dev", "eth0"]
        assert sidecar.startup_probe._exec.command == ["test", "-f", "/tmp/netsense-shaped"]
        # The profile's clock starts when training does: the trainer tells its shaper
        # through a file on a volume both mount.
        start_file = sidecar.command[sidecar.command.index("--start-file") + 1]
        assert env["NETSENSE_PROFILE_START_FILE"] == start_file
        mounts = {m.name: m.mount_path for m in sidecar.volume_mounts}
        # The same job and run volumes; the shaper's /tmp is its own (its image is read-only).
        assert mounts == {**{m.name: m.mount_path for m in trainer.volume_mounts}, "netsense-shaper-tmp": "/tmp"}
        assert any(start_file.startswith(path + "/") for path in mounts.values())
        assert {v.name for v in pod.spec.volumes if v.empty_dir is not None or v.config_map is not None} >= set(mounts)
        assert "--profile" in sidecar.command and sidecar.command[sidecar.command.index("--profile") + 1].startswith(
            mounts["netsense-job"] + "/")
    config = kube.core.read_namespaced_config_map("gang-job", ns)
    assert json.loads(config.data["job.json"])["spec"]["workers"] == 3
    assert json.loads(config.data["profile.json"]) == {"type": "static", "rate": "200Mbit"}
    assert config.metadata.owner_references[0].uid == uid
    time.sleep(2)  # several reconciles later: nothing new
    assert [p.metadata.uid for p in kube.pods(ns, "gang")] == [p.metadata.uid for p in pods]  # the same pods
    st = kube.status(ns, "gang")
    assert st["phase"] == "Pending" and st["network"]["rate"] == "200Mbit"


def test_an_operator_restart_creates_no_duplicates_and_carries_on(kube, ns, operator):
    kube.create_job(ns, "restart", quick_spec())
    wait_for(lambda: len(kube.pods(ns, "restart")) == 2, what="pods")
    pods = kube.pods(ns, "restart")
    operator.stop()  # the session's operator: down while its pods start
    try:
        for pod in pods:
            kube.set_pod_phase(ns, pod.metadata.name, "Running")
    finally:
        operator.start()
    wait_for(lambda: kube.status(ns, "restart").get("phase") == "Running", what="Running, seen by the new operator")
    time.sleep(2)  # several reconciles later: nothing new
    # The same pods, not new ones of the same (deterministic) names.
    assert [p.metadata.uid for p in kube.pods(ns, "restart")] == [p.metadata.uid for p in pods]


def test_a_namespace_scoped_operator_runs_jobs_with_roles_alone_and_leaves_other_namespaces_be(
        kube, ns, operator, control_plane, tmp_path):
    """manifests/overlays/namespaced: the ClusterRole bound by a RoleBinding in each watched namespace (and the
    Lease's), no ClusterRoleBinding."""
    sa = "netsense-scoped"
    kube.apply([{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": "netsense-system"}}])
    with open(os.path.join(REPO, "manifests", "overlays", "namespaced", "role.yaml")) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    with open(os.path.join(REPO, "manifests", "base", "rbac.yaml")) as fh:
        docs += [d for d in yaml.safe_load_all(fh) if d["kind"] == "RoleBinding"]  # the Lease
    for d in docs:  # beside the session operator's own objects, for another ServiceAccount
        d["metadata"]["name"] += "-scoped"
        if d["kind"] == "RoleBinding":
            d["subjects"][0]["name"] = sa
        if d["metadata"]["namespace"] == "ml-team":
            d["metadata"]["namespace"] = ns
            assert d["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                    "name": "netsense-operator"}  # base/rbac.yaml's, applied for the session
    kube.apply(docs)
    other = kube.namespace(f"t-{uuid.uuid4().hex[:8]}")
    operator.stop()  # the cluster-wide one would take both namespaces' jobs
    scoped = OperatorProcess(control_plane.token_kubeconfig(sa, "netsense-system"), str(tmp_path / "scoped.log"),
                             ("--namespace", ns)).start()
    try:
        kube.create_job(ns, "mine", quick_spec())
        kube.create_job(other, "theirs", quick_spec())
        pods = wait_for(lambda: len(kube.pods(ns, "mine")) == 2 and kube.pods(ns, "mine"), what="pods")
        for pod in pods:
            kube.set_pod_phase(ns, pod.metadata.name, "Running")
        wait_for(lambda: kube.status(ns, "mine").get("phase") == "Running", what="Running, from the watched pods")
        assert kube.status(other, "theirs").get("phase") is None and not kube.pods(other, "theirs")
        # Each line's timestamp is dropped first: its milliseconds can read 403 (CI: "03:52:27,403").
        said = re.sub(r"^\[[^\]]*\]", "", scoped.log(), flags=re.MULTILINE)
        assert "403" not in said and "Forbidden" not in said, scoped.log()
    finally:
        scoped.stop()
        operator.start()
        kube.delete_jobs(other)


def events_of(kube, ns: str, name: str) -> list:
    return kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items


def test_a_job_recreated_under_the_same_name_never_adopts_its_predecessors_pods(kube, ns, operator):
    """No garbage collector runs here (no controller-manager), as on a cluster where it is slow: the old
    job's pods and Service outlive it. The new job must neither count them nor rendezvous through them."""
    old = kube.create_job(ns, "again", quick_spec())
    old_pods = wait_for(lambda: len(kube.pods(ns, "again")) == 2 and kube.pods(ns, "again"), what="pods")
    for pod in old_pods:
        kube.set_pod_phase(ns, pod.metadata.name, "Running")
    wait_for(lambda: kube.status(ns, "again").get("phase") == "Running", what="Running")
    kube.custom.delete_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", "again")

    def gone() -> bool:
        try:
            kube.job(ns, "again")
        except client.ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, what="the old job deleted")
    new = kube.create_job(ns, "again", quick_spec())
    uid = new["metadata"]["uid"]
    assert uid != old["metadata"]["uid"]

    def owned() -> list:
        pods = kube.pods(ns, "again")
        return len(pods) == 2 and all(p.metadata.owner_references[0].uid == uid for p in pods) and pods

    pods = wait_for(owned, what="the new job's own pods")
    assert all(p.metadata.labels["netsense.dev/job-uid"] == uid for p in pods)
    assert all(p.status.phase in (None, "Pending") for p in pods), "a pod of the old job was taken over"
    st = wait_for(lambda: (s := kube.status(ns, "again")).get("phase") and s, what="a phase")
    assert st["phase"] == "Pending" and st["workers"]["running"] == 0
    svc = wait_for(lambda: (s := kube.core.read_namespaced_service("again-rdzv", ns))
                   .metadata.owner_references[0].uid == uid and s, what="the new job's own service")
    assert svc.spec.selector["netsense.dev/job-uid"] == uid


def test_a_pod_of_an_attempt_that_is_not_current_is_deleted(kube, ns, operator):
    """What an operator that died between creating a gang and recording it would leave behind."""
    job = kube.create_job(ns, "stray", quick_spec())
    pods = wait_for(lambda: len(kube.pods(ns, "stray")) == 2 and kube.pods(ns, "stray"), what="pods")
    stray = kube.core.api_client.sanitize_for_serialization(pods[0])
    stray["metadata"] = {"name": "stray-a7-w0", "labels": {**stray["metadata"]["labels"], "netsense.dev/attempt": "7"},
                         "ownerReferences": stray["metadata"]["ownerReferences"]}
    stray.pop("status", None)
    kube.core.create_namespaced_pod(ns, stray)
    wait_for(lambda: [p.metadata.name for p in kube.pods(ns, "stray")] == ["stray-a0-w0", "stray-a0-w1"],
             what="the stray attempt deleted")
    assert [p.metadata.uid for p in kube.pods(ns, "stray")] == [p.metadata.uid for p in pods], \
        "the current attempt's pods were replaced"
    assert kube.status(ns, "stray")["attempt"] == 0
    assert all(p.metadata.labels["netsense.dev/job-uid"] == job["metadata"]["uid"] for p in kube.pods(ns, "stray"))


def test_the_job_tells_its_story_in_events_and_conditions(kube, ns, operator):
    kube.create_job(ns, "story", quick_spec(runPolicy={"backoffLimit": 1}))
    first = wait_for(lambda: len(kube.pods(ns, "story", 0)) == 2 and kube.pods(ns, "story", 0), what="attempt 0")
    wait_for(lambda: any(e.reason == "GangCreated" for e in events_of(kube, ns, "story")), what="GangCreated")
    kube.set_pod_phase(ns, first[0].metadata.name, "Failed", message="rank 0: boom", exit_code=1)
    second = wait_for(lambda: len(kube.pods(ns, "story", 1)) == 2 and kube.pods(ns, "story", 1), what="attempt 1")
    restarting = wait_for(lambda: [e for e in events_of(kube, ns, "story") if e.reason == "Restarting"],
                          what="a Restarting event")
    assert restarting[0].type == "Warning" and "boom" in restarting[0].message
    for pod in second:
        kube.set_pod_phase(ns, pod.metadata.name, "Running")

    def condition(kind: str) -> dict:
        return next((c for c in kube.status(ns, "story").get("conditions", []) if c["type"] == kind), {})

    wait_for(lambda: condition("Running").get("status") == "True", what="Running")
    assert condition("Restarting")["status"] == "False", "Restarting stayed True after the new gang ran"
    for pod in second:
        kube.set_pod_phase(ns, pod.metadata.name, "Succeeded")
    wait_for(lambda: kube.status(ns, "story").get("phase") == "Succeeded", what="Succeeded")
    assert condition("Running")["status"] == "False"
    wait_for(lambda: any(e.reason == "Completed" and e.type == "Normal" for e in events_of(kube, ns, "story")),
             what="a Completed event")


def test_an_old_method_name_runs_and_says_so_on_the_job(kube, ns, operator):
    kube.create_job(ns, "old-name", quick_spec(compression={"method": "overlap"}))
    wait_for(lambda: len(kube.pods(ns, "old-name")) == 2, what="pods")
    assert kube.status(ns, "old-name")["appliedSpec"]["compression"]["method"] == "tta"
    warned = wait_for(lambda: [e for e in events_of(kube, ns, "old-name") if e.reason == "DeprecatedSpec"],
                      what="a DeprecatedSpec event")
    assert warned[0].type == "Warning" and "'tta'" in warned[0].message


def condition_of(kube, ns: str, name: str, kind: str) -> dict:
    return next((c for c in kube.status(ns, name).get("conditions", []) if c["type"] == kind), {})


def test_a_suspended_job_has_no_pods_until_resumed_and_suspending_deletes_the_gang(kube, ns, operator):
    kube.create_job(ns, "queued", quick_spec(suspend=True))
    wait_for(lambda: kube.status(ns, "queued").get("phase") == "Suspended", what="Suspended")
    time.sleep(1.5)
    assert not kube.pods(ns, "queued")
    patch = {"spec": {"suspend": False}}
    kube.custom.patch_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", "queued", patch)
    pods = wait_for(lambda: len(kube.pods(ns, "queued", 0)) == 2 and kube.pods(ns, "queued", 0), what="the gang")
    st = kube.status(ns, "queued")
    assert st["phase"] == "Pending" and st["restarts"] == 0
    assert not condition_of(kube, ns, "queued", "SpecChangeRefused"), "suspend is the one field that may change"
    for pod in pods:
        kube.set_pod_phase(ns, pod.metadata.name, "Running")
    wait_for(lambda: kube.status(ns, "queued").get("phase") == "Running", what="Running")
    patch = {"spec": {"suspend": True}}
    kube.custom.patch_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", "queued", patch)
    wait_for(lambda: kube.status(ns, "queued").get("phase") == "Suspended" and not kube.pods(ns, "queued"),
             what="suspended, the gang deleted")
    assert condition_of(kube, ns, "queued", "Running")["status"] == "False"
    patch = {"spec": {"suspend": False}}
    kube.custom.patch_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", "queued", patch)
    wait_for(lambda: len(kube.pods(ns, "queued", 1)) == 2, what="a new gang, attempt 1")
    st = kube.status(ns, "queued")
    assert st["attempt"] == 1 and st["restarts"] == 0 and st["phase"] == "Pending"
    assert condition_of(kube, ns, "queued", "Suspended")["status"] == "False"


def test_a_gang_that_cannot_start_says_why_and_fails_after_the_pending_timeout(kube, ns, operator):
    kube.create_job(ns, "stuck", quick_spec(runPolicy={"pendingTimeoutSeconds": 4}))
    pods = wait_for(lambda: len(kube.pods(ns, "stuck")) == 2 and kube.pods(ns, "stuck"), what="pods")
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image netsense/worker"}}
    kube.core.patch_namespaced_pod_status(pods[1].metadata.name, ns, {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "trainer", "image": "netsense/worker", "imageID": "", "ready": False, "restartCount": 0,
         "state": waiting}]}})
    ready = wait_for(lambda: (c := condition_of(kube, ns, "stuck", "PodsReady")).get("status") == "False" and c,
                     what="PodsReady False")
    assert ready["message"].startswith("rank 1: trainer: ImagePullBackOff")
    st = wait_for(lambda: (s := kube.status(ns, "stuck")).get("phase") == "Failed" and s, timeout=20, what="Failed")
    assert st["reason"] == "PendingTimeout" and "ImagePullBackOff" in st["message"]
    wait_for(lambda: not kube.pods(ns, "stuck"), what="the gang deleted")


def test_the_gpu_sample_becomes_pods_the_api_server_accepts_with_its_template(kube, ns, operator):
    with open(os.path.join(REPO, "manifests", "samples", "paper-resnet18-steps.yaml")) as fh:
        doc = yaml.safe_load(fh)
    kube.create_job(ns, "gpu", {**doc["spec"], "podTemplate": {
        **doc["spec"]["podTemplate"], "metadata": {"labels": {"team": "ml"}, "annotations": {"owner": "ml-infra"}}}})
    pods = wait_for(lambda: len(kube.pods(ns, "gpu")) == 8 and kube.pods(ns, "gpu"), what="8 pods")
    for rank, pod in enumerate(pods):
        assert pod.metadata.labels["team"] == "ml" and pod.metadata.labels["netsense.dev/rank"] == str(rank)
        assert pod.metadata.annotations["owner"] == "ml-infra"
        trainer = pod.spec.containers[0]
        assert trainer.resources.limits["nvidia.com/gpu"] == "1"
        assert [(m.name, m.mount_path) for m in trainer.volume_mounts][-1] == ("data", "/data/cifar100")
        assert pod.spec.volumes[-1].persistent_volume_claim.claim_name == "cifar100"
        assert env_of(trainer)["NCCL_DEBUG"] == "WARN" and env_of(trainer)["RANK"] == str(rank)
        assert any(t.key == "nvidia.com/gpu" for t in pod.spec.tolerations)


def test_a_pod_the_api_server_refuses_fails_the_job_with_its_message_and_no_partial_gang(kube, ns, operator):
    template = {"spec": {"volumes": [{"name": "Not_A_Label", "emptyDir": {}}]}}  # the schema cannot see this
    kube.create_job(ns, "refused", quick_spec(podTemplate=template))
    st = wait_for(lambda: (s := kube.status(ns, "refused")).get("phase") == "Failed" and s, what="Failed")
    assert st["reason"] == "AdmissionRefused"
    assert "Not_A_Label" in st["message"] and "the API server refused Pod refused-a0-w0" in st["message"]
    time.sleep(1)
    assert not kube.pods(ns, "refused")


def test_unshaped_jobs_run_under_pod_security_restricted_and_shaped_ones_are_refused_with_the_reason(kube, operator):
    ns = f"restricted-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace({"metadata": {"name": ns, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    try:
        unshaped = quick_spec()
        del unshaped["network"]["profile"]
        kube.create_job(ns, "plain", unshaped)
        pods = wait_for(lambda: len(kube.pods(ns, "plain")) == 2 and kube.pods(ns, "plain"), what="admitted pods")
        assert all(p.spec.containers[0].security_context.run_as_non_root for p in pods)
        kube.create_job(ns, "shaped", quick_spec())
        st = wait_for(lambda: (s := kube.status(ns, "shaped")).get("phase") == "Failed" and s, what="Failed")
        assert st["reason"] == "AdmissionRefused" and "violates PodSecurity" in st["message"]
        assert "NET_ADMIN" in st["message"]
    finally:
        kube.delete_jobs(ns)


def test_a_trace_profile_larger_than_an_argument_may_be_reaches_the_pods(kube, ns, operator):
    points = [{"at": f"{i}s", "rate": f"{100 + i % 50}Mbit"} for i in range(6000)]
    kube.create_job(ns, "trace", quick_spec(network={"profile": {"type": "trace", "points": points}}))
    pods = wait_for(lambda: len(kube.pods(ns, "trace")) == 2 and kube.pods(ns, "trace"), what="pods")
    config = kube.core.read_namespaced_config_map("trace-job", ns)
    assert len(config.data["profile.json"]) > 128 * 1024  # more than one argument or variable may hold
    assert len(json.loads(config.data["profile.json"])["points"]) == 6000
    for pod in pods:
        sizes = [len(a) for c in pod.spec.containers + pod.spec.init_containers for a in c.command or []]
        sizes += [len(e.value or "") for c in pod.spec.containers for e in c.env or []]
        assert max(sizes) < 4096


def test_pod_phases_drive_the_job_and_the_result_lands_in_status(kube, ns, operator):
    kube.create_job(ns, "phases", quick_spec())
    pods = wait_for(lambda: len(kube.pods(ns, "phases")) == 2 and kube.pods(ns, "phases"), what="pods")
    for p in pods:
        kube.set_pod_phase(ns, p.metadata.name, "Running")
    wait_for(lambda: kube.status(ns, "phases").get("phase") == "Running", what="Running")
    result = {"job": "phases", "status": "Succeeded", "best_accuracy": 0.9311111111, "throughput_samples_per_s": 812.5,
              "target_accuracy": 0.95, "target_hold": 3, "time_to_accuracy_s": None, "target_reached": False,
              "accuracy_curve": [[10, 1.5, 0.93]]}
    kube.set_pod_phase(ns, pods[1].metadata.name, "Succeeded")
    kube.set_pod_phase(ns, pods[0].metadata.name, "Succeeded", message=json.dumps(result))
    st = wait_for(lambda: (s := kube.status(ns, "phases")).get("phase") == "Succeeded" and s, what="Succeeded")
    assert st["completionTime"] and st["workers"]["succeeded"] == 2
    assert any(c["type"] == "Succeeded" and c["status"] == "True" for c in st["conditions"])
    # Every key of the result, in the status's own naming, a missed target's null included.
    got = wait_for(lambda: kube.status(ns, "phases").get("result"), what="status.result")
    assert got == {"job": "phases", "status": "Succeeded", "bestAccuracy": 0.9311111111,
                   "throughputSamplesPerS": 812.5, "targetAccuracy": 0.95, "targetHold": 3,
                   "timeToAccuracyS": None, "targetReached": False, "accuracyCurve": [[10, 1.5, 0.93]]}
    reached = next(c for c in st["conditions"] if c["type"] == "TargetReached")
    assert reached["status"] == "False" and reached["reason"] == "NotReached"
    assert "0.95 was not held 3 evaluations in a row (best 0.931)" in reached["message"]
    assert st["bestAccuracy"] == 0.931 and "0.95 was not held" in st["message"]
    # kubectl get nsj: rounded, and the target's fate in a column of its own
    table = kube.printed("phases", ns)
    assert table["BEST-ACC"] == "0.931" and table["TARGET"] == "missed (best 0.931)"
    # a job too short for a read of its log still says how far it went and how fast
    assert table["PROGRESS"] == "done" and table["SAMPLES/S"] == "812.5", table


def test_a_failed_worker_restarts_the_gang_until_backoff_limit(kube, ns, operator):
    kube.create_job(ns, "flaky", quick_spec(runPolicy={"backoffLimit": 1}))
    first = wait_for(lambda: len(kube.pods(ns, "flaky", 0)) == 2 and kube.pods(ns, "flaky", 0), what="attempt 0")
    kube.set_pod_phase(ns, first[1].metadata.name, "Failed", message="rank 1: RuntimeError: NCCL timeout",
                       exit_code=1)
    second = wait_for(lambda: len(kube.pods(ns, "flaky", 1)) == 2 and kube.pods(ns, "flaky", 1), what="attempt 1")
    st = kube.status(ns, "flaky")
    assert st["restarts"] == 1 and st["attempt"] == 1
    restarting = next(c for c in st["conditions"] if c["type"] == "Restarting")
    assert "NCCL timeout" in restarting["message"]
    wait_for(lambda: not kube.pods(ns, "flaky", 0), what="attempt 0 deleted")
    kube.set_pod_phase(ns, second[0].metadata.name, "Failed", message="rank 0: out of memory", exit_code=137)
    st = wait_for(lambda: (s := kube.status(ns, "flaky")).get("phase") == "Failed" and s, what="Failed")
    assert st["reason"] == "BackoffLimitExceeded" and "out of memory" in st["message"]
    wait_for(lambda: not kube.pods(ns, "flaky"), what="pods deleted")


def test_the_operator_exports_jobs_by_phase_restarts_and_reconcile_latency(kube, ns, operator):
    kube.create_job(ns, "counted", quick_spec(runPolicy={"backoffLimit": 1}))
    pods = wait_for(lambda: len(kube.pods(ns, "counted", 0)) == 2 and kube.pods(ns, "counted", 0), what="pods")
    kube.set_pod_phase(ns, pods[0].metadata.name, "Failed", message="rank 0: boom", exit_code=1)
    wait_for(lambda: kube.status(ns, "counted").get("restarts") == 1, what="a restart")

    def value(text: str, series: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(series + " ")))

    text = wait_for(lambda: (t := operator.metrics()) and 'netsense_jobs{phase="Pending"}' in t and t,
                    what="jobs by phase")
    assert value(text, 'netsense_jobs{phase="Pending"}') >= 1
    assert value(text, "netsense_gang_restarts_total") >= 1
    assert value(text, "netsense_reconcile_seconds_count") > 0
    assert value(text, 'netsense_reconcile_seconds_bucket{le="+Inf"}') == value(text, "netsense_reconcile_seconds_count")


def test_keep_failed_pods_leaves_the_last_gang_for_inspection(kube, ns, operator):
    kube.create_job(ns, "kept", quick_spec(runPolicy={"backoffLimit": 0, "keepFailedPods": True}))
    pods = wait_for(lambda: len(kube.pods(ns, "kept")) == 2 and kube.pods(ns, "kept"), what="pods")
    kube.set_pod_phase(ns, pods[1].metadata.name, "Failed", message="rank 1: NaN loss", exit_code=1)
    wait_for(lambda: kube.status(ns, "kept").get("phase") == "Failed", what="Failed")
    time.sleep(1.5)
    assert [p.metadata.name for p in kube.pods(ns, "kept")] == [p.metadata.name for p in pods]


@pytest.mark.parametrize(("name", "network", "message"), [
    ("invalid", {"profile": {"type": "steps", "steps": [{"at": "5s", "rate": "1Gbit"}]}},
     "spec.network.profile.steps[0].at"),
    ("shared", {"topology": "shared", "profile": {"type": "static", "rate": "50Mbit"}, "crossTraffic": [{"type": "bulk"}]},
     "spec.network.topology: shared is the emulated cluster's switch"),  # valid locally; a cluster's network is real
])
def test_a_spec_the_schema_accepts_but_the_cluster_cannot_run_fails_without_pods(kube, ns, operator, name, network,
                                                                                   message):
    kube.create_job(ns, name, quick_spec(network=network))
    st = wait_for(lambda: (s := kube.status(ns, name)).get("phase") and s, what="a phase")
    assert st["phase"] == "Failed" and st["reason"] == "InvalidSpec"
    assert message in st["message"]
    time.sleep(1)
    assert not kube.pods(ns, name)


def test_a_spec_change_of_a_running_job_is_refused(kube, ns, operator):
    kube.create_job(ns, "immutable", quick_spec())
    wait_for(lambda: len(kube.pods(ns, "immutable")) == 2, what="pods")
    kube.custom.patch_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs", "immutable",
                                               {"spec": {"workers": 4}})
    cond = wait_for(lambda: next((c for c in kube.status(ns, "immutable").get("conditions", [])
                                  if c["type"] == "SpecChangeRefused"), None), what="SpecChangeRefused")
    assert "cannot change" in cond["message"]
    time.sleep(1)
    assert len(kube.pods(ns, "immutable")) == 2
    assert kube.status(ns, "immutable")["appliedSpec"]["workers"] == 2


def test_active_deadline_and_ttl(kube, ns, operator):
    kube.create_job(ns, "deadline", quick_spec(runPolicy={"activeDeadlineSeconds": 2, "ttlSecondsAfterFinished": 2}))
    st = wait_for(lambda: (s := kube.status(ns, "deadline")).get("phase") == "Failed" and s, timeout=20,
                  what="DeadlineExceeded")
    assert st["reason"] == "DeadlineExceeded"

    def gone():
        try:
            kube.job(ns, "deadline")
            return False
        except client.ApiException as e:
            return e.status == 404

    wait_for(gone, timeout=20, what="the TTL to delete the job")


def test_the_operator_identity_has_no_more_than_it_needs(kube, operator_kubeconfig):
    from support.kube import Kube

    restricted = Kube(operator_kubeconfig)
    with pytest.raises(client.ApiException) as e:
        restricted.core.list_namespaced_secret("default")
    assert e.value.status == 403
    with pytest.raises(client.ApiException) as e:
        restricted.core.list_namespaced_config_map("default")  # it makes and reads its own, by name
    assert e.value.status == 403
    with open(os.path.join(REPO, "manifests", "base", "rbac.yaml")) as fh:
        role = next(d for d in yaml.safe_load_all(fh) if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]


def test_fifty_jobs_at_once_all_get_pods_and_a_phase_within_60s_and_quiet_jobs_cost_no_listing(kube, operator):
    ns = kube.namespace("load")
    start = time.monotonic()
    for i in range(50):
        kube.create_job(ns, f"load-{i}", quick_spec(workers=1))

    def all_started():
        jobs = kube.custom.list_namespaced_custom_object("netsense.dev", "v1alpha1", ns, "netsensejobs")["items"]
        pods = kube.core.list_namespaced_pod(ns, label_selector="netsense.dev/job").items
        phased = sum(1 for j in jobs if (j.get("status") or {}).get("phase"))
        return phased == 50 and len(pods) == 50

    try:
        wait_for(all_started, timeout=60, interval=1, what="50 jobs with pods and a phase")
        assert time.monotonic() - start < 60
        # 50 Pending jobs reconciled every 0.5 s: listing each one's pods would be ~500 LISTs in 5 s. The
        # operator watches them instead (a watch that ends lists once when it resumes).
        before = kube.requests("LIST", "pods")
        time.sleep(5)
        assert kube.requests("LIST", "pods") - before <= 3
    finally:
        kube.delete_jobs(ns)


def test_the_status_shows_the_first_profile_step_until_training_starts():
    from netsense_operator.reconciler import _network_status
    from netsense_operator.status import last_progress

    from netsense.shaping.profiles import build_profile
    from netsense.spec import parse_spec

    job = parse_spec(quick_spec(network={"profile": {"type": "steps", "steps": [
        {"at": "0s", "rate": "1Gbit"}, {"at": "2s", "rate": "100Mbit"}]}}), "clock")
    profile = build_profile(job.network["profile"])
    assert _network_status(job, profile, None) == {"rate": "1Gbit", "step": 0, "profile": "steps"}  # pods starting
    # Rank 0's progress lines carry the clock the trainers agreed on.
    log = json.dumps({"event": "progress", "step": 40, "profile_epoch": time.time() - 3})
    epoch = last_progress(log)["profileEpoch"]
    assert _network_status(job, profile, epoch)["rate"] == "100Mbit"


def test_waiting_reasons_name_the_container_or_the_scheduler():
    from netsense_operator.status import waiting_reason

    unschedulable = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": "0/3 nodes: 3 Insufficient nvidia.com/gpu."}]}}
    assert waiting_reason(unschedulable) == "Unschedulable: 0/3 nodes: 3 Insufficient nvidia.com/gpu."
    crashing = {"status": {"initContainerStatuses": [{"name": "shaper", "state": {"waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off 10s"}}}], "containerStatuses": [
        {"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    assert waiting_reason(crashing) == "shaper: CrashLoopBackOff back-off 10s"
    assert waiting_reason({"status": {"containerStatuses": [{"name": "trainer", "state": {"waiting": {
        "reason": "ContainerCreating"}}}]}}) is None  # on its way: nothing to report


def test_a_local_run_refuses_suspend():
    from netsense.spec import SpecError, check_local, parse_spec

    with pytest.raises(SpecError, match="spec.suspend"):
        check_local(parse_spec({**quick_spec(), "suspend": True}))


def test_the_control_plane_dies_with_the_process_that_started_it(control_plane):
    """A CI timeout SIGKILLs the test run: etcd and kube-apiserver must not outlive it."""
    import subprocess
    import sys

    code = ("import time\nfrom support.envtest import ControlPlane\n"
            f"cp = ControlPlane({control_plane.bin_dir!r}).__enter__()\nprint(cp.dir, flush=True)\ntime.sleep(600)\n")
    with Watched.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                       cwd=os.path.join(REPO, "tests")) as parent:  # killed with its children if this fails
        workdir = parent.proc.stdout.readline().strip()
        try:
            wait_for(lambda: len(parent.processes()) == 2, timeout=30, what="etcd and kube-apiserver up")
            started = parent.processes()
            parent.proc.kill()
            parent.proc.wait()
            wait_for(lambda: not alive(started), timeout=10, what="etcd and kube-apiserver gone")
        finally:  # a SIGKILLed parent cannot remove its work directory (certificates, etcd's data): we do
            if workdir.startswith(os.path.join(tempfile.gettempdir(), "netsense-envtest-")):
                shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT-while-ignored"])
def test_the_standalone_control_plane_stops_on_sigterm_and_on_ctrl_c_even_when_started_ignoring_it(
        control_plane, sig):
    """`python -m support.envtest` under a supervisor (SIGTERM), or started by a script without job control
    (SIGINT ignored, inherited): either way nothing is left running."""
    import signal
    import subprocess
    import sys

    ignore_int = sig.startswith("SIGINT")
    with Watched.popen(
            [sys.executable, "-m", "support.envtest"], cwd=os.path.join(REPO, "tests"), stdout=subprocess.PIPE,
            text=True, env={**os.environ, "KUBEBUILDER_ASSETS": control_plane.bin_dir},
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_int else None) as cp:
        kubeconfig = cp.proc.stdout.readline().split("=", 1)[1].split()[0]
        workdir = os.path.dirname(kubeconfig)
        assert len(cp.processes()) == 2, "etcd and kube-apiserver should be up"
        cp.proc.send_signal(signal.SIGINT if ignore_int else signal.SIGTERM)
        assert cp.proc.wait(timeout=30) == 0
        assert not cp.leftovers() and not os.path.exists(workdir)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_kopf_dying_on_its_own_ends_the_operator_with_an_error_and_it_is_given_an_identity(monkeypatch):
    """kopf guesses its identity from the passwd entry of our UID, which the operator image's UID 65532
    lacks: it must be given one. And a kopf that stops unasked (that KeyError, say) must end the process
    with 1, so that the kubelet restarts it, not 0 with the lease handed back as after a clean stop."""
    import kopf
    from netsense_operator.main import run_operator

    seen = {}

    def dying_kopf(**kwargs):
        seen.update(kwargs)
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setenv("NETSENSE_LEADER_ELECTION", "false")
    monkeypatch.setattr(kopf, "run", dying_kopf)
    assert run_operator() == 1
    assert seen["identity"]
