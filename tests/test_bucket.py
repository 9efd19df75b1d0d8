"""The bucket a shaped link gets, and how a shrinking bucket settles (no root needed: the protocol's
decisions, fed the counters a queue would show; tests/test_shaping.py runs it on real links)."""

from __future__ import annotations

from netsense.shaping.shaper import Shrink
from netsense.shaping.tc import MTU_FRAME, gso_segs_for, tbf_params

RATES = [1e6, 10e6, 20e6, 50e6, 100e6, 200e6, 300e6, 500e6, 1e9, 2e9, 10e9]


def test_every_bucket_holds_a_frame_and_the_senders_packets_with_room_to_spare():
    for bps in RATES:
        burst = tbf_params(bps)["burst"]
        assert burst > MTU_FRAME, f"{bps / 1e6:g} Mbit: a frame cannot leave a {burst}-byte bucket"
        segs = gso_segs_for(bps)
        assert segs == 1 or 3 * segs * MTU_FRAME <= 2 * burst, f"{bps / 1e6:g} Mbit: {segs}-frame packets"


def test_buckets_and_packets_grow_with_the_rate():
    bursts = [tbf_params(bps)["burst"] for bps in RATES]
    assert bursts == sorted(bursts)
    assert gso_segs_for(1e9) > gso_segs_for(200e6) > gso_segs_for(100e6) == 1  # slow links: one frame


def test_a_shrinking_bucket_stays_loose_until_what_was_queued_has_left_then_tightens():
    s = Shrink(20e6, loose_burst=40_000, stall_s=0.02)
    assert s.step(sent=1000, backlog=9000, now=0.0) is None  # 9000 bytes queued under the old bucket
    assert s.step(sent=6000, backlog=12_000, now=0.01) is None  # newer packets do not extend the wait
    assert s.step(sent=10_000, backlog=8000, now=0.02) == "tighten"
    s.enter("watch")
    assert s.step(sent=10_000, backlog=8000, now=0.02) is None
    assert s.step(sent=15_000, backlog=3000, now=0.03) is None
    assert s.step(sent=18_000, backlog=0, now=0.04) == "done"


def test_an_idle_link_tightens_at_once():
    s = Shrink(20e6, loose_burst=40_000, stall_s=0.02)
    assert s.step(sent=500, backlog=0, now=0.0) == "tighten"
    s.enter("watch")
    assert s.step(sent=500, backlog=0, now=0.0) == "done"


def test_a_head_that_stops_moving_under_the_tight_bucket_loosens_it_again():
    s = Shrink(20e6, loose_burst=40_000, stall_s=0.02)
    s.enter("watch")
    assert s.step(sent=100, backlog=30_000, now=0.0) is None
    assert s.step(sent=100, backlog=30_000, now=0.015) is None  # not yet: a slow link sends a frame in ms
    assert s.step(sent=100, backlog=31_000, now=0.025) == "loosen"
    s.enter("loose")
    assert s.step(sent=100, backlog=31_000, now=0.025) is None
    assert s.step(sent=100, backlog=31_000, now=1.0) is None  # loose: everything queued fits, so it only waits
    assert s.step(sent=31_100, backlog=2000, now=1.1) == "tighten"
