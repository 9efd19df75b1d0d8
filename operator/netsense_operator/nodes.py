"""Whether a pod's node is lost: NotReady (or unreachable) for longer than the job's ``runPolicy.lostNodeSeconds``.

Why the operator looks itself: when a node dies, its pods keep phase Running, the surviving ranks' collectives
time out (120 s) long before the taint manager evicts the pods (300 s by default), and a pod deleted on a node
whose kubelet is gone stays Terminating for good, so the next gang would wait for it forever. So a rank whose node
has not been Ready for ``lostNodeSeconds`` is lost: its gang restarts as a disruption (not a failure), and pods on
such a node are deleted at once (grace 0), since no kubelet is left to confirm a graceful end. A node that no
longer exists is lost at once.

Only pods that are not Ready (the node controller marks a lost node's pods so) or are terminating are looked
up, one GET of their node at most every NODE_CACHE_S: a healthy job costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from netsense_operator import status as st

NODE_CACHE_S = 5.0
GONE = 0.0  # "not Ready since" of a node that no longer exists: lost at once


def not_ready_since(node: dict | None) -> float | None:
    """Since when (unix time) ``node`` has not been Ready; GONE for a node that no longer exists (None); None
    when it is Ready."""
    if node is None:
        return GONE
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return None
            when = cond.get("lastTransitionTime")
            return st.parse_iso(when) if when else time.time()
    return None  # a node that never reported: not known to be lost


def needs_look(pod: dict) -> bool:
    """Whether a pod's node is worth a look: it is on one, and it is terminating or not Ready."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    status = pod.get("status") or {}
    if status.get("phase") not in ("Running", "Pending"):
        return False
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") != "True"


class NodeWatch:
    """Reads nodes through ``read`` (name -> node dict, None if it is gone; raises PermissionError where the
    operator may not read nodes), each at most every NODE_CACHE_S."""

    def __init__(self, read: Callable[[str], dict | None], clock: Callable[[], float] = time.monotonic):
        self.read, self.clock = read, clock
        self.cache: dict[str, tuple[float, float | None]] = {}  # name -> (read at, not Ready since)
        self.denied = False

    def lost(self, pod: dict, after_s: float) -> str | None:
        """Why the pod's node counts as lost (None: it does not, or the node cannot be read)."""
        if self.denied or not needs_look(pod):
            return None
        name = pod["spec"]["nodeName"]
        cached = self.cache.get(name)
        if cached is None or self.clock() - cached[0] > NODE_CACHE_S:
            try:
                node = self.read(name)
            except PermissionError:
                self.denied = True
                return None
            cached = (self.clock(), not_ready_since(node))
            self.cache[name] = cached
        since = cached[1]
        if since is None:
            return None
        if since == GONE:
            return f"its node {name} no longer exists"
        down = time.time() - since
        if down < after_s:
            return None
        return f"its node {name} has not been Ready for {down:.0f}s (lostNodeSeconds {after_s:g})"
