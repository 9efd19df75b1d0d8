"""The Kubernetes objects a NetSenseJob becomes (pure functions, no API calls).

Images: the trainer runs the job's image; the shaping sidecar its own small one (no torch: tc and
PyYAML), named by the operator's configuration (NETSENSE_SHAPER_IMAGE; a digest pins it), so what runs
with NET_ADMIN is the same audited image for every job whatever image a job brings.

Privilege: the trainer runs as a non-root user with no capabilities and the
runtime's default seccomp profile, which Pod Security's "restricted" level
admits; the shaping sidecar (only for jobs with a profile) runs as root with
NET_ADMIN to change its pod's qdiscs, which only the "privileged" level
admits (baseline forbids adding capabilities). So a namespace for shaped jobs
needs `pod-security.kubernetes.io/enforce: privileged`; unshaped jobs run under
restricted.

One headless Service (rendezvous at rank 0) and one Pod per rank per *attempt*:
a gang restart deletes the attempt's pods and creates the next attempt's, so
names never collide with pods still terminating. Every object is owned by the
NetSenseJob (garbage-collected with it).
"""

from __future__ import annotations

import json
import os

from netsense.gang import (
    MASTER_PORT,
    OUT_DIR_ENV,
    OUTPUT_URI_ENV,
    PROFILE_START_ENV,
    QUEUE_CSV_ENV,
    QUEUE_SUMMARY_ENV,
    RESULT_PATH_ENV,
    SHAPER,
    SHAPER_RESOURCES,
    TRAINER,
    TRAINER_RESOURCES,
    worker_env,
)
from netsense.spec import API_VERSION, KIND, Job, podtemplate
from netsense.spec.fence import SHAPER_TMP_VOLUME
from netsense.spec.job import DEFAULT_IMAGE, PENALTIES_KEY, penalties_configmap
from netsense_operator.gate import GATE

SHAPER_IMAGE = "netsense/shaper:0.1.0"  # images/shaper.Dockerfile, tagged with the package's version

TRAINER_UID = 65532  # nobody's cousin: any non-root uid the image's files are readable by
READY_FILE = "/tmp/netsense-shaped"
# Shared by the trainer and its shaper (an emptyDir): the trainer writes the unix
# time training starts, and the shaper starts the profile's clock there.
RUN_DIR = "/run/netsense"
START_FILE = f"{RUN_DIR}/profile-start"
# The shaper keeps its queue's summary in the shared emptyDir (a few kB) for rank 0's result, and the
# samples themselves (~20 MB an hour) in its own filesystem, for `kubectl exec ... -c shaper cat`.
QUEUE_SUMMARY = f"{RUN_DIR}/queue.json"
QUEUE_CSV = "/tmp/netsense-queue.csv"
RUN_VOLUME = {"name": "netsense-run", "mountPath": RUN_DIR}
# The shaper's root filesystem is read-only: what it writes (the ready file, the queue samples) goes to a /tmp of
# its own, and a link the trainer plants in the shared volume cannot point a root write into the image.
SHAPER_TMP = {"name": SHAPER_TMP_VOLUME, "mountPath": "/tmp"}
# The trainer sees the shaper's /tmp read-only (so it can plant nothing there) to copy the queue samples into the
# job's output volume at its end: the shaper, root, never writes to a volume the job chose.
LINK_DIR = "/run/netsense-link"
TRAINER_LINK = {"name": SHAPER_TMP["name"], "mountPath": LINK_DIR, "readOnly": True}
# spec.output: the job's PersistentVolumeClaim, written by the trainer (the pod's fsGroup makes it writable where
# the volume's driver applies fsGroup); each rank under <path>/<job>/attempt-<n>/rank-<r>/.
OUTPUT_MOUNT = {"name": "netsense-output", "mountPath": "/netsense-output"}
# The job itself (job.json) and its profile (profile.json) reach the pods through a ConfigMap: a trace
# profile of a few thousand points outgrows the 128 KiB that one argument or variable may hold (E2BIG).
JOB_DIR = "/etc/netsense"
JOB_VOLUME = {"name": "netsense-job", "mountPath": JOB_DIR, "readOnly": True}
# tta's penalties profile on a cluster (spec.compression.penalties: configmap:NAME): the ConfigMap's penalties.json,
# mounted read-only; the trainer's job.json names the file, so the worker reads a local path as netsense run's does.
PENALTIES_DIR = "/etc/netsense-penalties"
PENALTIES_VOLUME = {"name": "netsense-penalties", "mountPath": PENALTIES_DIR, "readOnly": True}
# A calibrate job's runs (each one's timeline and result) go to the pod's /tmp, or to spec.output where it is set;
# the profile leaves through the trainer's termination message (netsense calibrate --termination-log).
CALIBRATE_OUT = "/tmp/netsense-calibrate"
LABEL_JOB = "netsense.dev/job"
# Selection is by the job's UID: a job deleted and re-created under the same name is another job, and
# must never count (or rendezvous with) pods its predecessor left for the garbage collector.
LABEL_JOB_UID = "netsense.dev/job-uid"
LABEL_ATTEMPT = "netsense.dev/attempt"
LABEL_RANK = "netsense.dev/rank"


