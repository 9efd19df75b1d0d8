"""End to end on a real node (support.node): the operator as a Deployment, jobs as real pods.

What the envtest-level tests cannot show: images that start, the shaper sidecar shaping a pod's
link, DNS and the headless Service for the rendezvous, rank 0's result through a real termination
message, the garbage collector, the kubelet's own errors. Every step uses the real kubectl with
the commands the README gives. `make e2e` runs this file (it builds the node and the images first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml
from support import REPO
from support.kube import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.root]

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


def kubectl_in(env: dict):
    """kubectl with this environment (its KUBECONFIG, its PATH): stdout, or an AssertionError with its stderr."""

    def run(*args: str, check: bool = True, timeout: float = 300) -> str:
        proc = subprocess.run(["kubectl", *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}\n{proc.stdout[-2000:]}")
        return proc.stdout

    return run


def deploy_operator(kubectl) -> None:
    """What the README tells a user to type: the local overlay, its CRD established, the operator rolled out."""
    kubectl("apply", "-k", os.path.join(REPO, "manifests", "overlays", "local"))
    kubectl("wait", "--for=condition=Established", "crd/netsensejobs.netsense.dev", "--timeout=60s")
    kubectl("-n", OPERATOR_NS, "rollout", "status", "deploy/netsense-operator", "--timeout=180s")


@pytest.fixture(scope="module")
def kubectl(node):
    return kubectl_in({**os.environ, "KUBECONFIG": node.kubeconfig, "PATH": f"{node.cp.bin_dir}:{os.environ['PATH']}"})


_explained: dict = {}  # the running test's kubectl, and whether its failure has been explained already


@pytest.fixture(autouse=True)
def _explain_a_failure(request):
    """On a failed test, what a person would look at first, in the test's report (CI keeps only the output).
    A wait that times out explains at once, before the test's own clean-up removes what it was waiting for."""
    _explained.clear()
    if "kubectl" in request.fixturenames:
        _explained["kubectl"] = request.getfixturevalue("kubectl")
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        _explain()
    _explained.clear()


def _explain() -> None:
    """Every job's phase and conditions, the pods, the last events, the operator's last log lines."""
    kubectl = _explained.get("kubectl")
    if kubectl is None or _explained.get("done"):
        return
    _explained["done"] = True
    print("\n---- why it may have failed ----")
    try:
        for job in _get(kubectl, "nsj", "-A")["items"]:
            s = job.get("status") or {}
            print(f"nsj {job['metadata']['namespace']}/{job['metadata']['name']}: {s.get('phase')} "
                  f"{s.get('reason', '')} {s.get('message', '')}")
            for c in s.get("conditions", []):
                print(f"  {c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')[:300]}")
        print(kubectl("get", "pods", "-A", "-o", "wide", check=False)[-3000:])
        print(kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)[-4000:])
        print(kubectl("-n", OPERATOR_NS, "logs", "deploy/netsense-operator", "--tail=60", check=False)[-6000:])
    except Exception as e:  # the cluster itself may be what failed
        print(f"(could not read the cluster: {e})")


def _get(kubectl, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json"))


def _job(kubectl, name: str) -> dict:
    return _get(kubectl, "nsj", name)


def _wait(what: str, predicate, timeout: float, every: float = 1.0):
    try:
        return wait_for(predicate, timeout, every, what)
    except AssertionError:
        _explain()
        raise


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
    deploy_operator(kubectl)
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
    columns = {name: row[header.index(name):header.index(after)].strip() if after else row[header.index(name):]
               for name, after in zip(header.split(), [*header.split()[1:], None], strict=True)}
    assert "<none>" not in row and columns["PHASE"] == "Succeeded", row
    assert all(columns[c] for c in ("RATE", "PROGRESS", "SAMPLES/S", "BEST-ACC", "TARGET")), columns  # none blank
    assert len(columns["BEST-ACC"].split(".")[1]) <= 3, row  # rounded
    # the target's fate first, in words: reached at its time, or missed with the best accuracy
    assert columns["TARGET"].startswith("reached at " if result["timeToAccuracyS"] is not None else "missed (best "), row
    kubectl("delete", "-f", SAMPLE, "--wait=true")


def _volume(host_dir, name: str) -> list[dict]:
    """A PersistentVolume on a directory of this node and its claim in "default" (world-writable: hostPath has
    no fsGroup)."""
    host_dir.mkdir()
    host_dir.chmod(0o777)
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(host_dir), "type": "Directory"},
                  "claimRef": {"namespace": "default", "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": name,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]


