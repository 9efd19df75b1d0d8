"""Every manifest and overlay renders with kustomize and validates offline against
the Kubernetes schema; the pods the operator builds validate too."""

from __future__ import annotations

import glob
import os
import re
import subprocess

import kubernetes_validate
import pytest
import yaml
from netsense_operator import resources as res
from support import REPO, unavailable

from netsense.spec import load_job
from netsense.spec.job import DEFAULT_IMAGE

K8S_VERSION = "1.37.0"
OVERLAYS = ["manifests", "manifests/base", "manifests/overlays/local", "manifests/overlays/gpu",
            "manifests/overlays/namespaced"]


@pytest.fixture(scope="module")
def kubectl():
    from support.envtest import EnvtestError, binaries_dir

    try:
        path = os.path.join(binaries_dir(build=True), "kubectl")
    except EnvtestError as e:
        unavailable(f"kubectl (built with the envtest binaries) is missing: {e}")
    return path


def validate(doc: dict) -> None:
    if doc["kind"] == "NetSenseJob":
        return  # validated against our CRD by the API-server tests
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def render(kubectl: str, overlay: str) -> list[dict]:
    out = subprocess.run([kubectl, "kustomize", os.path.join(REPO, overlay)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict], kind: str, namespace: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (namespace is None or d["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"{len(found)} {kind} in {namespace}"
    return found[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomizations_render_and_validate(kubectl, overlay):
    docs = render(kubectl, overlay)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= kinds
    bindings = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert ("netsense-operator" in bindings) != overlay.endswith("namespaced")
    for d in docs:
        validate(d)


def test_the_namespaced_install_binds_the_one_list_of_rules_in_its_namespace_only(kubectl):
    """One RBAC source: the namespaced install binds base/rbac.yaml's ClusterRole with a RoleBinding (rights in
    that namespace alone) and has no ClusterRoleBinding, so it reads no pod or log elsewhere."""
    cluster_wide = next(d for d in render(kubectl, "manifests/base")
                        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "netsense-operator")
    docs = render(kubectl, "manifests/overlays/namespaced")
    assert cluster_wide in docs
    binding = one(docs, "RoleBinding", "ml-team")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": cluster_wide["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "netsense-operator",
                                    "namespace": "netsense-system"}]
    # Cluster-wide, it may only read nodes (is a rank's node lost?).
    bound = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert [b["roleRef"]["name"] for b in bound] == ["netsense-operator-nodes"]
    nodes_role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "netsense-operator-nodes")
    assert nodes_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "ml-team"]
    command = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--namespace") + 1] == "ml-team"


def test_the_admission_policy_is_generated_from_the_fences_table():
    from netsense.spec.fence import HEADER, admission_policies

    with open(os.path.join(REPO, "manifests", "base", "admission-policy.yaml")) as fh:
        text = fh.read()
    assert text.startswith(HEADER)
    assert [d for d in yaml.safe_load_all(text) if d] == admission_policies(), \
        "run `make manifests` to regenerate manifests/base/admission-policy.yaml"


def test_every_file_a_kustomization_names_exists():
    for overlay in OVERLAYS:
        path = os.path.join(REPO, overlay, "kustomization.yaml")
        with open(path) as fh:
            text = fh.read()
        for ref in re.findall(r"manifests/[\w./-]+\.yaml", text):
            assert os.path.exists(os.path.join(REPO, ref)), f"{overlay}/kustomization.yaml names {ref}"


@pytest.mark.parametrize("sample", sorted(glob.glob(os.path.join(REPO, "manifests", "samples", "paper-*.yaml"))))
def test_gpu_samples_build_pods_that_reach_their_data_and_their_gpu(sample):
    job = load_job(sample)
    pod = res.worker_pod(job, "default", "uid-1", 3, 0)
    validate(pod)
    trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    mounts = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
    assert any(job.training["dataPath"].startswith(path) for path in mounts.values()), "dataPath is not mounted"
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert set(mounts) <= volumes
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "1"  # a quantity: a string, as the API has it
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["RANK"] == "3" and env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_DEBUG"] == "WARN"
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])


