"""A cluster cell's artifacts, read back from its job's output volume (spec.output) into the cell's directory.

The mechanism is the one `kubectl cp` uses: one small reader pod for the campaign mounts the claim read-only,
and the bench streams ``tar | base64`` out of it through the API server's exec. So a campaign needs nothing of
ours in the cluster beyond the operator (and this pod, for the campaign's length), no object store and no
credentials beyond the user's kubeconfig (pods/exec in the namespace). The volume keeps everything; the cell's
directory gets the same files a local cell has, so the report and the plots are the local bench's code:

    <cell>/artifacts/attempt-<n>/rank-<r>/{timeline.csv,result.json,queue.csv}   as the ranks wrote them
    <cell>/timeline.csv   the last attempt's rank 0, with the per-step queue columns of a local run
    <cell>/queue.csv      every rank's samples of the last attempt (dev: rank<r>-<dev>)
"""

from __future__ import annotations

import base64
import csv
import io
import os
import shlex
import shutil
import tarfile
import time

from netsense.errors import BadInput

READER_MOUNT = "/volume"
READER_UID = 65532  # the trainer's: the files it wrote are its own
TAR_EXIT = "netsense-tar-exit:"


class ArtifactsError(BadInput, RuntimeError):
    pass


def reader_image(namespace: str, base_spec: dict) -> str:
    """The image the cells' trainers run (it has sh, tar and base64): the grid's spec.image, else the one the
    operator was installed with (its Deployment's NETSENSE_WORKER_IMAGE)."""
    if base_spec.get("image"):
        return base_spec["image"]
    from kubernetes import client

    try:
        deployments = client.AppsV1Api().list_deployment_for_all_namespaces(
            label_selector="app.kubernetes.io/name=netsense,app.kubernetes.io/component=operator").items
    except client.ApiException as e:
        raise ArtifactsError(f"--output-claim: cannot read the operator's Deployment for the worker image "
                             f"({e.status} {e.reason}); name an image with --reader-image") from None
    for d in deployments:
        for c in d.spec.template.spec.containers:
            for e in c.env or []:
                if e.name == "NETSENSE_WORKER_IMAGE" and e.value:
                    return e.value
    raise ArtifactsError("--output-claim: no operator Deployment names NETSENSE_WORKER_IMAGE; name an image with "
                         "--reader-image")