def test_every_rank_leaves_its_artifacts_on_the_jobs_volume(operator, tmp_path):
    """spec.output names a claim (here a hostPath volume on this node, world-writable: hostPath has no fsGroup):
    rank 0 leaves its timeline and result, each rank its link's queue samples, under <path>/<job>/attempt-0/, and
    status.result says where."""
    kubectl = operator
    host_dir = tmp_path / "volume"
    volume = _volume(host_dir, "e2e-output")
    (tmp_path / "volume.yaml").write_text(yaml.safe_dump_all(volume))
    try:
        kubectl("apply", "-f", str(tmp_path / "volume.yaml"))
        _apply_job(kubectl, tmp_path, "kept", **{"training.epochs": 2, "output": {"claimName": "e2e-output",
                                                                                 "path": "campaign/one"}})
        assert _wait("kept to finish", lambda: _phase(kubectl, "kept") in ("Succeeded", "Failed") and
                     _phase(kubectl, "kept"), 600, every=2) == "Succeeded", _job(kubectl, "kept").get("status")
        result = _job(kubectl, "kept")["status"]["result"]
        assert result["artifacts"] == "pvc://e2e-output/campaign/one/kept/attempt-0", result
        attempt = host_dir / "campaign" / "one" / "kept" / "attempt-0"
        found = sorted(str(p.relative_to(attempt)) for p in attempt.rglob("*") if p.is_file())
        assert found == ["rank-0/queue.csv", "rank-0/result.json", "rank-0/timeline.csv", "rank-1/queue.csv"], found
        kept = json.loads((attempt / "rank-0" / "result.json").read_text())
        assert kept["best_accuracy"] == pytest.approx(result["bestAccuracy"], abs=1e-3)
        from netsense.train.results import read_timeline

        steps = read_timeline(str(attempt / "rank-0" / "timeline.csv"))
        assert len(steps) == kept["steps"], (len(steps), kept["steps"])
        for rank in (0, 1):
            rows = (attempt / f"rank-{rank}" / "queue.csv").read_text().splitlines()
            assert rows[0].startswith("t,dev,") and len(rows) > 10 and all(r.count(",") == 7 for r in rows), rows[:3]
        print(f"\nE2E artifacts: {len(found)} files, {len(steps)} timeline rows, "
              f"{sum(p.stat().st_size for p in attempt.rglob('*') if p.is_file()) / 1e3:.0f} kB")
    finally:
        kubectl("delete", "nsj", "kept", "--ignore-not-found", "--wait=true")
        kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(tmp_path / "volume.yaml"))


def test_two_processes_in_one_pod_train_as_one_gang(operator, tmp_path):
    """procsPerWorker: 2 with one worker: one pod, two ranks (gloo on the CPU), trained to the end."""
    kubectl = operator
    _apply_job(kubectl, tmp_path, "procs", workers=1, procsPerWorker=2, **{"training.epochs": 1})
    try:
        seen = set()

        def done():
            seen.update(p["metadata"]["name"] for p in _job_pods(kubectl, "procs"))
            return _phase(kubectl, "procs") in ("Succeeded", "Failed") and _phase(kubectl, "procs")

        assert _wait("procs to finish", done, 600, every=2) == "Succeeded", _job(kubectl, "procs").get("status")
        result = _job(kubectl, "procs")["status"]["result"]
        assert result["workers"] == 2 and result["steps"] > 0 and len(seen) == 1, (result, seen)
        print(f"\nE2E two ranks in one pod: {result['steps']} steps, {result['throughputSamplesPerS']} samples/s")
    finally:
        kubectl("delete", "nsj", "procs", "--ignore-not-found", "--wait=true")


