"""netem's command lines, as a pure unit: no root, no tc run, no netem in the kernel needed.

A profile's delay, jitter and loss become a netem qdisc under the TBF (netsense.shaping.tc). What a user relies on:
the exact tc command that carries them (20ms of delay is 20000us, 0.1% of loss is 0.1%, not 10% or 0.001%), and,
on a kernel without netem, the one clear NO_NETEM error, raised before anything is created.

(The argv below is accepted by tc's own parser: on a kernel without netem, `tc qdisc replace dev lo parent 1:1
handle 10: netem limit 1000 delay 20000us 5000us loss 0.1000%` fails in the kernel with "Specified qdisc kind is
unknown", where a malformed option fails in tc itself, e.g. `Illegal "loss percent"`.)
"""

from __future__ import annotations

import subprocess

import pytest

import netsense.emulation.cluster as cl
from netsense.shaping import tc
from netsense.shaping.profiles import build_profile

# What tc prints when the kernel has no netem (iproute2 6.x; "RTNETLINK answers: ..." on older ones).
UNKNOWN_QDISC = "Error: Specified qdisc kind is unknown.\n"


class FakeTc:
    """subprocess.run for tc and ip: records every command; answers from ``fail`` (a predicate on the argv ->
    stderr), rc 0 otherwise."""

    def __init__(self, fail=lambda cmd: None):
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, cmd, *args, **kwargs):
        cmd = list(cmd)
        self.calls.append(cmd)
        err = self.fail(cmd)
        return subprocess.CompletedProcess(cmd, 2 if err else 0, stdout="", stderr=err or "")


@pytest.fixture
def fake(monkeypatch):
    f = FakeTc()
    monkeypatch.setattr(tc.subprocess, "run", f)
    return f


def link(profile: dict, **kw) -> tc.TcLink:
    return tc.TcLink("eth0", impairments=build_profile(profile).impairments, **kw)


@pytest.mark.parametrize("impairments, rate, netem", [
    ({"delay": "20ms", "jitter": "5ms", "loss": "0.1%"}, "100Mbit",
     ["netem", "limit", "1000", "delay", "20000us", "5000us", "loss", "0.1000%"]),
    ({"delay": "20ms"}, "100Mbit", ["netem", "limit", "1000", "delay", "20000us"]),
    ({"delay": "1.5ms", "jitter": "0.25ms"}, "100Mbit", ["netem", "limit", "1000", "delay", "1500us", "250us"]),
    ({"jitter": "5ms"}, "100Mbit", ["netem", "limit", "1000", "delay", "0us", "5000us"]),  # around no delay
    ({"loss": "1%"}, "100Mbit", ["netem", "limit", "1000", "loss", "1.0000%"]),
    ({"loss": 0.001}, "100Mbit", ["netem", "limit", "1000", "loss", "0.1000%"]),  # a fraction is the same loss
    ({"loss": "0.01%"}, "100Mbit", ["netem", "limit", "1000", "loss", "0.0100%"]),
    # netem's queue (packets) holds what the TBF's does (bytes, ~100 ms of the rate) in 1500-byte packets
    ({"delay": "20ms"}, "1Gbit", ["netem", "limit", "8333", "delay", "20000us"]),
])
def test_a_profiles_impairments_become_this_netem_child_of_the_tbf(fake, impairments, rate, netem):
    lk = link({"type": "static", "rate": rate, **impairments})
    lk.setup(float(rate[:-4]) * (1e9 if rate.endswith("Gbit") else 1e6))
    assert len(fake.calls) == 2
    tbf, child = fake.calls
    assert tbf[:8] == ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:"] and tbf[8] == "tbf"
    assert child == ["tc", "qdisc", "replace", "dev", "eth0", "parent", "1:1", "handle", "10:", *netem]


def test_the_whole_tree_of_a_shaped_link_in_a_namespace_and_its_rate_changes(fake):
    """setup: the TBF at the root, netem as its child; change: both in place (the same handles), with the
    impairments given again; teardown: the root goes (and netem with it)."""
    lk = link({"type": "static", "rate": "100Mbit", "delay": "20ms", "jitter": "5ms", "loss": "0.1%"},
              netns="nsense-abc-h0")
    lk.setup(100e6)
    lk.change(1e9)
    lk.teardown()
    netem = ["delay", "20000us", "5000us", "loss", "0.1000%"]
    assert fake.calls == [
        ["tc", "-n", "nsense-abc-h0", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:",
         "tbf", "rate", "100000000bit", "burst", "3389", "limit", "1250000"],
        ["tc", "-n", "nsense-abc-h0", "qdisc", "replace", "dev", "eth0", "parent", "1:1", "handle", "10:",
         "netem", "limit", "1000", *netem],
        ["tc", "-n", "nsense-abc-h0", "qdisc", "change", "dev", "eth0", "root", "handle", "1:",
         "tbf", "rate", "1000000000bit", "burst", "40000", "limit", "12500000"],
        ["tc", "-n", "nsense-abc-h0", "qdisc", "change", "dev", "eth0", "parent", "1:1", "handle", "10:",
         "netem", "limit", "8333", *netem],
        ["tc", "-n", "nsense-abc-h0", "qdisc", "del", "dev", "eth0", "root"],
    ]


