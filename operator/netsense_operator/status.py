"""Reading pods and writing NetSenseJob status (pure helpers, unit-testable)."""

from __future__ import annotations

import datetime
import hashlib
import json

from netsense.gang import TRAINER

PENDING, RUNNING, SUCCEEDED, FAILED, SUSPENDED = "Pending", "Running", "Succeeded", "Failed", "Suspended"
FINISHED = (SUCCEEDED, FAILED)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


MUTABLE = ("suspend",)  # the fields a started job may change


def spec_hash(spec: dict) -> str:
    """What must not change once a job started (all but MUTABLE)."""
    fixed = {k: v for k, v in spec.items() if k not in MUTABLE}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def set_condition(conditions: list[dict] | None, type_: str, status: str, reason: str, message: str) -> list[dict]:
    """Conditions keyed by type; lastTransitionTime changes only when status does."""
    out = [dict(c) for c in (conditions or [])]
    for c in out:
        if c["type"] == type_:
            if c["status"] != status:
                c["lastTransitionTime"] = now_iso()
            c.update(status=status, reason=reason, message=message)
            return out
    out.append({"type": type_, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": now_iso()})
    return out


def trainer_terminated(pod: dict) -> dict | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == TRAINER:
            return ((cs.get("state") or {}).get("terminated")) or None
    return None


def finished_at(pod: dict) -> float | None:
    """When the pod's trainer ended (unix time; None if unknown)."""
    when = (trainer_terminated(pod) or {}).get("finishedAt")
    return parse_iso(when) if when else None


def failure_reason(pod: dict) -> str:
    """Why a pod failed, in one line: the trainer's own message first."""
    term = trainer_terminated(pod) or {}
    status = pod.get("status") or {}
    text = term.get("message") or term.get("reason") or status.get("message") or status.get("reason") or "failed"
    exit_code = term.get("exitCode")
    text = " ".join(str(text).split())
    return f"{text} (exit code {exit_code})" if exit_code not in (None, 0) else text


def waiting_reason(pod: dict) -> str | None:
    """Why a pod is not running yet, in one line (None when nothing says): unschedulable, or a container
    (the trainer, or the shaper: an init container) waiting, e.g. ImagePullBackOff or CrashLoopBackOff."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return " ".join(f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".split())
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return " ".join(f"{cs.get('name')}: {waiting['reason']} {waiting.get('message') or ''}".split())
    return None


def result_of(pod: dict) -> dict | None:
    """rank 0's result, written to its termination message as one JSON line."""
    term = trainer_terminated(pod) or {}
    try:
        result = json.loads(term.get("message") or "")
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


def last_progress(log_text: str) -> dict | None:
    """The last JSON progress line of a trainer's log."""
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"progress"' in line:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "progress":
                return {"step": ev.get("step"), "epoch": ev.get("epoch"), "samplesPerSecond": ev.get("samples_per_s"),
                        "density": ev.get("density"), "loss": ev.get("loss"), "accuracy": ev.get("accuracy"),
                        "rateMbit": ev.get("rate_mbit"), "profileEpoch": ev.get("profile_epoch")}
    return None
