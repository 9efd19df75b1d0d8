"""One acting operator at a time: leader election on a coordination.k8s.io Lease.

A second replica (a rolling update, a mistaken `replicas: 2`) waits for the
Lease instead of reconciling beside the first: two operators restarting the
same gang would fight. The holder renews every RENEW_S; one that stops cleanly
hands the Lease back so a successor starts at once.

Two clocks are never compared. A waiting replica does not read the holder's
renewTime against its own wall clock (hosts' clocks differ): it notes when it
*saw* the Lease last change, on its own monotonic clock, and takes it only once
the Lease has stood unchanged for LEASE_S there (client-go's observedTime). The
holder stops acting (its process exits, the Deployment restarts it) once
RENEW_DEADLINE_S has passed on its own monotonic clock since its last successful
renewal, which is before any successor can have counted LEASE_S from that
renewal: the old leader is gone before a new one starts.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("netsense.leader")
LEASE_S = 15
RENEW_S = 5
RENEW_DEADLINE_S = 10  # < LEASE_S: the holder gives up before anyone may take over
RETRY_S = 1  # between renewals that failed


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _micro(t: datetime.datetime) -> str:
    """A Lease's MicroTime."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value) -> datetime.datetime | None:
    if value is None or isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class LeaseNamespaceMissing(RuntimeError):
    """The Lease's namespace does not exist: the message says what to do, in one line."""


class LeaseElector:
    def __init__(self, namespace: str, name: str = "netsense-operator", identity: str | None = None,
                 api: client.CoordinationV1Api | None = None, clock: Callable[[], float] = time.monotonic):
        self.namespace, self.name = namespace, name
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.api = api or client.CoordinationV1Api()
        self.clock = clock
        self._stop = threading.Event()
        self._seen: tuple[str, float] | None = None  # (the Lease's resourceVersion, when we saw it change)

    def _lease_body(self, resource_version: str | None = None, holder: str | None = None) -> dict:
        now = _micro(_now())
        spec = {"holderIdentity": self.identity if holder is None else holder, "leaseDurationSeconds": LEASE_S,
                "acquireTime": now, "renewTime": now}
        meta: dict = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def try_acquire(self) -> str | None:
        """Take or renew the Lease; None when it is ours now, else who holds it."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(self.namespace, self._lease_body())
                return None
            except ApiException as e2:
                if e2.status == 409:  # someone else was quicker
                    return "another replica"
                if e2.status == 404:
                    raise LeaseNamespaceMissing(
                        f"the namespace {self.namespace!r} for the leader-election Lease does not exist: create it "
                        "(kubectl apply -k manifests/overlays/local does), or set NETSENSE_LEASE_NAMESPACE to an "
                        "existing one, or NETSENSE_LEADER_ELECTION=false for a single replica") from None
                raise
        spec = lease.spec
        holder = spec.holder_identity or ""
        version = lease.metadata.resource_version
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, self.clock())  # it changed (or we just met it): its clock starts now, ours
        expired = self.clock() - self._seen[1] > (spec.lease_duration_seconds or LEASE_S)
        if holder and holder != self.identity and not expired:
            return holder
        body = self._lease_body(lease.metadata.resource_version)
        if holder == self.identity and spec.acquire_time is not None:
            body["spec"]["acquireTime"] = _micro(_time(spec.acquire_time))
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, body)  # resourceVersion: no races
        except ApiException as e:
            if e.status == 409:
                return "another replica"
            raise
        return None

    def acquire(self) -> None:
        """Block until the Lease is ours."""
        waited = False
        while (holder := self.try_acquire()) is not None:
            if not waited:
                log.warning("another operator (%s) holds the lease %s/%s: waiting", holder, self.namespace, self.name)
                waited = True
            time.sleep(RENEW_S / 2)
        log.warning("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)

    def keep(self, on_lost: Callable[[], None]) -> None:
        """Renew in a daemon thread; call on_lost if the Lease cannot be kept."""

        def renew() -> None:
            last_ok, wait = self.clock(), RENEW_S
            while not self._stop.wait(wait):
                try:
                    if self.try_acquire() is None:
                        last_ok, wait = self.clock(), RENEW_S
                        continue
                    log.error("the lease was taken by another operator: stopping")
                except Exception as e:  # the API server is away: retry until the renew deadline
                    if self.clock() - last_ok < RENEW_DEADLINE_S:
                        log.warning("renewing the lease failed (%s): retrying", e)
                        wait = min(RETRY_S, max(0.0, RENEW_DEADLINE_S - (self.clock() - last_ok)))
                        continue
                    log.error("could not renew the lease for %ss: stopping before another may lead", RENEW_DEADLINE_S)
                on_lost()
                return

        threading.Thread(target=renew, name="lease", daemon=True).start()

    def release(self) -> None:
        """Hand the Lease back (a successor need not wait for it to lapse)."""
        self._stop.set()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                body = self._lease_body(lease.metadata.resource_version, holder="")
                body["spec"]["leaseDurationSeconds"] = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as e:
            log.warning("releasing the lease: %s", e.reason)