def controller_uid(obj: dict) -> str | None:
    """The UID of the object's controlling NetSenseJob (None if a NetSenseJob does not control it)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND:
            return ref.get("uid")
    return None


def owner_reference(name: str, uid: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def service_name(job: str) -> str:
    return f"{job}-rdzv"


def pod_name(job: str, attempt: int, rank: int) -> str:
    return f"{job}-a{attempt}-w{rank}"


def labels(job: str, uid: str, attempt: int | None = None, rank: int | None = None,
           component: str = "worker") -> dict[str, str]:
    out = {"app.kubernetes.io/name": "netsense", "app.kubernetes.io/component": component, LABEL_JOB: job,
           LABEL_JOB_UID: uid}
    if attempt is not None:
        out[LABEL_ATTEMPT] = str(attempt)
    if rank is not None:
        out[LABEL_RANK] = str(rank)
    return out


def config_name(job: str) -> str:
    return f"{job}-job"


def penalties_name(job: str) -> str:
    """The ConfigMap a calibrate job writes its profile to (a tta job names it: configmap:<job>-penalties)."""
    return f"{job}-penalties"


def penalties_config_map(job: str, namespace: str, uid: str, profile_text: str) -> dict:
    """A calibrate job's profile (penalties.json, as netsense calibrate writes it), owned by the job: it lives as
    long as the job (the record of its calibration: its status says what it measured and cost), and goes with it."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": penalties_name(job), "namespace": namespace,
                         "labels": labels(job, uid, component="penalties"),
                         "ownerReferences": [owner_reference(job, uid)]},
            "data": {PENALTIES_KEY: profile_text}}


def config_map(job: Job, namespace: str, uid: str) -> dict:
    """job.json (what the trainer reads) and profile.json (the shaper). Without spec.podTemplate: the worker has
    no use for it, and a ConfigMap is readable by a namespace's `view` role, which a job's env is not. A
    ConfigMap's penalties are named by the path they are mounted at (the worker reads a file, as locally)."""
    manifest = job.manifest()
    manifest["spec"] = {k: v for k, v in manifest["spec"].items() if k != "podTemplate"}
    if job.mode == "calibrate":  # not read by a calibration, and not mounted in its pod
        manifest["spec"]["compression"] = {k: v for k, v in job.compression.items() if k != "penalties"}
    elif penalties_configmap(job.compression) is not None:
        manifest["spec"]["compression"] = {**job.compression, "penalties": f"{PENALTIES_DIR}/{PENALTIES_KEY}"}
    data = {"job.json": json.dumps(manifest, separators=(",", ":"))}
    if job.network.get("profile") and job.mode != "calibrate":
        data["profile.json"] = json.dumps(job.network["profile"], separators=(",", ":"))
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_name(job.name), "namespace": namespace, "labels": labels(job.name, uid),
                         "ownerReferences": [owner_reference(job.name, uid)]},
            "data": data}


def service(job: Job, namespace: str, uid: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service_name(job.name), "namespace": namespace, "labels": labels(job.name, uid),
                     "ownerReferences": [owner_reference(job.name, uid)]},
        "spec": {
            "clusterIP": "None",
            # Rank 0 must be resolvable before it is Ready: the others connect while it starts.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB_UID: uid, LABEL_RANK: "0"},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}],
        },
    }


def _shaper(job: Job, image: str) -> dict:
    net = job.network
    return {
        "name": SHAPER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        # A native sidecar: starts before the trainer, is stopped after it, and does not
        # keep the pod alive (Kubernetes >= 1.29).
        "restartPolicy": "Always",
        "command": ["netsense", "shape", "--dev", net["interface"], "--profile", f"{JOB_DIR}/profile.json",
                    "--direction", net["direction"],
                    "--start-file", START_FILE, "--ready-file", READY_FILE, "--queue-csv", QUEUE_CSV,
                    "--queue-summary", QUEUE_SUMMARY],
        "volumeMounts": [dict(RUN_VOLUME), dict(JOB_VOLUME), dict(SHAPER_TMP)],  # copies: the pod is the caller's
        # Root with NET_ADMIN alone, no privilege escalation, a read-only image. Not a non-root user: Kubernetes
        # has no ambient capabilities (KEP-2763 is not implemented), so a non-root shaper could only get
        # NET_ADMIN from file capabilities on tc, which need allowPrivilegeEscalation: true.
        "securityContext": {
            "runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
        },
        # The trainer starts only once the first profile step is in place: never unshaped.
        "startupProbe": {"exec": {"command": ["test", "-f", READY_FILE]}, "periodSeconds": 1,
                         "failureThreshold": 120},
        # Limits on both, so a namespace quota that demands them admits the sidecar.
        "resources": {k: dict(v) for k, v in SHAPER_RESOURCES.items()},  # a copy: the pod is the caller's
    }