@pytest.mark.parametrize("overlay, operator, shaper, worker", [
    ("manifests/base", "netsense/operator:{v}", "netsense/shaper:{v}", "/worker"),
    ("manifests/overlays/local", "netsense/operator:dev", "netsense/shaper:dev", "/worker"),
    ("manifests/overlays/gpu", "registry.example.com/netsense/operator:{v}", "registry.example.com/netsense/shaper:{v}",
     "/worker-cuda"),
])
def test_overlays_set_the_operator_shaper_and_worker_images(kubectl, overlay, operator, shaper, worker):
    with open(os.path.join(REPO, "pyproject.toml")) as fh:
        version = re.search(r'^version = "(.+)"', fh.read(), re.M).group(1)
    container = one(render(kubectl, overlay), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == operator.format(v=version)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NETSENSE_SHAPER_IMAGE"] == shaper.format(v=version)
    # the trainer's image of a job that names none: this install's worker (not a CRD default no registry serves)
    assert env["NETSENSE_WORKER_IMAGE"] == shaper.format(v=version).replace("/shaper", worker)
    # The operator's own defaults carry the same version as what is installed.
    assert res.SHAPER_IMAGE == f"netsense/shaper:{version}" and DEFAULT_IMAGE == f"netsense/worker:{version}"


def test_shaped_pods_run_the_shaper_image_the_operator_is_given():
    job = load_job(os.path.join(REPO, "samples", "quick.yaml"))
    pod = res.worker_pod(job, "default", "uid-1", 0, 0, "registry.example.com/netsense/shaper@sha256:" + "0" * 64)
    shaper = pod["spec"]["initContainers"][0]
    assert shaper["name"] == "shaper" and shaper["image"].endswith("@sha256:" + "0" * 64)
    assert pod["spec"]["containers"][0]["image"] == DEFAULT_IMAGE  # the job names none
    validate(pod)
    named = res.worker_pod(load_job(os.path.join(REPO, "manifests", "samples", "quick-local.yaml")), "d", "u", 0, 0,
                           worker_image="registry.example.com/netsense/worker:9")
    assert named["spec"]["containers"][0]["image"] == "netsense/worker:dev"  # the job's own wins
    unnamed = res.worker_pod(job, "d", "u", 0, 0, worker_image="registry.example.com/netsense/worker:9")
    assert unnamed["spec"]["containers"][0]["image"] == "registry.example.com/netsense/worker:9"


def test_a_gang_that_names_a_kueue_queue_is_one_kueue_pod_group_an_attempt():
    """Kueue's plain-pod integration admits pods one by one unless they name a group: a part of a gang admitted
    would hold quota waiting for the rest. Named once per attempt, with the gang's size; nothing for a job that
    names no queue."""
    from netsense.spec.job import parse_job

    with open(os.path.join(REPO, "samples", "quick.yaml")) as fh:
        doc = yaml.safe_load(fh)
    plain = parse_job(doc)
    doc["spec"]["podTemplate"] = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}}}
    queued = parse_job(doc)
    pods = [res.worker_pod(queued, "d", "0f4c4a7e-2b55-4b1e-9d7e-4c1c9b1f5a11", rank, attempt)
            for attempt in (0, 1) for rank in range(queued.workers)]
    groups = [p["metadata"]["labels"][res.KUEUE_GROUP] for p in pods]
    assert len(set(groups[:2])) == 1 and len(set(groups[2:])) == 1 and groups[0] != groups[2], groups
    assert all(len(g) <= 63 for g in groups)
    assert {p["metadata"]["annotations"][res.KUEUE_GROUP_COUNT] for p in pods} == {str(queued.workers)}
    assert all(p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" for p in pods)
    for p in pods:
        validate(p)
    bare = res.worker_pod(plain, "d", "u", 0, 0)
    assert res.KUEUE_GROUP not in bare["metadata"]["labels"]
    assert res.KUEUE_GROUP_COUNT not in bare["metadata"].get("annotations", {})


def test_operator_built_pods_validate():
    for name in ("quick.yaml", "paper-resnet18-steps.yaml"):
        job = load_job(os.path.join(REPO, "samples", name))
        validate(res.service(job, "default", "uid-1"))
        for rank in range(job.workers):
            validate(res.worker_pod(job, "default", "uid-1", rank, 0))


def test_the_operator_and_the_shaper_sidecar_never_import_torch():
    """Their images have no torch (images/operator.Dockerfile, images/shaper.Dockerfile): an import of it
    anywhere on their paths would fail only there, at a user's first kubectl apply."""
    import sys

    code = ("import sys, netsense_operator.handlers, netsense_operator.main, netsense.cli, netsense.shaping.shaper, "
            "netsense.shaping.queue, netsense.shaping.tc; "
            "sys.exit('torch imported' if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
