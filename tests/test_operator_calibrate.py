"""A calibrate job and a tta job that reads its profile, against a real kube-apiserver + etcd with the operator's
own RBAC and admission policy (the tests play kubelet): the calibration's one pod, its profile from the pod's
termination message into the ConfigMap <job>-penalties, the mount of that ConfigMap into a tta job's workers, and
the refusals, each naming spec.compression.penalties."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client
from support.kube import quick_spec, wait_for

PROFILE = {"netsense_penalties": 1, "job": "cal", "model": "mlp", "dataset": "digits", "workers": 2,
           "milestone": {"loss": 0.64817, "smoothing": "trailing mean of 20 steps", "dense_steps": {"0": 160, "1": 150}},
           "seeds": [0, 1], "interval_level": 0.95, "cost": {"wall_seconds": 212.4, "steps": 3880, "runs": 16},
           "topk": {"0.01": {"steps_factor": 1.31, "interval": [0.9, 1.9], "steps": {"0": 210, "1": 196}, "budget": 200},
                    "0.001": {"steps_factor": 3.2, "interval": None, "lower_bound": True, "steps": {"0": None, "1": None},
                              "budget": 800}},
           "powersgd": {"2": {"steps_factor": 1.12, "interval": [1.0, 1.3], "steps": {"0": 180, "1": 168},
                              "budget": 200}}}


def calibrate_spec(**over) -> dict:
    return quick_spec(mode="calibrate", calibration={"seeds": 2, "steps": 200}, **over)


def status_of(kube, ns: str, name: str, phase: str) -> dict:
    return wait_for(lambda: (s := kube.status(ns, name)).get("phase") == phase and s, what=f"phase {phase}")


def test_a_calibrate_job_is_one_confined_pod_of_the_worker_image_running_netsense_calibrate(kube, ns, operator):
    job = kube.create_job(ns, "cal", calibrate_spec(compression={"method": "tta", "penalties": "configmap:older"}))
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    time.sleep(1)  # several reconciles later: still one pod (a gang of job.workers would have made 2)
    assert [p.metadata.name for p in kube.pods(ns, "cal")] == ["cal-a0-w0"]
    assert pod.metadata.owner_references[0].uid == job["metadata"]["uid"]
    assert pod.metadata.labels["app.kubernetes.io/component"] == "calibrate"
    assert not pod.spec.init_containers  # no shaper: the runs are simulated, on the pod's loopback
    (trainer,) = pod.spec.containers
    assert trainer.command == ["netsense", "calibrate", "/etc/netsense/job.json", "--out", "/tmp/netsense-calibrate",
                               "--termination-log", "/dev/termination-log"]
    assert trainer.termination_message_path == "/dev/termination-log" and not trainer.ports
    sc = trainer.security_context
    assert sc.run_as_non_root and sc.run_as_user == 65532 and sc.allow_privilege_escalation is False
    assert sc.capabilities.drop == ["ALL"] and not sc.capabilities.add
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.spec.automount_service_account_token is False and pod.spec.restart_policy == "Never"
    assert [v.name for v in pod.spec.volumes] == ["netsense-job"]  # a calibration reads no profile
    spec = json.loads(kube.core.read_namespaced_config_map("cal-job", ns).data["job.json"])["spec"]
    assert spec["mode"] == "calibrate" and "penalties" not in spec["compression"]
    with pytest.raises(client.ApiException) as e:  # no rendezvous: nothing to meet
        kube.core.read_namespaced_service("cal-rdzv", ns)
    assert e.value.status == 404
    st = kube.status(ns, "cal")
    assert st["phase"] == "Pending" and st["workers"]["total"] == 1 and "network" not in st


def test_a_finished_calibration_leaves_its_profile_in_a_configmap_the_job_owns_and_a_summary_in_status(
        kube, ns, operator):
    job = kube.create_job(ns, "cal", calibrate_spec())
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    kube.set_pod_phase(ns, pod.metadata.name, "Running")
    status_of(kube, ns, "cal", "Running")
    kube.set_pod_phase(ns, pod.metadata.name, "Succeeded", message=json.dumps(PROFILE, separators=(",", ":")))
    st = status_of(kube, ns, "cal", "Succeeded")
    assert st["reason"] == "Calibrated"
    assert "spec.compression.penalties: configmap:cal-penalties" in st["message"]
    cm = kube.core.read_namespaced_config_map("cal-penalties", ns)
    assert json.loads(cm.data["penalties.json"]) == PROFILE
    (owner,) = cm.metadata.owner_references  # collected with the job: nothing outlives it
    assert owner.uid == job["metadata"]["uid"] and owner.controller and owner.kind == "NetSenseJob"
    assert cm.metadata.labels["netsense.dev/job-uid"] == job["metadata"]["uid"]
    assert cm.metadata.labels["app.kubernetes.io/component"] == "penalties"
    cal = st["calibration"]
    assert cal["configMap"] == "cal-penalties" and cal["costSeconds"] == 212.4 and cal["costSteps"] == 3880
    assert cal["factors"] == {"topk": {"0.01": 1.31, "0.001": 3.2}, "powersgd": {"2": 1.12}}
    assert cal["lowerBounds"] == ["topk 0.001"] and cal["milestoneLoss"] == 0.64817
    assert "topk 0.001 >3.20x" in cal["summary"] and "cost 212.4 s" in cal["summary"]


def test_a_calibration_that_fails_is_failed_with_its_reason_and_leaves_no_profile(kube, ns, operator):
    kube.create_job(ns, "cal", calibrate_spec(runPolicy={"backoffLimit": 0}))
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    kube.set_pod_phase(ns, pod.metadata.name, "Failed", exit_code=1,
                       message="calibration failed: calibration run dense-s0-b200 failed: NaN loss")
    st = status_of(kube, ns, "cal", "Failed")
    assert "calibration run dense-s0-b200 failed: NaN loss" in st["message"], st
    with pytest.raises(client.ApiException) as e:
        kube.core.read_namespaced_config_map("cal-penalties", ns)
    assert e.value.status == 404


def test_a_termination_message_that_is_not_a_profile_fails_the_calibration(kube, ns, operator):
    kube.create_job(ns, "cal", calibrate_spec())
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    kube.set_pod_phase(ns, pod.metadata.name, "Succeeded", message='{"netsense_penalties": 1, "topk": {}}')
    st = status_of(kube, ns, "cal", "Failed")
    assert st["reason"] == "CalibrationUnreadable" and "no measured topk options" in st["message"], st
    with pytest.raises(client.ApiException):
        kube.core.read_namespaced_config_map("cal-penalties", ns)


def _profile_map(kube, ns: str, name: str, data: dict) -> None:
    kube.core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": data})


def test_a_tta_job_naming_a_configmap_gets_it_read_only_and_its_workers_read_a_local_file(kube, ns, operator):
    _profile_map(kube, ns, "mine", {"penalties.json": json.dumps(PROFILE)})  # a user's own (kubectl create configmap)
    kube.create_job(ns, "tta", quick_spec(compression={"method": "tta", "penalties": "configmap:mine"}))
    pods = wait_for(lambda: len(kube.pods(ns, "tta")) == 2 and kube.pods(ns, "tta"), what="the gang")
    for pod in pods:
        (volume,) = [v for v in pod.spec.volumes if v.name == "netsense-penalties"]
        assert volume.config_map.name == "mine"
        assert [(i.key, i.path) for i in volume.config_map.items] == [("penalties.json", "penalties.json")]
        (mount,) = [m for m in pod.spec.containers[0].volume_mounts if m.name == "netsense-penalties"]
        assert mount.mount_path == "/etc/netsense-penalties" and mount.read_only
        assert all(m.name != "netsense-penalties" for m in pod.spec.init_containers[0].volume_mounts)  # not the shaper's
    spec = json.loads(kube.core.read_namespaced_config_map("tta-job", ns).data["job.json"])["spec"]
    assert spec["compression"]["penalties"] == "/etc/netsense-penalties/penalties.json"
    assert kube.status(ns, "tta")["appliedSpec"]["compression"]["penalties"] == "configmap:mine"


def test_a_calibrate_job_then_a_tta_job_on_its_profile(kube, ns, operator):
    kube.create_job(ns, "cal", calibrate_spec())
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    kube.set_pod_phase(ns, pod.metadata.name, "Succeeded", message=json.dumps(PROFILE))
    status_of(kube, ns, "cal", "Succeeded")
    kube.create_job(ns, "tta", quick_spec(compression={"method": "tta", "penalties": "configmap:cal-penalties"}))
    pods = wait_for(lambda: len(kube.pods(ns, "tta")) == 2 and kube.pods(ns, "tta"), what="the gang")
    assert all(any(v.config_map and v.config_map.name == "cal-penalties" for v in p.spec.volumes) for p in pods)


def _condition(status: dict, kind: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def test_a_tta_job_applied_with_its_calibration_waits_for_the_profile_then_runs(kube, ns, operator):
    """A calibrate job and the tta job that reads its profile, applied together: the tta job waits (Pending, no
    pod, PodsReady False naming the calibration) until the ConfigMap is written, then makes its gang."""
    kube.create_job(ns, "cal", calibrate_spec())
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    kube.set_pod_phase(ns, pod.metadata.name, "Running")
    running = status_of(kube, ns, "cal", "Running")
    assert _condition(running, "Running")["message"] == "the calibration pod running"
    kube.create_job(ns, "tta", quick_spec(compression={"method": "tta", "penalties": "configmap:cal-penalties"}))
    st = wait_for(lambda: _condition(s := kube.status(ns, "tta"), "PodsReady").get("reason") == "WaitingForCalibration"
                  and s, what="waiting for the calibration")
    assert st["phase"] == "Pending" and "calibrate job cal" in _condition(st, "PodsReady")["message"]
    time.sleep(1)  # two reconcile intervals: still waiting, nothing made
    assert not kube.pods(ns, "tta") and kube.status(ns, "tta")["phase"] == "Pending"
    kube.set_pod_phase(ns, pod.metadata.name, "Succeeded", message=json.dumps(PROFILE))
    pods = wait_for(lambda: len(kube.pods(ns, "tta")) == 2 and kube.pods(ns, "tta"), what="the gang")
    assert all(any(v.config_map and v.config_map.name == "cal-penalties" for v in p.spec.volumes) for p in pods)


def test_a_tta_job_waiting_for_a_calibration_that_fails_fails_naming_the_field(kube, ns, operator):
    kube.create_job(ns, "cal", calibrate_spec(runPolicy={"backoffLimit": 0}))
    (pod,) = wait_for(lambda: kube.pods(ns, "cal"), what="the calibration pod")
    kube.create_job(ns, "tta", quick_spec(compression={"method": "tta", "penalties": "configmap:cal-penalties"}))
    wait_for(lambda: _condition(kube.status(ns, "tta"), "PodsReady").get("reason") == "WaitingForCalibration",
             what="waiting for the calibration")
    kube.set_pod_phase(ns, pod.metadata.name, "Failed", exit_code=1, message="calibration failed")
    st = status_of(kube, ns, "tta", "Failed")
    assert st["reason"] == "InvalidSpec" and st["message"].startswith("spec.compression.penalties: ConfigMap "
                                                                      "cal-penalties does not exist")
    assert not kube.pods(ns, "tta")


@pytest.mark.parametrize("data, why", [
    (None, "ConfigMap gone does not exist in namespace"),
    ({"profile.json": "{}"}, "ConfigMap gone has no key penalties.json (keys: profile.json)"),
    ({"penalties.json": "{not json"}, "penalties.json is not a penalties profile"),
    ({"penalties.json": json.dumps({**PROFILE, "powersgd": {}})}, "no measured powersgd options"),
])
def test_a_tta_job_whose_configmap_cannot_serve_it_fails_naming_the_field_and_makes_no_pod(kube, ns, operator, data,
                                                                                           why):
    if data is not None:
        _profile_map(kube, ns, "gone", data)
    kube.create_job(ns, "tta", quick_spec(compression={"method": "tta", "penalties": "configmap:gone"}))
    st = status_of(kube, ns, "tta", "Failed")
    assert st["reason"] == "InvalidSpec" and st["message"].startswith("spec.compression.penalties: ")
    assert why in st["message"], st["message"]
    assert not kube.pods(ns, "tta")


def test_a_local_penalties_file_is_refused_on_a_cluster_naming_the_field(kube, ns, operator):
    kube.create_job(ns, "tta", quick_spec(compression={"method": "tta", "penalties": "runs/penalties.json"}))
    st = status_of(kube, ns, "tta", "Failed")
    assert st["reason"] == "InvalidSpec" and "spec.compression.penalties: a penalties file is read locally" in \
        st["message"] and "configmap:NAME" in st["message"]
    assert not kube.pods(ns, "tta")


@pytest.mark.parametrize("spec, message", [
    ({"compression": {"method": "tta", "penalties": "configmap:Not_A_Name"}}, "configmap:NAME names a ConfigMap"),
    ({"mode": "calibrating"}, 'spec.mode: Unsupported value: "calibrating"'),
    ({"calibration": {"seeds": 20}}, "spec.calibration.seeds"),
])
def test_the_server_refuses_a_bad_calibration_or_reference_at_admission(kube, ns, spec, message):
    with pytest.raises(client.ApiException) as e:
        kube.create_job(ns, "bad", quick_spec(**spec))
    assert e.value.status == 422
    assert message in json.loads(e.value.body)["message"]
