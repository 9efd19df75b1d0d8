"""The shared bottleneck, cross traffic and the queue: what the testbed creates and what a run shows of it."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from support.procs import cmdline, descendants
from support.rates import until_enough

from netsense.emulation.bottleneck import cross_samples, queue_samples, summarize
from netsense.emulation.bulk import (
    available_congestion_control,
    best_second,
    bulk_result,
    payload_rates,
    rate_between,
    start_bulk,
)
from netsense.emulation.cluster import LocalCluster
from netsense.emulation.cross import Flow, flows_from_spec
from netsense.shaping.profiles import build_profile
from netsense.shaping.queue import DelayHistogram, LinkStats
from netsense.shaping.shaper import write_clock
from netsense.shaping.tc import qdiscs
from netsense.spec import SpecError, check_cluster, check_local, parse_job, parse_spec
from netsense.train.results import read_timeline

MBIT = 1e6


def test_an_onoff_flow_follows_its_schedule_on_the_training_clock():
    f = Flow("onoff0-0", start=1.0, stop=9.0, on=2.0, off=1.0)
    assert [f.active(t) for t in (0.5, 1.0, 2.9, 3.0, 3.9, 4.0, 8.9, 9.0)] == [
        False, True, True, False, False, True, True, False]
    assert Flow("bulk0-0").active(1e6)


def test_cross_traffic_entries_become_one_flow_per_connection():
    flows = flows_from_spec([{"type": "bulk", "flows": 2, "start": "3s"},
                             {"type": "onoff", "flows": 1, "start": "0s", "onFor": "500ms", "offFor": "2s"}])
    assert flows == [Flow("bulk0-0", 3.0), Flow("bulk0-1", 3.0), Flow("onoff1-0", 0.0, None, 0.5, 2.0)]


def test_cross_traffic_needs_the_shared_topology_and_says_so():
    with pytest.raises(SpecError) as e:
        parse_spec({"network": {"profile": {"type": "static", "rate": "50Mbit"},
                                "crossTraffic": [{"type": "bulk"}]}})
    assert [i.path for i in e.value.issues] == ["spec.network.crossTraffic"]
    assert "topology: shared" in str(e.value)


def test_a_cluster_refuses_the_shared_topology_the_testbed_runs():
    job = parse_spec({"network": {"topology": "shared", "profile": {"type": "static", "rate": "50Mbit"}}})
    check_local(job)
    with pytest.raises(SpecError) as e:
        check_cluster(job)
    assert [i.path for i in e.value.issues] == ["spec.network.topology"]


def test_unquoted_on_and_off_keys_get_an_error_that_explains_yaml():
    doc = yaml.safe_load("""
apiVersion: netsense.dev/v1alpha1
kind: NetSenseJob
metadata: {name: x}
spec:
  network:
    topology: shared
    crossTraffic: [{type: onoff, on: 2s, off: 2s}]
