"""spec.podTemplate: what a cluster needs of a worker pod that the job does not say, merged into the pods the
operator builds (in the spirit of Kubeflow's replica pod templates, as an override, not a base).

    podTemplate:
      metadata: {labels: {...}, annotations: {...}}
      spec:                                   # any PodSpec field but the ones the operator owns
        nodeSelector: {nvidia.com/gpu.present: "true"}
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
        priorityClassName: training
        schedulerName: volcano                # a gang scheduler
        volumes: [{name: data, persistentVolumeClaim: {claimName: cifar100}}]
        containers:                           # by name: trainer, or shaper (the sidecar)
          - name: trainer
            env: [{name: NCCL_DEBUG, value: WARN}]
            volumeMounts: [{name: data, mountPath: /data, readOnly: true}]
            resources: {limits: {nvidia.com/gpu: 1}}

Merging: labels and annotations are added; lists (volumes, tolerations, imagePullSecrets, ...) are appended to
the operator's; maps (nodeSelector) are merged; other fields are set. A container's env, envFrom and
volumeMounts are appended, its resources replace the operator's. What the operator owns (the gang's labels,
restartPolicy, hostname, the rendezvous and result variables, a container's command and image) is an error at
validation, naming the field, never silently overridden. Everything else is for the API server to judge: a pod
it refuses fails the job with its message.
"""

from __future__ import annotations

import copy

from netsense.gang import CONTAINERS, RENDEZVOUS_ENV  # containers by name: trainer, or shaper

OWNED_SPEC = ("containers", "initContainers", "restartPolicy", "hostname", "subdomain")
CONTAINER_FIELDS = ("name", "env", "envFrom", "volumeMounts", "resources")
OWNED_ENV = RENDEZVOUS_ENV
OWNED_LABEL_PREFIX = "netsense.dev/"
OPERATOR_VOLUMES = ("netsense-run", "netsense-job")


def check(template: dict, path: str = "spec.podTemplate") -> list[tuple[str, str]]:
    """(field path, message) for every part of the template that the operator owns or cannot place."""
    issues: list[tuple[str, str]] = []
    unknown = set(template) - {"metadata", "spec"}
    issues += [(f"{path}.{k}", "unknown field (known: metadata, spec)") for k in sorted(unknown)]
    meta = template.get("metadata") or {}
    issues += [(f"{path}.metadata.{k}", "unknown field (known: labels, annotations)")
               for k in sorted(set(meta) - {"labels", "annotations"})]
    issues += [(f"{path}.metadata.labels.{k}", "set by the operator (the gang is selected by these)")
               for k in (meta.get("labels") or {}) if k.startswith(OWNED_LABEL_PREFIX)]
    spec = template.get("spec") or {}
    issues += [(f"{path}.spec.{k}", "set by the operator") for k in OWNED_SPEC if k in spec and k != "containers"]
    volumes = [v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)]
    issues += [(f"{path}.spec.volumes", f"{name!r} is the operator's volume") for name in volumes
               if name in OPERATOR_VOLUMES]
    for i, c in enumerate(spec.get("containers") or []):
        where = f"{path}.spec.containers[{i}]"
        if not isinstance(c, dict) or c.get("name") not in CONTAINERS:
            issues.append((f"{where}.name", f"must be one of {', '.join(CONTAINERS)} (the containers are the "
                                            f"operator's; these add to them)"))
            continue
        issues += [(f"{where}.{k}", f"set by the operator (may add: {', '.join(CONTAINER_FIELDS[1:])})")
                   for k in c if k not in CONTAINER_FIELDS]
        issues += [(f"{where}.env[{j}]", f"{e.get('name')} is set by the operator")
                   for j, e in enumerate(c.get("env") or []) if isinstance(e, dict) and
                   (e.get("name") in OWNED_ENV or str(e.get("name", "")).startswith("NETSENSE_"))]
    return issues


def quantities(resources: dict) -> dict:
    """Resource requirements with every quantity a string, as the API's types have them (YAML reads
    `nvidia.com/gpu: 1` as a number, which the Kubernetes client refuses before sending)."""
    return {k: {name: str(q) for name, q in v.items()} if k in ("requests", "limits") and isinstance(v, dict) else v
            for k, v in resources.items()}


def apply(pod: dict, template: dict | None) -> dict:
    """The pod with the (checked) template merged in; the pod itself is left as it was."""
    if not template:
        return pod
    out = copy.deepcopy(pod)
    meta = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        if meta.get(key):
            out["metadata"][key] = {**meta[key], **out["metadata"].get(key, {})}
    spec = out["spec"]
    for key, value in (template.get("spec") or {}).items():
        if key == "containers":
            continue
        if isinstance(value, list):
            spec[key] = spec.get(key, []) + copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **copy.deepcopy(value)}
        else:
            spec[key] = copy.deepcopy(value)
    ours = {c["name"]: c for c in spec.get("containers", []) + spec.get("initContainers", [])}
    for extra in (template.get("spec") or {}).get("containers") or []:
        container = ours.get(extra["name"])
        if container is None:  # the shaper, on a job without a profile
            continue
        for key in ("env", "envFrom", "volumeMounts"):
            if extra.get(key):
                container[key] = container.get(key, []) + copy.deepcopy(extra[key])
        if extra.get("resources"):
            container["resources"] = quantities(extra["resources"])
    return out