def output_dir(job: Job, attempt: int, rank: int) -> str:
    """Where worker ``rank`` of ``attempt`` writes on the job's output volume, relative to the volume:
    <path>/<job>/attempt-<n>/rank-<r>, r the worker's first rank (its only one, unless procsPerWorker)."""
    path = (job.spec.get("output") or {}).get("path")
    first = rank * job.procs_per_worker  # named by the worker's first rank (its one voice: netsense.train.launch)
    return "/".join(p for p in (path, job.name, f"attempt-{attempt}", f"rank-{first}") if p)


def trainer_security() -> dict:
    """The trainer container's securityContext, Pod Security "restricted": it needs no privilege at all (a fresh
    dict: the pod is the caller's)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True, "runAsUser": TRAINER_UID, "runAsGroup": TRAINER_UID}


def trainer_pod_confinement() -> dict:
    """The pod-level half of a trainer's confinement (a worker's pod, a calibration's): no service-account token
    (it never talks to the API), no service links, a short grace, seccomp RuntimeDefault. Fresh dicts:
    _mount_output adds fsGroup to the securityContext."""
    return {"automountServiceAccountToken": False, "enableServiceLinks": False, "terminationGracePeriodSeconds": 10,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}


def worker_pod(job: Job, namespace: str, uid: str, rank: int, attempt: int, shaper_image: str = SHAPER_IMAGE,
               worker_image: str = DEFAULT_IMAGE) -> dict:
    """Rank ``rank``'s pod of ``attempt``; the trainer runs the job's image, else ``worker_image`` (the
    operator's configured default)."""
    if job.mode == "calibrate":
        return calibrate_pod(job, namespace, uid, attempt, worker_image)
    net = job.network
    shaped = bool(net.get("profile"))
    extra = {RESULT_PATH_ENV: "/dev/termination-log",
             "HOME": "/tmp"}  # a non-root user's caches (torch, the native kernels) need somewhere to go
    if shaped:
        extra.update({PROFILE_START_ENV: START_FILE, QUEUE_SUMMARY_ENV: QUEUE_SUMMARY})
    output = job.spec.get("output")
    if output:
        mine = output_dir(job, attempt, rank)
        extra[OUT_DIR_ENV] = f"{OUTPUT_MOUNT['mountPath']}/{mine}"
        extra[OUTPUT_URI_ENV] = f"pvc://{output['claimName']}/{mine.rpartition('/')[0]}"  # the attempt's
        if shaped:
            extra[QUEUE_CSV_ENV] = f"{LINK_DIR}/{os.path.basename(QUEUE_CSV)}"
    env = worker_env(job, rank, f"{service_name(job.name)}.{namespace}.svc", f"{JOB_DIR}/job.json",
                     net["interface"] if shaped else None, extra)
    trainer = {
        "name": TRAINER,
        "image": job.spec.get("image") or worker_image,
        "imagePullPolicy": job.spec["imagePullPolicy"],
        "command": ["netsense", "worker"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "rendezvous", "containerPort": MASTER_PORT}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": trainer_security(),
        "resources": podtemplate.quantities(job.spec.get("resources") or TRAINER_RESOURCES),
    }
    spec: dict = {
        # One rank a node where the cluster has the nodes: two ranks on one node share its NIC, and one pod's
        # shaped eth0 no longer describes the path between them. Preferred, not required (a one-node cluster
        # still runs the job); spec.podTemplate.spec.affinity.podAntiAffinity replaces it (required, say).
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": {LABEL_JOB_UID: uid}}}}]}},
        "restartPolicy": "Never",  # a failed rank fails the gang; the operator restarts it whole
        **trainer_pod_confinement(),
        "hostname": f"w{rank}",
        "containers": [trainer],
        "volumes": [{"name": JOB_VOLUME["name"], "configMap": {"name": config_name(job.name)}}],
    }
    # Copies of the module's mounts: the pod is the caller's to change, and a change must not reach the next pod.
    trainer["volumeMounts"] = [dict(JOB_VOLUME)]
    if net.get("profile"):
        spec["initContainers"] = [_shaper(job, shaper_image)]
        trainer["volumeMounts"].append(dict(RUN_VOLUME))
        spec["volumes"].append({"name": RUN_VOLUME["name"], "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
        spec["volumes"].append({"name": SHAPER_TMP["name"], "emptyDir": {}})  # queue samples: ~20 MB an hour
    if output:
        _mount_output(spec, trainer, output)
        if shaped:
            trainer["volumeMounts"].append(dict(TRAINER_LINK))
    if (penalties := penalties_configmap(job.compression)) is not None:
        trainer["volumeMounts"].append(dict(PENALTIES_VOLUME))
        spec["volumes"].append({"name": PENALTIES_VOLUME["name"], "configMap": {
            "name": penalties, "items": [{"key": PENALTIES_KEY, "path": PENALTIES_KEY}]}})
    return _finish_pod(job, namespace, uid, attempt, rank, spec, "worker")


def _mount_output(spec: dict, trainer: dict, output: dict) -> None:
    trainer["volumeMounts"].append(dict(OUTPUT_MOUNT))
    spec["volumes"].append({"name": OUTPUT_MOUNT["name"], "persistentVolumeClaim": {"claimName": output["claimName"]}})
    spec["securityContext"].update(fsGroup=TRAINER_UID, fsGroupChangePolicy="OnRootMismatch")


def _finish_pod(job: Job, namespace: str, uid: str, attempt: int, rank: int, spec: dict, component: str) -> dict:
    """The pod around ``spec``: names, labels, owner, the job's pod template, Kueue's group or the gang's gate."""
    pod = _kueue_group(podtemplate.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(job.name, attempt, rank), "namespace": namespace,
                     "labels": labels(job.name, uid, attempt, rank, component),
                     "ownerReferences": [owner_reference(job.name, uid)]},
        "spec": spec,
    }, job.spec.get("podTemplate")), job, uid, attempt)
    if KUEUE_QUEUE not in pod["metadata"]["labels"]:  # Kueue gates and admits its pod groups itself
        pod["spec"]["schedulingGates"] = [{"name": GATE}]  # lifted once the whole gang fits (gate.py)
    return pod


