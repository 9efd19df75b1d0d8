"""What no NetSenseJob's pod may have, in one table with three uses.

A shaped job runs in a namespace whose Pod Security level is "privileged" (the shaper needs NET_ADMIN), so Pod
Security refuses nothing there, and the operator's service account may create pods in any namespace. Three
guards stand between a job and a privileged pod, and all three read the rules below:

- ``spec.podTemplate``'s allow-list (podtemplate.py) gives the same reasons for the fields it refuses;
- the operator checks every pod it builds with :func:`violations` before creating it (a defect of ours is a
  clear error, not a 403);
- the API server enforces them on the operator's account with ValidatingAdmissionPolicies whose CEL is
  generated here (:func:`admission_policies`; manifests/base/admission-policy.yaml is ``netsense
  admission-policy``'s output, and a test keeps it so). The same policies fence the account's DELETEs to the
  objects a NetSenseJob controls.

A rule is declarative: a path into the Pod and what may stand there, so the Python check and the CEL are made
from the same data and cannot drift apart. Paths are dotted; a segment ending in ``*`` is a list whose every
item is checked; the first segment ``containers*`` is every container of the pod (containers, initContainers
and ephemeralContainers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from netsense.gang import SHAPER  # the one container that may add a capability (NET_ADMIN)

OPERATOR_ACCOUNT = "system:serviceaccount:netsense-system:netsense-operator"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")

# Reasons that the podTemplate allow-list gives too (podtemplate.py): one wording for one rule.
OFF_THE_LINK = "would take the pod off the shaped interface (onto the node's own network, unshaped)"
WHY_HOST_NETWORK = f"hostNetwork {OFF_THE_LINK}"
WHY_HOST_PID = "hostPID would show the pod every process of its node"
WHY_HOST_IPC = "hostIPC would share the node's IPC namespace with the pod"
WHY_SHARE_PROCESSES = "would let the trainer see the shaper's processes"
WHY_HOST_PATH = "a hostPath volume would mount the node's filesystem into the pod"
WHY_NO_TOKEN = "workers never talk to the API server: no service account token"

# Annotations that loosen a container's confinement or give the pod another network (which the shaper does not
# see), and the CNI bandwidth plugin's, which would shape the pod a second time. By prefix.
REFUSED_ANNOTATIONS = {
    "container.apparmor.security.beta.kubernetes.io/": "would change a container's AppArmor profile",
    "seccomp.security.alpha.kubernetes.io/": "would change the pod's seccomp profile",
    "container.seccomp.security.alpha.kubernetes.io/": "would change a container's seccomp profile",
    "k8s.v1.cni.cncf.io/": "would attach another network to the pod, one the shaper does not shape",
    "kubernetes.io/ingress-bandwidth": "would shape the pod a second time (the profile is the pod's link)",
    "kubernetes.io/egress-bandwidth": "would shape the pod a second time (the profile is the pod's link)",
}

# The volumes the operator adds to every pod; a job may neither define nor mount one of its own under these names.
OPERATOR_VOLUMES = ("netsense-run", "netsense-job", "netsense-shaper-tmp", "netsense-output", "netsense-penalties")
SHAPER_TMP_VOLUME = "netsense-shaper-tmp"  # the root shaper's /tmp: any other container sees it read-only

# Pod Security "baseline" allows these SELinux types and nothing else (spc_t is a super-privileged container).
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
CONFINED_PROFILES = ("RuntimeDefault", "Localhost")


@dataclass(frozen=True)
class Rule:
    """At ``path``: with ``allowed`` empty, nothing may stand there (absent, or false / 0 / "" / empty); else,
    if set, one of ``allowed``; with ``required``, it must be set (to one of ``allowed``). ``exempt`` names a
    container the rule does not bind; ``when`` = (field, value) binds only the items of the path's last list
    whose field has that value. ``bad`` is a value that breaks the rule (its type is the field's: the CEL
    differs for a flag, a number, a list, an object); tests put it in a pod and expect both checks to refuse."""

    path: str
    why: str
    bad: Any
    allowed: tuple = ()
    required: bool = False
    exempt: str | None = None
    when: tuple[str, str] | None = None

    @property
    def message(self) -> str:
        where = self.path.replace("*", "[*]")
        if self.when:
            where += f" (where {self.when[0]} is {self.when[1]})"
        if self.exempt:
            where += f" (but the {self.exempt}'s)"
        values = " or ".join(repr(a) if isinstance(a, str) else str(a).lower() for a in self.allowed)
        if self.required:
            return f"a NetSenseJob's pod must set {where} to {values}: {self.why}"
        if self.allowed:
            return f"a NetSenseJob's pod may set {where} only to {values}: {self.why}"
        return f"a NetSenseJob's pod may not set {where}: {self.why}"


POD_RULES = (
    Rule("spec.hostNetwork", WHY_HOST_NETWORK, True),
    Rule("spec.hostPID", WHY_HOST_PID, True),
    Rule("spec.hostIPC", WHY_HOST_IPC, True),
    Rule("spec.shareProcessNamespace", WHY_SHARE_PROCESSES, True),
    Rule("spec.automountServiceAccountToken", WHY_NO_TOKEN + " (automountServiceAccountToken: false)", True,
         allowed=(False,), required=True),
    Rule("spec.volumes*.hostPath", WHY_HOST_PATH, {"path": "/"}),
    Rule("spec.volumes*.projected.sources*.serviceAccountToken", WHY_NO_TOKEN, {"path": "token"}),
    Rule("spec.securityContext.sysctls", "a sysctl would change the kernel's settings for the pod's namespaces",
         [{"name": "net.core.somaxconn", "value": "1024"}]),
    Rule("spec.securityContext.seLinuxOptions.type", "an SELinux type outside Pod Security baseline's (spc_t is "
         "unconfined)", "spc_t", allowed=SELINUX_TYPES),
    Rule("spec.securityContext.seccompProfile.type", "the pod runs under the runtime's default seccomp profile",
         "Unconfined", allowed=CONFINED_PROFILES),
    Rule("spec.securityContext.appArmorProfile.type", "the pod runs under the runtime's AppArmor profile",
         "Unconfined", allowed=CONFINED_PROFILES),
    Rule("containers*.securityContext.privileged", "no container is privileged", True),
    Rule("containers*.securityContext.allowPrivilegeEscalation", "no container may gain privileges "
         "(allowPrivilegeEscalation: false)", True, allowed=(False,), required=True),
    Rule("containers*.securityContext.procMount", "an unmasked /proc would show the node's kernel settings",
         "Unmasked", allowed=("Default",)),
    Rule("containers*.securityContext.seLinuxOptions.type", "an SELinux type outside Pod Security baseline's "
         "(spc_t is unconfined)", "spc_t", allowed=SELINUX_TYPES),
    Rule("containers*.securityContext.seccompProfile.type", "containers run under the runtime's default seccomp "
         "profile", "Unconfined", allowed=CONFINED_PROFILES),
    Rule("containers*.securityContext.appArmorProfile.type", "containers run under the runtime's AppArmor "
         "profile", "Unconfined", allowed=CONFINED_PROFILES),
    Rule("containers*.securityContext.capabilities.add*", "the one capability added is the shaper's NET_ADMIN",
         ["SYS_ADMIN"], allowed=("NET_ADMIN",)),
    Rule("containers*.securityContext.capabilities.add", "only the shaper adds a capability", ["NET_ADMIN"],
         exempt=SHAPER),
    Rule("containers*.ports*.hostPort", "a hostPort would open a port of the node, off the shaped interface",
         8080),
    Rule("containers*.volumeMounts*.readOnly", "only the shaper writes its /tmp (a link planted there would "
         "point a root write anywhere)", False, allowed=(True,), required=True, exempt=SHAPER,
         when=("name", SHAPER_TMP_VOLUME)),
)


# ---- Python: the operator's own check ------------------------------------------------------------------------

_MISSING = object()


def _nothing(rule: Rule, value: Any) -> bool:
    """Whether ``value`` (present) counts as nothing for a rule that allows nothing: false, 0, "", an empty list;
    an object counts only by its absence (CEL cannot take the size of one)."""
    if isinstance(rule.bad, dict):
        return False
    return value in (False, 0, "") or value == []


def _leaf_ok(rule: Rule, value: Any) -> bool:
    if value is _MISSING or value is None:
        return not rule.required
    if not rule.allowed:
        return _nothing(rule, value)
    return any(value == a and type(value) is type(a) for a in rule.allowed)  # False is not 0


def _holds(rule: Rule, node: Any, segments: list[str]) -> bool:
    name, *rest = segments
    listed = name.endswith("*")
    value = node.get(name.rstrip("*")) if isinstance(node, dict) else None
    value = _MISSING if value is None else value
    if not listed:
        return _leaf_ok(rule, value) if not rest else _holds(rule, {} if value is _MISSING else value, rest)
    items = [] if value is _MISSING else value
    if rule.when and not rest[1:]:  # the last list: only the items the rule is about
        field, wanted = rule.when
        items = [i for i in items if isinstance(i, dict) and i.get(field) == wanted]
    if not rest:
        return all(_leaf_ok(rule, item) for item in items)
    return all(_holds(rule, item, rest) for item in items)


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return [c for key in CONTAINER_LISTS for c in spec.get(key) or []]


def holds(rule: Rule, pod: dict) -> bool:
    """Whether ``pod`` (a Pod as a dict, the API's field names) keeps ``rule``."""
    first, *rest = rule.path.split(".")
    if first == "containers*":
        return all(_holds(rule, c, rest) for c in _containers(pod) if c.get("name") != rule.exempt)
    return _holds(rule, pod, rule.path.split("."))


ANNOTATIONS_MESSAGE = ("a NetSenseJob's pod may not have an annotation that changes its confinement or its network: "
                       + ", ".join(f"{p}..." for p in REFUSED_ANNOTATIONS))


def refused_annotations(pod_or_metadata: dict) -> list[tuple[str, str]]:
    """(annotation, why) for each annotation of the pod's metadata that a job may not set."""
    meta = pod_or_metadata.get("metadata", pod_or_metadata)
    return [(key, why) for key in (meta.get("annotations") or {})
            for prefix, why in REFUSED_ANNOTATIONS.items() if key.startswith(prefix)]


def violations(pod: dict) -> list[str]:
    """Every rule ``pod`` breaks, as the admission policy would say it; empty when the pod may be created."""
    out = [r.message for r in POD_RULES if not holds(r, pod)]
    out += [f"{ANNOTATIONS_MESSAGE} ({key} {why})" for key, why in refused_annotations(pod)]
    return out


# ---- CEL: the API server's check -----------------------------------------------------------------------------

def _cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _cel_leaf(rule: Rule, var: str) -> str:
    """The test of one value ``var`` that is known to be present."""
    if rule.allowed:
        return f"{var} in [{', '.join(_cel_literal(a) for a in rule.allowed)}]"
    if isinstance(rule.bad, bool):
        return f"!{var}"
    if isinstance(rule.bad, int):
        return f"{var} == 0"
    if isinstance(rule.bad, str):
        return f"{var} == ''"
    if isinstance(rule.bad, list):
        return f"size({var}) == 0"
    return "false"  # an object: present at all is too much


def _cel(rule: Rule, var: str, segments: list[str], depth: int = 0) -> str:
    name, *rest = segments
    field = f"{var}.{name.rstrip('*')}"
    if name.endswith("*"):
        item = f"x{depth}"
        inner = _cel_leaf(rule, item) if not rest else _cel(rule, item, rest, depth + 1)
        if rule.when and not rest[1:]:
            key, wanted = rule.when
            inner = f"{item}.{key} != {_cel_literal(wanted)} || ({inner})"
        return f"!has({field}) || {field}.all({item}, {inner})"
    inner = _cel_leaf(rule, field) if not rest else _cel(rule, field, rest, depth)
    if inner == "false":  # an object: present at all is too much
        return f"!has({field})"
    if rule.required:
        return f"has({field}) && ({inner})"
    return f"!has({field}) || ({inner})"


def cel(rule: Rule) -> str:
    """The rule as a CEL expression over the admission request's ``object`` (a Pod)."""
    first, *rest = rule.path.split(".")
    if first == "containers*":
        inner = _cel(rule, "c", rest, 1)
        if rule.exempt:
            inner = f"c.name == {_cel_literal(rule.exempt)} || ({inner})"
        return f"variables.containers.all(c, {inner})"
    return _cel(rule, "object", rule.path.split("."))


def annotations_cel() -> str:
    prefixes = ", ".join(_cel_literal(p) for p in REFUSED_ANNOTATIONS)
    return (f"!has(object.metadata.annotations) || "
            f"object.metadata.annotations.all(k, ![{prefixes}].exists(p, k.startsWith(p)))")


# ---- the manifests --------------------------------------------------------------------------------------------

_CONTAINERS_CEL = " + ".join(f"(has(object.spec.{k}) ? object.spec.{k} : [])" for k in CONTAINER_LISTS)
_OWNED = ("size(variables.owners) == 1 && 'netsense.dev/job-uid' in variables.labels && "
          "variables.labels['netsense.dev/job-uid'] == variables.owners[0].uid")


def _owners(obj: str) -> list[dict]:
    return [
        {"name": "owners", "expression": f"has({obj}.metadata.ownerReferences) ? {obj}.metadata.ownerReferences."
                                         "filter(r, r.kind == 'NetSenseJob' && r.apiVersion.startsWith("
                                         "'netsense.dev/') && has(r.controller) && r.controller) : []"},
        {"name": "labels", "expression": f"has({obj}.metadata.labels) ? {obj}.metadata.labels : {{}}"},
    ]


def _policy(name: str, operations: list[str], resources: list[str], variables: list[dict],
            validations: list[dict]) -> list[dict]:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                                                    "resources": resources}]},
            "matchConditions": [{"name": "by-the-operator",
                                 "expression": f"request.userInfo.username == '{OPERATOR_ACCOUNT}'"}],
            "variables": variables,
            "validations": validations,
        },
    }
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return [policy, binding]