def test_a_calibrate_job_then_a_tta_job_on_its_profile(operator, tmp_path):
    """spec.mode: calibrate as real pods: netsense calibrate in one pod of the worker image (non-root, its runs on
    the pod's loopback), its profile through a real termination message into the ConfigMap <job>-penalties (owned
    by the job: gone with it); a tta job naming configmap:<job>-penalties trains with those factors (its result
    says which file it read: the mount), and the profile goes with the calibrate job."""
    kubectl = operator
    _apply_job(kubectl, tmp_path, "calib", mode="calibrate",
               calibration={"seeds": 1, "steps": 20, "rungs": 1, "densities": [0.01], "ranks": [2], "parallel": 1})
    try:
        assert _wait("calib to finish", lambda: _phase(kubectl, "calib") in ("Succeeded", "Failed") and
                     _phase(kubectl, "calib"), 600, every=2) == "Succeeded", _job(kubectl, "calib").get("status")
        calibration = _job(kubectl, "calib")["status"]["calibration"]
        assert calibration["configMap"] == "calib-penalties" and calibration["costSeconds"] > 0, calibration
        profile = json.loads(_get(kubectl, "configmap", "calib-penalties")["data"]["penalties.json"])
        assert profile["job"] == "calib" and set(profile["topk"]) == {"0.01"} and set(profile["powersgd"]) == {"2"}
        _apply_job(kubectl, tmp_path, "calibrated", **{"training.epochs": 1,
                                                       "compression.penalties": "configmap:calib-penalties"})
        assert _wait("calibrated to finish", lambda: _phase(kubectl, "calibrated") in ("Succeeded", "Failed") and
                     _phase(kubectl, "calibrated"), 600, every=2) == "Succeeded", _job(kubectl, "calibrated").get("status")
        read = _job(kubectl, "calibrated")["status"]["result"]["penalties"]
        assert read["file"] == "/etc/netsense-penalties/penalties.json", read
        assert read["topk"] == {"0.01": profile["topk"]["0.01"]["steps_factor"]}, (read, profile)
        print(f"\nE2E calibration: {calibration['summary']}")
    finally:
        kubectl("delete", "nsj", "calibrated", "--ignore-not-found", "--wait=true")
        kubectl("delete", "nsj", "calib", "--ignore-not-found", "--wait=true")
    _wait("the garbage collector to remove calib's profile",
          lambda: not _get(kubectl, "configmap", "-l", f"{LABEL_JOB}=calib")["items"], 120)


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


def _measuring_pods(name: str, profile: dict):
    """(job, its ConfigMap, pod(rank, script)): pods built as the operator builds a rank's (the shaper sidecar, the
    profile in the ConfigMap), the trainer's command replaced by ``script``; no owner (the garbage collector would
    take them), none of the operator's labels and no gang gate."""
    from netsense_operator import resources

    from netsense.spec.job import parse_job

    with open(SAMPLE) as fh:
        doc = yaml.safe_load(fh)
    doc["metadata"]["name"] = name
    doc["spec"]["network"]["profile"] = profile
    job = parse_job(doc)
    config = resources.config_map(job, "default", f"uid-{name}")
    config["metadata"].pop("ownerReferences")

    def pod(rank: int, script: str) -> dict:
        p = resources.worker_pod(job, "default", f"uid-{name}", rank, 0, shaper_image=SHAPER)
        p["metadata"].pop("ownerReferences")
        p["metadata"]["labels"] = {"app": "shape-measure"}
        p["spec"].pop("schedulingGates")  # no job, so no operator admits them: scheduled at once
        trainer = next(c for c in p["spec"]["containers"] if c["name"] == "trainer")
        trainer["command"] = ["sh", "-c", script]
        return p

    return job, config, pod