def test_ingress_impairments_go_on_the_ifb_device(fake):
    lk = link({"type": "static", "rate": "100Mbit", "delay": "20ms"}, ingress=True)
    lk.setup(100e6)
    netem = [c for c in fake.calls if "netem" in c]
    assert netem == [["tc", "qdisc", "replace", "dev", "ifb-eth0", "parent", "1:1", "handle", "10:",
                      "netem", "limit", "1000", "delay", "20000us"]]


def test_a_profile_without_impairments_asks_nothing_of_netem(fake):
    lk = link({"type": "static", "rate": "100Mbit"})
    lk.setup(100e6)
    lk.change(50e6)
    assert fake.calls and not any("netem" in c for c in fake.calls)


# ---- a kernel without netem -------------------------------------------------------------------------------------

def test_tc_refusing_the_netem_qdisc_is_the_clear_no_netem_error(monkeypatch):
    fake = FakeTc(fail=lambda cmd: UNKNOWN_QDISC if "netem" in cmd else None)
    monkeypatch.setattr(tc.subprocess, "run", fake)
    lk = link({"type": "static", "rate": "100Mbit", "delay": "20ms", "loss": "0.1%"})
    with pytest.raises(tc.NetemUnavailable) as e:
        lk.setup(100e6)
    assert str(e.value) == tc.NO_NETEM == "this kernel has no netem qdisc: delay/jitter/loss profiles cannot run here"
    assert isinstance(e.value, tc.TcError)  # what the shaper's callers catch
    assert len(fake.calls) == 2 and "tbf" in fake.calls[0] and "netem" in fake.calls[1]
    lk.teardown()  # the TBF it did install is removed (the shaper tears down on the way out)
    assert fake.calls[-1] == ["tc", "qdisc", "del", "dev", "eth0", "root"]


def test_the_same_words_about_another_qdisc_are_tcs_own_error_not_blamed_on_netem(monkeypatch):
    monkeypatch.setattr(tc.subprocess, "run", FakeTc(fail=lambda cmd: UNKNOWN_QDISC))
    with pytest.raises(tc.TcError) as e:
        tc.run_tc(["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "1bit"])
    assert not isinstance(e.value, tc.NetemUnavailable)
    assert str(e.value) == ("`tc qdisc replace dev eth0 root handle 1: tbf rate 1bit` failed: "
                            "Error: Specified qdisc kind is unknown.")


def test_an_emulated_cluster_with_delay_on_a_kernel_without_netem_fails_with_no_netem_before_creating_anything(
        monkeypatch, tmp_path):
    """As root with ip and tc (faked here): the probe (a scratch namespace, removed at once) finds no netem, and
    the cluster stops there: no namespace of its own, no state file, nothing to clean up."""
    calls: list[list[str]] = []

    def run(cmd, *args, **kwargs):
        cmd = list(cmd)
        calls.append(cmd)
        probing = "-n" in cmd[:3] and cmd[cmd.index("-n") + 1].startswith(f"{cl.PREFIX}probe-") \
            or cmd[:3] in (["ip", "netns", "add"], ["ip", "netns", "del"]) and cmd[3].startswith(f"{cl.PREFIX}probe-")
        if not probing:
            raise AssertionError(f"ran {cmd} after the netem probe")
        err = UNKNOWN_QDISC if "netem" in cmd else ""
        return subprocess.CompletedProcess(cmd, 2 if err else 0, stdout="", stderr=err)

    monkeypatch.setattr(cl.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cl.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(cl, "STATE_DIR", str(tmp_path / "state"))
    profile = build_profile({"type": "static", "rate": "100Mbit", "delay": "20ms", "jitter": "5ms", "loss": "0.1%"})
    with pytest.raises(cl.EmulationError) as e:
        cl.LocalCluster(2, profile).__enter__()
    assert str(e.value) == tc.NO_NETEM
    probe_ns = calls[0][3]
    assert calls == [["ip", "netns", "add", probe_ns],
                     ["tc", "-n", probe_ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                     ["ip", "netns", "del", probe_ns]]
    assert not (tmp_path / "state").exists()


def test_an_emulated_cluster_without_impairments_never_probes_for_netem(monkeypatch):
    ran = []
    monkeypatch.setattr(cl.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cl.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(subprocess, "run", lambda cmd, *a, **k: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    cl.preflight(build_profile({"type": "static", "rate": "100Mbit"}))
    cl.preflight(None)
    assert ran == []
