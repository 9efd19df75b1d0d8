"""Reading pods and writing NetSenseJob status (pure helpers, unit-testable)."""

from __future__ import annotations

import datetime
import json

from netsense.gang import TRAINER
from netsense.train.results import evaluated, result_target

PENDING, RUNNING, SUCCEEDED, FAILED, SUSPENDED = "Pending", "Running", "Succeeded", "Failed", "Suspended"
FINISHED = (SUCCEEDED, FAILED)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def iso(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


MUTABLE = ("suspend",)  # the fields a started job may change
# How a pod's end reads when it was not its own failure (the DisruptionTarget condition, Kubernetes >= 1.26,
# and the older reasons): eviction (the Eviction API, a node drain, node pressure), preemption, a lost node.
DISRUPTION_REASONS = ("Evicted", "Preempting", "Preempted", "NodeLost", "Terminated", "Shutdown", "NodeShutdown")
# The kubelet's words when it evicts a pod for the pod's own use (pkg/kubelet/eviction): past its ephemeral-storage
# or emptyDir limit, or, under node pressure, named as the container that used more than it requested. The same
# job would do it again: a failure (counted against backoffLimit), never a disruption to restart without end.
SELF_EVICTED = ("exceeds the total limit of containers", "exceeded its local ephemeral storage limit",
                "Usage of EmptyDir volume", "has larger consumption of")


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
    if evicted := self_evicted(pod):
        return evicted
    text = term.get("message") or term.get("reason") or status.get("message") or status.get("reason") or "failed"
    exit_code = term.get("exitCode")
    text = " ".join(str(text).split())
    return f"{text} (exit code {exit_code})" if exit_code not in (None, 0) else text


def disruption(pod: dict) -> str | None:
    """Why a pod ended or is ending without failing itself, in one line (None: it did not): its deletion
    (``kubectl delete``, a drain, the Eviction API, a lost node's), a DisruptionTarget condition, or a reason
    of eviction or preemption. Not a succeeded pod's deletion (the job's own cleanup)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded" or self_evicted(pod):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return " ".join(f"{cond.get('reason') or 'Disrupted'}: {cond.get('message') or ''}".split())
    if status.get("reason") in DISRUPTION_REASONS:
        return " ".join(f"{status['reason']}: {status.get('message') or ''}".split())
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "deleted"
    return None


def self_evicted(pod: dict) -> str | None:
    """Why the kubelet evicted the pod for its own use of a resource (None: it did not), in one line."""
    status = pod.get("status") or {}
    message = status.get("message") or ""
    if status.get("reason") == "Evicted" and any(words in message for words in SELF_EVICTED):
        return " ".join(f"evicted for its own use: {message}".split())
    return None


def waiting_reason(pod: dict) -> str | None:
    """Why a pod is not running yet, in one line (None when nothing says): unschedulable, or a container
    (the trainer, or the shaper: an init container) waiting, e.g. ImagePullBackOff or CrashLoopBackOff."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        # SchedulingGated is the operator's own gate (gate.py: its WaitingForRoom says why), and it can stay on a pod
        # for a moment after the gate is lifted, until the scheduler looks at the pod again.
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and \
                cond.get("reason") != "SchedulingGated":
            return " ".join(f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".split())
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return " ".join(f"{cs.get('name')}: {waiting['reason']} {waiting.get('message') or ''}".split())
    return None


def _target(result: dict) -> tuple[str, float, float | None] | None:
    """(metric, target, best) of the target a result's job set (netsense.train.results: accuracy or loss, and its
    best evaluation of it); None when it set none."""
    target = result_target(result)
    return None if target is None else (*target, evaluated(result, target[0]))


def target_condition(result: dict) -> tuple[str, str, str]:
    """(status, reason, message) of the TargetReached condition from a result (result.json's keys): True with
    the time, or False with the best it did and the hold rule; Unknown when the job set no target."""
    hold, target = result.get("target_hold", 3), _target(result)
    if target is None:
        return "Unknown", "NoTarget", "spec.training.targetAccuracy (or targetLoss) is not set"
    metric, value, best = target
    if result.get("time_to_accuracy_s") is not None:
        return ("True", "Reached", f"{metric} {value} held {hold} evaluations in a row from "
                f"{result['time_to_accuracy_s']:.1f} s of training")
    best_text = "none" if best is None else f"{best:.3f}"
    return ("False", "NotReached", f"{metric} {value} was not held {hold} evaluations in a row (best {best_text})")


def target_summary(result: dict) -> str:
    """What `kubectl get nsj`'s TARGET column says first: reached (when), missed (the best it did: an accuracy,
    or "loss" and the lowest loss), or none set; a Succeeded job can have missed its target, and the phase alone
    would read as success."""
    target = _target(result)
    if target is None:
        return "no target"
    if result.get("time_to_accuracy_s") is not None:
        return f"reached at {result['time_to_accuracy_s']:.1f} s"
    metric, _, best = target
    return f"missed (best {'' if metric == 'accuracy' else 'loss '}{'none' if best is None else format(best, '.3f')})"


def final_progress(progress: dict | None, result: dict) -> dict:
    """status.progress once the job is done, from rank 0's result: its steps and mean samples/s (a job shorter
    than a read of the log never showed any, and `kubectl get nsj` showed its PROGRESS and SAMPLES/S blank)."""
    steps, epochs = result.get("steps"), result.get("epochs")
    done = ", ".join(([f"{steps} steps"] if steps is not None else []) + ([f"{epochs:g} epochs"] if epochs else []))
    return {**(progress or {}), "step": steps, "samplesPerSecond": result.get("throughput_samples_per_s"),
            "summary": f"done: {done}" if done else "done"}


def result_of(pod: dict) -> dict | None:
    """rank 0's result, written to its termination message as one JSON line."""
    term = trainer_terminated(pod) or {}
    try:
        result = json.loads(term.get("message") or "")
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


CALIBRATE_PREFIX = "[calibrate] "  # netsense.bench.calibration's lines on stderr


def last_progress(log_text: str) -> dict | None:
    """The last JSON progress line of a trainer's log; of a calibration's, its last rung (what it runs now)."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(CALIBRATE_PREFIX + "rung "):
            return {"summary": line[len(CALIBRATE_PREFIX):].split(" (")[0]}
        line = line.strip()
        if line.startswith("{") and '"progress"' in line:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "progress":
                step, most = ev.get("step"), ev.get("max_steps")
                return {"step": step, "epoch": ev.get("epoch"), "samplesPerSecond": ev.get("samples_per_s"),
                        "density": ev.get("density"), "loss": ev.get("loss"), "accuracy": ev.get("accuracy"),
                        "rateMbit": ev.get("rate_mbit"), "profileEpoch": ev.get("profile_epoch"),
                        # for `kubectl get nsj`: how far, in words
                        "summary": f"step {step}" + (f"/{most}" if most else "") + f", epoch {ev.get('epoch')}"}
    return None


def calibration_summary(profile: dict, config_map: str) -> dict:
    """status.calibration of a calibrate job: where its profile is, each option's steps factor over dense fp16's
    (a lower bound marked '>'), and what calibrating cost (part of any comparison that uses the profile)."""
    factors, words = {}, []
    for family, unit in (("topk", "topk"), ("powersgd", "powersgd rank")):
        factors[family] = {}
        for option, entry in (profile.get(family) or {}).items():
            factors[family][option] = entry.get("steps_factor")
            bound = ">" if entry.get("lower_bound") else ""
            words.append(f"{unit} {option} {bound}{entry.get('steps_factor'):.2f}x")
    cost = profile.get("cost") or {}
    lower = sorted(f"{f} {o}" for f in ("topk", "powersgd") for o, e in (profile.get(f) or {}).items()
                   if e.get("lower_bound"))
    return {"configMap": config_map, "factors": factors, "lowerBounds": lower,
            "milestoneLoss": (profile.get("milestone") or {}).get("loss"), "seeds": profile.get("seeds"),
            "costSeconds": cost.get("wall_seconds"), "costSteps": cost.get("steps"), "costRuns": cost.get("runs"),
            "summary": f"{', '.join(words)} the dense steps; cost {cost.get('wall_seconds')} s, "
                       f"{cost.get('steps')} steps in {cost.get('runs')} runs"}
