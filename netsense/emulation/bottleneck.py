"""What happened at the bottleneck of a local run: its queue and the cross traffic.

``Observers`` starts, beside the workers, a queue sampler in the namespace of
every shaped link (netsense.shaping.queue: backlog, queueing delay and drops
every 10 ms into queue.csv) and the cross traffic (netsense.emulation.cross:
each flow's goodput into cross_traffic.csv). Both run on the training clock
and die with the cluster. After the run, ``summarize`` adds to each step of
timeline.csv the worst queueing delay and the drops during it and the cross
traffic's rate, and to result.json a ``bottleneck`` summary: the sampler's
per-link queueing delay percentiles (weighted by how long each delay held, on
the training clock) and drops; each cross flow's mean goodput while it was on.
"""

from __future__ import annotations

import bisect
import csv
import json
import os
import statistics
import sys
from dataclasses import asdict

from netsense.emulation.bulk import available_congestion_control
from netsense.emulation.cluster import CannotRunHere, LocalCluster
from netsense.emulation.cross import BIN_S, Flow, flows_from_spec
from netsense.shaping.queue import read_rows, read_summary

CROSS_PORT = 5201
STEP_FIELDS = ["queue_delay_max_ms", "drops", "cross_mbit"]


class Observers:
    def __init__(self, cluster: LocalCluster, cross_traffic: list[dict] | None, out_dir: str, clock: str):
        self.cluster, self.out_dir, self.clock = cluster, out_dir, clock
        self.cross_traffic = cross_traffic or []
        self.flows = flows_from_spec(self.cross_traffic)

    def start(self) -> None:
        """Raises CannotRunHere (before starting anything) for a congestion control this kernel lacks."""
        available = available_congestion_control().split()
        for i, entry in enumerate(self.cross_traffic):
            cc = entry.get("congestionControl")
            if cc and cc not in available:
                raise CannotRunHere(f"spec.network.crossTraffic[{i}].congestionControl: {cc!r} is not in this "
                                   f"kernel (available: {' '.join(available)})")
        me = sys.executable
        if self.cluster.shaped:  # one sampler reads every shaped link, whichever namespace it is in
            devs = [a for label, ns, dev in self.cluster.shaped for a in ("--dev", f"{label}={ns}:{dev}")]
            with open(os.path.join(self.out_dir, "queue-sampler.log"), "w") as log:
                self.cluster.spawn_in(self.cluster.bridge_ns,
                                      [me, "-m", "netsense.shaping.queue", "--clock", self.clock,
                                       "--out", os.path.join(self.out_dir, "queue.csv"),
                                       "--summary", os.path.join(self.out_dir, "queue-summary.json"), *devs],
                                      stderr=log)
        if self.flows:
            c = self.cluster
            c.spawn_in(c.cross_ns(1), [me, "-m", "netsense.emulation.cross", "recv", str(CROSS_PORT), self.clock,
                                       os.path.join(self.out_dir, "cross_traffic.csv")])
            flows = json.dumps([asdict(f) for f in self.flows])
            c.spawn_in(c.cross_ns(0), [me, "-m", "netsense.emulation.cross", "send", c.cross_address(1),
                                       str(CROSS_PORT), self.clock, flows])


def queue_samples(out_dir: str) -> list[dict]:
    """queue.csv's rows taken while the training clock ran."""
    return [r for r in read_rows(os.path.join(out_dir, "queue.csv")) if r["t"] != ""]


def cross_samples(out_dir: str) -> list[dict]:
    """Rows of cross_traffic.csv (none without cross traffic)."""
    return read_rows(os.path.join(out_dir, "cross_traffic.csv"))


def summarize(out_dir: str, flows: list[Flow], queue: list[dict], cross: list[dict]) -> dict:
    """Per-step columns into timeline.csv from the run's queue and cross samples (queue_samples,
    cross_samples); returns the bottleneck summary for result.json."""
    timeline_path = os.path.join(out_dir, "timeline.csv")
    steps = read_rows(timeline_path)
    if steps and (queue or cross):
        _add_step_columns(timeline_path, steps, queue, cross)
    summary: dict = {"links": read_summary(os.path.join(out_dir, "queue-summary.json"))}
    if flows:
        summary["cross_traffic"] = {}
        for f in flows:
            on = [float(r["mbit"]) for r in cross if r["flow"] == f.name and f.active(float(r["t"]))]
            summary["cross_traffic"][f.name] = {"mean_mbit_when_on": round(statistics.fmean(on), 3) if on else 0.0,
                                                "bytes": sum(int(r["bytes"]) for r in cross if r["flow"] == f.name)}
    return summary


def _add_step_columns(path: str, steps: list[dict], queue: list[dict], cross: list[dict]) -> None:
    """Each step (training clock (previous time, time]) gets its worst queueing delay and its drops, and the
    cross traffic's rate in the 100 ms bin that holds the step's end (steps are often shorter than a bin)."""
    q = sorted(queue, key=lambda r: float(r["t"]))
    by_flow: dict[str, list[tuple[float, float]]] = {}
    for r in cross:
        by_flow.setdefault(r["flow"], []).append((float(r["t"]), float(r["mbit"])))
    for rows in by_flow.values():
        rows.sort()
    drops_before: dict[str, int] = {}
    qi = 0
    for step in steps:
        end = float(step["time"])
        worst, dropped = 0.0, 0
        while qi < len(q) and float(q[qi]["t"]) <= end:
            r = q[qi]
            if r["queue_delay_ms"]:
                worst = max(worst, float(r["queue_delay_ms"]))
            d = int(r["drops"])
            dropped += d - drops_before.get(r["dev"], d)
            drops_before[r["dev"]] = d
            qi += 1
        step["queue_delay_max_ms"] = round(worst, 3) if queue else ""
        step["drops"] = dropped if queue else ""
        rates = [rows[i][1] for rows in by_flow.values()
                 if (i := bisect.bisect_left(rows, (end, -1.0))) < len(rows) and rows[i][0] - end < 2 * BIN_S]
        step["cross_mbit"] = round(sum(rates), 3) if cross else ""
    fields = [k for k in steps[0] if k not in STEP_FIELDS] + STEP_FIELDS
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(steps)
