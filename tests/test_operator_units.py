"""The operator's decisions that need no API server: no decision on a status older than its own write, and a
pod that vanished while the watch was away."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace


def _pod(uid: str, created_s_ago: float) -> dict:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - created_s_ago))
    return {"metadata": {"name": uid, "uid": uid, "labels": {}, "creationTimestamp": created}, "status": {}}


def test_a_pod_that_vanished_while_the_watch_was_away_is_dropped_once_a_resync_lists_without_it(monkeypatch):
    """After a 410 kopf lists again without a DELETED for pods gone meanwhile; they would stay in the index and
    their rank would never come back. A resync (one LIST for every job) drops what the API server no longer
    has; a pod created too close to the LIST to tell is kept; and one LIST a RESYNC_S, however many jobs."""
    from netsense_operator import handlers

    lists = []

    def list_pods(**kwargs):
        """Two pages of metadata only, as the API server answers a PartialObjectMetadataList with a limit."""
        lists.append(kwargs)
        assert "PartialObjectMetadataList" in kwargs["_headers"]["Accept"] and not kwargs["_preload_content"]
        page = {"items": [{"metadata": {"uid": "kept"}}], "metadata": {"continue": "next"}} if not kwargs["_continue"] \
            else {"items": [{"metadata": {"uid": "also-kept"}}], "metadata": {}}
        return SimpleNamespace(data=json.dumps(page).encode())

    monkeypatch.delenv("NETSENSE_NAMESPACES", raising=False)
    monkeypatch.setattr(handlers, "core", lambda: SimpleNamespace(list_pod_for_all_namespaces=list_pods))
    monkeypatch.setattr(handlers, "_last_resync", [0.0])
    monkeypatch.setattr(handlers, "_vanished", set())
    index = {"job-a": [_pod("kept", 600), _pod("gone", 600), _pod("also-kept", 600)], "job-b": [_pod("new", 5)]}
    handlers._resync(index)
    assert [p["metadata"]["uid"] for p in handlers._pods(index, "job-a")] == ["kept", "also-kept"]
    assert [p["metadata"]["uid"] for p in handlers._pods(index, "job-b")] == ["new"], "too recent to tell"
    for _ in range(5):
        handlers._resync(index)
    assert len(lists) == 2, "a LIST (two pages) every pass, not one a RESYNC_S"


def test_no_decision_on_a_status_older_than_the_operators_own_write():
    """A timer pass that sees the job before the watch showed the operator's last write of its phase or
    attempt does nothing (it could re-create a gang the last pass had just finished)."""
    from netsense_operator import handlers

    uid = f"stale-{uuid.uuid4().hex}"
    handlers._remember(uid, {"attempt": 0, "phase": "Running"}, {"phase": "Failed"})
    assert handlers._stale(uid, {"attempt": 0, "phase": "Running"})  # the watch still shows Running
    assert not handlers._stale(uid, {"attempt": 0, "phase": "Failed"})  # it caught up
    handlers._remember(uid, {"attempt": 0, "phase": "Running"}, {"attempt": 1, "phase": "Pending"})
    assert handlers._stale(uid, {"attempt": 0, "phase": "Running"})
    assert not handlers._stale(uid, {"attempt": 1, "phase": "Pending"})
    handlers._written[uid] = (5, "Pending", time.monotonic() - handlers.STALE_AFTER_S - 1)
    assert not handlers._stale(uid, {"attempt": 1, "phase": "Pending"}), "a write never seen holds forever"