def test_the_sidecar_shapes_a_pods_link_through_a_step(operator, tmp_path):
    """Two pods built as the operator builds a rank's (shaper sidecar, profile in a ConfigMap), the trainer's
    command replaced by a bulk transfer: the receiver counts what the sender's shaped eth0 lets through,
    40 Mbit/s and then, 6 s into the profile's clock, 10 Mbit/s."""
    from netsense.gang import PROFILE_START_ENV

    kubectl = operator
    job, config, pod = _measuring_pods("shape", {"type": "steps", "steps": [{"at": "0s", "rate": "40Mbit"},
                                                                          {"at": "6s", "rate": "10Mbit"}]})
    # The sender runs 2 s before the clock starts (the shaper holds the first step meanwhile), so the windows
    # below see a steady flow, not the pod's start-up; the clock's epoch goes to the log, to place the windows
    # on the receiver's bins (which start at the sender's connect).
    start_clock = f'date +%s.%N > "${{{PROFILE_START_ENV}}}"'
    rx = pod(0, "exec python -m netsense.emulation.bulk recv 5001 20")
    docs = [config, rx]
    (tmp_path / "rx.yaml").write_text(yaml.safe_dump_all(docs))
    try:
        kubectl("apply", "-f", str(tmp_path / "rx.yaml"))
        ip = _wait("the receiver's IP", lambda: _get(kubectl, "pod", rx["metadata"]["name"])["status"].get("podIP"),
                   120)
        tx = pod(1, f"python -m netsense.emulation.bulk send {ip} 5001 16 & sleep 2 && {start_clock} && "
                    f'cat "${{{PROFILE_START_ENV}}}" && wait')
        (tmp_path / "tx.yaml").write_text(yaml.safe_dump(tx))
        kubectl("apply", "-f", str(tmp_path / "tx.yaml"))
        _wait("the transfer", lambda: _get(kubectl, "pod", rx["metadata"]["name"])["status"].get("phase")
              in ("Succeeded", "Failed"), 180)
        out = json.loads(kubectl("logs", rx["metadata"]["name"], "-c", "trainer").strip().splitlines()[-1])
        from netsense.emulation.bulk import best_second, rate_between

        epoch = float(kubectl("logs", tx["metadata"]["name"], "-c", "trainer").split()[0])
        clock = epoch - out["start"]  # the profile's t=0 on the receiver's bins
        windows = {"before": (clock + 1.0, clock + 5.0), "after": (clock + 8.0, clock + 13.0)}
        mean = {k: rate_between(out, *w) / 1e6 for k, w in windows.items()}
        best = {k: best_second(out, *w) / 1e6 for k, w in windows.items()}
        print(f"\nE2E shaped pod link: {mean['before']:.1f} Mbit/s before the step (profile 40; best second "
              f"{best['before']:.1f}), {mean['after']:.1f} after (10; best {best['after']:.1f}); the clock started "
              f"{clock:.2f} s after the sender connected")
        # The best second is the shaper's reading: a shaper never lets more through than its rate, while a busy
        # machine only slows the flow (a CI run's mean read 26 of 40 with the flow starting with the pod).
        per_second = [round(rate_between(out, clock + i, clock + i + 1) / 1e6, 1) for i in range(-1, 14)]
        why = (f"Mbit/s in each second of the profile's clock from -1 s: {per_second}; the sender's shaper said:\n"
               + kubectl("logs", tx["metadata"]["name"], "-c", "shaper")[-3000:])
        assert best["before"] == pytest.approx(40, rel=0.15), why
        assert best["after"] == pytest.approx(10, rel=0.15), why
        assert mean["before"] > 0.6 * 40 and mean["after"] > 0.6 * 10, why
    finally:
        kubectl("delete", "--ignore-not-found", "-f", str(tmp_path / "rx.yaml"),
                *(["-f", str(tmp_path / "tx.yaml")] if (tmp_path / "tx.yaml").exists() else []), "--wait=true")


@pytest.mark.parametrize("rate", ["200Mbit", "1000Mbit"])
def test_a_shaped_pods_link_carries_a_payload_after_idle_at_its_rate(operator, tmp_path, rate):
    """What a training step sends, between two shaped pods: each payload after 100 ms idle, its apparent rate at
    the receiver over the profile's rate (the fastest of 5: noise only slows a payload). None may outrun the link
    by more than its bucket; from 300 kB they must carry at least 0.8x (the emulated link's bounds)."""
    kubectl = operator
    name = f"payload-{rate.lower()}"
    _, config, pod = _measuring_pods(name, {"type": "static", "rate": rate})
    sizes = [s for s in (47_000, 300_000, 1_000_000, 4_000_000) for _ in range(5)]
    rx = pod(0, "exec python -m netsense.emulation.bulk recv-payloads 5002 " + " ".join(map(str, sizes)))
    (tmp_path / "rx.yaml").write_text(yaml.safe_dump_all([config, rx]))
    try:
        kubectl("apply", "-f", str(tmp_path / "rx.yaml"))
        ip = _wait("the receiver's IP", lambda: _get(kubectl, "pod", rx["metadata"]["name"])["status"].get("podIP"),
                   120)
        tx = pod(1, f"sleep 1 && exec python -m netsense.emulation.bulk send-payloads {ip} 5002 0.1 "
                    + " ".join(map(str, sizes)))
        (tmp_path / "tx.yaml").write_text(yaml.safe_dump(tx))
        kubectl("apply", "-f", str(tmp_path / "tx.yaml"))
        _wait("the payloads", lambda: all(_get(kubectl, "pod", p["metadata"]["name"])["status"].get("phase")
                                          in ("Succeeded", "Failed") for p in (rx, tx)), 180)
        done = json.loads(kubectl("logs", rx["metadata"]["name"], "-c", "trainer").strip().splitlines()[-1])["done"]
        started = json.loads(kubectl("logs", tx["metadata"]["name"], "-c", "trainer").strip().splitlines()[-1])[
            "started"]
        bps = float(rate.removesuffix("Mbit")) * 1e6
        ratios: dict[int, float] = {}
        for size, t0, t1 in zip(sizes, started, done, strict=True):  # CLOCK_MONOTONIC: one kernel, both pods
            ratios[size] = max(ratios.get(size, 0.0), size * 8 / (t1 - t0) / bps)
        table = ", ".join(f"{size // 1000} kB {x:.2f}x" for size, x in ratios.items())
        print(f"\nE2E payload after idle between shaped pods at {rate}: {table}")
        # As tests/test_shaping.py holds the emulated link: from 47 kB (300 kB at 1 Gbit, whose bucket is 40 kB)
        # within 1.15x; below that, no more than the bucket's worth of bytes for free.
        from netsense.shaping.tc import tbf_params

        burst, held = tbf_params(bps)["burst"], 300_000 if bps > 200e6 else 47_000
        for size, x in ratios.items():
            most = 1.15 if size >= held else 1.15 * size / (size - burst)
            assert x <= most, f"{size // 1000} kB outran the link (at most {most:.2f}x): {table}"
        assert all(x >= 0.8 for size, x in ratios.items() if size >= 300_000), f"the link carried too little: {table}"
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(tmp_path / "rx.yaml"),
                *(["-f", str(tmp_path / "tx.yaml")] if (tmp_path / "tx.yaml").exists() else []))