class VolumeReader:
    """The campaign's reader pod: start(), fetch() per cell, close() (also on Ctrl-C)."""

    def __init__(self, namespace: str, claim: str, image: str, name: str):
        from kubernetes import client

        self.api = client.CoreV1Api()
        self.namespace, self.claim, self.image = namespace, claim, image
        self.name = f"netsense-reader-{name}"[:63].rstrip("-.")

    def pod(self) -> dict:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "labels": {"app.kubernetes.io/name": "netsense",
                                                       "app.kubernetes.io/component": "bench-reader"}},
            "spec": {
                "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 0,
                "activeDeadlineSeconds": 7 * 86400,  # a bench killed without clean-up does not leave it for good
                "securityContext": {"runAsNonRoot": True, "runAsUser": READER_UID, "runAsGroup": READER_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "reader", "image": self.image, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "infinity"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                        "readOnlyRootFilesystem": True},
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                  "limits": {"cpu": "500m", "memory": "256Mi"}},
                    "volumeMounts": [{"name": "output", "mountPath": READER_MOUNT, "readOnly": True}],
                }],
                "volumes": [{"name": "output", "persistentVolumeClaim": {"claimName": self.claim, "readOnly": True}}],
            },
        }

    def start(self, timeout_s: float = 300) -> None:
        """Create the pod (replacing a reader an interrupted run left) and wait until it runs; a pod that cannot
        start says why (the claim, the image)."""
        from kubernetes import client

        self.close()
        self.api.create_namespaced_pod(self.namespace, self.pod())
        deadline = time.monotonic() + timeout_s
        why = "not scheduled yet"
        while time.monotonic() < deadline:
            try:
                pod = self.api.read_namespaced_pod(self.name, self.namespace)
            except client.ApiException as e:
                if e.status != 404:
                    raise
                time.sleep(1)
                continue
            if pod.status.phase == "Running":
                return
            if pod.status.phase in ("Failed", "Succeeded"):
                break
            for c in pod.status.container_statuses or []:
                if c.state and c.state.waiting:
                    why = f"{c.state.waiting.reason}: {c.state.waiting.message or ''}".strip(": ")
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    why = f"{cond.reason}: {cond.message}"
            time.sleep(1)
        self.close()
        raise ArtifactsError(f"--output-claim {self.claim}: the reader pod {self.namespace}/{self.name} did not "
                             f"start within {timeout_s:.0f}s ({why})")

    def fetch(self, path: str, dest: str, timeout_s: float = 600) -> list[str]:
        """Copy the volume's directory ``path`` into ``dest`` (created); returns the files, [] where the volume
        has no such directory (a cell that failed before any rank wrote)."""
        from kubernetes import client

        # tar's own exit status on stderr: through a pipe, sh reports base64's alone (and dash has no pipefail).
        script = (f"cd {READER_MOUNT} && if [ -d {shlex.quote(path)} ]; then "
                  f"{{ tar -C {shlex.quote(path)} -czf - .; echo \"{TAR_EXIT}$?\" >&2; }} | base64; fi")
        # An API client of this call's own: kubernetes.stream swaps its client's call_api for a websocket one
        # while it opens the exec, so on a shared client another thread's plain request in that window went
        # out as a websocket upgrade ("Handshake status 200 OK"), and two streams at once (--parallel cells
        # collected together) could leave the swap in place for good.
        with client.ApiClient() as own:
            try:
                return self._fetch(client.CoreV1Api(own), path, dest, script, timeout_s)
            except ArtifactsError:
                raise
            except Exception as e:  # noqa: BLE001 - a dropped stream, a reader pod gone, a truncated archive
                raise ArtifactsError(f"reading {path} from {self.claim}: {type(e).__name__}: "
                                     f"{' '.join(str(e).split())[:300]}") from e

    def _fetch(self, api, path: str, dest: str, script: str, timeout_s: float) -> list[str]:
        from kubernetes.stream import stream

        resp = stream(api.connect_get_namespaced_pod_exec, self.name, self.namespace,
                      command=["sh", "-c", script], stderr=True, stdin=False, stdout=True, tty=False,
                      _preload_content=False)
        out, err = [], []
        deadline = time.monotonic() + timeout_s
        while resp.is_open() and time.monotonic() < deadline:
            resp.update(timeout=1)
            if resp.peek_stdout():
                out.append(resp.read_stdout())
            if resp.peek_stderr():
                err.append(resp.read_stderr())
        if resp.is_open():
            resp.close()
            raise ArtifactsError(f"reading {path} from {self.claim}: not done after {timeout_s:.0f}s")
        code = resp.returncode
        resp.close()
        said = "".join(err)
        tar_exit = [line.removeprefix(TAR_EXIT) for line in said.splitlines() if line.startswith(TAR_EXIT)]
        said = "\n".join(line for line in said.splitlines() if not line.startswith(TAR_EXIT)).strip()[-500:]
        if code:
            raise ArtifactsError(f"reading {path} from {self.claim}: exit {code}: {said}")
        if tar_exit and tar_exit[-1] != "0":
            raise ArtifactsError(f"reading {path} from {self.claim}: tar exit {tar_exit[-1]}: {said}")
        data = "".join(out).strip()
        if not data:
            if tar_exit:  # tar ran, and its archive never came: the stream was cut
                raise ArtifactsError(f"reading {path} from {self.claim}: the stream ended before the archive")
            return []
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data)), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")  # nothing outside dest, no links out, no devices
            return sorted(m.name.removeprefix("./") for m in tar.getmembers() if m.isfile())

    def close(self) -> None:
        from kubernetes import client

        try:
            self.api.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)
        except client.ApiException as e:
            if e.status != 404:
                raise
        while True:  # gone, so that a new reader of the same name can be created
            try:
                self.api.read_namespaced_pod(self.name, self.namespace)
            except client.ApiException as e:
                if e.status == 404:
                    return
                raise
            time.sleep(0.5)


def lay_out(cell_dir: str) -> str | None:
    """From <cell>/artifacts, the files a local cell has: the last attempt's rank-0 timeline (with the per-step
    queue columns) and every rank's queue samples in one queue.csv. Returns the timeline's path (None: none)."""
    from netsense.emulation.bottleneck import summarize
    from netsense.shaping.queue import FIELDS, read_rows

    root = os.path.join(cell_dir, "artifacts")
    attempts = sorted((d for d in os.listdir(root) if d.startswith("attempt-")) if os.path.isdir(root) else [],
                      key=lambda d: int(d.split("-")[1]))
    if not attempts:
        return None
    last = os.path.join(root, attempts[-1])
    timeline = os.path.join(last, "rank-0", "timeline.csv")
    if not os.path.exists(timeline):
        return None
    shutil.copyfile(timeline, os.path.join(cell_dir, "timeline.csv"))
    queue: list[dict] = []
    for rank in sorted((d for d in os.listdir(last) if d.startswith("rank-")), key=lambda d: int(d.split("-")[1])):
        for row in read_rows(os.path.join(last, rank, "queue.csv")):
            queue.append({**row, "dev": f"rank{rank.split('-')[1]}-{row['dev']}"})
    if queue:
        with open(os.path.join(cell_dir, "queue.csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(queue)
        summarize(cell_dir, [], [r for r in queue if r["t"] != ""], [])
    return os.path.join(cell_dir, "timeline.csv")
