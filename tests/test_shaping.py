"""Shaping accuracy and lifecycle, measured with real TCP bulk transfers between
namespaced hosts (root only; counted at the receiver)."""

from __future__ import annotations

import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest
from support.procs import Watched, leaked_namespaces, ours
from support.rates import until_enough

from netsense.emulation import cluster as cl
from netsense.emulation.bulk import (
    best_second,
    bulk_result,
    payload_bounds,
    payload_rates,
    rate_between,
    start_bulk,
)
from netsense.emulation.cluster import LocalCluster, kernel_has_netem
from netsense.shaping.profiles import build_profile
from netsense.shaping.shaper import write_clock
from netsense.shaping.tc import gso_max_segs, gso_segs_for, qdiscs, tbf_params

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("nothing_left_behind")]


def burst_of(qdisc: str) -> int:
    """The bucket `tc qdisc show` prints for a TBF (it prints sizes in b, Kb or Mb)."""
    words = qdisc.split()
    size = words[words.index("burst") + 1]
    scale = {"Mb": 1 << 20, "Kb": 1 << 10, "b": 1}
    unit = next(u for u in scale if size.endswith(u))
    return int(float(size[:-len(unit)]) * scale[unit])


def bulk(c: LocalCluster, seconds: float, port: int = 5001) -> dict:
    return bulk_result(start_bulk(c, seconds, port=port))


# A short payload after an idle gap must not outrun the link (netsense.emulation.bulk.payload_bounds).
@pytest.mark.parametrize("rate", ["10Mbit", "20Mbit", "50Mbit", "200Mbit", "1000Mbit"])
def test_a_payload_after_an_idle_gap_crosses_at_the_link_rate(rate):
    # Sizes that fell short are measured again, up to twice (support.rates), keeping each size's fastest
    # crossing: a CI run on this shared 2-core VM read 50 Mbit's 1 MB at 0.66x in all 5 reps (a stall of a
    # second), 0.9x+ alone. A shaper that carries too little falls short every round; one that lets a payload
    # outrun the link fails at once, since noise never makes a payload faster.
    profile = build_profile({"type": "static", "rate": rate})
    bps = profile.rate_at(0)
    from_bytes, low, high = payload_bounds(bps)
    burst = tbf_params(bps)["burst"]
    sizes = [10_000, 47_000, 100_000, 300_000, 1_000_000] + ([4_000_000] if bps >= 50e6 else [])
    ratios: dict[int, float] = {}

    def report() -> str:
        return ", ".join(f"{size // 1000} kB {x:.2f}x" for size, x in sorted(ratios.items()))

    def short_after(attempt: int) -> list[int]:
        """Measure the sizes still short (all of them at first); the sizes short after it."""
        todo = [size for size in sizes if size not in ratios or (size >= from_bytes and ratios[size] < low)]
        got = payload_rates(c, todo, reps=5, fastest=True, port=5002 + attempt)
        ratios.update({size: max(r / bps, ratios.get(size, 0.0)) for size, r in got.items()})
        if burst < 10_000:  # it gains at most the bucket (a frame and 150 us of the rate): its time less that
            assert ratios[10_000] <= 10_000 / (10_000 - burst), f"{rate}: 10 kB outran the link ({report()})"
        for size, x in ratios.items():
            assert x <= high or size < from_bytes, f"{rate}: {size // 1000} kB outran the link ({report()})"
        return [size for size, x in ratios.items() if size >= from_bytes and x < low]

    with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
        short = until_enough(short_after, lambda still: not still)[-1]
    assert not short, f"{rate}: {[s // 1000 for s in short]} kB crossed below {low}x the rate in 3 rounds ({report()})"