# Chaos: what a user would break before trusting the operator on a real cluster.

def _finish_without_duplicates(kubectl, name: str, ns: str = "default", timeout: float = 900, workers: int = 2) -> dict:
    """Wait for the job to end; its final status, after checking every view of its pods (terminating ones
    included): never more than one gang's worth, never two attempts at once (a new gang beside its predecessor)."""
    peak, mixed = 0, []

    def finished():
        nonlocal peak
        try:
            pods = _get(kubectl, "-n", ns, "pods", "-l", f"{LABEL_JOB}={name}")["items"]
            phase = (_get(kubectl, "-n", ns, "nsj", name).get("status") or {}).get("phase")
        except AssertionError:  # the API server away for a moment: ask again
            return None
        peak = max(peak, len(pods))
        attempts = {p["metadata"]["labels"].get("netsense.dev/attempt") for p in pods}
        if len(attempts) > 1:
            mixed.append(sorted(p["metadata"]["name"] for p in pods))
        return phase in ("Succeeded", "Failed") and phase

    phase = _wait(f"{name} to finish", finished, timeout, every=1)
    status = _get(kubectl, "-n", ns, "nsj", name)["status"]
    assert phase == "Succeeded", json.dumps(status, indent=1)[:3000]
    assert peak <= workers and not mixed, \
        f"{peak} pods at once for a {workers}-worker job; two attempts together: {mixed[:3]}"
    return status


def test_chaos_a_drain_under_a_quota_that_fits_one_gang(operator, tmp_path):
    """kubectl drain evicts the job's pods through the Eviction API (the node cordoned, then uncordoned): a
    disruption, not a failure (backoffLimit 0), and the new gang waits for the old one inside a ResourceQuota of
    exactly one gang's pods. It runs before the CRD-upgrade test: a CRD applied again changes the schema that
    new objects are defaulted with only some time later, and a job created meanwhile gets the newer field."""
    kubectl = operator
    ns = "chaos-quota"
    with open(SAMPLE) as fh:
        job = yaml.safe_load(fh)
    job["metadata"].update(name="drained", namespace=ns)
    job["spec"]["training"]["epochs"] = 12
    job["spec"]["runPolicy"]["backoffLimit"] = 0
    # The namespace, its quota and the job in one file, as a user would write them: the job meets a quota the
    # controller has not counted yet and a namespace whose `default` ServiceAccount does not exist yet, and waits.
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-gang", "namespace": ns},
             "spec": {"hard": {"pods": "2"}}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    (tmp_path / "drained.yaml").write_text(yaml.safe_dump_all([namespace, quota, job]))
    try:
        kubectl("apply", "-f", str(tmp_path / "drained.yaml"))
        _wait("drained to run", lambda: (_get(kubectl, "-n", ns, "nsj", "drained").get("status") or {})
              .get("phase") == "Running", 300)
        time.sleep(5)
        node_name = _get(kubectl, "-n", ns, "pods", "-l", f"{LABEL_JOB}=drained")["items"][0]["spec"]["nodeName"]
        t0 = time.monotonic()
        try:
            kubectl("drain", node_name, f"--pod-selector={LABEL_JOB}=drained", "--delete-emptydir-data", "--force",
                    "--ignore-daemonsets", "--timeout=180s")
        finally:
            kubectl("uncordon", node_name)
        print(f"\nE2E drain: the job's pods evicted in {time.monotonic() - t0:.1f}s")
        status = _finish_without_duplicates(kubectl, "drained", ns)
        assert status["disruptions"] >= 1 and status["restarts"] == 0, status
    finally:
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=300)