def admission_policies() -> list[dict]:
    """The ValidatingAdmissionPolicies (with their bindings) that fence the operator's account: it may create
    only a NetSenseJob's objects, delete only those, and no pod it creates breaks a rule of POD_RULES."""
    owned = _policy("netsense-operator-owned-objects", ["CREATE", "UPDATE"], ["pods", "services", "configmaps"],
                    _owners("object"), [
                        {"expression": _OWNED,
                         "message": "the netsense operator may create only a NetSenseJob's objects: a controller "
                                    "ownerReference to the job and its UID in the label netsense.dev/job-uid"},
                        {"expression": "request.resource.resource != 'services' || !has(object.spec.type) || "
                                       "object.spec.type == 'ClusterIP'",
                         "message": "a NetSenseJob's Service is its headless rendezvous (type ClusterIP)"}])
    deletes = _policy("netsense-operator-deletes", ["DELETE"], ["pods", "services", "configmaps"],
                      _owners("oldObject"), [
                          {"expression": _OWNED,
                           "message": "the netsense operator may delete only a NetSenseJob's objects: a controller "
                                      "ownerReference to the job and its UID in the label netsense.dev/job-uid"}])
    pods = _policy("netsense-operator-pods", ["CREATE", "UPDATE"], ["pods"],
                   [{"name": "containers", "expression": _CONTAINERS_CEL}],
                   [{"expression": cel(r), "message": r.message} for r in POD_RULES]
                   + [{"expression": annotations_cel(), "message": ANNOTATIONS_MESSAGE}])
    return owned + deletes + pods


HEADER = """\
# Generated by `netsense admission-policy` from netsense/spec/fence.py (make manifests); a test keeps it so.
# The fence around the operator's account: it may create pods, Services and ConfigMaps in any namespace (the
# cluster-wide install), so the API server itself checks that each is a NetSenseJob's (a controller
# ownerReference and the job's UID label), that it deletes only such objects, and that no pod it creates asks
# for what no job may (the host's namespaces or filesystem, privilege, a capability other than the shaper's
# NET_ADMIN, an API token, a sysctl, a hostPort, an unconfined profile). A defect in the operator then cannot
# become a privileged pod. ValidatingAdmissionPolicy: GA since Kubernetes 1.30.
# Reads (pods/log GETs) are no admission's business: RBAC alone bounds them (README, Security).
# The operator's identity is named in every policy: installed elsewhere than netsense-system, change it there.
"""