def test_a_rate_change_in_place_sizes_the_bucket_and_the_senders_packets_for_the_new_rate():
    # Each change is awaited up to half a second past its time (the bound a scheduled change is held to):
    # applying it runs tc, which a loaded 2-core VM can delay past 150 ms (a CI run read the old rate then).
    profile = build_profile({"type": "steps", "steps": [{"at": "0s", "rate": "20Mbit"}, {"at": "0.5s", "rate": "1Gbit"},
                                                        {"at": "1.5s", "rate": "20Mbit"}]})
    slow, fast = tbf_params(20e6)["burst"], tbf_params(1e9)["burst"]

    def shaped(hosts: list[str]) -> tuple[str, int, list[int]]:
        shown = qdiscs("eth0", hosts[0])
        return shown, burst_of(shown), [gso_max_segs("eth0", ns) for ns in hosts]

    def once_applied(c: LocalCluster, at: float, rate: str, bucket: int, segs: int) -> None:
        hosts = [c.host_ns(0), c.host_ns(1)]
        time.sleep(max(0.0, c.epoch + at - time.time()))
        while time.time() < c.epoch + at + 0.5:
            shown, got_bucket, got_segs = shaped(hosts)
            if f"rate {rate} " in shown and got_bucket == pytest.approx(bucket, rel=0.01) and got_segs == [segs] * 2:
                return
            time.sleep(0.02)
        pytest.fail(f"{rate} not applied by {at + 0.5} s: {shown.strip()!r}, gso_max_segs {got_segs}")

    with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
        shown, bucket, segs = shaped([c.host_ns(0), c.host_ns(1)])
        assert "rate 20Mbit " in shown and "peakrate" not in shown
        assert bucket == pytest.approx(slow, rel=0.01) and segs == [1, 1]
        once_applied(c, 0.5, "1Gbit", fast, gso_segs_for(1e9))
        once_applied(c, 1.5, "20Mbit", slow, 1)  # an idle link's bucket shrinks at once


def test_a_static_link_leaves_the_senders_packets_alone():
    with LocalCluster(2, build_profile({"type": "static", "rate": "20Mbit"}),
                      shaping_log=open(os.devnull, "w")) as c:
        assert gso_max_segs("eth0", c.host_ns(0)) > 1  # TBF cuts what does not fit: cheaper than TCP doing it


@pytest.mark.parametrize("rate", ["10Mbit", "50Mbit", "200Mbit", "1000Mbit"])
def test_static_rate_is_achieved_within_10_percent(rate):
    # Another 4 s flow only when one fell short (support.rates): this shared 2-core VM has stalls of seconds
    # (a CI run read 0.78x of 50 Mbit and 0.83x of 1 Gbit in one flow each, 0.93-0.96x alone minutes later),
    # and a shaper that carries too little falls short every time. Over the rate fails at once: noise never
    # adds bytes. Where all fall short, the same path unshaped is measured: at 1 Gbit the VM's CPU binds
    # (0.80-0.84x in one minute with 25% of the CPU stolen by the host), and the shaper is held to 0.9x of
    # what the path carried then, so the test reads the shaper, not the machine's load.
    # Two readings of each flow: its fastest second (the shaper's rate) and its mean over the window, held to
    # 0.7x: a shaper that stalls for seconds (2 s in every 4) still has a fast second, never that mean.
    profile = build_profile({"type": "static", "rate": rate})
    bps = profile.rate_at(0)

    def fastest_and_mean(attempt: int) -> tuple[float, float]:
        out = bulk(c, 4, port=5001 + attempt)
        got = best_second(out, 0.8, 3.6)
        assert got / bps <= 1.1, f"{rate}: fastest second {got / 1e6:.1f} Mbit/s"
        return got, rate_between(out, 0.8, 3.6)

    def enough(reading: tuple[float, float]) -> bool:
        return reading[0] >= 0.9 * bps and reading[1] >= 0.7 * bps

    with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
        # In CI a starved host fails the test (printing the steal) rather than skipping it: a skip there
        # would also hide the stalling shaper this test is for.
        readings = until_enough(fastest_and_mean, enough, skip_when_starved=not os.environ.get("CI"))
    if enough(readings[-1]):
        return
    with LocalCluster(2) as c:
        out = bulk(c, 4)
        unshaped = best_second(out, 0.8, 3.6), rate_between(out, 0.8, 3.6)
    mbit = [(round(b / 1e6, 1), round(m / 1e6, 1)) for b, m in readings]
    assert max(b for b, _ in readings) >= 0.9 * min(bps, unshaped[0]), (
        f"{rate}: (fastest second, mean) {mbit} Mbit/s, unshaped fastest {unshaped[0] / 1e6:.0f}")
    assert max(m for _, m in readings) >= 0.7 * min(bps, unshaped[1]), (
        f"{rate}: (fastest second, mean) {mbit} Mbit/s, unshaped mean {unshaped[1] / 1e6:.0f}: the link stalls")


