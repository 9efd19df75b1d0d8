"""One acting operator at a time: leader election on a coordination.k8s.io Lease.

A second replica (a rolling update, a mistaken `replicas: 2`) waits for the
Lease instead of reconciling beside the first: two operators restarting the
same gang would fight. The holder renews every RENEW_S; one that stops cleanly
hands the Lease back so a successor starts at once.

Two clocks are never compared. A waiting replica does not read the holder's
renewTime against its own wall clock (hosts' clocks differ): it notes when it
*saw* the Lease last change, on its own monotonic clock, and takes it only once
the Lease has stood unchanged for LEASE_S there (client-go's observedTime). The
holder counts its deadline from the moment it *sent* its last successful renewal
(never from when the answer came: a slow answer must not extend it), and stops
acting once RENEW_DEADLINE_S has passed since then: :func:`acting` turns False
at that instant, whatever the renewal thread is doing (a call can hang on a
stalled connection), and the handlers ask it before each pass; then its process
exits and the Deployment restarts it. Every Lease call has a request timeout
shorter than the renew deadline. So the old leader stops before any successor can
have counted LEASE_S from that renewal's landing.

Why not the Kubernetes client's leaderelection module: it reads the holder's
renewTime against the local wall clock (the two-clock comparison above) and sets
no request timeouts; kopf's peering is a different protocol (priorities, not a
Lease), which other tools (kubectl, client-go's leaderelection) do not read.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("netsense.leader")
LEASE_S = 15
RENEW_S = 5
RENEW_DEADLINE_S = 10  # < LEASE_S: the holder gives up before anyone may take over
RETRY_S = 1  # between renewals that failed
REQUEST_TIMEOUT_S = 3.0  # each Lease call: a stalled one ends well before the renew deadline
ACQUIRE_RETRY_MAX_S = 30.0  # waiting for an API server that is away, before leading: backing off up to this

_elector: LeaseElector | None = None  # the one this process leads with (None: no election, always acting)


def acting() -> bool:
    """Whether this process may act now: it holds the Lease, by its own clock, since its last renewal was sent
    less than RENEW_DEADLINE_S ago (or it runs without an election)."""
    return _elector is None or _elector.holds()


def process_identity() -> str:
    """This process, unlike any other that ever held the Lease: host, pid and start time. A container restarted
    after a crash keeps its host name and pid (1), and with the same identity it would take the Lease back at
    once as if it had never gone, ahead of the replica that waited its turn. The start time (clock ticks since
    boot, /proc/self/stat) tells the two apart; a random word where there is no /proc."""
    try:
        with open("/proc/self/stat") as fh:
            started = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = uuid.uuid4().hex[:8]
    return f"{socket.gethostname()}-{os.getpid()}-{started}"


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
        self.identity = identity or process_identity()
        self.api = api or client.CoordinationV1Api()
        self.clock = clock
        self._stop = threading.Event()
        self._seen: tuple[str, float] | None = None  # (the Lease's resourceVersion, when we saw it change)
        self._renewed: float | None = None  # when the last successful renewal was sent (our monotonic clock)

    def holds(self) -> bool:
        """Whether the Lease is ours by our own clock: its last renewal was sent less than RENEW_DEADLINE_S ago."""
        return self._renewed is not None and self.clock() - self._renewed < RENEW_DEADLINE_S

    def _lease_body(self, resource_version: str | None = None, holder: str | None = None) -> dict:
        now = _micro(_now())
        spec = {"holderIdentity": self.identity if holder is None else holder, "leaseDurationSeconds": LEASE_S,
                "acquireTime": now, "renewTime": now}
        meta: dict = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def try_acquire(self) -> str | None:
        """Take or renew the Lease; None when it is ours now (and since the moment this call began), else who
        holds it."""
        sent = self.clock()
        holder = self._try_acquire()
        if holder is None:
            self._renewed = sent
        return holder

    def _try_acquire(self) -> str | None:
        timeout = {"_request_timeout": REQUEST_TIMEOUT_S}
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **timeout)
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(self.namespace, self._lease_body(), **timeout)
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
            self.api.replace_namespaced_lease(self.name, self.namespace, body, **timeout)  # resourceVersion: no races
        except ApiException as e:
            if e.status == 409:
                return "another replica"
            raise
        return None

    def acquire(self) -> None:
        """Block until the Lease is ours. An API server that is away (a connection error, a timeout, a 5xx) is
        waited for, backing off up to ACQUIRE_RETRY_MAX_S, not a crash: a restart loop would wait no better."""
        waited, retry = False, RENEW_S / 2
        while True:
            try:
                holder = self.try_acquire()
            except LeaseNamespaceMissing:
                raise
            except Exception as e:  # noqa: BLE001 - anything the client raises for a server it cannot reach
                if isinstance(e, ApiException) and e.status is not None and e.status < 500 and e.status != 429:
                    raise
                log.warning("the API server cannot be reached for the lease (%s): retrying in %.0fs",
                            " ".join(str(e).split())[:200], retry)
                time.sleep(retry)
                retry = min(ACQUIRE_RETRY_MAX_S, retry * 2)
                continue
            if holder is None:
                break
            if not waited:
                log.warning("another operator (%s) holds the lease %s/%s: waiting", holder, self.namespace, self.name)
                waited = True
            retry = RENEW_S / 2
            time.sleep(retry)
        log.warning("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)

    def keep(self, on_lost: Callable[[], None]) -> None:
        """Renew in a daemon thread; call on_lost once the Lease cannot be kept. The deadline counts from when the
        last successful renewal was sent (holds()), so a renewal that hangs past it ends the leadership even
        before the call returns: a watchdog checks holds() too."""
        global _elector
        _elector = self
        lost = threading.Event()

        def give_up(why: str) -> None:
            if not lost.is_set():
                lost.set()
                log.error("%s: stopping", why)
                on_lost()

        def renew() -> None:
            wait = RENEW_S
            while not self._stop.wait(wait) and not lost.is_set():
                try:
                    if self.try_acquire() is None:
                        wait = RENEW_S
                        continue
                    give_up("the lease was taken by another operator")
                    return
                except Exception as e:  # the API server is away: retry until the renew deadline
                    if self.holds():
                        left = RENEW_DEADLINE_S - (self.clock() - self._renewed)
                        log.warning("renewing the lease failed (%s): retrying", " ".join(str(e).split())[:200])
                        wait = min(RETRY_S, max(0.0, left))
                        continue
                    give_up(f"could not renew the lease for {RENEW_DEADLINE_S}s")
                    return

        def watchdog() -> None:
            while not self._stop.wait(min(RETRY_S, RENEW_DEADLINE_S / 10)) and not lost.is_set():
                if not self.holds():
                    give_up(f"no renewal of the lease landed within {RENEW_DEADLINE_S}s")
                    return

        threading.Thread(target=renew, name="lease", daemon=True).start()
        threading.Thread(target=watchdog, name="lease-watchdog", daemon=True).start()

    def release(self) -> None:
        """Hand the Lease back (a successor need not wait for it to lapse)."""
        self._stop.set()
        self._renewed = None  # not acting from here on
        timeout = {"_request_timeout": REQUEST_TIMEOUT_S}
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, **timeout)
            if lease.spec.holder_identity == self.identity:
                body = self._lease_body(lease.metadata.resource_version, holder="")
                body["spec"]["leaseDurationSeconds"] = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, body, **timeout)
        except Exception as e:  # noqa: BLE001 - handing back is a courtesy: the Lease lapses anyway
            log.warning("releasing the lease: %s", " ".join(str(e).split())[:200])
