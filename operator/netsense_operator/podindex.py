"""The jobs' pods as the watch shows them (kopf's index), less those a periodic LIST found gone: a watch that
expires is listed again by kopf without a DELETED for what vanished meanwhile."""

from __future__ import annotations

import functools
import json
import os
import threading
import time

import kopf
from kubernetes.client.rest import ApiException

from netsense_operator import api
from netsense_operator import resources as res
from netsense_operator import status as st


def pods(index: kopf.Index, uid: str) -> list[dict]:
    """The job's pods as the watch last saw them, less those a resync found gone (resync)."""
    pods = list(index.get(uid, ()))  # a copy first: the event loop may change the index meanwhile
    return [p for p in pods if p["metadata"].get("uid") not in _vanished]


# A watch that expires (410 Gone) is listed again by kopf without a DELETED for the pods that vanished
# meanwhile: they would stay in the index, their rank never re-created. Once a RESYNC_S, one LIST of every job's
# pods (cluster-wide, or per watched namespace: one request, however many jobs) names what the index still holds
# and the API server no longer has.
RESYNC_S = float(os.environ.get("NETSENSE_RESYNC_INTERVAL", "60"))
RESYNC_MARGIN_S = 60.0  # a pod created this close to the LIST may be missing from it without being gone
_vanished: set[str] = set()
_resync_lock = threading.Lock()
_last_resync = [0.0]


# The resync needs only UIDs: metadata alone (about a tenth of a pod's JSON), 500 pods a page. Measured
# (testbed/operator_cost.py, 10,400 pods): whole pods parsed into the client's models took the operator to 2 GiB.
METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}
RESYNC_PAGE = 500


def _listed_pod_uids() -> set[str]:
    namespaces = [n for n in os.environ.get("NETSENSE_NAMESPACES", "").split(",") if n]
    calls = [functools.partial(api.core().list_namespaced_pod, n) for n in namespaces] or \
        [api.core().list_pod_for_all_namespaces]
    uids: set[str] = set()
    for call in calls:
        token = None
        while True:
            raw = call(label_selector=res.LABEL_JOB_UID, limit=RESYNC_PAGE, _continue=token, _headers=METADATA_ONLY,
                       _preload_content=False)
            page = json.loads(raw.data)
            uids.update(item["metadata"]["uid"] for item in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
    return uids


def resync(index: kopf.Index) -> None:
    with _resync_lock:
        if time.monotonic() - _last_resync[0] < RESYNC_S:
            return
        _last_resync[0] = time.monotonic()
    listed_at = time.time()
    try:
        present = _listed_pod_uids()
    except ApiException:
        return  # the next resync tries again
    for pods in list(index.values()):
        for pod in list(pods):
            meta = pod["metadata"]
            created = meta.get("creationTimestamp")
            if meta.get("uid") and meta["uid"] not in present and created and \
                    st.parse_iso(created) < listed_at - RESYNC_MARGIN_S:
                _vanished.add(meta["uid"])
