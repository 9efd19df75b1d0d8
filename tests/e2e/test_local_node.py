"""End to end on a real node (support.node): the operator as a Deployment, jobs as real pods.

What the envtest-level tests cannot show: images that start, the shaper sidecar shaping a pod's
link, DNS and the headless Service for the rendezvous, rank 0's result through a real termination
message, the garbage collector, the kubelet's own errors. Every step uses the real kubectl with
the commands the README gives. `make e2e` runs this file (it builds the node and the images first).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml
from support.kube import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.root]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(REPO, "manifests", "samples", "quick-local.yaml")
OPERATOR_NS = "netsense-system"
LABEL_JOB = "netsense.dev/job"
SHAPER = "netsense/shaper:dev"  # what the local overlay names (NETSENSE_SHAPER_IMAGE)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from support.node import LocalNode, leftovers

    log_dir = os.environ.get("NETSENSE_E2E_LOGS") or str(tmp_path_factory.mktemp("node-logs"))
    os.makedirs(log_dir, exist_ok=True)
    with LocalNode(log_dir=log_dir) as n:
        yield n
    left = {k: v for k, v in leftovers().items() if v}
    assert not left, f"the node left things behind: {left}"


@pytest.fixture(scope="module")
def kubectl(node):
    env = {**os.environ, "KUBECONFIG": node.kubeconfig, "PATH": f"{node.cp.bin_dir}:{os.environ['PATH']}"}

    def run(*args: str, check: bool = True, timeout: float = 300) -> str:
        proc = subprocess.run(["kubectl", *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}\n{proc.stdout[-2000:]}")
        return proc.stdout

    return run


def _get(kubectl, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json"))


def _job(kubectl, name: str) -> dict:
    return _get(kubectl, "nsj", name)


def _wait(what: str, predicate, timeout: float, every: float = 1.0):
    return wait_for(predicate, timeout, every, what)


def _job_pods(kubectl, name: str) -> list[dict]:
    return _get(kubectl, "pods", "-l", f"{LABEL_JOB}={name}")["items"]


def _apply_job(kubectl, tmp_path, name: str, **spec_changes) -> None:
    with open(SAMPLE) as fh:
        job = yaml.safe_load(fh)
    job["metadata"]["name"] = name
    for key, value in spec_changes.items():
        node = job["spec"]
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    kubectl("apply", "-f", str(path))


def _phase(kubectl, name: str) -> str | None:
    return (_job(kubectl, name).get("status") or {}).get("phase")


@pytest.fixture(scope="module")
def operator(kubectl):
    """What the README tells a user to type."""
    kubectl("apply", "-k", os.path.join(REPO, "manifests", "overlays", "local"))
    kubectl("wait", "--for=condition=Established", "crd/netsensejobs.netsense.dev", "--timeout=60s")
    kubectl("-n", OPERATOR_NS, "rollout", "status", "deploy/netsense-operator", "--timeout=180s")
    return kubectl


def test_quick_sample_runs_as_real_pods(operator):
    kubectl = operator
    kubectl("apply", "-f", SAMPLE)
    seen: dict[str, dict] = {}
    sidecar_started = False

    def done():
        nonlocal sidecar_started
        for pod in _job_pods(kubectl, "quick-digits"):
            seen[pod["metadata"]["name"]] = pod  # the last view of each pod before it goes
            sidecar_started |= any(c.get("started") for c in pod["status"].get("initContainerStatuses") or [])
        return _phase(kubectl, "quick-digits") in ("Succeeded", "Failed") and _phase(kubectl, "quick-digits")

    assert _wait("quick-digits to finish", done, 600, every=2) == "Succeeded", \
        json.dumps(_job(kubectl, "quick-digits").get("status"), indent=1)[:3000]
    job = _job(kubectl, "quick-digits")
    result = job["status"]["result"]  # rank 0's termination message, parsed by the operator (camelCase keys)
    assert result["workers"] == 2 and result["method"] == "tta" and result["bestAccuracy"] >= 0.9
    assert result["linkMeanRateMbit"] == pytest.approx(50, rel=0.01)
    reached = next(c for c in job["status"]["conditions"] if c["type"] == "TargetReached")
    assert reached["status"] == ("True" if result["timeToAccuracyS"] is not None else "False"), reached

    # The shaper started first and passed its startupProbe before the trainer started: the kubelet starts
    # a pod's containers only after its native sidecars' startup probes pass.
    assert len(seen) == 2
    for pod in seen.values():
        shaper, = pod["status"]["initContainerStatuses"]
        trainer, = pod["status"]["containerStatuses"]
        assert shaper["name"] == "shaper" and trainer["name"] == "trainer"
        shaper_start = next(iter(shaper["state"].values()))["startedAt"]
        trainer_start = trainer["state"]["terminated"]["startedAt"]
        assert shaper_start <= trainer_start and trainer["state"]["terminated"]["exitCode"] == 0, pod["status"]
    assert sidecar_started, "no view of a pod showed its shaper started (startupProbe passed)"

    table = kubectl("get", "nsj", "quick-digits")
    header, row = table.splitlines()[:2]
    assert header.split()[:9] == ["NAME", "PHASE", "METHOD", "WORKERS", "RATE", "PROGRESS", "SAMPLES/S", "BEST-ACC",
                                  "TARGET"], header
    assert "<none>" not in row and row.split()[1] == "Succeeded", row
    best, target = row.split()[-3:-1]  # ..., BEST-ACC, TARGET, AGE
    assert len(best.split(".")[1]) <= 3 and target in ("True", "False"), row  # rounded; the target's fate
    kubectl("delete", "-f", SAMPLE, "--wait=true")


def test_bad_image_is_a_condition_not_a_silent_pending(operator, tmp_path):
    kubectl = operator
    _apply_job(kubectl, tmp_path, "bad-image", image="netsense/does-not-exist:dev")

    def waiting():
        for cond in (_job(kubectl, "bad-image").get("status") or {}).get("conditions") or []:
            if cond["type"] == "PodsReady" and cond["status"] == "False":
                return cond
        return None

    cond = _wait("a PodsReady=False condition on bad-image", waiting, 120)
    assert "ErrImageNeverPull" in cond["message"], cond
    kubectl("delete", "nsj", "bad-image", "--wait=true")


def test_deleting_a_running_job_removes_its_pods_and_service(operator, tmp_path):
    kubectl = operator
    _apply_job(kubectl, tmp_path, "deleted", **{"training.epochs": 200})
    _wait("deleted to run", lambda: _phase(kubectl, "deleted") == "Running", 300)
    assert _get(kubectl, "svc", "-l", f"{LABEL_JOB}=deleted")["items"]
    t0 = time.monotonic()
    kubectl("delete", "nsj", "deleted", "--wait=false")
    _wait("the garbage collector to remove deleted's pods and Service",
          lambda: not _job_pods(kubectl, "deleted") and not _get(kubectl, "svc", "-l", f"{LABEL_JOB}=deleted")["items"]
          and not _get(kubectl, "configmap", "-l", f"{LABEL_JOB}=deleted")["items"], 120)
    print(f"\nE2E deleted job: pods, Service and ConfigMap gone in {time.monotonic() - t0:.1f}s")


def test_faults_while_running(operator, tmp_path):
    """A rank's pod deleted (a disruption, not the rank's failure): the gang restarts at once, not counted
    against backoffLimit, and the job still succeeds. The operator killed mid-job and started again (its
    Deployment): no duplicate pods."""
    kubectl = operator
    _apply_job(kubectl, tmp_path, "faults", **{"training.epochs": 12, "runPolicy.backoffLimit": 2})
    _wait("faults to run", lambda: _phase(kubectl, "faults") == "Running", 300)
    time.sleep(5)  # training, not only started
    victim = next(p["metadata"]["name"] for p in _job_pods(kubectl, "faults")
                  if p["metadata"]["labels"].get("netsense.dev/rank") == "1")
    t0 = time.monotonic()
    kubectl("delete", "pod", victim, "--wait=false")

    def restarted_and_running():
        status = _job(kubectl, "faults").get("status") or {}
        return status.get("attempt", 0) >= 1 and status.get("phase") == "Running"

    _wait("the gang to restart", restarted_and_running, 300)
    print(f"\nE2E rank deleted: gang running again after {time.monotonic() - t0:.1f}s")

    op = _get(kubectl, "-n", OPERATOR_NS, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
    assert len(op) == 1
    t0 = time.monotonic()
    kubectl("-n", OPERATOR_NS, "delete", "pod", op[0]["metadata"]["name"], "--grace-period=0", "--force")
    kubectl("-n", OPERATOR_NS, "rollout", "status", "deploy/netsense-operator", "--timeout=180s")
    print(f"E2E operator killed: a new one ready after {time.monotonic() - t0:.1f}s")
    peak = 0

    def finished():
        nonlocal peak
        live = [p for p in _job_pods(kubectl, "faults") if not p["metadata"].get("deletionTimestamp")]
        peak = max(peak, len(live))
        return _phase(kubectl, "faults") in ("Succeeded", "Failed") and _phase(kubectl, "faults")

    assert _wait("faults to finish", finished, 600, every=1) == "Succeeded", \
        json.dumps(_job(kubectl, "faults").get("status"), indent=1)[:3000]
    assert peak <= 2, f"{peak} live pods for a 2-worker job: the restarted operator duplicated the gang"
    final = _job(kubectl, "faults")["status"]
    assert (final["disruptions"], final["restarts"]) == (1, 0), final
    kubectl("delete", "nsj", "faults", "--wait=true")


def test_the_sidecar_shapes_a_pods_link_through_a_step(operator, tmp_path):
    """Two pods built as the operator builds a rank's (shaper sidecar, profile in a ConfigMap), the trainer's
    command replaced by a bulk transfer: the receiver counts what the sender's shaped eth0 lets through,
    40 Mbit/s and then, 6 s into the profile's clock, 10 Mbit/s."""
    from netsense_operator import resources

    from netsense.gang import PROFILE_START_ENV
    from netsense.spec.job import parse_job

    kubectl = operator
    with open(SAMPLE) as fh:
        doc = yaml.safe_load(fh)
    doc["metadata"]["name"] = "shape"
    doc["spec"]["network"]["profile"] = {"type": "steps", "steps": [{"at": "0s", "rate": "40Mbit"},
                                                                     {"at": "6s", "rate": "10Mbit"}]}
    job = parse_job(doc)
    config = resources.config_map(job, "default", "uid-shape")

    def pod(rank: int, script: str) -> dict:
        p = resources.worker_pod(job, "default", "uid-shape", rank, 0, shaper_image=SHAPER)
        # Not a job's pod: no owner (the garbage collector would take it), none of the operator's labels.
        p["metadata"].pop("ownerReferences")
        p["metadata"]["labels"] = {"app": "shape-measure"}
        trainer = next(c for c in p["spec"]["containers"] if c["name"] == "trainer")
        trainer["command"] = ["sh", "-c", script]
        return p

    config["metadata"].pop("ownerReferences")
    start_clock = f'date +%s.%N > "${{{PROFILE_START_ENV}}}"'
    rx = pod(0, "exec python -m netsense.emulation.bulk recv 5001 16")
    docs = [config, rx]
    (tmp_path / "rx.yaml").write_text(yaml.safe_dump_all(docs))
    kubectl("apply", "-f", str(tmp_path / "rx.yaml"))
    ip = _wait("the receiver's IP", lambda: _get(kubectl, "pod", rx["metadata"]["name"])["status"].get("podIP"), 120)
    # The clock's epoch goes to the log too: the receiver counts from the sender's connect, which comes a
    # Python start-up after the clock; on the receiver's count alone a slow start-up (over 0.5 s) would put
    # the step inside the "before" window.
    tx = pod(1, f'{start_clock} && cat "${{{PROFILE_START_ENV}}}" && exec python -m netsense.emulation.bulk send {ip} 5001 14')
    (tmp_path / "tx.yaml").write_text(yaml.safe_dump(tx))
    kubectl("apply", "-f", str(tmp_path / "tx.yaml"))
    _wait("the transfer", lambda: _get(kubectl, "pod", rx["metadata"]["name"])["status"].get("phase")
          in ("Succeeded", "Failed"), 180)
    out = json.loads(kubectl("logs", rx["metadata"]["name"], "-c", "trainer").strip().splitlines()[-1])
    from netsense.emulation.bulk import rate_between

    epoch = float(kubectl("logs", tx["metadata"]["name"], "-c", "trainer").split()[0])
    clock = epoch - out["start"]  # the profile's t=0 on the receiver's bins
    before = rate_between(out, max(0.0, clock + 1.0), clock + 5.0) / 1e6
    after = rate_between(out, clock + 8.0, clock + 13.0) / 1e6
    print(f"\nE2E shaped pod link: {before:.1f} Mbit/s before the step (profile 40), {after:.1f} after (10); "
          f"the sender connected {-clock:.2f} s into the profile's clock")
    assert before == pytest.approx(40, rel=0.15) and after == pytest.approx(10, rel=0.15), out
    kubectl("delete", "-f", str(tmp_path / "tx.yaml"), "-f", str(tmp_path / "rx.yaml"), "--wait=true")