def test_a_scheduled_change_binds_within_half_a_second():
    profile = build_profile({"type": "steps", "steps": [{"at": "0s", "rate": "200Mbit"}, {"at": "3s", "rate": "20Mbit"}]})
    low_bps = 20e6

    def rate_after_the_change(_attempt: int) -> float:
        """One 6 s bulk run over the change; its rate from 0.5 s to 2 s after the change bound."""
        with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
            epoch = c.epoch
            out = bulk(c, 6)
        change_at = epoch + 3.0
        # Bins are relative to the receiver's start. The change is the first stretch of 3 bins at the new rate
        # from a bin before its time on: a busy machine stalls the sender for a bin now and then, and a run
        # here took such a dip in the 200 Mbit phase for the change (then read 93 Mbit where 20 had to be).
        bins, start, bin_s = out["bins"], out["start"], out["bin_s"]
        threshold = 0.5 * (200e6 + low_bps) / 8 * bin_s
        first = max(0, int((change_at - start) / bin_s) - 1)
        first_low = next((i for i in range(first, len(bins) - 2) if all(b < threshold for b in bins[i:i + 3])), None)
        assert first_low is not None, "the link never ran at the new rate"
        # A stall only ever slows the sender: it can make the change look early, never late, nor the new
        # rate faster. So these two bounds fail at once; a rate short of the new one is measured again.
        delay = start + first_low * bin_s - change_at
        assert delay <= 0.5, f"the change bound {delay:.2f}s after its time"
        after = first_low * bin_s
        got = rate_between(out, after + 0.5, after + 2.0)
        assert got <= 1.12 * low_bps, f"{got / 1e6:.1f} Mbit/s after the change to 20 Mbit"
        return got

    # CI read 17.5 Mbit/s here (0.87x) once in the full suite on this 2-core VM: a stall of the sender.
    readings = until_enough(rate_after_the_change, lambda got: got >= 0.88 * low_bps)
    assert readings[-1] >= 0.88 * low_bps, f"the new rate read {[round(x / 1e6, 1) for x in readings]} Mbit/s"


def test_a_step_decline_is_followed_step_by_step():
    every = 1.5
    profile = build_profile({"type": "steps", "from": "250Mbit", "to": "25Mbit", "by": "25Mbit",
                             "every": f"{every}s"})
    assert len(profile.points) == 10

    def per_step(attempt: int) -> list[float]:
        with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
            epoch = c.epoch
            out = bulk(c, every * 10 + 0.5, port=5001 + attempt)
        offset = out["start"] - epoch
        ratios = [rate_between(out, t - offset + 0.5, t - offset + every - 0.2) / bps for t, bps in profile.points]
        assert max(ratios) <= 1.1, f"over the rate: {[round(x, 2) for x in ratios]}"
        return ratios

    # 0.85: below ~300 Mbit a changing rate keeps packets to one or two frames (netsense.shaping.tc): TCP pays
    readings = until_enough(per_step, lambda ratios: min(ratios) >= 0.85)
    assert min(readings[-1]) >= 0.85, f"steps carried {[[round(x, 2) for x in r] for r in readings]} of the rate"


def test_a_shrinking_bucket_never_stalls_the_link():
    """GSO packets queued under a large bucket could never leave a smaller one (the link stalled for good)."""
    profile = build_profile({"type": "steps", "steps": [{"at": "0s", "rate": "2Gbit"}, {"at": "1s", "rate": "1Gbit"},
                                                        {"at": "2s", "rate": "200Mbit"}, {"at": "3s", "rate": "20Mbit"}]})
    with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
        epoch = c.epoch
        out = bulk(c, 4.5)
    offset = out["start"] - epoch
    # The sender's first byte, in the receiver's time: on a loaded machine its process starts late, and a step
    # it never saw cannot be read (a flow that stalls after it began still reads 0).
    begun = next((i for i, b in enumerate(out["bins"]) if b), len(out["bins"])) * out["bin_s"]
    ends = [t for t, _ in profile.points[1:]] + [4.5]
    measured = []
    for i, (t, bps) in enumerate(profile.points):
        t0 = max(t - offset, begun) + 0.4
        if t0 + 0.5 > ends[i] - offset:
            continue
        got = rate_between(out, t0, t0 + 0.5)
        assert got >= min(0.5 * bps, 400e6), f"step {i} ({bps / 1e6:.0f} Mbit) carried {got / 1e6:.1f} Mbit/s"
        # Over the rate is never noise: a follower that leaves a falling step's old rate in place reads here.
        assert got <= 1.1 * bps, f"step {i} ({bps / 1e6:.0f} Mbit) carried {got / 1e6:.1f} Mbit/s: over its rate"
        measured.append(i)
    assert len(measured) >= 2 and measured[-1] == len(profile.points) - 1, \
        f"the flow began {begun:.1f} s in: too late to read the shrinking steps {measured}"