""")
    with pytest.raises(SpecError) as e:
        parse_job(doc)
    text = str(e.value)
    assert "spec.network.crossTraffic[0]: a key read as the boolean True" in text and "onFor" in text


def write_csv(path: str, fields: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(fields)
        w.writerows(rows)


def test_summary_puts_each_steps_worst_queue_drops_and_cross_rate_into_the_timeline(tmp_path):
    write_csv(tmp_path / "timeline.csv", ["time", "step", "bytes"], [[0.5, 1, 1000], [1.0, 2, 1000], [1.5, 3, 1000]])
    write_csv(tmp_path / "queue.csv", ["t", "dev", "backlog_bytes", "backlog_packets", "queue_delay_ms", "drops",
                                       "sent_bytes", "rate_mbit"],
              [["", "up0", 0, 0, 0.0, 0, 0, 50],  # before the clock started: not counted
               [0.2, "up0", 0, 0, 0.0, 3, 0, 50], [0.4, "up0", 62500, 40, 10.0, 3, 0, 50],
               [0.9, "up0", 125000, 80, 20.0, 7, 0, 50], [1.2, "up0", 0, 0, 0.0, 7, 0, 50]])
    write_csv(tmp_path / "cross_traffic.csv", ["t", "flow", "bytes", "mbit"],
              [[0.1, "bulk0-0", 0, 0.0], [1.05, "bulk0-0", 250000, 20.0], [1.55, "bulk0-0", 125000, 10.0]])
    (tmp_path / "queue-summary.json").write_text(json.dumps({"links": {"up0": {"drops": 4}}}))
    summary = summarize(str(tmp_path), [Flow("bulk0-0", start=1.0)], queue_samples(str(tmp_path)),
                        cross_samples(str(tmp_path)))
    with open(tmp_path / "timeline.csv") as fh:
        steps = list(csv.DictReader(fh))
    assert [s["queue_delay_max_ms"] for s in steps] == ["10.0", "20.0", "0.0"]
    assert [s["drops"] for s in steps] == ["0", "4", "0"]
    assert [s["cross_mbit"] for s in steps] == ["0", "20.0", "10.0"]  # no cross sample near 0.5 s: none
    assert summary["links"] == {"up0": {"drops": 4}}  # the sampler's own summary
    assert summary["cross_traffic"]["bulk0-0"] == {"mean_mbit_when_on": 15.0, "bytes": 375000}


def test_the_queue_summary_weighs_each_delay_by_how_long_it_held_on_the_training_clock():
    link = LinkStats(DelayHistogram(), first_drops=3)
    for t, delay, drops in [(0.0, 0.0, 3), (0.2, 10.0, 3), (0.7, 20.0, 7), (1.0, 0.0, 7), (1.0, 500.0, 7)]:
        link.add(t, delay, drops)  # the last sample came while the clock stood (evaluation): it weighs nothing
    s = link.summary()
    assert s["seconds"] == 1.0 and s["drops"] == 4
    assert s["queue_delay_p50_ms"] == pytest.approx(10.0, rel=0.02)  # 0 ms 0.2 s, 10 ms 0.5 s, 20 ms 0.3 s
    assert s["queue_delay_p99_ms"] == pytest.approx(20.0, rel=0.02)
    assert s["queue_delay_max_ms"] == 20.0


# ---- on the testbed (root) ---------------------------------------------------------------------------------------

@pytest.mark.root
def test_the_shared_link_carries_its_rate_each_way_and_nothing_else_is_shaped(nothing_left_behind):
    with LocalCluster(2, build_profile({"type": "static", "rate": "50Mbit"}), topology="shared") as c:
        assert "tbf" in qdiscs("up0", c.bridge_ns) and "tbf" in qdiscs("up1", c.bridge_ns)
        assert "tbf" not in qdiscs("eth0", c.host_ns(0)), "on the shared topology the hosts' own links are free"

        def each_way(attempt: int) -> list[float]:
            there = bulk_result(start_bulk(c, 4, port=5001 + 2 * attempt))
            back = bulk_result(start_bulk(c, 4, src=1, dst=0, port=5002 + 2 * attempt))
            ratios = [best_second(out, 0.8, 3.6) / (50 * MBIT) for out in (there, back)]
            assert max(ratios) <= 1.1, f"over the rate: {ratios}"
            return ratios

        readings = until_enough(each_way, lambda ratios: min(ratios) >= 0.9)
    assert min(readings[-1]) >= 0.9, f"fastest seconds, there and back: {readings} of 50 Mbit"


@pytest.mark.root
def test_two_equal_flows_share_the_shared_link_roughly_evenly(nothing_left_behind):
    """Two cubic flows (Linux's default) over the drop-tail queue: shares drift from ~0.67/0.33 to ~0.5/0.5
    within 15-20 s here (0.54-0.61 over 2-19 s in three runs; 0.68 once in a busy full-suite run). Loss-based TCP
    over a FIFO converges slowly; BBRv1, this machine's default, does not converge: the flow that measured its RTT
    on the empty link kept 13 of 50 Mbit until PROBE_RTT at 10 s. So the shares are read over the run's second
    half, and each must hold a quarter to three quarters: what a shared link must never do is starve one flow
    (or, the sum's check, give each its own 50 Mbit)."""
    if "cubic" not in available_congestion_control().split():
        pytest.skip("no cubic in this kernel")
    # Again only when the pair carried too little (support.rates): a CI run read 26.2 + 15.1 of 50 Mbit in the
    # full suite, and 0.70-0.84x here in one minute with a quarter of the CPU stolen by the host (four Python
    # endpoints on two cores fall behind); a queue that starves the link fails every time. Over the rate or
    # starving one flow fails at once.
    def shared(attempt: int) -> tuple[float, float]:
        with LocalCluster(4, build_profile({"type": "static", "rate": "50Mbit"}), topology="shared") as c:
            # Both cross up0: ranks 0 and 2 sit on rack A, 1 and 3 on rack B.
            a = start_bulk(c, 20, src=0, dst=1, port=5001 + 2 * attempt, cc="cubic")
            b = start_bulk(c, 20, src=2, dst=3, port=5002 + 2 * attempt, cc="cubic")
            a, b = bulk_result(a), bulk_result(b)
        ra, rb = rate_between(a, 2.3, 19.3), rate_between(b, 2.0, 19.0)  # b's receiver started 0.3 s after a's
        assert (ra + rb) / (50 * MBIT) <= 1.1, f"{ra / MBIT:.1f} + {rb / MBIT:.1f} Mbit"
        late_a, late_b = rate_between(a, 10.3, 19.3), rate_between(b, 10.0, 19.0)
        assert 1 / 4 <= late_a / (late_a + late_b) <= 3 / 4, f"unequal shares: {late_a / MBIT:.1f} vs {late_b / MBIT:.1f}"
        return ra, rb

    readings = until_enough(shared, lambda pair: sum(pair) / (50 * MBIT) >= 0.85)
    assert sum(readings[-1]) / (50 * MBIT) >= 0.85, f"the shared link carried {readings} of 50 Mbit"


def sample_queue(c: LocalCluster, out_dir: str, clock: str) -> subprocess.Popen:
    return c.spawn_in(c.bridge_ns, [sys.executable, "-m", "netsense.shaping.queue", "--dev", "up0", "--clock", clock,
                                    "--out", os.path.join(out_dir, "queue.csv"),
                                    "--summary", os.path.join(out_dir, "queue-summary.json")])


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)


@pytest.mark.root
def test_the_queue_builds_and_drops_when_the_link_is_oversubscribed_and_stays_empty_when_not(
        tmp_path, nothing_left_behind):
    if "cubic" not in available_congestion_control().split():
        pytest.skip("no cubic in this kernel")
    clock = str(tmp_path / "clock")
    write_clock(clock, time.time())
    quiet, busy = str(tmp_path / "quiet"), str(tmp_path / "busy")
    os.makedirs(quiet)
    os.makedirs(busy)
    with LocalCluster(2, build_profile({"type": "static", "rate": "20Mbit"}), topology="shared") as c:
        sampler = sample_queue(c, quiet, clock)
        payload_rates(c, [3000], reps=30)  # two frames every 100 ms: 0.5 Mbit/s of a 20 Mbit/s link
        stop(sampler)
        sampler = sample_queue(c, busy, clock)
        bulk_result(start_bulk(c, 4, cc="cubic"))  # loss-based TCP fills any queue until it drops (BBR need not)
        stop(sampler)
    q, b = (summarize(d, [], queue_samples(d), [])["links"]["up0"] for d in (quiet, busy))
    assert q["seconds"] > 2 and b["seconds"] > 3
    assert q["queue_delay_p99_ms"] <= 2.0 and q["drops"] == 0, q  # at most the two frames: 1.2 ms
    assert b["queue_delay_p99_ms"] >= 40 and b["drops"] > 0, b  # the queue holds 80 ms at 20 Mbit


@pytest.mark.slow
@pytest.mark.root
def test_a_training_job_gets_less_of_the_shared_link_once_cross_traffic_starts(tmp_path, nothing_left_behind):
    from netsense.emulation.runner import run_job

    spec = {"workers": 2,
            "training": {"model": "mlp", "hiddenSize": 256, "dataset": "digits", "batchSize": 32, "lr": 0.05,
                         "maxSteps": 400, "evalEvery": 1000, "seed": 0},
            "compression": {"method": "allreduce"},
            "network": {"topology": "shared", "profile": {"type": "static", "rate": "50Mbit"},
                        "crossTraffic": [{"type": "bulk", "flows": 2, "start": "6s"}]}}
    out = str(tmp_path / "run")
    result = run_job(parse_spec(spec, "cross"), out, quiet=True)
    steps = read_timeline(os.path.join(out, "timeline.csv"))

    def training_mbit(t0: float, t1: float) -> float:
        window = [s for s in steps if t0 < s["time"] <= t1]
        return sum(s["bytes"] for s in window) * 8 / (window[-1]["time"] - window[0]["time"]) / MBIT

    end = steps[-1]["time"]
    assert end > 12, f"the run ended at {end:.1f} s of training: too short to compare"
    before, after = training_mbit(1, 5.5), training_mbit(7, end)
    assert after < 0.75 * before, f"training took {before:.1f} Mbit/s alone and {after:.1f} beside cross traffic"
    cross = result["bottleneck"]["cross_traffic"]
    assert set(cross) == {"bulk0-0", "bulk0-1"}
    assert all(f["mean_mbit_when_on"] >= 5 for f in cross.values()), cross
    assert all(s["cross_mbit"] == 0 for s in steps if s["time"] < 5.5)
    assert {"up0", "up1"} <= set(result["bottleneck"]["links"])
    assert os.path.exists(os.path.join(out, "timeline.png"))
    # This process's own children only (the run was in-process): never another run's on the machine.
    left = [pid for pid in descendants(os.getpid())
            if any(m in cmdline(pid) for m in ("netsense.emulation.cross", "netsense.shaping.queue"))]
    assert not left, "cross traffic or a queue sampler outlived the run"
    json.dumps(result)  # result.json stays plain JSON
