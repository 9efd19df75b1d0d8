import os
import uuid

import pytest

# tests/support (the control plane, the kubelet stand-in, spawned ranks) is imported as `support`: pytest
# puts tests/ on sys.path (rootdir-relative "prepend" imports), so no path editing here.

IS_ROOT = os.geteuid() == 0


# Fixtures that need the envtest binaries (kube-apiserver, etcd, kubectl: built from Go modules).
APISERVER_FIXTURES = {"control_plane", "kube", "operator", "operator_kubeconfig", "kubectl"}


def _names(code) -> set[str]:
    """The global names a function's code uses, its comprehensions' and inner functions' included."""
    return set(code.co_names).union(*(_names(c) for c in code.co_consts if hasattr(c, "co_names")))


def pytest_collection_modifyitems(config, items):
    # What a test needs, read off the test itself where a marker could be forgotten: a test that spawns gloo
    # ranks (support.ranks.run_world), or takes a fixture that needs the envtest binaries.
    for item in items:
        code = getattr(getattr(item, "function", None), "__code__", None)
        if code is not None and "run_world" in _names(code):
            item.add_marker(pytest.mark.gloo)
        if APISERVER_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.apiserver)
    # The API-server tests last: their etcd, kube-apiserver and operator (reconciling every 0.5 s) live for
    # the rest of the session (session fixtures), and nothing should share the two cores with the bulk-TCP
    # rates the shaping and bottleneck tests measure.
    items.sort(key=lambda item: "control_plane" in item.fixturenames)  # stable: the rest keep their order
    if IS_ROOT:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("CI must run the suite as root: its network-namespace and tc tests would be skipped")
    skip = pytest.mark.skip(reason="needs root (network namespaces and tc); run the suite as root, as CI does")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """etcd + kube-apiserver (envtest-style), with the NetSenseJob CRD installed."""
    from support import unavailable
    from support.envtest import ControlPlane, EnvtestError, binaries_dir, install_crd

    try:
        bins = binaries_dir(build=True)
    except EnvtestError as e:
        unavailable(f"the envtest binaries are missing (make envtest): {e}")
    with ControlPlane(bins, log_dir=str(tmp_path_factory.mktemp("envtest-logs"))) as cp:
        install_crd(cp.kubeconfig)
        cp.bin_dir = bins
        yield cp


@pytest.fixture(scope="session")
def kube(control_plane):
    from support.kube import Kube

    return Kube(control_plane.kubeconfig)


@pytest.fixture(scope="session")
def operator_kubeconfig(control_plane, kube):
    """The operator's identity: a ServiceAccount token with exactly manifests/base/rbac.yaml, fenced by
    manifests/base/admission-policy.yaml (every operator test runs inside the fence)."""
    from support.kube import REPO

    for name in ("namespace.yaml", "rbac.yaml", "admission-policy.yaml"):
        kube.apply_file(os.path.join(REPO, "manifests", "base", name))
    kube.roomy_node()  # gangs are admitted against the nodes' free room (gate.py): one with room for every test's
    return control_plane.token_kubeconfig("netsense-operator", "netsense-system")


@pytest.fixture(scope="session")
def operator(operator_kubeconfig, tmp_path_factory):
    from support.kube import OperatorProcess

    op = OperatorProcess(operator_kubeconfig, str(tmp_path_factory.mktemp("operator") / "operator.log")).start()
    yield op
    op.stop()


@pytest.fixture
def ns(kube):
    """A namespace of this test's own; its jobs are deleted after it (a job left Pending would be reconciled
    for the rest of the session)."""
    name = kube.namespace(f"t-{uuid.uuid4().hex[:8]}")
    yield name
    kube.delete_jobs(name)


@pytest.fixture
def nothing_left_behind():
    """The test's network namespaces are gone after it (a failure or an exception included)."""
    from support.procs import leaked_namespaces, ours

    before = ours()
    yield
    assert not leaked_namespaces(before), "namespaces left behind"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the item (item.rep_setup, rep_call), for fixtures that explain a failure."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def pytest_configure(config):
    # Registered here, not in pyproject.toml (whose hash keys the venv): make kind-e2e's tests (tests/e2e/test_kind.py).
    config.addinivalue_line("markers", "kind: needs the multi-node kind cluster of make kind-e2e; also marked e2e")
