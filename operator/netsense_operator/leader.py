"""One acting operator at a time: leader election on a coordination.k8s.io Lease.

A second replica (a rolling update, a mistaken `replicas: 2`) waits for the
Lease instead of reconciling beside the first: two operators restarting the
same gang would fight. The holder renews every RENEW_S; a holder that cannot
renew within LEASE_S stops (its process exits and the Deployment restarts it),
and one that stops cleanly hands the Lease back so a successor starts at once.
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


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _micro(t: datetime.datetime) -> str:
    """A Lease's MicroTime."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value) -> datetime.datetime | None:
    if value is None or isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class LeaseElector:
    def __init__(self, namespace: str, name: str = "netsense-operator", identity: str | None = None):
        self.namespace, self.name = namespace, name
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.api = client.CoordinationV1Api()
        self._stop = threading.Event()

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
                raise
        spec = lease.spec
        holder = spec.holder_identity or ""
        renewed = _time(spec.renew_time or spec.acquire_time)
        expired = renewed is None or _now() - renewed > datetime.timedelta(seconds=spec.lease_duration_seconds or
                                                                             LEASE_S)
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
            last_ok = time.monotonic()
            while not self._stop.wait(RENEW_S):
                try:
                    if self.try_acquire() is None:
                        last_ok = time.monotonic()
                        continue
                    log.error("the lease was taken by another operator: stopping")
                except Exception as e:  # the API server is away: keep trying until the lease lapses
                    if time.monotonic() - last_ok < LEASE_S:
                        log.warning("renewing the lease failed (%s): retrying", e)
                        continue
                    log.error("could not renew the lease for %ss: stopping", LEASE_S)
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
