"""Leader election without comparing two hosts' clocks (operator/netsense_operator/leader.py).

A waiting replica takes the Lease only once it has seen it unchanged for the lease duration on its own
monotonic clock, whatever the holder's renewTime says; a holder that cannot renew gives up before that long
has passed, so two operators never act at once. Units against a fake Lease API (no sleeping on the election's
own timers), and against the real API server what a user meets first: a missing namespace, and a waiting
replica's liveness probe."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException
from netsense_operator import leader
from netsense_operator.leader import LeaseElector, LeaseNamespaceMissing
from support.clock import FakeClock


class FakeLeases:
    """One Lease, with resourceVersions as the API server keeps them (a stale replace is a 409)."""

    def __init__(self, namespace_exists: bool = True):
        self.lease = None
        self.version = 0
        self.namespace_exists = namespace_exists
        self.down = False
        self.timeouts: list = []  # each call's _request_timeout
        self.on_call = lambda: None  # what a call does first (a slow answer: advances a fake clock)

    def _check(self, kwargs: dict) -> None:
        self.timeouts.append(kwargs.get("_request_timeout"))
        self.on_call()
        if self.down:
            raise ApiException(status=503, reason="the API server is away")

    def read_namespaced_lease(self, name, namespace, **kwargs):
        self._check(kwargs)
        if self.lease is None:
            raise ApiException(status=404, reason="NotFound")
        spec = self.lease["spec"]
        return SimpleNamespace(metadata=SimpleNamespace(resource_version=str(self.version)), spec=SimpleNamespace(
            holder_identity=spec["holderIdentity"], renew_time=spec["renewTime"], acquire_time=spec["acquireTime"],
            lease_duration_seconds=spec["leaseDurationSeconds"]))

    def create_namespaced_lease(self, namespace, body, **kwargs):
        self._check(kwargs)
        if not self.namespace_exists:
            raise ApiException(status=404, reason=f'namespaces "{namespace}" not found')
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.lease, self.version = body, self.version + 1

    def replace_namespaced_lease(self, name, namespace, body, **kwargs):
        self._check(kwargs)
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        self.lease, self.version = body, self.version + 1

    def skew(self, seconds: float) -> None:
        """The holder's wall clock is this far from ours: its renewTime says so (a new version too)."""
        when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
        self.lease["spec"]["renewTime"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.version += 1


@pytest.mark.parametrize("holder_skew_s", [-3600, 0, 3600])
def test_a_waiting_replica_counts_the_lease_on_its_own_clock(holder_skew_s):
    """Whether the holder's clock is an hour behind, right, or an hour ahead: the Lease is taken only after it
    stood unchanged for its duration as the waiting replica saw it."""
    api, clock = FakeLeases(), FakeClock()
    a = LeaseElector("ns", identity="a", api=api)
    assert a.try_acquire() is None
    api.skew(holder_skew_s)
    b = LeaseElector("ns", identity="b", api=api, clock=clock)
    assert b.try_acquire() == "a"  # seen now: its clock starts now
    clock.t += leader.LEASE_S - 1
    assert b.try_acquire() == "a"
    clock.t += 2
    assert b.try_acquire() is None and api.lease["spec"]["holderIdentity"] == "b"


def test_a_holder_that_keeps_renewing_keeps_the_lease_however_old_its_renew_time_reads():
    api, clock = FakeLeases(), FakeClock()
    a = LeaseElector("ns", identity="a", api=api)
    a.try_acquire()
    b = LeaseElector("ns", identity="b", api=api, clock=clock)
    for _ in range(10):
        api.skew(-3600)  # every renewal, an hour behind by our clock
        assert b.try_acquire() == "a"
        clock.t += leader.RENEW_S


def test_a_holder_that_cannot_renew_stops_before_anyone_may_take_over(monkeypatch):
    """The API server away: the holder retries, then gives up at RENEW_DEADLINE_S (< LEASE_S) after its last
    renewal, by its own clock."""
    monkeypatch.setattr(leader, "RENEW_S", 0.05)
    monkeypatch.setattr(leader, "RETRY_S", 0.01)
    monkeypatch.setattr(leader, "RENEW_DEADLINE_S", 0.3)
    assert leader.RENEW_DEADLINE_S < leader.LEASE_S
    api = FakeLeases()
    a = LeaseElector("ns", identity="a", api=api)
    a.try_acquire()
    lost = threading.Event()
    api.down = True
    went_down = time.monotonic()
    a.keep(lost.set)
    assert lost.wait(10), "the holder went on acting without its lease"
    gave_up = time.monotonic() - went_down
    # From below: not before the deadline; from above: the deadline plus a retry's wait and a check, not 10x it.
    assert 0.3 - 0.05 <= gave_up <= 0.3 + leader.RENEW_S + 0.5, f"gave up after {gave_up:.2f}s, deadline 0.3s"
    assert not leader.acting(), "the handlers would still act"
    a._stop.set()
    leader._elector = None


def test_the_deadline_counts_from_when_the_renewal_was_sent_not_when_its_answer_came():
    """A renewal whose answer took 4 s (a slow or stalled connection) buys no more than one sent 4 s earlier."""
    api, clock = FakeLeases(), FakeClock()
    a = LeaseElector("ns", identity="a", api=api, clock=clock)
    sent = clock.t

    def slow() -> None:
        clock.t += 2  # each of its two calls (read, replace) answers 2 s later
    api.on_call = slow
    assert a.try_acquire() is None
    api.on_call = lambda: None
    clock.t = sent + leader.RENEW_DEADLINE_S - 0.01
    assert a.holds()
    clock.t = sent + leader.RENEW_DEADLINE_S + 0.01
    assert not a.holds(), "the answer's delay extended the deadline"


def test_every_lease_call_ends_before_the_renew_deadline():
    api = FakeLeases()
    a = LeaseElector("ns", identity="a", api=api)
    a.try_acquire()
    a.try_acquire()
    a.release()
    assert api.timeouts and all(t is not None and t < leader.RENEW_DEADLINE_S / 2 for t in api.timeouts), api.timeouts


def test_acquiring_waits_out_an_api_server_that_is_away(monkeypatch):
    """A 60 s outage at start-up is waited for (backing off), not a crash that becomes CrashLoopBackOff."""
    monkeypatch.setattr(leader, "RENEW_S", 0.02)
    monkeypatch.setattr(leader.time, "sleep", lambda s: None)
    api = FakeLeases()
    api.down = True
    calls = []

    def recover() -> None:
        calls.append(1)
        if len(calls) > 5:
            api.down = False
    api.on_call = recover
    a = LeaseElector("ns", identity="a", api=api)
    a.acquire()
    assert api.lease["spec"]["holderIdentity"] == "a" and len(calls) > 5


def test_a_missing_lease_namespace_is_one_line_saying_what_to_do():
    with pytest.raises(LeaseNamespaceMissing) as e:
        LeaseElector("netsense-system", identity="a", api=FakeLeases(namespace_exists=False)).try_acquire()
    message = str(e.value)
    assert "\n" not in message and "'netsense-system'" in message
    assert "NETSENSE_LEASE_NAMESPACE" in message and "NETSENSE_LEADER_ELECTION=false" in message


# ---- the real API server ---------------------------------------------------------------------------------

@pytest.mark.apiserver
def test_the_operator_against_a_cluster_without_the_lease_namespace_exits_with_one_line(control_plane):
    env = {**os.environ, "KUBECONFIG": control_plane.kubeconfig, "NETSENSE_LEASE_NAMESPACE": "no-such-namespace",
           "NETSENSE_METRICS_ADDR": "off"}
    proc = subprocess.run([sys.executable, "-m", "netsense_operator"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'no-such-namespace'" in lines[0] and "does not exist" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.apiserver
def test_a_waiting_replica_answers_its_liveness_probe(kube, operator, operator_kubeconfig, tmp_path):
    """The session's operator leads; a second one waits, and its liveness endpoint says it is alive (a probe
    that failed while it waited had the kubelet kill it over and over)."""
    from support.kube import OperatorProcess, wait_for

    from netsense.emulation.loopback import free_port

    operator.wait_leading(kube)  # an operator started a moment ago may not lead yet
    port = free_port()
    second = OperatorProcess(operator_kubeconfig, str(tmp_path / "second.log"),
                             args=("--liveness", f"http://127.0.0.1:{port}/healthz")).start()
    try:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(lambda: "waiting" in second.log(), timeout=30, what="the second operator waiting")
        assert wait_for(healthy, timeout=15, what="the waiting replica's /healthz")
        assert "leading as" not in second.log()
    finally:
        second.stop()


def test_a_restarted_process_with_the_same_host_and_pid_is_another_holder():
    """A container restarted after a crash keeps its host name and pid 1: were that its identity, it would take
    the Lease back at once, ahead of the replica that waited its turn."""
    here = leader.process_identity()
    code = "from netsense_operator.leader import process_identity; print(process_identity())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert here != other and here.split("-")[0] == other.split("-")[0]
    assert here.rsplit("-", 1)[0].endswith(str(os.getpid()))