def calibrate_pod(job: Job, namespace: str, uid: str, attempt: int, worker_image: str = DEFAULT_IMAGE) -> dict:
    """A calibrate job's one pod: the trainer's image running netsense calibrate on the job's job.json (every run
    on the simulated clock, its workers on the pod's loopback: no shaper, no rendezvous), its profile written to
    the termination message. The trainer's confinement exactly (non-root, no capabilities, no privilege
    escalation, seccomp RuntimeDefault, no service-account token), and the job's pod template as a worker's."""
    out = CALIBRATE_OUT
    output = job.spec.get("output")
    if output:
        out = f"{OUTPUT_MOUNT['mountPath']}/{output_dir(job, attempt, 0).rpartition('/')[0]}/calibrate"
    trainer = {
        "name": TRAINER,
        "image": job.spec.get("image") or worker_image,
        "imagePullPolicy": job.spec["imagePullPolicy"],
        "command": ["netsense", "calibrate", f"{JOB_DIR}/job.json", "--out", out,
                    "--termination-log", "/dev/termination-log"],
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": trainer_security(),
        "resources": podtemplate.quantities(job.spec.get("resources") or TRAINER_RESOURCES),
        "volumeMounts": [dict(JOB_VOLUME)],
    }
    spec: dict = {
        "restartPolicy": "Never",
        **trainer_pod_confinement(),
        "containers": [trainer],
        "volumes": [{"name": JOB_VOLUME["name"], "configMap": {"name": config_name(job.name)}}],
    }
    if output:
        _mount_output(spec, trainer, output)
    return _finish_pod(job, namespace, uid, attempt, 0, spec, "calibrate")


KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"


def _kueue_group(pod: dict, job: Job, uid: str, attempt: int) -> dict:
    """A pod template that names a Kueue queue (label kueue.x-k8s.io/queue-name) gets Kueue's plain-pod group:
    the gang is admitted whole or not at all (admitted one pod at a time, a part of a gang would hold quota
    waiting for the rest). One group an attempt: a restarted gang is a new workload, its predecessor's pods
    are gone first (the operator waits for them)."""
    meta = pod["metadata"]
    if KUEUE_QUEUE in (meta.get("labels") or {}):
        meta["labels"][KUEUE_GROUP] = f"{uid}-{attempt}"  # a label value: at most 63 characters (a UID is 36)
        meta.setdefault("annotations", {})[KUEUE_GROUP_COUNT] = str(job.pods)
    return pod