def test_direction_both_shapes_each_hosts_downlink_at_the_rate_step_by_step():
    """Two hosts send to a third at once, each uplink at the rate: only the receiver's downlink holds their sum
    to the rate (unshaped, it would carry twice that), on each step of the profile."""
    every = 3.0
    profile = build_profile({"type": "steps", "steps": [{"at": "0s", "rate": "40Mbit"},
                                                        {"at": f"{every}s", "rate": "20Mbit"}]})

    def per_step(attempt: int) -> list[float]:
        with LocalCluster(3, profile, direction="both", shaping_log=open(os.devnull, "w")) as c:
            epoch = c.epoch
            flows = [start_bulk(c, 2 * every + 0.5, src=src, dst=1, port=5001 + 10 * attempt + src)
                     for src in (0, 2)]
            outs = [bulk_result(f) for f in flows]
        ratios = []
        for t, bps in profile.points:
            into = sum(rate_between(out, t - (out["start"] - epoch) + 0.8, t - (out["start"] - epoch) + every - 0.2)
                       for out in outs)
            ratios.append(into / bps)
        assert max(ratios) <= 1.1, f"the downlink carried {[round(x, 2) for x in ratios]} of each step's rate"
        return ratios

    readings = until_enough(per_step, lambda ratios: min(ratios) >= 0.85)
    assert min(readings[-1]) >= 0.85, f"the downlink carried {[[round(x, 2) for x in r] for r in readings]}"


def test_two_clusters_coexist_and_are_isolated():
    """Same addresses, separate networks: a host of one cluster reaches its own hosts and never the other's."""
    with LocalCluster(3) as a, LocalCluster(2) as b:
        assert not set(a.namespaces) & set(b.namespaces)
        assert a.address(0) == b.address(0)
        target = a.address(2)  # a host only cluster a has
        listener = a.spawn(2, [sys.executable, "-c", "import socket,time; s=socket.create_server(('0.0.0.0', 5009)); "
                                                     "print('up', flush=True); time.sleep(30)"],
                           stdout=subprocess.PIPE)
        assert listener.stdout.readline().strip() == b"up"
        probe = ("import socket,sys; s=socket.socket(); s.settimeout(2); "
                 f"print(s.connect_ex(({target!r}, 5009)))")

        def connects(ns: str) -> bool:
            out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe],
                                 capture_output=True, text=True, check=True).stdout
            return int(out) == 0

        assert connects(a.host_ns(0)), "a host cannot reach its own cluster's host"
        assert not connects(b.host_ns(0)), f"a host of cluster b reached {target} of cluster a"


def test_cleanup_after_an_exception_inside_the_cluster():
    with pytest.raises(RuntimeError), LocalCluster(2, build_profile({"type": "static", "rate": "10Mbit"}),
                                                   shaping_log=open(os.devnull, "w")) as c:
        sleeper = c.spawn(0, ["sleep", "60"])
        raise RuntimeError("boom")
    assert sleeper.poll() is not None, "the cluster's process outlived it"
    with pytest.raises(ProcessLookupError):  # nor any process of its group
        os.killpg(sleeper.pid, 0)


def test_netsense_clean_removes_what_a_killed_run_left(capsys):
    from netsense.cli import main

    code = ("from netsense.emulation.cluster import LocalCluster; import time; "
            "c = LocalCluster(2).__enter__(); print(c.id, flush=True); time.sleep(60)")
    with Watched.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as holder:
        run_id = holder.proc.stdout.readline().strip()
        left = holder.namespaces()
        assert len(left) == 3 and all(run_id in ns for ns in left)
        holder.proc.send_signal(signal.SIGKILL)
        holder.proc.wait()
        assert main(["clean"]) == 0
        said = capsys.readouterr().out
        assert all(ns in said for ns in left)
        assert not set(left) & ours()


def test_netem_profiles_fail_clearly_or_add_delay():
    profile = build_profile({"type": "static", "rate": "100Mbit", "delay": "20ms"})
    if not kernel_has_netem():
        before = ours()
        with pytest.raises(cl.EmulationError, match="this kernel has no netem"):
            LocalCluster(2, profile).__enter__()
        assert not leaked_namespaces(before), "created something before failing"
        return
    with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
        code = (f"import socket,time; s=socket.socket(); s.settimeout(5); t=time.perf_counter(); "
                f"s.connect_ex(('{c.address(1)}', 9)); print(time.perf_counter()-t)")

        def round_trip(_attempt: int) -> float:
            out = subprocess.run(["ip", "netns", "exec", c.host_ns(0), sys.executable, "-c", code],
                                 capture_output=True, text=True, check=True).stdout
            rtt = float(out)
            # The SYN crosses host 0's delayed uplink, the RST host 1's: twice the delay, never less.
            assert rtt >= 0.038, f"a round trip took {rtt * 1e3:.1f} ms with 20 ms on each uplink"
            return rtt

        # A busy machine only ever adds time: a round trip over the bound is read again.
        readings = until_enough(round_trip, lambda rtt: rtt <= 0.050)
        assert readings[-1] <= 0.050, f"round trips of {[round(r * 1e3, 1) for r in readings]} ms: the delay is over"


