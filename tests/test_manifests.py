"""Every manifest and overlay renders with kustomize and validates offline against
the Kubernetes schema; the pods the operator builds validate too."""

from __future__ import annotations

import os
import subprocess

import kubernetes_validate
import pytest
import yaml

from netsense.kube import resources as res
from netsense.spec import load_job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K8S_VERSION = "1.37.0"
OVERLAYS = ["manifests", "manifests/base", "manifests/overlays/kind", "manifests/overlays/gpu"]


@pytest.fixture(scope="module")
def kubectl():
    from netsense.testbed.envtest import EnvtestError, binaries_dir

    try:
        path = os.path.join(binaries_dir(build=True), "kubectl")
    except EnvtestError as e:
        if os.environ.get("CI"):
            pytest.fail(f"kubectl (built with the envtest binaries) is missing in CI: {e}")
        pytest.skip(f"no kubectl: {e}")
    return path


def validate(doc: dict) -> None:
    if doc["kind"] == "NetSenseJob":
        return  # validated against our CRD by the API-server tests
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomizations_render_and_validate(kubectl, overlay):
    out = subprocess.run([kubectl, "kustomize", os.path.join(REPO, overlay)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole", "ServiceAccount"} <= kinds
    for d in docs:
        validate(d)


def test_overlays_set_the_images():
    with open(os.path.join(REPO, "manifests/overlays/kind/kustomization.yaml")) as fh:
        kind = yaml.safe_load(fh)
    assert kind["images"] == [{"name": "netsense/operator", "newTag": "dev"}]
    assert "Never" in kind["patches"][0]["patch"]


def test_operator_built_pods_validate():
    for name in ("quick.yaml", "paper-resnet18-steps.yaml"):
        job = load_job(os.path.join(REPO, "samples", name))
        validate(res.service(job, "default", "uid-1"))
        for rank in range(job.workers):
            validate(res.worker_pod(job, "default", "uid-1", rank, 0))