def _job_doc(name: str, ns: str, **spec) -> dict:
    with open(SAMPLE) as fh:
        job = yaml.safe_load(fh)
    job["metadata"].update(name=name, namespace=ns)
    job["spec"]["training"]["epochs"] = 1
    job["spec"].update(spec)
    return job


def _trainer_times(kubectl, ns: str, name: str) -> list[tuple[str, str]]:
    """(startedAt, finishedAt) of each of the job's trainers (RFC 3339 UTC: compared as text)."""
    out = []
    for pod in _get(kubectl, "-n", ns, "pods", "-l", f"{LABEL_JOB}={name}")["items"]:
        for c in pod["status"].get("containerStatuses") or []:
            ended = (c.get("state") or {}).get("terminated") or {}
            if c["name"] == "trainer" and ended:
                out.append((ended["startedAt"], ended["finishedAt"]))
    return out


def _run_two(kubectl, tmp_path, ns: str, jobs: list[dict], waiting_reason: str) -> None:
    """Apply both jobs at once; the second waits (``waiting_reason``) while the first runs: no trainer of the
    second starts before every trainer of the first has ended. Both end Succeeded, nothing counted against either
    (no restart, no disruption)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    (tmp_path / f"{ns}.yaml").write_text(yaml.safe_dump_all([namespace, *jobs]))
    kubectl("apply", "-f", str(tmp_path / f"{ns}.yaml"))
    names = [j["metadata"]["name"] for j in jobs]
    reasons: dict[str, set] = {n: set() for n in names}

    def both_ended() -> bool:
        ended = True
        for name in names:
            status = _get(kubectl, "-n", ns, "nsj", name).get("status") or {}
            reasons[name].update(c.get("reason") for c in status.get("conditions") or [] if c["type"] == "PodsReady")
            ended &= status.get("phase") in ("Succeeded", "Failed")
        return ended

    _wait("both jobs to end", both_ended, 900, every=0.5)
    print(f"\nE2E {ns}: PodsReady reasons seen: {reasons}")
    for name in names:
        workers = next(j for j in jobs if j["metadata"]["name"] == name)["spec"]["workers"]
        status = _finish_without_duplicates(kubectl, name, ns, timeout=60, workers=workers)
        assert status["restarts"] == 0 and status["disruptions"] == 0, status
    first, second = sorted(names, key=lambda n: min(t[0] for t in _trainer_times(kubectl, ns, n)))
    first_end = max(t[1] for t in _trainer_times(kubectl, ns, first))
    second_start = min(t[0] for t in _trainer_times(kubectl, ns, second))
    assert second_start >= first_end, f"{second} started at {second_start}, before {first} ended at {first_end}"
    assert waiting_reason in reasons[second], f"{second} waited without saying why: {reasons}"


def test_two_gangs_that_cannot_both_fit_the_node_run_one_after_the_other(operator, tmp_path):
    """The node has 2 cpu; each gang asks for 2 x 0.71: both cannot run at once. Without gang admission one rank
    of each was scheduled, each rank 0 timed out at the rendezvous and restarted, again and again."""
    kubectl, ns = operator, "e2e-fit"
    jobs = [_job_doc(name, ns, resources={"requests": {"cpu": "700m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}})
            for name in ("fits-first", "fits-second")]
    try:
        _run_two(kubectl, tmp_path, ns, jobs, "WaitingForRoom")
    finally:
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=300)


def test_two_gangs_under_a_quota_for_one_run_one_after_the_other(operator, tmp_path):
    """A quota of 6 pods and two 4-worker jobs: the second makes no pod while the first holds the quota, then
    runs; neither fails (a half-made gang would hold quota waiting for ranks that cannot come)."""
    kubectl, ns = operator, "e2e-quota"
    small = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "3Gi"}}
    jobs = [_job_doc(name, ns, workers=4, resources=small) for name in ("quota-first", "quota-second")]
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "six-pods", "namespace": ns},
             "spec": {"hard": {"pods": "6"}}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    try:
        (tmp_path / "quota.yaml").write_text(yaml.safe_dump_all([namespace, quota]))
        kubectl("apply", "-f", str(tmp_path / "quota.yaml"))
        _run_two(kubectl, tmp_path, ns, jobs, "QuotaExceeded")
    finally:
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=300)


def test_chaos_the_api_server_down_30s_and_a_new_crd_under_a_running_job(node, operator, tmp_path):
    """A CRD applied again with a defaulted field it did not have (an upgrade), then the API server stopped for
    30 s and started again (the operator loses its Lease and comes back): the job finishes, no pod duplicated,
    no restart, and the new default is no spec change."""
    kubectl = operator
    _apply_job(kubectl, tmp_path, "chaos-cp", **{"training.epochs": 12})
    _wait("chaos-cp to run", lambda: _phase(kubectl, "chaos-cp") == "Running", 300)
    crd_path = os.path.join(REPO, "manifests", "base", "crd.yaml")
    with open(crd_path) as fh:
        crd = yaml.safe_load(fh)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["upgradeNote"] = {"type": "string", "default": "a field a newer CRD added"}
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump(crd))
    try:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "crd.yaml"))
        _wait("the new CRD's default on the job", lambda: _job(kubectl, "chaos-cp")["spec"].get("upgradeNote"), 60)
        t0 = time.monotonic()
        node.cp.restart_apiserver(down_s=30)
        print(f"\nE2E API server down 30 s: serving again after {time.monotonic() - t0:.1f}s")
        status = _finish_without_duplicates(kubectl, "chaos-cp")
    finally:  # the CRD as installed, once the API server answers
        with open(SAMPLE) as fh:
            probe_job = yaml.safe_load(fh)
        probe_job["metadata"]["name"] = "crd-probe"
        probe_job["spec"]["suspend"] = True  # created for real (below): the operator starts nothing for it
        probe_path = tmp_path / "probe.yaml"
        probe_path.write_text(yaml.safe_dump(probe_job))
        in_a_row = []

        def restored() -> bool:
            kubectl("apply", "--server-side", "--force-conflicts", "-f", crd_path, check=False)
            # The CRD object changes at once, the schema the server defaults new objects with later. A dry-run
            # create was not enough: after the API server's restart a job created just after a clean dry run
            # still got the old default (CI: the next test's job then failed InvalidSpec on upgradeNote). So a
            # suspended job is created for real and read back, three times in a row, 2 s apart.
            probe = kubectl("create", "-o", "json", "-f", str(probe_path), check=False)
            kubectl("delete", "nsj", "crd-probe", "--ignore-not-found", "--wait=true", check=False)
            in_a_row.append(bool(probe) and "upgradeNote" not in json.loads(probe)["spec"])
            return len(in_a_row) >= 3 and all(in_a_row[-3:])

        _wait("the CRD restored (a new job without the new default, 3 times in a row)", restored, 120, every=2)
    assert (status["restarts"], status.get("disruptions", 0)) == (0, 0), status
    refused = [c for c in status["conditions"] if c["type"] == "SpecChangeRefused" and c["status"] == "True"]
    assert not refused, refused
    kubectl("delete", "nsj", "chaos-cp", "--wait=true")


def test_chaos_two_operator_replicas_and_the_leader_killed(operator, tmp_path):
    """The Deployment scaled to 2: one leads, one waits; the leader killed without a chance to hand the Lease
    back, the other takes over (after the Lease has sat unchanged 15 s) and the job finishes, no pod
    duplicated."""
    kubectl = operator
    kubectl("-n", OPERATOR_NS, "scale", "deploy/netsense-operator", "--replicas=2")
    try:
        kubectl("-n", OPERATOR_NS, "rollout", "status", "deploy/netsense-operator", "--timeout=180s")
        _apply_job(kubectl, tmp_path, "chaos-ha", **{"training.epochs": 12})
        _wait("chaos-ha to run", lambda: _phase(kubectl, "chaos-ha") == "Running", 300)
        def holder() -> str:
            return _get(kubectl, "-n", OPERATOR_NS, "lease", "netsense-operator")["spec"].get("holderIdentity") or ""

        old = holder()
        pods = _get(kubectl, "-n", OPERATOR_NS, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
        assert len(pods) == 2
        leader = next(p for p in pods if old.startswith(p["metadata"]["name"]))
        container = leader["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        from support.node import SOCKET

        t0 = time.monotonic()
        # SIGKILL from the host, as a crash or an OOM kill: no SIGTERM, so the Lease is not handed back.
        subprocess.run(["ctr", "--address", SOCKET, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", container],
                       check=True, capture_output=True, timeout=30)
        new = _wait("another operator to lead", lambda: (h := holder()) and h != old and h, 120)
        took = time.monotonic() - t0
        print(f"\nE2E leader SIGKILLed: {new} leads after {took:.1f}s")
        assert took >= 10, f"{new} took the Lease {took:.1f} s after the kill: before it could have lapsed"
        status = _finish_without_duplicates(kubectl, "chaos-ha")
        assert (status["restarts"], status.get("disruptions", 0)) == (0, 0), status
    finally:  # the job too: one left behind fails the next test's "no job left"
        kubectl("-n", OPERATOR_NS, "scale", "deploy/netsense-operator", "--replicas=1")
        kubectl("delete", "nsj", "chaos-ha", "--ignore-not-found", "--wait=true")


def campaign_grid(name: str) -> dict:
    """A 4-cell campaign (two methods x two seeds, one 50 Mbit link) of cells that train their whole 20 s (no stop
    at the target): long enough to be caught running, and to run two at a time (here and on kind)."""
    return {"name": name,
            "base": {"workers": 2, "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
                     "training": {"model": "mlp", "dataset": "digits", "hiddenSize": 256, "targetAccuracy": 0.8,
                                  "stopAtTarget": False, "maxSeconds": "20s", "evalEvery": 5}},
            "methods": {"allreduce": {"method": "allreduce"}, "topk-0.1": {"method": "topk", "density": 0.1}},
            "profiles": {"static-50": {"type": "static", "rate": "50Mbit"}}, "seeds": [0, 1]}


def test_a_benchmark_campaign_on_the_node_side_by_side_interrupted_and_resumed(node, operator, tmp_path, request):
    """`netsense bench --cluster --parallel 2 --output-claim`: Ctrl-C while two cells run deletes their jobs (no
    NetSenseJob, no pod left, no reader pod); run again, every cell runs, its ranks' files come back from the
    volume, and the same table and plots as a local bench land; a third run reuses every finished cell and
    submits nothing."""
    kubectl = operator
    grid = campaign_grid("campaign")
    path, out = tmp_path / "campaign.yaml", tmp_path / "campaign"
    path.write_text(yaml.safe_dump(grid))
    (tmp_path / "volume.yaml").write_text(yaml.safe_dump_all(_volume(tmp_path / "volume", "campaign-output")))
    kubectl("apply", "-f", str(tmp_path / "volume.yaml"))
    request.addfinalizer(lambda: kubectl("delete", "--ignore-not-found", "--wait=true", "-f",
                                         str(tmp_path / "volume.yaml")))
    env = {**os.environ, "KUBECONFIG": node.kubeconfig}
    argv = [os.path.join(REPO, ".venv", "bin", "netsense"), "bench", str(path), "--cluster", "--parallel", "2",
            "--out", str(out), "--output-claim", "campaign-output", "--cell-plots"]

    def jobs() -> list[dict]:
        return _get(kubectl, "nsj")["items"]

    bench = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's
    try:
        _wait("two cells running side by side", lambda: sum(
            1 for j in jobs() if (j.get("status") or {}).get("phase") == "Running") == 2, 300)
        bench.send_signal(signal.SIGINT)
        _, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 130, err[-2000:]
    _wait("the interrupted cells' jobs and pods gone, and the reader", lambda: not jobs() and not _get(
        kubectl, "pods", "-l", LABEL_JOB)["items"] and not _get(
        kubectl, "pods", "-l", "app.kubernetes.io/component=bench-reader")["items"], 120)

    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\nE2E campaign: 4 cells, 2 at a time, in {time.monotonic() - t0:.0f}s")
    table = json.loads((out / "table.json").read_text())
    assert {r["method"] for r in table} == {"allreduce", "topk-0.1"} and all(r["reached"] == "2/2" for r in table)
    assert (out / "summary.md").exists() and (out / "time_to_target.png").exists() and (out / "density_vs_link.png").exists()
    from netsense.train.results import read_timeline

    for cell in (d for d in out.iterdir() if (d / "result.json").exists()):
        kept = json.loads((cell / "result.json").read_text())
        files = sorted(str(p.relative_to(cell / "artifacts")) for p in (cell / "artifacts").rglob("*") if p.is_file())
        assert files == ["attempt-0/rank-0/queue.csv", "attempt-0/rank-0/result.json", "attempt-0/rank-0/timeline.csv",
                         "attempt-0/rank-1/queue.csv"], (cell.name, files)
        steps = read_timeline(str(cell / "timeline.csv"))
        assert len(steps) == kept["steps"] and "queue_delay_max_ms" in steps[0], (cell.name, len(steps))
        assert (cell / "timeline.png").exists() and kept["artifacts"].startswith("pvc://campaign-output/"), cell.name
    assert not _get(kubectl, "pods", "-l", "app.kubernetes.io/component=bench-reader")["items"], "reader left"
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stderr.count("reusing the finished result") == 4, again.stderr[-2000:]
    _wait("every cell's job deleted once its result was read", lambda: not jobs(), 60)