def test_shape_command_applies_follows_and_removes_its_qdiscs(tmp_path):
    ns = f"{cl.PREFIX}shape-{secrets.token_hex(3)}"  # this test's own: a run beside it may use its own
    subprocess.run(["ip", "netns", "add", ns], check=True)
    proc = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
        profile = tmp_path / "p.yaml"
        profile.write_text("type: steps\nsteps: [{at: 0s, rate: 100Mbit}, {at: 1s, rate: 30Mbit}]\n")
        ready, clock, queue = tmp_path / "ready", tmp_path / "clock", tmp_path / "queue.csv"
        write_clock(str(clock), time.time())
        gso_before = gso_max_segs("eth0", ns)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "netsense", "shape", "--dev",
                                 "eth0", "--profile", str(profile), "--direction", "both",
                                 "--ready-file", str(ready), "--start-file", str(clock), "--queue-csv", str(queue)],
                                stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists()
        assert "tbf" in qdiscs("eth0", ns) and "ingress" in qdiscs("eth0", ns)
        assert gso_max_segs("eth0", ns) == gso_segs_for(100e6)  # this pod's packets follow the rate
        assert "tbf" in qdiscs("ifb-eth0", ns)
        time.sleep(1.6)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 143
        events = [json.loads(line) for line in out.splitlines()]
        assert [e["rate"] for e in events if e["event"] in ("shaped", "rate")] == ["100Mbit", "30Mbit"]
        assert events[-1]["event"] == "unshaped"
        # The sidecar's queue, as on the testbed: both shaped directions sampled, summarized on exit.
        summary = next(e for e in events if e["event"] == "queue")["links"]
        assert set(summary) == {"eth0", "ifb-eth0"} and summary["eth0"]["seconds"] > 1
        with open(queue) as fh:
            rows = list(csv.DictReader(fh))
        assert {r["rate_mbit"] for r in rows if r["dev"] == "eth0"} >= {"100.0", "30.0"}
        assert "tbf" not in qdiscs("eth0", ns) and "ingress" not in qdiscs("eth0", ns)
        links = subprocess.run(["ip", "-n", ns, "link"], capture_output=True, text=True).stdout
        assert "ifb-eth0" not in links
        assert gso_max_segs("eth0", ns) == gso_before, "the device's GSO size was not restored"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "netns", "del", ns])


def tbf_rate(c: LocalCluster, host: int) -> str:
    return qdiscs("eth0", c.host_ns(host)).split(" rate ")[1].split()[0]


def test_with_a_start_file_the_profile_follows_the_training_clock_pauses_and_rewinds(tmp_path):
    start = str(tmp_path / "profile-start")
    profile = build_profile({"type": "steps", "steps": [{"at": "0s", "rate": "50Mbit"}, {"at": "0.5s", "rate": "20Mbit"}]})
    with LocalCluster(2, profile, shaping_log=open(os.devnull, "w"), start_file=start) as c:
        time.sleep(1.0)  # workers starting: the first step holds however long that takes
        assert c.epoch is None and tbf_rate(c, 0) == "50Mbit"
        epoch = time.time()
        write_clock(start, epoch, paused_at=0.3)  # an evaluation at 0.3 s on the training clock
        time.sleep(1.0)
        assert c.epoch == epoch and tbf_rate(c, 0) == "50Mbit", "the profile ran on while training stood still"
        resumed = time.time()
        write_clock(start, resumed - 0.3)  # training resumes: 0.2 s to the change
        time.sleep(1.0)
        assert tbf_rate(c, 1) == "20Mbit"
        applied_at, bps = c.follower.applied[-1]
        # Never early (that is the follower's error, not noise); late by what a loaded machine can delay one
        # poll of the start file and one tc call (150 ms each seen here), no more.
        assert bps == 20e6 and resumed + 0.2 - 0.005 <= applied_at <= resumed + 0.2 + 0.35, applied_at - resumed
        os.unlink(start)  # a gang restart: back to the first step until the new gang starts
        c.follower.rewind()
        time.sleep(1.0)
        assert c.epoch is None and tbf_rate(c, 0) == "50Mbit"
        write_clock(start, time.time())
        time.sleep(1.0)
        assert tbf_rate(c, 0) == "20Mbit"
